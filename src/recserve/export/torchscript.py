"""``torchscript``: traced TorchScript, what Triton's ``pytorch_libtorch`` backend loads.

Three files from one graph: ``model.pt`` (the fused graph, for the predictor), ``native.pt`` (the native
layout's model, where the catalogue allows one: ``recserve.export.native_export``) and ``seed.pt`` (the seed
layout's model step, the PoC's TorchScript ``bert4rec``).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import NATIVE_TORCHSCRIPT_FILE, SEED_K, SEED_TORCHSCRIPT_FILE
from recserve.export import native_export
from recserve.export.backend_protocol import Runner
from recserve.export.graph import GraphSpec, build_graph, example_inputs
from recserve.export.runner import torch_runner
from recserve.models.output_table import FP8
from recserve.models.serving_graph import TOP_K_CHUNK, NativeGraph, SeedStep

log = logging.getLogger(__name__)

FILE = "model.pt"


PORTABLE = True  # a traced graph: torch.jit.load maps it to the serving device


def save(run_dir: Path, spec: GraphSpec, out: Path, manifest: ExportManifest) -> dict:
    device = manifest.device
    graph = build_graph(run_dir, spec, manifest.max_k, manifest.precision, manifest.explore_new).to(device)
    example = example_inputs(spec, batch=4, length=spec.window - 1, device=device)
    added: dict = {"seed_model": SEED_TORCHSCRIPT_FILE}
    with torch.inference_mode(), warnings.catch_warnings():
        # the graph's one shape test (the window) is meant to be fixed by the trace: the tracer's warning of
        # it says nothing a user can act on
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.jit.save(torch.jit.trace(graph, example, check_trace=False), out / FILE)
        tokens = torch.nn.functional.pad(example[0] % (len(spec.vocab_ids) + 1), (0, 1), value=graph.mask_index)
        seed = SeedStep(graph.head, SEED_K)
        torch.jit.save(trace_frozen(seed, (tokens,)), out / SEED_TORCHSCRIPT_FILE)
        reason = native_export.unsupported(spec)
        if reason is None:
            inputs = tuple(t.to(device) for t in native_export.example(4, spec.window - 1, spec))
            # on a GPU the answer is max_k wide (choosing the batch's k would wait for the GPU mid-graph), taken
            # through chunks of the catalogue
            on_cpu = device == "cpu"
            model = NativeGraph(graph, dynamic_k=on_cpu, chunk=0 if on_cpu else TOP_K_CHUNK)
            rules = tuple(t.to(device) for t in example_inputs(spec, batch=4, length=1)[3:])
            methods = {"forward": inputs, "ruled": inputs + rules}  # ruled: recserve's backend, under rules
            torch.jit.save(trace_frozen(model, methods), out / NATIVE_TORCHSCRIPT_FILE)
            added |= {"native_model": NATIVE_TORCHSCRIPT_FILE, "native_rules": True}
        else:
            log.info("no native model: %s", reason)
            added["native_absent"] = reason
    return added


def trace_frozen(module: torch.nn.Module, example: tuple | dict[str, tuple]) -> torch.jit.ScriptModule:
    """Traced and frozen: weights become constants of the graph, so Triton's PyTorch backend runs no attribute
    lookups (a third of the unfrozen graph's nodes) on each call. ``example``: forward's inputs, or each
    method's by name (every one kept). Float8 buffers (an 8-bit output layer) stay attributes: PyTorch cannot
    save them as constants."""
    methods = example if isinstance(example, dict) else {"forward": example}
    traced = torch.jit.trace_module(module.eval(), methods, check_trace=False)
    float8 = [name for name, buffer in module.named_buffers() if buffer.dtype == FP8]
    return torch.jit.freeze(traced, preserved_attrs=[name for name in methods if name != "forward"] + float8)


def load(out: Path, spec: GraphSpec, manifest: ExportManifest, device: str) -> Runner:
    module = torch.jit.load(out / FILE, map_location=device).eval()
    return torch_runner(module, device, len(spec.vocab_ids), optimized=manifest.precision != "fp8")
