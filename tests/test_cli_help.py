"""Every verb's --help, as a user on an 80-column terminal reads it: no text that the help's markup ate (a
default written in brackets, left as "folder ."), and no option name cut short ("--relative-positi…")."""

import re

import typer.main
from typer.testing import CliRunner

from recserve.cli.main import app

runner = CliRunner()


def _commands(command, path=()):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path


def test_every_help_keeps_its_text_whole():
    eaten = []
    for path in _commands(typer.main.get_command(app)):
        output = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
        for line in output.splitlines():
            if re.search(r"\w \.(\s|$)", line):
                eaten.append(f"{' '.join(path)}: {line.strip()}")
    assert not eaten, "help text eaten by markup:\n" + "\n".join(eaten)


def test_every_option_name_is_shown_whole_at_80_columns():
    cut = []
    for path in _commands(typer.main.get_command(app)):
        output = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
        cut += [f"{' '.join(path)}: {line.strip()}" for line in output.splitlines() if "…" in line]
    assert not cut, "cut short at 80 columns:\n" + "\n".join(cut)


def test_at_80_columns_each_options_help_reads_under_its_name_not_in_a_squeezed_column():
    """Once `train --help` took 295 lines at 80 columns, its help column ~19 characters wide, and option names
    were folded mid-word (--min-user-interactio / ns). Each option now has its names on a line and its help
    under them, as wide as the terminal."""
    narrow = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "80"}).output
    wide = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "160"}).output
    assert len(narrow.splitlines()) < 1.8 * len(wide.splitlines()), len(narrow.splitlines())
    names = re.findall(r"^│ (--[a-z-]+)", narrow, flags=re.M)
    assert {"--data", "--relative-positions", "--warm-start"} <= set(names), names
    data = runner.invoke(app, ["data", "--help"], env={"COLUMNS": "80"}).output
    assert re.search(r"^│ --min-user-interactions\b", data, flags=re.M), data


def test_the_helps_lists_of_models_layouts_and_backends_come_from_their_registries():
    """A model, layout or backend added to its registry is in the help without a word of the CLI changed."""
    import os
    import subprocess
    import sys

    code = """
import dataclasses, sys
from recserve.artifacts import served
from recserve.export import backends
from recserve.models import registry
registry.MODELS["gru4rec"] = dataclasses.replace(registry.MODELS["sasrec"], name="gru4rec", about="a new model")
served.LAYOUTS["shadow"] = served.ServedLayout(("shadow_model",), about="a new layout")
backends.BACKENDS = (*backends.BACKENDS, "openvino")
from typer.testing import CliRunner
from recserve.cli.main import app
for verb in ("train", "repo", "export", "bench"):
    print(CliRunner().invoke(app, [verb, "--help"]).output)
"""
    wide = os.environ | {"COLUMNS": "1000"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=wide).stdout
    assert "gru4rec (a new model)" in out and "[default: sasrec]" in out
    assert "shadow (a new layout)" in out and "native_session, echo, floor, shadow (by session" in out
    assert "cudagraph, torch_tensorrt or openvino" in out
