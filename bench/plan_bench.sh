#!/usr/bin/env bash
# `pipetrain local --plan auto` against the plain 1F1B default (`--stages 2 --schedule 1f1b`, one
# micro-batch) on the same two local workers, in one run, for examples/gpt_char and the deep MLP
# (B=64), in ROUNDS rounds that each run auto and the default (in turns, which first) for STEPS
# steps. Per run: the plan, the planner's prediction (auto: what its "plan auto:" line promised,
# planned afresh each round; the default: the prediction of `pipetrain plan --local 2
# --partition-by flops` for its plan, as a run without --plan auto is cut by FLOPs), the measured
# samples/s (B over the median step time of steps WARMUP..STEPS: a run's first steps are slower),
# the share of a CPU a process got around the round (1 on an idle host), the measured samples/s
# divided by it, and that over the prediction. Per model, the medians over the rounds of
# measured/predicted and of auto/default measured.
# Usage: bench/plan_bench.sh [BUILD_DIR] [STEPS] [ROUNDS]   Env: WARMUP (10).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-100}
rounds=${3:-5}
warmup=${WARMUP:-10}
pipetrain=$build/client/pipetrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ((steps <= warmup)); then
  echo "plan_bench: STEPS ($steps) must be more than WARMUP ($warmup)" >&2
  exit 2
fi

# measured JSON_LINES_FILE: samples/s from the median step_ms of steps >= WARMUP.
measured() {
  python3 - "$1" "$warmup" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1])
      if l.startswith("{") and '"step_ms"' in l and json.loads(l)["step"] >= int(sys.argv[2])]
print("%.1f" % (64 * 1000 / statistics.median(ms)))
PY
}

# cpu_share: the share of a CPU a busy process gets now (CPU seconds / wall seconds of a short
# `reference` run confined to each CPU in turn, averaged): 1 on an idle host. The planner predicts
# what the workers do when the CPUs are theirs (CPU seconds, docs/scaling.md); on a host other
# processes load, a run gets this share of it.
cpu_share() {
  local cpus total=0 n=0 cpu times
  cpus=$(python3 -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
  for cpu in $cpus; do
    /usr/bin/time -o "$out/time" -f "%e %U %S" taskset -c "$cpu" "$pipetrain" reference \
      --model examples/deep_mlp.textproto --data synthetic --batch 64 --steps 10 \
      --eval-samples 1 >/dev/null 2>&1
    times=$(tail -1 "$out/time")
    total=$(python3 -c "e, u, s = map(float, '$times'.split()); print($total + (u + s) / e)")
    n=$((n + 1))
  done
  python3 -c "print('%.3f' % min(1.0, $total / $n))"
}

median() { python3 -c 'import statistics, sys; print("%.3f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs; $rounds rounds of" \
  "$steps steps, the median of steps $warmup..$steps"
printf "%-9s %5s %-8s %-32s %9s %9s %6s %9s %9s\n" model round run plan predicted measured share \
  "meas/shr" "m/s/pred"
for model in gpt_char deep_mlp; do
  flags=(--model "examples/$model.textproto" --batch 64 --seed 1)
  [[ $model == deep_mlp ]] && flags+=(--data synthetic --optimizer sgd:lr=0.01)
  auto_ratios=() default_ratios=() speedups=()
  for ((round = 1; round <= rounds; round++)); do
    "$pipetrain" plan --local 2 "${flags[@]}" --partition-by flops --json --top 1000 \
      >"$out/plans.json"
    default_pred=$(python3 -c '
import json, sys
for l in open(sys.argv[1]):
    p = json.loads(l)
    if (p["replicas"], p["stages"], p["schedule"], p["virtual"], p["microbatches"]) == \
        (1, 2, "1f1b", 1, 1):
        print("%.1f" % p["samples_per_second"])' "$out/plans.json")
    share_before=$(cpu_share)
    # Odd rounds run auto first, even rounds the default first: neither gets the earlier (or
    # later) half of a slow spell every time.
    for run in $( ((round % 2)) && echo auto default || echo default auto); do
      if [[ $run == auto ]]; then
        "$pipetrain" local --plan auto --stages 2 "${flags[@]}" --steps "$steps" --json \
          >"$out/auto.json" 2>"$out/auto.err"
      else
        "$pipetrain" local --stages 2 --schedule 1f1b "${flags[@]}" --steps "$steps" --json \
          >"$out/default.json" 2>/dev/null
      fi
    done
    share=$(python3 -c "print('%.3f' % (($share_before + $(cpu_share)) / 2))")
    auto_line=$(grep -m1 '^plan auto:' "$out/auto.err")
    auto_plan=$(sed -E 's/^plan auto: ([0-9]+) replicas? x ([0-9]+) stages? x ([0-9]+) virtual, ([a-z0-9-]+), ([0-9]+) micro-batches.*/R=\1 S=\2 V=\3 \4 M=\5/' <<<"$auto_line")
    auto_pred=$(grep -o 'predicted [0-9.]*' <<<"$auto_line" | cut -d' ' -f2)
    auto_meas=$(measured "$out/auto.json")
    default_meas=$(measured "$out/default.json")
    for run in auto default; do
      if [[ $run == auto ]]; then plan=$auto_plan pred=$auto_pred meas=$auto_meas
      else plan="R=1 S=2 V=1 1f1b M=1" pred=$default_pred meas=$default_meas; fi
      ratio=$(python3 -c "print('%.3f' % ($meas / $share / $pred))")
      if [[ $run == auto ]]; then auto_ratios+=("$ratio"); else default_ratios+=("$ratio"); fi
      printf "%-9s %5s %-8s %-32s %9s %9s %6s %9s %9s\n" "$model" "$round" "$run" "$plan" \
        "$pred" "$meas" "$share" "$(python3 -c "print('%.1f' % ($meas / $share))")" "$ratio"
    done
    speedups+=("$(python3 -c "print('%.3f' % ($auto_meas / $default_meas))")")
  done
  printf "%-9s median over %d rounds: auto measured/predicted %s, default %s; auto/default measured %s (rounds: %s)\n" \
    "$model" "$rounds" "$(median "${auto_ratios[@]}")" "$(median "${default_ratios[@]}")" \
    "$(median "${speedups[@]}")" "${speedups[*]}"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
