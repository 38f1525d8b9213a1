"""Where the native graph's GPU time goes at a catalogue size: the export's native TorchScript graph (as
`recserve export --device cuda` freezes it) replayed as a CUDA graph at several batch sizes, its kernels by
GPU time at one batch size, and the top-k step alone (torch.topk over the whole row against a two-stage
top-k over chunks of the row) on the same scores. Figures printed and written to --out as JSON.

    python benchmarks/native_graph_profile.py --items 1000000 --out runs/native-profile.json
    python benchmarks/native_graph_profile.py --items 100000 --attributes --explore-new 0.1 --out explore.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from recserve.bench.replay import replay_ms
from recserve.bench.synthetic import make_random_run
from recserve.export import native_export
from recserve.export.graph import build_graph, load_spec
from recserve.export.torchscript import trace_frozen
from recserve.models.serving_graph import NativeGraph


def chunked_topk(scores: torch.Tensor, k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact top k of each row: the top k of each chunk of the row, then the top k of those."""
    rows, width = scores.shape
    pad = (-width) % chunk
    padded = torch.nn.functional.pad(scores, (0, pad), value=float("-inf")) if pad else scores
    local_scores, local_idx = padded.view(rows, -1, chunk).topk(min(k, chunk), dim=2)
    offsets = torch.arange(0, width + pad, chunk, device=scores.device)[None, :, None]
    top_scores, pos = local_scores.reshape(rows, -1).topk(k, dim=1)
    return top_scores, (local_idx + offsets).reshape(rows, -1).gather(1, pos)


def with_attributes(run: Path, out: Path, rows: int = 17, new_share: float = 0.1) -> Path:
    """A copy of the random ``run`` whose model learns its items as IDs plus two attributes of random values, a
    ``new_share`` of the items held by no training event (what exploration serves)."""
    import dataclasses
    import shutil

    from recserve.constants import MODEL_CONFIG_FILE, WEIGHTS_FILE
    from recserve.models.run_loader import load_config

    shutil.copytree(run, out, dirs_exist_ok=True)
    cfg = dataclasses.replace(load_config(run), attribute_columns=2, attribute_rows=rows)
    cfg.save(out / MODEL_CONFIG_FILE)
    weights = torch.load(run / WEIGHTS_FILE, weights_only=True)
    generator = torch.Generator().manual_seed(0)
    vocab = cfg.num_items + 2
    weights["attributes.table.weight"] = 0.02 * torch.randn(rows, cfg.hidden, generator=generator)
    weights["attributes.codes"] = torch.randint(1, rows, (vocab, 2), generator=generator)
    trained = torch.rand(vocab, generator=generator) >= new_share
    trained[[0, -1]] = True
    weights["attributes.trained"] = trained
    torch.save(weights, out / WEIGHTS_FILE)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--model", default="bert4rec", choices=["bert4rec", "sasrec"])
    parser.add_argument(
        "--no-relative-positions", action="store_true", help="SASRec without its learned attention bias per distance"
    )
    parser.add_argument("--ligr", action="store_true", help="SASRec with LiGR blocks (gated residuals, SwiGLU)")
    parser.add_argument("--lru", action="store_true", help="SASRec with a linear recurrent unit beside attention")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--window", type=int, default=40)
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--profile-batch", type=int, default=64)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--max-k", type=int, default=100)
    parser.add_argument("--chunks", default="1024,4096,16384")
    parser.add_argument("--work", type=Path, default=Path("/tmp/native-profile"))
    parser.add_argument(
        "--attributes", action="store_true", help="items learned as their IDs plus two attributes (folded at export)"
    )
    parser.add_argument(
        "--explore-new", type=float, default=0.0, help="with --attributes: the answer's share for new items"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    options = (
        ({"relative_positions": False} if args.no_relative_positions else {})
        | ({"ligr": True} if args.ligr else {})
        | ({"lru": True} if args.lru else {})
    )
    name = f"run-{args.model}-{args.items}-{args.hidden}-{args.window}" + "".join(f"-{k}" for k in sorted(options))
    run = make_random_run(
        args.work / name, num_items=args.items, model=args.model, hidden=args.hidden, window=args.window, **options
    )
    if args.attributes:
        run = with_attributes(run, args.work / f"{name}-attributes")
    spec = load_spec(run)
    graph = build_graph(run, spec, args.max_k, args.precision, args.explore_new).cuda()
    length = spec.window - 1
    result: dict = {
        "items": args.items,
        "model": args.model,
        "relative_positions": args.model == "sasrec" and not args.no_relative_positions,
        "ligr": args.ligr,
        "lru": args.lru,
        "hidden": args.hidden,
        "window": args.window,
        "precision": args.precision,
        "max_k": args.max_k,
        "attributes": args.attributes,
        "explore_new": args.explore_new,
        "gpu": torch.cuda.get_device_name(),
    }
    with torch.inference_mode():
        example = tuple(t.cuda() for t in native_export.example(4, length, spec))
        model = trace_frozen(NativeGraph(graph, dynamic_k=False), example)
        rows = []
        for batch in map(int, args.batches.split(",")):
            inputs = tuple(t.cuda() for t in native_export.example(batch, length, spec, seed=batch))
            graph_ms = replay_ms(lambda inputs=inputs: model(*inputs))
            scores = graph.head.scores(
                torch.nn.functional.pad(
                    torch.randint(1, args.items, (batch, length), device="cuda"), (0, 1), value=graph.mask_index
                ),
                torch.ones(batch, dtype=torch.bool, device="cuda"),
            )
            row = {"batch": batch, "graph_ms": graph_ms, "topk_ms": replay_ms(lambda s=scores: s.topk(args.max_k, 1))}
            for chunk in map(int, args.chunks.split(",")):
                expected = scores.topk(args.max_k, 1)
                got = chunked_topk(scores, args.max_k, chunk)
                assert torch.equal(got[0], expected[0]), "chunked top-k scores differ from torch.topk's"
                row[f"chunked{chunk}_ms"] = replay_ms(lambda s=scores, c=chunk: chunked_topk(s, args.max_k, c))
            rows.append(row)
            print(
                f"batch {batch:4d}: graph {graph_ms:7.3f} ms ({1000 * graph_ms / batch:7.1f} us a row), topk "
                + ", ".join(
                    f"{k.removesuffix('_ms')} {v:.3f}" for k, v in row.items() if k.endswith("_ms") and k != "graph_ms"
                ),
                flush=True,
            )
        result["batches"] = rows
        inputs = tuple(t.cuda() for t in native_export.example(args.profile_batch, length, spec, seed=1))
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                model(*inputs)
            torch.cuda.synchronize()
    kernels = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:15]
    result["profile"] = {
        "batch": args.profile_batch,
        "kernels": [
            {"name": e.key[:120], "ms_per_call": e.device_time_total / 5 / 1000, "count": e.count // 5} for e in kernels
        ],
    }
    print(f"kernels at batch {args.profile_batch} (ms a call):")
    for k in result["profile"]["kernels"]:
        print(f"  {k['ms_per_call']:7.3f}  x{k['count']:<3d} {k['name']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
