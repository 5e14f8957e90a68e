/* The fused AdamW update (PyTorch's torch.optim.AdamW formula), in place on the parameter and its
 * two moment buffers, float32 and float64. The loop after `#else` is written once against `real`;
 * this file includes itself once per dtype (Torch7's THGenerate pattern). */
#ifndef real

#include <tgmath.h>

#include "iter.h"
#include "nn.h"

/* The step's scalars, folded once in double. */
typedef struct adamw_consts {
  double decay;        /* 1 - lr * weight_decay */
  double beta1, beta2;
  double step_size;    /* lr / (1 - beta1^step) */
  double sqrt_bc2;     /* sqrt(1 - beta2^step) */
  double eps;
} adamw_consts;

/* The update on dense arrays with AVX, the same operations in the same order as the scalar loop
 * (so the same bits): -O2 does not vectorise that loop because sqrt may set errno. Returns how
 * many leading elements it updated. */
#ifdef __AVX__
#include <immintrin.h>
#define ADAMW_DENSE(NAME, T, W, V, SFX)                                                            \
  static int64_t NAME(T *p, const T *g, T *m, T *v, int64_t n, const adamw_consts *c) {           \
    const V decay = _mm256_set1_##SFX((T)c->decay), b1 = _mm256_set1_##SFX(1 - (T)c->beta1),     \
            b2 = _mm256_set1_##SFX((T)c->beta2), b2c = _mm256_set1_##SFX(1 - (T)c->beta2),        \
            step = _mm256_set1_##SFX((T)c->step_size), bc2 = _mm256_set1_##SFX((T)c->sqrt_bc2),  \
            eps = _mm256_set1_##SFX((T)c->eps);                                                   \
    int64_t i = 0;                                                                                \
    for (; i + W <= n; i += W) {                                                                  \
      V gi = _mm256_loadu_##SFX(g + i), mi = _mm256_loadu_##SFX(m + i);                          \
      mi = _mm256_add_##SFX(mi, _mm256_mul_##SFX(b1, _mm256_sub_##SFX(gi, mi)));                  \
      V vi = _mm256_add_##SFX(_mm256_mul_##SFX(b2, _mm256_loadu_##SFX(v + i)),                    \
                              _mm256_mul_##SFX(_mm256_mul_##SFX(b2c, gi), gi));                  \
      V den = _mm256_add_##SFX(_mm256_div_##SFX(_mm256_sqrt_##SFX(vi), bc2), eps);               \
      V pi = _mm256_sub_##SFX(_mm256_mul_##SFX(_mm256_loadu_##SFX(p + i), decay),                \
                              _mm256_mul_##SFX(step, _mm256_div_##SFX(mi, den)));              \
      _mm256_storeu_##SFX(m + i, mi);                                                             \
      _mm256_storeu_##SFX(v + i, vi);                                                             \
      _mm256_storeu_##SFX(p + i, pi);                                                             \
    }                                                                                             \
    return i;                                                                                     \
  }
ADAMW_DENSE(adamw_dense_f32, float, 8, __m256, ps)
ADAMW_DENSE(adamw_dense_f64, double, 4, __m256d, pd)
#else
static int64_t adamw_dense_f32(float *p, const float *g, float *m, float *v, int64_t n, const adamw_consts *c) {
  (void)p, (void)g, (void)m, (void)v, (void)n, (void)c;
  return 0;
}
static int64_t adamw_dense_f64(double *p, const double *g, double *m, double *v, int64_t n,
                               const adamw_consts *c) {
  (void)p, (void)g, (void)m, (void)v, (void)n, (void)c;
  return 0;
}
#endif

#define FLOW_GENERIC_FILE "adamw.c"
#include "generic.h"

int flow_cpu_adamw(flow_tensor *p, const flow_tensor *g, flow_tensor *m, flow_tensor *v,
                   const flow_adamw_hyper *h) {
  adamw_consts c = {
      .decay = 1 - h->lr * h->weight_decay,
      .beta1 = h->beta1,
      .beta2 = h->beta2,
      .step_size = h->lr / (1 - pow(h->beta1, (double)h->step)),
      .sqrt_bc2 = sqrt(1 - pow(h->beta2, (double)h->step)),
      .eps = h->eps,
  };
  flow_iter it;
  flow_tensor *ops[4] = {p, (flow_tensor *)g, m, v};
  flow_iter_init(&it, ops, 4);
  flow_iter_run(&it, p->dtype == FLOW_F32 ? adamw_loop_f32 : adamw_loop_f64, &c);
  return 0;
}

#else

/* p *= 1 - lr wd;  m += (1 - b1)(g - m);  v = b2 v + (1 - b2) g^2;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
static void GEN(adamw_loop)(char **ptr, const int64_t *stride, int64_t n, void *ctx) {
  const adamw_consts *c = ctx;
  const real decay = (real)c->decay, b1 = (real)c->beta1, b2 = (real)c->beta2, step = (real)c->step_size,
             bc2 = (real)c->sqrt_bc2, eps = (real)c->eps;
  char *pp = ptr[0], *pg = ptr[1], *pm = ptr[2], *pv = ptr[3];
  /* Dense operands (parameters and their buffers always are): vector loop first. */
  int64_t i = 0;
  if (stride[0] == sizeof(real) && stride[1] == sizeof(real) && stride[2] == sizeof(real) &&
      stride[3] == sizeof(real)) {
    i = GEN(adamw_dense)((real *)pp, (const real *)pg, (real *)pm, (real *)pv, n, c);
    pp += i * stride[0], pg += i * stride[1], pm += i * stride[2], pv += i * stride[3];
  }
  for (; i < n; i++, pp += stride[0], pg += stride[1], pm += stride[2], pv += stride[3]) {
    real *p = (real *)pp, *m = (real *)pm, *v = (real *)pv, g = *(const real *)pg;
    *m += (1 - b1) * (g - *m);
    *v = b2 * *v + (1 - b2) * g * g;
    *p = *p * decay - step * (*m / (sqrt(*v) / bc2 + eps));
  }
}

#endif
