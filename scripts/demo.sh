#!/usr/bin/env bash
# The demo, from a fresh clone to a falling loss in minutes. Four phases, each announced on stderr
# with the time since the start:
#   1. the packages the three binaries need (scripts/setup.sh --demo; nothing when present);
#   2. configures a Release build of the binaries alone into build-demo/ (DEMO_BUILD_DIR): no
#      tests, no benchmarks, the math for this CPU's instruction-set level only, and a unity build
#      (each library compiled as one unit);
#   3. builds coordinator, stage_worker and pipetrain (ninja's [done/total] progress);
#   4. `pipetrain local` starts a coordinator and two stage workers on 127.0.0.1 and trains the
#      bundled digits MLP through a 1F1B pipeline, printing the loss falling; then `pipetrain
#      evaluate` reports the held-out accuracy of the trained weights.
# Extra arguments go to `pipetrain local` (e.g. --stages 4 --schedule zb-v). The build directory
# is the demo's own: build/ (scripts/build.sh, scripts/test.sh) keeps its tests and benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
# "demo [m:ss] TEXT" on stderr.
phase() {
  local t=$((SECONDS - start))
  printf 'demo [%d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*" >&2
}

phase "1/4 checking the $(bash scripts/setup.sh --demo --list | wc -l) packages the binaries" \
  "need (scripts/setup.sh --demo)..."
bash scripts/setup.sh --demo

# The build's configuration: scripts/demo_build.sh (shared with scripts/test.sh's check of it).
source scripts/demo_build.sh
level=$(demo_isa_level)
build_dir=${DEMO_BUILD_DIR:-build-demo}
phase "2/4 configuring: a Release unity build of the three binaries in $build_dir/ (no tests," \
  "no benchmarks${level:+, the math for $level only})..."
demo_configure . "$build_dir" >/dev/null

phase "3/4 building coordinator, stage_worker and pipetrain ($(nproc) compile jobs)..."
(cd "$build_dir" && NINJA_STATUS="demo build [%f/%t] " ninja "${DEMO_TARGETS[@]}")

bin=$build_dir/client/pipetrain
checkpoint=$(mktemp -d)
trap 'rm -rf "$checkpoint"' EXIT
phase "4/4 starting a coordinator and 2 stage workers (pipetrain local) and training..."
"$bin" local --stages 2 --schedule 1f1b --model examples/mlp_digits.textproto --data digits \
  --steps 300 --batch 64 --microbatches 4 --seed 1 --optimizer adamw:lr=1e-2 --log-every 25 \
  --save "$checkpoint" "$@"
"$bin" evaluate --resume "$checkpoint" --eval-samples 0
phase "done"
