"""Graceful shutdown: SIGTERM to `recserve serve` under load; accepted requests are answered, exit code 0."""

import signal
import threading
import time
import urllib.request
from pathlib import Path

from recserve.client import RecommenderClient, RecommendError, ServerBusyError, ServerUnreachableError
from recserve.serving.triton_server.detached import servers_dir
from tests.conftest import start_serve

LOAD_S = 4.0
# Triton first waits for open HTTP connections to close (the load's keep-alive ones: LOAD_S - 1 s), then
# unloads the models: a loaded 2-core machine once needed more than 10 s for both
EXIT_TIMEOUT_S = 20


def _refused_before_sending(err: ServerBusyError) -> bool:
    """A request the server never accepted: a 503, or a connection refused once the port closed. Any other
    unreachable error (a reset or a hang-up after the request went out) is a request lost in flight."""
    if not isinstance(err, ServerUnreachableError):
        return True
    cause = err.__cause__
    return isinstance(cause, ConnectionRefusedError) or "ConnectionRefusedError" in str(err)


def _shutdown_lines(log: Path) -> str:
    """What Triton's log says it waited for after the signal (connections, in-flight requests, live models)."""
    if not log.exists():
        return f"(no log at {log})"
    return "\n".join(line for line in log.read_text(errors="replace").splitlines() if "Timeout" in line)


def _wait_ready(port: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise AssertionError("server not ready")


def test_sigterm_under_load_answers_accepted_requests_and_exits_zero(int_repo, tmp_path):
    serve, http, grpc, metrics = start_serve(int_repo, "--exit-timeout-secs", str(EXIT_TIMEOUT_S))
    try:
        _wait_ready(http)
        outcomes = {"ok": 0, "refused": 0, "failed": []}
        lock = threading.Lock()
        stop_at = time.monotonic() + LOAD_S

        def worker():
            with RecommenderClient(f"127.0.0.1:{http}", "http", timeout_s=5) as client:
                load(client)

        def load(client):
            while time.monotonic() < stop_at:
                try:
                    client.recommend([1, 2, 3], k=5)
                    key = "ok"
                except ServerBusyError as err:  # refused before acceptance, or dropped in flight (lost)
                    if not _refused_before_sending(err):
                        with lock:
                            outcomes["failed"].append(f"lost in flight: {err}")
                        continue
                    key = "refused"
                except RecommendError as err:  # anything else, a 400 included, is a request lost
                    with lock:
                        outcomes["failed"].append(f"{err.status}: {err}")
                    continue
                with lock:
                    outcomes[key] += 1

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        sent_signal_at = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=EXIT_TIMEOUT_S + 20)
        exit_s = time.monotonic() - sent_signal_at
        for t in threads:
            t.join()
        print(
            f"shutdown: answered {outcomes['ok']}, refused after SIGTERM {outcomes['refused']}, "
            f"failed {len(outcomes['failed'])}, exit code {code} after {exit_s:.1f} s"
        )
        logs = sorted((servers_dir() / "logs").glob(f"triton-{http}-*.log"))  # serve's, kept with the last runs'
        assert code == 0, serve.stdout.read() + _shutdown_lines(logs[-1])
        assert outcomes["ok"] > 0 and outcomes["failed"] == []
        # it exits by itself once in-flight requests are done: within its exit timeout and the stubs' stop
        assert exit_s < EXIT_TIMEOUT_S + 15
    finally:
        if serve.poll() is None:
            serve.kill()
