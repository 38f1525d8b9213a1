"""One device vocabulary: every command takes cpu and gpu, and cuda for gpu; anything else is refused by name."""

import pytest
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.devices import serving_device, torch_device
from recserve.errors import ConfigError


@pytest.mark.parametrize(
    ("word", "serving", "torch"), [("cpu", "cpu", "cpu"), ("gpu", "gpu", "cuda"), ("CUDA", "gpu", "cuda")]
)
def test_both_words_name_the_same_device(word, serving, torch):
    assert serving_device(word) == serving and torch_device(word) == torch


def test_auto_only_where_a_command_can_choose():
    assert torch_device("auto", allow_auto=True) == "auto"
    with pytest.raises(ConfigError, match="expected cpu or gpu"):
        serving_device("auto")


@pytest.mark.parametrize("word", ["tpu", "cuda:0", ""])
def test_another_word_is_refused_with_the_words_taken(word):
    with pytest.raises(ConfigError, match=f"device {word!r}: expected cpu or gpu \\(cuda is taken for gpu\\)"):
        torch_device(word)


@pytest.mark.parametrize(
    "command",
    [
        ["export", "--run", "{tmp}", "--out", "{tmp}/e"],
        ["evaluate", "--run", "{tmp}", "--data", "{tmp}"],
        ["train", "--data", "{tmp}", "--out", "{tmp}/t"],
        ["repo", "--run", "{tmp}", "--out", "{tmp}/r"],
    ],
)
def test_every_command_refuses_an_unknown_device_in_the_same_words(command, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in command] + ["--device", "tpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "device 'tpu': expected" in result.output and "cuda is taken for gpu" in " ".join(result.output.split())
