#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU: builds with CUDA (FLOW_CUDA=ON), runs the CUDA specs,
# then the GPU benchmarks (matmul vs cuBLAS, GPT-2 124M step vs PyTorch when torch is installed),
# within about 8 minutes. Everything is also logged to $OUT/gpu-check.log when OUT is set.
#   scripts/gpu-check.sh            FLOW_BUILD picks the build folder (default build-gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${FLOW_BUILD:-build-gpu}
LOG=${OUT:+$OUT/gpu-check.log}
LOG=${LOG:-/dev/null}
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
run configure 60 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFLOW_CUDA=ON || exit 1
run build 240 cmake --build "$BUILD" -j"$(nproc)" || exit 1
if ! run gpu 30 "$BUILD/flowlua" -e 'local f = require "flow"
  print("cuda devices: " .. f.cuda.device_count() .. (f.cuda.is_available() and "" or " (" .. f.cuda.unavailable_reason() .. ")"))
  os.exit(f.cuda.is_available() and 0 or 1)'; then
  say "gpu-check: no usable GPU; the CUDA specs and benchmarks below will only be skipped"
fi
run specs 120 "$BUILD/flowlua" spec/run.lua spec/cuda_spec.lua
# global tensors on cuda placements: at 1 rank, then 2 ranks (over NCCL with 2+ GPUs; on one GPU the
# ranks share it, NCCL is off and CUDA shards are boxed through the host over MPI)
run cuda_global_1 60 "$BUILD/flowlua" spec/run.lua spec/mpi/cuda_global_spec.lua
if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe -np 2)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  run cuda_global_2 90 "${mpi[@]}" "$BUILD/flowlua" spec/run.lua spec/mpi/cuda_global_spec.lua
fi
run train_gpt_cuda 120 "$BUILD/flowlua" scripts/train_gpt.lua --device cuda --amp bf16 --steps 300 --log-every 100 \
  --eval-every 300 --sample-len 40
run gpu_matmul 90 "$BUILD/flowlua" scripts/bench/gpu_matmul.lua 8192 20
run gpt_gpu_small 60 "$BUILD/flowlua" scripts/bench/gpt_gpu.lua --layers 2 --dim 128 --heads 4 --seq 128 --batch 4 \
  --vocab 256 --steps 3 --warmup 1
run gpt_gpu 150 "$BUILD/flowlua" scripts/bench/gpt_gpu.lua --steps 5 --warmup 1
flow_tps=$(grep -Eo 'gpt_gpu: .*tokens/s [0-9]+' "$LOG" | grep -Eo '[0-9]+$' | tail -1)
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
