"""The sources of Triton's native backends: one table of what is pinned, fetched, verified and cached.

Triton's PyTorch and ONNX Runtime backends (and recserve's own) build against five repositories of Triton's
r24.10 release, rapidjson's headers and the ONNX Runtime C API headers of the installed onnxruntime. They come
from one of two places, as Triton's own build gets them:

- git: each repository cloned from ``$TRITON_SOURCES_URL/<name>.git`` (default Triton's GitHub organisation)
  and checked out at its pinned commit, which git verifies; rapidjson from its own repository; the ONNX
  Runtime headers from the upstream release tag of the installed version, checked by ``ORT_API_VERSION``.
  What is fetched is cached under ``$RECSERVE_CACHE/sources`` (default ``~/.cache/recserve``), keyed by
  commit, so a second build fetches nothing.
- an offline folder (``TRITON_NATIVE_SRC``) holding ``triton-r24.10-src.tar.gz`` (the five trees),
  ``rapidjson-<commit>-include.tar.gz`` and ``onnxruntime-<version>-c-api-headers.tar.gz``; each tree is
  checked against the git tree hash of its pinned commit before use.

Stdlib and recserve only, a build tool beside the backend it builds: ``scripts/build_triton_backends.sh`` runs
it as ``python native/backend_sources.py DEST``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from recserve.errors import BuildError
from recserve.files import cache_dir

log = logging.getLogger(__name__)

TRITON_RELEASE = "r24.10"  # the release of the Triton server that nvidia-pytriton 0.7.0 bundles (2.51)
SOURCES_URL_ENV = "TRITON_SOURCES_URL"
DEFAULT_SOURCES_URL = "https://github.com/triton-inference-server"
OFFLINE_ENV = "TRITON_NATIVE_SRC"
RAPIDJSON_URL = "https://github.com/Tencent/rapidjson.git"
ORT_HEADERS_URL = "https://raw.githubusercontent.com/microsoft/onnxruntime/v{version}/include/onnxruntime/core/session"
ORT_HEADER = "onnxruntime_c_api.h"


@dataclass(frozen=True)
class GitSource:
    """One repository at one commit. ``tree`` is git's hash of the files used (``subdir`` of the commit, or
    all of it): what an offline copy, which has no history, is checked against."""

    name: str
    commit: str
    tree: str
    url: str = ""  # empty: $TRITON_SOURCES_URL/<name>.git
    branch: str = TRITON_RELEASE
    subdir: str = ""


# The heads of branch r24.10 (the release of the bundled server); the trees are those commits' files.
TRITON_REPOS = (
    GitSource("backend", "ac03a5d97403dec841ad46d0439e93db12c9268f", "94f5b40f7f7d7b246c082e344ae8feafca94ebcd"),
    GitSource("core", "bfec7c61dc0939433f64f14e89b1973073eac8ba", "3bdf633963421820bab4c5d43ff72c4858348b9c"),
    GitSource("common", "578491fc3944f77d16a6a38e3d7691c485c47ba0", "ba424b6c2d34696d4ac21f251ba326867f85af05"),
    GitSource(
        "pytorch_backend", "e97a90061f7399b25368e2cb1f6d5c40f8cbae4e", "3064381ecc84bf28b9dcc4046b29b3611461ea61"
    ),
    GitSource(
        "onnxruntime_backend", "17e5cb23a6fbeb37282eb7079dd0b580cd79530d", "083594d2e7dbbc7efafabe17e4ce2045eb10e43d"
    ),
)
# header-only; Triton's common/triton_json.h compiles against master of 2025-02 as against Debian's 1.1.0
RAPIDJSON = GitSource(
    "rapidjson",
    "24b5e7a8b27f42fa16b96fc70aade9106cf7102f",
    "1da6fa35f246ecf36036d6ada8ce785bfe7a7aa1",
    url=RAPIDJSON_URL,
    branch="master",
    subdir="include",
)
TRITON_ARCHIVE = f"triton-{TRITON_RELEASE}-src.tar.gz"
# recserve's backend reads the session store with hiredis's C client: the copy that the `hiredis` package's
# source distribution vendors (hiredis 1.5.0), from the package index, checked by its SHA-256
HIREDIS_VERSION = "3.5.0"
HIREDIS_SHA256 = "c227592cc56b7df247abe4755c26723965be68972be2149fa441ac33d82131ba"
HIREDIS_ARCHIVE = f"hiredis-{HIREDIS_VERSION}.tar.gz"


def fetch_sources(
    dest: Path,
    offline: Path | None = None,
    base_url: str | None = None,
    ort_version: str | None = None,
    repos: tuple[GitSource, ...] = TRITON_REPOS,
    rapidjson: GitSource = RAPIDJSON,
) -> dict[str, Path]:
    """Writes every source the native build needs into ``dest``: ``<repo>/`` for each Triton repository,
    ``rapidjson/include/``, and (given ``ort_version``) ``onnxruntime-headers/``.

    Args:
        offline: a folder in the offline layout (``TRITON_NATIVE_SRC``); None fetches with git.
        base_url: where the Triton repositories are (``TRITON_SOURCES_URL``); None for upstream.
        ort_version: the installed onnxruntime's version; None leaves its headers out.
        repos, rapidjson: the pins (tests point them at mirrors of their own).

    Returns:
        name -> the folder written (``onnxruntime`` for the headers, ``hiredis`` for its C sources).

    Raises:
        BuildError: a source that cannot be had or does not verify, saying what to set.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if offline is not None:
        out = _from_offline(Path(offline), dest, ort_version, repos, rapidjson)
        return out | {"hiredis": hiredis_sources(dest / "hiredis", offline)}
    base = (base_url or DEFAULT_SOURCES_URL).rstrip("/")
    out = {}
    for source in (*repos, rapidjson):
        url = source.url or f"{base}/{source.name}.git"
        tree = cached_checkout(source, url) / source.subdir
        target = dest / source.name / source.subdir if source.subdir else dest / source.name
        shutil.copytree(tree, target, ignore=shutil.ignore_patterns(".git"), symlinks=True, dirs_exist_ok=True)
        out[source.name] = dest / source.name
    if ort_version:
        out["onnxruntime"] = _copy(cached_ort_headers(ort_version), dest / "onnxruntime-headers")
    return out | {"hiredis": hiredis_sources(dest / "hiredis")}


def hiredis_sources(dest: Path, offline: Path | None = None) -> Path:
    """hiredis's C sources (``vendor/hiredis`` of ``HIREDIS_ARCHIVE``, ``hiredis_archive``'s) in ``dest``."""
    with tempfile.TemporaryDirectory(dir=Path(dest).parent) as tmp:
        _extract(hiredis_archive(offline), Path(tmp), strip=1)
        _copy(Path(tmp) / "vendor" / "hiredis", Path(dest))
    return Path(dest)


def hiredis_archive(offline: Path | None = None) -> Path:
    """``HIREDIS_ARCHIVE``, checked by its SHA-256: from the offline folder, else the cache, else downloaded
    into the cache from the package index with pip."""
    cached = cache_dir() / "sources" / HIREDIS_ARCHIVE
    places = [Path(offline) / HIREDIS_ARCHIVE] if offline else []
    archive = next((p for p in [*places, cached] if p.is_file()), None)
    if archive is None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d",
             str(cached.parent), f"hiredis=={HIREDIS_VERSION}"],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0 or not cached.is_file():
            raise BuildError(
                f"cannot download hiredis {HIREDIS_VERSION}'s source distribution ({done.stderr.strip()[-300:]}): "
                f"put {HIREDIS_ARCHIVE} in {OFFLINE_ENV} or in {cached.parent}"
            )
        archive = cached
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != HIREDIS_SHA256:
        raise BuildError(f"{archive}: SHA-256 {digest}, not {HIREDIS_SHA256} of hiredis {HIREDIS_VERSION}'s sources")
    return archive


def cached_checkout(source: GitSource, url: str) -> Path:
    """``source`` checked out at its commit in the cache, fetched from ``url`` the first time only."""
    folder = cache_dir() / "sources" / f"{source.name}-{source.commit}"
    if _head(folder) == source.commit:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        _git(tmp, "init", "-q")
        # a pinned commit by itself where the server allows it (GitHub does), else the branch that holds it
        if not _try_git(tmp, "fetch", "-q", "--depth", "1", url, source.commit):
            if not _try_git(tmp, "fetch", "-q", url, f"refs/heads/{source.branch}"):
                raise BuildError(
                    f"cannot fetch {source.name} from {url} (branch {source.branch}): set {SOURCES_URL_ENV} to a "
                    f"mirror of Triton's repositories, or {OFFLINE_ENV} to a folder holding {TRITON_ARCHIVE}"
                )
            if not _try_git(tmp, "cat-file", "-e", f"{source.commit}^{{commit}}"):
                head = _git(tmp, "rev-parse", "FETCH_HEAD")
                raise BuildError(
                    f"{url}: branch {source.branch} is at {head}, which does not hold the pinned commit "
                    f"{source.commit} of {source.name}: that mirror is not Triton's {TRITON_RELEASE}"
                )
        _git(tmp, "-c", "advice.detachedHead=false", "checkout", "-q", source.commit)
        if _head(tmp) != source.commit:
            raise BuildError(f"{url}: the checkout of {source.name} is not at {source.commit}")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("fetched %s at %s from %s", source.name, source.commit[:12], url)
    return folder


def cached_ort_headers(version: str) -> Path:
    """The C API headers of ONNX Runtime ``version`` from its release tag, cached; checked to declare the
    API version of that release (``ORT_API_VERSION`` is the minor version)."""
    folder = cache_dir() / "sources" / f"onnxruntime-{version}-include"
    if (folder / ORT_HEADER).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        wanted, done = [ORT_HEADER], set()
        while wanted:  # the main header includes the others by name
            name = wanted.pop()
            url = f"{ORT_HEADERS_URL.format(version=version)}/{name}"
            try:
                with urllib.request.urlopen(url, timeout=60) as reply:
                    text = reply.read().decode()
            except OSError as err:
                raise BuildError(
                    f"cannot fetch ONNX Runtime {version}'s {name} from {url} ({err}): set {OFFLINE_ENV} to a folder "
                    f"holding onnxruntime-<version>-c-api-headers.tar.gz"
                ) from err
            (tmp / name).write_text(text)
            done.add(name)
            wanted += [n for n in re.findall(r'#include "(onnxruntime_[a-z_]+\.h)"', text) if n not in done]
        check_ort_headers(tmp, version, exact=True)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def ort_api_version(headers: Path) -> int:
    text = (Path(headers) / ORT_HEADER).read_text(errors="replace")
    match = re.search(r"#define ORT_API_VERSION (\d+)", text)
    if not match:
        raise BuildError(f"{headers / ORT_HEADER}: no ORT_API_VERSION: not ONNX Runtime's C API header")
    return int(match.group(1))


def check_ort_headers(headers: Path, version: str, exact: bool) -> int:
    """The headers' API version, which must be the library's (``exact``) or one it still serves (older).

    Raises:
        BuildError: headers newer than the library, or (``exact``) of another release.
    """
    api, library = ort_api_version(headers), int(version.split(".")[1])
    if api > library or (exact and api != library):
        raise BuildError(
            f"{headers}: ONNX Runtime headers of API version {api}, but the installed onnxruntime {version} "
            f"serves API version {library}{'' if exact else ' and older'}"
        )
    return api


def tree_hash(folder: Path) -> str:
    """Git's tree hash of a folder's files (what ``git rev-parse COMMIT^{tree}`` gives for the same files)."""
    with tempfile.TemporaryDirectory() as scratch:
        env = os.environ | {"GIT_DIR": f"{scratch}/git", "GIT_WORK_TREE": str(folder)}
        subprocess.run(["git", "init", "-q", "--bare", f"{scratch}/git"], check=True, capture_output=True)
        subprocess.run(["git", "add", "-A", "-f"], check=True, capture_output=True, env=env, cwd=folder)
        return subprocess.run(["git", "write-tree"], check=True, capture_output=True, text=True, env=env).stdout.strip()


def _from_offline(
    offline: Path, dest: Path, ort_version: str | None, repos: tuple[GitSource, ...], rapidjson: GitSource
) -> dict[str, Path]:
    archive = offline / TRITON_ARCHIVE
    if not archive.is_file():
        raise BuildError(f"{OFFLINE_ENV}={offline}: no {TRITON_ARCHIVE} there (the five trees of Triton's r24.10)")
    _extract(archive, dest)
    jsons = sorted(offline.glob(f"rapidjson-{rapidjson.commit[:7]}*-include.tar.gz"))
    if not jsons:
        raise BuildError(f"{OFFLINE_ENV}={offline}: no rapidjson-{rapidjson.commit[:7]}-include.tar.gz there")
    _extract(jsons[0], dest / "rapidjson")
    out = {}
    for source in (*repos, rapidjson):
        folder = dest / source.name / source.subdir if source.subdir else dest / source.name
        if not folder.is_dir() or (got := tree_hash(folder)) != source.tree:
            found = "missing" if not folder.is_dir() else f"tree {got}"
            raise BuildError(
                f"{OFFLINE_ENV}={offline}: {source.name} is {found}, not the tree {source.tree} of commit "
                f"{source.commit}: the offline copy is not the pinned release"
            )
        out[source.name] = dest / source.name
    if ort_version:
        out["onnxruntime"] = _offline_ort_headers(offline, dest / "onnxruntime-headers", ort_version)
    return out


def _offline_ort_headers(offline: Path, dest: Path, version: str) -> Path:
    """The newest headers in the offline folder that the installed library serves."""
    archives = sorted(
        offline.glob("onnxruntime-*-c-api-headers.tar.gz"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)],
        reverse=True,
    )
    problems = []
    for archive in archives:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            _extract(archive, Path(tmp), strip=1)
            try:
                check_ort_headers(Path(tmp), version, exact=False)
            except BuildError as err:
                problems.append(str(err))
                continue
            return _copy(Path(tmp), dest)
    raise BuildError(
        f"{OFFLINE_ENV}={offline}: no ONNX Runtime C API headers for onnxruntime {version} "
        f"(onnxruntime-<version>-c-api-headers.tar.gz){': ' + '; '.join(problems) if problems else ''}"
    )


def _extract(archive: Path, dest: Path, strip: int = 0) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts[strip:]
            if not parts:
                continue
            member.name = str(Path(*parts))
            members.append(member)
        tar.extractall(dest, members=members, filter="data")


def _copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, dirs_exist_ok=True)
    return dest


def _head(folder: Path) -> str | None:
    if not (folder / ".git").exists():
        return None
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _try_git(folder: Path, *args: str) -> bool:
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backend_sources",
        description="Write the native backends' sources into DEST: fetched with git from "
        f"${SOURCES_URL_ENV} (default {DEFAULT_SOURCES_URL}) at pinned commits and cached, or taken from the "
        f"offline folder ${OFFLINE_ENV}.",
    )
    parser.add_argument("dest", type=Path)
    parser.add_argument("--onnxruntime", metavar="VERSION", help="also the C API headers of this onnxruntime")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    offline = os.environ.get(OFFLINE_ENV)
    try:
        written = fetch_sources(
            args.dest, Path(offline) if offline else None, os.environ.get(SOURCES_URL_ENV), args.onnxruntime
        )
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    where = f"{OFFLINE_ENV}={offline}" if offline else os.environ.get(SOURCES_URL_ENV, DEFAULT_SOURCES_URL)
    print(f"sources of {', '.join(written)} from {where}, verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
