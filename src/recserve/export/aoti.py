"""``aoti``: ``torch.export`` with dynamic batch and length, then AOTInductor into a ``.pt2`` package."""

from __future__ import annotations

from pathlib import Path

import torch

from recserve.export.graph import GraphSpec, build_graph, example_inputs
from recserve.export.runner import torch_runner

FILE = "model.pt2"


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: dict) -> None:
    device = manifest["device"]
    graph = build_graph(run_dir, spec, manifest["max_k"], manifest["precision"]).to(device)
    example = example_inputs(spec, batch=4, length=min(spec.window - 1, 9), device=device)
    batch, length = torch.export.Dim("batch", min=1, max=65536), torch.export.Dim("length", min=1, max=spec.window - 1)
    with torch.inference_mode():
        program = torch.export.export(
            graph, example,
            dynamic_shapes={"item_ids": {0: batch, 1: length}, "lengths": {0: batch}, "exclude_seen": {0: batch}},
        )
        torch._inductor.aoti_compile_and_package(program, package_path=str(out / FILE))


def load(out: Path, spec: GraphSpec, manifest: dict, device: str):
    return torch_runner(torch._inductor.aoti_load_package(str(out / FILE)), device)
