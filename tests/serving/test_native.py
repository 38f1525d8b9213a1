"""Triton's native PyTorch and ONNX Runtime backends (built from source by scripts/build_triton_backends.sh,
which `make test` runs) serve TorchScript and ONNX models in the bundled server beside the python backend;
the native layout (``recommender_native``) serves the whole graph on them."""

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tests.conftest import require_native, server_settings
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from recserve.serving.triton_repository.pbtxt import InstanceGroup, TensorSpec, TritonModelConfig, to_pbtxt
from recserve.serving.triton_server.launcher import TritonServer

HISTORY = np.array([[3, 17, 42, 0], [5, 0, 0, 0]], dtype=np.int64)


class TopItems(torch.nn.Module):
    """Histories of item indices (padding 0) in, the top 5 of 50 items out: the shape of a serving graph."""

    def __init__(self):
        super().__init__()
        self.items = torch.nn.Embedding(51, 8, padding_idx=0)

    def forward(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        query = self.items(history).sum(1)  # (B, 8)
        scores = query @ self.items.weight[1:].T  # (B, 50)
        top_scores, top = scores.topk(5, dim=1)
        return top + 1, top_scores


def _model_dir(tmp_path: Path, backend: str) -> Path:
    require_native(backend)
    torch.manual_seed(0)
    folder = tmp_path / "repo" / "top_items"
    (folder / "1").mkdir(parents=True)
    return folder


def _serve_once(model_dir: Path, backend: str, names: tuple[str, str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Writes the model's config, serves the repository, and asks once for ``HISTORY``'s top items."""
    source, ids, scores = names
    config = TritonModelConfig(
        "top_items",
        (TensorSpec(source, "INT64", (-1,)),),
        (TensorSpec(ids, "INT64", (5,)), TensorSpec(scores, "FP32", (5,))),
        backend=backend,
        max_batch_size=8,
        instance_groups=(InstanceGroup(count=1, kind="KIND_CPU"),),
    )
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    with TritonServer(model_dir.parent, server_settings()) as server:
        tensor = httpclient.InferInput(source, list(HISTORY.shape), "INT64")
        tensor.set_data_from_numpy(HISTORY)
        reply = httpclient.InferenceServerClient(server.http_url).infer("top_items", [tensor])
    return reply.as_numpy(ids), reply.as_numpy(scores)


def test_the_pytorch_backend_serves_a_torchscript_model_like_python_runs_it(tmp_path):
    model_dir = _model_dir(tmp_path, "pytorch")
    module = torch.jit.trace(TopItems().eval(), torch.ones(2, 4, dtype=torch.int64))
    torch.jit.save(module, model_dir / "1" / "model.pt")
    ids, scores = _serve_once(model_dir, "pytorch", ("INPUT__0", "OUTPUT__0", "OUTPUT__1"))
    expected_ids, expected_scores = module(torch.from_numpy(HISTORY))
    np.testing.assert_array_equal(ids, expected_ids.numpy())
    np.testing.assert_allclose(scores, expected_scores.detach().numpy(), rtol=1e-5)


def test_the_onnxruntime_backend_serves_an_onnx_model_like_onnxruntime_runs_it(tmp_path):
    import onnxruntime

    model_dir = _model_dir(tmp_path, "onnxruntime")
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=1, max=32)
    torch.onnx.export(
        TopItems().eval(),
        (torch.ones(2, 4, dtype=torch.int64),),
        model_dir / "1" / "model.onnx",
        dynamo=True,
        input_names=["history"],
        output_names=["top", "top_scores"],
        dynamic_shapes={"history": {0: batch, 1: length}},
    )
    ids, scores = _serve_once(model_dir, "onnxruntime", ("history", "top", "top_scores"))
    session = onnxruntime.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    expected_ids, expected_scores = session.run(None, {"history": HISTORY})
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


# The native layout: recommender_native, the whole serving graph on Triton's own backends


# the native layout's export backend -> what runs it (a Triton backend)
NATIVE_SERVERS = {"torchscript": "pytorch", "onnx": "onnxruntime", "torchscript-recserve": "recserve"}


@pytest.fixture(scope="module", params=list(NATIVE_SERVERS))
def native_server(request, tiny_run, tmp_path_factory):
    """``tiny_run`` served in the fused layout (eager) and the native layout from a ``param`` export, on
    Triton's PyTorch or ONNX Runtime backend or on recserve's own."""
    from recserve.pipeline import repository_from_run
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    runtime = NATIVE_SERVERS[request.param]
    require_native(runtime)
    repo = tmp_path_factory.mktemp(f"native-{request.param}") / "repo"
    settings = RepositorySettings(
        instance_count=2,
        native_instance_count=2,
        max_queue_delay_microseconds=2000,
        native_runtime=runtime if runtime == "recserve" else None,
    )
    repository_from_run(tiny_run, repo, ("native",), settings, backend=request.param.split("-")[0])
    assert f"/{runtime}" in str(native_server_backend(repo)), "the repository names its backend"
    repository_from_run(tiny_run, repo, ("fused",), settings, backend="eager")
    with TritonServer(repo, server_settings()) as server:
        yield server


def native_server_backend(repo: Path) -> str:
    """The backend (or platform) of the repository's native model, as its config.pbtxt names it."""
    from recserve.serving.triton_repository.pbtxt import parse_pbtxt

    config = parse_pbtxt((repo / "recommender_native" / "config.pbtxt").read_text())
    return "/" + (config.backend or config.platform.split("_")[0])


def _histories(tiny_run) -> list[np.ndarray]:
    """Real-looking requests: short, long (past the window), empty, with unknown IDs, with negative IDs."""
    ids = np.load(tiny_run / "item_ids.npy")
    rng = np.random.default_rng(3)
    out = [ids[rng.integers(0, len(ids), n)] for n in (1, 2, 5, 12, 19, 30, 60)]
    return out + [ids[:0], np.array([ids[4], 999_999, ids[9]]), np.array([-7, ids[1]]), np.array([999_999])]


def test_native_answers_are_the_fused_answers(native_server, tiny_run):
    from recserve.client import RecommenderClient

    fused = RecommenderClient(native_server.grpc_url)
    native = RecommenderClient(native_server.grpc_url, model="recommender_native")
    for history in _histories(tiny_run):
        for k, exclude in ((10, True), (3, False), (100, True)):
            a, b = fused.recommend(history, k, exclude), native.recommend(history, k, exclude)
            assert len(b.item_ids) == k and b.unknown_ids == a.unknown_ids, (history, k)
            tied = np.abs(a.scores - b.scores) <= 1e-3  # an eager and a compiled graph may swap equal scores
            assert np.all((a.item_ids == b.item_ids) | tied), (history, k, a.item_ids, b.item_ids)
    assert native.recommend([999_999, -3, 5]).unknown_ids == 2  # padding (-1) aside, every ID not in the catalogue


def test_native_requests_of_different_k_share_batches(native_server, tiny_run):
    """Concurrent requests are batched (equal shapes: padded histories) and each gets its own k."""
    from recserve.client import AsyncRecommenderClient

    histories = _histories(tiny_run)

    async def ask():
        client = AsyncRecommenderClient(native_server.grpc_url, model="recommender_native")
        try:
            jobs = [client.recommend(histories[i % len(histories)], k=1 + i % 20) for i in range(120)]
            return await asyncio.gather(*jobs)
        finally:
            await client.close()

    stats = httpclient.InferenceServerClient(native_server.http_url)
    for _ in range(5):  # bounded: a loaded machine may answer one burst a request at a time
        before = stats.get_inference_statistics("recommender_native")["model_stats"][0]
        answers = asyncio.run(ask())
        assert [len(a.item_ids) for a in answers] == [1 + i % 20 for i in range(120)]
        after = stats.get_inference_statistics("recommender_native")["model_stats"][0]
        executions = int(after["execution_count"]) - int(before["execution_count"])
        if executions < int(after["inference_count"]) - int(before["inference_count"]):
            break  # some executions ran several requests
    else:
        raise AssertionError("no execution ran more than one request in five bursts of 120")


def _raw(url: str, **arrays):
    client = httpclient.InferenceServerClient(url)
    inputs = []
    for name, value in arrays.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return client.infer("recommender_native", inputs)


def _good(length: int = 19) -> dict:
    ids = np.full((1, length), -1, dtype=np.int64)
    ids[0, -2:] = [1, 2]
    return {"item_ids": ids, "k": np.array([[5]], np.int32), "exclude_seen": np.array([[True]])}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"item_ids": np.array([[1, 2, 3]], np.int64)}, "unexpected shape for input 'item_ids'"),
        ({"item_ids": np.ones((1, 19), np.int32)}, "inference input 'item_ids' data-type is 'INT32'"),
        ({"k": np.array([[5]], np.int64)}, "inference input 'k' data-type is 'INT64'"),
        ({"exclude_seen": np.array([[1]], np.int32)}, "inference input 'exclude_seen' data-type is 'INT32'"),
        ({"item_ids": np.array([[b"sku"] * 19], object)}, "data-type is 'BYTES'"),
        ({"k": None}, "but missing required input(s) ['k']"),
    ],
)
def test_bad_native_requests_get_a_clear_400_and_the_server_stays_ready(native_server, change, message):
    arrays = _good() | change
    with pytest.raises(InferenceServerException) as err:
        _raw(native_server.http_url, **{k: v for k, v in arrays.items() if v is not None})
    assert err.value.status() == "400" and message in err.value.message(), err.value.message()
    assert native_server.is_ready()
    assert _raw(native_server.http_url, **_good()).as_numpy("scores").shape == (1, 5)


@pytest.mark.parametrize("k", [0, -4, 101])
def test_k_out_of_range_gets_no_items_from_the_server_and_an_error_from_the_client(native_server, k):
    """A native model cannot fail one request of a batch: a k outside 1..max_k gets only padding (its
    neighbours are answered), and RecommenderClient refuses such a k before sending."""
    from recserve.client import RecommenderClient, RecommendError

    reply = _raw(native_server.http_url, **(_good() | {"k": np.array([[k]], np.int32)}))
    names = [o["name"] for o in reply.get_response()["outputs"]]
    ids = reply.as_numpy(names[0] if names[0] != "scores" else names[1])
    assert np.all(ids == -1) and np.all(np.isneginf(reply.as_numpy("scores")))
    with pytest.raises(RecommendError, match=f"k: {k} is out of range; allowed 1..100"):
        RecommenderClient(native_server.grpc_url, model="recommender_native").recommend([1, 2], k=k)
    with pytest.raises(RecommendError, match="the native layout takes integer IDs"):
        RecommenderClient(native_server.grpc_url, model="recommender_native").recommend(["sku-1"], k=3)
    assert native_server.is_ready()


def test_native_repository_refusals_say_what_to_do(tiny_export, string_run, tmp_path):
    """An export without a native model (eager; string IDs) and a traced model asked for another device."""
    from recserve.errors import ServingError
    from recserve.export.exporter import export_run
    from recserve.serving.triton_repository.layouts import write_repository
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    with pytest.raises(ServingError, match="eager export holds no native model; export with --backend torchscript"):
        write_repository(tiny_export, tmp_path / "a", ("native",))
    strings = tmp_path / "strings"
    export_run(string_run, "torchscript", "fp32", strings)
    with pytest.raises(ServingError, match="string IDs cannot be tensors.*fused layout"):
        write_repository(strings, tmp_path / "b", ("native",))
    with pytest.raises(ServingError, match="traced on cpu and runs there only; serve it with --device cpu"):
        write_repository(strings, tmp_path / "c", ("seed",), RepositorySettings(device="gpu"))


def test_a_repository_needing_an_unbuilt_backend_is_refused_before_the_server_starts(tmp_path):
    from recserve.errors import ServingError
    from recserve.serving.triton_server.bundle import check_backends

    folder = tmp_path / "backends"
    (folder / "python").mkdir(parents=True)
    repo = tmp_path / "repo"
    (repo / "bert4rec").mkdir(parents=True)
    (repo / "bert4rec" / "config.pbtxt").write_text('name: "bert4rec"\nplatform: "pytorch_libtorch"\n')
    with pytest.raises(ServingError, match="bert4rec need.* Triton's pytorch backend.*scripts/build_triton_backends"):
        check_backends(repo, folder)
    (folder / "pytorch").mkdir()
    check_backends(repo, folder)


def test_a_gpu_repository_on_a_backend_built_without_cuda_is_refused_naming_the_rebuild(tmp_path):
    from recserve.errors import ServingError
    from recserve.serving.triton_server.bundle import check_backends

    folder = tmp_path / "backends"
    (folder / "pytorch").mkdir(parents=True)
    repo = tmp_path / "repo"
    (repo / "recommender_native").mkdir(parents=True)
    (repo / "recommender_native" / "config.pbtxt").write_text(
        'name: "recommender_native"\nplatform: "pytorch_libtorch"\ninstance_group { kind: KIND_GPU count: 1 }\n'
    )
    for build in (None, '{"cuda": false}'):  # a build of before build.json, and a CPU build
        if build:
            (folder / "pytorch" / "build.json").write_text(build)
        with pytest.raises(ServingError, match="recommender_native run.* on GPUs.*without CUDA.*build_triton_backends"):
            check_backends(repo, folder)
    (folder / "pytorch" / "build.json").write_text('{"cuda": true, "cuda_archs": "90-real"}')
    check_backends(repo, folder)


def test_native_config_takes_padded_ids_and_its_own_instance_count(tiny_run, tmp_path):
    import os

    from recserve.export.exporter import export_run
    from recserve.serving.triton_repository.layouts import write_repository
    from recserve.serving.triton_repository.pbtxt import parse_pbtxt
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    export_run(tiny_run, "torchscript", "fp32", tmp_path / "ts")
    write_repository(tmp_path / "ts", tmp_path / "a", ("native",), RepositorySettings(instance_count=1))
    config = parse_pbtxt((tmp_path / "a" / "recommender_native" / "config.pbtxt").read_text())
    assert config.platform == "pytorch_libtorch" and list(config.input[0].dims) == [19]  # window 20 - the mask
    assert [i.optional for i in config.input] == [False, False, False]  # native batching needs every input
    assert config.parameters["padding_id"].string_value == "-1" and config.parameters["max_k"].string_value == "100"
    assert config.instance_group[0].count == min(8, 4 * len(os.sched_getaffinity(0)))  # threads in the server
    write_repository(tmp_path / "ts", tmp_path / "b", ("native",), RepositorySettings(native_instance_count=3))
    config = parse_pbtxt((tmp_path / "b" / "recommender_native" / "config.pbtxt").read_text())
    assert config.instance_group[0].count == 3


def test_recserves_backend_serves_the_8_bit_output_layer(tiny_run, tmp_path):
    """precision fp8 through Triton: recserve's backend loads the TorchScript graph with its float8 item table
    (kept as an attribute of the file) and answers what the eager graph at fp8 answers."""
    from recserve.client import RecommenderClient
    from recserve.export.graph import build_graph, load_spec
    from recserve.export.runner import torch_runner
    from recserve.pipeline import repository_from_run
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    require_native("recserve")
    repo = tmp_path / "repo"
    settings = RepositorySettings(native_instance_count=1, native_runtime="recserve")
    repository_from_run(tiny_run, repo, ("native",), settings, backend="torchscript", precision="fp8")
    spec = load_spec(tiny_run)
    eager = torch_runner(build_graph(tiny_run, spec, 100, "fp8"), "cpu", len(spec.vocab_ids))
    plain = torch_runner(build_graph(tiny_run, spec, 100, "bf16"), "cpu", len(spec.vocab_ids))
    differs = False
    with TritonServer(repo, server_settings()) as server:
        native = RecommenderClient(server.grpc_url, model="recommender_native")
        known = np.load(tiny_run / "item_ids.npy")  # a history of no known item: the popularity answer, in bf16
        for history in [h for h in _histories(tiny_run) if 0 < len(h) <= 19 and np.isin(h, known).all()]:
            got = native.recommend(history, 10, True)
            arrays = (history[None, :].astype(np.int64), np.array([len(history)]), np.array([True]))
            ids, scores = (a[0, :10] for a in eager(*arrays))
            tied = np.abs(scores - got.scores) <= 1e-3
            assert np.all((ids == got.item_ids) | tied), (history, ids, got.item_ids)
            differs |= not np.allclose(plain(*arrays)[1][0, :10], got.scores, atol=1e-4)
    assert differs, "the served scores are the bf16 table's, not the 8-bit one's"
