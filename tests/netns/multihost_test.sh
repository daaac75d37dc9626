#!/usr/bin/env bash
# Multi-host test: the coordinator, the client and each of S stage workers run in their own
# network namespace, joined by veth pairs to a bridge in a separate "switch" namespace, with
# addresses in 198.18.0.0/24. Loopback stays DOWN in every namespace, so no process can take a
# loopback shortcut: every byte crosses a veth pair. Trains the digits MLP with `pipetrain train`
# and checks every step's loss and every checkpoint file against `pipetrain reference`, bit for bit.
# The client evaluates the job's weights every 3 steps and at the end (--eval-every,
# --eval-samples) through the coordinator's Evaluate RPC from its own namespace: its evaluation
# lines must be the reference's, and the last one `pipetrain evaluate`'s on the saved checkpoint.
#
# TRANSPORT "tls" (default): mTLS on every hop with a test CA (scripts/make_test_certs.sh), each
# worker's certificate naming its address; "insecure": plaintext, the daemons started with
# --insecure (they refuse a non-loopback address without TLS otherwise).
#
# Usage: multihost_test.sh BUILD_DIR SOURCE_DIR [STAGES] [SCHEDULE] [TRANSPORT]
# Exits 77 (CTest: skipped) with a message where network namespaces are not permitted.
set -euo pipefail

build=$1
src=$2
stages=${3:-3}
schedule=${4:-1f1b}
transport=${5:-tls}
pipetrain=$build/client/pipetrain
coordinator=$build/server/coordinator/coordinator
worker=$build/server/worker/stage_worker

tag="pt$$"
probe="${tag}probe"
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! ip netns add "$probe" 2>/dev/null; then
  echo "SKIP: network namespaces are not permitted here (needs root, iproute2 and CAP_NET_ADMIN)"
  exit 77
fi
ip netns del "$probe"

# shellcheck source=tests/netns/hosts.sh
source "$src/tests/netns/hosts.sh"

add_host coord 198.18.0.1
add_host client 198.18.0.2
for ((i = 0; i < stages; i++)); do add_host "w$i" "198.18.0.$((10 + i))"; done

# Loopback is down everywhere: prove it.
for n in "${namespaces[@]}"; do
  if ip -n "$n" -o link show lo | grep -q "state UP"; then
    echo "FAIL: loopback is up in $n"
    exit 1
  fi
done

# tls_flags NAME: the --tls-* flags of certificate NAME, or --insecure for plaintext.
client_tls=()
tls_flags() {
  if [[ $transport == tls ]]; then
    echo "--tls-cert=$work/certs/$1.pem --tls-key=$work/certs/$1.key --tls-ca=$work/certs/ca.pem"
  elif [[ $1 != client ]]; then
    echo "--insecure"
  fi
}
if [[ $transport == tls ]]; then
  hosts=(198.18.0.1)
  for ((i = 0; i < stages; i++)); do hosts+=("198.18.0.$((10 + i))"); done
  WORKERS=$stages bash "$src/scripts/make_test_certs.sh" "$work/certs" "${hosts[@]}" 2>/dev/null
fi
read -r -a client_tls <<<"$(tls_flags client)"

# shellcheck disable=SC2046  # tls_flags is a list of flags without spaces inside
ip netns exec "${tag}coord" "$coordinator" --listen 198.18.0.1:7070 --checkpoint-root "$work" \
  $(tls_flags coordinator) >"$work/coordinator.log" 2>&1 &
pids+=($!)
for ((i = 0; i < stages; i++)); do
  # shellcheck disable=SC2046
  ip netns exec "${tag}w$i" "$worker" --coordinator 198.18.0.1:7070 \
    --listen "198.18.0.$((10 + i)):7100" --name "worker-$i" $(tls_flags "worker-$i") \
    >"$work/w$i.log" 2>&1 &
  pids+=($!)
done

args=(--model "$src/examples/mlp_digits.textproto" --data digits --data-dir "$src/data"
      --batch 32 --microbatches 4 --steps 6 --seed 11 --optimizer "adamw:lr=1e-2,clip_norm=1"
      --json)
eval_args=(--eval-every 3 --eval-samples 300)
"$pipetrain" reference "${args[@]}" "${eval_args[@]}" --save "$work/reference" >"$work/reference.out"

# Workers register asynchronously: retry while the coordinator answers that some are missing
# (bounded: 300 tries, 0.1 s apart).
ok=0
for ((try = 0; try < 300; try++)); do
  if ip netns exec "${tag}client" "$pipetrain" train --coordinator 198.18.0.1:7070 \
       "${client_tls[@]}" --stages "$stages" --schedule "$schedule" "${args[@]}" "${eval_args[@]}" \
       --save "$work/pipeline" \
       >"$work/train.out" 2>"$work/train.err"; then
    ok=1
    break
  fi
  if ! grep -q "FAILED_PRECONDITION" "$work/train.err"; then break; fi
  sleep 0.1
done
if [[ $ok -ne 1 ]]; then
  echo "FAIL: pipetrain train failed:"
  cat "$work/train.err" "$work/coordinator.log"
  exit 1
fi

python3 - "$work/reference.out" "$work/train.out" <<'PY'
import json, sys
def losses(path):
    out = []
    for line in open(path):
        j = json.loads(line)
        if "step" in j:
            out.append((j["step"], j["loss"]))
    return out
ref, run = losses(sys.argv[1]), losses(sys.argv[2])
if not ref or ref != run:
    print("FAIL: losses differ\nreference:", ref, "\npipeline: ", run)
    sys.exit(1)
print("losses equal over", len(ref), "steps")
PY

# The evaluations through the service: the reference's lines (steps 3 and 6, then the final one),
# and the final one is `pipetrain evaluate`'s of the checkpoint the job saved.
"$pipetrain" evaluate --resume "$work/pipeline" --data-dir "$src/data" --eval-samples 300 --json \
  >"$work/evaluate.out"
python3 - "$work/reference.out" "$work/train.out" "$work/evaluate.out" <<'PY'
import sys
def evals(path):
    return [line.strip() for line in open(path) if line.startswith('{"eval_')]
ref, run, checkpoint = evals(sys.argv[1]), evals(sys.argv[2]), evals(sys.argv[3])
if len(ref) != 3 or ref != run:
    print("FAIL: evaluation lines differ\nreference:", ref, "\npipeline: ", run)
    sys.exit(1)
if checkpoint != ref[-1:]:
    print("FAIL: pipetrain evaluate of the checkpoint:", checkpoint, "\nthe run's:", ref[-1])
    sys.exit(1)
print("evaluations through the service equal:", len(run))
PY

for f in "$work"/reference/layer-*.safetensors; do
  if ! cmp -s "$f" "$work/pipeline/$(basename "$f")"; then
    echo "FAIL: $(basename "$f") differs between the reference and the pipeline"
    exit 1
  fi
done
echo "checkpoint files identical: $(ls "$work"/reference/layer-*.safetensors | wc -l)"
