"""A killed python-model process: `recserve serve` notices and restarts the server; clients see errors
only during that window (Triton 2.51 neither restarts the process nor stops reporting ready)."""

import os
import signal
import subprocess
import time
from pathlib import Path

from recserve.client import RecommenderClient, RecommendError
from tests.conftest import start_serve
from tests.reliability.test_shutdown import _wait_ready

RECOVERY_BOUND_S = 90
QUIET_S = 20  # a killed stub is noticed within --watch-secs; answers this long after the kill mean it recovered


def _stubs_of(model: str) -> list[int]:
    out = subprocess.run(["pgrep", "-af", "triton_python_backend_stub"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if f"/{model}/" in line]


def test_a_killed_model_process_is_recovered_within_a_bounded_window(int_repo, tmp_path):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(int_repo / "echo", repo / "echo")
    serve, http, grpc, metrics = start_serve(repo, "--watch-secs", "1", "--exit-timeout-secs", "5")
    try:
        _wait_ready(http)
        client = RecommenderClient(f"127.0.0.1:{http}", "http", model="echo", timeout_s=5)
        assert len(client.recommend([1, 2]).item_ids) == 10
        (stub,) = [pid for pid in _stubs_of("echo") if str(repo) in Path(f"/proc/{pid}/cmdline").read_text()]
        os.kill(stub, signal.SIGKILL)
        killed_at, first_error, errors = time.monotonic(), None, 0
        while time.monotonic() - killed_at < RECOVERY_BOUND_S:
            try:
                client.recommend([1, 2])
                # answering again after failing; or never seen failing (the restart fell between two requests)
                if first_error is not None or time.monotonic() - killed_at > QUIET_S:
                    break
            except (RecommendError, OSError):
                errors += 1
                first_error = first_error or time.monotonic()
            time.sleep(0.2)
        window_s = time.monotonic() - killed_at
        print(f"crash recovery: answers again {window_s:.1f} s after the kill, {errors} failed requests meanwhile")
        assert window_s < RECOVERY_BOUND_S
        assert len(client.recommend([1, 2]).item_ids) == 10
        assert serve.poll() is None  # still serving
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()


def test_a_model_process_that_died_before_supervision_began_is_still_noticed(int_repo, tmp_path):
    """The dead stub stays a zombie child of the server: supervision started after the kill restarts it too."""
    import shutil
    import threading

    from recserve.serving.triton_server.launcher import TritonServer
    from recserve.serving.triton_server.supervisor import dead_stubs, stub_count, supervise
    from tests.conftest import server_settings

    repo = tmp_path / "repo"
    shutil.copytree(int_repo / "echo", repo / "echo")
    reports: list[str] = []
    with TritonServer(repo, server_settings()) as server:
        (stub,) = [pid for pid in _stubs_of("echo") if str(repo) in Path(f"/proc/{pid}/cmdline").read_text()]
        os.kill(stub, signal.SIGKILL)
        time.sleep(0.5)
        assert dead_stubs(server) == 1
        stop = threading.Event()

        def stop_once_recovered() -> None:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not any(r.startswith("recovered") for r in reports):
                time.sleep(0.2)
            stop.set()

        # supervised from this thread: the server it restarts is tied to the life of the thread that starts it
        threading.Thread(target=stop_once_recovered, daemon=True).start()
        supervise(server, stop, 0.5, 120, reports.append)
        assert reports and reports[0] == "1 model process(es) died: restarting the server", reports
        assert dead_stubs(server) == 0 and stub_count(server) == 1
        client = RecommenderClient(server.http_url, "http", model="echo", timeout_s=5)
        assert len(client.recommend([1, 2]).item_ids) == 10
