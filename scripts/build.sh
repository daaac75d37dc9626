#!/usr/bin/env bash
# Installs the dependencies (scripts/setup.sh), configures and builds pipetrain into build/.
# Usage: scripts/build.sh [ninja targets...]   Env: BUILD_DIR (default build), BUILD_TYPE (Release).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Paths relative to the checkout, so clones and worktrees share one compiler cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DPIPETRAIN_WERROR=ON >/dev/null
jobs=$(nproc)
ninja -C "$build_dir" -j"$jobs" "$@"
