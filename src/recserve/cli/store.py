"""``recserve store``: recserve's own session store (a Redis server run from a folder, no root)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors

app = typer.Typer(
    help="The embedded session store: a Redis server on loopback with a generated password, run from a folder "
    "(for the demo and a laptop; point serving at a team's Valkey or Redis with a store record instead).",
    no_args_is_help=True,
)

FolderOption = Annotated[
    Path | None, typer.Option("--dir", help="The store's folder (default: store/ in recserve's cache folder).")
]


def store_dir(folder: Path | None) -> Path:
    from recserve.files import cache_dir

    return folder or cache_dir() / "store"


@app.command()
@handle_errors
def start(
    folder: FolderOption = None,
    prefix: Annotated[str, typer.Option(help="Every key's prefix (the only keys its user may touch).")] = "recserve:",
    persist: Annotated[
        bool, typer.Option(help="Every acknowledged event on disk first (append-only file, fsync always).")
    ] = True,
) -> None:
    """Start the store in the background (its data, password and port kept across restarts)."""
    from recserve.sessions import embedded_store

    settings = embedded_store.start(store_dir(folder), prefix=prefix, persist=persist)
    console.print(
        f"session store at {settings.url} (user {settings.username}, prefix {settings.prefix!r}); "
        f"its record: {store_dir(folder) / embedded_store.RECORD_FILE}"
    )


@app.command()
@handle_errors
def stop(folder: FolderOption = None) -> None:
    """Stop the store (its data stay in the folder)."""
    from recserve.sessions import embedded_store

    stopped = embedded_store.stop(store_dir(folder))
    console.print("stopped" if stopped else f"no store was running in {store_dir(folder)}")


@app.command()
@handle_errors
def status(folder: FolderOption = None) -> None:
    """Say whether the store answers."""
    from recserve.sessions import embedded_store
    from recserve.sessions.session_store import SessionStore

    settings = embedded_store.settings_of(store_dir(folder))
    with SessionStore(settings) as store:
        store.ping()
    console.print(f"session store at {settings.url} answers")
