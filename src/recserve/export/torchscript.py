"""``torchscript``: a traced ``model.pt``, what Triton's ``pytorch_libtorch`` backend loads."""

from __future__ import annotations

from pathlib import Path

import torch

from recserve.export.graph import GraphSpec, build_graph, example_inputs
from recserve.export.manifest import ExportManifest
from recserve.export.protocol import Runner
from recserve.export.runner import torch_runner

FILE = "model.pt"


PORTABLE = True  # a traced graph: torch.jit.load maps it to the serving device


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    device = manifest.device
    graph = build_graph(run_dir, spec, manifest.max_k, manifest.precision).to(device)
    example = example_inputs(spec, batch=4, length=spec.window - 1, device=device)
    with torch.inference_mode():
        traced = torch.jit.trace(graph, example, check_trace=False)
    torch.jit.save(traced, out / FILE)
    return {}


def load(out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner:
    return torch_runner(torch.jit.load(out / FILE, map_location=device).eval(), device)
