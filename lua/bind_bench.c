/* Lua bindings for benchmarks and tests (flow._bench): references measured in the same run as
 * flowlua's own figures, e.g. oneDNN or OpenBLAS called directly on a tensor's memory, so
 * scripts/bench/ can print ratios rather than absolute numbers from another machine; the plain
 * reference GEMM the specs check oneDNN against; oneDNN's thread count and primitive count. */
#include <cblas.h>
#include <omp.h>
#include <string.h>
#include <time.h>

#include "../kernels/cpu/conv.h"
#include "../kernels/cpu/cpu.h"
#include "../kernels/cpu/onednn.h"
#include "bind.h"

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A 2-d contiguous float32 CPU tensor, else a Lua error naming what was wrong. */
static flow_tensor *check_matrix(lua_State *L, int idx, const char *what) {
  flow_tensor *t = flow_lua_check(L, idx, "_bench.sgemm");
  char s[128];
  if (t->ndim != 2)
    luaL_error(L, "_bench.sgemm: %s must be 2-d (got shape %s)", what, flow_shape_str(t->ndim, t->shape, s, sizeof s));
  if (t->dtype != FLOW_F32)
    luaL_error(L, "_bench.sgemm: %s must be float32 (got %s)", what, flow_dtype_name(t->dtype));
  if (t->device.type != FLOW_CPU) luaL_error(L, "_bench.sgemm: %s must be on the cpu", what);
  if (!flow_tensor_is_contiguous(t)) luaL_error(L, "_bench.sgemm: %s must be contiguous", what);
  return t;
}

/* _bench.sgemm(a [m,k], b [k,n], c [m,n], iters, library) -> seconds per call of C = A B by
 * oneDNN's matmul primitive (library "onednn", the default: flowlua's own GEMM without the op
 * around it, run whole on oneDNN's own threads) or OpenBLAS's cblas_sgemm ("openblas"). */
static int l_sgemm(lua_State *L) {
  flow_tensor *a = check_matrix(L, 1, "a"), *b = check_matrix(L, 2, "b"), *c = check_matrix(L, 3, "c");
  lua_Integer iters = luaL_optinteger(L, 4, 1);
  const char *lib = luaL_optstring(L, 5, "onednn");
  bool onednn = strcmp(lib, "onednn") == 0;
  if (!onednn && strcmp(lib, "openblas") != 0)
    return luaL_error(L, "_bench.sgemm: library must be onednn or openblas (got %s)", lib);
  if (iters < 1) return luaL_error(L, "_bench.sgemm: iters must be at least 1 (got %d)", (int)iters);
  int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
  if (b->shape[0] != k || c->shape[0] != m || c->shape[1] != n) {
    char sa[64], sb[64], sc[64];
    return luaL_error(L, "_bench.sgemm: shapes %s @ %s -> %s do not match", flow_shape_str(2, a->shape, sa, sizeof sa),
                      flow_shape_str(2, b->shape, sb, sizeof sb), flow_shape_str(2, c->shape, sc, sizeof sc));
  }
  const float *pa = flow_tensor_data(a), *pb = flow_tensor_data(b);
  float *pc = flow_tensor_data(c);
  double t0 = seconds();
  for (lua_Integer i = 0; i < iters; i++) {
    if (!onednn)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, pa, (int)k, pb,
                  (int)n, 0.0f, pc, (int)n);
    else {
      bool was = flow_onednn_whole(true);   /* oneDNN's primitive as oneDNN threads it */
      int rc = flow_onednn_sgemm("_bench.sgemm", false, false, m, n, k, 1, pa, k, pb, n, 0, pc, n);
      flow_onednn_whole(was);
      if (rc != 0) return flow_lua_error(L);
    }
  }
  lua_pushnumber(L, (seconds() - t0) / (double)iters);
  return 1;
}

/* _bench.matmul_reference(out, a, b, transpose_a, transpose_b): out (float32 or float64, the shape
 * flow.matmul gives) = op(a) @ op(b) by a plain loop accumulating in double. */
static int l_matmul_reference(lua_State *L) {
  const char *fn = "_bench.matmul_reference";
  flow_tensor *out = flow_lua_check(L, 1, fn), *a = flow_lua_check(L, 2, fn), *b = flow_lua_check(L, 3, fn);
  if (out->device.type != FLOW_CPU || a->device.type != FLOW_CPU || b->device.type != FLOW_CPU)
    return luaL_error(L, "_bench.matmul_reference: cpu tensors only");
  if (flow_cpu_matmul_reference(out, a, b, lua_toboolean(L, 4), lua_toboolean(L, 5)) != 0) return flow_lua_error(L);
  return 0;
}

/* _bench.onednn() -> {threads =, primitives =, bf16 =, cut =, cut_nested =}: the OpenMP threads oneDNN runs on here,
 * the primitives built so far, whether bf16 autocast would run natively, and the GEMMs cut into
 * pieces so far, cut_nested of them inside a parallel region (none should be). */
static int l_onednn(lua_State *L) {
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, flow_onednn_num_threads());
  lua_setfield(L, -2, "threads");
  lua_pushinteger(L, flow_onednn_primitives_built());
  lua_setfield(L, -2, "primitives");
  lua_pushboolean(L, flow_onednn_bf16_native());
  lua_setfield(L, -2, "bf16");
  int64_t cut, nested;
  flow_onednn_cut_counts(&cut, &nested);
  lua_pushinteger(L, cut);
  lua_setfield(L, -2, "cut");
  lua_pushinteger(L, nested);
  lua_setfield(L, -2, "cut_nested");
  lua_pushinteger(L, flow_onednn_bf16_carried());
  lua_setfield(L, -2, "carried");
  return 1;
}

/* _bench.conv_reference(on) -> previous: float32 conv2d, pooling and batch norm on the reference
 * kernels (true) or on oneDNN (false, the default). */
static int l_conv_reference(lua_State *L) {
  bool prev = flow_cpu_conv_reference;
  flow_cpu_conv_reference = lua_toboolean(L, 1);
  lua_pushboolean(L, prev);
  return 1;
}

/* _bench.set_threads(n) -> previous: the OpenMP threads this thread's oneDNN calls and CPU loops
 * use from now on (benchmarks compare thread counts in one process). */
static int l_set_threads(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  if (n < 1 || n > 1024) return luaL_error(L, "_bench.set_threads: expected 1 to 1024 threads (got %d)", (int)n);
  lua_pushinteger(L, flow_onednn_num_threads());
  omp_set_num_threads((int)n);
  return 1;
}

/* _bench.gemm_whole(on) -> previous: this thread's GEMMs run whole on oneDNN's own threads (true)
 * or cut into one piece per thread (false, the default); see flow_onednn_whole. */
static int l_gemm_whole(lua_State *L) {
  lua_pushboolean(L, flow_onednn_whole(lua_toboolean(L, 1)));
  return 1;
}

/* Called by luaopen_flow with the module table on top. */
void flow_lua_open_bench(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"sgemm", l_sgemm},   {"matmul_reference", l_matmul_reference}, {"onednn", l_onednn},
      {"conv_reference", l_conv_reference}, {"gemm_whole", l_gemm_whole},
      {"set_threads", l_set_threads}, {NULL, NULL}};
  luaL_newlib(L, fns);
  lua_setfield(L, -2, "_bench");
}
