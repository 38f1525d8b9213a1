"""A repository's next version, loaded into the running server, and the way back (``recserve promote`` and
``recserve rollback``).

The gate ranks the candidate and the run the repository serves on the same newest events
(``train.comparison``). The next version of every model is written with the settings the repository was
written with (its record; ``pipeline.write_next_version``, which exports the run first) and loaded through
Triton's model-control API (``--model-control explicit``: the server loads nothing on its own and keeps its
crashed-model watchdog); each model's policy serves its newest version, so the load moves every request to the
new version while the old one finishes what it holds. A rollback moves the newest version of every model aside
(``rolled-back-N``, a name Triton ignores) and loads again: the version before it serves.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recserve.artifacts.repository_record import read_repository_info, write_repository_info
from recserve.errors import ServingError

# a connection dropped before an answer (a reset, a peer that closed): tried again after each pause
RESET_ERRORS = (ConnectionResetError, ConnectionAbortedError)  # http.client.RemoteDisconnected among them
RESET_PAUSES_S = (0.2, 1.0)
ROLLED_BACK = "rolled-back-"  # a version folder moved aside: Triton ignores a name that is not a number
LOCK_FILE = ".recserve-changing.lock"  # a file: Triton takes only folders for models


@dataclass(frozen=True)
class ModelControl:
    """Triton's model-repository API on a server started with ``--model-control explicit`` and an admin key."""

    http_url: str  # host:port
    admin_key: str
    header: str = "recserve-admin-key"
    timeout_s: float = 300.0

    def _call(self, path: str, method: str = "GET", body: dict | None = None, hint: str = "") -> bytes:
        """The API's answer; ``hint`` ends the message of a refusal other than the key's. A connection the
        server drops before it answers (as a server under load may) is tried again after each of
        ``RESET_PAUSES_S``: a load and the index are safe to ask twice. A server that is not there is said at once."""
        for pause_s in RESET_PAUSES_S:
            try:
                return self._call_once(path, method, body, hint)
            except ServingError as err:
                cause = err.__cause__
                if not isinstance(getattr(cause, "reason", cause), RESET_ERRORS):
                    raise
            time.sleep(pause_s)
        return self._call_once(path, method, body, hint)

    def _call_once(self, path: str, method: str, body: dict | None, hint: str) -> bytes:
        data = json.dumps(body or {}).encode() if method == "POST" else None
        request = urllib.request.Request(
            f"http://{self.http_url}{path}", data=data, method=method, headers={self.header: self.admin_key}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return reply.read()
        except urllib.error.HTTPError as err:
            said = err.read().decode(errors="replace")[:300]
            if err.code == 403:
                raise ServingError(
                    f"{self.http_url}: the admin key was refused ({said}); give the server's --admin-key"
                ) from err
            raise ServingError(f"{self.http_url}{path}: HTTP {err.code}: {said}{hint}") from err
        except (urllib.error.URLError, OSError) as err:
            raise ServingError(
                f"{self.http_url}: no server answers ({err}); is it running (`recserve status`)?"
            ) from err

    def load(self, model: str) -> None:
        """Loads ``model`` as its repository folder now holds it (its newest version); returns once it is loaded.

        Raises:
            ServingError: the server refused or failed the load (its words), or the key was refused.
        """
        hint = " (a server loads versions when asked only under --model-control explicit)"
        self._call(f"/v2/repository/models/{model}/load", "POST", hint=hint)

    def index(self) -> list[dict]:
        """Each model version the server knows, with its state (READY, UNAVAILABLE, UNLOADING)."""
        return json.loads(self._call("/v2/repository/index", "POST", {}))


def versions_of(repo: Path) -> dict[str, list[int]]:
    """Each model of the repository with its version folders, oldest first (folders moved aside left out)."""
    return {
        config.parent.name: sorted(int(p.name) for p in config.parent.iterdir() if p.is_dir() and p.name.isdigit())
        for config in sorted(Path(repo).glob("*/config.pbtxt"))
    }


def serving_version(repo: Path) -> int:
    """The version the repository's models serve: the newest one every model holds.

    Raises:
        ServingError: no model, or models whose newest versions differ (a repository written by hand).
    """
    newest = {model: versions[-1] for model, versions in versions_of(repo).items() if versions}
    if not newest:
        raise ServingError(f"{repo}: no model with a version folder; write one with `recserve repo`")
    if len(set(newest.values())) > 1:
        shown = ", ".join(f"{m} {v}" for m, v in newest.items())
        raise ServingError(f"{repo}: its models' newest versions differ ({shown}); promote needs one version for all")
    return next(iter(newest.values()))


def repository_settings(repo: Path, info: dict):
    """The settings the repository was written with (its record), as ``RepositorySettings``.

    Raises:
        ServingError: a record without them (written by an older recserve).
    """
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    recorded = info.get("settings")
    if not isinstance(recorded, dict) or not info.get("layouts"):
        raise ServingError(
            f"{repo}: its record holds no settings (written by an older recserve); write it again with `recserve repo`"
        )
    known = {f.name for f in dataclasses.fields(RepositorySettings)}
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items() if k in known}
    return RepositorySettings(**values)


def remove_version(repo: Path, version: int) -> None:
    import shutil

    for folder in Path(repo).glob(f"*/{version}"):
        if (folder.parent / "config.pbtxt").is_file():
            shutil.rmtree(folder, ignore_errors=True)


def load_everywhere(control: ModelControl, repo: Path, version: int, timeout_s: float = 300) -> float:
    """Loads every model of the repository and waits until the server says ``version`` of each is READY.

    Returns:
        The seconds it took.

    Raises:
        ServingError: a load failed, or a version not ready within ``timeout_s``.
    """
    started = time.monotonic()
    models = list(versions_of(repo))
    for model in models:
        control.load(model)
    while True:
        ready = {(m["name"], m.get("version")) for m in control.index() if m.get("state") == "READY"}
        missing = [m for m in models if (m, str(version)) not in ready]
        if not missing:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise ServingError(f"version {version} of {', '.join(missing)} not ready within {timeout_s:g} s")
        time.sleep(0.2)


def move_aside(repo: Path, version: int) -> list[Path]:
    """Every model's folder of ``version`` renamed ``rolled-back-VERSION`` (kept, never served)."""
    moved = []
    for model in versions_of(repo):
        folder = Path(repo) / model / str(version)
        if folder.is_dir():
            target = folder.with_name(f"{ROLLED_BACK}{version}-{time.strftime('%Y%m%dT%H%M%S')}")
            folder.rename(target)
            moved.append(target)
    return moved


@contextmanager
def changing(repo: Path) -> Iterator[None]:
    """Holds the repository for one promotion or rollback at a time (a lock file beside its models).

    Raises:
        ServingError: another promotion or rollback holds it.
    """
    import fcntl

    with open(Path(repo) / LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise ServingError(f"{repo}: another `recserve promote` or `rollback` is changing it; try again") from err
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record_serving(repo: Path, version: int) -> str | None:
    """The repository's record says which run ``version`` came from serves now; returns that run."""
    info = read_repository_info(repo)
    run = info.get("versions", {}).get(str(version), {}).get("run")
    if run:
        info["run"] = run
    info["serving"] = version
    write_repository_info(repo, info)
    return run
