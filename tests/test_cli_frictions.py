"""Frictions a new user met, each once a traceback or noise, now one line or silence (issue: the first hour)."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from recserve.cli.main import app

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


def test_events_show_answers_json_and_the_store_verbs_name_the_store_to_start(tmp_path):
    store = tmp_path / "store"
    assert runner.invoke(app, ["store", "start", "--dir", str(store)]).exit_code == 0
    try:
        sent = runner.invoke(app, ["events", "send", "shopper-9", "50", "181", "--store", str(store)])
        assert sent.exit_code == 0, sent.output
        shown = runner.invoke(app, ["events", "show", "shopper-9", "--store", str(store), "--json"])
        assert shown.exit_code == 0 and json.loads(shown.output)["items"] == ["50", "181"], shown.output
    finally:
        runner.invoke(app, ["store", "stop", "--dir", str(store)])
    down = runner.invoke(app, ["events", "show", "shopper-9", "--store", str(store)])
    assert down.exit_code == 1 and "recserve store start" in down.output and "Traceback" not in down.output
