/* The fused AdamW update (PyTorch's torch.optim.AdamW formula), in place on the parameter and its
 * two moment buffers, float32 and float64. The loop after `#else` is written once against `real`;
 * this file includes itself once per dtype (Torch7's THGenerate pattern). */
#ifndef real

#include <tgmath.h>

#include "iter.h"
#include "nn.h"
#include "onednn.h"

/* The step's scalars, folded once in double. */
typedef struct adamw_consts {
  double decay;        /* 1 - lr * weight_decay */
  double beta1, beta2;
  double step_size;    /* lr / (1 - beta1^step) */
  double sqrt_bc2;     /* sqrt(1 - beta2^step) */
  double eps;
  const char *p;       /* with a bf16 copy to fill (twin): p's data (contiguous), and the copy's */
  uint16_t *twin;
} adamw_consts;

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
  /* a weight that bf16 autocast rounded for its GEMMs gets its next copy here, rounded as the
   * parameter is written, not in a pass of its own at its next GEMM (onednn.h: carrying) */
  flow_tensor *twin = p->dtype == FLOW_F32 ? flow_onednn_bf16_carry(p) : NULL;
  c.p = flow_tensor_data(p);
  c.twin = twin ? flow_tensor_data(twin) : NULL;
  flow_iter it;
  flow_tensor *ops[4] = {p, (flow_tensor *)g, m, v};
  flow_iter_init(&it, ops, 4);
  flow_iter_run_parallel(&it, twin ? adamw_twin_loop_f32 : p->dtype == FLOW_F32 ? adamw_loop_f32 : adamw_loop_f64, &c,
                         FLOW_GRAIN_COSTLY);
  flow_tensor_decref(twin);
  return 0;
}

#else

/* p *= 1 - lr wd;  m += (1 - b1)(g - m);  v = b2 v + (1 - b2) g^2;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
 * Dense operands (parameters and their buffers always are) run a loop over a multiple of 32
 * first (-O2's cheap vectoriser takes only loops without a scalar epilogue; and only with
 * -fno-math-errno, which CMakeLists.txt sets for this file, since sqrt may set errno); the same
 * operations in the same order everywhere, so every element gets the same bits. */
#define ADAMW_UPDATE(p, g, m, v)                                    \
  do {                                                              \
    real g_ = (g);                                                  \
    (m) += (1 - b1) * (g_ - (m));                                   \
    (v) = b2 * (v) + (1 - b2) * g_ * g_;                            \
    (p) = (p) * decay - step * ((m) / (sqrt(v) / bc2 + eps));       \
  } while (0)

FLOW_CPU_DISPATCH
static void GEN(adamw_loop)(char **ptr, const int64_t *stride, int64_t n, void *ctx) {
  const adamw_consts *c = ctx;
  const real decay = (real)c->decay, b1 = (real)c->beta1, b2 = (real)c->beta2, step = (real)c->step_size,
             bc2 = (real)c->sqrt_bc2, eps = (real)c->eps;
  if (stride[0] == sizeof(real) && stride[1] == sizeof(real) && stride[2] == sizeof(real) &&
      stride[3] == sizeof(real)) {
    real *p = (real *)ptr[0], *m = (real *)ptr[2], *v = (real *)ptr[3];
    const real *g = (const real *)ptr[1];
    int64_t n32 = n & ~(int64_t)31, i;
#pragma GCC ivdep
    for (i = 0; i < n32; i++) ADAMW_UPDATE(p[i], g[i], m[i], v[i]);
    for (i = n32; i < n; i++) ADAMW_UPDATE(p[i], g[i], m[i], v[i]);
    return;
  }
  char *pp = ptr[0], *pg = ptr[1], *pm = ptr[2], *pv = ptr[3];
  for (int64_t i = 0; i < n; i++, pp += stride[0], pg += stride[1], pm += stride[2], pv += stride[3])
    ADAMW_UPDATE(*(real *)pp, *(const real *)pg, *(real *)pm, *(real *)pv);
}

/* The same, and the updated parameter rounded to bf16 into its copy (float32 only; the parameter
 * contiguous, its element i at copy element i), a chunk at a time while the chunk is in L1, by the
 * rounding the GEMMs' own copies get (flow_onednn_round_bf16). */
#define CHUNK 1024
__attribute__((unused)) static void GEN(adamw_twin_loop)(char **ptr, const int64_t *stride, int64_t n, void *ctx) {
  const adamw_consts *c = ctx;
  for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
    int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
    char *part[4];
    for (int k = 0; k < 4; k++) part[k] = ptr[k] + i0 * stride[k];
    GEN(adamw_loop)(part, stride, len, ctx);
    uint16_t *h = c->twin + (part[0] - c->p) / (int64_t)sizeof(real);
    if (stride[0] == sizeof(real)) flow_onednn_round_bf16(h, (const float *)part[0], len);
    else   /* the parameter is contiguous, so its elements step through the copy alike */
      for (int64_t i = 0; i < len; i++)
        flow_onednn_round_bf16(h + i * stride[0] / (int64_t)sizeof(real), (const float *)(part[0] + i * stride[0]), 1);
  }
}
#undef CHUNK

#undef ADAMW_UPDATE

#endif
