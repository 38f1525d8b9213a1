"""``recserve items``: items hidden catalogue-wide (out of stock, withdrawn, not for sale here) or shown again,
in the session store that the served models follow: the next answer after a hide leaves the items out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.cli.events import PasswordEnvOption, StoreOption, open_store

app = typer.Typer(
    help="Items hidden from every answer (out of stock, withdrawn) or shown again; served models follow the "
    "store's set without reloading.",
    no_args_is_help=True,
)

ItemsArgument = Annotated[list[str] | None, typer.Argument(help="Item IDs (as the catalogue writes them).")]
FileOption = Annotated[Path | None, typer.Option("--file", help="A file of item IDs, one a line, besides.")]


def _items(items: list[str] | None, file: Path | None) -> list[str]:
    listed = list(items or [])
    if file is not None:
        try:
            listed += [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as err:
            raise typer.BadParameter(f"{file}: cannot read item IDs from it ({err})", param_hint="--file") from None
    if not listed:
        raise typer.BadParameter("no item IDs: give them as arguments or with --file", param_hint="ITEMS")
    return listed


def _change(items, file, store, password_env, hidden: bool) -> None:
    listed = _items(items, file)
    with open_store(store, password_env) as opened:
        changed = opened.hide(listed, hidden)
        version = opened.hidden_version()
    verb = "hidden" if hidden else "shown again"
    console.print(f"{changed} of {len(listed)} item(s) {verb} (version {version}); the next answers follow")


@app.command()
@handle_errors
def hide(
    items: ItemsArgument = None,
    file: FileOption = None,
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
) -> None:
    """Hide items from every answer of the models that follow this store."""
    _change(items, file, store, password_env, hidden=True)


@app.command()
@handle_errors
def show(
    items: ItemsArgument = None,
    file: FileOption = None,
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
) -> None:
    """Show hidden items again."""
    _change(items, file, store, password_env, hidden=False)


@app.command("list")
@handle_errors
def list_hidden(
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of lines.")] = False,
) -> None:
    """The items hidden now, and the version of the set."""
    with open_store(store, password_env) as opened:
        version, items = opened.hidden()
    if as_json:
        print(json.dumps({"version": version, "hidden": items}))
        return
    console.print(f"{len(items)} item(s) hidden (version {version})", highlight=False)
    for item in items:
        print(item)
