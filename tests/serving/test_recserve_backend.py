"""recserve's own Triton backend (native/triton-backend, built by scripts/build_triton_backends.sh): the native
TorchScript graph served without Triton's PyTorch backend. On CPUs it runs the graph as it is; the CUDA-graph
replay is tested on GPUs (tests/gpu/test_recserve_backend_gpu.py). tests/serving/test_native.py runs the
native layout's contract tests (answers, batching, bad inputs) on it too."""

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
import tritonclient.http as httpclient
from tests.conftest import require_native, server_settings

from recserve.bench.step_log import read_step_lines
from recserve.errors import ServingError
from recserve.serving.triton_repository.pbtxt import parse_pbtxt
from recserve.serving.triton_server.launcher import TritonServer

LENGTH = 19  # tiny_run's window - 1


@pytest.fixture(scope="module")
def two_runtimes(tiny_run, tmp_path_factory) -> Path:
    """One torchscript export of ``tiny_run`` in the native layout on Triton's PyTorch backend
    (``recommender_native``) and on recserve's (the same files as ``native_recserve``), in one repository."""
    from recserve.pipeline import repository_from_run
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    require_native("pytorch", "recserve")
    repo = tmp_path_factory.mktemp("runtimes") / "repo"
    settings = RepositorySettings(
        native_instance_count=1, native_runtime="pytorch", max_batch_size=64, max_queue_delay_microseconds=5000
    )
    repository_from_run(tiny_run, repo, ("native",), settings, backend="torchscript")
    config = parse_pbtxt((repo / "recommender_native" / "config.pbtxt").read_text())
    assert config.platform == "pytorch_libtorch" and not config.backend
    mine = repo / "native_recserve"
    (mine / "1").mkdir(parents=True)
    (mine / "1" / "model.pt").write_bytes((repo / "recommender_native" / "1" / "model.pt").read_bytes())
    config.name, config.platform, config.backend = "native_recserve", "", "recserve"
    (mine / "config.pbtxt").write_text(str(config))
    return repo


def _batch(tiny_run, rows: int, seed: int) -> dict[str, np.ndarray]:
    """``rows`` histories padded to the native length (some empty, some with unknown IDs), mixed k and
    exclude_seen: one request of several rows."""
    from recserve.export.native_export import padded

    ids = np.load(tiny_run / "item_ids.npy")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, rows)
    histories = np.full((rows, 40), -1, dtype=np.int64)
    for row, n in enumerate(lengths):
        if n:
            histories[row, -n:] = rng.choice(ids, n)
    histories[0, -1] = 999_999  # not in the catalogue
    return {
        "item_ids": padded(histories, lengths, LENGTH),
        "k": rng.integers(1, 101, (rows, 1)).astype(np.int32),
        "exclude_seen": rng.integers(0, 2, (rows, 1)).astype(bool),
    }


def _infer(client, model: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    reply = client.infer(model, _inputs(arrays))
    return {o["name"]: reply.as_numpy(o["name"]) for o in reply.get_response()["outputs"]}


def test_its_answers_are_the_pytorch_backends_on_the_same_export(two_runtimes, tiny_run):
    """Whole batches of mixed histories, k and exclude_seen: the same item IDs, scores and unknown counts,
    bit for bit (one graph, one CPU)."""
    with TritonServer(two_runtimes, server_settings()) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for rows, seed in ((1, 0), (7, 1), (64, 2)):
            arrays = _batch(tiny_run, rows, seed)
            theirs, mine = _infer(client, "recommender_native", arrays), _infer(client, "native_recserve", arrays)
            assert theirs.keys() == mine.keys() and len(mine) == 3
            for name in theirs:
                np.testing.assert_array_equal(mine[name], theirs[name], err_msg=f"{name}, {rows} rows")
            assert mine["unknown_item_ids"][0, 0] == 1
        # the backend reports an execution's statistics after it sent the answers: read until the last is in
        deadline, counts = time.monotonic() + 5, None
        while counts != (1 + 7 + 64, 3) and time.monotonic() < deadline:
            stats = client.get_inference_statistics("native_recserve")["model_stats"][0]
            counts = (int(stats["inference_count"]), int(stats["execution_count"]))
        assert counts == (1 + 7 + 64, 3)


def test_requests_batched_together_each_get_their_own_rows(two_runtimes, tiny_run):
    """Concurrent requests of 1-3 rows each, batched into shared executions: every request gets the answer
    it gets alone (from the PyTorch backend, one request at a time)."""
    with TritonServer(two_runtimes, server_settings()) as server:
        alone = httpclient.InferenceServerClient(server.http_url)
        requests = [_batch(tiny_run, 1 + i % 3, 100 + i) for i in range(96)]
        expected = [_infer(alone, "recommender_native", arrays) for arrays in requests]

        async def burst():
            async with grpcclient.InferenceServerClient(server.grpc_url) as client:
                jobs = [client.infer("native_recserve", _inputs(arrays, grpcclient)) for arrays in requests]
                return await asyncio.gather(*jobs)

        for _ in range(5):  # bounded: a loaded machine may answer one burst a request at a time
            before = alone.get_inference_statistics("native_recserve")["model_stats"][0]
            replies = asyncio.run(burst())
            for arrays, reply, want in zip(requests, replies, expected):  # answers are as wide as a batch's
                got = {name: reply.as_numpy(name) for name in want}  # largest k: each row up to its own k
                for row, k in enumerate(arrays["k"][:, 0]):  # another batch size may round the last bit
                    scores, ids = got["scores"][row, :k], got["item_ids"][row, :k]
                    np.testing.assert_allclose(scores, want["scores"][row, :k], rtol=1e-5, atol=1e-6)
                    tied = np.abs(scores - want["scores"][row, :k]) <= 1e-5
                    assert np.all((ids == want["item_ids"][row, :k]) | tied), (row, ids, want["item_ids"][row])
                    assert np.all(got["item_ids"][row, k:] == -1)
                np.testing.assert_array_equal(got["unknown_item_ids"], want["unknown_item_ids"])
            after = alone.get_inference_statistics("native_recserve")["model_stats"][0]
            if int(after["execution_count"]) - int(before["execution_count"]) < len(requests):
                break  # some executions ran several requests, and each got its own rows
        else:
            raise AssertionError("no execution ran more than one request in five bursts")


def _inputs(arrays: dict[str, np.ndarray], module=httpclient) -> list:
    inputs = []
    for name, value in arrays.items():
        tensor = module.InferInput(name, list(value.shape), {"item_ids": "INT64", "k": "INT32"}.get(name, "BOOL"))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def test_a_request_may_ask_for_some_outputs_only(two_runtimes, tiny_run):
    with TritonServer(two_runtimes, server_settings()) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        reply = client.infer(
            "native_recserve", _inputs(_batch(tiny_run, 3, 5)), outputs=[httpclient.InferRequestedOutput("scores")]
        )
        assert [o["name"] for o in reply.get_response()["outputs"]] == ["scores"]
        assert reply.as_numpy("scores").shape[0] == 3


def test_step_summary_s_makes_each_instance_log_its_batches_steps(two_runtimes, tiny_run, tmp_path):
    """Each step's median, 99th percentile and largest time a batch, after the first batch and then every
    step_summary_s seconds; nothing without the parameter."""
    source = two_runtimes / "native_recserve"
    for period_s in (60, 0):
        repo = tmp_path / f"repo-{period_s}"
        (repo / "native_recserve" / "1").mkdir(parents=True)
        (repo / "native_recserve" / "1" / "model.pt").write_bytes((source / "1" / "model.pt").read_bytes())
        config = parse_pbtxt((source / "config.pbtxt").read_text())
        if period_s:
            config.parameters["step_summary_s"].string_value = str(period_s)
        (repo / "native_recserve" / "config.pbtxt").write_text(str(config))
        with TritonServer(repo, server_settings()) as server:
            client = httpclient.InferenceServerClient(server.http_url)
            for seed in range(3):
                client.infer("native_recserve", _inputs(_batch(tiny_run, 2, seed)))
            log = server.log_path.read_text()
        lines = [line for line in log.splitlines() if "ms a batch, p50/p99/max" in line]
        if not period_s:
            assert not lines
            continue
        assert len(lines) == 1, lines  # the first batch's; the next come a period on
        steps = lines[0].split("p50/p99/max: ")[1].rstrip('"').split(", ")
        assert [step.split(" ")[0] for step in steps] == ["requests", "store", "parse", "inputs", "graph", "answers"]
        times = {name: [float(t) for t in value.split("/")] for name, value in (s.split(" ") for s in steps)}
        assert all(0 <= p50 <= p99 <= top for p50, p99, top in times.values())
        assert times["graph"][0] > 0 and "recserve backend: native_recserve" in lines[0] and "batches 1 in" in lines[0]
        (parsed,) = read_step_lines(log)  # the benchmarks read the same line back
        assert parsed["batches"] == 1 and parsed["ruled"] == 0 and parsed["instance"].startswith("native_recserve")
        assert parsed["steps"] == {name: tuple(t) for name, t in times.items()}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"parameters": {"buckets": "1,0,4"}}, "parameter buckets: '0' is not a batch size in 1..64"),
        ({"parameters": {"buckets": "2,x"}}, "parameter buckets: 'x' is not a batch size in 1..64"),
        ({"parameters": {"padding_id": "none"}}, "parameter padding_id: 'none' is not an integer"),
        ({"outputs": 2}, "the recserve backend serves the recommender_native contract: 3 outputs, not 2"),
        ({"k_type": "INT64"}, "input 1 ('k') is TYPE_INT64; the recommender_native contract has INT32 there"),
        ({"max_batch_size": 0}, "the recserve backend batches requests: set max_batch_size above 0"),
        ({"model_file": b"not a TorchScript archive"}, "loading "),
    ],
)
def test_a_model_it_cannot_serve_is_a_load_error_naming_why(two_runtimes, tmp_path, change, message):
    """The server refuses to start (strict readiness) and its log says what is wrong with the model."""
    repo = tmp_path / "repo"
    (repo / "native_recserve" / "1").mkdir(parents=True)
    source = two_runtimes / "native_recserve"
    model = change.get("model_file", (source / "1" / "model.pt").read_bytes())
    (repo / "native_recserve" / "1" / "model.pt").write_bytes(model)
    config = parse_pbtxt((source / "config.pbtxt").read_text())
    for key, value in change.get("parameters", {}).items():
        config.parameters[key].string_value = value
    if "outputs" in change:
        del config.output[change["outputs"] :]
    if "k_type" in change:
        config.input[1].data_type = 9  # TYPE_INT64
    if "max_batch_size" in change:
        config.max_batch_size = change["max_batch_size"]
        config.ClearField("dynamic_batching")
    (repo / "native_recserve" / "config.pbtxt").write_text(str(config))
    with pytest.raises(ServingError) as err, TritonServer(repo, server_settings()):
        pass
    assert message in str(err.value), str(err.value)[-2000:]


def test_the_repository_writer_picks_the_runtime_and_refuses_what_cannot_run(tiny_run, tiny_export, tmp_path):
    """recserve's backend on GPUs and the PyTorch backend on CPUs by default; --native-runtime chooses; an
    ONNX graph runs on onnxruntime only; an unknown runtime is refused before any export."""
    import dataclasses

    from recserve.artifacts.export_manifest import ExportManifest
    from recserve.pipeline import repository_from_run
    from recserve.serving.triton_repository.native_configs import native_backend
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    repo = tmp_path / "repo"
    repository_from_run(
        tiny_run, repo, ("native",), RepositorySettings(native_runtime="recserve"), backend="torchscript"
    )
    config = parse_pbtxt((repo / "recommender_native" / "config.pbtxt").read_text())
    assert config.backend == "recserve" and not config.platform
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    assert config.parameters["padding_id"].string_value == "-1"
    manifest = dataclasses.replace(ExportManifest.read(tiny_export), native_model="native.pt")
    assert native_backend(manifest, None, "gpu") == ("recserve", "")
    assert native_backend(manifest, None, "cpu") == ("", "pytorch_libtorch")
    assert native_backend(manifest, "pytorch", "gpu") == ("", "pytorch_libtorch")
    onnx = dataclasses.replace(manifest, native_model="native.onnx")
    assert native_backend(onnx, None, "cpu") == ("", "onnxruntime_onnx")
    with pytest.raises(ServingError, match="--native-runtime recserve runs TorchScript; this onnx export"):
        native_backend(onnx, "recserve", "cpu")
    with pytest.raises(ServingError, match="native runtime 'tensorrt': expected one of recserve, pytorch"):
        repository_from_run(tiny_run, tmp_path / "other", ("native",), RepositorySettings(native_runtime="tensorrt"))
    assert not (tmp_path / "other").exists()


def test_the_cli_writes_a_repository_on_the_runtime_asked_for(tiny_run, tmp_path):
    from typer.testing import CliRunner

    from recserve.cli.main import app

    out = tmp_path / "repo"
    result = CliRunner().invoke(
        app,
        [
            "repo",
            "--run",
            str(tiny_run),
            "--out",
            str(out),
            "--layout",
            "native",
            "--backend",
            "torchscript",
            "--native-runtime",
            "recserve",
            "--step-summary-s",
            "30",
        ],
    )
    assert result.exit_code == 0, result.output
    config = parse_pbtxt((out / "recommender_native" / "config.pbtxt").read_text())
    assert config.backend == "recserve" and config.parameters["step_summary_s"].string_value == "30"
    args = ["repo", "--run", str(tiny_run), "--out", str(tmp_path / "y"), "--layout", "native", "--backend"]
    args += ["torchscript", "--native-runtime", "pytorch", "--step-summary-s", "30"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "the batches' steps are logged by recserve's backend" in result.output
    assert "--native-runtime" in CliRunner().invoke(app, ["repo", "--help"], env={"COLUMNS": "200"}).output
    result = CliRunner().invoke(
        app,
        ["repo", "--run", str(tiny_run), "--out", str(tmp_path / "x"), "--layout", "native", "--native-runtime", "x"],
    )
    assert result.exit_code != 0 and "native runtime 'x'" in result.output
