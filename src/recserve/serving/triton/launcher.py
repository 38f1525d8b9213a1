"""Starts the Triton server that ships inside nvidia-pytriton on a model repository, and stops it gracefully.

What the bundled server needs (and what this module arranges): ``nvidia_pytriton.libs`` and the running
interpreter's LIBDIR on LD_LIBRARY_PATH, the interpreter's bin folder first on PATH (the python-backend stub
uses the first python it finds, which must have numpy < 2 and recserve), and the stub for this Python
version copied into ``backends/python/``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recserve.constants import GRPC_PORT, HTTP_PORT, METRICS_PORT
from recserve.errors import ServingError
from recserve.files import cache_dir
from recserve.serving.processes import child_pids, cmdline, proc_name, proc_stat, stop_with_parent
from recserve.serving.triton.placement import DEVICE_ENV

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"  # loopback unless asked otherwise
    http_port: int = HTTP_PORT
    grpc_port: int = GRPC_PORT
    metrics_port: int = METRICS_PORT
    model_control_mode: str = "none"  # none, poll (repository polling) or explicit (model-repository API)
    repository_poll_secs: int = 5
    restricted_api_key: str | None = None  # header value that unlocks the restricted APIs
    restricted_api_header: str = "recserve-admin-key"
    exit_timeout_secs: int = 30  # how long in-flight requests may finish after a stop
    log_verbose: int = 0
    threads_per_instance: int = 1  # CPU threads of each model process (OMP/MKL); instances are the parallelism
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()  # (name, value) set for the server process

    def validate(self) -> None:
        if self.model_control_mode not in ("none", "poll", "explicit"):
            raise ServingError(f"model control mode {self.model_control_mode!r}: expected none, poll or explicit")
        if self.model_control_mode == "explicit" and not self.restricted_api_key:
            raise ServingError("model control mode explicit loads models over the API: set a restricted-API key")


@dataclass(frozen=True)
class Bundle:
    """Where the Triton server of the nvidia-pytriton wheel lives."""

    binary: Path
    backend_dir: Path
    libs: Path


def find_bundle() -> Bundle:
    """Locates the server; ``TRITONSERVER_BIN`` and ``TRITON_BACKEND_DIR`` override the wheel's copy."""
    if os.environ.get("TRITONSERVER_BIN"):
        binary = Path(os.environ["TRITONSERVER_BIN"])
        backend_dir = Path(os.environ.get("TRITON_BACKEND_DIR", binary.parent.parent / "backends"))
        return Bundle(binary, backend_dir, binary.parent.parent.parent.parent / "nvidia_pytriton.libs")
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServingError("the Triton server ships in nvidia-pytriton: `pip install nvidia-pytriton==0.7.0`")
    root = Path(next(iter(spec.submodule_search_locations)))
    server = root / "tritonserver"
    return Bundle(server / "bin" / "tritonserver", backend_folder(server), root.parent / "nvidia_pytriton.libs")


def backend_folder(server: Path) -> Path:
    """recserve's own backend folder for the bundled server (the installed package is never written to):
    the bundle's backends linked in, and its python backend with the stub for this Python beside it.

    It lives in recserve's cache folder (``files.cache_dir``).
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServingError(f"the bundled Triton has no python-backend stub for Python {version}")
    folder = cache_dir() / "triton-backends" / f"{server.resolve().as_posix().replace('/', '_')}-py{version}"
    (folder / "python").mkdir(parents=True, exist_ok=True)
    for source in (server / "backends").iterdir():
        if source.name == "python":
            for item in source.iterdir():
                if item.name != stub.name:
                    _link(folder / "python" / item.name, item)
        else:
            _link(folder / source.name, source)
    target = folder / "python" / stub.name
    if not target.is_file() or target.stat().st_size != stub.stat().st_size:
        shutil.copy2(stub, target)
    for native in native_backends():
        _link(folder / native.name, native)
    return folder


def native_backends() -> list[Path]:
    """Backends built from source beside the bundled python one (``scripts/build_triton_backends.sh``):
    the folders under ``RECSERVE_TRITON_BACKENDS``, default ``build/triton-backends`` of a source checkout."""
    root = os.environ.get("RECSERVE_TRITON_BACKENDS")
    folder = Path(root) if root else Path(__file__).resolve().parents[4] / "build" / "triton-backends"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and any(p.glob("libtriton_*.so")))


PLATFORM_BACKENDS = {"pytorch_libtorch": "pytorch", "onnxruntime_onnx": "onnxruntime"}  # Triton's own mapping


def model_backends(repo: Path) -> list[tuple[str, str, Any]]:
    """(model, the backend its config names, the parsed config) for each model of a repository; a model
    whose config does not parse is left out (the server reports it in its own words)."""
    from recserve.serving.triton.model_config import parse_pbtxt

    found = []
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        try:
            config = parse_pbtxt(path.read_text())
        except Exception:
            continue
        found.append((path.parent.name, config.backend or PLATFORM_BACKENDS.get(config.platform, ""), config))
    return found


def check_backends(repo: Path, backend_dir: Path) -> None:
    """Refuses, before the server starts, a repository whose models need a backend the folder lacks.

    Raises:
        ServingError: naming the models, their backend and how to build it.
    """
    missing: dict[str, list[str]] = {}
    cpu_only: dict[str, list[str]] = {}
    for model, backend, config in model_backends(repo):
        if backend and not (backend_dir / backend).is_dir():
            missing.setdefault(backend, []).append(model)
        elif backend in CUDA_BUILT and on_gpus(config) and not built_with_cuda(backend_dir / backend):
            cpu_only.setdefault(backend, []).append(model)
    if missing:
        names = "; ".join(f"{', '.join(models)} need(s) Triton's {b} backend" for b, models in missing.items())
        raise ServingError(
            f"{repo}: {names}, which is not in {backend_dir}: build the native backends with "
            "scripts/build_triton_backends.sh (make test does), or set RECSERVE_TRITON_BACKENDS to where they are"
        )
    if cpu_only:
        names = "; ".join(f"{', '.join(models)} run(s) on GPUs on the {b} backend" for b, models in cpu_only.items())
        raise ServingError(
            f"{repo}: {names}, which was built without CUDA ({backend_dir}): rebuild it on this GPU host with "
            "`rm -rf build/triton-backends && scripts/build_triton_backends.sh` (it builds with CUDA where torch "
            "sees a GPU; TRITON_BACKENDS_GPU=1 asks for it)"
        )


KIND_GPU = 1  # inference.ModelInstanceGroup.Kind
CUDA_BUILT = ("pytorch", "recserve")  # the backends whose build says whether it has CUDA (build.json)


def on_gpus(config) -> bool:
    return any(group.kind == KIND_GPU for group in config.instance_group)


def built_with_cuda(folder: Path) -> bool:
    """Whether a backend built by scripts/build_triton_backends.sh has CUDA (its ``build.json``)."""
    try:
        return bool(json.loads((folder / "build.json").read_text()).get("cuda"))
    except (OSError, ValueError):
        return False


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and link.resolve() == target.resolve():
        return
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def server_env(bundle: Bundle, settings: ServerSettings) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, str(settings.threads_per_instance))
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(bundle.libs), libdir, env.get("LD_LIBRARY_PATH")) if p)
    # the stub runs the first python on PATH: STUB_ENV (a venv with numpy < 2) where set, else this one
    python_dir = Path(env["STUB_ENV"]) / "bin" if env.get("STUB_ENV") else Path(sys.executable).parent
    env["PATH"] = os.pathsep.join([str(python_dir), env.get("PATH", "")])
    return env | dict(settings.extra_env)


def serving_flags(exit_timeout_s: int) -> list[str]:
    """The flags every Triton recserve starts takes, wherever it runs (`recserve serve`, the Kubernetes
    Deployment, KServe's ServingRuntime): ready only when every model is, in-flight requests given
    ``exit_timeout_s`` to finish after a stop, latency quantiles kept (what the p99 alert reads)."""
    return [
        "--strict-readiness=true",
        f"--exit-timeout-secs={exit_timeout_s}",
        "--metrics-config=summary_latencies=true",
    ]


def server_args(bundle: Bundle, repo: Path, s: ServerSettings) -> list[str]:
    args = [
        str(bundle.binary),
        f"--model-repository={repo}",
        f"--backend-directory={bundle.backend_dir}",
        f"--http-address={s.host}",
        f"--grpc-address={s.host}",
        f"--metrics-address={s.host}",
        f"--http-port={s.http_port}",
        f"--grpc-port={s.grpc_port}",
        f"--metrics-port={s.metrics_port}",
        f"--model-control-mode={s.model_control_mode}",
        f"--log-verbose={s.log_verbose}",
        *serving_flags(s.exit_timeout_secs),
    ]
    if s.model_control_mode == "poll":
        args.append(f"--repository-poll-secs={s.repository_poll_secs}")
    restricted = "model-repository,shared-memory,logging"
    key = s.restricted_api_key or os.urandom(16).hex()  # without a key, nobody can use them
    args += [
        f"--http-restricted-api={restricted}:{s.restricted_api_header}={key}",
        f"--grpc-restricted-protocol={restricted}:{s.restricted_api_header}={key}",
    ]
    return [*args, *s.extra_args]


@dataclass
class TritonServer:
    """A running tritonserver; a context manager that waits for readiness and stops on exit."""

    repo: Path
    settings: ServerSettings = field(default_factory=ServerSettings)
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    gpu: bool = False  # models run on the GPU even in CPU instances (RECSERVE_DEVICE=cuda for the stubs)

    @property
    def http_url(self) -> str:
        return f"{self.settings.host}:{self.settings.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.settings.host}:{self.settings.grpc_port}"

    def start(self) -> TritonServer:
        self.settings.validate()
        if not Path(self.repo).is_dir():
            raise ServingError(f"{self.repo}: no such model repository; write one with `recserve repo`")
        bundle = find_bundle()
        check_backends(Path(self.repo), bundle.backend_dir)
        self.log_path = self.log_path or Path(self.repo).parent / f"tritonserver-{self.settings.http_port}.log"
        log_file = open(self.log_path, "wb")  # noqa: SIM115 - the server writes to it for its lifetime
        env = server_env(bundle, self.settings) | ({DEVICE_ENV: "cuda"} if self.gpu else {})
        self.process = subprocess.Popen(
            server_args(bundle, Path(self.repo).resolve(), self.settings),
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=stop_with_parent,
        )
        log_file.close()
        return self

    def exit_code(self) -> int | None:
        """None while the server runs; its exit code once it has exited."""
        if self.process is None:
            raise ServingError("the server was never started")
        return self.process.poll()

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Waits until every model is ready; raises with the server's own words if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (code := self.exit_code()) is not None:
                raise ServingError(f"tritonserver exited with code {code}:\n{self.failure_summary()}")
            if self.is_ready():
                return
            time.sleep(0.25)
        self.stop()
        raise ServingError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.failure_summary()}")

    def failure_summary(self, lines: int = 30) -> str:
        """The log lines that say why (model load errors first)."""
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        errors = [
            line
            for line in text
            if line.startswith("E") or "UNAVAILABLE" in line or "failed" in line.lower() or "unrecognized" in line
        ]
        return "\n".join((errors or text)[-lines:])

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM, letting in-flight requests finish (Triton's exit timeout), then SIGKILL if still alive."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s or self.settings.exit_timeout_secs + 10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()

    def stub_count(self) -> int:
        """Live python-backend stub processes of this server (one per python model instance)."""
        if self.process is None or self.process.poll() is not None:
            return 0
        return sum(b"triton_python_backend_stub" in cmdline(pid) for pid in child_pids(self.process.pid))

    def dead_stubs(self) -> int:
        """Python-backend stubs of this server that died and were not reaped (zombies: Triton 2.51 keeps them)."""
        if self.process is None or self.process.poll() is not None:
            return 0
        dead = 0
        for pid in child_pids(self.process.pid):
            fields = proc_stat(pid)
            dead += fields is not None and fields[0] == "Z" and proc_name(pid).startswith("triton_python")
        return dead

    def restart(self, timeout_s: float = 300) -> float:
        """Stops and starts the server on the same repository; returns the seconds it took."""
        started = time.monotonic()
        self.stop(timeout_s=10)  # a server with a dead model process may never finish a graceful stop
        self.start()
        self.wait_ready(timeout_s)
        return time.monotonic() - started

    def supervise(
        self,
        stop: threading.Event,
        watch_secs: float,
        ready_timeout_s: float = 300,
        report: Callable[[str], None] = log.warning,
    ) -> int | None:
        """Keeps the server up until ``stop`` is set; returns its exit code if it exits on its own first.

        Every ``watch_secs`` (0: never) it counts the python model processes; one that died (Triton 2.51 does
        not restart it) restarts the whole server, told through ``report``. Only with model control
        ``none``, where model processes never change on purpose.
        """
        stubs, next_check = self.stub_count(), time.monotonic() + watch_secs
        while not stop.wait(0.5):
            if (code := self.exit_code()) is not None:
                return code
            if watch_secs and self.settings.model_control_mode == "none" and time.monotonic() >= next_check:
                alive, dead = self.stub_count(), self.dead_stubs()
                if alive < stubs or dead:  # dead: also one that died before the first count
                    report(f"{max(stubs - alive, dead)} model process(es) died: restarting the server")
                    report(f"recovered in {self.restart(ready_timeout_s):.1f} s")
                    alive = self.stub_count()
                stubs, next_check = alive, time.monotonic() + watch_secs
        return None

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
