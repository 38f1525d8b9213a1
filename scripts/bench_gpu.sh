#!/usr/bin/env bash
# `make bench-gpu`: the GPU benchmarks on a GPU host of one's own, with the normal install (`make setup`,
# whose torch from the package index is a CUDA build on Linux). It builds the native backends with CUDA for
# the visible GPUs, then writes under OUT (default runs/bench-gpu):
#   serving/      the layouts side by side through Triton on GPU 0 (benchmarks/serving_layouts.py: echo, seed, fused
#                 eager and cudagraph, native on Triton's PyTorch backend and on recserve's; perf_analyzer over
#                 gRPC on a quarter of the cores (8 or more), the server on the rest, a concurrency sweep;
#                 summary.json, report.md, PNGs), the native answers checked against fused;
#   train-scale.json  `recserve train`'s epoch time, memory and test metrics at 10k, 100k and 1M items
#                 (benchmarks/train_scale.py, generated logs).
# BENCH_GPU_SERVING and BENCH_GPU_TRAINING add options to each (e.g. BENCH_GPU_SERVING="--items 1000000").
# Usage: scripts/bench_gpu.sh [PYTHON] [OUT]
set -euo pipefail
py=${1:-.venv/bin/python}
out=${2:-runs/bench-gpu}
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "error: the torch in $py sees no GPU: make bench-gpu needs an NVIDIA GPU and a CUDA build of torch" \
       "(make setup TORCH=torch installs the package index's, a CUDA build on Linux)" >&2
  exit 1
fi
bash scripts/build_triton_backends.sh "$py"
mkdir -p "$out"
cores=$("$py" -c 'import os; print(len(os.sched_getaffinity(0)))')
"$py" benchmarks/serving_layouts.py --out "$out/serving" --work "$out/work" --concurrency 1,16,64,256,512 \
  --client-cpus $(( cores >= 8 ? cores / 4 : 0 )) \
  --variants echo-plain,seed,fused-eager-bf16,fused-cudagraph-bf16-plain,native-torchscript-bf16-plain,native-recserve-bf16-plain \
  ${BENCH_GPU_SERVING:-}
"$py" benchmarks/train_scale.py --out "$out/train-scale.json" --device cuda --work "$out/work" ${BENCH_GPU_TRAINING:-}
echo "results in $out: serving/summary.json, serving/report.md, serving/*.png, train-scale.json"
