#!/usr/bin/env bash
# The whole path on the shipped ML-100K data: prepare, train SASRec (the default model), evaluate, export,
# serve through every layout (fused, native, the PoC's seed ensemble, echo, and by session from recserve's
# embedded session store), recommend (under business rules too, an item hidden and gone); the next day (a warm
# start from yesterday's run, the gate, a promotion into the running server and a rollback); benchmark; then
# Mult-VAE, and the SageMaker path on a local endpoint.
set -euo pipefail
out=${1:-runs/demo}
bin=.venv/bin
rs="$bin/recserve"
mkdir -p "$out"
mark() { echo "[demo] $1 after $SECONDS s" >&2; }  # where the time goes
# its ports: PORTS="HTTP GRPC METRICS ENDPOINT" (make demo PORTS="..."), else four free ones on loopback, so
# that a server of another's on the usual ports never fails it
read -r http grpc metrics endpoint_port <<< "${PORTS:-$($bin/python -c 'from recserve.processes import free_ports; print(*free_ports(4))')}"
echo "[demo] ports: HTTP $http, gRPC $grpc, metrics $metrics, SageMaker endpoint $endpoint_port" >&2

$rs data ml-100k --out "$out/data"
if [ -f "$out/run/model.pt" ] && [ -f "$out/run/metrics.json" ] && [ "${DEMO_RETRAIN:-0}" != 1 ]; then
  mark "trained SASRec: kept from an earlier demo ($out/run; DEMO_RETRAIN=1 trains again)"
else
  # a run cut short before resumes from its last checkpoint; DEMO_RETRAIN=1 starts afresh
  $rs train --data "$out/data" --out "$out/run" --epochs "${DEMO_EPOCHS:-60}" $([ "${DEMO_RETRAIN:-0}" = 1 ] && echo --overwrite)
  mark "trained SASRec"
fi
$rs export --run "$out/run" --out "$out/export-onnx" --backend onnx
$rs export --run "$out/run" --out "$out/export-eager" --backend eager
$rs export --run "$out/run" --out "$out/export-torchscript" --backend torchscript
mark "exported"
# the repository serves the exports just validated: onnx behind the fused model and (as ONNX Runtime's own
# model) the native layout, TorchScript as the seed layout's model step; the native and seed layouts need
# Triton's native backends, which make demo builds first (only RECSERVE_SKIP_NATIVE=1 goes on without them)
if [ -f build/triton-backends/pytorch/libtriton_pytorch.so ] && [ -f build/triton-backends/onnxruntime/libtriton_onnxruntime.so ]; then
  $rs repo --export "$out/export-onnx" --out "$out/repo" --layout fused,native,echo
  $rs repo --export "$out/export-torchscript" --out "$out/repo" --layout seed
  native=1
else
  [ "${RECSERVE_SKIP_NATIVE:-0}" = 1 ] || { echo "Triton's native backends are not built: scripts/build_triton_backends.sh" >&2; exit 1; }
  echo "RECSERVE_SKIP_NATIVE=1: serving the fused and echo layouts only" >&2
  $rs repo --export "$out/export-onnx" --out "$out/repo" --layout fused,echo
  native=0
fi

# Real-time sessions: recserve's embedded store (a Redis server on loopback behind a generated password, run
# from a folder), 100 ML-100K users' histories replayed into it (each user's test item held out), and the
# session layout, which answers a session ID from the store
$rs store start --dir "$out/store"
trap '$rs store stop --dir "$out/store" >/dev/null 2>&1 || true' EXIT
$rs events load "$out/data" --users 100 --holdout 1 --store "$out/store"
$rs repo --export "$out/export-onnx" --out "$out/repo" --layout session --session-store "$out/store"
# and recserve's own backend, reading the same store in C++ and scoring the TorchScript graph in the same call
if [ "$native" = 1 ] && [ -f build/triton-backends/recserve/libtriton_recserve.so ]; then
  $rs repo --export "$out/export-torchscript" --out "$out/repo" --layout native_session --session-store "$out/store"
fi

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

# in the background: it returns once every model is ready; `recserve status` says what runs
trap '$rs stop --http-port $http >/dev/null 2>&1 || true; $rs store stop --dir "$out/store" >/dev/null 2>&1 || true' EXIT
$rs serve --repo "$out/repo" --http-port $http --grpc-port $grpc --metrics-port $metrics --detach
$rs status
echo "history of user 1 (oldest first): $history"
$rs recommend $history --url 127.0.0.1:$grpc --items "$out/run/items.parquet"
# the same shopper by session: the store holds user 1's whole history (the newest 200 items); then a click,
# sent as an event, is in the very next answer
user=$($bin/python -c "import sys; from recserve.data.datasets import load_prepared; print(load_prepared(sys.argv[1]).user_ids[0])" "$out/data")
$rs recommend --session "user-$user" --url 127.0.0.1:$grpc --k 5 --items "$out/run/items.parquet"
$rs events send "user-$user" 50 --kind view --store "$out/store"
$rs recommend --session "user-$user" --url 127.0.0.1:$grpc --k 5 --items "$out/run/items.parquet"
# Business rules inside the top k: ML-100K's items carry their release year and genre (`recserve data --items`
# adds a shop's own attributes); a rule keeps the answer to what it lets through, and an item hidden in the
# store (out of stock) is gone from the session's next answer
$rs recommend $history --url 127.0.0.1:$grpc --k 5 --where 'genre == "Comedy" and year >= 1990' --items "$out/run/items.parquet"
top=$($rs recommend --session "user-$user" --url 127.0.0.1:$grpc --k 1 --json | $bin/python -c 'import json, sys; print(json.load(sys.stdin)["item_id"][0])')
$rs items hide "$top" --store "$out/store"
$rs recommend --session "user-$user" --url 127.0.0.1:$grpc --k 5 --json | $bin/python -c '
import json, sys
answer = json.load(sys.stdin)["item_id"]
assert int(sys.argv[1]) not in answer, "a hidden item was recommended"
print(f"item {sys.argv[1]} hidden: the next answer is {answer}")' "$top"
$rs items show "$top" --store "$out/store"
if [ -d "$out/repo/recommender_native_session" ]; then  # the same session from recserve's own backend,
  # then with its top item excluded there (recserve's backend keeps to a request's rules too)
  $rs recommend --session "user-$user" --url 127.0.0.1:$grpc --k 5 --model recommender_native_session --json
  $rs recommend --session "user-$user" --url 127.0.0.1:$grpc --k 5 --model recommender_native_session \
    --exclude "$top" --json
fi
if [ "$native" = 1 ]; then  # the same answer from the whole graph on ONNX Runtime's backend, no Python
  $rs recommend $history --url 127.0.0.1:$grpc --model recommender_native --json
  # the PoC's own client, unchanged: 39 INT64 IDs in `inputs` of bert4rec_ensemble, IDs and scores back
  DEMO_HTTP=$http $bin/python - $history <<'PY'
import os
import sys
import numpy as np
import tritonclient.http as httpclient

client = httpclient.InferenceServerClient(url=f"127.0.0.1:{os.environ['DEMO_HTTP']}")
item_ids = np.array(sys.argv[1:], dtype=np.int64)[-39:]
item_ids = np.concatenate([np.zeros(39 - len(item_ids), dtype=np.int64), item_ids])  # 0: no item
inputs = [httpclient.InferInput("inputs", item_ids.shape, "INT64")]
inputs[0].set_data_from_numpy(item_ids)
outputs = [httpclient.InferRequestedOutput("output__0"), httpclient.InferRequestedOutput("output__1")]
result = client.infer("bert4rec_ensemble", inputs, outputs=outputs)
print("seed layout (the PoC's client):", result.as_numpy("output__0").tolist())
PY
fi
$rs stop --http-port $http
mark "served every layout"

# The next day. Yesterday's model knew the events up to the 80% time cut, and the shop's item table (genre and
# year) listed 66 movies that no event held yet: the model learned every movie as its ID plus its attributes, so
# it ranks those by their attributes, and the repository gives every tenth column of an answer to the best of
# them (--explore-new 0.1). Today's log holds every event. Today's run starts from yesterday's weights, carried
# by item ID, and is split by time as a shop lives: the test targets are each user's first event after the 95%
# cut. The gate ranks both runs on those targets, and the winner is promoted into the running server (explicit
# model control: a version loads only when `recserve promote` says so).
$bin/python - "$out" <<'PY'
import sys
import polars as pl
from recserve.data.io import read_ml100k
log, films = read_ml100k()
log.filter(pl.col("timestamp") <= log["timestamp"].quantile(0.8, "lower")).write_csv(f"{sys.argv[1]}/day-one.csv")
log.write_csv(f"{sys.argv[1]}/day-two.csv")
films.select("item_id", "genre", "year").write_csv(f"{sys.argv[1]}/films.csv")
PY
$rs data "$out/day-one.csv" --out "$out/day-one" --items "$out/films.csv" --unseen-items
# a run kept from a demo before item attributes is trained again
if [ ! -f "$out/day-one-run/model.pt" ] || ! grep -q '"attribute_columns": [1-9]' "$out/day-one-run/model_config.json" \
  || [ "${DEMO_RETRAIN:-0}" = 1 ]; then
  $rs train --data "$out/day-one" --out "$out/day-one-run" --epochs "${DEMO_DAY_EPOCHS:-20}" --overwrite
fi
$rs data "$out/day-two.csv" --out "$out/day-two" --split time --test-after 95% --items "$out/films.csv" --unseen-items
$rs train --data "$out/day-two" --out "$out/day-two-run" --warm-start "$out/day-one-run" --epochs 5 --overwrite
mark "trained the next day's run from yesterday's"
rm -rf "$out/shop-repo"
$rs repo --run "$out/day-one-run" --out "$out/shop-repo" --layout fused --explore-new 0.1
export RECSERVE_ADMIN_KEY="$($bin/python -c 'import secrets; print(secrets.token_hex(16))')"
trap '$rs stop --http-port $http >/dev/null 2>&1 || true; $rs store stop --dir "$out/store" >/dev/null 2>&1 || true' EXIT
$rs serve --repo "$out/shop-repo" --http-port $http --grpc-port $grpc --metrics-port $metrics --detach \
  --model-control explicit
if $rs promote --run "$out/day-two-run" --repo "$out/shop-repo" --tolerance 0.05; then
  $rs status
  # a shopper of today, whose history holds movies no event of yesterday held: answered by today's model
  $bin/python - "$out" "$grpc" <<'PY'
import sys
import numpy as np
from recserve.client import RecommenderClient
from recserve.data.datasets import load_prepared
out, grpc = sys.argv[1], sys.argv[2]
day_one, day_two = load_prepared(f"{out}/day-one"), load_prepared(f"{out}/day-two")
known = np.unique(day_one.vocab.to_ids(day_one.sequences.items))  # the movies an event of yesterday held
held = day_two.test()
ids = day_two.vocab.to_ids(held.inputs.items)
new = ~np.isin(ids, known)
owner = np.repeat(np.arange(held.inputs.num_users), held.inputs.lengths)
user = int(np.bincount(owner[new], minlength=held.inputs.num_users).argmax())
history = ids[held.inputs.offsets[user]:held.inputs.offsets[user + 1]][-20:]
answer = RecommenderClient(f"127.0.0.1:{grpc}").recommend(history.tolist(), k=10).item_ids
watched = np.unique(day_two.vocab.to_ids(day_two.train.items))  # what today's run learned from events
unwatched = [f"#{n + 1}" for n, item in enumerate(answer) if item not in watched]
print(f"a shopper whose last 20 movies hold {int(np.isin(history, known, invert=True).sum())} that yesterday's "
      f"model never saw in an event: {answer.tolist()}; no training event of today's run holds "
      f"{', '.join(unwatched) or 'none'} of them (ranked by genre and year; every tenth column explores)")
PY
  $rs rollback --repo "$out/shop-repo"
else
  echo "[demo] the gate kept yesterday's model: nothing was promoted" >&2
fi
$rs stop --http-port $http
unset RECSERVE_ADMIN_KEY
mark "promoted and rolled back"

# A short load test of the repository's layouts side by side (the full sweep: docs/benchmarks.md), the
# session layout's requests asking for sessions of the same histories, loaded into the store first
$rs bench --repo "$out/repo" --out "$out/bench" --concurrency 8 --measurement-ms 1000
$rs store stop --dir "$out/store"
trap - EXIT
mark "benchmarked"

# Mult-VAE on implicit feedback (ratings of 4 and 5), by the paper's held-out-user protocol
$rs data ml-100k --out "$out/data-implicit" --rating-threshold 3.5
$rs train --data "$out/data-implicit" --out "$out/multvae" --model multvae
mark "trained Mult-VAE"

# The SageMaker path: the SASRec run as a model.tar.gz, served locally by the SageMaker PyTorch
# toolkit over TorchServe, asked for user 1's recommendations
$rs sagemaker package --export "$out/export-eager" --runtime pytorch --out "$out/model.tar.gz"
$rs sagemaker serve --model "$out/model.tar.gz" --port $endpoint_port &
endpoint=$!
trap 'kill -TERM $endpoint 2>/dev/null; wait $endpoint 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf 127.0.0.1:$endpoint_port/invocations -H 'Content-Type: application/json' -d '{"item_id": []}' >/dev/null && break
  kill -0 $endpoint 2>/dev/null || { echo "endpoint failed to start" >&2; exit 1; }
  sleep 1
done
$rs sagemaker invoke $history --k 5 --url http://127.0.0.1:$endpoint_port
kill -TERM $endpoint; wait $endpoint 2>/dev/null || true
trap - EXIT
mark "done"
