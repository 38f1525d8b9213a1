#!/usr/bin/env bash
# One GPU-machine call: the default BERT4Rec on ML-100K and video.txt over several seeds, this checkout
# (bf16 and float32) beside an older one (.gpu-carry/old-src), within about 9 minutes. Carries:
# .gpu-carry/wheels (polars for Python 3.12), .gpu-carry/ml100k and .gpu-carry/video (prepared folders).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-carry/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
out=${OUT:-runs/gpu-quality}; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
seeds() { python3 benchmarks/train_seeds.py "$@"; }
seeds --data .gpu-carry/video --seeds 0,1,2 --parallel 3 --variant "new-bf16=--device cuda" \
  --out "$out/video-new.jsonl" --runs /tmp/rv > "$out/video-new.log" 2>&1 &
seeds --src .gpu-carry/old-src --data .gpu-carry/video --seeds 0 --parallel 1 --variant "old=--device cuda" \
  --out "$out/video-old.jsonl" --runs /tmp/rvo > "$out/video-old.log" 2>&1 &
seeds --data .gpu-carry/ml100k --seeds 0,1,2,3,4 --parallel 10 --variant "new-bf16=--device cuda" \
  --variant "new-fp32=--device cuda --precision 32" --out "$out/ml100k.jsonl" --runs /tmp/rm > "$out/ml100k.log" 2>&1
seeds --src .gpu-carry/old-src --data .gpu-carry/ml100k --seeds 0,1,2,3,4 --parallel 5 --variant "old=--device cuda" \
  --out "$out/ml100k.jsonl" --runs /tmp/rmo >> "$out/ml100k.log" 2>&1
seeds --data .gpu-carry/video --seeds 0 --parallel 1 --variant "new-fp32=--device cuda --precision 32" \
  --out "$out/video-new.jsonl" --runs /tmp/rvf > "$out/video-fp32.log" 2>&1 &
for _ in $(seq 1 "${WAIT_STEPS:-100}"); do jobs -r | grep -q . || break; sleep 5; done
tail -n 8 "$out"/*.log
