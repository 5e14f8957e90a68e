/* Ordering ops: sort (argsort is its indices) and topk along one axis. Shape and dtype rules, the
 * SBP rule (split on any other axis: each line is ordered where it lies), and the gradient, which
 * scatters the values' gradient back to the positions the indices name. */
#include "sort.h"

#include "../kernels/cpu/cpu.h"
#include "../sbp/signature.h"
#include "index.h"

/* values like x, indices int64 of the same shape. A 0-d x is one line of one element. */
static int infer_sort(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  (void)nin;
  int64_t ax;
  if (flow_axis_norm(op->name, a->axis, in[0].ndim, &ax) != 0) return -1;
  out[0] = out[1] = in[0];
  out[1].dtype = FLOW_I64;
  return 0;
}

/* sort's, with attrs.k (0 <= k <= the axis' size) kept along attrs.axis. */
static int infer_topk(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  if (infer_sort(op, in, nin, a, out) != 0) return -1;
  int nd = in[0].ndim, ax = nd == 0 ? 0 : (int)(a->axis < 0 ? a->axis + nd : a->axis);
  int64_t n = nd ? in[0].shape[ax] : 1;
  if (a->k < 0 || a->k > n)
    return flow_error_set("%s: k = %lld is out of range for axis %lld of size %lld (expected 0 <= k <= %lld)", op->name,
                          (long long)a->k, (long long)a->axis, (long long)n, (long long)n);
  if (nd) out[0].shape[ax] = out[1].shape[ax] = a->k;
  return 0;
}

static FLOW_KERNEL(cpu_sort) {
  (void)nin; (void)nout;
  const flow_tensor *x = in[0];
  int axis = x->ndim == 0 ? -1 : (int)(a->axis < 0 ? a->axis + x->ndim : a->axis);
  int64_t k = axis < 0 ? 1 : out[0]->shape[axis];
  return flow_cpu_sort(out[0], out[1], x, axis, k, a->flags & FLOW_ATTR_DESCENDING);
}

/* y = x[idx] along the axis, so dx = g put back at idx (zeros at the positions topk dropped). */
static int grad_sort(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  if (c->in_meta[0].ndim == 0) { flow_tensor_incref(c->gout[0]); gin[0] = c->gout[0]; return 0; }
  gin[0] = flow_scatter_into_zeros(&c->in_meta[0], c->attrs->axis, c->out[1], c->gout[0]);
  return gin[0] ? 0 : -1;
}

FLOW_OP(sort) {.nin = 1, .nout = 2, .sbp = FLOW_SBP_RULE(softmax, 0),
               .infer = infer_sort, .grad = grad_sort, .save_out = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, sort, cpu_sort)
FLOW_OP(topk) {.nin = 1, .nout = 2, .sbp = FLOW_SBP_RULE(softmax, 0),
               .infer = infer_topk, .grad = grad_sort, .save_out = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, topk, cpu_sort)

static int call_sort(const flow_op *op, flow_tensor *t, const flow_attrs *at, flow_tensor **values,
                     flow_tensor **indices) {
  flow_tensor *out[2];
  if (flow_op_call(op, &t, 1, at, out) != 0) return -1;
  if (values) *values = out[0];
  else flow_tensor_decref(out[0]);
  if (indices) *indices = out[1];
  else flow_tensor_decref(out[1]);
  return 0;
}

int flow_sort(flow_tensor *t, int64_t axis, bool descending, flow_tensor **values, flow_tensor **indices) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  at.flags = descending ? FLOW_ATTR_DESCENDING : 0;
  return call_sort(&flow_op_sort, t, &at, values, indices);
}

int flow_topk(flow_tensor *t, int64_t k, int64_t axis, bool largest, flow_tensor **values, flow_tensor **indices) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  at.k = k;
  at.flags = largest ? FLOW_ATTR_DESCENDING : 0;
  return call_sort(&flow_op_topk, t, &at, values, indices);
}
