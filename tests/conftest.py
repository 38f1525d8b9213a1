"""Shared fixtures: the prepared ML-100K folder and small synthetic logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recserve.pipeline import repository_from_run
from recserve.processes import free_ports
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.bundle import native_backends
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer


@pytest.fixture(scope="session")
def ml100k_dir(tmp_path_factory) -> Path:
    from recserve.data.datasets import prepare  # here, not above: a GPU machine's tests may lack polars

    out = tmp_path_factory.mktemp("ml100k") / "data"
    prepare("ml-100k", out)
    return out


def _train_tiny(data_dir: Path, out: Path, model: str = "bert4rec", **overrides) -> Path:
    from recserve.artifacts.run_metrics import merge_metrics
    from recserve.train.trainer import TrainConfig, train

    settings = {"window": 20, "hidden": 32, "layers": 1, "heads": 2} | overrides
    summary = train(
        data_dir, out, settings, TrainConfig(epochs=2, samples_per_user=1, device="cpu", resume=False), model=model
    )
    merge_metrics(out, summary)
    return out


@pytest.fixture(scope="session")
def tiny_run(ml100k_dir, tmp_path_factory) -> Path:
    """A small BERT4Rec trained for two epochs on ML-100K (integer IDs)."""
    return _train_tiny(ml100k_dir, tmp_path_factory.mktemp("tiny") / "run")


@pytest.fixture(scope="session")
def tiny_export(tiny_run, tmp_path_factory) -> Path:
    """``tiny_run`` exported (eager, fp32, validated): what repositories and packages are written from."""
    from recserve.export.exporter import export_run

    out = tmp_path_factory.mktemp("tiny-export") / "eager"
    export_run(tiny_run, "eager", "fp32", out)
    return out


@pytest.fixture(scope="session")
def sasrec_run(ml100k_dir, tmp_path_factory) -> Path:
    """A small SASRec trained for two epochs on ML-100K (integer IDs), its relative-position biases then drawn
    far from zero: two epochs leave them near it (0.015 at most), where an export that dropped them would still
    pass every parity check."""
    import torch

    from recserve.constants import WEIGHTS_FILE

    run = _train_tiny(ml100k_dir, tmp_path_factory.mktemp("sasrec") / "run", model="sasrec")
    weights = torch.load(run / WEIGHTS_FILE, weights_only=True)
    biases = [name for name in weights if name.endswith("rel_bias")]
    assert biases, "SASRec's defaults have relative positions: the fixture expects their biases"
    generator = torch.Generator().manual_seed(0)
    for name in biases:
        weights[name] = 4 * torch.randn(weights[name].shape, generator=generator)  # attention leans on distance
    torch.save(weights, run / WEIGHTS_FILE)
    return run


@pytest.fixture(scope="session")
def string_data_dir(tmp_path_factory) -> Path:
    """A synthetic log with string SKUs: each user walks a cycle of items."""
    import numpy as np
    import polars as pl

    from recserve.data.datasets import prepare

    rng = np.random.default_rng(0)
    rows = []
    for user in range(60):
        start = rng.integers(0, 30)
        for step in range(12):
            rows.append((f"user-{user}", f"sku-{(start + step) % 30:03d}", step))
    folder = tmp_path_factory.mktemp("strings")
    pl.DataFrame(rows, schema=["user_id", "item_id", "timestamp"], orient="row").write_csv(folder / "log.csv")
    prepare(str(folder / "log.csv"), folder / "data")
    return folder / "data"


def model_top_ids(
    run: Path, histories: list, exclude_seen: bool = True, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The trained model's own top 10 per history of IDs (each at most window - 1 long), computed here from its
    scores and the run's ID table, independently of the serving code; and which histories have no near-tie
    (under 1e-4) between the 10th and 11th scores. ``allowed``: (N,) bool over the ID table, the only items a
    business rule lets through (-1 fills a row past the items allowed)."""
    import torch

    from recserve.constants import ITEM_TABLE_FILE, PAD_INDEX
    from recserve.models.run_loader import load_run

    table = np.load(run / ITEM_TABLE_FILE, allow_pickle=False)  # index i + 1 has ID table[i]
    model = load_run(run).eval()
    window = model.cfg.window
    order = np.argsort(table)
    tokens = np.zeros((len(histories), window), dtype=np.int64)
    for row, history in enumerate(histories):
        tokens[row, window - 1 - len(history) : window - 1] = order[np.searchsorted(table, history, sorter=order)] + 1
    tokens[:, -1] = len(table) + 1  # the mask (reserved) token
    with torch.no_grad():
        scores = model(torch.as_tensor(tokens)).float().numpy()
    scores[:, [PAD_INDEX, len(table) + 1]] = -np.inf
    if allowed is not None:
        scores[:, 1:-1][:, ~allowed] = -np.inf
    if exclude_seen:
        np.put_along_axis(scores, tokens[:, :-1], -np.inf, axis=1)
        scores[:, PAD_INDEX] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :11]
    ranked = np.take_along_axis(scores, top, axis=1)
    ids = np.where(np.isfinite(ranked[:, :10]), table[np.clip(top[:, :10] - 1, 0, len(table) - 1)], -1)
    return ids, (ranked[:, 9] - ranked[:, 10] > 1e-4) | ~np.isfinite(ranked[:, 9])


@pytest.fixture(scope="session")
def string_run(string_data_dir, tmp_path_factory) -> Path:
    return _train_tiny(string_data_dir, tmp_path_factory.mktemp("string-run") / "run", window=8)


def start_serve(repo: Path, *options: str) -> tuple[subprocess.Popen, int, int, int]:
    """`recserve serve` on free loopback ports in its own process, as a user starts it (output piped).
    Returns the process and its HTTP, gRPC and metrics ports."""
    http, grpc, metrics = free_ports(3)
    command = [
        sys.executable,
        "-m",
        "recserve.cli.main",
        "serve",
        "--repo",
        str(repo),
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--metrics-port",
        str(metrics),
        *(() if "--exit-timeout-secs" in options else ("--exit-timeout-secs", "5")),  # an idle client's
        *options,  # keep-alive connection holds a stop for the whole timeout
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), http, grpc, metrics


def server_settings(**overrides) -> ServerSettings:
    http, grpc, metrics = free_ports(3)
    # a test's idle keep-alive connections would hold each stop for the whole exit timeout
    return ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_secs=3, **overrides)


BUILT_BACKENDS = {p.name for p in native_backends()}
# Triton's PyTorch and ONNX Runtime backends, built by scripts/build_triton_backends.sh (make test runs it): the
# seed layout's model step runs on the first, the native layout on either (ONNX Runtime's on CPUs, where IDs are
# dense). A test that needs one fails where it is not built, unless RECSERVE_SKIP_NATIVE=1 says to go without.
SKIP_NATIVE_ENV = "RECSERVE_SKIP_NATIVE"
SKIP_NATIVE = os.environ.get(SKIP_NATIVE_ENV) == "1"
NATIVE_READY = {"pytorch", "onnxruntime"} <= BUILT_BACKENDS
SERVED_LAYOUTS = ("fused", "seed", "native", "echo") if NATIVE_READY else ("fused", "echo")  # a test server's
BENCH_LAYOUTS = (*SERVED_LAYOUTS, "floor") if NATIVE_READY else SERVED_LAYOUTS  # and the floor beside native


def require_native(*backends: str) -> None:
    """Fails the calling test where one of ``backends`` (default all three) is not built; skips it instead only
    under RECSERVE_SKIP_NATIVE=1, which the test summary then names."""
    missing = sorted(set(backends or ("pytorch", "onnxruntime", "recserve")) - BUILT_BACKENDS)
    if not missing:
        return
    message = (
        f"the native {' and '.join(missing)} backend(s) are not built: run scripts/build_triton_backends.sh "
        f"(make test does; it needs TRITON_NATIVE_SRC or network for the sources), or set {SKIP_NATIVE_ENV}=1"
    )
    if SKIP_NATIVE:
        pytest.skip(f"{SKIP_NATIVE_ENV}=1: {message}")
    pytest.fail(message)


@pytest.fixture
def native_backends_built() -> None:
    require_native()


needs_native_backends = pytest.mark.usefixtures("native_backends_built")


def pytest_terminal_summary(terminalreporter) -> None:
    if SKIP_NATIVE:
        skipped = sum(SKIP_NATIVE_ENV in str(r.longrepr) for r in terminalreporter.stats.get("skipped", []))
        terminalreporter.write_line(
            f"{SKIP_NATIVE_ENV}=1: {skipped} test(s) of the native and seed layouts skipped (backends not built)",
            yellow=True,
        )


@pytest.fixture(scope="session")
def int_repo(tiny_run, tmp_path_factory):
    """Every layout of ``tiny_run``: fused from an eager export, native and seed from a torchscript one, and
    the floor (recserve's backend without a graph) where the native backends are built."""
    repo = tmp_path_factory.mktemp("repo-int") / "repo"
    repository_from_run(
        tiny_run, repo, BENCH_LAYOUTS, RepositorySettings(max_queue_delay_microseconds=2000), backend="eager"
    )
    return repo


@pytest.fixture(scope="session")
def int_server(int_repo):
    with TritonServer(int_repo, server_settings()) as server:
        yield server


@pytest.fixture(scope="session")
def string_server(string_run, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo-str") / "repo"
    layouts = tuple(x for x in SERVED_LAYOUTS if x != "native")  # string IDs have no native layout
    repository_from_run(string_run, repo, layouts, backend="onnx")
    with TritonServer(repo, server_settings()) as server:
        yield server


@pytest.fixture(scope="session")
def ml100k_implicit_dir(tmp_path_factory) -> Path:
    """ML-100K as implicit feedback: ratings of 4 and 5 (the Mult-VAE paper's threshold of 3.5)."""
    from recserve.data.datasets import PrepareOptions, prepare

    out = tmp_path_factory.mktemp("ml100k-implicit") / "data"
    prepare("ml-100k", out, PrepareOptions(rating_threshold=3.5))
    return out


@pytest.fixture(scope="session")
def vae_run(ml100k_implicit_dir, tmp_path_factory) -> Path:
    """Mult-VAE trained briefly on implicit ML-100K, its test metrics in metrics.json."""
    from recserve.artifacts.run_metrics import merge_metrics
    from recserve.train.heldout import evaluate_heldout_run
    from recserve.train.trainer import TrainConfig, train

    out = tmp_path_factory.mktemp("vae") / "run"
    cfg = TrainConfig(epochs=25, batch_size=100, weight_decay=0.0, patience=25, device="cpu", resume=False)
    merge_metrics(out, train(ml100k_implicit_dir, out, {}, cfg, model="multvae"))
    merge_metrics(out, evaluate_heldout_run(out, ml100k_implicit_dir))
    return out


def other_histories(data_dir: Path, out: Path) -> Path:
    """A copy of a prepared data folder whose longest history lacks its first item: the same items and users
    (the item count agrees), another fingerprint."""
    import shutil

    import polars as pl

    shutil.copytree(data_dir, out)
    sequences = pl.read_parquet(out / "sequences.parquet")
    longest = int(sequences["items"].list.len().arg_max())
    shortened = sequences["items"].to_list()
    shortened[longest] = shortened[longest][1:]
    sequences.with_columns(pl.Series("items", shortened)).write_parquet(out / "sequences.parquet")
    return out
