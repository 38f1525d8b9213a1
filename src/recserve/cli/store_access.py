"""How the verbs reach the session store (``events``, ``items``, ``store``, ``repo``, ``status``): its
folder's default, the options that name a store and its password, and the store opened as a role's user."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def store_dir(folder: Path | None) -> Path:
    """The embedded store's folder: ``folder``, else store/ in recserve's cache folder (a laptop's default)."""
    from recserve.files import cache_dir

    return folder or cache_dir() / "store"


StoreOption = Annotated[
    Path | None,
    typer.Option(
        "--store",
        help="The store: a folder of `recserve store start`, or a JSON file of its settings (url, username, "
        "password_file, prefix, ...) (default: recserve's embedded store).",
    ),
]
PasswordEnvOption = Annotated[
    str | None, typer.Option(help="Take the store's password from this environment variable (else password_file).")
]


def open_store(store: Path | None, password_env: str | None, id_type: str | None = None, role: str = "serving"):
    """The store as ``role``'s user reaches it: an embedded store's folder gives that role's user; a record file
    is used as it is (a team's store: the record of the user meant for the work)."""
    from recserve.sessions import embedded_store
    from recserve.sessions.session_store import SessionStore
    from recserve.sessions.store_settings import StoreSettings, password_from_env, read_store_record

    where = store or store_dir(None)
    record = read_store_record(where)
    if where.is_dir() and role != "serving":
        record = embedded_store.role_settings(where, role).describe()
    return SessionStore(StoreSettings.from_record(record, password=password_from_env(password_env)), id_type)
