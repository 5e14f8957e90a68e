#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU: builds with CUDA (FLOW_CUDA=ON), runs the CUDA specs,
# then the GPU benchmarks (matmul vs cuBLAS, GPT-2 124M step vs PyTorch when torch is installed),
# within about 8 minutes. Everything is also logged to $OUT/gpu-check.log when OUT is set.
#   scripts/gpu-check.sh            FLOW_BUILD picks the build folder (default build-gpu)
# The GPU machine's image has CUDA, cmake and PyTorch but maybe not Lua, OpenBLAS, busted or MPI:
# run scripts/gpu-deps.sh here first and carry .gpu-deps with the device call, e.g.
#   run(command="scripts/gpu-check.sh", carry=[".gpu-deps"], timeout_s=540)
# Without a GPU (here) everything still builds and the GPU parts skip: a dry run of the script.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${FLOW_BUILD:-build-gpu}
LOG=${OUT:+$OUT/gpu-check.log}
LOG=${LOG:-$(mktemp /tmp/gpu-check.XXXXXX.log)}
export OPENBLAS_NUM_THREADS=1
status=0

say() { echo "$@" | tee -a "$LOG"; }
run() { # label, timeout seconds, command...
  local label=$1 limit=$2; shift 2
  say "== $label: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  say "== $label: exit $rc after $((SECONDS - t0)) s"
  [ "$rc" -ne 0 ] && status=1
  return "$rc"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"

# ---- what a bare CUDA image may lack -----------------------------------------------------------
# Lua 5.4, OpenBLAS, readline, zlib, pkg-config and busted: the .debs of scripts/gpu-deps.sh
# (carried as .gpu-deps) are unpacked under /tmp/flow-deps and used instead (FLOW_USE_DEPS=1 forces
# that). No MPI: FLOW_MPI=OFF, one rank. NCCL and cuDNN: wherever they are (PyTorch's pip packages
# hold them when /usr/local/cuda does not).
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DFLOW_CUDA=ON)
system_deps() {
  pkg-config --exists lua5.4 openblas 2>/dev/null && [ -e /usr/include/readline/readline.h ] &&
    [ -e /usr/include/zlib.h ] && [ -e /usr/share/lua/5.1/busted/runner.lua ]
}
if [ "${FLOW_USE_DEPS:-0}" = 1 ] || ! system_deps; then
  if ! ls .gpu-deps/*.deb >/dev/null 2>&1; then
    say "gpu-check: Lua/OpenBLAS/busted are missing here and no .gpu-deps was carried (run scripts/gpu-deps.sh first)"
    exit 1
  fi
  P=/tmp/flow-deps
  rm -rf "$P" && mkdir -p "$P"
  for f in .gpu-deps/*.deb; do dpkg -x "$f" "$P"; done
  # absolute links point into / (libz.so -> /lib/...): point them into the prefix instead
  find "$P" -type l | while read -r l; do
    t=$(readlink "$l")
    case $t in /*) ln -sfn "$P$t" "$l" ;; esac
  done
  L=$P/usr/lib/x86_64-linux-gnu
  export PATH=$P/usr/bin:$PATH
  export LD_LIBRARY_PATH=$L:$L/openblas-pthread:$P/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$L/pkgconfig:$L/openblas-pthread/pkgconfig PKG_CONFIG_SYSROOT_DIR=$P
  export CFLAGS="-I$P/usr/include ${CFLAGS:-}"
  export LUA_PATH="$P/usr/share/lua/5.4/?.lua;$P/usr/share/lua/5.4/?/init.lua;$P/usr/share/lua/5.1/?.lua;$P/usr/share/lua/5.1/?/init.lua;;"
  export LUA_CPATH="$L/lua/5.4/?.so;;"
  cmake_args+=(-DPKG_CONFIG_EXECUTABLE="$P/usr/bin/pkgconf" -DCMAKE_PREFIX_PATH="$P/usr"
               -DCMAKE_LIBRARY_PATH="$L;$P/lib/x86_64-linux-gnu")
  say "gpu-check: using the carried packages unpacked in $P"
fi
if ! command -v mpicc >/dev/null; then
  cmake_args+=(-DFLOW_MPI=OFF)
  say "gpu-check: no MPI here: a one-rank build (FLOW_MPI=OFF)"
fi
pysite=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
for lib in nccl cudnn; do
  LIB=$(echo "$lib" | tr a-z A-Z)
  h=$(find -L /usr/local/cuda/include /usr/include $pysite -maxdepth 6 -name "$lib.h" 2>/dev/null | head -1)
  so=$(find -L /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu $pysite -maxdepth 6 -name "lib$lib.so*" 2>/dev/null | sort | head -1)
  if [ -n "$h" ] && [ -n "$so" ]; then
    cmake_args+=(-DFLOW_${LIB}_INCLUDE="$(dirname "$h")" -DFLOW_${LIB}_LIB="$so")
    export LD_LIBRARY_PATH=$(dirname "$so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "gpu-check: $lib: $h, $so"
  else
    say "gpu-check: $lib not found (header '$h', library '$so')"
  fi
done

run configure 60 cmake -S . -B "$BUILD" "${cmake_args[@]}" || exit 1
run build 240 cmake --build "$BUILD" -j"$(nproc)" || exit 1
# the CUDA libraries are the plugin's (flow_cuda.so, loaded on first CUDA use), not flowlua's
ldd "$BUILD/flowlua" "$BUILD/flow_cuda.so" | grep -E ':$|not found|lua|blas|nccl|cudnn|cublas|cudart|mpi' | tee -a "$LOG"
gpu=1
if ! run gpu 30 "$BUILD/flowlua" -e 'local f = require "flow"
  print("cuda devices: " .. f.cuda.device_count() .. (f.cuda.is_available() and "" or " (" .. f.cuda.unavailable_reason() .. ")"))
  os.exit(f.cuda.is_available() and 0 or 1)'; then
  say "gpu-check: no usable GPU; the CUDA specs and benchmarks below will only be skipped"
  gpu=0
fi
run specs 120 "$BUILD/flowlua" spec/run.lua spec/cuda_spec.lua
# global tensors on cuda placements: at 1 rank, then 2 ranks (over NCCL with 2+ GPUs; on one GPU the
# ranks share it, NCCL is off and CUDA shards are boxed through the host over MPI)
run cuda_global_1 60 "$BUILD/flowlua" spec/run.lua spec/mpi/cuda_global_spec.lua
if command -v mpirun >/dev/null && ! grep -q '^FLOW_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt"; then
  mpi=(mpirun --oversubscribe -np 2)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  run cuda_global_2 90 "${mpi[@]}" "$BUILD/flowlua" spec/run.lua spec/mpi/cuda_global_spec.lua
fi
[ "$gpu" = 1 ] && run train_gpt_cuda 120 "$BUILD/flowlua" scripts/train_gpt.lua --device cuda --amp bf16 --steps 300 --log-every 100 \
  --eval-every 300 --sample-len 40
# graph mode (nn.Graph on the actor engine) against eager, the same model, bf16 autocast
[ "$gpu" = 1 ] && run train_gpt_cuda_graph 120 "$BUILD/flowlua" scripts/train_gpt.lua --device cuda --amp bf16 --mode graph \
  --steps 300 --log-every 100 --eval-every 300 --sample-len 40
run gpu_matmul 90 "$BUILD/flowlua" scripts/bench/gpu_matmul.lua 8192 20
run gpt_gpu_small 60 "$BUILD/flowlua" scripts/bench/gpt_gpu.lua --layers 2 --dim 128 --heads 4 --seq 128 --batch 4 \
  --vocab 256 --steps 3 --warmup 1
# tokens/s printed in the log after line $1
tps() { tail -n +"$(($1 + 1))" "$LOG" | grep -Eo 'gpt_gpu: .*tokens/s [0-9]+' | grep -Eo '[0-9]+$' | tail -1; }
mark=$(wc -l < "$LOG")
run gpt_gpu 150 "$BUILD/flowlua" scripts/bench/gpt_gpu.lua --steps 5 --warmup 1
fused_tps=$(tps "$mark")
# the same step with attention as cuBLAS matmuls + softmax (flow.backends.attention = "math")
mark=$(wc -l < "$LOG")
run gpt_gpu_math 120 "$BUILD/flowlua" scripts/bench/gpt_gpu.lua --steps 5 --warmup 1 --attention math
math_tps=$(tps "$mark")
flow_tps=$(printf '%s\n%s\n' "${fused_tps:-0}" "${math_tps:-0}" | sort -n | tail -1)
[ "${flow_tps:-0}" = 0 ] && flow_tps=
say "gpt tokens/s: fused attention ${fused_tps:-?}, math attention ${math_tps:-?}"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  run gpt_torch_ref 120 python3 scripts/bench/gpt_torch_ref.py --steps 5 --warmup 2
  ref_tps=$(grep -Eo 'gpt_torch_ref: .*tokens/s [0-9]+' "$LOG" | grep -Eo '[0-9]+$' | tail -1)
  if [ -n "${flow_tps:-}" ] && [ -n "${ref_tps:-}" ]; then
    say "gpt tokens/s ratio flowlua/PyTorch: $(awk -v a="$flow_tps" -v b="$ref_tps" 'BEGIN {printf "%.3f", a / b}')"
  fi
else
  say "gpt_torch_ref: skipped (PyTorch with CUDA is not installed)"
fi
say "gpu-check: $([ $status -eq 0 ] && echo ok || echo FAILED) in $SECONDS s"
exit $status
