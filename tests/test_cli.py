"""The command line: help on every verb, bad input as one red line and a non-zero exit."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from recserve.cli.main import app

runner = CliRunner()


def _verbs(group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of a typer app, the groups' subcommands included (``sagemaker package``)."""
    paths = [(*path, c.name or c.callback.__name__.replace("_", "-")) for c in group.registered_commands]
    for sub in group.registered_groups:
        paths += _verbs(sub.typer_instance, (*path, sub.name))
    return paths


def test_every_verb_has_help():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    verbs = _verbs(app)
    assert {("sagemaker", "package"), ("sagemaker", "deploy"), ("deploy", "k8s"), ("train",)} <= set(verbs)
    for verb in verbs:
        sub = runner.invoke(app, [*verb, "--help"])
        assert sub.exit_code == 0 and "Usage" in sub.output, verb
        summary = sub.output.split("Usage", 1)[1].split("Options", 1)[0]  # the docstring below the usage
        assert len(summary.split()) > 6, f"{' '.join(verb)} --help explains nothing"


def test_data_prints_the_summary(tmp_path):
    result = runner.invoke(app, ["data", "ml-100k", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert "943" in result.output and "1,682" in result.output


def test_data_on_a_missing_file_exits_non_zero_with_the_path(tmp_path):
    result = runner.invoke(app, ["data", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert "nope.csv: no such file" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_serve_on_a_machine_without_a_gpu_says_so(tmp_path):
    result = runner.invoke(app, ["serve", "--repo", str(tmp_path), "--gpu"])
    assert result.exit_code != 0 and "no CUDA device" in result.output


def test_serve_on_a_missing_repository_exits_with_the_path(tmp_path):
    result = runner.invoke(app, ["serve", "--repo", str(tmp_path / "nope")])
    assert result.exit_code == 1 and "no such model repository" in result.output


def test_serve_refuses_a_folder_that_is_no_repository_naming_what_it_holds(tiny_export, tmp_path):
    """An export folder, a run folder and an empty folder: one line each, naming the command that makes a
    repository of it, and no server started ("ready" never printed)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    for folder, message in [
        (tiny_export, "an export folder: write a repository from it with `recserve repo --export"),
        (tmp_path / "run", "a training run: write a repository from it with `recserve repo --run"),
        (tmp_path / "empty", "not a model repository, an empty folder"),
    ]:
        result = runner.invoke(app, ["serve", "--repo", str(folder)])
        assert result.exit_code == 1 and message in result.output.replace("\n", " "), result.output
        assert "ready" not in result.output and "Traceback" not in result.output


def test_repo_with_gpu_ids_that_are_not_numbers_names_the_option(tmp_path):
    result = runner.invoke(
        app, ["repo", "--run", str(tmp_path), "--out", str(tmp_path / "r"), "--device", "gpu", "--gpus", "0,one"]
    )
    assert result.exit_code == 2 and "--gpus" in result.output and "expected GPU ids" in result.output


@pytest.mark.parametrize("command", [["repo", "--out", "r"], ["sagemaker", "package"]])
def test_serving_commands_take_exactly_one_source(command, tmp_path):
    """--export (a validated export) or --run (exported first): neither, or both, is a usage error."""
    neither = runner.invoke(app, command)
    both = runner.invoke(app, [*command, "--export", str(tmp_path), "--run", str(tmp_path)])
    for result in (neither, both):
        assert result.exit_code == 2 and "give exactly one of --export" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["recommend", "1", "2", "--url", "127.0.0.1:1"], "no server answers at 127.0.0.1:1 (grpc): start one with"),
        (["recommend", "1", "--url", "127.0.0.1:1", "--protocol", "http"], "no server answers at 127.0.0.1:1 (http)"),
        (["sagemaker", "invoke", "1", "--url", "http://127.0.0.1:1"], "no endpoint answers at http://127.0.0.1:1"),
        (["export", "--run", "{tmp}", "--out", "{tmp}/e"], "not a training run, missing model_config.json"),
        (["export", "--run", "{tmp}/an-export", "--out", "{tmp}/e"], "an export, not a training run; serve it with"),
        (
            ["repo", "--export", "{tmp}", "--out", "{tmp}/r"],
            "no export.json; pass a folder written by `recserve export`",
        ),
        (["bench", "--repo", "{tmp}/nope", "--out", "{tmp}/b"], "no such model repository"),
        (
            ["data", "ml100k", "--out", "{tmp}/d"],
            "no source recserve ships by that name (built in: ml-100k); did you mean 'ml-100k'?",
        ),
        (["data", "ml-1m", "--out", "{tmp}/d"], "(built in: ml-100k)"),
        (["data", "{tmp}/log.csv", "--out", "{tmp}/d"], "name yours with --user-col, --item-col, --time-col"),
        (["data", "{tmp}", "--out", "{tmp}/d"], "a folder; give the log file itself"),
        (["data", "{tmp}/empty.csv", "--out", "{tmp}/d"], "empty"),
        (
            ["train", "--data", "{tmp}", "--out", "{tmp}/t", "--model", "sasrec", "--mask-prob", "0.3"],
            "--mask-prob: not a setting of sasrec",
        ),
        (["train", "--data", "{tmp}", "--out", "{tmp}/t", "--model", "multvae", "--layers", "2"], "--layers: not a"),
    ],
)
def test_bad_input_gets_one_line_that_says_what_to_do(args, message, tmp_path):
    """Each of these once printed a raw traceback or a library's words (gRPC's, polars', urllib's)."""
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "log.csv").write_text("visitor,sku,ts\n1,2,3\n")
    (tmp_path / "an-export").mkdir()
    (tmp_path / "an-export" / "export.json").write_text("{}")
    result = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_serve_refuses_a_taken_port_before_loading_anything_naming_the_option(int_repo):
    import socket
    import time

    from recserve.processes import free_ports

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        grpc, metrics = free_ports(2)
        started = time.monotonic()
        result = runner.invoke(
            app,
            ["serve", "--repo", str(int_repo), "--http-port", str(taken), "--grpc-port", str(grpc)]
            + ["--metrics-port", str(metrics)],
        )
    assert result.exit_code == 1, result.output
    assert f"127.0.0.1:{taken}" in result.output and "choose another with --http-port" in result.output
    assert time.monotonic() - started < 5, "it loaded models before finding the port taken"


def test_version_and_env_say_what_this_installation_is():
    from importlib import metadata

    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.strip() == f"recserve {metadata.version('recserve')}"
    found = runner.invoke(app, ["env", "--json"])
    assert found.exit_code == 0, found.output
    import json

    env = json.loads(found.output)
    assert env["versions"]["torch"] == metadata.version("torch") and env["versions"]["recserve"]
    assert set(env) == {"python", "versions", "native_backends", "store_server", "gpus"}
    assert env["store_server"] and env["store_server"].endswith("valkey-server")
    assert "native Triton backends:" in runner.invoke(app, ["env"]).output
