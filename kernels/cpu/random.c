/* Index-driven fills (see random.h): one walker turns the output box into runs of consecutive
 * logical indices; each fill is a row function over such a run. */
#include "random.h"

#include <math.h>
#include <string.h>

#include "../../core/error.h"
#include "../../core/rng.h"

/* A run: n elements at out (stride os bytes) and x (stride xs bytes, may be NULL) whose logical
 * row-major indices are i0, i0 + 1, ..., i0 + n - 1. */
typedef struct row_ctx {
  const flow_tensor *out;
  const flow_attrs *a;
  int64_t lshape[FLOW_MAX_DIMS];   /* the logical shape */
  int64_t low; uint64_t range;     /* randint */
} row_ctx;
typedef void (*row_fn)(char *out, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,
                       const row_ctx *c);

/* The logical shape of the tensor out is a box of; checks the box lies inside it. */
static int logical_shape(const char *op, const flow_tensor *out, const flow_attrs *a, int64_t *shape,
                         int64_t *start) {
  if (a->nlogical == 0) {
    memcpy(shape, out->shape, sizeof(int64_t) * (size_t)out->ndim);
    memset(start, 0, sizeof(int64_t) * FLOW_MAX_DIMS);
    return 0;
  }
  char s0[128], s1[128];
  if (a->nlogical != out->ndim)
    return flow_error_set("%s: a shard of shape %s cannot be a box of a logical tensor of shape %s", op,
                          flow_shape_str(out->ndim, out->shape, s0, sizeof s0),
                          flow_shape_str(a->nlogical, a->logical_shape, s1, sizeof s1));
  for (int d = 0; d < out->ndim; d++) {
    if (a->box_start[d] < 0 || a->box_start[d] + out->shape[d] > a->logical_shape[d])
      return flow_error_set("%s: the box starting at %lld of size %lld on axis %d lies outside the "
                            "logical shape %s", op, (long long)a->box_start[d], (long long)out->shape[d], d,
                            flow_shape_str(a->nlogical, a->logical_shape, s1, sizeof s1));
    shape[d] = a->logical_shape[d];
    start[d] = a->box_start[d];
  }
  return 0;
}

/* Walk out (and x, same shape) one last-axis run at a time. */
static int walk(const char *op, flow_tensor *out, const flow_tensor *x, row_ctx *c, row_fn row) {
  int64_t start[FLOW_MAX_DIMS], lstride[FLOW_MAX_DIMS];
  c->out = out;
  if (logical_shape(op, out, c->a, c->lshape, start) != 0) return -1;
  int nd = out->ndim;
  flow_contiguous_strides(nd, c->lshape, lstride);
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  int64_t oes = (int64_t)flow_dtype_size(out->dtype), xes = x ? (int64_t)flow_dtype_size(x->dtype) : 0;
  if (nd == 0) {
    row(flow_tensor_data(out), oes, x ? flow_tensor_data(x) : NULL, xes, 0, 1, c);
    return 0;
  }
  int64_t len = out->shape[nd - 1], idx[FLOW_MAX_DIMS] = {0};
  for (int64_t done = 0; done < n; done += len) {
    int64_t li = 0, oo = 0, xo = 0;
    for (int d = 0; d < nd; d++) {
      li += (start[d] + idx[d]) * lstride[d];
      oo += idx[d] * out->stride[d];
      if (x) xo += idx[d] * x->stride[d];
    }
    row((char *)flow_tensor_data(out) + oo * oes, out->stride[nd - 1] * oes,
        x ? (const char *)flow_tensor_data(x) + xo * xes : NULL, x ? x->stride[nd - 1] * xes : 0,
        (uint64_t)li, len, c);
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < out->shape[d]) break;
      idx[d] = 0;
    }
  }
  return 0;
}

/* ---- random draws ------------------------------------------------------------------------ */

static void row_uniform(char *o, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,
                        const row_ctx *c) {
  (void)x; (void)xs;
  flow_dtype dt = c->out->dtype;
  uint32_t w[4];
  for (int64_t k = 0; k < n; k++, o += os) {
    flow_rng_words(c->a->seed, c->a->rng_offset, i0 + (uint64_t)k, w);
    if (dt == FLOW_F64) *(double *)o = flow_rng_uniform_f64(w[0], w[1]);
    else if (dt == FLOW_F32) *(float *)o = flow_rng_uniform_f32(w[0]);
    else flow_dtype_store(dt, o, flow_rng_uniform_f32(w[0]));
  }
}

/* z = sqrt(-2 ln u1) cos(2 pi u2) with u1 in (0, 1] (no log 0) and u2 in [0, 1). */
static void row_normal(char *o, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,
                       const row_ctx *c) {
  (void)x; (void)xs;
  flow_dtype dt = c->out->dtype;
  uint32_t w[4];
  for (int64_t k = 0; k < n; k++, o += os) {
    flow_rng_words(c->a->seed, c->a->rng_offset, i0 + (uint64_t)k, w);
    if (dt == FLOW_F64) {
      double u1 = 1.0 - flow_rng_uniform_f64(w[0], w[1]), u2 = flow_rng_uniform_f64(w[2], w[3]);
      *(double *)o = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    } else {
      float u1 = 1.0f - flow_rng_uniform_f32(w[0]), u2 = flow_rng_uniform_f32(w[1]);
      float z = sqrtf(-2.0f * logf(u1)) * cosf(2.0f * (float)M_PI * u2);
      if (dt == FLOW_F32) *(float *)o = z;
      else flow_dtype_store(dt, o, z);
    }
  }
}

/* low + (64 random bits mod range): the modulo bias is below range / 2^64. */
static void row_int(char *o, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,
                    const row_ctx *c) {
  (void)x; (void)xs;
  uint32_t w[4];
  for (int64_t k = 0; k < n; k++, o += os) {
    flow_rng_words(c->a->seed, c->a->rng_offset, i0 + (uint64_t)k, w);
    int64_t v = (int64_t)((uint64_t)c->low + (((uint64_t)w[1] << 32 | w[0]) % c->range));
    if (c->out->dtype == FLOW_I64) *(int64_t *)o = v;
    else flow_dtype_store(c->out->dtype, o, (double)v);
  }
}

/* Dropped when the element's first word, read as a uniform in [0, 1), is below p. */
#define DEF_DROPOUT(fname, T)                                                                   \
  static void fname(char *o, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,      \
                    const row_ctx *c) {                                                         \
    double p = c->a->scalar;                                                                    \
    uint64_t threshold = (uint64_t)(p * 4294967296.0);                                          \
    T scale = p < 1 ? (T)(1.0 / (1.0 - p)) : 0;                                                 \
    uint32_t w[4];                                                                              \
    for (int64_t k = 0; k < n; k++, o += os, x += xs) {                                         \
      flow_rng_words(c->a->seed, c->a->rng_offset, i0 + (uint64_t)k, w);                        \
      *(T *)o = w[0] >= threshold ? *(const T *)x * scale : (T)0;                               \
    }                                                                                           \
  }
DEF_DROPOUT(row_dropout_f32, float)
DEF_DROPOUT(row_dropout_f64, double)

int flow_cpu_rand_uniform(flow_tensor *out, const flow_attrs *a) {
  row_ctx c = {.a = a};
  return walk("rand", out, NULL, &c, row_uniform);
}

int flow_cpu_rand_normal(flow_tensor *out, const flow_attrs *a) {
  row_ctx c = {.a = a};
  return walk("randn", out, NULL, &c, row_normal);
}

int flow_cpu_rand_int(flow_tensor *out, const flow_attrs *a, int64_t low, int64_t high) {
  if (high <= low)
    return flow_error_set("randint: high (%lld) must be greater than low (%lld)", (long long)high, (long long)low);
  row_ctx c = {.a = a, .low = low, .range = (uint64_t)high - (uint64_t)low};
  return walk("randint", out, NULL, &c, row_int);
}

int flow_cpu_dropout(flow_tensor *out, const flow_tensor *x, const flow_attrs *a) {
  row_ctx c = {.a = a};
  if (out->dtype == FLOW_F32) return walk("dropout", out, x, &c, row_dropout_f32);
  if (out->dtype == FLOW_F64) return walk("dropout", out, x, &c, row_dropout_f64);
  return flow_error_set("dropout: %s is not supported (float32 or float64)", flow_dtype_name(out->dtype));
}

/* ---- arange, linspace, eye --------------------------------------------------------------- */

static void store_index_value(char *o, flow_dtype dt, double v) {
  if (dt == FLOW_F32) *(float *)o = (float)v;
  else flow_dtype_store(dt, o, v);
}

static void row_arange(char *o, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,
                       const row_ctx *c) {
  (void)x; (void)xs;
  double start = c->a->scalar, step = c->a->scalar2;
  flow_dtype dt = c->out->dtype;
  bool exact = dt == FLOW_I64 && start == (double)(int64_t)start && step == (double)(int64_t)step;
  for (int64_t k = 0; k < n; k++, o += os) {
    int64_t i = (int64_t)i0 + k;
    if (exact) *(int64_t *)o = (int64_t)start + (int64_t)step * i;
    else store_index_value(o, dt, start + step * (double)i);
  }
}

/* Symmetric: the first half counts up from start, the second down from stop, so both ends are
 * exact whatever the rounding of step (a single point is start). */
static void row_linspace(char *o, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,
                         const row_ctx *c) {
  (void)x; (void)xs;
  double a = c->a->scalar, b = c->a->scalar2;
  int64_t len = c->lshape[0];
  double step = len > 1 ? (b - a) / (double)(len - 1) : 0;
  for (int64_t k = 0; k < n; k++, o += os) {
    int64_t i = (int64_t)i0 + k;
    store_index_value(o, c->out->dtype, i < (len + 1) / 2 ? a + step * (double)i : b - step * (double)(len - 1 - i));
  }
}

static void row_eye(char *o, int64_t os, const char *x, int64_t xs, uint64_t i0, int64_t n,
                    const row_ctx *c) {
  (void)x; (void)xs;
  int64_t m = c->lshape[1];
  for (int64_t k = 0; k < n; k++, o += os) {
    int64_t i = (int64_t)i0 + k;
    store_index_value(o, c->out->dtype, i / m == i % m);
  }
}

int flow_cpu_arange(flow_tensor *out, const flow_attrs *a) {
  row_ctx c = {.a = a};
  return walk("arange", out, NULL, &c, row_arange);
}

int flow_cpu_linspace(flow_tensor *out, const flow_attrs *a) {
  row_ctx c = {.a = a};
  return walk("linspace", out, NULL, &c, row_linspace);
}

int flow_cpu_eye(flow_tensor *out, const flow_attrs *a) {
  if (out->ndim != 2) return flow_error_set("eye: expected a 2-d output (got %d-d)", out->ndim);
  row_ctx c = {.a = a};
  return walk("eye", out, NULL, &c, row_eye);
}
