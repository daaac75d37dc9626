#!/usr/bin/env bash
# Samples/s of `pipetrain local` with S = 1, 2, 4 stages (1F1B) on the deep benchmark MLP, beside
# `pipetrain reference` (one process, no pipeline) measured in the same run. Steady-state figure:
# the median step time over steps 2..N (the first step opens the links).
# Usage: bench/local_throughput.sh [BUILD_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-12}
pipetrain=$build/client/pipetrain
common=(--model examples/deep_mlp.textproto --data synthetic --batch 64 --microbatches 8
        --steps "$steps" --seed 1 --optimizer sgd:lr=0.01 --json)

median_samples_per_s() {  # reads JSON lines on stdin; prints samples/s from the median step_ms
  python3 -c '
import json, sys, statistics
batch = int(sys.argv[1])
ms = [json.loads(l)["step_ms"] for l in sys.stdin if l.startswith("{\"step\"")][1:]
print("%.0f" % (batch / (statistics.median(ms) / 1000.0)))' 64
}

# The reference prints no step times: time an N-step and a 1-step run and divide the difference,
# which cancels start-up, data generation and evaluation.
run_seconds() {
  local start end
  start=$(date +%s.%N)
  "$pipetrain" reference "${common[@]}" --steps "$1" --eval-samples 1 >/dev/null
  end=$(date +%s.%N)
  python3 -c "print($end - $start)"
}
t_n=$(run_seconds "$steps")
t_1=$(run_seconds 1)
ref=$(python3 -c "print('%.0f' % (64 * ($steps - 1) / max(1e-9, $t_n - $t_1)))")
echo "deep MLP, B=64, M=8, 1F1B, $(nproc) cores"
printf "%-22s %12s %8s\n" "run" "samples/s" "ratio"
printf "%-22s %12s %8s\n" "reference (1 process)" "$ref" "1.000"
for s in 1 2 4; do
  sps=$("$pipetrain" local --stages "$s" --schedule 1f1b "${common[@]}" | median_samples_per_s)
  printf "%-22s %12s %8s\n" "local S=$s" "$sps" "$(python3 -c "print('%.3f' % ($sps / $ref))")"
done
