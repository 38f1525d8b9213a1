#!/usr/bin/env bash
# The whole path on the shipped ML-100K data: prepare, train, evaluate, export, serve, recommend.
set -euo pipefail
out=${1:-runs/demo}
bin=.venv/bin
rs="$bin/recserve"
mkdir -p "$out"

$rs data ml-100k --out "$out/data"
$rs train --data "$out/data" --out "$out/run" --epochs "${DEMO_EPOCHS:-60}"
$rs export --run "$out/run" --out "$out/export-onnx" --backend onnx
$rs repo --run "$out/run" --out "$out/repo" --layout fused,seed,echo

# A real shopper: user 1's 20 most recent movies before the one held out for testing.
history=$($bin/python - "$out/data" <<'PY'
import sys
from recserve.data.datasets import load_prepared
data = load_prepared(sys.argv[1])
seq = data.sequences.truncated(1)
items = seq.items[seq.offsets[0]:seq.offsets[1]][-20:]
print(" ".join(str(x) for x in data.vocab.to_ids(items)))
PY
)

$rs serve --repo "$out/repo" --http-port 18000 --grpc-port 18001 --metrics-port 18002 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf 127.0.0.1:18000/v2/health/ready >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "server failed to start" >&2; exit 1; }
  sleep 1
done
echo "history of user 1 (oldest first): $history"
$rs recommend $history --url 127.0.0.1:18001 --items "$out/run/items.parquet"
kill -TERM $server; wait $server 2>/dev/null || true
trap - EXIT

# A short load test of the three layouts side by side (the full sweep: docs/benchmarks.md)
$rs bench --repo "$out/repo" --out "$out/bench" --concurrency 8 --measurement-ms 1000
