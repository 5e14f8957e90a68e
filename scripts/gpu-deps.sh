#!/usr/bin/env bash
# Run here, before a device call: fetches the Debian packages flowlua needs to build and run its
# specs that a bare CUDA image may lack (Lua 5.4, OpenBLAS, readline, zlib, pkg-config, busted)
# into .gpu-deps/ (ignored by git, about 14 MB). Carry that folder with the call
# (carry: [".gpu-deps"]); scripts/gpu-check.sh unpacks it there when the system lacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(liblua5.4-0 liblua5.4-dev libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5
          libquadmath0 libreadline8 libreadline-dev zlib1g zlib1g-dev pkgconf pkgconf-bin libpkgconf3
          lua-busted lua-filesystem lua-term lua-system lua-say lua-luassert lua-penlight lua-mediator
          lua-cliargs lua-dkjson)
mkdir -p .gpu-deps
cd .gpu-deps
rm -f ./*.deb
apt-get download "${packages[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
echo "gpu-deps: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in .gpu-deps"
