"""Security defaults: loopback binding, restricted admin APIs, model loading only with the key, no key in logs."""

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from recserve.errors import ServingError
from recserve.serving.triton_server.bundle import Bundle
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer, server_args
from tests.conftest import server_settings

HEADER = ServerSettings().restricted_api_header


def _request(url: str, method: str = "GET", body: dict | None = None, headers: dict | None = None) -> int:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def test_every_endpoint_binds_loopback_unless_told_otherwise():
    bundle = Bundle(Path("tritonserver"), Path("backends"), Path("libs"))
    args = server_args(bundle, Path("repo"), ServerSettings())
    for flag in ("--http-address", "--grpc-address", "--metrics-address"):
        assert f"{flag}=127.0.0.1" in args
    assert "--model-control-mode=none" in args
    assert "--http-address=0.0.0.0" in server_args(bundle, Path("repo"), ServerSettings(host="0.0.0.0"))


def test_admin_apis_are_refused_without_the_key(int_server):
    base = f"http://{int_server.http_url}/v2"
    assert _request(f"{base}/logging") == 403
    assert _request(f"{base}/repository/index", "POST") == 403
    assert _request(f"{base}/systemsharedmemory/status") == 403
    assert _request(f"{base}/models/recommender/ready") == 200  # inference APIs stay open


def test_explicit_model_control_without_a_key_is_refused():
    with pytest.raises(ServingError, match="restricted-API key"):
        ServerSettings(model_control_mode="explicit").validate()


def test_explicit_mode_loads_every_model_then_loads_and_unloads_only_with_the_key_and_never_logs_it(int_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(int_repo / "echo", repo / "echo")
    key = "s3cret-admin-key-for-test"
    settings = server_settings(model_control_mode="explicit", restricted_api_key=key)
    with TritonServer(repo, settings, log_path=tmp_path / "server.log") as server:
        load = f"http://{server.http_url}/v2/repository/models/echo/load"
        unload = load.replace("/load", "/unload")
        ready = f"http://{server.http_url}/v2/models/echo/ready"
        assert _request(ready) == 200  # every model loaded at the start
        assert _request(unload, "POST") == 403 and _request(load, "POST") == 403
        assert _request(unload, "POST", headers={HEADER: key}) == 200
        deadline = time.monotonic() + 30
        while _request(ready) == 200 and time.monotonic() < deadline:  # an unload finishes in the background
            time.sleep(0.1)
        assert _request(ready) != 200
        assert _request(load, "POST", headers={HEADER: key}) == 200
        assert _request(ready) == 200
        # once readable by any local user in /proc/PID/cmdline: the server's command line holds a mark instead
        command = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert key.encode() not in command and b"@RECSERVE_SECRET@" in command
        assert key.encode() not in Path(f"/proc/{server.process.pid}/environ").read_bytes()
    assert key not in (tmp_path / "server.log").read_text()


def test_the_bundled_server_gets_a_backend_folder_of_its_own(tmp_path, monkeypatch):
    """The installed nvidia-pytriton package is never written to: the stub goes into recserve's cache."""
    from recserve.serving.triton_server.bundle import find_bundle

    monkeypatch.delenv("TRITONSERVER_BIN", raising=False)
    monkeypatch.setenv("RECSERVE_CACHE", str(tmp_path))
    bundle = find_bundle()
    assert bundle.backend_dir.is_relative_to(tmp_path)
    assert (bundle.backend_dir / "python" / "triton_python_backend_stub").is_file()
    assert (bundle.backend_dir / "python" / "libtriton_python.so").resolve().is_file()


def test_the_python_models_shared_memory_is_the_servers_owners_alone(int_server):
    """Once the python backend's regions were 0644: another local user read a shopper's session ID and rule from
    them. The server starts with a private umask, so every region its model processes map is 0600."""
    from recserve.processes import child_pids

    stubs = child_pids(int_server.process.pid)
    regions = {
        line.split(None, 5)[5]
        for pid in stubs
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
        if "/dev/shm/" in line and len(line.split(None, 5)) == 6
    }
    assert stubs and regions, "the python models map their shared memory"
    for region in regions:
        path = Path(region.removesuffix(" (deleted)"))
        if path.exists():
            assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))


def test_a_server_on_the_port_that_is_not_ours_is_never_taken_for_ours():
    """Once `serve` declared ready when any server answered its port (a test server on 8000 was taken for its
    own). Readiness now asks for the server's ID too (Triton's `--id`, its metadata's name)."""
    import http.server
    import threading

    from recserve.serving.triton_server.launcher import answers_ready

    class Impostor(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"name": "someone-else"}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body if self.path == "/v2" else b"")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"127.0.0.1:{server.server_address[1]}"
        assert answers_ready(url)  # ready, to a client that asks nothing more
        assert not answers_ready(url, "recserve-0123456789abcdef")
    finally:
        server.shutdown()


def test_our_server_answers_with_its_own_id(int_server):
    from recserve.serving.triton_server.launcher import answers_ready

    assert answers_ready(int_server.http_url, int_server.server_id)
    assert not answers_ready(int_server.http_url, "recserve-not-this-one")


def test_stop_signals_no_process_that_a_stale_record_names(tmp_path, monkeypatch):
    """Once `recserve stop` killed an unrelated process named by a stale record, and its whole group with
    SIGKILL. A record's process is its own only with the record's start time and a detached server's command."""
    import os
    import subprocess

    from recserve.serving.triton_server.detached import ServerRecord, servers_dir, start_ticks, stop_server

    monkeypatch.setenv("RECSERVE_CACHE", str(tmp_path / "cache"))
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        fields = dict(host="127.0.0.1", grpc_port=2, metrics_port=3, triton_log="", log="", started="", repo="r")
        for ticks in (start_ticks(bystander.pid), 12345):  # its real start time (not a server's command), a wrong one
            record = ServerRecord(bystander.pid, http_port=1, server_id="x", start_ticks=ticks, **fields)
            record.path.write_text(json.dumps(record.__dict__))
            assert not record.alive()
            assert stop_server(record, timeout_s=1) is False
            assert bystander.poll() is None and not record.path.exists()  # it lives; the stale record is gone
    finally:
        bystander.kill()
        bystander.wait()
    assert servers_dir().stat().st_mode & 0o777 == 0o700
    assert os.stat(servers_dir()).st_uid == os.getuid()


def test_a_shared_fallback_cache_folder_another_user_made_is_refused(tmp_path):
    import os

    from recserve.files import private_dir

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)  # another user's (the tests run as root, which may give it away)
    with pytest.raises(PermissionError, match="not this user's own folder"):
        private_dir(theirs)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError):
        private_dir(tmp_path / "link")
    mine = private_dir(tmp_path / "mine")
    assert mine.stat().st_mode & 0o777 == 0o700
