"""Builds the inference graph of a training run at a given precision."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import torch

from recserve.artifacts.catalogue import has_catalogue, read_catalogue
from recserve.artifacts.popularity import has_popularity, read_popularity
from recserve.constants import MAX_RULE_ITEMS, MAX_RULE_MASKS
from recserve.data.vocab import use_lookup_table
from recserve.errors import ConfigError, ExportError
from recserve.export.spec import GraphSpec
from recserve.models.run_loader import load_config, load_run, model_name
from recserve.models.serving_graph import InferenceGraph
from recserve.models.transformer import ItemTransformer

PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def load_spec(run_dir: Path, graph_searches: bool = True) -> GraphSpec:
    """Reads a run's catalogue and decides where IDs get mapped.

    Args:
        graph_searches: whether the target backend has a search operator (ONNX has none); without it,
            only dense integer IDs are mapped inside the graph.
    """
    run_dir = Path(run_dir)
    model = model_name(run_dir)  # a folder that is no run at all says so first
    if not has_catalogue(run_dir) or not has_popularity(run_dir):
        raise ExportError(f"{run_dir}: missing its catalogue or popularity; this run predates them, train it again")
    ids = read_catalogue(run_dir)
    window = load_config(run_dir).window
    in_graph = ids.dtype.kind in "iu" and (graph_searches or use_lookup_table(ids))
    mapping = "graph" if in_graph else "predictor"
    return GraphSpec(ids, read_popularity(run_dir), window, model, mapping)


def build_graph(
    run_dir: Path, spec: GraphSpec, max_k: int, precision: str = "fp32", explore_new: float = 0.0
) -> InferenceGraph:
    """The run's model inside the fused graph, in eval mode, on the CPU, at ``precision``, with ``explore_new``
    of the answer's columns for new items (``serving_graph.explored_top``).

    int8 applies PyTorch's dynamic quantization to the linear layers (CPU only); fp8 is bf16 with the output
    layer's item table in float8 e4m3 (``ItemTransformer.quantize_output``; SASRec and BERT4Rec).
    """
    if precision not in PRECISIONS:
        raise ExportError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    encoder = load_run(run_dir)
    if precision == "fp8" and not isinstance(encoder, ItemTransformer):
        raise ExportError("precision fp8 quantizes a transformer's output layer; for Mult-VAE use bf16 or fp16")
    table = spec.vocab_ids if spec.id_mapping == "graph" else np.arange(1, len(spec.vocab_ids) + 1)
    try:
        graph = InferenceGraph(encoder, table, spec.popularity, max_k, explore_new).eval()
    except ConfigError as err:
        raise ExportError(str(err)) from None
    if precision == "int8":
        graph.head.encoder = torch.ao.quantization.quantize_dynamic(encoder, {torch.nn.Linear}, dtype=torch.qint8)
    elif precision != "fp32":
        encoder.to(DTYPES[precision])
    if precision == "fp8":
        try:
            cast(ItemTransformer, encoder).quantize_output()  # a transformer: refused above otherwise
        except ConfigError as err:
            raise ExportError(str(err)) from None
    return graph


def example_inputs(spec: GraphSpec, batch: int, length: int, seed: int = 0, device: str = "cpu"):
    """Graph inputs from random catalogue IDs, with a few unknown IDs and varied history lengths."""
    rng = np.random.default_rng(seed)
    n = len(spec.vocab_ids)
    if spec.id_mapping == "graph":
        ids = spec.vocab_ids[rng.integers(0, n, (batch, length))]
        ids = np.where(rng.random((batch, length)) < 0.05, ids.max() + 7, ids)  # unknown IDs
    else:
        ids = rng.integers(0, n + 1, (batch, length))  # indices; 0 stands for unknown
    lengths = rng.integers(0, length + 1, batch)
    lengths[0] = length
    ids = np.where(np.arange(length)[None, :] >= (length - lengths)[:, None], ids, 0)
    exclude = rng.random(batch) < 0.7
    rules = example_rules(n, batch, rng)
    as_t = lambda a: torch.as_tensor(a).to(device)  # noqa: E731
    return tuple(as_t(a) for a in (ids.astype(np.int64), lengths.astype(np.int64), exclude, *rules))


def rule_shapes(batch) -> dict:
    """torch.export's dynamic dimensions of the rule inputs (``serving_graph.allowed_items``), beside the
    batch's: up to ``MAX_RULE_MASKS`` masks (and the row of every item), lists of up to ``MAX_RULE_ITEMS``."""
    masks = torch.export.Dim("masks", min=1, max=MAX_RULE_MASKS + 1)
    excluded = torch.export.Dim("excluded", min=1, max=MAX_RULE_ITEMS)
    included = torch.export.Dim("included", min=1, max=MAX_RULE_ITEMS)
    return {
        "masks": {0: masks},
        "mask_of_row": {0: batch},
        "excluded": {0: batch, 1: excluded},
        "included": {0: batch, 1: included},
    }


def example_rules(
    num_items: int, batch: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Business rules as the graph takes them (``allowed_items``): three masks, the first letting every item
    through and the others a random nine tenths; each row one of them, two excluded items (or padding), and
    every third row a list of twenty items to keep to."""
    masks = np.ones((3, num_items + 2), dtype=bool)
    masks[1:] = rng.random((2, num_items + 2)) < 0.9
    masks[:, [0, num_items + 1]] = False  # padding and the mask token are never recommended
    mask_of_row = rng.integers(0, 3, batch).astype(np.int64)
    excluded = rng.integers(0, num_items + 1, (batch, 2)).astype(np.int64)  # 0: padding, excludes nothing more
    included = rng.integers(1, num_items + 1, (batch, 20)).astype(np.int64)
    included[np.arange(batch) % 3 != 2] = 0  # rows without a list
    return masks, mask_of_row, excluded, included
