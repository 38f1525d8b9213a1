#!/usr/bin/env bash
# One call on the two-GPU machine: training throughput on one GPU against two (Lightning DDP), each run
# alone on the machine: the generated 1M-item log (benchmarks/train_scale.py's generator, 200,000 users)
# at batch 1024 and 2048, DDP with bf16 and with float32 gradient exchange; the GPUs' link and all-reduce
# bandwidth first. Carries .gpu-carry/wheels (polars for Python 3.12). Video.txt: VIDEO=1 (needs .gpu-carry/video).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-carry/wheels/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/gpu-ddp}; mkdir -p "$out"; work=$(mktemp -d /tmp/ddp-work.XXXX)
{ nvidia-smi topo -m; python3 benchmarks/allreduce.py --items 1000000; } > "$out/link.txt" 2>&1
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
scale --out "$out/items-1m-b1024-x1.json" --devices 1 --batch-size 1024
scale --out "$out/items-1m-b1024-x2.json" --devices 2 --batch-size 1024
scale --out "$out/items-1m-b1024-x2-fp32.json" --devices 2 --batch-size 1024 --no-ddp-compress --no-test
scale --out "$out/items-1m-b2048-x1.json" --devices 1 --batch-size 2048 --no-test
scale --out "$out/items-1m-b2048-x2.json" --devices 2 --batch-size 2048 --no-test
if [ -n "${VIDEO:-}" ]; then
  for model in bert4rec sasrec; do
    for devices in 1 2; do
      python3 benchmarks/train_scale.py --device cuda --work "$work" --epochs 2 --data .gpu-carry/video --model $model \
        --devices $devices --batch-size 128 --out "$out/video-$model-x$devices.json" >> "$out/scale.log" 2>&1
    done
  done
fi
cat "$out/link.txt"; grep -v "━" "$out/scale.log" | grep "windows/s\|Error\|error" | tail -n 20
