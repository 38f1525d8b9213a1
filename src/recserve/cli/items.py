"""``recserve items``: items hidden catalogue-wide (out of stock, withdrawn, not for sale here) or shown again,
in the session store that the served models follow: the next answer after a hide leaves the items out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from recserve.cli.console import console, err_console, handle_errors
from recserve.cli.store_access import PasswordEnvOption, StoreOption, open_store

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


CatalogueOption = Annotated[
    Path | None,
    typer.Option(
        "--catalogue",
        help="A run, export or repository folder: the IDs are checked against its catalogue (its ID type and "
        "their canonical form; IDs it lacks are reported as unknown).",
    ),
]
ChangeIdOption = Annotated[
    str | None,
    typer.Option(
        "--change-id",
        help="This change's ID (letters, digits, '._:-'): the command run again with it changes nothing more "
        "(default: a new ID; recserve's own retries keep it).",
    ),
]


def _catalogue_ids(folder: Path):
    """The sorted item IDs of a run or export folder, or of the run a repository serves."""
    import numpy as np

    from recserve.artifacts.catalogue import has_catalogue, read_catalogue
    from recserve.artifacts.repository_record import has_record, read_repository_info

    if not has_catalogue(folder) and has_record(folder):
        found = sorted(folder.glob("*/[0-9]*/**/item_ids.npy"))
        run = read_repository_info(folder).get("run")
        folder = found[-1].parent if found else Path(run) if run else folder
    return np.asarray(read_catalogue(folder))


def _checked(listed: list[str], catalogue: Path | None) -> tuple[list[str] | list[int], str | None, list[str]]:
    """The IDs as the catalogue writes them (integers for an integer catalogue), its ID type, and the IDs it
    lacks; without a catalogue, the IDs as given.

    Raises:
        typer.BadParameter: an ID that is not of the catalogue's type in canonical form (naming it).
    """
    import numpy as np

    from recserve.artifacts.catalogue import id_type_of
    from recserve.sessions import store_contract

    if catalogue is None:
        return listed, None, []
    ids = _catalogue_ids(catalogue)
    id_type = id_type_of(ids)
    bad = [item for item in listed if store_contract.item_problem(item, id_type)]
    if bad:
        kind = (
            "integers in canonical decimal (no sign but '-', no leading zero, no blank)"
            if id_type == "int64"
            else "text"
        )
        shown = ", ".join(repr(b) for b in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise typer.BadParameter(f"{shown}: not item IDs of this catalogue ({kind}); nothing was changed")
    values = np.array([int(i) for i in listed], dtype=np.int64) if id_type == "int64" else np.array(listed, dtype=str)
    position = np.searchsorted(ids, values).clip(0, max(len(ids) - 1, 0))
    known = (ids[position] == values) if len(ids) else np.zeros(len(values), dtype=bool)
    unknown = [listed[n] for n in np.flatnonzero(~known)]
    return (values.tolist() if id_type == "int64" else listed), id_type, unknown


def _change(items, file, store, password_env, catalogue, change_id, hidden: bool) -> None:
    listed = _items(items, file)
    values, id_type, unknown = _checked(listed, catalogue)
    with open_store(store, password_env, id_type, role="operator") as opened:
        result = opened.hide(values, hidden, change_id)
    verb = "hidden" if hidden else "shown again"
    line = f"{len(listed)} item(s) {verb} (version {result.version}): {result.changed} changed the set"
    if result.applied_before:
        line += f", {result.applied_before} were this change's ID applied before"
    console.print(line + "; the next answers follow", highlight=False)
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        err_console.print(
            f"[yellow]{len(unknown)} not in the catalogue ({escape(shown)}): kept in the set, for a later catalogue[/]",
            highlight=False,
        )
    elif catalogue is None:
        err_console.print(
            "not checked against a catalogue: --catalogue RUN|EXPORT|REPO checks the IDs and names unknown ones",
            highlight=False,
        )


@app.command()
@handle_errors
def hide(
    items: ItemsArgument = None,
    file: FileOption = None,
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
    catalogue: CatalogueOption = None,
    change_id: ChangeIdOption = None,
) -> None:
    """Hide items from every answer of the models that follow this store (as the store's operator user)."""
    _change(items, file, store, password_env, catalogue, change_id, hidden=True)


@app.command()
@handle_errors
def show(
    items: ItemsArgument = None,
    file: FileOption = None,
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
    catalogue: CatalogueOption = None,
    change_id: ChangeIdOption = None,
) -> None:
    """Show hidden items again (as the store's operator user)."""
    _change(items, file, store, password_env, catalogue, change_id, hidden=False)


@app.command("list")
@handle_errors
def list_hidden(
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of lines.")] = False,
) -> None:
    """The items hidden now, and the version of the set."""
    with open_store(store, password_env, role="operator") as opened:
        version, items = opened.hidden()
    if as_json:
        print(json.dumps({"version": version, "hidden": items}))
        return
    console.print(f"{len(items)} item(s) hidden (version {version})", highlight=False)
    for item in items:
        print(item)
