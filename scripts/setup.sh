#!/usr/bin/env bash
# Set-up on a fresh Debian machine: installs the Debian packages flowlua needs (only those
# missing), then configures and builds into ${FLOW_BUILD:-build}. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config lua5.4 liblua5.4-dev lua-busted lua-filesystem
          libopenmpi-dev openmpi-bin libopenblas-dev libdnnl-dev libreadline-dev zlib1g-dev jargon-text lua-argparse
          python3-torch dataset-fashion-mnist)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD=${FLOW_BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" 2>&1 | grep -Ev '^\[|^-- |Built target|Scanning|Consolidate' || true
test -x "$BUILD/flowlua" || { echo "setup: build failed" >&2; exit 1; }
echo "setup: built $BUILD/flowlua"
