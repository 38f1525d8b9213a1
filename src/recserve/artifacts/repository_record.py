"""A model repository's record (``recserve.json``): the run it serves and, for each layout written, the export it
was built from (backend, precision, device) and, where it was given one, its store's record (never a
password): the sessions of a layout by session, the hidden items of any. Written by ``recserve repo`` and read
by ``recserve bench`` and ``recserve deploy``, only through this module."""

from __future__ import annotations

import json
from pathlib import Path

from recserve.constants import REPOSITORY_FILE


def record_layouts(
    repo: Path,
    layouts: tuple[str, ...],
    export: dict,
    run: str,
    session_store: dict | None = None,
    settings: dict | None = None,
    version: int = 1,
) -> None:
    """Adds the layouts just written to the repository's record, with the export each was built from
    (``export``: its backend, precision, device and largest k), the run it came from, the store they were given
    (``session_store``: its record), if any, the repository's settings (what a promotion writes the next
    version with) and the version's run (``versions``)."""
    info = read_repository_info(repo)
    for layout in layouts:
        info["layouts"][layout] = dict(export) | ({"session_store": session_store} if session_store else {})
    info["run"] = run
    if settings is not None:
        info["settings"] = settings
    written = info.setdefault("versions", {}).setdefault(str(version), {"layouts": []})
    written["run"] = str(Path(run).resolve())
    written["layouts"] = sorted(set(written["layouts"]) | set(layouts))
    write_repository_info(repo, info)


def write_repository_info(repo: Path, info: dict) -> None:
    """Replaces the repository's record whole (a reader never sees half of it)."""
    from recserve.files import replaced_on_success

    with replaced_on_success(Path(repo) / REPOSITORY_FILE, folder=False) as tmp:
        tmp.write_text(json.dumps(info, indent=2) + "\n")


def read_repository_info(repo: Path) -> dict:
    """The repository's record: the run it serves and each layout's export; empty if none."""
    path = Path(repo) / REPOSITORY_FILE
    info = json.loads(path.read_text()) if path.is_file() else {}
    if not isinstance(info.get("layouts"), dict):  # written by an older recserve: a list of names
        info["layouts"] = {}
    return info


def catalogue_id_type(repo: Path) -> str | None:
    """The item ID type ("int64" or "string") of the catalogue the repository's models serve, or None where its
    record does not say (written by an older recserve)."""
    types = {export.get("item_id_type") for export in read_repository_info(repo)["layouts"].values()} - {None}
    return types.pop() if len(types) == 1 else None


def has_record(repo: Path) -> bool:
    """Whether ``repo`` is a repository that ``recserve repo`` wrote."""
    return (Path(repo) / REPOSITORY_FILE).is_file()


def store_of(info: dict) -> dict | None:
    """The store record of a repository's record (its sessions, its hidden items), if any layout has one."""
    return next((record["session_store"] for record in info["layouts"].values() if record.get("session_store")), None)
