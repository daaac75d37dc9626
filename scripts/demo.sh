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

# The math's instruction-set level: only the one this CPU runs best (the default build has both
# x86-64-v3 and x86-64-v4, for binaries that move between hosts; docs/performance.md).
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true) "
has_flags() {
  local f
  for f in "$@"; do [[ $cpu_flags == *" $f "* ]] || return 1; done
}
arch_args=()
level=""
if [[ $(uname -m) == x86_64 ]]; then
  if has_flags avx512f avx512bw avx512cd avx512dq avx512vl avx2 fma bmi1 bmi2 f16c movbe; then
    level=x86-64-v4
  elif has_flags avx2 fma bmi1 bmi2 f16c movbe; then
    level=x86-64-v3
  else
    level=generic
    arch_args=(-DPIPETRAIN_ARCH=x86-64)
  fi
  arch_args+=(-DPIPETRAIN_ISA_LEVELS=$level)
fi

# A unity build (CMAKE_UNITY_BUILD, one unit per library: BATCH_SIZE 0) parses the gRPC, Protobuf
# and Abseil headers once per library instead of once per source file: 40% less CPU than a build
# of one unit per file (docs/deploy.md, "The demo's packages and time"). The math, whose code sets
# the speed of training, keeps one unit per source as in every build (common/math/CMakeLists.txt).
build_dir=${DEMO_BUILD_DIR:-build-demo}
phase "2/4 configuring: a Release unity build of the three binaries in $build_dir/ (no tests," \
  "no benchmarks${level:+, the math for $level only})..."
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_BUILD_TESTS=OFF \
  -DPIPETRAIN_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=0 \
  "${arch_args[@]}" >/dev/null

phase "3/4 building coordinator, stage_worker and pipetrain ($(nproc) compile jobs)..."
(cd "$build_dir" && NINJA_STATUS="demo build [%f/%t] " ninja coordinator stage_worker pipetrain)

bin=$build_dir/client/pipetrain
checkpoint=$(mktemp -d)
trap 'rm -rf "$checkpoint"' EXIT
phase "4/4 starting a coordinator and 2 stage workers (pipetrain local) and training..."
"$bin" local --stages 2 --schedule 1f1b --model examples/mlp_digits.textproto --data digits \
  --steps 300 --batch 64 --microbatches 4 --seed 1 --optimizer adamw:lr=1e-2 --log-every 25 \
  --save "$checkpoint" "$@"
"$bin" evaluate --resume "$checkpoint" --eval-samples 0
phase "done"
