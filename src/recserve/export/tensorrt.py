"""``torch_tensorrt``: Torch-TensorRT (``ir="dynamo"``) with min/opt/max batch shapes, saved as TorchScript.

Used where Torch-TensorRT is installed (NVIDIA's PyTorch and Triton containers).
"""

from __future__ import annotations

from pathlib import Path

import torch

from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import MAX_RULE_ITEMS, MAX_RULE_MASKS
from recserve.errors import ExportError
from recserve.export.backend_protocol import Runner
from recserve.export.graph import GraphSpec, build_graph, example_inputs
from recserve.export.runner import torch_runner

FILE = "model.ts"
OPT_BATCH, MAX_BATCH = 64, 1024


def _torch_tensorrt():
    try:
        import torch_tensorrt
    except ImportError as err:
        raise ExportError(
            "backend torch_tensorrt needs Torch-TensorRT and TensorRT with a CUDA GPU: `pip install torch-tensorrt` "
            "matching your torch, or use NVIDIA's PyTorch container; onnx, torchscript, aoti and compile work without"
        ) from err
    return torch_tensorrt


PORTABLE = False  # TensorRT engines are built for the export's GPU


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    trt = _torch_tensorrt()
    if not manifest.device.startswith("cuda"):
        raise ExportError("backend torch_tensorrt needs --device cuda")
    graph = build_graph(run_dir, spec, manifest.max_k, manifest.precision, manifest.explore_new).cuda()
    length, width = spec.window - 1, len(spec.vocab_ids) + 2
    inputs = [
        trt.Input(min_shape=(1, 1), opt_shape=(OPT_BATCH, length), max_shape=(MAX_BATCH, length), dtype=torch.int64),
        trt.Input(min_shape=(1,), opt_shape=(OPT_BATCH,), max_shape=(MAX_BATCH,), dtype=torch.int64),
        trt.Input(min_shape=(1,), opt_shape=(OPT_BATCH,), max_shape=(MAX_BATCH,), dtype=torch.bool),
        # the business rules (serving_graph.allowed_items): masks, each row's mask, its excluded and included items
        trt.Input(min_shape=(1, width), opt_shape=(3, width), max_shape=(MAX_RULE_MASKS + 1, width), dtype=torch.bool),
        trt.Input(min_shape=(1,), opt_shape=(OPT_BATCH,), max_shape=(MAX_BATCH,), dtype=torch.int64),
        trt.Input(min_shape=(1, 1), opt_shape=(OPT_BATCH, 2), max_shape=(MAX_BATCH, MAX_RULE_ITEMS), dtype=torch.int64),
        trt.Input(min_shape=(1, 1), opt_shape=(OPT_BATCH, 1), max_shape=(MAX_BATCH, MAX_RULE_ITEMS), dtype=torch.int64),
    ]
    precisions = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    compiled = trt.compile(graph, ir="dynamo", inputs=inputs, enabled_precisions={precisions[manifest.precision]})
    trt.save(
        compiled,
        str(out / FILE),
        output_format="torchscript",
        inputs=list(example_inputs(spec, OPT_BATCH, length, device="cuda")),
    )
    return {}


def load(out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner:
    _torch_tensorrt()
    return torch_runner(torch.jit.load(out / FILE, map_location=device).eval(), device, len(spec.vocab_ids))
