#!/usr/bin/env bash
# Builds everything (with -Werror) and runs every test, then each fuzz target for FUZZ_SECONDS
# (default 30; 0 skips them) in its own clang build (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# --timeout: a hung test fails the run instead of stalling it (the longest take ~30 s).
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure --timeout 600 -j"$(nproc)"
if [[ "${FUZZ_SECONDS:-30}" != 0 ]]; then
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
fi
