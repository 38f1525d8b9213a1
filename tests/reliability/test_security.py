"""Security defaults: loopback binding, restricted admin APIs, model loading only with the key, no key in logs."""

import json
import shutil
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


def test_explicit_mode_loads_models_only_with_the_key_and_never_logs_it(int_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(int_repo / "echo", repo / "echo")
    key = "s3cret-admin-key-for-test"
    settings = server_settings(model_control_mode="explicit", restricted_api_key=key)
    with TritonServer(repo, settings, log_path=tmp_path / "server.log") as server:
        load = f"http://{server.http_url}/v2/repository/models/echo/load"
        assert _request(load, "POST") == 403
        assert _request(f"http://{server.http_url}/v2/models/echo/ready") != 200  # nothing loaded yet
        assert _request(load, "POST", headers={HEADER: key}) == 200
        assert _request(f"http://{server.http_url}/v2/models/echo/ready") == 200
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
