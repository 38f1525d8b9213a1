#!/usr/bin/env bash
# One call on the GPU machine: unpack the carried Triton server and perf_analyzer (.gpu, made by
# make-bundle.sh plus scripts/gpu_wheels.sh), build the repositories and run the layouts side by side.
# Usage (from the repository root, on the GPU machine): scripts/gpu_bench.sh [gpu_bench.py options]
# Results go to $OUT (or runs/gpu-bench).
set -euo pipefail
export SRC=src
source .gpu/device-env.sh
deps=/tmp/recserve-deps
if [ ! -d "$deps" ]; then
  python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$deps" .gpu/wheels/*.whl
fi
export PYTHONPATH="$PWD/src:$deps"
export PERF_ANALYZER=/tmp/gpu-bundle/bin/perf_analyzer
if [ -d .gpu/native ]; then  # the native layout: Triton's PyTorch backend built here, with CUDA, against this torch
  started=$(date +%s)
  TRITON_NATIVE_SRC=.gpu/native TRITON_NATIVE_DEBS=.gpu/native/debs TRITON_BACKENDS_GPU=1 \
    TRITON_BACKENDS_OUT="$TRITON_BACKEND_DIR" TRITON_SERVER_LIBS=/tmp/gpu-bundle/nvidia_pytriton.libs \
    bash scripts/build_triton_backends.sh python3 || echo "warning: a native backend failed to build" >&2
  echo "native backends built in $(( $(date +%s) - started )) s"
fi
out=${OUT:-runs/gpu-bench}
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv || true
python3 scripts/gpu_bench.py --out "$out" "$@"
