"""``eager`` and ``compile``: the run's weights and config, rebuilt at load (compile: torch.compile then)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import MODEL_CONFIG_FILE, WEIGHTS_FILE
from recserve.export.backend_protocol import Runner
from recserve.export.graph import GraphSpec, build_graph
from recserve.export.runner import torch_runner

FILES = (WEIGHTS_FILE, MODEL_CONFIG_FILE)


PORTABLE = True  # rebuilt from the weights wherever it is loaded


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    for name in FILES:
        shutil.copyfile(Path(run_dir) / name, out / name)
    return {}


def load(out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner:
    graph = build_graph(out, spec, manifest.max_k, manifest.precision, manifest.explore_new).to(device)
    if manifest.backend != "compile":
        return torch_runner(graph, device, len(spec.vocab_ids))
    # CUDA graphs (mode reduce-overhead) only pay off on a GPU; dynamic shapes avoid a recompile per batch
    mode = "reduce-overhead" if str(device).startswith("cuda") else None
    return torch_runner(torch.compile(graph, dynamic=True, mode=mode), device, len(spec.vocab_ids))
