"""``recserve export``: builds one backend's export, validates it, and only then writes it."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path

from recserve.artifacts.catalogue import copy_catalogue, id_type_of
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.item_table import read_attributes, write_attributes
from recserve.artifacts.run_record import data_folder_of
from recserve.constants import (
    DEFAULT_MAX_K,
    ITEMS_FILE,
    MODEL_CONFIG_FILE,
    NATIVE_TORCHSCRIPT_FILE,
    POPULARITY_FILE,
)
from recserve.errors import ExportError
from recserve.export import native_export
from recserve.export.backends import backend_module
from recserve.export.graph import PRECISIONS, build_graph, load_spec
from recserve.export.runner import torch_runner
from recserve.export.validate import check_parity, served_ndcg10
from recserve.files import replaced_on_success

log = logging.getLogger(__name__)

CATALOGUE_FILES = (POPULARITY_FILE, MODEL_CONFIG_FILE, ITEMS_FILE)  # copied into every export, beside the catalogue


def _check_request(backend: str, precision: str, device: str) -> None:
    import torch

    backend_module(backend)
    if precision not in PRECISIONS:
        raise ExportError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if device not in ("cpu", "cuda"):
        raise ExportError(f"device {device!r}: expected cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ExportError("device cuda: no CUDA device is available here; use --device cpu")
    if precision == "int8" and device != "cpu":
        raise ExportError("precision int8 runs on the CPU only (dynamic quantization); use fp16 or bf16 on a GPU")
    if precision == "fp16" and device == "cpu":
        raise ExportError("precision fp16 needs a GPU (--device cuda); on the CPU use fp32, bf16 or int8")
    if precision == "fp8":
        _check_fp8(backend, device)


FP8_BACKENDS = ("torchscript", "eager", "cudagraph")  # those that run torch._scaled_mm as it is


def _check_fp8(backend: str, device: str) -> None:
    """fp8 (``build_graph``) on a backend that runs it, on a GPU with float8 products or the CPU (for checks).

    Raises:
        ExportError: another backend, or a GPU before compute capability 8.9.
    """
    import torch

    if backend not in FP8_BACKENDS:
        raise ExportError(f"precision fp8 exports on {', '.join(FP8_BACKENDS)}, not {backend}; use bf16 on {backend}")
    capability = torch.cuda.get_device_capability() if device == "cuda" else None
    if capability is not None and capability < (8, 9):
        name, (major, minor) = torch.cuda.get_device_name(), capability
        raise ExportError(
            f"precision fp8 needs a GPU of compute capability 8.9 or later (L4, L40S, H100, H200); {name} is "
            f"{major}.{minor}: use bf16"
        )


def export_run(
    run_dir: Path,
    backend: str,
    precision: str,
    out: Path,
    device: str = "cpu",
    max_k: int = DEFAULT_MAX_K,
    data_dir: Path | None = None,
    explore_new: float = 0.0,
) -> ExportManifest:
    """Exports a training run; returns the manifest written to ``out/export.json``.

    Raises:
        ExportError: the backend is not available, or the export failed its parity check (nothing is written).
    """
    _check_request(backend, precision, device)
    run_dir, out = Path(run_dir), Path(out)
    spec = load_spec(run_dir, graph_searches=backend != "onnx")
    max_k = _bounded_max_k(max_k, len(spec.vocab_ids))
    module = backend_module(backend)
    manifest = ExportManifest(
        model=spec.model,
        backend=backend,
        precision=precision,
        device=device,
        max_k=max_k,
        window=spec.window,
        num_items=len(spec.vocab_ids),
        item_id_type=id_type_of(spec.vocab_ids),
        id_mapping=spec.id_mapping,
        run=str(run_dir),
        portable=module.PORTABLE,
        explore_new=_bounded_share(explore_new),
    )
    with replaced_on_success(out) as tmp:
        copy_catalogue(run_dir, tmp)
        for name in CATALOGUE_FILES:
            if (run_dir / name).exists():
                shutil.copyfile(run_dir / name, tmp / name)
        write_attributes(tmp, read_attributes(run_dir, len(spec.vocab_ids)))  # what rules filter on
        started = time.perf_counter()
        manifest = manifest.with_backend_fields(module.save(run_dir, spec, tmp, manifest))
        manifest = dataclasses.replace(manifest, build_s=round(time.perf_counter() - started, 2))
        runner = module.load(tmp, spec, manifest, device)
        reference_graph = build_graph(run_dir, spec, max_k, "fp32", manifest.explore_new).to(device)
        reference = torch_runner(reference_graph, device, len(spec.vocab_ids))
        validation = check_parity(reference, runner, spec, precision, manifest.fixed_length)
        if manifest.native_model:
            served = native_export.as_runner(
                native_export.load(tmp, manifest.native_model, device), spec.window - 1, max_k
            )
            validation["native"] = check_parity(reference, served, spec, precision, spec.window - 1, rules=False)
            if manifest.native_rules:  # its ruled method, under business rules (recserve's backend)
                validation["native_ruled"] = check_parity(reference, served, spec, precision, spec.window - 1)
            if device.startswith("cuda") and manifest.native_model == NATIVE_TORCHSCRIPT_FILE:  # as served on GPUs
                validation["native_captured"] = native_export.check_capture(
                    tmp, manifest.native_model, spec, device, bool(manifest.native_rules)
                )
        if precision != "fp32":
            validation |= _quality_change(reference, runner, spec, run_dir, data_dir)
        manifest = dataclasses.replace(manifest, validation=validation)
        manifest.write(tmp)
    return manifest


def _bounded_share(explore_new: float) -> float:
    """``explore_new`` if it lies in [0, 1).

    Raises:
        ExportError: a share outside it.
    """
    if not 0 <= explore_new < 1:
        raise ExportError(f"--explore-new {explore_new}: the share of the answer for new items lies in [0, 1)")
    return float(explore_new)


def _bounded_max_k(max_k: int, items: int) -> int:
    """The largest k an export answers: 1 to the catalogue's size (the default, 100, lowered to a smaller
    catalogue's size; any other value past it refused).

    Raises:
        ExportError: ``max_k`` below 1, or above the catalogue's size when asked for.
    """
    if max_k < 1:
        raise ExportError(f"--max-k {max_k}: the largest k a request may ask for is at least 1")
    if max_k > items:
        if max_k == DEFAULT_MAX_K:
            return items
        raise ExportError(f"--max-k {max_k}: the catalogue holds {items:,} items, so k can be at most {items:,}")
    return max_k


def _quality_change(reference, runner, spec, run_dir: Path, data_dir: Path | None) -> dict:
    """Validation NDCG@10 (served answers, seen excluded) of the export against eager fp32."""
    data_dir = data_dir or _data_dir_of(run_dir)
    if data_dir is None:
        return {"ndcg10_delta": None, "ndcg10_note": "no data folder known; pass --data"}
    ref, got = served_ndcg10((reference, runner), spec, data_dir)
    return {"ndcg10_reference": ref, "ndcg10": got, "ndcg10_delta": got - ref}


def _data_dir_of(run_dir: Path) -> Path | None:
    return data_folder_of(run_dir)
