"""Writing a stage's artifact so that it appears whole or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def replaced_on_success(out: Path, folder: bool = True) -> Iterator[Path]:
    """Yields a hidden temporary sibling of ``out`` (a folder, or a file path) to write into.

    When the block succeeds the temporary takes ``out``'s place (a previous ``out`` is removed only then);
    when it fails the temporary is deleted and ``out`` is left as it was. Readers never see a half-written
    artifact: a Triton polling the repository, a second command reading the folder.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    else:
        handle, name = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        os.close(handle)
        tmp = Path(name)
    tmp.chmod((0o777 if folder else 0o666) & ~_umask())  # what a plain mkdir or open would give, not 0700
    try:
        yield tmp
        if not folder:
            os.replace(tmp, out)
            return
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def cache_dir() -> Path:
    """recserve's cache folder: ``RECSERVE_CACHE``, else ``$XDG_CACHE_HOME/recserve`` (``~/.cache/recserve``),
    else, where the home folder cannot be written, one of the user's own in the temporary folder (named by the
    user's ID, 0700, refused unless it is the user's: never a folder another user made or can write)."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recserve"
    preferred = Path(os.environ.get("RECSERVE_CACHE") or default)
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    except OSError:
        return private_dir(Path(tempfile.gettempdir()) / f"recserve-cache-{os.getuid()}")


def private_dir(folder: Path) -> Path:
    """``folder`` made (or kept) as the user's alone: 0700, owned by the user.

    Raises:
        PermissionError: it is another user's, or a link (someone made it first, to read what is put there).
    """
    folder = Path(folder)
    with contextlib.suppress(FileExistsError):  # a file or a dangling link in its place: refused below
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if folder.is_symlink() or not folder.is_dir() or info.st_uid != os.getuid():
        raise PermissionError(f"{folder} is not this user's own folder; recserve keeps nothing there")
    if info.st_mode & 0o077:
        folder.chmod(0o700)
    return folder


def write_private(path: Path, text: str) -> None:
    """``text`` written to ``path`` whole (a temporary beside it, renamed), readable by its owner only."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600 from the first byte
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
