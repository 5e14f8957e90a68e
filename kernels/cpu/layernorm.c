/* LayerNorm over the last axis, fused forward (saving mean and rstd) and fused backward (dx, dw,
 * db in one pass), float32 and float64. The kernels after `#else` are written once against `real`:
 * this file includes itself once per dtype (Torch7's THGenerate pattern). */
#ifndef real

#include <string.h>
#include <tgmath.h>

#include "nn.h"

/* Independent partial sums per row: the row statistics run at throughput, not add latency. */
#define LANES 8

#define FLOW_GENERIC_FILE "layernorm.c"
#include "generic.h"

/* Dense views of n inputs (NULL stays NULL); -1 if a copy fails. */
static int dense_all(const flow_tensor *const *t, const void **p, flow_tensor **tmp, int n) {
  for (int i = 0; i < n; i++) {
    tmp[i] = NULL;
    p[i] = NULL;
    if (t[i] && !(p[i] = flow_cpu_dense(t[i], &tmp[i]))) {
      while (i-- > 0) flow_tensor_decref(tmp[i]);
      return -1;
    }
  }
  return 0;
}

int flow_cpu_layernorm_forward(flow_tensor *y, flow_tensor *mean, flow_tensor *rstd, const flow_tensor *x,
                               const flow_tensor *w, const flow_tensor *b, double eps) {
  const flow_tensor *in[3] = {x, w, b};
  const void *p[3];
  flow_tensor *tmp[3];
  if (dense_all(in, p, tmp, 3) != 0) return -1;
  int64_t C = x->shape[x->ndim - 1], rows = flow_shape_numel(x->ndim - 1, x->shape);
  if (x->dtype == FLOW_F32)
    layernorm_forward_f32(flow_tensor_data(y), flow_tensor_data(mean), flow_tensor_data(rstd), p[0], p[1],
                          p[2], rows, C, (float)eps);
  else
    layernorm_forward_f64(flow_tensor_data(y), flow_tensor_data(mean), flow_tensor_data(rstd), p[0], p[1],
                          p[2], rows, C, eps);
  for (int i = 0; i < 3; i++) flow_tensor_decref(tmp[i]);
  return 0;
}

int flow_cpu_layernorm_backward(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                const flow_tensor *dmean, const flow_tensor *drstd, const flow_tensor *x,
                                const flow_tensor *w, const flow_tensor *mean, const flow_tensor *rstd) {
  const flow_tensor *in[7] = {dy, dmean, drstd, x, w, mean, rstd};
  const void *p[7];
  flow_tensor *tmp[7];
  if (dense_all(in, p, tmp, 7) != 0) return -1;
  int64_t C = x->shape[x->ndim - 1], rows = flow_shape_numel(x->ndim - 1, x->shape);
  memset(flow_tensor_data(dw), 0, flow_tensor_nbytes(dw));
  memset(flow_tensor_data(db), 0, flow_tensor_nbytes(db));
  if (x->dtype == FLOW_F32)
    layernorm_backward_f32(flow_tensor_data(dx), flow_tensor_data(dw), flow_tensor_data(db), p[0], p[1], p[2],
                           p[3], p[4], p[5], p[6], rows, C);
  else
    layernorm_backward_f64(flow_tensor_data(dx), flow_tensor_data(dw), flow_tensor_data(db), p[0], p[1], p[2],
                           p[3], p[4], p[5], p[6], rows, C);
  for (int i = 0; i < 7; i++) flow_tensor_decref(tmp[i]);
  return 0;
}

#else

/* Per row of C: mean = sum x / C,  var = sum (x - mean)^2 / C (biased),  rstd = 1 / sqrt(var + eps),
 * y = (x - mean) * rstd * w + b  (w = 1, b = 0 when absent). */
/* sum of (x - c)^p for p = 1 or 2 (inlined with p constant: one vector loop each) */
static inline __attribute__((always_inline)) real GEN(row_moment)(const real *x, int64_t n, real c, int p) {
  real acc[LANES] = {0}, sum = 0;
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) acc[l] += p == 1 ? x[i + l] - c : (x[i + l] - c) * (x[i + l] - c);
  for (; i < n; i++) sum += p == 1 ? x[i] - c : (x[i] - c) * (x[i] - c);
  for (int l = 0; l < LANES; l++) sum += acc[l];
  return sum;
}

/* The row loops run over a multiple of 32 first (-O2's cheap vectoriser takes only loops without
 * a scalar epilogue), with weight and bias present (nn.LayerNorm) split from the general case. */
FLOW_CPU_DISPATCH
static void GEN(layernorm_forward)(real *y, real *mean, real *rstd, const real *x, const real *w,
                                   const real *b, int64_t rows, int64_t C, real eps) {
  int64_t C32 = w && b ? C & ~(int64_t)31 : 0;
  for (int64_t r = 0; r < rows; r++) {
    const real *xr = x + r * C;
    real *yr = y + r * C;
    real m = GEN(row_moment)(xr, C, 0, 1) / C;
    real s = 1 / sqrt(GEN(row_moment)(xr, C, m, 2) / C + eps);
#pragma GCC ivdep
    for (int64_t i = 0; i < C32; i++) yr[i] = (xr[i] - m) * s * w[i] + b[i];
    for (int64_t i = C32; i < C; i++) {
      real n = (xr[i] - m) * s;
      yr[i] = n * (w ? w[i] : 1) + (b ? b[i] : 0);
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

/* With xhat = (x - mean) * rstd and dn = dy * w:
 * dx = (dn - mean(dn) - xhat * mean(dn * xhat)) * rstd,  dw += dy * xhat,  db += dy  (dw, db zeroed);
 * the saved statistics add d(mean)/dx = 1/C and d(rstd)/dx = -rstd^2 xhat / C:
 * dx += (dmean - drstd * rstd^2 * xhat) / C, folded into the two row means below. */
FLOW_CPU_DISPATCH
static void GEN(layernorm_backward)(real *dx, real *dw, real *db, const real *dy, const real *dmean,
                                    const real *drstd, const real *x, const real *w, const real *mean,
                                    const real *rstd, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; r++) {
    const real *xr = x + r * C, *dyr = dy + r * C;
    real *dxr = dx + r * C, m = mean[r], s = rstd[r];
    real dn_mean = 0, dn_xhat_mean = 0, a1[LANES] = {0}, a2[LANES] = {0};
    int64_t i = 0;
    if (w)
      for (; i + LANES <= C; i += LANES)
        for (int l = 0; l < LANES; l++) {
          real dn = dyr[i + l] * w[i + l];
          a1[l] += dn;
          a2[l] += dn * (xr[i + l] - m);
        }
    else
      for (; i + LANES <= C; i += LANES)
        for (int l = 0; l < LANES; l++) {
          a1[l] += dyr[i + l];
          a2[l] += dyr[i + l] * (xr[i + l] - m);
        }
    for (; i < C; i++) {
      real dn = dyr[i] * (w ? w[i] : 1);
      dn_mean += dn;
      dn_xhat_mean += dn * (xr[i] - m);
    }
    for (int l = 0; l < LANES; l++) {
      dn_mean += a1[l];
      dn_xhat_mean += a2[l];
    }
    dn_xhat_mean *= s;
    dn_mean = (dn_mean - dmean[r] / s) / C;
    dn_xhat_mean = (dn_xhat_mean + drstd[r] * s) / C;
    int64_t C32 = w ? C & ~(int64_t)31 : 0;
#pragma GCC ivdep
    for (i = 0; i < C32; i++) {
      real xhat = (xr[i] - m) * s;
      dxr[i] = (dyr[i] * w[i] - dn_mean - xhat * dn_xhat_mean) * s;
      dw[i] += dyr[i] * xhat;
      db[i] += dyr[i];
    }
    for (i = C32; i < C; i++) {
      real xhat = (xr[i] - m) * s;
      dxr[i] = (dyr[i] * (w ? w[i] : 1) - dn_mean - xhat * dn_xhat_mean) * s;
      dw[i] += dyr[i] * xhat;
      db[i] += dyr[i];
    }
  }
}

#endif
