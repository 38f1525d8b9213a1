#!/usr/bin/env bash
# One call on the two-GPU machine: training throughput on one GPU against two (Lightning DDP), each run
# alone on the machine. First `recserve train --compile`'s own loop on the generated 1M-item log
# (benchmarks/train_scale.py's generator, 200,000 users) at batch 4096 (test NDCG@10 too) and 2048 on one
# GPU and on two; then the same step in a plain loop at 2048 (benchmarks/profile_step.py: DDP as the
# trainer sets it up, and each GPU alone without the all-reduce, the floor; MORE_STEPS=1 adds 1024 and
# 4096, eager and compiled); the GPUs' link and all-reduce bandwidth; the trainer's host work a step
# (benchmarks/trainer_overhead.py, where .gpu-carry/ml100k is carried) last. Carries .gpu-carry/wheels
# (polars for Python 3.12). video.txt: VIDEO=1 (needs .gpu-carry/video; VIDEO_BATCH, default 128).
# The training runs' JSON files end up in one, runs.json ({file name: its content}).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-carry/wheels/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/gpu-ddp}; mkdir -p "$out"; work=$(mktemp -d /tmp/ddp-work.XXXX)
python3 - "$work" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from train_scale import generate
from recserve.data.datasets import prepare
work = Path(sys.argv[1])
generate(work / "log.parquet", 200_000, 1_000_000, 50)
prepare(str(work / "log.parquet"), work / "items-1m")
PY
scale() { python3 benchmarks/train_scale.py --device cuda --work "$work" --epochs 2 --data "$work/items-1m" "$@" >> "$out/scale.log" 2>&1; }
compiled() {  # the run with --compile; eager (and said so in the log) where compiling fails
  scale "$@" --compile || { echo "compile failed: eager instead ($*)" | tee -a "$out/scale.log"; scale "$@"; }
}
for batch in 4096 2048; do  # the larger batch first: it is the one the target is measured at
  test=$([ $batch = 4096 ] || echo --no-test)
  compiled --out "$out/items-1m-b$batch-x1.json" --devices 1 --batch-size $batch $test
  compiled --out "$out/items-1m-b$batch-x2.json" --devices 2 --batch-size $batch $test
done
grep -v "━" "$out/scale.log" | grep "windows/s\|Error\|error" | tail -n 20
step() { python3 benchmarks/profile_step.py --items 1000000 --users 200000 --json "$out/step.json" "$@" >> "$out/step.log" 2>&1; }
step --devices 1 --batch-size 2048 --variants fused --no-profile
step --devices 2 --batch-size 2048 --variants bf16+view+fused,local+fused --no-profile
[ -n "${MORE_STEPS:-}" ] && for batch in 1024 4096; do
  step --devices 1 --batch-size $batch --variants fused,fused+compile --no-profile
  step --devices 2 --batch-size $batch --variants bf16+view+fused,local+fused,bf16+view+fused+compile --no-profile
done
grep "GPU(s)\|Error" "$out/step.log"
{ nvidia-smi topo -m; python3 benchmarks/allreduce.py --items 1000000; } > "$out/link.txt" 2>&1
if [ -n "${VIDEO:-}" ]; then
  for model in bert4rec sasrec; do
    for devices in 1 2; do
      python3 benchmarks/train_scale.py --device cuda --work "$work" --epochs 2 --data .gpu-carry/video --model $model \
        --devices $devices --batch-size "${VIDEO_BATCH:-128}" --compile --out "$out/video-$model-x$devices.json" >> "$out/scale.log" 2>&1
    done
  done
  grep -v "━" "$out/scale.log" | grep "video\|Error" | tail -n 8
fi
if [ -d .gpu-carry/ml100k ]; then  # the trainer's host work a step on this host's CPU (one GPU)
  python3 benchmarks/trainer_overhead.py --device cuda --data .gpu-carry/ml100k --repeats 3 \
    --out "$out/trainer-overhead.json" 2>&1 | grep "repeat\|median\|Error"
fi
# one file for the training runs' JSON: a call brings back at most 8 files
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {f.stem: json.loads(f.read_text()) for f in sorted(out.glob("*.json")) if f.name != "step.json"}
(out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
for name in runs:
    (out / f"{name}.json").unlink()
PY
