#!/usr/bin/env bash
# Adds to .gpu/ what the GPU machine's Python 3.12 lacks for building repositories there (the protobuf schema
# of config.pbtxt), the native backends' sources and the .deb files their build needs offline (.gpu/native,
# built there by scripts/gpu_bench.sh), and the trained ML-100K run with its test histories.
# Usage: scripts/gpu_wheels.sh [RUN DATA]
set -euo pipefail
src=${TRITON_NATIVE_SRC:-../shared/triton-native}
if [ -f "$src/triton-r24.10-src.tar.gz" ]; then
  mkdir -p .gpu/native/debs
  cp "$src/triton-r24.10-src.tar.gz" "$src/onnxruntime-1.29-c-api-headers.tar.gz" .gpu/native/
  (cd .gpu/native/debs && apt-get download -q rapidjson-dev patchelf 2>/dev/null)
fi
mkdir -p .gpu/wheels
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels \
  grpcio protobuf==6.33.6 tritonclient==2.73.0 packaging python-rapidjson
if [ $# -eq 2 ]; then
  rm -rf .gpu/ml100k && mkdir -p .gpu/ml100k
  cp "$1"/model.pt "$1"/model_config.json "$1"/item_ids.npy "$1"/popularity.npy .gpu/ml100k/
  .venv/bin/python - "$2" .gpu/ml100k/histories.npz <<'PY'
import sys, numpy as np
from recserve.data.datasets import load_prepared
data = load_prepared(sys.argv[1]); seq = data.sequences.truncated(1)
np.savez(sys.argv[2], items=data.vocab.to_ids(seq.items), offsets=seq.offsets)
PY
fi
du -sh .gpu
