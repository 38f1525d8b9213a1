"""Shared console output and error handling for the CLI."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from recserve.errors import RecserveError
from recserve.extras import missing_extra

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable)


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,  # other libraries: warnings only
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False)],
        force=True,
    )
    logging.getLogger("recserve").setLevel(logging.DEBUG if verbose else logging.INFO)


def handle_errors(fn: F) -> F:
    """Turns recserve's own errors into one red line and exit code 1 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RecserveError as err:
            err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from err
        except ModuleNotFoundError as err:
            if (line := missing_extra(err)) is None:
                raise
            err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from err

    return cast(F, wrapper)


def history_ids(item_ids: list[str], string_ids: bool, hint: str = "") -> list[int] | list[str]:
    """Command-line item IDs as the model takes them: integers (the model's items are int64), or strings;
    ``hint`` ends the message for IDs that are no integers (what to do where the type was not asked of the model)."""
    if string_ids:
        return item_ids
    from recserve.artifacts.catalogue import is_int64_text

    bad = [x for x in item_ids if not is_int64_text(x)]
    if bad:
        message = f"{', '.join(repr(b) for b in bad[:5])}: this model's item IDs are integers (int64){hint}"
        raise typer.BadParameter(message, param_hint="ITEM_IDS")
    return [int(x) for x in item_ids]


def export_or_run(export: Path | None, run: Path | None) -> Path:
    """The one source a serving command was given: ``--export`` (a validated export) or ``--run``."""
    if (export is None) == (run is None):
        raise typer.BadParameter(
            "give exactly one of --export (a folder from `recserve export`) and --run (a run folder, exported first)",
            param_hint="--export / --run",
        )
    return export if export is not None else run  # type: ignore[return-value]


def whole_option_names() -> None:
    """--help shows every option's name and default whole at any width (80 columns included): typer's tables
    cut a long name (--relative-positions) or default to fit with an ellipsis; its highlighters make the
    names' text and ``_get_parameter_help`` the help's, so theirs are made to fold onto the next line."""
    from typer import rich_utils

    def whole(highlight):
        def render(text):
            out = highlight(text)
            out.overflow = "fold"
            return out

        return render

    rich_utils.highlighter = whole(rich_utils.OptionHighlighter())
    rich_utils.negative_highlighter = whole(rich_utils.NegativeOptionHighlighter())
    parameter_help = rich_utils._get_parameter_help

    def help_whole(**kwargs):  # a long default ("[default: no-response-cache]") folds too
        columns = parameter_help(**kwargs)
        for part in columns.renderables:
            if hasattr(part, "overflow"):
                part.overflow = "fold"
        return columns

    rich_utils._get_parameter_help = help_whole
    rich_utils._print_options_panel = _options_below_where_narrow(rich_utils._print_options_panel)


NARROW_HELP = 120  # columns below which an option's help goes under its name, not into a squeezed column


def _options_below_where_narrow(table_panel):
    """typer's options panel as a table where the terminal is wide; where it is narrow (80 columns: the help
    column was ~19 characters, a name folded mid-word), each option's names and type on a line of their own and
    its help indented below, the width of the terminal."""
    from rich.console import Group, RenderableType
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text
    from typer import rich_utils

    def panel(*, name, params, ctx, markup_mode, console) -> None:
        if console.width >= NARROW_HELP or not params:
            return table_panel(name=name, params=params, ctx=ctx, markup_mode=markup_mode, console=console)
        rows: list[RenderableType] = []
        for param in params:
            names = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("-")]
            shown = ", ".join(names) or str(getattr(param, "display_name_raw", None) or param.name).upper()
            head = Text(shown, style="bold cyan", overflow="fold")
            kind = None if getattr(param, "is_flag", False) else param.display_type_rich(ctx=ctx)
            if kind:
                head.append(f"  {kind}", style="yellow")
            rows += [
                head,
                Padding(rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode), (0, 0, 0, 4)),
            ]
        console.print(Panel(Group(*rows), title=name, title_align="left", border_style="dim"))

    return panel
