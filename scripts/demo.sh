#!/usr/bin/env bash
# The demo: builds pipetrain and trains the bundled digits MLP, printing the loss going down and
# the held-out accuracy. Extra arguments are passed to `pipetrain reference`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh pipetrain >/dev/null
exec "${BUILD_DIR:-build}/client/pipetrain" reference --model examples/mlp_digits.textproto \
  --data digits --steps 300 --batch 64 --microbatches 4 --seed 1 --optimizer adamw:lr=1e-2 \
  --log-every 25 "$@"
