/* Softmax and log-softmax along one axis, forward and backward, float32 and float64.
 * The kernels after `#else` are written once against `real`: this file includes itself once per
 * dtype (Torch7's THGenerate pattern). A tensor is seen as [outer, n, inner] around the axis. */
#ifndef real

#include <tgmath.h>

#include "nn.h"

#define real float
#define GEN(name) name##_f32
#include "softmax.c"
#undef real
#undef GEN
#define real double
#define GEN(name) name##_f64
#include "softmax.c"
#undef real
#undef GEN

static void split_axis(const flow_tensor *t, int axis, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = flow_shape_numel(axis, t->shape);
  *n = t->ndim ? t->shape[axis] : 1;
  *inner = t->ndim ? flow_shape_numel(t->ndim - axis - 1, t->shape + axis + 1) : 1;
}

int flow_cpu_softmax_forward(flow_tensor *y, const flow_tensor *x, int axis, bool as_log) {
  flow_tensor *tmp;
  const void *xp = flow_cpu_dense(x, &tmp);
  if (!xp) return -1;
  int64_t outer, n, inner;
  split_axis(x, axis, &outer, &n, &inner);
  if (x->dtype == FLOW_F32) softmax_forward_f32(flow_tensor_data(y), xp, outer, n, inner, as_log);
  else softmax_forward_f64(flow_tensor_data(y), xp, outer, n, inner, as_log);
  flow_tensor_decref(tmp);
  return 0;
}

int flow_cpu_softmax_backward(flow_tensor *dx, const flow_tensor *y, const flow_tensor *dy, int axis,
                              bool as_log) {
  flow_tensor *ty, *tdy;
  const void *yp = flow_cpu_dense(y, &ty);
  const void *dyp = yp ? flow_cpu_dense(dy, &tdy) : NULL;
  if (!dyp) { flow_tensor_decref(ty); return -1; }
  int64_t outer, n, inner;
  split_axis(y, axis, &outer, &n, &inner);
  if (y->dtype == FLOW_F32) softmax_backward_f32(flow_tensor_data(dx), yp, dyp, outer, n, inner, as_log);
  else softmax_backward_f64(flow_tensor_data(dx), yp, dyp, outer, n, inner, as_log);
  flow_tensor_decref(ty);
  flow_tensor_decref(tdy);
  return 0;
}

#else

/* Per row (n elements, stride `inner`): m = max x,  s = sum exp(x - m),
 * softmax: y = exp(x - m) / s;  log_softmax: y = x - m - log s. */
static void GEN(softmax_forward)(real *y, const real *x, int64_t outer, int64_t n, int64_t inner, bool as_log) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const real *xr = x + o * n * inner + i;
      real *yr = y + o * n * inner + i;
      real m = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; j++) if (xr[j * inner] > m) m = xr[j * inner];
      if (as_log) {
        for (int64_t j = 0; j < n; j++) s += exp(xr[j * inner] - m);
        real shift = m + log(s);
        for (int64_t j = 0; j < n; j++) yr[j * inner] = xr[j * inner] - shift;
      } else {
        for (int64_t j = 0; j < n; j++) s += (yr[j * inner] = exp(xr[j * inner] - m));
        real r = 1 / s;
        for (int64_t j = 0; j < n; j++) yr[j * inner] *= r;
      }
    }
}

/* softmax:     dx = y * (dy - sum(dy * y))
 * log_softmax: dx = dy - exp(y) * sum(dy) */
static void GEN(softmax_backward)(real *dx, const real *y, const real *dy, int64_t outer, int64_t n,
                                  int64_t inner, bool as_log) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * n * inner + i;
      const real *yr = y + base, *dyr = dy + base;
      real *dxr = dx + base, s = 0;
      if (as_log) {
        for (int64_t j = 0; j < n; j++) s += dyr[j * inner];
        for (int64_t j = 0; j < n; j++) dxr[j * inner] = dyr[j * inner] - exp(yr[j * inner]) * s;
      } else {
        for (int64_t j = 0; j < n; j++) s += dyr[j * inner] * yr[j * inner];
        for (int64_t j = 0; j < n; j++) dxr[j * inner] = yr[j * inner] * (dyr[j * inner] - s);
      }
    }
}

#endif
