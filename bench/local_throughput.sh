#!/usr/bin/env bash
# Samples/s of `pipetrain local` with S = 1, 2, 4 stages (1F1B) on the deep benchmark MLP, beside
# `pipetrain reference` (one process, no pipeline) measured in the same run. Every figure is
# end to end and measured the same way: the wall time of an N-step run minus that of a 1-step
# run, divided into N-1 batches — which cancels start-up (processes, data, links) and evaluation.
# Usage: bench/local_throughput.sh [BUILD_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-25}
pipetrain=$build/client/pipetrain
common=(--model examples/deep_mlp.textproto --data synthetic --batch 64 --microbatches 8
        --seed 1 --optimizer sgd:lr=0.01 --json)

# run_seconds STEPS COMMAND...: wall time of one run.
run_seconds() {
  local n=$1 start end
  shift
  start=$(date +%s.%N)
  "$@" --steps "$n" >/dev/null 2>&1
  end=$(date +%s.%N)
  python3 -c "print($end - $start)"
}
# samples_per_s COMMAND...
samples_per_s() {
  local t_n t_1
  t_n=$(run_seconds "$steps" "$@")
  t_1=$(run_seconds 1 "$@")
  python3 -c "print('%.0f' % (64 * ($steps - 1) / max(1e-9, $t_n - $t_1)))"
}

ref=$(samples_per_s "$pipetrain" reference "${common[@]}" --eval-samples 1)
echo "deep MLP, B=64, M=8, 1F1B, $(nproc) cores, $steps steps"
printf "%-22s %12s %8s\n" "run" "samples/s" "ratio"
printf "%-22s %12s %8s\n" "reference (1 process)" "$ref" "1.000"
for s in 1 2 4; do
  sps=$(samples_per_s "$pipetrain" local --stages "$s" --schedule 1f1b "${common[@]}")
  printf "%-22s %12s %8s\n" "local S=$s" "$sps" "$(python3 -c "print('%.3f' % ($sps / $ref))")"
done
