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
