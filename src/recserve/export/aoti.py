"""``aoti``: ``torch.export`` with a dynamic batch, then AOTInductor into a ``.pt2`` package.

Histories are padded to the full window (``fixed_length`` in the manifest): one static length lets
Inductor plan every kernel once, and the predictor pads accordingly.
"""

from __future__ import annotations

from pathlib import Path

import torch

from recserve.artifacts.export_manifest import ExportManifest
from recserve.export.backend_protocol import Runner
from recserve.export.graph import GraphSpec, build_graph, example_inputs, rule_shapes
from recserve.export.runner import torch_runner

FILE = "model.pt2"


PORTABLE = False  # compiled for the export's device


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    device = manifest.device
    graph = build_graph(run_dir, spec, manifest.max_k, manifest.precision, manifest.explore_new).to(device)
    example = example_inputs(spec, batch=4, length=spec.window - 1, device=device)
    batch = torch.export.Dim("batch", min=1, max=65536)
    shapes = {"item_ids": {0: batch}, "lengths": {0: batch}, "exclude_seen": {0: batch}} | rule_shapes(batch)
    with torch.inference_mode():
        program = torch.export.export(graph, example, dynamic_shapes=shapes)
        torch._inductor.aoti_compile_and_package(program, package_path=str(out / FILE))
    return {"fixed_length": spec.window - 1}


def load(out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner:
    return torch_runner(torch._inductor.aoti_load_package(str(out / FILE)), device, len(spec.vocab_ids))
