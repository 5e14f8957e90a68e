/* Lua bindings: flow.cuda.*, flow.backends.allow_tf32, flow.autocast, and moving tensors between
 * devices and dtypes (t:to, t:cuda, t:cpu). The CUDA plugin loads on first CUDA use (core/cuda.h):
 * flow.cuda's functions, a cuda tensor or placement. */
#include <string.h>

#include <stdlib.h>

#include "../core/comm.h"
#include "../core/autocast.h"
#include "../core/cuda.h"
#include "../core/nccl.h"
#include "../ops/device.h"
#include "../ops/elementwise.h"
#include "bind.h"

static int raise_unavailable(lua_State *L, const char *fn) {
  return luaL_error(L, "%s: cuda is not available (%s)", fn, flow_cuda_unavailable_reason());
}

/* A device index from an optional argument: nil -> 0, an integer, or "cuda:N". */
static int opt_index(lua_State *L, int idx, const char *fn) {
  if (lua_isnoneornil(L, idx)) return 0;
  if (lua_type(L, idx) == LUA_TSTRING) {
    flow_device d;
    if (flow_device_parse(lua_tostring(L, idx), &d) != 0) return flow_lua_error(L);
    if (d.type != FLOW_CUDA) return luaL_error(L, "%s: expected a cuda device (got %s)", fn, lua_tostring(L, idx));
    return d.index;
  }
  return (int)luaL_checkinteger(L, idx);
}

static int f_is_available(lua_State *L) {
  lua_pushboolean(L, flow_cuda_is_available());
  return 1;
}

static int f_unavailable_reason(lua_State *L) {
  if (flow_cuda_is_available()) lua_pushnil(L);
  else lua_pushstring(L, flow_cuda_unavailable_reason());
  return 1;
}

static int f_device_count(lua_State *L) {
  lua_pushinteger(L, flow_cuda_device_count());
  return 1;
}

/* The backend with a GPU, or a Lua error naming fn. */
static const flow_cuda_backend *check_backend(lua_State *L, const char *fn) {
  const flow_cuda_backend *b = flow_cuda_backend_get();
  if (!b) raise_unavailable(L, fn);
  return b;
}

static int f_synchronize(lua_State *L) {
  const flow_cuda_backend *b = check_backend(L, "cuda.synchronize");
  int index = lua_isnoneornil(L, 1) ? -1 : opt_index(L, 1, "cuda.synchronize");
  if (b->synchronize(index) != 0) return flow_lua_error(L);
  return 0;
}

static int f_memory_stats(lua_State *L) {
  const flow_cuda_backend *b = check_backend(L, "cuda.memory_stats");
  flow_cuda_memory_stats s;
  if (b->memory_stats(opt_index(L, 1, "cuda.memory_stats"), &s) != 0) return flow_lua_error(L);
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, (lua_Integer)s.allocated); lua_setfield(L, -2, "allocated");
  lua_pushinteger(L, (lua_Integer)s.reserved); lua_setfield(L, -2, "reserved");
  lua_pushinteger(L, (lua_Integer)s.peak); lua_setfield(L, -2, "peak");
  lua_pushinteger(L, (lua_Integer)s.num_allocs); lua_setfield(L, -2, "num_allocs");
  lua_pushinteger(L, (lua_Integer)s.cache_hits); lua_setfield(L, -2, "cache_hits");
  lua_pushinteger(L, (lua_Integer)s.num_mallocs); lua_setfield(L, -2, "num_mallocs");
  return 1;
}

static int f_empty_cache(lua_State *L) {
  const flow_cuda_backend *b = check_backend(L, "cuda.empty_cache");
  int index = lua_isnoneornil(L, 1) ? -1 : opt_index(L, 1, "cuda.empty_cache");
  if (b->empty_cache(index) != 0) return flow_lua_error(L);
  return 0;
}

/* cuda._bench_gemm(a [m,k], b [k,n], c [m,n], iters) -> seconds per C = A B called straight on
 * cuBLAS (tf32 for float32 when flow.backends.allow_tf32): the reference for bench/gpu_matmul. */
static int f_bench_gemm(lua_State *L) {
  flow_tensor *a = flow_lua_check(L, 1, "cuda._bench_gemm"), *b = flow_lua_check(L, 2, "cuda._bench_gemm"),
              *c = flow_lua_check(L, 3, "cuda._bench_gemm");
  int iters = (int)luaL_optinteger(L, 4, 10);
  double secs;
  if (check_backend(L, "cuda._bench_gemm")->bench_gemm(c, a, b, iters, &secs) != 0) return flow_lua_error(L);
  lua_pushnumber(L, secs);
  return 1;
}

/* cuda._nccl_allreduce(t): sums a contiguous cuda tensor in place over every rank through NCCL
 * (the communicator backend's check; the global layer calls the backend directly). Returns t. */
static int f_nccl_allreduce(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "cuda._nccl_allreduce");
  if (t->device.type != FLOW_CUDA || !flow_tensor_is_contiguous(t))
    return luaL_error(L, "cuda._nccl_allreduce: expected a contiguous cuda tensor");
  if (flow_comm_init() != 0) return flow_lua_error(L);
  int n = flow_comm_size(), *ranks = malloc((size_t)n * sizeof *ranks);
  if (!ranks) return luaL_error(L, "cuda._nccl_allreduce: out of host memory");
  for (int r = 0; r < n; r++) ranks[r] = r;
  flow_comm *c = flow_nccl_for_ranks(ranks, n);
  free(ranks);
  if (!c) return flow_lua_error(L);
  if (t->device.index != flow_nccl_device())
    return luaL_error(L, "cuda._nccl_allreduce: the tensor is on cuda:%d but this rank's GPU is cuda:%d",
                      t->device.index, flow_nccl_device());
  void *p = flow_tensor_data(t);
  if (c->ops->allreduce(c, p, p, (size_t)flow_tensor_numel(t), t->dtype) != 0) return flow_lua_error(L);
  t->storage->version++;
  lua_settop(L, 1);
  return 1;
}

/* ---- flow.backends.allow_tf32 ----------------------------------------------------------------- */

static int backends_index(lua_State *L) {
  if (strcmp(luaL_checkstring(L, 2), "allow_tf32") == 0) lua_pushboolean(L, flow_cuda_allow_tf32);
  else lua_pushnil(L);
  return 1;
}

static int backends_newindex(lua_State *L) {
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "allow_tf32") == 0) flow_cuda_allow_tf32 = lua_toboolean(L, 3);
  else lua_rawset(L, 1);
  return 0;
}

/* ---- flow.autocast(dtype, fn, ...) -------------------------------------------------------------- */

/* Runs fn(...) with matmul, attention (CUDA) and convolution (CPU) computing in dtype from float32
 * inputs: bf16 or f16 on CUDA, bf16 on the CPU (where f16 runs as float32); outputs and master
 * weights stay float32. The previous setting comes back even if fn raises. */
static int f_autocast(lua_State *L) {
  flow_dtype dt = flow_lua_check_dtype(L, 1);
  if (dt != FLOW_BF16 && dt != FLOW_F16 && dt != FLOW_F32)
    return luaL_error(L, "autocast: dtype must be bfloat16 or float16 (or float32 to turn it off), got %s",
                      flow_dtype_name(dt));
  luaL_checktype(L, 2, LUA_TFUNCTION);
  int base = 1;
  flow_dtype prev = flow_set_autocast(dt);
  int status = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
  flow_set_autocast(prev);
  if (status != LUA_OK) return lua_error(L);
  return lua_gettop(L) - base;
}

/* ---- moving tensors: to / cuda / cpu ------------------------------------------------------------ */

/* Cast on the GPU side of a move (it is cheaper there): move then cast when going to cuda, cast then
 * move otherwise. A new reference, or NULL with the error set. */
static flow_tensor *move(flow_tensor *t, flow_device dev, flow_dtype dt) {
  bool cast_first = dev.type == FLOW_CPU;
  flow_tensor *a = cast_first ? flow_cast(t, dt) : flow_to_device(t, dev);
  if (!a) return NULL;
  flow_tensor *b = cast_first ? flow_to_device(a, dev) : flow_cast(a, dt);
  flow_tensor_decref(a);
  return b;
}

/* t:to("cuda" | "cuda:1" | "cpu" | "bfloat16" | {device=, dtype=, requires_grad=} | other tensor).
 * Returns t itself when nothing changes. requires_grad in the options makes the result a leaf
 * with that flag (what flow.tensor{..., device=, requires_grad=} needs). */
static int t_to(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "to");
  flow_device dev = t->device;
  flow_dtype dt = t->dtype;
  flow_tensor *other = flow_lua_test(L, 2);
  if (other) {
    dev = other->device;
    dt = other->dtype;
  } else if (lua_type(L, 2) == LUA_TSTRING) {
    const char *s = lua_tostring(L, 2);
    if (flow_dtype_parse(s, &dt) != 0 && flow_device_parse(s, &dev) != 0)
      return luaL_error(L, "to: '%s' is neither a dtype nor a device (expected e.g. \"cuda\", \"cpu\", "
                        "\"bfloat16\")", s);
  } else if (lua_istable(L, 2)) {
    dt = flow_lua_opt_dtype(L, 2, dt);
    dev = flow_lua_opt_device(L, 2, dev);
  } else {
    return luaL_error(L, "to: expected a device, a dtype, {device=, dtype=} or a tensor (got %s)",
                      luaL_typename(L, 2));
  }
  if (dev.type == FLOW_CUDA && !flow_cuda_is_available())
    return luaL_error(L, "to: cuda is not available (%s)", flow_cuda_unavailable_reason());
  flow_tensor *r = move(t, dev, dt);
  if (!r) return flow_lua_error(L);
  if (lua_istable(L, 2) && !other) {
    lua_getfield(L, 2, "requires_grad");
    int has = !lua_isnil(L, -1), on = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (has) {
      flow_tensor *leaf = flow_tensor_alias(r);
      flow_tensor_decref(r);
      if (!leaf) return flow_lua_error(L);
      leaf->requires_grad = on && flow_dtype_is_float(leaf->dtype);
      r = leaf;
    }
  }
  if (r == t) { lua_settop(L, 1); flow_tensor_decref(r); return 1; }
  return flow_lua_push(L, r);
}

static int t_cuda(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "cuda");
  flow_device dev = {FLOW_CUDA, opt_index(L, 2, "cuda")};
  if (!flow_cuda_is_available()) return raise_unavailable(L, "cuda");
  flow_tensor *r = flow_to_device(t, dev);
  if (r == t) { flow_tensor_decref(r); lua_settop(L, 1); return 1; }
  return flow_lua_push(L, r);
}

static int t_cpu(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "cpu");
  flow_tensor *r = flow_to_device(t, FLOW_DEVICE_CPU);
  if (r == t) { flow_tensor_decref(r); lua_settop(L, 1); return 1; }
  return flow_lua_push(L, r);
}

/* registry["flow.to_host"](t): a CPU copy without autograd, for item/totable/printing. */
static int to_host(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "to_host"), *h;
  if (t->device.type == FLOW_CPU) { lua_settop(L, 1); return 1; }
  flow_attrs at;
  flow_attrs_init(&at);
  at.device = FLOW_DEVICE_CPU;
  if (flow_op_call_local(&flow_op_to_device, &t, 1, &at, &h) != 0) return flow_lua_error(L);
  return flow_lua_push(L, h);
}

/* ---- opening ---------------------------------------------------------------------------------- */

static FLOW_KERNEL(no_gpu_kernel) {
  (void)in; (void)nin; (void)out; (void)nout; (void)a;
  return flow_error_set("cuda is not available (%s)", flow_cuda_unavailable_reason());
}

/* flow.cuda.local_device() -> "cuda:N", the GPU this rank drives (its rank on the node modulo the
 * node's GPU count) */
static int f_local_device(lua_State *L) {
  int gpu = flow_nccl_device();
  if (gpu < 0) return flow_lua_error(L);
  lua_pushfstring(L, "cuda:%d", gpu);
  return 1;
}

/* flow.cuda.nccl_usable() -> true, or false and why CUDA tensors are boxed through host memory */
static int f_nccl_usable(lua_State *L) {
  lua_pushboolean(L, flow_nccl_usable());
  if (flow_nccl_usable()) return 1;
  lua_pushstring(L, flow_nccl_unusable_reason());
  return 2;
}

/* Without a GPU no CUDA tensor can exist, but source ops (zeros, rand) on "cuda" would otherwise
 * fail at the kernel lookup with a vaguer message: give every op a CUDA slot that says why. Runs
 * once the plugin has loaded or failed to. */
static void mark_ops_unavailable(bool available) {
  if (available) return;
  for (const flow_op *op = flow_op_first(); op; op = op->next)
    if (!flow_kernel_find(FLOW_CUDA, op->name)) flow_kernel_register(FLOW_CUDA, op->name, no_gpu_kernel);
}

/* flow.cuda._kernels() -> {op name = true} for every op with a CUDA kernel of its own (compiled in
 * this build, GPU or not), and the list of CUDA kernel names no op has; nil in a build without CUDA. */
static int f_kernels(lua_State *L) {
#ifdef FLOW_HAVE_CUDA
  flow_cuda_init();
  lua_newtable(L);
  for (const flow_op *op = flow_op_first(); op; op = op->next) {
    flow_kernel_fn k = flow_kernel_find(FLOW_CUDA, op->name);
    if (k && k != no_gpu_kernel) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, op->name);
    }
  }
  const char *const *names;
  int n = flow_kernel_names(FLOW_CUDA, &names), unmatched = 0;
  lua_newtable(L);
  for (int i = 0; i < n; i++)
    if (!flow_op_find(names[i])) {
      lua_pushstring(L, names[i]);
      lua_rawseti(L, -2, ++unmatched);
    }
  return 2;
#else
  lua_pushnil(L);
  return 1;
#endif
}

void flow_lua_open_cuda(lua_State *L) {
  flow_cuda_install(mark_ops_unavailable);
  if (flow_comm_size() > 1 && flow_nccl_init() != 0) luaL_error(L, "%s", flow_error_get());

  static const luaL_Reg cuda_fns[] = {
    {"is_available", f_is_available}, {"unavailable_reason", f_unavailable_reason},
    {"device_count", f_device_count}, {"synchronize", f_synchronize}, {"memory_stats", f_memory_stats},
    {"empty_cache", f_empty_cache}, {"_bench_gemm", f_bench_gemm}, {"_nccl_allreduce", f_nccl_allreduce},
    {"nccl_usable", f_nccl_usable}, {"local_device", f_local_device}, {"_kernels", f_kernels}, {NULL, NULL}};
  lua_newtable(L);
  luaL_setfuncs(L, cuda_fns, 0);
#ifdef FLOW_HAVE_CUDA
  lua_pushboolean(L, 1);
#else
  lua_pushboolean(L, 0);
#endif
  lua_setfield(L, -2, "built"); /* this build has the CUDA backend (a GPU may still be missing) */
  lua_setfield(L, -2, "cuda");

  lua_getfield(L, -1, "backends");
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "backends");
  }
  lua_newtable(L);
  lua_pushcfunction(L, backends_index);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, backends_newindex);
  lua_setfield(L, -2, "__newindex");
  lua_setmetatable(L, -2);
  lua_pop(L, 1);

  lua_pushcfunction(L, to_host);
  lua_setfield(L, LUA_REGISTRYINDEX, "flow.to_host");

  static const luaL_Reg fns[] = {{"autocast", f_autocast}, {NULL, NULL}};
  static const luaL_Reg methods[] = {{"to", t_to}, {"cuda", t_cuda}, {"cpu", t_cpu}, {NULL, NULL}};
  flow_lua_register(L, fns, methods);
}
