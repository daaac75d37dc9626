#!/usr/bin/env bash
# Installs the Debian packages pipetrain needs, with apt-get. Idempotent: packages already present
# are left alone (and nothing is fetched when all are); safe to run on every invocation.
#
# Usage: scripts/setup.sh [--demo | --all] [--list]
#   --demo  only what configuring and building the three binaries (coordinator, stage_worker,
#           pipetrain) with -DPIPETRAIN_BUILD_TESTS=OFF -DPIPETRAIN_BUILD_BENCH=OFF needs, and
#           running them: scripts/demo.sh, deploy/Dockerfile
#   --all   (default) also the tests', benchmarks', Python client's, fuzzing's, sanitizers' and
#           deployment checks' packages: scripts/build.sh, scripts/test.sh
#   --list  print the chosen set, one package per line, and install nothing
set -euo pipefail

# The three binaries and their libraries (the top-level CMakeLists.txt and server/*/CMakeLists.txt
# find_package calls; OpenMP comes with g++, ld.bfd and objcopy with binutils).
# tests/integration/demo_packages_test.sh checks that a configure for the demo finds nothing
# outside these packages and what they depend on.
demo_packages=(
  cmake ninja-build g++
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libeigen3-dev libssl-dev nlohmann-json3-dev zlib1g-dev
  # Metrics (prometheus-cpp) and logs (spdlog) of the daemons.
  prometheus-cpp-dev libspdlog-dev
  # Tokenizers (SentencePiece): `pipetrain tokenizer`, text data sets with --tokenizer, and the
  # coordinator's check of a job's tokenizer.
  libsentencepiece-dev
)
# Everything else the repository uses.
more_packages=(
  ccache pkg-config
  # Tests and benchmarks; -DPIPETRAIN_USE_BLAS=ON; test certificates (scripts/make_test_certs.sh).
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev openssl python3 iproute2
  # The Python client (client/python), its tests and example.
  python3-grpcio python3-protobuf python3-numpy python3-venv python3-pip python3-setuptools
  python3-wheel python3-pytest python3-tqdm python3-matplotlib
  # PyTorch parity of the layers (tests/parity: the same models trained in plain PyTorch) and of
  # `pipetrain export`'s weights (tests/common/model/test_hf_export.py).
  python3-torch
  # The Python data module's tokenizer (pipetrain.data with a tokenizer directory).
  python3-sentencepiece
  # Tests: a real Prometheus scraping the daemons (+ promtool), and containers built and run
  # from local files (podman with runc); the .deb is checked with dpkg-deb.
  prometheus curl podman runc dpkg-dev
  # scripts/fuzz.sh and scripts/sanitize.sh: clang with libFuzzer and the sanitizer runtimes.
  clang libclang-rt-dev libomp-dev
)

set_name=all
list=false
for arg in "$@"; do
  case "$arg" in
    --demo) set_name=demo ;;
    --all) set_name=all ;;
    --list) list=true ;;
    -h | --help)
      awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
      exit 0
      ;;
    *)
      echo "setup: unknown argument '$arg' (usage: scripts/setup.sh [--demo | --all] [--list])" >&2
      exit 2
      ;;
  esac
done

packages=("${demo_packages[@]}")
if [[ $set_name == all ]]; then
  packages+=("${more_packages[@]}")
fi
if $list; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
echo "setup: updating the package lists (apt-get update)..." >&2
$SUDO apt-get update -qq
# What apt will install: the missing packages and the dependencies they bring.
total=$(apt-get install -s --no-install-recommends "${missing[@]}" 2>/dev/null | grep -c '^Inst ' ||
  true)
echo "setup: installing ${#missing[@]} packages (${total:-?} with their dependencies):" \
  "${missing[*]}..." >&2
start=$SECONDS
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed in $((SECONDS - start)) s" >&2
