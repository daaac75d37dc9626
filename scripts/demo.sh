#!/usr/bin/env bash
# The demo: builds pipetrain and its daemons, then `pipetrain local` starts a coordinator and two
# stage workers on this machine and trains the bundled digits MLP through a 1F1B pipeline,
# printing the loss falling; finally `pipetrain evaluate` reports the held-out accuracy of the
# trained weights. Extra arguments go to `pipetrain local` (e.g. --stages 4 --schedule zb-v).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh pipetrain coordinator stage_worker >/dev/null
bin=${BUILD_DIR:-build}/client/pipetrain
checkpoint=$(mktemp -d)
trap 'rm -rf "$checkpoint"' EXIT
"$bin" local --stages 2 --schedule 1f1b --model examples/mlp_digits.textproto --data digits \
  --steps 300 --batch 64 --microbatches 4 --seed 1 --optimizer adamw:lr=1e-2 --log-every 25 \
  --save "$checkpoint" "$@"
"$bin" evaluate --checkpoint "$checkpoint" --eval-samples 0
