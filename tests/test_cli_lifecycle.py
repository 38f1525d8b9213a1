"""The CLI's lifecycle and settings files, as a user runs them: `recserve serve --detach` returns once the
server is ready, `recserve status` lists it (and the stores), `recserve stop` stops it, its log is kept with
the last runs'; `recserve train --config FILE` takes TOML or YAML settings that options override, and
`recserve runs` shows runs side by side."""

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.client import RecommenderClient
from recserve.constants import ECHO_MODEL
from recserve.processes import free_ports
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def _recserve(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "recserve.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_a_detached_server_is_listed_answers_and_stops_and_its_log_is_kept(tiny_export, tmp_path, monkeypatch):
    monkeypatch.setenv("RECSERVE_CACHE", str(tmp_path / "cache"))  # its records and logs, the child's too
    repo = tmp_path / "repo"
    write_repository(tiny_export, repo, ("echo",), RepositorySettings())
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    started = _recserve("serve", "--repo", str(repo), *ports, "--exit-timeout-secs", "3", "--detach")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"ready: HTTP 127.0.0.1:{http}" in started.stdout and "detached" in started.stdout
        with RecommenderClient(f"127.0.0.1:{grpc}", model=ECHO_MODEL) as client:
            assert client.recommend([1, 2, 3], k=3).item_ids.tolist()  # it answers after the command returned
        status = json.loads(_recserve("status", "--json").stdout)
        (server,) = status["servers"]
        assert server["state"] == "ready" and server["repo"] == str(repo.resolve()) and server["grpc_port"] == grpc
        assert server["models"] == [{"name": "echo", "versions": ["1"]}]  # what it serves, asked of it
        assert server["run"] == json.loads((repo / "recserve.json").read_text()).get("run")
        said = " ".join(_recserve("status").stdout.split())
        assert "model echo: version 1" in said, said
        record = tmp_path / "cache" / "servers" / f"{http}.json"
        assert record.stat().st_mode & 0o777 == 0o600 and server["server_id"].startswith("recserve-")
        assert any(store["state"] in ("running", "not running") for store in status["stores"])
        again = _recserve("serve", "--repo", str(repo), *ports, "--detach")
        said = " ".join((again.stdout + again.stderr).split())
        assert again.returncode == 1 and f"recserve already serves {repo.resolve()} there" in said, said
        assert "Traceback" not in again.stdout + again.stderr
        empty = tmp_path / "empty"
        empty.mkdir()
        refused = _recserve("serve", "--repo", str(empty), *ports, "--detach")
        assert refused.returncode == 1 and "not a model repository, an empty folder" in refused.stdout + refused.stderr
    finally:
        stopped = _recserve("stop", "--http-port", str(http))
    assert stopped.returncode == 0 and f"server on HTTP port {http}" in stopped.stdout and "stopped" in stopped.stdout
    assert json.loads(_recserve("status", "--json").stdout)["servers"] == []
    logs = sorted((tmp_path / "cache" / "servers" / "logs").glob(f"triton-{http}-*.log"))
    assert len(logs) == 1 and "Started GRPCInferenceService" in logs[0].read_text()
    for private in (tmp_path / "cache" / "servers", logs[0].parent):  # the user's alone
        assert private.stat().st_mode & 0o777 == 0o700
    assert all(log.stat().st_mode & 0o777 == 0o600 for log in logs[0].parent.iterdir())
    assert _recserve("stop").stdout.strip() == "no detached server runs"


def test_two_detached_serves_on_one_port_leave_one_server_and_its_record(tiny_export, tmp_path, monkeypatch):
    """Once both said "ready" and the loser deleted the winner's record (an orphan serving still). The port's lock
    lets one start; the other says so, and the winner's record stays, naming its own server."""
    monkeypatch.setenv("RECSERVE_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    write_repository(tiny_export, repo, ("echo",), RepositorySettings())
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    command = [sys.executable, "-m", "recserve.cli.main", "serve", "--repo", str(repo), *ports, "--detach"]
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        said = [p.communicate(timeout=180)[0] for p in both]
        codes = sorted(p.returncode for p in both)
        assert codes == [0, 1], said
        (server,) = json.loads(_recserve("status", "--json").stdout)["servers"]
        assert server["state"] == "ready", server  # the winner's record, and the server answering is its own
    finally:
        _recserve("stop", "--http-port", str(http))
    assert json.loads(_recserve("status", "--json").stdout)["servers"] == []


@pytest.fixture(scope="module")
def configured_run(ml100k_dir, tmp_path_factory):
    """A run trained from a TOML settings file, its epochs overridden by an option."""
    folder = tmp_path_factory.mktemp("configured")
    config = folder / "sasrec.toml"
    config.write_text(
        'model = "sasrec"\nepochs = 3\nhidden = 16\nwindow = 20\nlayers = 1\nrelative-positions = false\n'
    )
    out = folder / "run"
    result = CliRunner().invoke(
        app, ["train", "--data", str(ml100k_dir), "--out", str(out), "--config", str(config), "--epochs", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "Epoch 1/1" in result.output and "Epoch 0/" not in result.output  # the bar counts from 1, as curves.png
    # no terminal here: a line an epoch (a bar would draw nothing in a log), with its validation metric
    assert re.search(r"^Epoch 1/1: ndcg@10 [0-9.]+, hr@10 [0-9.]+ \([0-9]+ s\)$", result.output, flags=re.M), (
        result.output
    )
    # SASRec refits by default: its epochs counted alike, a line each though it validates none
    assert re.search(r"^Refit epoch 1/1: trained \([0-9]+ s\)$", result.output, flags=re.M), result.output
    return out


def test_train_takes_its_settings_from_a_file_and_an_option_overrides_the_file(configured_run):
    metrics = json.loads((configured_run / "metrics.json").read_text())
    model = json.loads((configured_run / "model_config.json").read_text())
    assert metrics["model"] == "sasrec" and metrics["train"]["epochs"] == 1  # the option's, not the file's 3
    assert (model["hidden"], model["window"], model["layers"], model["relative_positions"]) == (16, 20, 1, False)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.toml", "hiden = 16\n", "'hiden' is not a setting; did you mean hidden?"),
        ("a.yaml", "epochs: many\n", "epochs = 'many' is not a int"),
        ("a.yaml", "hidden: [16\n", "cannot be read as YAML"),
        ("a.toml", 'model = "bert4rec"\nrelative_positions = true\n', "relative-positions: not a setting of bert4rec"),
        ("a.ini", "epochs = 1\n", "a settings file is TOML (.toml), YAML (.yaml, .yml) or JSON (.json)"),
    ],
)
def test_a_bad_settings_file_gets_one_line_naming_the_setting(ml100k_dir, tmp_path, name, text, message):
    config = tmp_path / name
    config.write_text(text)
    result = CliRunner().invoke(
        app, ["train", "--data", str(ml100k_dir), "--out", str(tmp_path / "r"), "-c", str(config)]
    )
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "r" / "metrics.json").exists()


def test_runs_shows_runs_side_by_side_with_the_settings_they_differ_in(configured_run, tiny_run):
    result = CliRunner().invoke(app, ["runs", str(tiny_run), str(configured_run)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    for line in ("model", "hidden", "test ndcg@10", "popularity ndcg@10", "best epoch"):
        assert line in result.output
    rows = json.loads(CliRunner().invoke(app, ["runs", str(tiny_run), str(configured_run), "--json"]).output)
    assert [r["settings"]["hidden"] for r in rows] == [32, 16]
    assert rows[0]["test"] == {} and 0 < rows[1]["test"]["ndcg@10"] < 1  # tiny_run was never tested: blank
    missing = CliRunner().invoke(app, ["runs", str(tiny_run.parent)])
    assert missing.exit_code == 1 and "no finished run there" in missing.output
