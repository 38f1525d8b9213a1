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
out=${OUT:-runs/gpu-bench}
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv || true
python3 scripts/gpu_bench.py --out "$out" "$@"
