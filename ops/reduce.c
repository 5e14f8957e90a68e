/* Reductions: sum, mean, var over any axes; max/min (with indices), argmax/argmin along one axis
 * or over everything. Shape rules and gradients. */
#include "reduce.h"

#include <string.h>

#include "../kernels/cpu/cpu.h"
#include "../sbp/signature.h"
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

void flow_reduce_meta(const flow_meta *t, const bool *mask, bool keepdim, flow_meta *out) {
  out->dtype = t->dtype;
  out->device = t->device;
  out->ndim = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (!mask[d]) out->shape[out->ndim++] = t->shape[d];
    else if (keepdim) out->shape[out->ndim++] = 1;
  }
}

static int infer_sum(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                     flow_meta *out) {
  (void)nin;
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(op, a, in[0].ndim, mask) != 0) return -1;
  flow_reduce_meta(&in[0], mask, a->keepdim, out);
  if (in[0].dtype == FLOW_BOOL || in[0].dtype == FLOW_U8 || in[0].dtype == FLOW_I32) out->dtype = FLOW_I64;
  return 0;
}

/* mean and var: floating point only. */
static int infer_float_reduce(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                              flow_meta *out) {
  (void)nin;
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(op, a, in[0].ndim, mask) != 0) return -1;
  if (!flow_dtype_is_float(in[0].dtype))
    return flow_error_set("%s: expected a floating-point tensor (got %s; cast it first)", op->name,
                          flow_dtype_name(in[0].dtype));
  flow_reduce_meta(&in[0], mask, a->keepdim, out);
  return 0;
}

/* The mask again, in a kernel: inference has already checked the axes. A 0-d tensor has no mask
 * (its axis 0 or -1 means the whole tensor). */
static void kernel_mask(const flow_attrs *a, int ndim, bool *mask) {
  for (int d = 0; d < ndim; d++) mask[d] = a->naxes == 0;
  for (int i = 0; ndim > 0 && i < a->naxes; i++) mask[a->axes[i] < 0 ? a->axes[i] + ndim : a->axes[i]] = true;
}

/* How many elements each output element reduces. */
static int64_t reduced_count(int ndim, const int64_t *shape, const bool *mask) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) if (mask[d]) n *= shape[d];
  return n;
}

static FLOW_KERNEL(cpu_sum) {
  (void)nin; (void)nout;
  bool mask[FLOW_MAX_DIMS];
  kernel_mask(a, in[0]->ndim, mask);
  return flow_cpu_sum(out[0], in[0], mask);
}

static FLOW_KERNEL(cpu_mean) {
  (void)nin; (void)nout;
  bool mask[FLOW_MAX_DIMS];
  kernel_mask(a, in[0]->ndim, mask);
  return flow_cpu_mean(out[0], in[0], mask, 1.0 / (double)reduced_count(in[0]->ndim, in[0]->shape, mask));
}

/* attrs: FLOW_ATTR_UNBIASED divides by count - 1 */
static FLOW_KERNEL(cpu_var) {
  (void)nin; (void)nout;
  bool mask[FLOW_MAX_DIMS];
  kernel_mask(a, in[0]->ndim, mask);
  return flow_cpu_var(out[0], in[0], mask, a->flags & FLOW_ATTR_UNBIASED ? 1 : 0);
}

/* g (of the reduced shape) reshaped to keep the reduced axes as 1, times scale, expanded back
 * over them: the gradient of sum (scale 1) and mean (scale 1/count). */
static flow_tensor *spread(const flow_grad_ctx *c, flow_tensor *g, double scale) {
  const flow_meta *im = &c->in_meta[0];
  int64_t kshape[FLOW_MAX_DIMS];
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(c->op, c->attrs, im->ndim, mask) != 0) return NULL;
  for (int d = 0; d < im->ndim; d++) kshape[d] = mask[d] ? 1 : im->shape[d];
  flow_tensor *s = scale == 1 ? (flow_tensor_incref(g), g) : flow_mul_scalar(g, scale);
  flow_tensor *k = s ? flow_reshape(s, im->ndim, kshape) : NULL;
  flow_tensor *r = k ? flow_expand(k, im->ndim, im->shape) : NULL;
  flow_tensor_decref(s);
  flow_tensor_decref(k);
  return r;
}

/* The gradient of a sum is the output gradient broadcast back over the reduced axes. */
static int grad_sum(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  return (gin[0] = spread(c, c->gout[0], 1)) ? 0 : -1;
}

static int grad_mean(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  const flow_meta *im = &c->in_meta[0];
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(c->op, c->attrs, im->ndim, mask) != 0) return -1;
  return (gin[0] = spread(c, c->gout[0], 1.0 / (double)reduced_count(im->ndim, im->shape, mask))) ? 0 : -1;
}

/* var = sum (x - m)^2 / (n - ddof):  dx = g * 2 (x - m) / (n - ddof) */
static int grad_var(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  const flow_meta *im = &c->in_meta[0];
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(c->op, c->attrs, im->ndim, mask) != 0) return -1;
  int64_t n = reduced_count(im->ndim, im->shape, mask);
  int ddof = c->attrs->flags & FLOW_ATTR_UNBIASED ? 1 : 0;
  flow_tensor *m = flow_mean(c->in[0], c->attrs->naxes, c->attrs->axes, true);
  flow_tensor *d = m ? flow_sub(c->in[0], m) : NULL;
  flow_tensor *g = d ? spread(c, c->gout[0], 2.0 / (double)(n - ddof)) : NULL;
  gin[0] = g ? flow_mul(d, g) : NULL;
  flow_decref_all((flow_tensor *[]){m, d, g}, 3);
  return gin[0] ? 0 : -1;
}

FLOW_OP(sum) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(reduce, FLOW_SBP_LINEAR),
              .infer = infer_sum, .grad = grad_sum};
FLOW_KERNEL_REGISTER(FLOW_CPU, sum, cpu_sum)
FLOW_OP(mean) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(reduce, 0),
               .infer = infer_float_reduce, .grad = grad_mean};
FLOW_KERNEL_REGISTER(FLOW_CPU, mean, cpu_mean)
FLOW_OP(var) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(reduce, 0),
              .infer = infer_float_reduce, .grad = grad_var, .save_in = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, var, cpu_var)

static flow_tensor *reduce(const flow_op *op, flow_tensor *t, int naxes, const int64_t *axes, bool keepdim,
                           int flags) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (naxes > FLOW_MAX_DIMS) { flow_error_set("%s: at most %d axes", op->name, FLOW_MAX_DIMS); return NULL; }
  at.naxes = naxes;
  for (int i = 0; i < naxes; i++) at.axes[i] = axes[i];
  at.keepdim = keepdim;
  at.flags = flags;
  return flow_op_call1(op, &t, 1, &at);
}

flow_tensor *flow_mean(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim) {
  return reduce(&flow_op_mean, t, naxes, axes, keepdim, 0);
}

flow_tensor *flow_var(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim, bool unbiased) {
  return reduce(&flow_op_var, t, naxes, axes, keepdim, unbiased ? FLOW_ATTR_UNBIASED : 0);
}

/* ---- prod -------------------------------------------------------------------------------------- */

/* prod(x) over everything, or along one axis (attrs.axes[0]); integer and bool inputs give int64. */
static int infer_prod(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  if (a->naxes > 1) return flow_error_set("%s: takes one axis or none (got %d)", op->name, a->naxes);
  return infer_sum(op, in, nin, a, out);
}

static FLOW_KERNEL(cpu_prod) {
  (void)nin; (void)nout;
  bool mask[FLOW_MAX_DIMS];
  kernel_mask(a, in[0]->ndim, mask);
  return flow_cpu_prod(out[0], in[0], mask);
}

/* dy/dx_i = the product of the other elements of x_i's slice, as torch: with no zero in the slice
 * y / x_i; with exactly one, the product of the nonzeros at the zero and 0 elsewhere; with two or
 * more, 0. p1 = the product of the slice's nonzeros (zeros taken as 1), so y / x_i = p1 / x_i. */
static int grad_prod(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  flow_tensor *x = c->in[0];
  flow_attrs keep = *c->attrs;
  keep.keepdim = 1;
  flow_tensor *z = flow_eq_scalar(x, 0);
  flow_tensor *zf = z ? flow_cast(z, x->dtype) : NULL;
  flow_tensor *nz = zf ? flow_sum(zf, keep.naxes, keep.axes, true) : NULL;
  flow_tensor *x1 = nz ? flow_masked_fill(x, z, 1) : NULL;
  flow_tensor *p1 = x1 ? flow_op_call1(&flow_op_prod, &x1, 1, &keep) : NULL;
  flow_tensor *others = p1 ? flow_div(p1, x1) : NULL;
  flow_tensor *has_zero = others ? flow_binary_scalar(&flow_op_ne, nz, 0) : NULL;
  flow_tensor *not_one = has_zero ? flow_binary_scalar(&flow_op_ne, nz, 1) : NULL;
  flow_tensor *at_nonzero = not_one ? flow_masked_fill(others, has_zero, 0) : NULL;
  flow_tensor *at_zero = at_nonzero ? flow_masked_fill(p1, not_one, 0) : NULL;
  flow_tensor *d = at_zero ? flow_where(z, at_zero, at_nonzero) : NULL;
  flow_tensor *g = d ? spread(c, c->gout[0], 1) : NULL;
  gin[0] = g ? flow_mul(g, d) : NULL;
  flow_decref_all((flow_tensor *[]){z, zf, nz, x1, p1, others, has_zero, not_one, at_nonzero, at_zero, d, g}, 12);
  return gin[0] ? 0 : -1;
}

FLOW_OP(prod) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(reduce, 0),
               .infer = infer_prod, .grad = grad_prod, .save_in = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, prod, cpu_prod)

flow_tensor *flow_prod(flow_tensor *t, bool has_axis, int64_t axis, bool keepdim) {
  return reduce(&flow_op_prod, t, has_axis ? 1 : 0, &axis, keepdim, 0);
}

/* ---- amax / amin ------------------------------------------------------------------------------ */

/* amax(x, axes, keepdim): the largest value over any set of axes (none: all), same dtype, NaN if
 * the slice holds one; amin likewise. A reduced axis must not be empty, as in torch. */
static int infer_amaxmin(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  (void)nin;
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(op, a, in[0].ndim, mask) != 0) return -1;
  for (int d = 0; d < in[0].ndim; d++)
    if (mask[d] && in[0].shape[d] == 0) {
      char s[128];
      return flow_error_set("%s: cannot reduce axis %d of size 0 (shape %s)", op->name, d,
                            flow_shape_str(in[0].ndim, in[0].shape, s, sizeof s));
    }
  flow_reduce_meta(&in[0], mask, a->keepdim, out);
  return 0;
}

static FLOW_KERNEL(cpu_amax) {
  (void)nin; (void)nout;
  bool mask[FLOW_MAX_DIMS];
  kernel_mask(a, in[0]->ndim, mask);
  return flow_cpu_amaxmin(out[0], in[0], mask, true);
}
static FLOW_KERNEL(cpu_amin) {
  (void)nin; (void)nout;
  bool mask[FLOW_MAX_DIMS];
  kernel_mask(a, in[0]->ndim, mask);
  return flow_cpu_amaxmin(out[0], in[0], mask, false);
}

/* As torch: the gradient is split evenly among the elements equal to the result,
 * dx = m g / sum(m) with m = (x == y) over each slice; a slice whose result is NaN has no such
 * element, so its gradient is 0/0 = NaN throughout. */
static int grad_amaxmin(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  const flow_meta *im = &c->in_meta[0];
  int64_t kshape[FLOW_MAX_DIMS];
  bool mask[FLOW_MAX_DIMS];
  if (flow_reduce_mask(c->op, c->attrs, im->ndim, mask) != 0) return -1;
  for (int d = 0; d < im->ndim; d++) kshape[d] = mask[d] ? 1 : im->shape[d];
  flow_tensor *x = c->in[0];
  flow_tensor *y = flow_reshape(c->out[0], im->ndim, kshape);
  flow_tensor *g = y ? flow_reshape(c->gout[0], im->ndim, kshape) : NULL;
  flow_tensor *m = g ? flow_eq(x, y) : NULL;
  flow_tensor *mf = m ? flow_cast(m, g->dtype) : NULL;
  flow_tensor *n = mf ? flow_sum(mf, c->attrs->naxes, c->attrs->axes, true) : NULL;
  flow_tensor *share = n ? flow_div(g, n) : NULL;
  gin[0] = share ? flow_mul(mf, share) : NULL;
  flow_decref_all((flow_tensor *[]){y, g, m, mf, n, share}, 6);
  return gin[0] ? 0 : -1;
}

FLOW_OP(amax) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(reduce, 0),
               .infer = infer_amaxmin, .grad = grad_amaxmin, .save_in = 1, .save_out = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, amax, cpu_amax)
FLOW_OP(amin) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(reduce, 0),
               .infer = infer_amaxmin, .grad = grad_amaxmin, .save_in = 1, .save_out = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, amin, cpu_amin)

flow_tensor *flow_amaxmin(flow_tensor *t, bool is_max, int naxes, const int64_t *axes, bool keepdim) {
  return reduce(is_max ? &flow_op_amax : &flow_op_amin, t, naxes, axes, keepdim, 0);
}

/* ---- cumsum ------------------------------------------------------------------------------------ */

/* cumsum(x, axis): y[.., k, ..] = sum_{j <= k} x[.., j, ..]; with FLOW_ATTR_REVERSE the sum runs
 * over j >= k. Same shape; integer and bool inputs give int64, as torch. A 0-d x is its own sum. */
static int infer_cumsum(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)nin;
  int64_t ax;
  if (flow_axis_norm(op->name, a->axis, in[0].ndim, &ax) != 0) return -1;
  *out = in[0];
  if (!flow_dtype_is_float(in[0].dtype)) out->dtype = FLOW_I64;
  return 0;
}

static FLOW_KERNEL(cpu_cumsum) {
  (void)nin; (void)nout;
  int axis = in[0]->ndim == 0 ? 0 : (int)(a->axis < 0 ? a->axis + in[0]->ndim : a->axis);
  return flow_cpu_cumsum(out[0], in[0], axis, a->flags & FLOW_ATTR_REVERSE);
}

/* y_k = sum_{j <= k} x_j, so dx_j = sum_{k >= j} g_k: the cumsum of g the other way. */
static int grad_cumsum(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_cumsum(c->gout[0], c->attrs->axis, !(c->attrs->flags & FLOW_ATTR_REVERSE));
  return gin[0] ? 0 : -1;
}

FLOW_OP(cumsum) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(along_axis, FLOW_SBP_LINEAR),
                 .infer = infer_cumsum, .grad = grad_cumsum};
FLOW_KERNEL_REGISTER(FLOW_CPU, cumsum, cpu_cumsum)

flow_tensor *flow_cumsum(flow_tensor *t, int64_t axis, bool reverse) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  at.flags = reverse ? FLOW_ATTR_REVERSE : 0;
  return flow_op_call1(&flow_op_cumsum, &t, 1, &at);
}

/* ---- max / min / argmax / argmin ------------------------------------------------------------ */

/* attrs.naxes is 0 (over everything: 0-d results, flat indices) or 1 (axes[0]). Sets *axis to
 * the normalised axis, or -1 for a reduction over everything. */
static int arg_axis(const flow_op *op, const flow_attrs *a, const flow_meta *in, int *axis) {
  *axis = -1;
  if (a->naxes > 1) return flow_error_set("%s: takes one axis (got %d)", op->name, a->naxes);
  if (a->naxes == 1) {
    int64_t ax;
    if (flow_axis_norm(op->name, a->axes[0], in->ndim, &ax) != 0) return -1;
    if (in->ndim > 0) *axis = (int)ax;
  }
  return 0;
}

static int infer_arg(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                     flow_meta *out) {
  (void)nin;
  int axis;
  if (arg_axis(op, a, &in[0], &axis) != 0) return -1;
  if (axis >= 0 ? in[0].shape[axis] == 0 : flow_shape_numel(in[0].ndim, in[0].shape) == 0) {
    char s[128];
    return flow_error_set("%s: cannot reduce an empty %s (shape %s)", op->name, axis >= 0 ? "axis" : "tensor",
                          flow_shape_str(in[0].ndim, in[0].shape, s, sizeof s));
  }
  bool mask[FLOW_MAX_DIMS];
  for (int k = 0; k < in[0].ndim; k++) mask[k] = axis < 0 || k == axis;
  flow_reduce_meta(&in[0], mask, a->keepdim, &out[0]);
  out[op->nout - 1] = out[0];
  out[op->nout - 1].dtype = FLOW_I64;
  return 0;
}

static int kernel_axis(const flow_attrs *a, const flow_tensor *t) {
  if (a->naxes == 0 || t->ndim == 0) return -1;
  return (int)(a->axes[0] < 0 ? a->axes[0] + t->ndim : a->axes[0]);
}

static FLOW_KERNEL(cpu_max) {
  (void)nin; (void)nout;
  return flow_cpu_argreduce(out[0], out[1], in[0], kernel_axis(a, in[0]), true);
}
static FLOW_KERNEL(cpu_min) {
  (void)nin; (void)nout;
  return flow_cpu_argreduce(out[0], out[1], in[0], kernel_axis(a, in[0]), false);
}
static FLOW_KERNEL(cpu_argmax) {
  (void)nin; (void)nout;
  return flow_cpu_argreduce(NULL, out[0], in[0], kernel_axis(a, in[0]), true);
}
static FLOW_KERNEL(cpu_argmin) {
  (void)nin; (void)nout;
  return flow_cpu_argreduce(NULL, out[0], in[0], kernel_axis(a, in[0]), false);
}

/* The gradient goes to the selected element: argreduce_backward(g, indices) puts g at the index
 * along the axis of a zero tensor of the input's shape. */
/* Over every element torch splits g evenly among the ties: m marks the elements equal to the
 * result (the NaNs when the result is NaN), gin = m g / sum(m). */
static int grad_all_ties(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *x = c->in[0], *v = c->out[0], *g = c->gout[0];
  flow_tensor *eq = flow_eq(x, v);
  flow_tensor *xnan = eq ? flow_ne(x, x) : NULL, *vnan = xnan ? flow_ne(v, v) : NULL;
  flow_tensor *m = vnan ? flow_where(vnan, xnan, eq) : NULL;
  flow_tensor *mf = m ? flow_cast(m, g->dtype) : NULL;
  flow_tensor *n = mf ? flow_sum(mf, 0, NULL, false) : NULL;
  flow_tensor *share = n ? flow_div(g, n) : NULL;
  gin[0] = share ? flow_mul(mf, share) : NULL;
  flow_decref_all((flow_tensor *[]){eq, xnan, vnan, m, mf, n, share}, 7);
  return gin[0] ? 0 : -1;
}

static int grad_arg(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  if (c->attrs->naxes == 0) return grad_all_ties(c, gin);
  const flow_meta *im = &c->in_meta[0];
  flow_attrs at = *c->attrs;
  at.nshape = im->ndim;
  for (int d = 0; d < im->ndim; d++) at.shape[d] = im->shape[d];
  flow_tensor *in[2] = {c->gout[0], c->out[1]};
  gin[0] = flow_op_call1(&flow_op_argreduce_backward, in, 2, &at);
  return gin[0] ? 0 : -1;
}

/* argreduce_backward(g, idx): attrs.shape is the input's shape, axes/naxes as in max. */
static int infer_arg_backward(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                              flow_meta *out) {
  (void)nin;
  if (in[1].dtype != FLOW_I64)
    return flow_error_set("%s: indices must be int64 (got %s)", op->name, flow_dtype_name(in[1].dtype));
  out->dtype = in[0].dtype;
  out->device = in[0].device;
  out->ndim = a->nshape;
  for (int d = 0; d < a->nshape; d++) out->shape[d] = a->shape[d];
  int axis;
  if (arg_axis(op, a, out, &axis) != 0) return -1;
  int64_t kept = axis >= 0 ? flow_shape_numel(out->ndim, out->shape) / out->shape[axis] : 1;
  if (flow_shape_numel(in[0].ndim, in[0].shape) != kept || flow_shape_numel(in[1].ndim, in[1].shape) != kept)
    return flow_error_set("%s: %lld gradients and %lld indices for %lld reduced positions", op->name,
                          (long long)flow_shape_numel(in[0].ndim, in[0].shape), (long long)flow_shape_numel(in[1].ndim, in[1].shape), (long long)kept);
  return 0;
}

static FLOW_KERNEL(cpu_arg_backward) {
  (void)nin; (void)nout;
  int axis = a->naxes == 0 || a->nshape == 0 ? -1 : (int)(a->axes[0] < 0 ? a->axes[0] + a->nshape : a->axes[0]);
  return flow_cpu_index_put_axis(out[0], in[0], in[1], axis);
}

FLOW_OP(max) {.nin = 1, .nout = 2, .sbp = FLOW_SBP_RULE(reduce, 0),
              .infer = infer_arg,
              .grad = grad_arg, .save_in = 1, .save_out = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, max, cpu_max)
FLOW_OP(min) {.nin = 1, .nout = 2, .sbp = FLOW_SBP_RULE(reduce, 0),
              .infer = infer_arg,
              .grad = grad_arg, .save_in = 1, .save_out = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, min, cpu_min)
FLOW_OP(argmax) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(reduce, 0),
                 .infer = infer_arg};
FLOW_KERNEL_REGISTER(FLOW_CPU, argmax, cpu_argmax)
FLOW_OP(argmin) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(reduce, 0),
                 .infer = infer_arg};
FLOW_KERNEL_REGISTER(FLOW_CPU, argmin, cpu_argmin)
FLOW_OP(argreduce_backward) {.nin = 2, .nout = 1, .infer = infer_arg_backward, .nondiff_in = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, argreduce_backward, cpu_arg_backward)

static void arg_attrs(flow_attrs *at, bool has_axis, int64_t axis, bool keepdim) {
  flow_attrs_init(at);
  at->naxes = has_axis ? 1 : 0;
  at->axes[0] = axis;
  at->keepdim = keepdim;
}

int flow_maxmin(flow_tensor *t, bool is_max, bool has_axis, int64_t axis, bool keepdim,
                flow_tensor **values, flow_tensor **indices) {
  flow_attrs at;
  arg_attrs(&at, has_axis, axis, keepdim);
  flow_tensor *out[2];
  if (flow_op_call(is_max ? &flow_op_max : &flow_op_min, &t, 1, &at, out) != 0) return -1;
  *values = out[0];
  if (indices) *indices = out[1];
  else flow_tensor_decref(out[1]);
  return 0;
}

flow_tensor *flow_argmaxmin(flow_tensor *t, bool is_max, bool has_axis, int64_t axis, bool keepdim) {
  flow_attrs at;
  arg_attrs(&at, has_axis, axis, keepdim);
  return flow_op_call1(is_max ? &flow_op_argmax : &flow_op_argmin, &t, 1, &at);
}

flow_tensor *flow_sum(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim) {
  return reduce(&flow_op_sum, t, naxes, axes, keepdim, 0);
}

flow_tensor *flow_sum_to_shape(flow_tensor *g, int ndim, const int64_t *shape) {
  int gnd = flow_tensor_lndim(g); /* logical: g may be global */
  const int64_t *gshape = flow_tensor_lshape(g);
  if (flow_shape_eq(gnd, gshape, ndim, shape)) { flow_tensor_incref(g); return g; }
  int64_t axes[FLOW_MAX_DIMS];
  int naxes = 0, lead = gnd - ndim;
  for (int d = 0; d < gnd; d++)
    if (d < lead || (shape[d - lead] == 1 && gshape[d] != 1)) axes[naxes++] = d;
  /* no axis to sum (only size-1 axes differ): naxes == 0 would mean "all axes" */
  flow_tensor *s = naxes ? flow_sum(g, naxes, axes, true) : (flow_tensor_incref(g), g);
  if (!s) return NULL;
  flow_tensor *r = flow_reshape(s, ndim, shape);
  flow_tensor_decref(s);
  return r;
}
