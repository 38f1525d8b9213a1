"""Exports: parity with eager fp32 on untraced shapes, the PoC's traps, and nothing written on failure."""

import json

import numpy as np
import pytest
import torch

from recserve.artifacts.export_manifest import ExportManifest
from recserve.errors import ExportError
from recserve.export import exporter
from recserve.export.backend_protocol import rule_inputs
from recserve.export.backends import load_runner
from recserve.export.graph import build_graph, example_inputs, load_spec
from recserve.export.runner import torch_runner
from recserve.export.validate import FP32_SCORE_TOL


@pytest.mark.parametrize("run", ["tiny_run", "sasrec_run"])  # BERT4Rec and SASRec
@pytest.mark.parametrize("backend", ["eager", "torchscript", "onnx"])
def test_fp32_exports_match_eager_on_untraced_shapes(run, request, tmp_path, backend):
    run = request.getfixturevalue(run)
    manifest = exporter.export_run(run, backend, "fp32", tmp_path / "out")
    validation = manifest.validation
    assert validation["max_score_diff"] <= FP32_SCORE_TOL and validation["top10_overlap"] == 1.0
    assert {(c["batch"], c["length"]) for c in validation["cases"]} >= {(1, 7), (3, 19), (64, 19)}
    assert_matches_eager(run, tmp_path / "out", length=5)


def assert_matches_eager(run, export_dir, length: int) -> None:
    """The export's answers against the eager graph built here, on a batch and seed no parity case used:
    not the manifest's word for it."""
    spec = load_spec(run, graph_searches=ExportManifest.read(export_dir).backend != "onnx")
    inputs = [t.numpy() for t in example_inputs(spec, 11, length, seed=42)]
    reference = torch_runner(build_graph(run, spec, 100), "cpu", len(spec.vocab_ids))(*inputs)
    got = load_runner(export_dir)(*inputs)
    np.testing.assert_array_equal(got[0][:, :10], reference[0][:, :10])
    np.testing.assert_allclose(got[1], reference[1], atol=FP32_SCORE_TOL)


@pytest.mark.parametrize(
    ("option", "backend"),
    [("ligr", "torchscript"), ("ligr", "onnx"), ("lru", "torchscript"), ("lru", "onnx")],
)
def test_sasrecs_block_options_export_with_their_weights(sasrec_run, tmp_path, option, backend):
    """SASRec's block options, each on (LiGR: gated residuals, SwiGLU; lru: a linear recurrent unit beside
    attention): the trained run's folder with the option on and weights drawn far from their start (gate biases,
    the recurrence's radii and phases included), exported and checked against eager fp32. The native graph's
    parity is the export's own check (``validation["native"]``), on the graph recserve's backend replays."""
    import shutil

    from recserve.artifacts.model_config import read_model_config
    from recserve.constants import MODEL_CONFIG_FILE, WEIGHTS_FILE
    from recserve.models import SASRec, SASRecConfig

    run = tmp_path / f"{option}-run"
    shutil.copytree(sasrec_run, run)
    config = json.loads((run / MODEL_CONFIG_FILE).read_text()) | {option: True}
    (run / MODEL_CONFIG_FILE).write_text(json.dumps(config))
    torch.manual_seed(0)
    model = SASRec(SASRecConfig.from_settings(read_model_config(run)))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    torch.save(model.state_dict(), run / WEIGHTS_FILE)
    manifest = exporter.export_run(run, backend, "fp32", tmp_path / "out")
    assert manifest.validation["max_score_diff"] <= FP32_SCORE_TOL and manifest.validation["top10_overlap"] == 1.0
    if backend == "torchscript":
        assert manifest.validation["native"]["max_score_diff"] <= FP32_SCORE_TOL
    assert_matches_eager(run, tmp_path / "out", length=5)


def test_torch_compile_matches_eager(tiny_run, tmp_path):
    manifest = exporter.export_run(tiny_run, "compile", "fp32", tmp_path / "out")
    assert manifest.validation["top10_overlap"] == 1.0
    assert_matches_eager(tiny_run, tmp_path / "out", length=5)


def test_aot_inductor_package_matches_eager(tiny_run, tmp_path):
    manifest = exporter.export_run(tiny_run, "aoti", "fp32", tmp_path / "out")
    assert (tmp_path / "out" / "model.pt2").exists() and manifest.fixed_length == 19
    assert_matches_eager(tiny_run, tmp_path / "out", length=19)  # its one compiled length


@pytest.mark.parametrize(
    ("backend", "precision"),
    [("onnx", "int8"), ("eager", "int8"), ("eager", "bf16"), ("eager", "fp8"), ("torchscript", "fp8")],
)
def test_reduced_precision_reports_overlap_and_ndcg_change(tiny_run, ml100k_dir, tmp_path, backend, precision):
    manifest = exporter.export_run(tiny_run, backend, precision, tmp_path / "out", data_dir=ml100k_dir)
    validation = manifest.validation
    assert 0.5 < validation["top10_overlap"] <= 1.0
    assert abs(validation["ndcg10_delta"]) < 0.05 and validation["ndcg10_reference"] > 0
    # the reduction ran: the export's own scores, computed here, differ from eager fp32's (a model left in
    # fp32 would match them to the last bit)
    spec = load_spec(tiny_run, graph_searches=backend != "onnx")
    inputs = [t.numpy() for t in example_inputs(spec, 11, 19, seed=42)]
    reference = torch_runner(build_graph(tiny_run, spec, 100), "cpu", len(spec.vocab_ids))(*inputs)
    got = load_runner(tmp_path / "out")(*inputs)
    changed = np.abs(got[1][:, :10] - reference[1][:, :10]).max()
    assert 1e-6 < changed < 0.5 and manifest.precision == precision


def test_string_ids_are_mapped_by_the_predictor_and_answer_alike_on_every_backend(string_run, tmp_path):
    from recserve.serving.predictor import Predictor

    histories = [np.array(["sku-001", "sku-002", "sku-003"]), np.array(["sku-010"])]  # no empty one: popularity ties
    answers = {}
    for backend in ("eager", "torchscript", "onnx"):
        manifest = exporter.export_run(string_run, backend, "fp32", tmp_path / backend)
        assert manifest.id_mapping == "predictor" and manifest.item_id_type == "string"
        answers[backend] = [r.item_ids.tolist() for r in Predictor.load(tmp_path / backend).predict(histories, k=5)]
    assert answers["torchscript"] == answers["eager"] == answers["onnx"]
    assert all(len(ids) == 5 and all(i.startswith("sku-") for i in ids) for ids in answers["eager"])


def test_failed_parity_is_an_error_with_the_difference_and_nothing_is_written(tiny_run, tmp_path, monkeypatch):
    real_load = exporter.backend_module("torchscript").load

    def perturbed(*args):
        run = real_load(*args)
        return lambda *inputs, **kw: (lambda ids, scores: (ids, scores + 0.01))(*run(*inputs, **kw))

    monkeypatch.setattr(exporter.backend_module("torchscript"), "load", perturbed)
    with pytest.raises(ExportError, match=r"max score difference 1\.00e-02 \(tolerance 1e-03\)"):
        exporter.export_run(tiny_run, "torchscript", "fp32", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize(
    ("backend", "precision", "device", "message"),
    [
        ("tensorrt", "fp32", "cpu", "expected one of"),
        ("eager", "fp4", "cpu", "precision 'fp4'"),
        ("onnx", "fp8", "cpu", "fp8 exports on torchscript, eager, cudagraph, not onnx"),
        ("aoti", "fp8", "cpu", "not aoti; use bf16 on aoti"),
        ("eager", "fp16", "cpu", "fp16 needs a GPU"),
    ],
)
def test_bad_export_requests_are_refused(tiny_run, tmp_path, backend, precision, device, message):
    with pytest.raises(ExportError, match=message):
        exporter.export_run(tiny_run, backend, precision, tmp_path / "out", device=device)


def test_torch_tensorrt_says_what_to_install(tiny_run, tmp_path):
    pytest.importorskip("torch")
    try:
        import torch_tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(ExportError, match="pip install torch-tensorrt"):
            exporter.export_run(tiny_run, "torch_tensorrt", "fp32", tmp_path / "out")
    else:
        pytest.skip("Torch-TensorRT is installed; the GPU test covers it")


def test_graph_takes_int64_ids_and_any_batch(tiny_run, tmp_path):
    """PoC traps: int64 inputs, a dynamic batch dimension, `expand` under dynamic shapes."""
    exporter.export_run(tiny_run, "onnx", "fp32", tmp_path / "out")
    import onnx

    graph = onnx.load(str(tmp_path / "out" / "model.onnx")).graph
    item_ids = graph.input[0]
    assert item_ids.type.tensor_type.elem_type == onnx.TensorProto.INT64
    dims = item_ids.type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_param  # symbolic batch and length
    runner = load_runner(tmp_path / "out")
    for batch in (1, 2, 257):
        ids, scores = runner(np.ones((batch, 3), np.int64), np.full(batch, 3, np.int64), np.ones(batch, bool))
        assert ids.shape == (batch, 100) and scores.dtype == np.float32


@pytest.mark.parametrize("backend", ["onnx", "eager"])
def test_runners_select_only_the_k_asked_for_and_the_same_items(tiny_run, tmp_path, backend):
    manifest = exporter.export_run(tiny_run, backend, "fp32", tmp_path / "out")
    runner = load_runner(tmp_path / "out", manifest)
    spec = load_spec(tiny_run, graph_searches=backend != "onnx")
    inputs = [t.numpy() for t in example_inputs(spec, 6, 9, seed=7)]
    all_ids, all_scores = runner(*inputs)
    for k in (1, 10, 37):
        ids, scores = runner(*inputs, k=k)
        assert ids.shape == (6, k)
        np.testing.assert_array_equal(ids, all_ids[:, :k])
        np.testing.assert_allclose(scores, all_scores[:, :k], atol=1e-6)
    if backend == "onnx":  # the selection size is an input of the graph, not a constant
        import onnx

        graph = onnx.load(str(tmp_path / "out" / "model.onnx")).graph
        assert "k" in [i.name for i in graph.input]
        assert [n for n in graph.node if n.op_type == "TopK"][0].input[1] == "k"


def test_inference_graph_returns_the_models_top_ids_and_scores_not_a_loss(tiny_run):
    """The graph's answer is the encoder's own top 10 at the mask position, seen items excluded, as IDs."""
    from recserve.models.run_loader import load_run

    spec = load_spec(tiny_run)
    ids, lengths, exclude = example_inputs(spec, 2, 5)[:3]
    exclude[:] = True
    every_item = [torch.as_tensor(a) for a in rule_inputs(len(spec.vocab_ids), 2)]  # no rule: the model's own top
    top_ids, scores = build_graph(tiny_run, spec, 10)(ids, lengths, exclude, *every_item)
    assert top_ids.shape == scores.shape == (2, 10) and top_ids.dtype == torch.int64 and scores.dtype == torch.float32
    model, table = load_run(tiny_run).eval(), spec.vocab_ids
    for row in range(2):
        history = ids[row, 5 - int(lengths[row]) :].numpy()
        known = np.searchsorted(table, history[np.isin(history, table)]) + 1  # their indices, in order
        tokens = torch.as_tensor(np.r_[np.zeros(19 - len(known), int), known, model.cfg.mask_index])[None]
        with torch.no_grad():
            own = model(tokens)[0].float()
        own[[0, model.cfg.mask_index, *known]] = -torch.inf
        best = own.topk(10)
        assert top_ids[row].tolist() == table[best.indices.numpy() - 1].tolist()
        torch.testing.assert_close(scores[row], best.values, atol=1e-4, rtol=0)  # the one-query fast path


def test_export_report_times_every_variant_and_plots(tiny_run, ml100k_dir, tmp_path, monkeypatch):
    from recserve.export import parity_report

    monkeypatch.setattr(
        parity_report, "variants", lambda device: [("eager", "fp32"), ("onnx", "fp32"), ("onnx", "int8")]
    )
    result = parity_report.build_report(tiny_run, tmp_path, data_dir=ml100k_dir, seconds=0.05)
    rows = result["results"]
    assert len(rows) == 3 * len(parity_report.BATCH_SIZES)
    assert all(r["p50_ms"] > 0 and r["throughput"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in rows)
    assert {
        "backend",
        "precision",
        "batch_size",
        "p50_ms",
        "p99_ms",
        "throughput",
        "top10_overlap",
        "ndcg10_delta",
    } <= set(rows[0])
    assert (tmp_path / "report.png").stat().st_size > 10_000 and "| onnx | int8 |" in (
        tmp_path / "report.md"
    ).read_text()


@pytest.mark.parametrize("backend", ["torchscript", "onnx"])
def test_multvae_exports_match_eager_and_exclude_the_input_items(vae_run, tmp_path, backend):
    from recserve.serving.predictor import Predictor

    manifest = exporter.export_run(vae_run, backend, "fp32", tmp_path / "out")
    assert manifest.model == "multvae"
    assert manifest.validation["max_score_diff"] <= FP32_SCORE_TOL
    assert manifest.validation["top10_overlap"] == 1.0
    predictor = Predictor.load(tmp_path / "out")
    history = predictor.vocab_ids[[0, 5, 9, 40]]
    [answer] = predictor.predict([history], k=20)
    assert len(answer.item_ids) == 20 and not set(history.tolist()) & set(answer.item_ids.tolist())
    [reordered] = predictor.predict([history[::-1]], k=20)  # a bag of items: order does not matter
    np.testing.assert_array_equal(reordered.item_ids, answer.item_ids)


def test_sasrec_aot_inductor_package_passes_the_parity_check(sasrec_run, tmp_path):
    manifest = exporter.export_run(sasrec_run, "aoti", "fp32", tmp_path / "out")
    assert manifest.model == "sasrec" and manifest.fixed_length == 19
    assert_matches_eager(sasrec_run, tmp_path / "out", length=19)  # not the manifest's word for it


def test_the_manifest_reads_back_what_was_written_and_refuses_other_files(tiny_export, tmp_path):
    import dataclasses
    import shutil

    from recserve.artifacts.export_manifest import ExportManifest

    manifest = ExportManifest.read(tiny_export)
    assert manifest.backend == "eager" and manifest.window == 20 and manifest.validation["top10_overlap"] == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.backend = "onnx"  # type: ignore[misc]
    folder = tmp_path / "export"
    shutil.copytree(tiny_export, folder)
    written = json.loads((folder / "export.json").read_text())
    for change, message in [
        ({"format_version": 99}, "format version 99, this recserve reads 1"),
        ({"window": None}, "missing window"),
    ]:
        data = {k: v for k, v in (written | change).items() if v is not None}
        (folder / "export.json").write_text(json.dumps(data))
        with pytest.raises(ExportError, match=message):
            ExportManifest.read(folder)
    (folder / "export.json").write_text("{not json")
    with pytest.raises(ExportError, match="unreadable"):
        ExportManifest.read(folder)


@pytest.mark.parametrize("run", ["tiny_run", "sasrec_run", "vae_run"])
def test_torchscript_graphs_name_no_device_so_one_file_serves_every_gpu(run, request, tmp_path):
    """Triton's PyTorch backend loads one traced file onto each GPU of an instance group: a tensor made with
    a named device inside the graph would stay on the tracing device (cuda:0) and fail on cuda:1."""
    manifest = exporter.export_run(request.getfixturevalue(run), "torchscript", "fp32", tmp_path / "ts")
    assert manifest.validation["native"]["top10_overlap"] == 1.0  # the native graph checked like the fused one
    for name in ("model.pt", "native.pt", "seed.pt"):
        graph = str(torch.jit.load(tmp_path / "ts" / name).inlined_graph)
        assert "Device = prim::Constant" not in graph, name


def test_max_k_is_bounded_by_the_catalogue_with_an_error_naming_it(tiny_run, tmp_path):
    items = len(load_spec(tiny_run).vocab_ids)
    with pytest.raises(ExportError, match="at least 1"):
        exporter.export_run(tiny_run, "eager", "fp32", tmp_path / "a", max_k=-3)
    with pytest.raises(ExportError, match=f"holds {items:,} items, so k can be at most {items:,}"):
        exporter.export_run(tiny_run, "eager", "fp32", tmp_path / "b", max_k=items + 1)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert exporter.export_run(tiny_run, "eager", "fp32", tmp_path / "c", max_k=items).max_k == items
