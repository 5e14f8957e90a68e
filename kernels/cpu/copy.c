/* Copy with any strides, and dtype conversion (cast), fill, and the selecting copies where and
 * masked_fill. */
#include <string.h>

#include "../registry.h"
#include "cpu.h"
#include "iter.h"

#define DEF_MOVE(fname, T)                                                        \
  static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {           \
    (void)ctx;                                                                    \
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) { memcpy(p[0], p[1], (size_t)n * sizeof(T)); return; } \
    char *o = p[0];                                                               \
    const char *x = p[1];                                                         \
    for (int64_t i = 0; i < n; i++, o += s[0], x += s[1]) *(T *)o = *(const T *)x; \
  }
DEF_MOVE(move1, uint8_t)
DEF_MOVE(move2, uint16_t)
DEF_MOVE(move4, uint32_t)
DEF_MOVE(move8, uint64_t)

typedef struct { flow_dtype from, to; } cast_ctx;

/* float32 <-> float16/bfloat16 (ctx: the half dtype): the vector loops of iter.c where the float32
 * side is dense */
static void cast_to_half(char **p, const int64_t *s, int64_t n, void *ctx) {
  flow_dtype dt = *(const flow_dtype *)ctx;
  if (s[1] == 4) { flow_cpu_narrow_half(p[0], s[0], (const float *)p[1], n, dt); return; }
  for (int64_t i = 0; i < n; i++) {
    float x = *(const float *)(p[1] + i * s[1]);
    *(uint16_t *)(p[0] + i * s[0]) = dt == FLOW_BF16 ? flow_float_to_bf16(x) : flow_float_to_half(x);
  }
}

static void cast_from_half(char **p, const int64_t *s, int64_t n, void *ctx) {
  flow_dtype dt = *(const flow_dtype *)ctx;
  if (s[0] == 4) { flow_cpu_widen_half((float *)p[0], p[1], s[1], n, dt); return; }
  for (int64_t i = 0; i < n; i++) {
    uint16_t h = *(const uint16_t *)(p[1] + i * s[1]);
    *(float *)(p[0] + i * s[0]) = dt == FLOW_BF16 ? flow_bf16_to_float(h) : flow_half_to_float(h);
  }
}

/* General conversion through double: exact for every pair except int64 beyond 2^53. */
static void cast_any(char **p, const int64_t *s, int64_t n, void *vctx) {
  const cast_ctx *c = vctx;
  if (c->from == FLOW_I64 && c->to == FLOW_I64) return;
  for (int64_t i = 0; i < n; i++) {
    const char *x = p[1] + i * s[1];
    char *o = p[0] + i * s[0];
    if (c->from == FLOW_I64 && c->to == FLOW_I32) *(int32_t *)o = (int32_t) * (const int64_t *)x;
    else if (c->to == FLOW_I64 && c->from == FLOW_I32) *(int64_t *)o = *(const int32_t *)x;
    else flow_dtype_store(c->to, o, flow_dtype_load(c->from, x));
  }
}

int flow_cpu_copy(flow_tensor *out, const flow_tensor *x) {
  flow_iter it;
  flow_tensor *ops[2] = {out, (flow_tensor *)x};
  flow_iter_init(&it, ops, 2);
  if (out->dtype == x->dtype || (out->dtype == FLOW_BOOL && x->dtype == FLOW_U8)) {
    static const flow_iter_fn by_size[9] = {[1] = move1, [2] = move2, [4] = move4, [8] = move8};
    flow_iter_run_parallel(&it, by_size[flow_dtype_size(x->dtype)], NULL, FLOW_GRAIN_CHEAP);
  } else if (x->dtype == FLOW_F32 && flow_dtype_is_half(out->dtype)) {
    flow_iter_run_parallel(&it, cast_to_half, &out->dtype, FLOW_GRAIN_CHEAP);
  } else if (flow_dtype_is_half(x->dtype) && out->dtype == FLOW_F32) {
    flow_iter_run_parallel(&it, cast_from_half, (void *)&x->dtype, FLOW_GRAIN_CHEAP);
  } else {
    cast_ctx c = {x->dtype, out->dtype};
    flow_iter_run_parallel(&it, cast_any, &c, FLOW_GRAIN_CHEAP);
  }
  return 0;
}

__attribute__((constructor)) static void register_copy(void) { flow_kernel_set_copy(FLOW_CPU, flow_cpu_copy); }

/* memset of elements [lo, hi) of a dense buffer: a large zero fill cut among threads */
typedef struct zero_job { char *p; size_t es; } zero_job;
static void zero_part(int64_t lo, int64_t hi, int part, void *ctx) {
  (void)part;
  const zero_job *j = ctx;
  memset(j->p + lo * (int64_t)j->es, 0, (size_t)(hi - lo) * j->es);
}

int flow_cpu_fill(flow_tensor *out, double v) {
  char one[8];
  flow_dtype_store(out->dtype, one, v);
  size_t es = flow_dtype_size(out->dtype);
  int64_t n = flow_tensor_numel(out);
  char *p = flow_tensor_data(out);
  if (flow_tensor_is_contiguous(out)) {
    if (v == 0) {
      zero_job j = {p, es};
      flow_cpu_parallel(flow_cpu_threads(n, FLOW_GRAIN_CHEAP), n, 32, zero_part, &j);
      return 0;
    }
    for (int64_t i = 0; i < n; i++) memcpy(p + i * (int64_t)es, one, es);
    return 0;
  }
  /* strided: iterate with the output as its own (unused) source */
  int64_t idx[FLOW_MAX_DIMS] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t off = 0;
    for (int d = 0; d < out->ndim; d++) off += idx[d] * out->stride[d];
    memcpy(p + off * (int64_t)es, one, es);
    for (int d = out->ndim - 1; d >= 0; d--) { if (++idx[d] < out->shape[d]) break; idx[d] = 0; }
  }
  return 0;
}

/* ---- where / masked_fill: pure data movement, so one loop per element size ------------------ */

#define DEF_WHERE(fname, T)                                                                      \
  static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {                         \
    (void)ctx;                                                                                   \
    if (s[0] == sizeof(T) && s[1] == 1 && s[2] == sizeof(T) && s[3] == sizeof(T)) {              \
      T *o = (T *)p[0];                                                                          \
      const uint8_t *c = (const uint8_t *)p[1];                                                  \
      const T *a = (const T *)p[2], *b = (const T *)p[3];                                        \
      int64_t m = n & ~(int64_t)31, i;                                                           \
      _Pragma("GCC ivdep") for (i = 0; i < m; i++) o[i] = c[i] ? a[i] : b[i];                    \
      for (i = m; i < n; i++) o[i] = c[i] ? a[i] : b[i];                                         \
      return;                                                                                    \
    }                                                                                            \
    char *o = p[0];                                                                              \
    const char *c = p[1], *a = p[2], *b = p[3];                                                  \
    for (int64_t i = 0; i < n; i++, o += s[0], c += s[1], a += s[2], b += s[3])                  \
      *(T *)o = *c ? *(const T *)a : *(const T *)b;                                              \
  }
DEF_WHERE(where1, uint8_t)
DEF_WHERE(where2, uint16_t)
DEF_WHERE(where4, uint32_t)
DEF_WHERE(where8, uint64_t)

#define DEF_MASKED_FILL(fname, T)                                                                \
  static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {                         \
    T v;                                                                                         \
    memcpy(&v, ctx, sizeof v);                                                                   \
    char *o = p[0];                                                                              \
    const char *x = p[1], *m = p[2];                                                             \
    for (int64_t i = 0; i < n; i++, o += s[0], x += s[1], m += s[2])                             \
      *(T *)o = *m ? v : *(const T *)x;                                                          \
  }
DEF_MASKED_FILL(fill1, uint8_t)
DEF_MASKED_FILL(fill2, uint16_t)
DEF_MASKED_FILL(fill4, uint32_t)
DEF_MASKED_FILL(fill8, uint64_t)

int flow_cpu_where(flow_tensor *out, const flow_tensor *cond, const flow_tensor *a, const flow_tensor *b) {
  static const flow_iter_fn by_size[9] = {[1] = where1, [2] = where2, [4] = where4, [8] = where8};
  flow_iter it;
  flow_tensor *ops[4] = {out, (flow_tensor *)cond, (flow_tensor *)a, (flow_tensor *)b};
  flow_iter_init(&it, ops, 4);
  flow_iter_run_parallel(&it, by_size[flow_dtype_size(out->dtype)], NULL, FLOW_GRAIN_CHEAP);
  return 0;
}

int flow_cpu_masked_fill(flow_tensor *out, const flow_tensor *x, const flow_tensor *mask, double v) {
  static const flow_iter_fn by_size[9] = {[1] = fill1, [2] = fill2, [4] = fill4, [8] = fill8};
  char value[8];
  flow_dtype_store(out->dtype, value, v);
  flow_iter it;
  flow_tensor *ops[3] = {out, (flow_tensor *)x, (flow_tensor *)mask};
  flow_iter_init(&it, ops, 3);
  flow_iter_run_parallel(&it, by_size[flow_dtype_size(out->dtype)], value, FLOW_GRAIN_CHEAP);
  return 0;
}
