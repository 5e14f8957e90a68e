/* LayerNorm over the last axis, fused forward (saving mean and rstd) and fused backward (dx by
 * rows, dw and db by blocks of rows), float32 and float64, on several threads for large inputs.
 * The kernels after `#else` are written once against `real`:
 * this file includes itself once per dtype (Torch7's THGenerate pattern). */
#ifndef real

#include <string.h>
#include <tgmath.h>

#include "iter.h"
#include "nn.h"

/* Independent partial sums per row: the row statistics run at throughput, not add latency. */
#define LANES 8
/* Rows per block of the backward: threads take whole blocks, and dw and db are summed per block. */
#define WB_ROWS (int64_t)64

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
    layernorm_forward_run_f32(&(layernorm_job_f32){.y = flow_tensor_data(y), .mean = flow_tensor_data(mean),
                                                    .rstd = flow_tensor_data(rstd), .x = p[0], .w = p[1], .b = p[2],
                                                    .rows = rows, .C = C, .eps = (float)eps});
  else
    layernorm_forward_run_f64(&(layernorm_job_f64){.y = flow_tensor_data(y), .mean = flow_tensor_data(mean),
                                                    .rstd = flow_tensor_data(rstd), .x = p[0], .w = p[1], .b = p[2],
                                                    .rows = rows, .C = C, .eps = eps});
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
  int64_t np = (rows + WB_ROWS - 1) / WB_ROWS * 2 * C;
  np = np > 0 ? np : 1;
  flow_tensor *part = flow_tensor_new(x->dtype, FLOW_DEVICE_CPU, 1, &np); /* cached memory, no page faults */
  if (!part) {
    for (int i = 0; i < 7; i++) flow_tensor_decref(tmp[i]);
    return flow_error_set("layer_norm: out of memory for the weight gradient's partial sums");
  }
  flow_cpu_fill(part, 0);
  memset(flow_tensor_data(dw), 0, flow_tensor_nbytes(dw));
  memset(flow_tensor_data(db), 0, flow_tensor_nbytes(db));
  if (x->dtype == FLOW_F32)
    layernorm_backward_run_f32(&(layernorm_job_f32){.y = flow_tensor_data(dx), .dw = flow_tensor_data(dw),
                                                     .db = flow_tensor_data(db), .part = flow_tensor_data(part),
                                                     .dy = p[0], .dmean = p[1], .drstd = p[2], .x = p[3], .w = p[4],
                                                     .smean = p[5], .srstd = p[6], .rows = rows, .C = C});
  else
    layernorm_backward_run_f64(&(layernorm_job_f64){.y = flow_tensor_data(dx), .dw = flow_tensor_data(dw),
                                                     .db = flow_tensor_data(db), .part = flow_tensor_data(part),
                                                     .dy = p[0], .dmean = p[1], .drstd = p[2], .x = p[3], .w = p[4],
                                                     .smean = p[5], .srstd = p[6], .rows = rows, .C = C});
  flow_tensor_decref(part);
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
                                   const real *b, int64_t r0, int64_t r1, int64_t C, real eps) {
  int64_t C32 = w && b ? C & ~(int64_t)31 : 0;
  for (int64_t r = r0; r < r1; r++) {
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
 * dx = (dn - mean(dn) - xhat * mean(dn * xhat)) * rstd,  dw = sum over rows of dy * xhat,  db = sum of dy;
 * the saved statistics add d(mean)/dx = 1/C and d(rstd)/dx = -rstd^2 xhat / C:
 * dx += (dmean - drstd * rstd^2 * xhat) / C, folded into the two row means below.
 * dx is row by row (rows r0..r1); dw and db, sums down the columns, are summed per block of rows
 * (below) and the blocks added in order, so every sum runs in the same order whatever the threads. */
FLOW_CPU_DISPATCH
static void GEN(layernorm_backward_dx)(real *dx, const real *dy, const real *dmean, const real *drstd, const real *x,
                                       const real *w, const real *mean, const real *rstd, int64_t r0, int64_t r1,
                                       int64_t C) {
  for (int64_t r = r0; r < r1; r++) {
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
    }
    for (i = C32; i < C; i++) {
      real xhat = (xr[i] - m) * s;
      dxr[i] = (dyr[i] * (w ? w[i] : 1) - dn_mean - xhat * dn_xhat_mean) * s;
    }
  }
}

/* dw[i] += dy[r, i] * xhat[r, i], db[i] += dy[r, i] for rows r0..r1 in order (dw, db: a block's
 * partial sums). The columns run over a multiple of 32 first, as the loops above, or the vectoriser
 * leaves the loop scalar. */
FLOW_CPU_DISPATCH
static void GEN(layernorm_backward_wb)(real *w, real *b, const real *dy, const real *x, const real *mean,
                                       const real *rstd, int64_t r0, int64_t r1, int64_t C) {
  int64_t n32 = C & ~(int64_t)31;
  for (int64_t r = r0; r < r1; r++) {
    const real *xr = x + r * C, *dyr = dy + r * C;
    real m = mean[r], s = rstd[r];
#pragma GCC ivdep
    for (int64_t i = 0; i < n32; i++) {
      w[i] += dyr[i] * ((xr[i] - m) * s);
      b[i] += dyr[i];
    }
    for (int64_t i = n32; i < C; i++) {
      w[i] += dyr[i] * ((xr[i] - m) * s);
      b[i] += dyr[i];
    }
  }
}

/* ---- the threads' share: rows, or blocks of rows for the backward ---- */

typedef struct GEN(layernorm_job) {
  real *y, *mean, *rstd;               /* forward outputs; for the backward, y is dx */
  real *dw, *db;
  real *part;                          /* backward: dw and db of each block of WB_ROWS rows, zeroed */
  const real *x, *w, *b, *dy, *dmean, *drstd, *smean, *srstd;  /* smean, srstd: the saved statistics */
  int64_t rows, C;
  real eps;
} GEN(layernorm_job);

static void GEN(layernorm_forward_part)(int64_t lo, int64_t hi, int part, void *vjob) {
  const GEN(layernorm_job) *j = vjob;
  GEN(layernorm_forward)(j->y, j->mean, j->rstd, j->x, j->w, j->b, lo, hi, j->C, j->eps);
}

/* Blocks lo..hi of WB_ROWS rows: dx row by row, and each block's dw and db while its rows are in
 * cache. */
static void GEN(layernorm_dx_part)(int64_t lo, int64_t hi, int part, void *vjob) {
  const GEN(layernorm_job) *j = vjob;
  (void)part;
  for (int64_t blk = lo; blk < hi; blk++) {
    int64_t r0 = blk * WB_ROWS, r1 = r0 + WB_ROWS < j->rows ? r0 + WB_ROWS : j->rows;
    GEN(layernorm_backward_dx)(j->y, j->dy, j->dmean, j->drstd, j->x, j->w, j->smean, j->srstd, r0, r1, j->C);
    real *pw = j->part + blk * 2 * j->C;
    GEN(layernorm_backward_wb)(pw, pw + j->C, j->dy, j->x, j->smean, j->srstd, r0, r1, j->C);
  }
}

static void GEN(layernorm_forward_run)(GEN(layernorm_job) *j) {
  flow_cpu_parallel(flow_cpu_threads(j->rows * j->C, FLOW_GRAIN_COSTLY), j->rows, 1, GEN(layernorm_forward_part), j);
}

/* dw and db are the blocks' sums added in block order: the same bits on any number of threads. */
static void GEN(layernorm_backward_run)(GEN(layernorm_job) *j) {
  int64_t blocks = (j->rows + WB_ROWS - 1) / WB_ROWS;
  flow_cpu_parallel(flow_cpu_threads(j->rows * j->C, FLOW_GRAIN_COSTLY), blocks, 1, GEN(layernorm_dx_part), j);
  for (int64_t blk = 0; blk < blocks; blk++) {
    const real *pw = j->part + blk * 2 * j->C, *pb = pw + j->C;
#pragma GCC ivdep
    for (int64_t i = 0; i < j->C; i++) {
      j->dw[i] += pw[i];
      j->db[i] += pb[i];
    }
  }
}

#endif
