# The demo's build, defined once: sourced by scripts/demo.sh (which builds and runs it),
# scripts/test.sh (which checks that it still compiles) and tests/integration/demo_packages_test.sh
# (which checks its packages), so that the three cannot drift apart. Defines:
#   demo_isa_level          prints the math's instruction-set level for this CPU ("" off x86-64);
#   demo_configure SRC DIR  configures SRC into DIR as the demo does (a Release unity build of the
#                           binaries alone: no tests, no benchmarks, the math for that level only);
#   DEMO_TARGETS            the three binaries the demo builds.
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this one
DEMO_TARGETS=(coordinator stage_worker pipetrain)

# The math's instruction-set level: only the one this CPU runs best (the default build has both
# x86-64-v3 and x86-64-v4, for binaries that move between hosts; docs/performance.md).
demo_isa_level() {
  [[ $(uname -m) == x86_64 ]] || return 0
  local cpu_flags
  cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true) "
  if _demo_cpu_has "$cpu_flags" avx512f avx512bw avx512cd avx512dq avx512vl avx2 fma bmi1 bmi2 \
    f16c movbe; then
    echo x86-64-v4
  elif _demo_cpu_has "$cpu_flags" avx2 fma bmi1 bmi2 f16c movbe; then
    echo x86-64-v3
  else
    echo generic
  fi
}

# True if the " "-delimited flag list $1 holds every flag after it.
_demo_cpu_has() {
  local flags=$1 f
  shift
  for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done
}

# A unity build (CMAKE_UNITY_BUILD, one unit per library: BATCH_SIZE 0) parses the gRPC, Protobuf
# and Abseil headers once per library instead of once per source file: 40% less CPU than a build
# of one unit per file (docs/deploy.md, "The demo's packages and time"). The math, whose code sets
# the speed of training, keeps one unit per source as in every build (common/math/CMakeLists.txt).
# A unity build fails where two sources of one library define the same file-local name, which no
# other build notices: scripts/test.sh builds this configuration too.
demo_configure() {
  local src=$1 dir=$2 level
  level=$(demo_isa_level)
  local arch_args=()
  if [[ $level == generic ]]; then arch_args=(-DPIPETRAIN_ARCH=x86-64); fi
  if [[ -n $level ]]; then arch_args+=("-DPIPETRAIN_ISA_LEVELS=$level"); fi
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_BUILD_TESTS=OFF \
    -DPIPETRAIN_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=0 \
    "${arch_args[@]}"
}
