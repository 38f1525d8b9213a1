"""Options drawn from settings dataclasses: one field, one option, its help and default written once."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.cli.options import Settings, takes
from recserve.option_fields import option


@dataclass(frozen=True)
class Knobs:
    speed: int = option(3, "How fast.")
    colour: str = option("red", "Which colour [any].")
    delay_microseconds: int = option(0, "Wait.", flags=("--delay-ms",), parse=lambda ms: ms * 1000)
    hidden: int = 7  # no help: not an option


@dataclass(frozen=True)
class Other:
    speed: int = option(5, "How fast.")
    size: int = option(2, "How big.")


def _app(*groups: Settings) -> tuple[typer.Typer, list[Any]]:
    seen: list[Any] = []
    cli = typer.Typer()

    @cli.command()
    @takes(*groups)
    def command(name: Annotated[str, typer.Option()] = "x", knobs: Any = None) -> None:
        seen.append((name, knobs))

    return cli, seen


def test_a_built_group_gives_the_dataclass_with_the_defaults_and_the_options_given():
    cli, seen = _app(Settings("knobs", (Knobs,)))
    result = CliRunner().invoke(cli, ["--speed", "9", "--delay-ms", "2"])
    assert result.exit_code == 0, result.output
    assert seen == [("x", Knobs(speed=9, colour="red", delay_microseconds=2000))]
    assert "--hidden" not in CliRunner().invoke(cli, ["--help"]).output


def test_an_unset_group_gives_only_what_was_given():
    cli, seen = _app(Settings("knobs", (Knobs, Other), build=False, unset=True, titles={Knobs: "K", Other: "O"}))
    assert CliRunner().invoke(cli, ["--size", "4"]).exit_code == 0
    assert seen == [("x", {"size": 4})]
    text = " ".join(CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "300"}).output.split())
    assert "K, O: How fast. [3, 5]." in text  # the classes that say the same, together, each default shown
    assert "K: Which colour [any]. [red]." in text  # brackets in a help are text, not markup


def test_a_bad_value_for_a_parsed_option_names_its_flag():
    @dataclass(frozen=True)
    class Ids:
        ids: tuple[int, ...] = option(
            (), "Ids.", cli_type=str, cli_default="", parse=lambda t: tuple(map(int, t.split(",")))
        )

    cli, _ = _app(Settings("knobs", (Ids,)))
    result = CliRunner().invoke(cli, ["--ids", "1,x"])
    assert result.exit_code == 2 and "--ids" in result.output


def test_an_option_drawn_twice_is_refused_when_the_command_is_made():
    with pytest.raises(TypeError, match="'speed' is drawn twice"):
        _app(Settings("knobs", (Knobs,)), Settings("more", (Other,)))


def test_train_shows_each_models_default_and_takes_them_from_the_config():
    text = " ".join(CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "300"}).output.split())
    assert "BERT4Rec: Cloze masking probability [0.4]." in text
    assert "SASRec: a learned attention bias per head and query-key distance [on]." in text
    assert "(bert4rec 60, sasrec 100, multvae 200)" in text


def _commands(cli: typer.Typer) -> list:
    return cli.registered_commands + [c for group in cli.registered_groups for c in _commands(group.typer_instance)]


@pytest.mark.parametrize("command", _commands(app), ids=lambda c: c.name or c.callback.__name__)
def test_no_command_takes_more_than_twelve_parameters_by_hand(command):
    own = inspect.signature(inspect.unwrap(command.callback), eval_str=True).parameters
    assert len(own) <= 12, f"{command.name}: {len(own)} parameters; draw settings from a dataclass (cli/options.py)"
