#!/usr/bin/env bash
# Installs every Debian package that pipetrain's build, tests, benchmarks and demo need.
# Idempotent: packages already present are left alone; safe to run on every invocation.
set -euo pipefail

packages=(
  cmake ninja-build ccache g++ pkg-config
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libssl-dev openssl
  nlohmann-json3-dev zlib1g-dev python3 iproute2
  # The Python client (client/python), its tests and example.
  python3-grpcio python3-protobuf python3-numpy python3-venv python3-pip python3-setuptools
  python3-wheel python3-pytest python3-tqdm python3-matplotlib
  # Metrics (prometheus-cpp) and logs (spdlog) of the daemons.
  prometheus-cpp-dev libspdlog-dev
  # Tests: a real Prometheus scraping the daemons (+ promtool), and containers built and run
  # from local files (podman with runc); the .deb is checked with dpkg-deb.
  prometheus curl podman runc dpkg-dev
  # scripts/fuzz.sh and scripts/sanitize.sh: clang with libFuzzer and the sanitizer runtimes.
  clang libclang-rt-dev libomp-dev
)

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
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
