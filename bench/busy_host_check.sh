#!/usr/bin/env bash
# Issue 30's check of the registered speed, ROUNDS times: a coordinator and two identical workers
# on this host (one CPU each), the second started while `stress-ng` keeps every CPU busy (the
# load ends before the jobs run); then one job of 2 stages each of examples/gpt_char and the deep
# MLP. Prints each worker's registered GFLOP/s (`pipetrain workers`) and the imbalance of each
# job's partition (the job's status, as `pipetrain train` prints it).
# Usage: bench/busy_host_check.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
pipetrain=$build/client/pipetrain
logs=$(mktemp -d)
pids=()
stop_daemons() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_daemons; rm -rf "$logs"' EXIT

# round N: one busy start and its two jobs.
round() {
  local port=$((20000 + RANDOM % 20000)) stress speeds
  "$build/server/coordinator/coordinator" --listen "127.0.0.1:$port" 2>"$logs/coordinator.log" &
  pids+=($!)
  "$build/server/worker/stage_worker" --coordinator "127.0.0.1:$port" --cpus 0 --name idle-twin \
    2>"$logs/worker0.log" &
  pids+=($!)
  stress-ng --cpu "$((4 * $(nproc)))" --timeout 5s >/dev/null 2>&1 &
  stress=$!
  sleep 1 # the load runs before the second worker starts (not a synchronisation).
  "$build/server/worker/stage_worker" --coordinator "127.0.0.1:$port" --cpus 1 \
    --name busy-twin 2>"$logs/worker1.log" &
  pids+=($!)
  wait "$stress" || true
  for _ in $(seq 100); do
    speeds=$("$pipetrain" workers --coordinator "127.0.0.1:$port" 2>/dev/null |
      awk '/twin/ {print $1 " " $4}' | sort | tr '\n' ' ')
    [[ $(wc -w <<<"$speeds") == 4 ]] && break
    sleep 0.1
  done
  local line="round $1: GFLOP/s $speeds"
  for model in gpt_char deep_mlp; do
    local data=()
    [[ $model == deep_mlp ]] && data=(--data synthetic)
    line+=" | $model $("$pipetrain" train --coordinator "127.0.0.1:$port" \
      --model "examples/$model.textproto" "${data[@]}" --stages 2 --microbatches 4 --batch 16 \
      --steps 1 2>&1 | grep -o 'imbalance [0-9.]*' | head -1)"
  done
  echo "$line"
  stop_daemons
}

for r in $(seq "$rounds"); do round "$r"; done
