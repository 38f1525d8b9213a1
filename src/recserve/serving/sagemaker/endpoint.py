"""A local endpoint with SageMaker's hosting contract (GET ``/ping``, POST ``/invocations``), run as each
container runs its package: ``LocalEndpoint``, as the PyTorch container does (the SageMaker PyTorch inference
toolkit starting TorchServe), and ``TritonEndpoint``, as the Triton container does (Triton's SageMaker
frontend, the package's one model as the default).

For the PyTorch container, ``/ping`` says healthy before the model has loaded and stays healthy while
workers crash, so readiness here is a real answer from ``/invocations``. Only one TorchServe runs per
machine: TorchServe keeps its process ID in a fixed file and the toolkit attaches to any running TorchServe.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from recserve.errors import ServingError
from recserve.processes import exit_code
from recserve.serving.sagemaker.package import (
    ENTRY_POINT,
    TRITON_MODEL_ENV,
    WORKER_VARIABLES,
    pytorch_environment,
    unpack,
)

if TYPE_CHECKING:
    from recserve.serving.triton_server.launcher import TritonServer

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080
PROBE = json.dumps({"item_id": [], "k": 1}).encode()  # an empty history: popular items, from any model


E = TypeVar("E", bound="_Endpoint")


class _Endpoint:
    """What both local endpoints share: the package, the port, a work folder (removed at stop when made here)."""

    LOG = "endpoint.log"

    def __init__(self, package_path: Path, port: int, workdir: Path | None, startup_timeout_s: float):
        self.package_path = Path(package_path)
        self.port, self.startup_timeout_s = port, startup_timeout_s
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="recserve-sagemaker-"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / self.LOG

    def start(self: E) -> E:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _remove_workdir(self) -> None:
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self: E) -> E:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LocalEndpoint(_Endpoint):
    """Unpacks a pytorch-runtime model.tar.gz and serves it on 127.0.0.1:``port`` until stopped."""

    def __init__(
        self,
        package_path: Path,
        port: int = DEFAULT_PORT,
        workdir: Path | None = None,
        startup_timeout_s: float = 180.0,
        workers: int = 1,
    ):
        super().__init__(package_path, port, workdir, startup_timeout_s)
        self.workers = workers
        self.process: subprocess.Popen | None = None

    def exit_code(self) -> int | None:
        """None while the endpoint runs; its exit code once it has exited."""
        return exit_code(self.process, "the endpoint")

    def start(self) -> LocalEndpoint:
        model_dir = unpack(self.package_path, self.workdir / "model")
        if not (model_dir / "code" / ENTRY_POINT).is_file():
            raise ServingError(
                f"{self.package_path}: no code/{ENTRY_POINT}; package it with --runtime pytorch "
                "(a triton package runs in the Triton container: `recserve serve`)"
            )
        if shutil.which("java") is None:
            raise ServingError("TorchServe needs Java 17 or newer on PATH; install a JDK (e.g. openjdk-17-jre)")
        # what deploy gives the container (the caller's environment may tune batching and threads), then
        # what this endpoint fixes: its folder, port and workers
        container = pytorch_environment(self.workers)
        fixed = {key: container[key] for key in ("SAGEMAKER_PROGRAM", *WORKER_VARIABLES)}
        env = container | os.environ | fixed
        env |= {"SAGEMAKER_BASE_DIR": str(self.workdir), "SAGEMAKER_BIND_TO_PORT": str(self.port), "PATH": _tool_path()}
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "recserve.serving.sagemaker.container"],
                cwd=self.workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if (code := self.exit_code()) is not None:
                raise ServingError(f"the endpoint exited with code {code}:\n{self.log_tail()}")
            try:
                status, _ = invoke(self.url, PROBE, timeout_s=5)
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise ServingError(f"the endpoint gave no answer within {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the toolkit (it forwards it to TorchServe), then to the whole process group."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        _stop_torchserve()
        self._remove_workdir()


class TritonEndpoint(_Endpoint):
    """Unpacks a triton-runtime model.tar.gz and serves it as SageMaker's Triton container does: the bundled
    Triton with its SageMaker frontend on ``port`` (/ping, /invocations in KServe v2), the package's one model
    the default (``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``, as the container's serve script sets it).

    Triton 2.51's SageMaker frontend has no address option: it listens on every interface, as in the
    container; its own HTTP endpoint (readiness) stays on loopback.
    """

    LOG = "tritonserver.log"

    def __init__(
        self,
        package_path: Path,
        port: int = DEFAULT_PORT,
        workdir: Path | None = None,
        startup_timeout_s: float = 180.0,
    ):
        super().__init__(package_path, port, workdir, startup_timeout_s)
        self.server: TritonServer | None = None

    def start(self) -> TritonEndpoint:
        from recserve.processes import free_ports
        from recserve.serving.sagemaker.package import triton_model_name
        from recserve.serving.triton_server.launcher import ServerSettings, TritonServer

        model = triton_model_name(self.package_path)  # refuses a pytorch-runtime package, naming it
        repo = unpack(self.package_path, self.workdir / "model")
        http, grpc, metrics = free_ports(3)
        settings = ServerSettings(
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            extra_args=("--allow-sagemaker=true", f"--sagemaker-port={self.port}"),
            extra_env=((TRITON_MODEL_ENV, model),),
        )
        server = self.server = TritonServer(repo, settings, log_path=self.log_path).start()
        try:
            server.wait_ready(self.startup_timeout_s)
            deadline = time.monotonic() + 30
            while ping(self.url) != 200:  # the frontend starts after the models
                if time.monotonic() > deadline:
                    raise ServingError(f"Triton's SageMaker frontend gave no /ping on port {self.port}")
                time.sleep(0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def exit_code(self) -> int | None:
        return exit_code(None if self.server is None else self.server.process, "the endpoint")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self._remove_workdir()


def _tool_path() -> str:
    """PATH with this interpreter's bin folder first, where the toolkit's `torchserve` command lives."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def _stop_torchserve() -> None:
    """TorchServe runs detached from the toolkit; ask it to stop, as `torchserve --stop` does."""
    binary = shutil.which("torchserve", path=_tool_path())
    if binary:
        subprocess.run([binary, "--stop"], capture_output=True, timeout=60, check=False)


def invoke(
    url: str,
    body: bytes,
    content_type: str = "application/json",
    accept: str = "application/json",
    timeout_s: float = 30.0,
) -> tuple[int, bytes]:
    """POSTs ``body`` to ``url/invocations``; returns the status and the body (errors included)."""
    request = urllib.request.Request(
        f"{url}/invocations", data=body, method="POST", headers={"Content-Type": content_type, "Accept": accept}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def ping(url: str, timeout_s: float = 5.0) -> int:
    """/ping's status; 0 where nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0
