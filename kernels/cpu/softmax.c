/* Softmax and log-softmax along one axis, forward and backward, float32 and float64, and the row
 * primitives (max, shifted exp) the other fused kernels share. The code after `#else` is written
 * once against `real`: this file includes itself once per dtype (Torch7's THGenerate pattern).
 * A tensor is seen as [outer, n, inner] around the axis; rows along a non-last axis (inner > 1)
 * are gathered into a contiguous scratch row, so one row kernel serves every axis. Rows are
 * independent: large inputs share them among threads (iter.h). */
#ifndef real

#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "iter.h"
#include "nn.h"

/* Lanes of independent partial results: breaks the serial dependency of a running max or sum so
 * the loop runs at throughput, not latency (and lets the compiler use one vector per 8 floats). */
#define LANES 8

/* y[l] = exp(x[l] - shift), acc[l] += y[l] for one block of LANES elements. float64 calls libm;
 * float32 computes 8 exps at once in GCC/Clang vector types (libm's expf is a call per element,
 * which no loop vectorises). Cephes' expf: exp(v) = 2^n exp(r), n = round(v / ln2),
 * r = v - n ln2 in [-ln2/2, ln2/2] (ln2 split in two for an exact product), exp(r) by a degree-7
 * polynomial (measured relative error < 1e-7). Below ln(FLT_MIN) gives 0; above 127.5 ln2, where
 * 2^n would leave the exponent range, inf (only 88.38..88.72 lose a finite value); NaN stays NaN. */
static inline void exp_block_f64(double *y, const double *x, double shift, double *acc) {
  for (int l = 0; l < LANES; l++) acc[l] += (y[l] = exp(x[l] - shift));
}

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* where mask (all ones / all zeros per lane): a, else b. A macro: a function passing 32-byte
 * vectors by value draws an ABI warning when AVX is not enabled. */
#define SELECT8(mask, a, b) ((v8f)(((mask) & (v8i)(a)) | (~(mask) & (v8i)(b))))

static inline void exp_block_f32(float *y, const float *x, float shift, float *acc) {
  const float lo = -87.33654f, hi = 88.37626f, magic = 12582912.0f; /* 1.5 * 2^23: + magic rounds */
  const v8f zero = {0};
  v8f v, a;
  memcpy(&v, x, sizeof v);
  memcpy(&a, acc, sizeof a);
  v = v - shift;
  v8i under = v < lo, over = v > hi, nan = v != v;
  v8f c = SELECT8(under | nan, zero + lo, SELECT8(over, zero + hi, v));
  v8f t = c * 1.44269504088896341f + magic, n = t - magic;
  v8f r = c - n * 0.693359375f + n * 2.12194440e-4f;
  v8f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1;
  v8f e = p * (v8f)(((v8i)t - 0x4B400000 + 127) << 23); /* t's low mantissa bits hold n */
  e = SELECT8(under, zero, SELECT8(over, zero + INFINITY, SELECT8(nan, v, e)));
  a += e;
  memcpy(y, &e, sizeof e);
  memcpy(acc, &a, sizeof a);
}

#define FLOW_GENERIC_FILE "softmax.c"
#include "generic.h"

static void split_axis(const flow_tensor *t, int axis, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = flow_shape_numel(axis, t->shape);
  *n = t->ndim ? t->shape[axis] : 1;
  *inner = t->ndim ? flow_shape_numel(t->ndim - axis - 1, t->shape + axis + 1) : 1;
}

int flow_cpu_softmax_forward(flow_tensor *y, const flow_tensor *x, int axis, bool log) {
  flow_tensor *tmp;
  const void *xp = flow_cpu_dense(x, &tmp);
  if (!xp) return -1;
  int64_t outer, n, inner;
  split_axis(x, axis, &outer, &n, &inner);
  int rc = x->dtype == FLOW_F32 ? softmax_forward_f32(flow_tensor_data(y), xp, outer, n, inner, log)
                                : softmax_forward_f64(flow_tensor_data(y), xp, outer, n, inner, log);
  flow_tensor_decref(tmp);
  return rc;
}

int flow_cpu_softmax_backward(flow_tensor *dx, const flow_tensor *y, const flow_tensor *dy, int axis,
                              bool log) {
  flow_tensor *ty, *tdy = NULL;
  const void *yp = flow_cpu_dense(y, &ty);
  const void *dyp = yp ? flow_cpu_dense(dy, &tdy) : NULL;
  if (!dyp) { flow_tensor_decref(ty); return -1; }
  int64_t outer, n, inner;
  split_axis(y, axis, &outer, &n, &inner);
  int rc = y->dtype == FLOW_F32 ? softmax_backward_f32(flow_tensor_data(dx), yp, dyp, outer, n, inner, log)
                                : softmax_backward_f64(flow_tensor_data(dx), yp, dyp, outer, n, inner, log);
  flow_tensor_decref(ty);
  flow_tensor_decref(tdy);
  return rc;
}

#else

FLOW_CPU_DISPATCH real GEN(flow_cpu_row_max)(const real *x, int64_t n) {
  real m[LANES], r = -INFINITY;
  int64_t j = 0;
  for (int l = 0; l < LANES; l++) m[l] = -INFINITY;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (; j < n; j++) r = x[j] > r ? x[j] : r;
  for (int l = 0; l < LANES; l++) r = m[l] > r ? m[l] : r;
  return r;
}

FLOW_CPU_DISPATCH real GEN(flow_cpu_exp_shift)(real *y, const real *x, int64_t n, real shift) {
  real s[LANES] = {0}, sum = 0;
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) GEN(exp_block)(y + j, x + j, shift, s);
  for (; j < n; j++) sum += (y[j] = exp(x[j] - shift));
  for (int l = 0; l < LANES; l++) sum += s[l];
  return sum;
}

/* One contiguous row: m = max x,  s = sum exp(x - m),
 * softmax: y = exp(x - m) / s;  log_softmax: y = x - m - log s. */
FLOW_CPU_DISPATCH
static void GEN(softmax_row)(real *y, const real *x, int64_t n, bool as_log) {
  real m = GEN(flow_cpu_row_max)(x, n);
  real s = GEN(flow_cpu_exp_shift)(y, x, n, m);
  if (as_log) {
    real shift = m + log(s);
    for (int64_t j = 0; j < n; j++) y[j] = x[j] - shift;
  } else {
    real r = 1 / s;
    for (int64_t j = 0; j < n; j++) y[j] *= r;
  }
}

/* sum of a[j] * (b ? b[j] : 1) */
static real GEN(row_dot)(const real *a, const real *b, int64_t n) {
  real acc[LANES] = {0}, sum = 0;
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++) acc[l] += a[j + l] * (b ? b[j + l] : 1);
  for (; j < n; j++) sum += a[j] * (b ? b[j] : 1);
  for (int l = 0; l < LANES; l++) sum += acc[l];
  return sum;
}

/* softmax:     dx = y * (dy - sum(dy * y))
 * log_softmax: dx = dy - exp(y) * sum(dy) */
FLOW_CPU_DISPATCH
static void GEN(softmax_backward_row)(real *dx, const real *y, const real *dy, int64_t n, bool as_log) {
  if (as_log) {
    real s = GEN(row_dot)(dy, NULL, n);
    GEN(flow_cpu_exp_shift)(dx, y, n, 0);
    for (int64_t j = 0; j < n; j++) dx[j] = dy[j] - dx[j] * s;
  } else {
    real s = GEN(row_dot)(dy, y, n);
    for (int64_t j = 0; j < n; j++) dx[j] = y[j] * (dy[j] - s);
  }
}

/* Row r = (o, i) of [outer, n, inner] starts at o * n * inner + i with stride inner. */
static void GEN(gather)(real *row, const real *x, int64_t n, int64_t inner) {
  for (int64_t j = 0; j < n; j++) row[j] = x[j * inner];
}
static void GEN(scatter)(real *x, const real *row, int64_t n, int64_t inner) {
  for (int64_t j = 0; j < n; j++) x[j * inner] = row[j];
}

/* A softmax over rows of [outer, n, inner]: forward (y from x; dy NULL) or backward (dx from y, dy). */
typedef struct GEN(softmax_job) {
  real *out;              /* y, or dx */
  const real *in, *dy;    /* x, or y */
  int64_t n, inner;
  bool as_log;
  real *scratch;          /* 3 rows per part (iter.h's flow_cpu_parallel), when inner > 1 */
} GEN(softmax_job);

/* Rows r in [lo, hi), r = o * inner + i; rows are independent, so any cut gives the same bits. */
static void GEN(softmax_rows)(int64_t lo, int64_t hi, int part, void *vjob) {
  const GEN(softmax_job) *j = vjob;
  int64_t n = j->n, inner = j->inner;
  if (inner == 1) {
    for (int64_t r = lo; r < hi; r++)
      if (j->dy) GEN(softmax_backward_row)(j->out + r * n, j->in + r * n, j->dy + r * n, n, j->as_log);
      else GEN(softmax_row)(j->out + r * n, j->in + r * n, n, j->as_log);
    return;
  }
  real *row = j->scratch + (int64_t)part * 3 * n;
  for (int64_t r = lo; r < hi; r++) {
    int64_t base = r / inner * n * inner + r % inner;
    GEN(gather)(row, j->in + base, n, inner);
    if (j->dy) {
      GEN(gather)(row + n, j->dy + base, n, inner);
      GEN(softmax_backward_row)(row + 2 * n, row, row + n, n, j->as_log);
    } else {
      GEN(softmax_row)(row + 2 * n, row, n, j->as_log);
    }
    GEN(scatter)(j->out + base, row + 2 * n, n, inner);
  }
}

static int GEN(softmax_run)(GEN(softmax_job) *j, int64_t outer) {
  if (j->n == 0) return 0;
  int64_t rows = outer * j->inner;
  int t = flow_cpu_threads(rows * j->n, FLOW_GRAIN_COSTLY);
  j->scratch = NULL;
  if (j->inner > 1 && !(j->scratch = malloc(3 * (size_t)j->n * (size_t)t * sizeof(real))))
    return flow_error_set("softmax: out of memory");
  flow_cpu_parallel(t, rows, 1, GEN(softmax_rows), j);
  free(j->scratch);
  return 0;
}

static int GEN(softmax_forward)(real *y, const real *x, int64_t outer, int64_t n, int64_t inner, bool as_log) {
  GEN(softmax_job) j = {.out = y, .in = x, .n = n, .inner = inner, .as_log = as_log};
  return GEN(softmax_run)(&j, outer);
}

static int GEN(softmax_backward)(real *dx, const real *y, const real *dy, int64_t outer, int64_t n, int64_t inner,
                                 bool as_log) {
  GEN(softmax_job) j = {.out = dx, .in = y, .dy = dy, .n = n, .inner = inner, .as_log = as_log};
  return GEN(softmax_run)(&j, outer);
}

#endif
