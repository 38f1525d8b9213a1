"""Model update under load: a new version of `recommender` is added while clients run; the server (in
repository-polling mode) switches to it with zero failed requests."""

import json
import signal
import subprocess
import threading
import time
import urllib.request

from recserve.pipeline import repository_from_run
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from tests.conftest import start_serve
from tests.reliability.test_shutdown import _wait_ready


def _infer(port: int) -> str:
    body = {"inputs": [{"name": "item_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}]}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/recommender/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)["model_version"]


def test_a_new_version_replaces_the_old_under_load_without_failures(tiny_run, tmp_path):
    repo = tmp_path / "repo"
    repository_from_run(tiny_run, repo, ("fused",), RepositorySettings(), backend="onnx", version=1)
    serve, http, grpc, metrics = start_serve(repo, "--model-control", "poll", "--poll-secs", "1")
    versions, failures, stop = [], [], threading.Event()

    def load():
        while not stop.is_set():
            try:
                versions.append(_infer(http))
            except Exception as err:
                failures.append(repr(err))

    try:
        _wait_ready(http)
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1)
        repository_from_run(tiny_run, repo, ("fused",), RepositorySettings(), backend="onnx", version=2)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not versions or versions[-1] != "2"):
            time.sleep(0.5)
        time.sleep(2)  # keep the load on a little after the switch
        stop.set()
        for t in threads:
            t.join()
        print(
            f"model update: {len(versions)} answered ({versions.count('1')} by v1, {versions.count('2')} by v2), "
            f"{len(failures)} failed"
        )
        assert failures == []
        assert versions[0] == "1" and versions[-1] == "2"
    finally:
        stop.set()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
