-- Boxing benchmark: all-reduce (P->B), all-gather (S(0)->B), reduce-scatter (P->S(0)) and
-- all-to-all (S(0)->S(1)) through to_global on 16 MB tensors, against the raw MPI collective on
-- buffers of the same sizes in the same run. Prints time per call and ratio = raw / to_global
-- (1.0 = no overhead; target >= 0.95).
-- Run: mpirun -np 2 flowlua scripts/bench/boxing.lua [MB] [reps]
local flow = require "flow"
local S, B, PS = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum

local mb, reps = tonumber(arg and arg[1]) or 16, tonumber(arg and arg[2]) or 30
local p = flow.world_size()
local ranks = {}
for i = 0, p - 1 do ranks[#ranks + 1] = i end
local P = flow.placement("cpu", ranks)
local n = mb * 1024 * 1024 // 4 // (p * p) * (p * p) -- elements of the logical tensor
local rows = p * 64
local cols = n // rows

-- best of reps for each, the two interleaved so both see the same machine load; every call is
-- fenced by barriers so all ranks time the same collective
local function time2(f, g)
  f(); g()
  local bf, bg = math.huge, math.huge
  for _ = 1, reps do
    for k, fn in ipairs({ f, g }) do
      flow.barrier()
      local t0 = flow.now()
      fn()
      local dt = flow.now() - t0
      if k == 1 then bf = math.min(bf, dt) else bg = math.min(bg, dt) end
    end
  end
  return bf, bg
end

local function case(name, collective, from, to, send_n, recv_n)
  local x = flow.ones({ rows, cols }, { placement = P, sbp = from })
  local send, recv = flow.ones(send_n), flow.zeros(recv_n)
  local t_flow, t_raw = time2(function() x:to_global(P, to):free() end, function() flow._mpi(collective, send, recv) end)
  print(("%-15s %-12s %8.2f ms  raw MPI %8.2f ms  ratio %.3f"):format(name, tostring(from) .. "->" .. tostring(to),
    t_flow * 1e3, t_raw * 1e3, t_raw / t_flow))
end

print(("boxing on %d ranks, %d MB logical tensors (%d x %d float32), best of %d"):format(p, mb, rows, cols, reps))
case("all-reduce", "allreduce", PS, B, { n }, { n })
case("all-gather", "allgather", S(0), B, { n // p }, { n })
case("reduce-scatter", "reduce_scatter", PS, S(0), { n }, { n // p })
-- S(0)->S(1) re-lays the data out; raw MPI doing the same (strided send blocks, MPI_Alltoallw) is
-- the fair reference; the contiguous MPI_Alltoall of the same byte count (no re-layout) is shown too
case("all-to-all", "alltoall_s0s1", S(0), S(1), { rows // p, cols }, { rows, cols // p })
case("(contiguous)", "alltoall", S(0), S(1), { n // p }, { n // p })
