"""``recserve store``: recserve's own session store (a Redis server run from a folder, no root)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.cli.store_access import store_dir

app = typer.Typer(
    help="The embedded session store: a Redis server on loopback with a generated password, run from a folder "
    "(for the demo and a laptop; point serving at a team's Valkey or Redis with a store record instead).",
    no_args_is_help=True,
)

FolderOption = Annotated[
    Path | None, typer.Option("--dir", help="The store's folder (default: store/ in recserve's cache folder).")
]


@app.command()
@handle_errors
def start(
    folder: FolderOption = None,
    prefix: Annotated[str, typer.Option(help="Every key's prefix (the only keys its user may touch).")] = "recserve:",
    persist: Annotated[
        bool, typer.Option(help="Every acknowledged event on disk first (append-only file, fsync always).")
    ] = True,
    port: Annotated[
        int | None,
        typer.Option(help="Its port on 127.0.0.1 [default: the one it had before, else a free one]", min=1, max=65535),
    ] = None,
) -> None:
    """Start the store in the background (its data, password and port kept across restarts)."""
    from recserve.sessions import embedded_store

    where = store_dir(folder)
    already = (where / embedded_store.RECORD_FILE).is_file() and embedded_store.running(where)
    settings = embedded_store.start(where, prefix=prefix, persist=persist, port=port)
    if already:
        console.print(
            f"already running: session store at {settings.url}; its record: {where / embedded_store.RECORD_FILE}"
        )
        if port is not None and settings.url.rsplit(":", 1)[-1].split("/")[0] != str(port):
            console.print(
                f"[yellow]it keeps its port; `recserve store stop --dir {where}` first to move it to {port}[/]"
            )
        return
    console.print(
        f"session store at {settings.url} (user {settings.username}, prefix {settings.prefix!r}); "
        f"its record: {where / embedded_store.RECORD_FILE}"
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
def status(
    folder: FolderOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Say whether the store answers, and what it holds: sessions, hidden items (and their version)."""
    import json

    from recserve.sessions import embedded_store
    from recserve.sessions.session_store import SessionStore

    settings = embedded_store.settings_of(store_dir(folder))
    with SessionStore(settings) as store:
        store.ping()
    held = embedded_store.counts(store_dir(folder))
    if as_json:
        print(json.dumps({"url": settings.url, "folder": str(store_dir(folder)), "answers": True, **held}))
        return
    console.print(
        f"session store at {settings.url} answers: {held['sessions']:,} sessions, {held['hidden_items']:,} hidden "
        f"items (version {held['hidden_version']})"
    )
