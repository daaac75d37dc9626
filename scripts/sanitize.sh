#!/usr/bin/env bash
# Builds pipetrain with clang and sanitizers and runs the unit and integration tests under them
# (docs/reliability.md, "Sanitizers"):
#   scripts/sanitize.sh address [CTEST_ARGS...]   ASan + UBSan into build-asan/
#   scripts/sanitize.sh thread  [CTEST_ARGS...]   TSan into build-tsan/
# Any sanitizer report fails the test that triggered it (in a test binary or in a daemon it
# started). Extra arguments go to ctest (e.g. -R service_test). Env: SANITIZE_BUILD_DIR;
# SANITIZE_TARGETS (ninja targets to build, default all: with -R, name the tests and the binaries
# they start).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
case "$mode" in
  address) default_dir=build-asan ;;
  thread) default_dir=build-tsan ;;
  *)
    echo "usage: scripts/sanitize.sh address|thread [ctest args...]" >&2
    exit 2
    ;;
esac
bash scripts/setup.sh
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
build_dir=${SANITIZE_BUILD_DIR:-$default_dir}
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPIPETRAIN_SANITIZE="$mode" -DPIPETRAIN_BUILD_BENCH=OFF >/dev/null
read -r -a targets <<<"${SANITIZE_TARGETS:-}"
ninja -C "$build_dir" -j"$(nproc)" "${targets[@]}"

supp="$PWD/scripts/sanitizers"
# Reports from the test binaries and from every daemon they start: fatal, with stacks.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
# Sanitized code runs 2-15x slower: the tests' own timeouts are generous, ctest's is raised.
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 1800 "$@"
