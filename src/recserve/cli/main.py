"""The ``recserve`` application: registers one command per module."""

from __future__ import annotations

import importlib
from typing import Annotated

import typer
from rich.markup import escape
from typer.core import TyperGroup

from recserve.cli.bench import bench
from recserve.cli.console import err_console, setup_logging, whole_option_names
from recserve.cli.data import data
from recserve.cli.env import env
from recserve.cli.evaluate import evaluate
from recserve.cli.events import app as events_app
from recserve.cli.export import export
from recserve.cli.items import app as items_app
from recserve.cli.promote import promote, rollback
from recserve.cli.recommend import recommend
from recserve.cli.repo import repo
from recserve.cli.runs import runs
from recserve.cli.serve import serve
from recserve.cli.status import status, stop
from recserve.cli.store import app as store_app
from recserve.cli.train import train
from recserve.extras import missing_extra


def _optional_app(module: str, extra: str) -> typer.Typer:
    """A group of commands whose options come from an extra's classes (``recserve deploy``, ``recserve
    sagemaker``): the module's app where the extra is installed, else a group that answers any of its commands
    with the one line naming the extra (the other verbs run as ever)."""
    try:
        return importlib.import_module(module).app
    except ModuleNotFoundError as err:
        line = missing_extra(err, extra)
        if line is None:
            raise

    class Missing(TyperGroup):
        def resolve_command(self, ctx, args):
            err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
            ctx.exit(1)

    return typer.Typer(cls=Missing, help=escape(line), no_args_is_help=True)


whole_option_names()

app = typer.Typer(
    name="recserve",
    help="Real-time sequential recommendations: data, training, export, Triton serving and benchmarks.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        from recserve.cli.env import versions

        print(f"recserve {versions()['recserve']}")
        raise typer.Exit()


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print recserve's version.")
    ] = False,
) -> None:
    setup_logging(verbose)


for command in (
    data,
    train,
    runs,
    evaluate,
    export,
    repo,
    promote,
    rollback,
    serve,
    recommend,
    bench,
    env,
    status,
    stop,
):
    app.command()(command)
app.add_typer(_optional_app("recserve.cli.sagemaker", "sagemaker"), name="sagemaker")
app.add_typer(_optional_app("recserve.cli.deploy", "deploy"), name="deploy")
app.add_typer(store_app, name="store")
app.add_typer(events_app, name="events")
app.add_typer(items_app, name="items")

if __name__ == "__main__":
    app()
