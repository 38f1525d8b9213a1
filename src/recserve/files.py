"""Writing a stage's artifact so that it appears whole or not at all."""

from __future__ import annotations

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
    else one in the temporary folder where the home folder cannot be written."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recserve"
    preferred = Path(os.environ.get("RECSERVE_CACHE") or default)
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    except OSError:
        fallback = Path(tempfile.gettempdir()) / "recserve-cache"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback
