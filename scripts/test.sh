#!/usr/bin/env bash
# Builds everything (with -Werror) and runs every test; then checks that the demo's unity build
# (scripts/demo_build.sh, configured exactly as scripts/demo.sh does) still compiles its three
# binaries, in build-demo-check/ (DEMO_CHECK_BUILD_DIR); then runs each fuzz target for
# FUZZ_SECONDS (default 30; 0 skips them) in its own clang build (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# --timeout: a hung test fails the run instead of stalling it (the longest take ~30 s).
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure --timeout 600 -j"$(nproc)"
# A unity build compiles each library as one unit: two of its sources that define the same
# file-local name (anonymous namespace, static) break it, and only it (docs/deploy.md).
source scripts/demo_build.sh
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
demo_check_dir=${DEMO_CHECK_BUILD_DIR:-build-demo-check}
demo_configure . "$demo_check_dir" >/dev/null
ninja -C "$demo_check_dir" -j"$(nproc)" "${DEMO_TARGETS[@]}"
if [[ "${FUZZ_SECONDS:-30}" != 0 ]]; then
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
fi
