/* Reductions: sum (more in later sections). Shape rules and gradients. */
#include "reduce.h"

#include <string.h>

#include "../kernels/cpu/cpu.h"
#include "elementwise.h"
#include "shape.h"

int flow_reduce_mask(const flow_op *op, const flow_attrs *a, int ndim, bool *mask) {
  for (int d = 0; d < ndim; d++) mask[d] = a->naxes == 0;
  for (int i = 0; i < a->naxes; i++) {
    int64_t ax;
    if (flow_axis_norm(op->name, a->axes[i], ndim, &ax) != 0) return -1;
    if (ndim == 0) continue;
    if (mask[ax]) return flow_error_set("%s: axis %lld given twice", op->name, (long long)a->axes[i]);
    mask[ax] = true;
  }
  return 0;
}

void flow_reduce_meta(const flow_tensor *t, const bool *mask, bool keepdim, flow_meta *out) {
  out->dtype = t->dtype;
  out->device = t->device;
  out->ndim = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (!mask[d]) out->shape[out->ndim++] = t->shape[d];
    else if (keepdim) out->shape[out->ndim++] = 1;
  }
}

static int infer_sum(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                     flow_meta *out) {
  (void)nin;
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(op, a, in[0]->ndim, mask) != 0) return -1;
  if (in[0]->dtype == FLOW_F16 || in[0]->dtype == FLOW_BF16)
    return flow_error_set("%s: %s is storage-only on the CPU (cast to float32 first)", op->name,
                          flow_dtype_name(in[0]->dtype));
  flow_reduce_meta(in[0], mask, a->keepdim, out);
  if (in[0]->dtype == FLOW_BOOL || in[0]->dtype == FLOW_U8 || in[0]->dtype == FLOW_I32) out->dtype = FLOW_I64;
  return 0;
}

static FLOW_KERNEL(cpu_sum) {
  (void)nin; (void)nout;
  bool mask[FLOW_MAX_DIMS];
  for (int d = 0; d < in[0]->ndim; d++) mask[d] = a->naxes == 0;
  for (int i = 0; i < a->naxes; i++) mask[a->axes[i] < 0 ? a->axes[i] + in[0]->ndim : a->axes[i]] = true;
  if (in[0]->dtype != out[0]->dtype) { /* integer sums accumulate in int64 */
    flow_tensor *c = flow_tensor_new(FLOW_I64, in[0]->device, in[0]->ndim, in[0]->shape);
    if (!c) return -1;
    flow_cpu_copy(c, in[0]);
    int rc = flow_cpu_sum(out[0], c, mask);
    flow_tensor_decref(c);
    return rc;
  }
  return flow_cpu_sum(out[0], in[0], mask);
}

/* The gradient of a sum is the output gradient broadcast back over the reduced axes. */
static int grad_sum(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  const flow_meta *im = &c->in_meta[0];
  int64_t kshape[FLOW_MAX_DIMS];
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(c->op, c->attrs, im->ndim, mask) != 0) return -1;
  for (int d = 0; d < im->ndim; d++) kshape[d] = mask[d] ? 1 : im->shape[d];
  flow_tensor *k = flow_reshape(c->gout[0], im->ndim, kshape);
  if (!k) return -1;
  gin[0] = flow_expand(k, im->ndim, im->shape);
  flow_tensor_decref(k);
  return gin[0] ? 0 : -1;
}

FLOW_OP(sum) {.name = "sum", .nin = 1, .nout = 1, .infer = infer_sum,
              .kernel = {[FLOW_CPU] = cpu_sum}, .grad = grad_sum};

flow_tensor *flow_sum(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.naxes = naxes;
  for (int i = 0; i < naxes; i++) at.axes[i] = axes[i];
  at.keepdim = keepdim;
  return flow_op_call1(&flow_op_sum, &t, 1, &at);
}

flow_tensor *flow_sum_to_shape(flow_tensor *g, int ndim, const int64_t *shape) {
  if (flow_shape_eq(g->ndim, g->shape, ndim, shape)) { flow_tensor_incref(g); return g; }
  int64_t axes[FLOW_MAX_DIMS];
  int naxes = 0, lead = g->ndim - ndim;
  for (int d = 0; d < g->ndim; d++)
    if (d < lead || (shape[d - lead] == 1 && g->shape[d] != 1)) axes[naxes++] = d;
  flow_tensor *s = flow_sum(g, naxes, axes, true);
  if (!s) return NULL;
  flow_tensor *r = flow_reshape(s, ndim, shape);
  flow_tensor_decref(s);
  return r;
}
