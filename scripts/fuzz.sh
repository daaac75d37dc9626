#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan; tests/fuzz/CMakeLists.txt) into build-fuzz/ and
# runs each for SECONDS (default 30) from its seed corpus tests/fuzz/<target>/. Any crash, leak,
# sanitizer report or timeout fails the run (exit 1); the crashing input is kept under
# build-fuzz/fuzz-artifacts/. New coverage-increasing inputs go to build-fuzz/fuzz-corpus/<target>/
# (not to the seeds). Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   Env: FUZZ_BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
seconds=${1:-30}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(frame_decoder safetensors job_spec csv npy partition)
fi
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPIPETRAIN_FUZZ=ON -DPIPETRAIN_BUILD_BENCH=OFF >/dev/null
ninja -C "$build_dir" -j"$(nproc)" "${targets[@]/%/_fuzzer}"

failed=()
for t in "${targets[@]}"; do
  corpus="$build_dir/fuzz-corpus/$t"
  artifacts="$build_dir/fuzz-artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  log="$build_dir/fuzz-$t.log"
  echo "fuzz: $t for ${seconds}s (log $log)" >&2
  # -timeout: one input taking longer is a failure (a hang); -rss_limit_mb bounds memory.
  if "$build_dir/tests/fuzz/${t}_fuzzer" -max_total_time="$seconds" -timeout=20 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" \
      "$corpus" "tests/fuzz/$t" >"$log" 2>&1; then
    echo "fuzz: $t ok: $(grep -E '^(stat::number_of_executed_units|Done)' "$log" | tail -1)" >&2
  else
    echo "fuzz: $t FAILED; the input is under $artifacts; the end of $log:" >&2
    tail -40 "$log" >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]} > 0)); then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s each without a crash" >&2
