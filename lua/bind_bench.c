/* Lua bindings for benchmarks (flow._bench): references measured in the same run as flowlua's
 * own figures, e.g. OpenBLAS called directly on a tensor's memory, so scripts/bench/ can print
 * ratios rather than absolute numbers from another machine. */
#include <cblas.h>
#include <time.h>

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

/* _bench.sgemm(a [m,k], b [k,n], c [m,n], iters) -> seconds per call of C = A B by cblas_sgemm. */
static int l_sgemm(lua_State *L) {
  flow_tensor *a = check_matrix(L, 1, "a"), *b = check_matrix(L, 2, "b"), *c = check_matrix(L, 3, "c");
  lua_Integer iters = luaL_optinteger(L, 4, 1);
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
  for (lua_Integer i = 0; i < iters; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, pa, (int)k, pb,
                (int)n, 0.0f, pc, (int)n);
  lua_pushnumber(L, (seconds() - t0) / (double)iters);
  return 1;
}

/* Called by luaopen_flow with the module table on top. */
void flow_lua_open_bench(lua_State *L) {
  static const luaL_Reg fns[] = {{"sgemm", l_sgemm}, {NULL, NULL}};
  luaL_newlib(L, fns);
  lua_setfield(L, -2, "_bench");
}
