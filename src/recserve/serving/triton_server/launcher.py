"""Starts the Triton server that ships inside nvidia-pytriton on a model repository, waits for it, and stops
it gracefully; the flags every recserve Triton takes (``serving_flags``).

What the bundled server needs at start (and what this module arranges): ``nvidia_pytriton.libs`` and the
running interpreter's LIBDIR on LD_LIBRARY_PATH, and the interpreter's bin folder first on PATH (the
python-backend stub uses the first python it finds, which must have numpy < 2 and recserve). Its files and
backend folder are ``bundle``'s; watching its model processes is ``supervisor``'s.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from recserve.constants import GRPC_PORT, HTTP_PORT, METRICS_PORT
from recserve.errors import ServingError
from recserve.option_fields import option
from recserve.processes import exit_code, seal_shared_memory, stop_with_parent
from recserve.serving.triton_repository.placement import DEVICE_ENV
from recserve.serving.triton_server.bundle import (
    SECRET_ENV,
    SECRET_MARK,
    Bundle,
    argv_secret_library,
    check_backends,
    find_bundle,
)


@dataclass(frozen=True)
class ServerSettings:
    """The Triton server's own settings; a field with a help is an option of `recserve serve`."""

    host: str = option("127.0.0.1", "Address to listen on (loopback by default).")
    http_port: int = option(HTTP_PORT, "HTTP port.")
    grpc_port: int = option(GRPC_PORT, "gRPC port.")
    metrics_port: int = option(METRICS_PORT, "Prometheus metrics port.")
    model_control_mode: str = option(
        "none",
        "none, poll (watch the repository for new versions) or explicit (every model at the start, a new version "
        "when `recserve promote` loads it; needs --admin-key).",
        flags=("--model-control",),
    )
    repository_poll_secs: int = option(5, "Repository poll interval (poll mode).", flags=("--poll-secs",))
    restricted_api_key: str | None = option(
        None,
        "Key that unlocks the model-repository, shared-memory and logging APIs (header recserve-admin-key).",
        flags=("--admin-key",),
        envvar="RECSERVE_ADMIN_KEY",
    )
    restricted_api_header: str = "recserve-admin-key"
    exit_timeout_secs: int = option(30, "Time in-flight requests get to finish on stop.")
    latency_quantiles: str = option(
        "",
        "Latency quantiles for Triton's metrics (nv_inference_request_summary_us; the p99 alert's input), as "
        "quantile:error pairs, e.g. 0.5:0.05,0.99:0.001. Off by default: Triton 2.51's summaries stall every "
        "instance of a model for milliseconds each 500 requests under load (docs/deployment.md).",
    )
    log_verbose: int = 0
    threads_per_instance: int = 1  # CPU threads of each model process (OMP/MKL); instances are the parallelism
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()  # (name, value) set for the server process

    def validate(self) -> None:
        if self.model_control_mode not in ("none", "poll", "explicit"):
            raise ServingError(f"model control mode {self.model_control_mode!r}: expected none, poll or explicit")
        if self.model_control_mode == "explicit" and not self.restricted_api_key:
            raise ServingError("model control mode explicit loads models over the API: set a restricted-API key")
        if self.latency_quantiles:
            check_latency_quantiles(self.latency_quantiles)


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


def serving_flags(exit_timeout_s: int, latency_quantiles: str = "") -> list[str]:
    """The flags every Triton recserve starts takes, wherever it runs (`recserve serve`, the Kubernetes
    Deployment, KServe's ServingRuntime): ready only when every model is, in-flight requests given
    ``exit_timeout_s`` to finish after a stop, and with ``latency_quantiles`` (``quantile:error,...``) the
    latency quantiles Triton's summaries keep (what the p99 alert reads). Off by default: Triton 2.51's
    summaries hold every instance of a model while they fold in each 500 observations, longer as more
    requests fill their 60-second window (docs/deployment.md: p99 12.9 ms with them, 2.7 ms without, on one
    H100 at 8,000 requests/s)."""
    flags = ["--strict-readiness=true", f"--exit-timeout-secs={exit_timeout_s}"]
    if latency_quantiles:
        check_latency_quantiles(latency_quantiles)
        flags += ["--metrics-config=summary_latencies=true", f"--metrics-config=summary_quantiles={latency_quantiles}"]
    return flags


def check_latency_quantiles(text: str) -> None:
    """Raises ServingError unless ``text`` is what Triton's ``summary_quantiles`` takes: ``quantile:error``
    pairs, comma-separated, each number between 0 and 1 (Triton itself would only log a bad pair)."""
    for pair in text.split(","):
        try:
            quantile, error = (float(x) for x in pair.split(":"))
        except ValueError:
            quantile = error = -1.0
        if not (0 < quantile < 1 and 0 < error < 1):
            raise ServingError(
                f"latency quantiles {text!r}: expected quantile:error pairs, comma-separated, each number between "
                "0 and 1, e.g. 0.5:0.05,0.99:0.001"
            )


def server_args(bundle: Bundle, repo: Path, s: ServerSettings, key: str | None = None) -> list[str]:
    """The server's command line. ``key``: what the restricted APIs take (default: the settings' key, else a
    random one, so that nobody can use them); ``start`` passes ``SECRET_MARK`` and the key beside it."""
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
        *serving_flags(s.exit_timeout_secs, s.latency_quantiles),
    ]
    if s.model_control_mode == "poll":
        args.append(f"--repository-poll-secs={s.repository_poll_secs}")
    if s.model_control_mode == "explicit":  # every model at the start; later versions as `recserve promote` says
        args.append("--load-model=*")
    restricted = "model-repository,shared-memory,logging"
    key = key or s.restricted_api_key or os.urandom(16).hex()  # without a key, nobody can use them
    args += [
        f"--http-restricted-api={restricted}:{s.restricted_api_header}={key}",
        f"--grpc-restricted-protocol={restricted}:{s.restricted_api_header}={key}",
    ]
    return [*args, *s.extra_args]


def check_ports(s: ServerSettings) -> None:
    """Refuses ports that something else holds, before any model is loaded, naming the option to change.

    Raises:
        ServingError: a port is taken (or cannot be bound on the host).
    """
    import socket

    taken = []
    for flag, port in (("--http-port", s.http_port), ("--grpc-port", s.grpc_port), ("--metrics-port", s.metrics_port)):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((s.host, port))
            except OSError as err:
                taken.append(f"{s.host}:{port} ({err.strerror}; choose another with {flag})")
    if taken:
        raise ServingError("cannot serve on " + ", ".join(taken))


def check_repository(repo: Path) -> None:
    """Refuses a folder that holds no model to serve, naming what it holds instead and the command to run.

    Raises:
        ServingError: no model folder with a config.pbtxt in it.
    """
    if any(repo.glob("*/config.pbtxt")):
        return
    found = {
        "export.json": f"an export folder: write a repository from it with `recserve repo --export {repo} --out REPO`",
        "run.json": f"a training run: write a repository from it with `recserve repo --run {repo} --out REPO`",
        "dataset.json": "a prepared data folder: train on it first (`recserve train`)",
    }
    what = next((why for name, why in found.items() if (repo / name).is_file()), None)
    what = what or ("an empty folder" if not any(repo.iterdir()) else "no model folder with a config.pbtxt")
    raise ServingError(f"{repo}: not a model repository, {what}")


def answers_ready(http_url: str, server_id: str | None = None) -> bool:
    """Whether a Triton server at ``http_url`` (host:port) says every model is ready and, given ``server_id``,
    is that server (its metadata's name: ``--id``), not another that answers on the port."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=2) as reply:
            if reply.status != 200:
                return False
        if server_id is None:
            return True
        with urllib.request.urlopen(f"http://{http_url}/v2", timeout=2) as reply:
            return json.loads(reply.read()).get("name") == server_id
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return False


@dataclass
class TritonServer:
    """A running tritonserver; a context manager that waits for readiness and stops on exit."""

    repo: Path
    settings: ServerSettings = field(default_factory=ServerSettings)
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    gpu: bool = False  # models run on the GPU even in CPU instances (RECSERVE_DEVICE=cuda for the stubs)
    server_id: str = field(default_factory=lambda: f"recserve-{secrets.token_hex(8)}")  # `--id`: this server's

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
        check_repository(Path(self.repo))
        check_ports(self.settings)
        bundle = find_bundle()
        check_backends(Path(self.repo), bundle.backend_dir)
        self.log_path = self.log_path or Path(self.repo).parent / f"tritonserver-{self.settings.http_port}.log"
        # the log, and every file the server and its model processes make (the python backend's shared-memory
        # regions, which carry requests: session IDs, rules), its owner's alone
        log_file = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        os.fchmod(log_file.fileno(), 0o600)  # a log kept from an earlier server, too
        env = server_env(bundle, self.settings) | ({DEVICE_ENV: "cuda"} if self.gpu else {})
        key = self.settings.restricted_api_key or secrets.token_hex(16)
        shim = argv_secret_library()  # the key kept out of /proc/PID/cmdline, which every local user reads
        if shim is not None:
            env |= {"LD_PRELOAD": " ".join(filter(None, [str(shim), env.get("LD_PRELOAD")])), SECRET_ENV: key}
        args = server_args(bundle, Path(self.repo).resolve(), self.settings, SECRET_MARK if shim else key)
        self.process = subprocess.Popen(
            [*args, f"--id={self.server_id}"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=stop_with_parent,
            umask=0o077,
        )
        log_file.close()
        return self

    def exit_code(self) -> int | None:
        """None while the server runs; its exit code once it has exited."""
        return exit_code(self.process, "the server")

    def is_ready(self) -> bool:
        """Whether this server (its server ID: not another on its port) says every model is ready."""
        return answers_ready(self.http_url, self.server_id)

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Waits until every model is ready; raises with the server's own words if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (code := self.exit_code()) is not None:
                raise ServingError(f"tritonserver exited with code {code}:\n{self.failure_summary()}")
            if self.is_ready():
                self.seal()
                return
            time.sleep(0.25)
        self.stop()
        raise ServingError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.failure_summary()}")

    def seal(self) -> None:
        """The model processes' shared memory their owner's alone (``processes.seal_shared_memory``): once
        ready, before a request, and again at each watch of the model processes (a model loaded since)."""
        if self.process is not None and self.process.poll() is None:
            seal_shared_memory(self.process.pid)

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

    def restart(self, timeout_s: float = 300) -> float:
        """Stops and starts the server on the same repository; returns the seconds it took."""
        started = time.monotonic()
        self.stop(timeout_s=10)  # a server with a dead model process may never finish a graceful stop
        self.start()
        self.wait_ready(timeout_s)
        return time.monotonic() - started

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
