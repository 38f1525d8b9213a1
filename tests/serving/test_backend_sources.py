"""The native backends' sources: git mirrors at pinned commits (verified, cached, a wrong branch refused), the
offline folder (checked against the pinned trees), the ONNX Runtime headers' API version, and one clear error
when nothing can be had. Small trees of our own stand in for Triton's repositories."""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
from pathlib import Path

import pytest

import backend_sources as sources
from backend_sources import GitSource, check_ort_headers, fetch_sources, tree_hash
from recserve.errors import BuildError

NAMES = ("backend", "core")


def _git(folder: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True, env=env)
    return done.stdout.strip()


def _tree(folder: Path, name: str, text: str) -> Path:
    (folder / "src").mkdir(parents=True)
    (folder / "CMakeLists.txt").write_text(f"project({name})\n")
    (folder / "src" / f"{name}.cc").write_text(text)
    return folder


def _mirror(root: Path, name: str, text: str, branch: str = "r24.10") -> GitSource:
    """A bare repository ``root/<name>.git`` whose ``branch`` holds one commit of a small tree."""
    work = _tree(root / "work" / name, name, text)
    _git(work, "init", "-q", "-b", branch)
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", name)
    commit = _git(work, "rev-parse", "HEAD")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / f"{name}.git")], check=True)
    return GitSource(name, commit, tree_hash(work))


def _hiredis_archive(path: Path, text: str = "/* hiredis */\n") -> str:
    """A source distribution laid out as hiredis's (``vendor/hiredis`` inside one top folder); its SHA-256."""
    work = path.parents[1] / "hiredis-work" / f"hiredis-{sources.HIREDIS_VERSION}" / "vendor" / "hiredis"
    work.mkdir(parents=True, exist_ok=True)
    (work / "hiredis.c").write_text(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        tar.add(work.parents[1], arcname=work.parents[1].name)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """recserve's cache in ``tmp_path``, holding a small tree of our own where hiredis's sources go (pinned)."""
    monkeypatch.setenv("RECSERVE_CACHE", str(tmp_path / "cache"))
    digest = _hiredis_archive(tmp_path / "cache" / "sources" / sources.HIREDIS_ARCHIVE)
    monkeypatch.setattr(sources, "HIREDIS_SHA256", digest)
    return tmp_path / "cache"


@pytest.fixture
def mirrors(tmp_path) -> tuple[Path, tuple[GitSource, ...], GitSource]:
    root = tmp_path / "mirrors"
    repos = tuple(_mirror(root, name, f"// {name} at r24.10\n") for name in NAMES)
    json = _mirror(root, "rapidjson", "// header-only\n", branch="master")
    (root / "work" / "rapidjson" / "include").mkdir()
    return root, repos, GitSource("rapidjson", json.commit, json.tree, url=f"{root}/rapidjson.git", branch="master")


def test_mirrors_are_fetched_at_the_pinned_commits_and_cached(mirrors, cache, tmp_path):
    root, repos, json = mirrors
    written = fetch_sources(tmp_path / "out", base_url=f"file://{root}", repos=repos, rapidjson=json)
    assert set(written) == {*NAMES, "rapidjson", "hiredis"}
    assert (written["hiredis"] / "hiredis.c").read_text() == "/* hiredis */\n"
    assert (tmp_path / "out" / "core" / "src" / "core.cc").read_text() == "// core at r24.10\n"
    assert not (tmp_path / "out" / "core" / ".git").exists()  # a plain tree, as the offline folder gives
    checkouts = {p.name for p in (cache / "sources").iterdir() if p.is_dir()}
    assert checkouts == {f"{s.name}-{s.commit}" for s in (*repos, json)}
    # a second build fetches nothing: the mirrors may be gone
    subprocess.run(["rm", "-rf", str(root)], check=True)
    fetch_sources(tmp_path / "again", base_url="file:///nowhere", repos=repos, rapidjson=json)
    assert (tmp_path / "again" / "backend" / "src" / "backend.cc").is_file()


def test_a_mirror_whose_branch_holds_another_commit_is_refused(mirrors, cache, tmp_path):
    root, repos, json = mirrors
    pinned = repos[0]
    other = _git(root / "work" / "backend", "rev-parse", "HEAD")
    wrong = GitSource(pinned.name, "0" * 40, pinned.tree)  # a commit the mirror does not hold
    with pytest.raises(BuildError, match=f"branch r24.10 is at {other}, which does not hold the pinned commit 0{{40}}"):
        fetch_sources(tmp_path / "out", base_url=str(root), repos=(wrong,), rapidjson=json)
    assert not any((cache / "sources").glob("backend-0000*")), "nothing unverified is cached"


def test_no_source_at_all_is_one_error_naming_what_to_set(cache, tmp_path):
    with pytest.raises(BuildError, match="set TRITON_SOURCES_URL to a mirror.*or TRITON_NATIVE_SRC to a folder"):
        fetch_sources(tmp_path / "out", base_url="file:///nowhere/at/all")


def _offline_folder(folder: Path, mirrors_root: Path) -> None:
    """The offline layout made from the mirrors' trees: triton-r24.10-src.tar.gz and rapidjson's include."""
    folder.mkdir()
    with tarfile.open(folder / sources.TRITON_ARCHIVE, "w:gz") as tar:
        for name in NAMES:
            tar.add(mirrors_root / "work" / name, arcname=name, filter=lambda m: None if ".git" in m.name else m)


def test_the_offline_folder_is_checked_against_the_pinned_trees(mirrors, cache, tmp_path):
    root, repos, _ = mirrors
    include = root / "work" / "rapidjson" / "include"
    (include / "rapidjson.h").write_text("// rapidjson\n")
    json = GitSource("rapidjson", "24b5e7a" + "0" * 33, tree_hash(include), subdir="include")
    offline = tmp_path / "offline"
    _offline_folder(offline, root)
    with tarfile.open(offline / "rapidjson-24b5e7a-include.tar.gz", "w:gz") as tar:
        tar.add(include, arcname="include")
    written = fetch_sources(tmp_path / "out", offline=offline, repos=repos, rapidjson=json)
    assert (written["rapidjson"] / "include" / "rapidjson.h").is_file()
    (root / "work" / "core" / "src" / "core.cc").write_text("// changed\n")  # a copy that is not the release
    _offline_folder(tmp_path / "tampered", root)
    (offline / "rapidjson-24b5e7a-include.tar.gz").rename(tmp_path / "tampered" / "rapidjson-24b5e7a-include.tar.gz")
    with pytest.raises(BuildError, match=f"core is tree [0-9a-f]{{40}}, not the tree {repos[1].tree}"):
        fetch_sources(tmp_path / "out2", offline=tmp_path / "tampered", repos=repos, rapidjson=json)


def test_hiredis_comes_from_the_offline_folder_first_and_must_match_its_pin(cache, tmp_path, monkeypatch):
    offline = tmp_path / "offline"
    digest = _hiredis_archive(offline / sources.HIREDIS_ARCHIVE, "/* the offline copy */\n")
    monkeypatch.setattr(sources, "HIREDIS_SHA256", digest)
    written = sources.hiredis_sources(tmp_path / "a", offline)
    assert (written / "hiredis.c").read_text() == "/* the offline copy */\n"
    _hiredis_archive(offline / sources.HIREDIS_ARCHIVE, "/* another release */\n")
    with pytest.raises(BuildError, match=f"SHA-256 [0-9a-f]{{64}}, not {sources.HIREDIS_SHA256} of hiredis 3.5.0"):
        sources.hiredis_sources(tmp_path / "b", offline)
    assert not (tmp_path / "b").exists(), "nothing unverified is written"


def test_the_offline_folder_must_hold_the_triton_archive(tmp_path):
    with pytest.raises(BuildError, match="TRITON_NATIVE_SRC=.*: no triton-r24.10-src.tar.gz there"):
        fetch_sources(tmp_path / "out", offline=tmp_path)


def test_onnxruntime_headers_must_declare_an_api_the_library_serves(tmp_path):
    (tmp_path / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 29\n")
    assert check_ort_headers(tmp_path, "1.32.0", exact=False) == 29  # an older API: the library serves it
    with pytest.raises(BuildError, match="API version 29, but the installed onnxruntime 1.32.0 serves API version 32"):
        check_ort_headers(tmp_path, "1.32.0", exact=True)  # fetched for 1.32, so they must be 1.32's
    with pytest.raises(BuildError, match="serves API version 28 and older"):
        check_ort_headers(tmp_path, "1.28.1", exact=False)
