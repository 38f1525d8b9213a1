#!/usr/bin/env bash
# One call on the two-GPU machine: SASRec's defaults against a few alternatives on video.txt (GPU 0) and
# ML-100K (GPU 1), several runs sharing each GPU (quality only: their times are not solo times), then the
# default SASRec on video.txt trained with DDP on both GPUs (`--devices 2`) for the one-GPU comparison.
# Carries .gpu-carry/wheels (polars for Python 3.12), .gpu-carry/video and .gpu-carry/ml100k.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-carry/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/gpu-sasrec}; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
seeds() { python3 benchmarks/train_seeds.py --timeout-s "${RUN_TIMEOUT_S:-290}" "$@"; }
S="--model sasrec --device cuda"
CUDA_VISIBLE_DEVICES=0 seeds --data .gpu-carry/video --seeds 0,1,2 --parallel 3 --variant "sasrec=$S" \
  --out "$out/video.jsonl" --runs /tmp/sv > "$out/video-default.log" 2>&1 &
CUDA_VISIBLE_DEVICES=0 seeds --data .gpu-carry/video --seeds 0 --parallel 4 --variant "sasrec-dropout0.5=$S --dropout 0.5" \
  --variant "sasrec-hidden128=$S --hidden 128" --variant "sasrec-spu4=$S --samples-per-user 4" \
  --variant "sasrec-wd0.1=$S --weight-decay 0.1" --out "$out/video.jsonl" --runs /tmp/sv > "$out/video-variants.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 seeds --data .gpu-carry/ml100k --seeds 0,1,2,3,4 --parallel 10 --variant "sasrec=$S" \
  --variant "sasrec-window200=$S --window 200" --variant "sasrec-hidden128=$S --hidden 128" \
  --out "$out/ml100k.jsonl" --runs /tmp/sm > "$out/ml100k.log" 2>&1 &
for _ in $(seq 1 "${WAIT_STEPS:-60}"); do jobs -r | grep -q . || break; sleep 5; done
kill $(jobs -p) 2>/dev/null; pkill -f "recserve.cli.main train"; sleep 2
seeds --data .gpu-carry/video --seeds 0 --parallel 1 --variant "sasrec-ddp2=$S --devices 2" --timeout-s "${DDP_TIMEOUT_S:-250}" \
  --out "$out/video-ddp.jsonl" --runs /tmp/sd > "$out/video-ddp.log" 2>&1
tail -n 12 "$out"/*.log
