/* The reference kernels of conv2d (im2col + GEMM), max/avg pool2d and batch norm on the CPU,
 * forward and backward, float32 and float64, NCHW: float64 runs here, float32 on oneDNN
 * (conv_onednn.c), and the specs check one against the other. The kernels after `#else` are
 * written once against `real`: this file includes itself once per dtype (Torch7's THGenerate
 * pattern). */
#ifndef real

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "nn.h"

static const char OP[] = "conv2d";
/* Independent partial sums in the batch-norm moments (8 doubles: one AVX-512 register). */
#define BN_LANES 8

#define FLOW_GENERIC_FILE "conv.c"
#include "generic.h"

/* Dense views of n inputs (NULL stays NULL); -1 if a copy fails. */
static int dense_all(const flow_tensor *const *t, const void **p, flow_tensor **tmp, int n) {
  for (int i = 0; i < n; i++) {
    tmp[i] = NULL;
    p[i] = NULL;
    if (t[i] && !(p[i] = flow_cpu_dense(t[i], &tmp[i]))) {
      while (i-- > 0) if (tmp[i]) flow_tensor_decref(tmp[i]);
      return -1;
    }
  }
  return 0;
}

static void release_all(flow_tensor **tmp, int n) {
  for (int i = 0; i < n; i++) if (tmp[i]) flow_tensor_decref(tmp[i]);
}

/* The im2col buffer of one group: [Cg * kh * kw, OH * OW]. */
static void *col_alloc(const flow_conv_geom *g, size_t esize) {
  size_t n = (size_t)(g->C / g->groups * g->kh * g->kw) * (size_t)(g->OH * g->OW);
  void *p = malloc((n ? n : 1) * esize);
  if (!p) flow_error_set("conv2d: out of memory for a %zu-element im2col buffer", n);
  return p;
}

int flow_cpu_conv2d_forward_reference(flow_tensor *y, const flow_tensor *x, const flow_tensor *w,
                                      const flow_tensor *bias, const flow_conv_geom *g) {
  const flow_tensor *in[3] = {x, w, bias};
  const void *p[3];
  flow_tensor *tmp[3];
  if (dense_all(in, p, tmp, 3) != 0) return -1;
  void *col = col_alloc(g, flow_dtype_size(x->dtype));
  int rc = -1;
  if (col) {
    if (x->dtype == FLOW_F32) rc = conv_forward_f32(flow_tensor_data(y), p[0], p[1], p[2], col, g);
    else rc = conv_forward_f64(flow_tensor_data(y), p[0], p[1], p[2], col, g);
  }
  free(col);
  release_all(tmp, 3);
  return rc;
}

int flow_cpu_conv2d_backward_reference(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                       const flow_tensor *x, const flow_tensor *w, const flow_conv_geom *g) {
  const flow_tensor *in[3] = {dy, x, w};
  const void *p[3];
  flow_tensor *tmp[3];
  if (dense_all(in, p, tmp, 3) != 0) return -1;
  void *col = col_alloc(g, flow_dtype_size(x->dtype));
  int rc = -1;
  if (col) {
    memset(flow_tensor_data(dx), 0, flow_tensor_nbytes(dx));
    memset(flow_tensor_data(dw), 0, flow_tensor_nbytes(dw));
    if (x->dtype == FLOW_F32)
      rc = conv_backward_f32(flow_tensor_data(dx), flow_tensor_data(dw), flow_tensor_data(db), p[0], p[1], p[2], col,
                             g);
    else
      rc = conv_backward_f64(flow_tensor_data(dx), flow_tensor_data(dw), flow_tensor_data(db), p[0], p[1], p[2], col,
                             g);
  }
  free(col);
  release_all(tmp, 3);
  return rc;
}

int flow_cpu_pool2d_forward_reference(flow_tensor *y, const flow_tensor *x, const flow_conv_geom *g, bool max) {
  flow_tensor *tmp;
  const void *px = flow_cpu_dense(x, &tmp);
  if (!px) return -1;
  if (x->dtype == FLOW_F32) pool_forward_f32(flow_tensor_data(y), px, g, max);
  else pool_forward_f64(flow_tensor_data(y), px, g, max);
  if (tmp) flow_tensor_decref(tmp);
  return 0;
}

int flow_cpu_pool2d_backward_reference(flow_tensor *dx, const flow_tensor *dy, const flow_tensor *x,
                                       const flow_conv_geom *g, bool max) {
  const flow_tensor *in[2] = {dy, x};
  const void *p[2];
  flow_tensor *tmp[2];
  if (dense_all(in, p, tmp, 2) != 0) return -1;
  memset(flow_tensor_data(dx), 0, flow_tensor_nbytes(dx));
  if (x->dtype == FLOW_F32) pool_backward_f32(flow_tensor_data(dx), p[0], p[1], g, max);
  else pool_backward_f64(flow_tensor_data(dx), p[0], p[1], g, max);
  release_all(tmp, 2);
  return 0;
}

/* x [N, C, S...] as N x C x S. */
static void bn_dims(const flow_tensor *x, int64_t *N, int64_t *C, int64_t *S) {
  *N = x->shape[0];
  *C = x->shape[1];
  *S = flow_shape_numel(x->ndim - 2, x->shape + 2);
}

int flow_cpu_batchnorm_forward_reference(flow_tensor *y, const flow_tensor *x, const flow_tensor *w,
                                         const flow_tensor *b, flow_tensor *rm, flow_tensor *rv, bool training,
                                         double momentum, double eps) {
  const flow_tensor *in[3] = {x, w, b};
  const void *p[3];
  flow_tensor *tmp[3];
  if (dense_all(in, p, tmp, 3) != 0) return -1;
  int64_t N, C, S;
  bn_dims(x, &N, &C, &S);
  if (x->dtype == FLOW_F32)
    bn_forward_f32(flow_tensor_data(y), p[0], p[1], p[2], flow_tensor_data(rm), rm->stride[0], flow_tensor_data(rv),
                   rv->stride[0], N, C, S, training, momentum, eps);
  else
    bn_forward_f64(flow_tensor_data(y), p[0], p[1], p[2], flow_tensor_data(rm), rm->stride[0], flow_tensor_data(rv),
                   rv->stride[0], N, C, S, training, momentum, eps);
  release_all(tmp, 3);
  return 0;
}

int flow_cpu_batchnorm_backward_reference(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                          const flow_tensor *x, const flow_tensor *w, const flow_tensor *rm,
                                          const flow_tensor *rv, bool training, double eps) {
  const flow_tensor *in[5] = {dy, x, w, rm, rv};
  const void *p[5];
  flow_tensor *tmp[5];
  if (dense_all(in, p, tmp, 5) != 0) return -1;
  int64_t N, C, S;
  bn_dims(x, &N, &C, &S);
  if (x->dtype == FLOW_F32)
    bn_backward_f32(flow_tensor_data(dx), flow_tensor_data(dw), flow_tensor_data(db), p[0], p[1], p[2], p[3], p[4],
                    N, C, S, training, eps);
  else
    bn_backward_f64(flow_tensor_data(dx), flow_tensor_data(dw), flow_tensor_data(db), p[0], p[1], p[2], p[3], p[4],
                    N, C, S, training, eps);
  release_all(tmp, 5);
  return 0;
}

#else

/* col[(c kh + i) kw + j, oh OW + ow] = x[c, oh sh - ph + i dh, ow sw - pw + j dw] (0 outside). */
static void GEN(im2col)(real *col, const real *x, int64_t Cg, const flow_conv_geom *g) {
  int64_t P = g->OH * g->OW;
  for (int64_t c = 0; c < Cg; c++)
    for (int64_t i = 0; i < g->kh; i++)
      for (int64_t j = 0; j < g->kw; j++) {
        real *row = col + ((c * g->kh + i) * g->kw + j) * P;
        const real *xc = x + c * g->H * g->W;
        for (int64_t oh = 0; oh < g->OH; oh++) {
          int64_t ih = oh * g->sh - g->ph + i * g->dh;
          for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t iw = ow * g->sw - g->pw + j * g->dw;
            row[oh * g->OW + ow] = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W ? xc[ih * g->W + iw] : 0;
          }
        }
      }
}

/* The adjoint of im2col: dx[c, ih, iw] += col[...] for every window position reading it. */
static void GEN(col2im)(real *dx, const real *col, int64_t Cg, const flow_conv_geom *g) {
  int64_t P = g->OH * g->OW;
  for (int64_t c = 0; c < Cg; c++)
    for (int64_t i = 0; i < g->kh; i++)
      for (int64_t j = 0; j < g->kw; j++) {
        const real *row = col + ((c * g->kh + i) * g->kw + j) * P;
        real *dxc = dx + c * g->H * g->W;
        for (int64_t oh = 0; oh < g->OH; oh++) {
          int64_t ih = oh * g->sh - g->ph + i * g->dh;
          if (ih < 0 || ih >= g->H) continue;
          for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t iw = ow * g->sw - g->pw + j * g->dw;
            if (iw >= 0 && iw < g->W) dxc[ih * g->W + iw] += row[oh * g->OW + ow];
          }
        }
      }
}

/* Per image and group: y_g [Og, P] = w_g [Og, K] @ col [K, P] (+ bias), K = Cg kh kw. */
static int GEN(conv_forward)(real *y, const real *x, const real *w, const real *bias, real *col,
                             const flow_conv_geom *g) {
  int64_t Cg = g->C / g->groups, Og = g->O / g->groups, K = Cg * g->kh * g->kw, P = g->OH * g->OW;
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t gr = 0; gr < g->groups; gr++) {
      real *yg = y + (n * g->O + gr * Og) * P;
      GEN(im2col)(col, x + (n * g->C + gr * Cg) * g->H * g->W, Cg, g);
      if (bias)
        for (int64_t o = 0; o < Og; o++)
          for (int64_t q = 0; q < P; q++) yg[o * P + q] = bias[gr * Og + o];
      if (GEN(flow_cpu_gemm)(OP, false, false, Og, P, K, 1, w + gr * Og * K, K, col, P, bias ? 1 : 0, yg, P))
        return -1;
    }
  return 0;
}

/* dw_g += dy_g [Og, P] @ col^T;  dcol = w_g^T @ dy_g, scattered back by col2im;  db = sum dy. */
static int GEN(conv_backward)(real *dx, real *dw, real *db, const real *dy, const real *x, const real *w,
                              real *col, const flow_conv_geom *g) {
  int64_t Cg = g->C / g->groups, Og = g->O / g->groups, K = Cg * g->kh * g->kw, P = g->OH * g->OW;
  for (int64_t o = 0; o < g->O; o++) {
    real s = 0;
    for (int64_t n = 0; n < g->N; n++)
      for (int64_t q = 0; q < P; q++) s += dy[(n * g->O + o) * P + q];
    db[o] = s;
  }
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t gr = 0; gr < g->groups; gr++) {
      const real *dyg = dy + (n * g->O + gr * Og) * P;
      GEN(im2col)(col, x + (n * g->C + gr * Cg) * g->H * g->W, Cg, g);
      if (GEN(flow_cpu_gemm)(OP, false, true, Og, K, P, 1, dyg, P, col, P, 1, dw + gr * Og * K, K)) return -1;
      if (GEN(flow_cpu_gemm)(OP, true, false, K, P, Og, 1, w + gr * Og * K, K, dyg, P, 0, col, P)) return -1;
      GEN(col2im)(dx + (n * g->C + gr * Cg) * g->H * g->W, col, Cg, g);
    }
  return 0;
}

/* Window of output (oh, ow) clipped to the image: rows [*h0, *h1), columns [*w0, *w1). */
static void GEN(window)(const flow_conv_geom *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0,
                        int64_t *w1) {
  *h0 = oh * g->sh - g->ph;
  *w0 = ow * g->sw - g->pw;
  *h1 = *h0 + g->kh;
  *w1 = *w0 + g->kw;
  if (*h0 < 0) *h0 = 0;
  if (*w0 < 0) *w0 = 0;
  if (*h1 > g->H) *h1 = g->H;
  if (*w1 > g->W) *w1 = g->W;
}

static void GEN(pool_forward)(real *y, const real *x, const flow_conv_geom *g, bool max) {
  real inv = (real)1 / (real)(g->kh * g->kw);
  for (int64_t nc = 0; nc < g->N * g->C; nc++) {
    const real *xc = x + nc * g->H * g->W;
    for (int64_t oh = 0; oh < g->OH; oh++)
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t h0, h1, w0, w1;
        GEN(window)(g, oh, ow, &h0, &h1, &w0, &w1);
        real acc = max ? -INFINITY : 0;
        for (int64_t h = h0; h < h1; h++)
          for (int64_t v = w0; v < w1; v++) {
            real e = xc[h * g->W + v];
            if (max) acc = e > acc || isnan(e) ? e : acc;
            else acc += e;
          }
        y[(nc * g->OH + oh) * g->OW + ow] = max ? acc : acc * inv;
      }
  }
}

static void GEN(pool_backward)(real *dx, const real *dy, const real *x, const flow_conv_geom *g, bool max) {
  real inv = (real)1 / (real)(g->kh * g->kw);
  for (int64_t nc = 0; nc < g->N * g->C; nc++) {
    const real *xc = x + nc * g->H * g->W;
    real *dxc = dx + nc * g->H * g->W;
    for (int64_t oh = 0; oh < g->OH; oh++)
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t h0, h1, w0, w1;
        GEN(window)(g, oh, ow, &h0, &h1, &w0, &w1);
        real d = dy[(nc * g->OH + oh) * g->OW + ow];
        if (max) {
          int64_t best = -1;
          real m = -INFINITY;
          for (int64_t h = h0; h < h1; h++)
            for (int64_t v = w0; v < w1; v++) {
              real e = xc[h * g->W + v];
              if (best < 0 || e > m || (isnan(e) && !isnan(m))) { m = e; best = h * g->W + v; }
            }
          if (best >= 0) dxc[best] += d;
        } else {
          for (int64_t h = h0; h < h1; h++)
            for (int64_t v = w0; v < w1; v++) dxc[h * g->W + v] += d * inv;
        }
      }
  }
}

/* Batch mean and biased variance of channel c over N x S (two passes). */
void GEN(flow_cpu_bn_moments)(const real *x, int64_t N, int64_t C, int64_t S, int64_t c, double *mean, double *var) {
  /* BN_LANES independent double sums per pass, so the adds vectorize instead of waiting on one another */
  double s[BN_LANES] = {0}, q[BN_LANES] = {0}, st = 0, qt = 0;
  for (int64_t n = 0; n < N; n++) {
    const real *p = x + (n * C + c) * S;
    int64_t k = 0;
    for (; k + BN_LANES <= S; k += BN_LANES)
      for (int l = 0; l < BN_LANES; l++) s[l] += p[k + l];
    for (; k < S; k++) st += p[k];
  }
  for (int l = 0; l < BN_LANES; l++) st += s[l];
  double m = st / (double)(N * S);
  for (int64_t n = 0; n < N; n++) {
    const real *p = x + (n * C + c) * S;
    int64_t k = 0;
    for (; k + BN_LANES <= S; k += BN_LANES)
      for (int l = 0; l < BN_LANES; l++) q[l] += (p[k + l] - m) * (p[k + l] - m);
    for (; k < S; k++) qt += (p[k] - m) * (p[k] - m);
  }
  for (int l = 0; l < BN_LANES; l++) qt += q[l];
  *mean = m;
  *var = qt / (double)(N * S);
}

static void GEN(bn_forward)(real *y, const real *x, const real *w, const real *b, real *rm, int64_t rms, real *rv,
                            int64_t rvs, int64_t N, int64_t C, int64_t S, bool training, double momentum,
                            double eps) {
  int64_t M = N * S;
  for (int64_t c = 0; c < C; c++) {
    double mean, var;
    if (training) {
      GEN(flow_cpu_bn_moments)(x, N, C, S, c, &mean, &var);
      rm[c * rms] = (real)((1 - momentum) * rm[c * rms] + momentum * mean);
      rv[c * rvs] = (real)((1 - momentum) * rv[c * rvs] + momentum * (M > 1 ? var * M / (M - 1) : var));
    } else {
      mean = rm[c * rms];
      var = rv[c * rvs];
    }
    double scale = w[c] / sqrt(var + eps), shift = b[c] - mean * scale;
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < S; k++) y[(n * C + c) * S + k] = (real)(x[(n * C + c) * S + k] * scale + shift);
  }
}

/* xhat = (x - mean) rstd:  db = sum dy,  dw = sum dy xhat,  training dx = w rstd (dy - db/M - xhat dw/M)
 * (the batch statistics depend on x), eval dx = w rstd dy. */
static void GEN(bn_backward)(real *dx, real *dw, real *db, const real *dy, const real *x, const real *w,
                             const real *rm, const real *rv, int64_t N, int64_t C, int64_t S, bool training,
                             double eps) {
  int64_t M = N * S;
  for (int64_t c = 0; c < C; c++) {
    double mean, var;
    if (training) GEN(flow_cpu_bn_moments)(x, N, C, S, c, &mean, &var);
    else { mean = rm[c]; var = rv[c]; }
    double rstd = 1 / sqrt(var + eps), sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < S; k++) {
        int64_t i = (n * C + c) * S + k;
        sdy += dy[i];
        sdyx += dy[i] * (x[i] - mean) * rstd;
      }
    db[c] = (real)sdy;
    dw[c] = (real)sdyx;
    double ws = w[c] * rstd;
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < S; k++) {
        int64_t i = (n * C + c) * S + k;
        dx[i] = training ? (real)(ws * (dy[i] - sdy / M - (x[i] - mean) * rstd * sdyx / M)) : (real)(ws * dy[i]);
      }
  }
}

#endif
