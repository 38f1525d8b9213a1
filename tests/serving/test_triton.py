"""End to end against a real Triton: the fused, seed and echo layouts, integer and string IDs, bad input.

The seed layout's model step runs on Triton's PyTorch backend: its tests skip where that is not built.
The native layout has its own file (test_native.py)."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.conftest import model_top_ids, needs_native_backends, require_native, server_settings
from tritonclient.grpc import model_config_pb2 as pb
from typer.testing import CliRunner

from recserve.client import AsyncRecommenderClient, RecommenderClient, RecommendError
from recserve.constants import OUTPUT_UNKNOWN_IDS
from recserve.errors import ServingError
from recserve.export.validate import FP32_SCORE_TOL
from recserve.pipeline import repository_from_run
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.pbtxt import parse_pbtxt
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import TritonServer

ROOT = Path(__file__).resolve().parents[2]


def _infer(url, model, **arrays):
    client = httpclient.InferenceServerClient(url)
    inputs = []
    for name, value in arrays.items():
        dtype = (
            "BYTES"
            if value.dtype == object
            else {"int64": "INT64", "int32": "INT32", "bool": "BOOL", "float32": "FP32"}[str(value.dtype)]
        )
        tensor = httpclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return client.infer(model, inputs)


def test_each_layout_is_one_module_whose_configs_declare_the_served_contract(int_repo):
    """A layout is a row of recserve.artifacts.served.LAYOUTS and a module of the layouts package of the same
    name; every config the writer wrote declares the contract the clients build their requests from."""
    import pkgutil

    from recserve.artifacts import served
    from recserve.serving.triton_repository import layouts

    modules = {m.name for m in pkgutil.iter_modules(layouts.__path__)} - {"common"}
    assert modules == set(served.LAYOUTS) == set(layouts.LAYOUTS)
    assert all(layouts.LAYOUTS[name].served is served.LAYOUTS[name] for name in served.LAYOUTS)
    declared = {
        "recommender": served.recommender("INT64"),
        "echo": served.recommender("INT64"),
        "bert4rec_ensemble": served.seed("INT64"),
    }
    for model, contract in declared.items():
        config = parse_pbtxt((int_repo / model / "config.pbtxt").read_text())
        assert [(t.name, list(t.dims), t.optional) for t in config.input] == [
            (t.name, list(t.dims), t.optional) for t in contract.inputs
        ], model
        assert [t.name for t in config.output] == contract.output_names, model


@needs_native_backends
def test_the_floor_answers_the_native_contract_without_a_graph(int_server):
    """The floor layout: recserve's backend answers the native contract as wide as the batch's largest k,
    IDs of -1 and scores of 0, with no graph in its version folder."""
    from recserve.constants import FLOOR_MODEL, NATIVE_MODEL

    with (
        RecommenderClient(int_server.grpc_url, model=FLOOR_MODEL) as floor,
        RecommenderClient(int_server.grpc_url, model=NATIVE_MODEL) as native,
    ):
        answer = floor.recommend([1, 2, 3], k=7)
        assert answer.item_ids.tolist() == [-1] * 7 and answer.scores.tolist() == [0.0] * 7
        floor_shape, native_shape = floor.native_shape(), native.native_shape()  # as clients read them
        assert (floor_shape.length, floor_shape.padding_id, floor_shape.max_k) == (
            native_shape.length,
            native_shape.padding_id,
            native_shape.max_k,
        )
    version = Path(int_server.repo) / FLOOR_MODEL / "1"
    assert [p.name for p in version.iterdir()] == ["README"]


def test_config_pbtxt_parses_back_with_tritons_schema(int_repo):
    fused = parse_pbtxt((int_repo / "recommender" / "config.pbtxt").read_text())
    assert fused.max_batch_size == 256 and fused.backend == "python"
    assert fused.input[0].allow_ragged_batch and fused.input[1].optional and fused.input[2].optional
    assert fused.dynamic_batching.max_queue_delay_microseconds == 2000
    assert not fused.dynamic_batching.HasField("default_queue_policy")  # off by default (Triton 2.51 stalls)
    assert fused.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU


@needs_native_backends
def test_the_seed_layout_is_the_pocs_ensemble_around_a_torchscript_model(int_repo):
    ensemble = parse_pbtxt((int_repo / "bert4rec_ensemble" / "config.pbtxt").read_text())
    assert ensemble.platform == "ensemble" and ensemble.max_batch_size == 0
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == [
        "bert4rec_preprocessing",
        "bert4rec",
        "bert4rec_postprocessing",
    ]
    assert list(ensemble.input[0].dims) == [39] and ensemble.input[0].data_type == pb.TYPE_INT64
    model = parse_pbtxt((int_repo / "bert4rec" / "config.pbtxt").read_text())
    assert model.platform == "pytorch_libtorch" and (int_repo / "bert4rec" / "1" / "model.pt").is_file()
    assert model.max_batch_size == 1 and not model.HasField("dynamic_batching")
    assert [i.name for i in model.input] == ["input__0"]
    assert [o.name for o in model.output] == ["output__0", "output__1"]
    assert not (int_repo / "bert4rec" / "1" / "model.py").exists()  # no python imitation left


def test_instances_on_named_gpus_are_written_for_each_gpu(tiny_export, tiny_run, tmp_path):
    settings = RepositorySettings(device="gpu", gpus=(0, 1), instance_count=2)
    write_repository(tiny_export, tmp_path, ("echo",), settings)
    [group] = parse_pbtxt((tmp_path / "echo" / "config.pbtxt").read_text()).instance_group
    assert group.kind == pb.ModelInstanceGroup.KIND_GPU and list(group.gpus) == [0, 1] and group.count == 2
    with pytest.raises(ServingError, match="GPU ids"):
        write_repository(tiny_export, tmp_path / "cpu", ("echo",), RepositorySettings(gpus=(0,)))
    with pytest.raises(ServingError, match="GPU ids"):  # refused before the run is exported
        repository_from_run(tiny_run, tmp_path / "cpu", ("echo",), RepositorySettings(gpus=(0,)))
    assert not (tmp_path / "cpu").exists()


def test_the_repository_serves_the_export_it_was_given(tiny_export, tmp_path):
    """The fused model's version folder is a copy of the validated export, manifest and all."""
    summary = write_repository(tiny_export, tmp_path / "repo", ("fused",))
    served = tmp_path / "repo" / "recommender" / "1" / "export"
    assert (served / "export.json").read_text() == (tiny_export / "export.json").read_text()
    assert (served / "model.pt").read_bytes() == (tiny_export / "model.pt").read_bytes()
    info = json.loads((tmp_path / "repo" / "recserve.json").read_text())
    assert info["layouts"]["fused"]["backend"] == "eager" and summary["models"][0]["name"] == "recommender"


def test_bad_sources_for_a_repository_are_refused_with_what_to_do(tiny_export, tiny_run, tmp_path):
    """Not an export; the seed layout from an export without its TorchScript; an export compiled for another
    device (the native layout's refusals: test_native.py)."""
    from recserve.errors import ExportError
    from recserve.export.exporter import export_run

    with pytest.raises(ExportError, match="no export.json; pass a folder written by `recserve export`"):
        write_repository(tiny_run, tmp_path / "a", ("fused",))
    onnx = tmp_path / "onnx"
    export_run(tiny_run, "onnx", "fp32", onnx)
    with pytest.raises(ServingError, match="seed layout's model step is TorchScript.*--backend torchscript"):
        write_repository(onnx, tmp_path / "b", ("seed",))
    compiled = tmp_path / "compiled"  # a manifest that says: compiled ahead of time, for the CPU
    shutil.copytree(tiny_export, compiled)
    manifest = json.loads((compiled / "export.json").read_text()) | {"backend": "aoti", "portable": False}
    (compiled / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ServingError, match="the aoti export was built for cpu and runs there only"):
        write_repository(compiled, tmp_path / "c", ("fused",), RepositorySettings(device="gpu"))
    with pytest.raises(ServingError, match="layout nope"):
        write_repository(tiny_export, tmp_path / "d", ("nope",))


def test_fused_answers_match_the_predictor_and_count_unknown_ids(int_server, int_repo):
    from recserve.serving.predictor import Predictor

    with RecommenderClient(int_server.grpc_url) as client:
        answer = client.recommend([1, 2, 3, 999_999], k=5)
        clean = client.recommend([1, 2, 3], k=5)
    assert answer.unknown_ids == 1 and len(answer.item_ids) == 5
    np.testing.assert_array_equal(answer.item_ids, clean.item_ids)
    expected = Predictor.load(int_repo / "recommender" / "1" / "export").predict([np.array([1, 2, 3])], k=5)[0]
    np.testing.assert_array_equal(answer.item_ids, expected.item_ids)
    np.testing.assert_allclose(answer.scores, expected.scores, atol=FP32_SCORE_TOL)  # other threads, other sums
    assert not {1, 2, 3} & set(answer.item_ids.tolist()) and np.all(np.diff(answer.scores) <= 0)


def test_empty_history_gets_popular_items_and_a_long_one_its_most_recent(int_server, tiny_run):
    counts = np.load(tiny_run / "popularity.npy")[1:-1]
    reply = _infer(int_server.http_url, "recommender", item_ids=np.zeros((1, 0), np.int64))
    assert set(reply.as_numpy("item_ids")[0]) == set(np.argsort(-counts, kind="stable")[:10] + 1)
    with RecommenderClient(int_server.http_url, "http") as client:
        recent = list(range(200, 219))
        assert (
            client.recommend(list(range(1, 100)) + recent).item_ids.tolist()
            == client.recommend(recent).item_ids.tolist()
        )


@pytest.mark.parametrize("k", [0, 101])
def test_k_out_of_range_is_400_over_http_and_invalid_argument_over_grpc(int_server, k):
    with pytest.raises(RecommendError, match=f"k: {k} is out of range; allowed 1..100") as http_err:
        RecommenderClient(int_server.http_url, "http").recommend([1, 2], k=k)
    assert http_err.value.status == "400"
    with pytest.raises(RecommendError, match="out of range") as grpc_err:
        RecommenderClient(int_server.grpc_url, "grpc").recommend([1, 2], k=k)
    assert "INVALID_ARGUMENT" in grpc_err.value.status


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"item_ids": np.array([[1.0, 2.0]], np.float32)}, "data-type"),
        ({"item_ids": np.ones((1, 2, 3), np.int64)}, "shape"),
        ({"item_ids": np.array([[b"1", b"2"]], dtype=object)}, "data-type"),
        ({"item_ids": np.array([[1]], np.int64), "k": np.array([[5.0]], np.float32)}, "data-type"),
    ],
)
def test_wrong_dtype_shape_or_strings_to_an_integer_model_get_400(int_server, arrays, message):
    with pytest.raises(Exception) as err:
        _infer(int_server.http_url, "recommender", **arrays)
    assert err.value.status() == "400" and message in str(err.value)
    assert int_server.is_ready()


def test_a_batch_mixing_good_and_bad_requests_fails_only_the_bad_ones(int_server):
    async def burst():
        client = AsyncRecommenderClient(int_server.grpc_url)
        calls = [client.recommend([1, 2, i + 3], k=0 if i % 3 == 0 else 5) for i in range(24)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        await client.close()
        return results

    results = asyncio.run(burst())
    for i, result in enumerate(results):
        if i % 3 == 0:
            assert isinstance(result, RecommendError) and "out of range" in str(result)
        else:
            assert len(result.item_ids) == 5
    assert int_server.is_ready()


@needs_native_backends
def test_poc_client_code_works_unchanged_and_agrees_with_fused(int_server):
    # the PoC's client, verbatim in spirit: tritonclient.http, 39 INT64 IDs in `inputs`
    client = httpclient.InferenceServerClient(url=int_server.http_url)
    item_ids = np.arange(1, 40, dtype=np.int64)
    inputs = [httpclient.InferInput("inputs", item_ids.shape, "INT64")]
    inputs[0].set_data_from_numpy(item_ids)
    outputs = [httpclient.InferRequestedOutput("output__0"), httpclient.InferRequestedOutput("output__1")]
    result = client.infer("bert4rec_ensemble", inputs, outputs=outputs)
    ids, scores = result.as_numpy("output__0"), result.as_numpy("output__1")
    assert ids.shape == (10,) and scores.dtype == np.float32
    fused = RecommenderClient(int_server.grpc_url).recommend(item_ids, k=10, exclude_seen=False)
    np.testing.assert_array_equal(fused.item_ids, ids)
    np.testing.assert_allclose(fused.scores, scores, rtol=1e-4, atol=1e-4)


def test_echo_returns_its_fixed_answer_through_the_same_contract(int_server):
    with RecommenderClient(int_server.grpc_url, model="echo") as client:
        assert client.recommend([5, 6], k=3).item_ids.tolist() == [1, 2, 3]
        with pytest.raises(RecommendError, match="out of range"):
            client.recommend([5], k=0)


def test_string_ids_end_to_end_on_fused_and_seed(string_server, string_run):
    """The model's own top items (computed from its scores and the run's ID table) from both layouts."""
    with RecommenderClient(string_server.grpc_url) as client:
        answer = client.recommend(["sku-001", "sku-002", "unknown-sku"], k=4)
    want, clear = model_top_ids(string_run, [np.array(["sku-001", "sku-002"])])
    assert answer.unknown_ids == 1 and clear[0] and answer.item_ids.tolist() == want[0][:4].tolist()
    require_native("pytorch")
    history = np.array([f"sku-{i % 30:03d}".encode() for i in range(39)], dtype=object)
    reply = _infer(string_server.http_url, "bert4rec_ensemble", inputs=history)
    recent = np.array([x.decode() for x in history[-7:]])  # the seed step keeps the window's 7 most recent
    want, clear = model_top_ids(string_run, [recent], exclude_seen=False)
    assert clear[0] and [x.decode() for x in reply.as_numpy("output__0")] == want[0].tolist()
    with pytest.raises(Exception) as err:
        _infer(string_server.http_url, "recommender", item_ids=np.array([[1, 2]], np.int64))
    assert err.value.status() == "400"


def test_recommend_asks_the_model_which_ids_it_takes(string_server, int_server):
    """No --string-ids: the command reads the ID type from the model's metadata. A string catalogue's IDs go
    as strings (once `recommend 42` there got Triton's raw dtype message), a word to an integer one is one line."""
    from recserve.cli.main import app

    with RecommenderClient(string_server.grpc_url) as client:
        assert client.id_type() == "string"
    with RecommenderClient(int_server.http_url, "http") as client:
        assert client.id_type() == "int64"
    asked = CliRunner().invoke(app, ["recommend", "sku-001", "42", "--url", string_server.grpc_url, "--json"])
    assert asked.exit_code == 0 and json.loads(asked.output)[OUTPUT_UNKNOWN_IDS] == 1, asked.output
    wrong = CliRunner().invoke(app, ["recommend", "1", "abc", "--url", int_server.grpc_url], env={"COLUMNS": "200"})
    said = " ".join(wrong.output.split())
    assert wrong.exit_code == 2 and "'abc': this model's item IDs are integers (int64)" in said, said


def test_recommend_command_prints_json(int_server, tiny_run):
    from recserve.cli.main import app

    result = CliRunner().invoke(app, ["recommend", "1", "2", "3", "--url", int_server.grpc_url, "--json", "--k", "4"])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.output)
    want, clear = model_top_ids(tiny_run, [np.array([1, 2, 3])])  # the model's own, from its scores
    assert clear[0] and reply["item_id"] == want[0][:4].tolist() and len(reply["score"]) == 4
    assert reply["score"] == sorted(reply["score"], reverse=True)


@needs_native_backends
def test_recommend_command_asks_the_native_model_for_the_same_answer(int_server):
    from recserve.cli.main import app

    args = ["recommend", "1", "2", "3", "--url", int_server.grpc_url, "--json", "--k", "4"]
    fused = CliRunner().invoke(app, args)
    native = CliRunner().invoke(app, [*args, "--model", "recommender_native"])
    assert native.exit_code == 0, native.output
    assert json.loads(native.output)["item_id"] == json.loads(fused.output)["item_id"]


def test_each_torch_installation_keeps_its_own_link_to_the_native_backends(tmp_path):
    """A build in another checkout, whose environment has its own torch, leaves its link beside this one's
    in the cache folder, never over it (serving would then load backends built against the other torch)."""
    other = tmp_path / "site" / "torch"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    code = "from recserve.serving.triton_server.bundle import native_backends_link as f; print(f())"

    def link(*path: Path) -> Path:
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(map(str, [*path, ROOT / "src"])),
            "RECSERVE_CACHE": str(tmp_path / "cache"),
        }
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return Path(run.stdout.strip())

    mine, theirs = link(), link(tmp_path / "site")
    assert mine != theirs and mine.parent == theirs.parent == tmp_path / "cache"
    assert link() == mine  # the same environment finds the same link again


def test_a_queue_policy_that_rejects_is_written_when_asked(tiny_export, tmp_path):
    write_repository(
        tiny_export, tmp_path, ("echo",), RepositorySettings(max_queue_size=8, queue_timeout_microseconds=5000)
    )
    policy = parse_pbtxt((tmp_path / "echo" / "config.pbtxt").read_text()).dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 8 and policy.default_timeout_microseconds == 5000
    assert policy.timeout_action == pb.ModelQueuePolicy.REJECT and not policy.allow_timeout_override


def test_a_new_version_is_added_beside_the_old(tiny_export, tiny_run, int_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(int_repo, repo)
    write_repository(tiny_export, repo, ("fused",), RepositorySettings(), version=2)
    assert (repo / "recommender" / "1" / "model.py").exists() and (repo / "recommender" / "2" / "export").is_dir()
    with TritonServer(repo, server_settings()) as server:  # Triton's default policy: the newest version only
        http = httpclient.InferenceServerClient(server.http_url)
        ready = [http.is_model_ready("recommender", version) for version in ("1", "2")]
        with RecommenderClient(server.grpc_url) as client:
            answer = client.recommend([1, 2, 3], k=5)
    want, clear = model_top_ids(tiny_run, [np.array([1, 2, 3])])
    assert ready == [False, True] and clear[0] and answer.item_ids.tolist() == want[0][:5].tolist()


def test_a_model_that_fails_to_load_stops_the_server_with_its_error(int_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(int_repo / "echo", repo / "echo")
    (repo / "echo" / "1" / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
    with pytest.raises(ServingError, match="broken on purpose"), TritonServer(repo, server_settings()):
        pass


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                addresses.add(address)
    return addresses


def test_the_server_listens_on_loopback_and_restricts_the_repository_api(int_server):
    s = int_server.settings
    for port in (s.http_port, s.grpc_port, s.metrics_port):
        addresses = _listening(port)  # 127.0.0.1, or ::ffff:127.0.0.1 on a dual-stack socket; no wildcard
        assert addresses and addresses <= {"0100007F", "0000000000000000FFFF00000100007F"}, (port, addresses)
    client = grpcclient.InferenceServerClient(int_server.grpc_url)
    assert client.is_server_ready()  # so the refusal below is the restriction, not a dead server
    with pytest.raises(Exception, match="restricted"):
        client.get_model_repository_index()


def test_multvae_is_served_by_the_fused_layout(vae_run, tmp_path):
    from recserve.serving.predictor import Predictor

    repo = tmp_path / "repo"
    repository_from_run(vae_run, repo, ("fused",), backend="onnx")
    history = np.load(vae_run / "item_ids.npy")[[3, 30, 300]]
    with TritonServer(repo, server_settings()) as server, RecommenderClient(server.grpc_url) as client:
        answer = client.recommend(history.tolist(), k=10)
    expected = Predictor.load(repo / "recommender" / "1" / "export").predict([history], k=10)[0]
    np.testing.assert_array_equal(answer.item_ids, expected.item_ids)
    assert not set(history.tolist()) & set(answer.item_ids.tolist())


@needs_native_backends
def test_sasrec_is_served_by_the_fused_and_seed_layouts(sasrec_run, tmp_path):
    from recserve.serving.predictor import Predictor

    repo = tmp_path / "repo"
    repository_from_run(sasrec_run, repo, ("fused", "seed"), backend="onnx")
    history = np.load(sasrec_run / "item_ids.npy")[[3, 30, 300]]
    poc_history = np.arange(1, 40, dtype=np.int64)  # the PoC client's request: 39 IDs in `inputs`
    with TritonServer(repo, server_settings()) as server, RecommenderClient(server.grpc_url) as client:
        answer = client.recommend(history.tolist(), k=10)
        fused = client.recommend(poc_history, k=10, exclude_seen=False)
        seed = _infer(server.http_url, "bert4rec_ensemble", inputs=poc_history)
    expected = Predictor.load(repo / "recommender" / "1" / "export").predict([history], k=10)[0]
    np.testing.assert_array_equal(answer.item_ids, expected.item_ids)
    assert not set(history.tolist()) & set(answer.item_ids.tolist())
    np.testing.assert_array_equal(seed.as_numpy("output__0"), fused.item_ids)  # the PoC's path, the same model
