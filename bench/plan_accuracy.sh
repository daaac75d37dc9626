#!/usr/bin/env bash
# How close `pipetrain plan`'s predictions are, plan by plan: the TOP best plans of `pipetrain
# plan --local WORKERS --partition-by flops` for examples/gpt_char and the deep MLP (B=64), plus
# the plain 1F1B default (2 stages, one micro-batch), each run with `pipetrain local` (cut by
# FLOPs, as the prediction assumes), and its measured step (the median of steps WARMUP..STEPS; a
# run's first ~10 steps are slower) beside
# the predicted one: predicted / measured (1 is exact; below 1 the plan ran slower than
# predicted). Run on an idle host: the planner predicts the workers' speed when the CPUs are
# theirs. The load average before and after is printed.
# Usage: bench/plan_accuracy.sh [BUILD_DIR] [STEPS] [TOP] [WORKERS]   Env: WARMUP (10).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-60}
top=${3:-6}
warmup=${WARMUP:-10}
workers=${4:-2}
pipetrain=$build/client/pipetrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
printf "%-9s %-34s %10s %10s %9s\n" model plan "pred ms" "meas ms" pred/meas
for model in gpt_char deep_mlp; do
  flags=(--model "examples/$model.textproto" --batch 64 --seed 1)
  [[ $model == deep_mlp ]] && flags+=(--data synthetic --optimizer sgd:lr=0.01)
  "$pipetrain" plan --local "$workers" "${flags[@]}" --partition-by flops --json --top 1000 \
    >"$out/plans.json"
  # The TOP best plans, then the default: "R S schedule V M predicted_ms" per line.
  python3 - "$out/plans.json" "$top" >"$out/chosen" <<'PY'
import json, sys
plans = [json.loads(l) for l in open(sys.argv[1])]
key = lambda p: (p["replicas"], p["stages"], p["schedule"], p["virtual"], p["microbatches"])
chosen = plans[: int(sys.argv[2])]
chosen += [p for p in plans if key(p) == (1, 2, "1f1b", 1, 1) and p not in chosen]
for p in chosen:
    print(*key(p), "%.2f" % (p["step_seconds"] * 1e3))
PY
  while read -r r s kind v m pred; do
    "$pipetrain" local "${flags[@]}" --replicas "$r" --stages "$s" --schedule "$kind" \
      --virtual "$v" --microbatches "$m" --steps "$steps" --json >"$out/run.json" 2>/dev/null
    meas=$(python3 - "$out/run.json" "$warmup" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1])
      if l.startswith("{") and '"step_ms"' in l and json.loads(l)["step"] >= int(sys.argv[2])]
print("%.2f" % statistics.median(ms))
PY
)
    printf "%-9s %-34s %10s %10s %9s\n" "$model" "R=$r S=$s $kind V=$v M=$m" "$pred" "$meas" \
      "$(python3 -c "print('%.3f' % ($pred / $meas))")"
  done <"$out/chosen"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
