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
  for (int64_t i = 0; i < n; i++, pp += stride[0], pg += stride[1], pm += stride[2], pv += stride[3]) {
    real *p = (real *)pp, *m = (real *)pm, *v = (real *)pv, g = *(const real *)pg;
    *m += (1 - b1) * (g - *m);
    *v = b2 * *v + (1 - b2) * g * g;
    *p = *p * decay - step * (*m / (sqrt(*v) / bc2 + eps));
  }
}

#endif
