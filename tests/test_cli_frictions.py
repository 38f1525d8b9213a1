"""Frictions a new user met, each once a traceback or noise, now one line or silence (issue: the first hour)."""

import http.server
import json
import subprocess
import sys
import threading

from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.processes import free_ports

runner = CliRunner()


def test_a_store_folder_under_a_file_is_one_line_naming_the_option(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = runner.invoke(app, ["store", "start", "--dir", str(tmp_path / "a-file" / "store")])
    assert result.exit_code == 1 and "--dir" in result.output and "cannot hold the store's folder" in result.output
    assert "Traceback" not in result.output


def test_an_export_prints_its_own_lines_and_no_third_party_noise(tiny_run, tmp_path):
    """In a process of its own, as a user runs it: the noise came on the real stderr (loggers bound at import)."""
    for backend in ("onnx", "torchscript"):
        command = [sys.executable, "-m", "recserve.cli.main", "export", "--run", str(tiny_run), "--backend", backend]
        result = subprocess.run(
            [*command, "--out", str(tmp_path / backend)], capture_output=True, text=True, timeout=300
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        for noise in ("torchvision", "TracerWarning", "UserWarning", "DeprecationWarning", "Warning:"):
            assert noise not in output, f"{backend}: {output}"


def test_the_store_verbs_say_what_runs_and_holds_and_name_the_store_to_start(tmp_path):
    store = tmp_path / "store"
    (port,) = free_ports(1)
    started = runner.invoke(app, ["store", "start", "--dir", str(store), "--port", str(port)])
    assert started.exit_code == 0 and f"127.0.0.1:{port}" in started.output, started.output
    try:
        again = runner.invoke(app, ["store", "start", "--dir", str(store)])
        assert again.exit_code == 0 and "already running" in again.output, again.output
        sent = runner.invoke(app, ["events", "send", "shopper-9", "50", "181", "--store", str(store)])
        assert sent.exit_code == 0, sent.output
        assert runner.invoke(app, ["items", "hide", "7", "--store", str(store)]).exit_code == 0
        shown = runner.invoke(app, ["events", "show", "shopper-9", "--store", str(store), "--json"])
        assert shown.exit_code == 0 and json.loads(shown.output)["items"] == ["50", "181"], shown.output
        status = runner.invoke(app, ["store", "status", "--dir", str(store)])
        assert "answers: 1 sessions, 1 hidden items (version 1)" in " ".join(status.output.split()), status.output
        held = json.loads(runner.invoke(app, ["store", "status", "--dir", str(store), "--json"]).output)
        assert (held["sessions"], held["hidden_items"], held["hidden_version"]) == (1, 1, 1)
    finally:
        runner.invoke(app, ["store", "stop", "--dir", str(store)])
    down = runner.invoke(app, ["events", "show", "shopper-9", "--store", str(store)])
    assert down.exit_code == 1 and "recserve store start" in down.output and "Traceback" not in down.output


def test_a_grpc_request_to_an_http_port_names_the_protocol_to_use():
    """The HTTP port asked over gRPC (the default protocol) once said that no server answered there."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"127.0.0.1:{server.server_address[1]}"
        result = runner.invoke(app, ["recommend", "1", "2", "--url", url])
    finally:
        server.shutdown()
    assert result.exit_code == 1 and "answers HTTP, not gRPC: pass --protocol http" in " ".join(result.output.split())
