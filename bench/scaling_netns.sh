#!/usr/bin/env bash
# The link model checked on hosts of their own (docs/scaling.md, "How close the model is"): the
# coordinator, the client and two stage workers each in a network namespace, joined through a
# bridge in a "switch" namespace (addresses in 198.18.0.0/24, loopback down, plaintext), every
# host's egress limited by `tc tbf` to RATE. For each RATE, `pipetrain plan --coordinator`
# predicts the plan of 2 stages, 1f1b, M micro-batches with --link-bandwidth RATE (cut by FLOPs,
# as the run is), then `pipetrain train` runs it: a CSV row per rate with the prediction and the
# measured samples/s (B over the median step of steps 3..STEPS). netem delays do not work here,
# so the latency stays the veth's. MODEL=gpt_char (default) or deep_mlp.
# Usage: [MODEL=deep_mlp] bench/scaling_netns.sh BUILD_DIR OUT_CSV [STEPS] [RATE_MBIT ...]
# Exits 77 with a message where network namespaces are not permitted.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1
csv=$2
steps=${3:-20}
shift 3 || shift $#
rates=("$@")
[[ ${#rates[@]} -gt 0 ]] || rates=(20 100 1000)
pipetrain=$build/client/pipetrain
name=${MODEL:-gpt_char}
model_flags=(--model "examples/$name.textproto")
case $name in
  gpt_char) ;;
  deep_mlp) model_flags+=(--data synthetic --optimizer sgd:lr=0.01) ;;
  *) echo "MODEL must be gpt_char or deep_mlp, got '$name'"; exit 2 ;;
esac
batch=64
microbatches=8

tag="ps$$"
if [[ $(id -u) -ne 0 ]] || ! command -v tc >/dev/null || ! ip netns add "${tag}probe" 2>/dev/null
then
  echo "SKIP: network namespaces and tc are not permitted here (needs root and iproute2)"
  exit 77
fi
ip netns del "${tag}probe"

# shellcheck source=tests/netns/hosts.sh
source tests/netns/hosts.sh
add_host coord 198.18.0.1
add_host client 198.18.0.2
add_host w0 198.18.0.10
add_host w1 198.18.0.11

ip netns exec "${tag}coord" "$build/server/coordinator/coordinator" --insecure \
  --listen 198.18.0.1:7070 >"$work/coordinator.log" 2>&1 &
pids+=($!)
for i in 0 1; do
  ip netns exec "${tag}w$i" "$build/server/worker/stage_worker" --insecure \
    --coordinator 198.18.0.1:7070 --listen "198.18.0.$((10 + i)):7100" --name "worker-$i" \
    >"$work/w$i.log" 2>&1 &
  pids+=($!)
done

flags=(--coordinator 198.18.0.1:7070 "${model_flags[@]}" --batch "$batch" --seed 1)
echo "model,workers,stages,schedule,microbatches,rate,bytes_per_second,predicted,measured" >"$csv"
for rate in "${rates[@]}"; do
  bytes=$((rate * 125000))
  burst=$((bytes / 500 > 16384 ? bytes / 500 : 16384))
  for ns in coord client w0 w1; do
    ip netns exec "${tag}$ns" tc qdisc replace dev eth0 root tbf rate "${rate}mbit" \
      burst "$burst" latency 1s
  done
  # Workers register asynchronously: retry while the coordinator has too few idle ones
  # (bounded: 300 tries, 0.1 s apart).
  for ((try = 0; try < 300; try++)); do
    if ! ip netns exec "${tag}client" "$pipetrain" plan "${flags[@]}" --partition-by flops \
         --link-bandwidth "$bytes" --json --top 100000 >"$work/plans.json" 2>"$work/plan.err"; then
      grep -q "no idle worker" "$work/plan.err" || { cat "$work/plan.err"; exit 1; }
    elif grep -q '"stages":2' "$work/plans.json"; then
      break
    fi
    sleep 0.1
  done
  predicted=$(python3 - "$work/plans.json" "$microbatches" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    p = json.loads(l)
    if (p["replicas"], p["stages"], p["schedule"], p["virtual"], p["microbatches"]) == \
            (1, 2, "1f1b", 1, int(sys.argv[2])):
        print("%.1f" % p["samples_per_second"])
        break
PY
)
  ip netns exec "${tag}client" "$pipetrain" train "${flags[@]}" --stages 2 --schedule 1f1b \
    --microbatches "$microbatches" --steps "$steps" --json >"$work/train.json" 2>"$work/train.err"
  measured=$(python3 - "$work/train.json" "$batch" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1])
      if l.startswith("{") and '"step_ms"' in l and json.loads(l)["step"] >= 3]
print("%.1f" % (int(sys.argv[2]) * 1000 / statistics.median(ms)))
PY
)
  echo "$name,2,2,1f1b,$microbatches,${rate}mbit,$bytes,$predicted,$measured" | tee -a "$csv"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
