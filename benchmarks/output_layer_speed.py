"""Where the served graph's time goes at a million items, and what its output layer and top-k could cost instead.

Each form is captured as a CUDA graph and replayed (as recserve's backend replays its steps), at each batch:

- `graph`: the export's native graph (`recserve export --backend torchscript --precision P --device cuda`, P
  bf16 and fp8), its `ruled` method as the backend calls it (every row on the rule bank's first row, nothing
  excluded or listed) and its plain `forward` (`graph P plain`: a batch without rules), with its kernels by GPU
  time at each batch;
- products (the query against the item table, each row's bias row added): bf16 into the gathered bias rows
  (`addmm_`: rows of whole chunks; `addmm_ V`: the catalogue's own 1M + 2 columns; `addmm_ V in W`: those in
  rows of whole chunks, as the GPU's graph lays them), fp8 e4m3 with a scale a row
  (`recserve.models.output_table.scaled_product`, the export's fp8), int8 (`torch._int_mm`, the query padded to
  17 rows, its int32 scaled after), with the bytes a call reads over the time (GB/s);
- top-k forms over the bf16 scores: `torch.topk` over the whole row, and `chunks-N`: each row's chunks of N
  items' largest scores, the k chunks with the largest, the top k of their items
  (`recserve.models.serving_graph.chunked_top_k`; exact).

    python benchmarks/output_layer_speed.py --items 1000000 --out runs/output-layer-speed.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from recserve.bench.replay import replay_ms
from recserve.bench.synthetic import make_random_run
from recserve.host import cpu_model
from recserve.models.output_table import MULTIPLE, quantize_rows, scaled_product
from recserve.models.serving_graph import chunked_top_k


def _profile(call, calls: int = 20, count: int = 10) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:count]
    return [
        {"kernel": e.key[:110], "ms": e.self_device_time_total / 1e3 / calls, "count": e.count / calls} for e in events
    ]


def _try(name: str, call) -> float | None:
    try:
        return replay_ms(call)
    except Exception as error:  # a form that a GPU or a release does not support is reported, not fatal
        print(f"  {name}: {type(error).__name__}: {str(error)[:200]}", flush=True)
        return None


def graph_rows(items: int, hidden: int, batches: list[int], k: int, work: Path, precision: str) -> list[dict]:
    from recserve.artifacts.export_manifest import ExportManifest
    from recserve.bench.synthetic import native_histories
    from recserve.export.exporter import export_run

    run = work / f"run-{items}-{hidden}"
    if not run.exists():
        make_random_run(run, num_items=items, hidden=hidden)
    export = work / f"export-{items}-{hidden}-{precision}"
    if not export.exists():
        export_run(run, "torchscript", precision, export, device="cuda", max_k=k)
    module = torch.jit.load(str(export / "native.pt"), map_location="cuda").eval()
    length = ExportManifest.read(export).window - 1
    vocab = items + 2
    bank = torch.zeros((2, vocab), dtype=torch.bool, device="cuda")
    bank[:, 1:-1] = True
    rows = []
    for batch in batches:
        cuda = lambda a: torch.as_tensor(a).cuda()  # noqa: E731
        inputs = (cuda(native_histories(items, batch, length, seed=batch)), cuda(np.full((batch, 1), 10, np.int32)))
        inputs += (cuda(np.ones((batch, 1), bool)), bank, cuda(np.zeros(batch, np.int64)))
        none = cuda(np.zeros((batch, 128), np.int64))
        calls = {
            "ruled": lambda inputs=inputs, none=none: module.ruled(*inputs, none, none),
            "plain": lambda inputs=inputs: module(*inputs[:3]),
        }
        for method, call in calls.items():
            with torch.inference_mode(), torch.jit.optimized_execution(False):
                ms = replay_ms(call)
                kernels = _profile(call)
            form = f"graph {precision}" + (" plain" if method == "plain" else "")
            rows.append({"form": form, "batch": batch, "ms": ms, "kernels": kernels})
            print(f"{form}, batch {batch}: {ms:.3f} ms", flush=True)
            for kernel in kernels[:8]:
                print(f"    {kernel['ms']:.4f} ms x{kernel['count']:.0f} {kernel['kernel']}", flush=True)
    return rows


def form_rows(items: int, hidden: int, batches: list[int], k: int, chunks: list[int]) -> list[dict]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    width = -(-(items + 2) // max(chunks)) * max(chunks)  # the vocabulary padded to whole chunks
    table = (0.05 * torch.randn(width, hidden, generator=generator, device="cuda")).bfloat16()
    bias = torch.randn(2, width, generator=generator, device="cuda").bfloat16()
    table_fp8, table_scale = quantize_rows(table, MULTIPLE)
    table_scale = table_scale.T.contiguous()  # (1, V): _scaled_mm's form
    int8_scale = table.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
    table_int8 = (table.float() / int8_scale).round().clamp(-127, 127).to(torch.int8)
    vocab = items + 2
    table_v, bias_v = table[:vocab], bias[:, :vocab].contiguous()
    chunks = [c for c in chunks if width // c >= k]  # chunked_top_k takes k chunks at least
    columns = torch.arange(max(chunks, default=1), device="cuda")
    rows = []
    for batch in batches:
        query = torch.randn(batch, hidden, generator=generator, device="cuda").bfloat16()
        pick = torch.zeros(batch, dtype=torch.long, device="cuda")

        def fp8_product(query=query, pick=pick):
            return scaled_product(query, table_fp8, table_scale).add_(bias[pick])

        def int8_product(query=query, pick=pick):
            padded = torch.nn.functional.pad(query.float(), (0, 0, 0, max(17 - query.shape[0], 0)))
            scale = padded.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
            product = torch._int_mm((padded / scale).round().to(torch.int8), table_int8.T)
            return (product[: query.shape[0]] * scale[: query.shape[0]] * int8_scale.T).bfloat16().add_(bias[pick])

        forms = {
            "bf16 addmm_": (lambda query=query, pick=pick: bias[pick].addmm_(query, table.T), 2),
            # the catalogue's own V columns (1M + 2: rows not a multiple of 8), whole rows and in rows of W
            "bf16 addmm_ V": (lambda query=query, pick=pick: bias_v[pick].addmm_(query, table_v.T), 2),
            "bf16 addmm_ V in W": (lambda query=query, pick=pick: bias[pick][:, :vocab].addmm_(query, table_v.T), 2),
            "fp8 scaled_mm": (fp8_product, 1),
            "int8 int_mm": (int8_product, 1),
        }
        scores = bias[pick].addmm_(query, table.T)
        for name, (call, size) in forms.items():
            with torch.inference_mode():
                ms = _try(name, call)
            gbps = None if ms is None else width * (hidden * size + 4 * (size == 1)) / ms / 1e6
            rows.append({"form": f"product {name}", "batch": batch, "ms": ms, "table_gb_per_s": gbps})
            print(f"batch {batch}: product {name}: {ms} ms, {gbps} GB/s of the table", flush=True)
        expected = scores.topk(k, 1).values
        tops = {"topk": lambda s=scores: s.topk(k, 1)} | {
            f"chunks-{c}": (lambda s=scores, c=c: chunked_top_k(s, k, columns[:c], width, c)) for c in chunks
        }
        for name, call in tops.items():
            exact = bool(torch.equal(call()[0], expected))
            ms = _try(name, call)
            rows.append({"form": f"top-k {name}", "batch": batch, "ms": ms, "exact": exact})
            print(f"batch {batch}: top-k {name}: {ms} ms (exact: {exact})", flush=True)
        for name, call in (
            {"fp8 + chunks": fp8_product, "bf16 + chunks": forms["bf16 addmm_"][0]}.items() if chunks else ()
        ):
            best = min(chunks, key=lambda c: next(r["ms"] or 1e9 for r in rows if r["form"] == f"top-k chunks-{c}"))
            with torch.inference_mode():
                ms = _try(name, lambda call=call, best=best: chunked_top_k(call(), k, columns[:best], width, best))
            rows.append({"form": f"{name}-{best}", "batch": batch, "ms": ms})
            print(f"batch {batch}: {name}-{best}: {ms} ms", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--k", type=int, default=100, help="the answer's width (the export's max_k)")
    parser.add_argument("--chunks", default="128,256,512,1024")
    parser.add_argument("--precisions", default="bf16,fp8", help="the exported graphs' precisions")
    parser.add_argument("--no-graph", action="store_true", help="the forms alone, not the exported graph")
    parser.add_argument("--work", type=Path, default=Path("/tmp/output-layer-speed"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = []
    for precision in [] if args.no_graph else args.precisions.split(","):
        try:
            rows += graph_rows(args.items, args.hidden, batches, args.k, args.work, precision)
        except Exception as error:  # one precision's export failing leaves the rest to measure
            print(f"graph {precision}: {type(error).__name__}: {str(error)[:300]}", flush=True)
            rows.append({"form": f"graph {precision}", "error": f"{type(error).__name__}: {str(error)[:2000]}"})
    rows += form_rows(args.items, args.hidden, batches, args.k, chunks)
    settings = vars(args) | {"work": str(args.work), "out": str(args.out)}
    result = {"settings": settings, "gpu": torch.cuda.get_device_name(), "host": cpu_model(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
