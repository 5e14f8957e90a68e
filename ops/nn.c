/* Fused neural-network ops: softmax, log_softmax, layer_norm, cross_entropy,
 * scaled_dot_product_attention and adamw_. Shape and dtype rules, and gradient rules that call a
 * fused backward op (itself not differentiable) on the tensors the forward saved. */
#include "nn.h"

#include <math.h>

#include "../kernels/cpu/nn.h"
#include "../sbp/signature.h"
#include "autograd.h"
#include "elementwise.h"
#include "reduce.h"
#include "shape.h"

/* op-specific attrs.flags bits */
enum {
  LN_WEIGHT = 1 << 16,   /* layer_norm: input 1 is the weight */
  LN_BIAS = 1 << 17,     /* layer_norm: the last input is the bias */
  CE_REDUCE = 1 << 16,   /* cross_entropy: sum the per-row losses */
  CE_MEAN = 1 << 17,     /* cross_entropy: ... and divide by the count of non-ignored targets */
};

extern flow_op flow_op_softmax_grad, flow_op_log_softmax_grad, flow_op_layer_norm_grad,
    flow_op_cross_entropy_grad, flow_op_scaled_dot_product_attention_grad;

/* The fused kernels compute in float32 or float64; float16/bfloat16 on CUDA, and through float32 on the
 * CPU (dispatch.c). */
static int check_real(const flow_op *op, const flow_meta *t, const char *what) {
  if (flow_dtype_is_float(t->dtype)) return 0;
  return flow_error_set("%s: %s must be a floating-point tensor (got %s)", op->name, what, flow_dtype_name(t->dtype));
}

/* The dtype of the row statistics an op saves for its backward (layer_norm's mean and rstd, the lse
 * of cross_entropy and attention): float32 for float16/bfloat16 inputs, as the CUDA kernels compute
 * them, since rounding them to 8 or 11 bits would skew every gradient of the row. */
static flow_dtype stat_dtype(const flow_meta *x) {
  return flow_dtype_is_half(x->dtype) ? FLOW_F32 : x->dtype;
}

static int check_same_dtype(const flow_op *op, const flow_meta *t, const flow_meta *like, const char *what) {
  if (t->dtype == like->dtype) return 0;
  return flow_error_set("%s: %s is %s but the input is %s (cast one with :to())", op->name, what,
                        flow_dtype_name(t->dtype), flow_dtype_name(like->dtype));
}

/* Outputs that mirror inputs: out[j] gets in[src[j]]'s meta (the backward ops' inference). */
static void meta_like(const flow_meta *in, const int *src, int n, flow_meta *out) {
  for (int j = 0; j < n; j++) out[j] = in[src[j]];
}

/* Gradient of output j as a new reference: zeros where it received none. NULL + error on failure. */
static flow_tensor *gout_or_zeros(const flow_grad_ctx *c, int j) {
  if (c->gout[j]) { flow_tensor_incref(c->gout[j]); return c->gout[j]; }
  const flow_meta *m = &c->out_meta[j];
  return flow_full(m->ndim, m->shape, 0, m->dtype, m->device);
}

/* Gradients of every output (zeros for those without one) into g[0..nout); 1 if none had one,
 * 0 on success, -1 on error. */
static int gouts(const flow_grad_ctx *c, flow_tensor **g) {
  bool any = false;
  for (int j = 0; j < c->nout; j++) any |= c->gout[j] != NULL;
  if (!any) return 1;
  for (int j = 0; j < c->nout; j++)
    if (!(g[j] = gout_or_zeros(c, j))) {
      while (j-- > 0) flow_tensor_decref(g[j]);
      return -1;
    }
  return 0;
}

/* Run a backward op and hand its outputs to the inputs that need them: gin[map[j]] = out[j]
 * (map[j] < 0: output j is not wanted). */
static int run_backward(const flow_grad_ctx *c, const flow_op *op, flow_tensor *const *in, int nin,
                        const int *map, flow_tensor **gin) {
  flow_tensor *out[4];
  if (flow_op_call(op, in, nin, c->attrs, out) != 0) return -1;
  for (int j = 0; j < op->nout; j++) {
    if (map[j] >= 0 && c->need[map[j]]) gin[map[j]] = out[j];
    else flow_tensor_decref(out[j]);
  }
  return 0;
}

/* ---- softmax, log_softmax ---------------------------------------------------------------- */

static int infer_softmax(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  (void)nin;
  int64_t ax;
  if (check_real(op, &in[0], "input") != 0 || flow_axis_norm(op->name, a->axis, in[0].ndim, &ax) != 0) return -1;
  *out = in[0];
  return 0;
}

static int infer_softmax_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                              flow_meta *out) {
  (void)op; (void)nin; (void)a;
  meta_like(in, (const int[]){0}, 1, out);
  return 0;
}

/* The axis as an index into the shape (a 0-d tensor is one row of one element). */
static int axis_of(const flow_attrs *a, int ndim) {
  return ndim == 0 ? 0 : (int)(a->axis < 0 ? a->axis + ndim : a->axis);
}

static FLOW_KERNEL(cpu_softmax) {
  (void)nin; (void)nout;
  return flow_cpu_softmax_forward(out[0], in[0], axis_of(a, in[0]->ndim), false);
}
static FLOW_KERNEL(cpu_log_softmax) {
  (void)nin; (void)nout;
  return flow_cpu_softmax_forward(out[0], in[0], axis_of(a, in[0]->ndim), true);
}
/* inputs: y (the forward's output), dy */
static FLOW_KERNEL(cpu_softmax_grad) {
  (void)nin; (void)nout;
  return flow_cpu_softmax_backward(out[0], in[0], in[1], axis_of(a, in[0]->ndim), false);
}
static FLOW_KERNEL(cpu_log_softmax_grad) {
  (void)nin; (void)nout;
  return flow_cpu_softmax_backward(out[0], in[0], in[1], axis_of(a, in[0]->ndim), true);
}

/* Both rules read only the saved output: see kernels/cpu/softmax.c for the math. */
static int grad_softmax_like(const flow_grad_ctx *c, flow_tensor **gin, const flow_op *bwd) {
  if (!c->gout[0] || !c->need[0]) return 0;
  flow_tensor *in[2] = {c->out[0], c->gout[0]};
  return run_backward(c, bwd, in, 2, (const int[]){0}, gin);
}
static int grad_softmax(const flow_grad_ctx *c, flow_tensor **gin) {
  return grad_softmax_like(c, gin, &flow_op_softmax_grad);
}
static int grad_log_softmax(const flow_grad_ctx *c, flow_tensor **gin) {
  return grad_softmax_like(c, gin, &flow_op_log_softmax_grad);
}

FLOW_OP(softmax) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(softmax, 0),
                  .infer = infer_softmax, .grad = grad_softmax, .save_out = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, softmax, cpu_softmax)
FLOW_OP(log_softmax) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(softmax, 0),
                      .infer = infer_softmax, .grad = grad_log_softmax, .save_out = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, log_softmax, cpu_log_softmax)
FLOW_OP(softmax_grad) {.nin = 2, .nout = 1, .sbp = FLOW_SBP_RULE(softmax, 0),
                       .infer = infer_softmax_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, softmax_grad, cpu_softmax_grad)
FLOW_OP(log_softmax_grad) {.nin = 2, .nout = 1, .sbp = FLOW_SBP_RULE(softmax, 0),
                           .infer = infer_softmax_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, log_softmax_grad, cpu_log_softmax_grad)

static flow_tensor *softmax_call(const flow_op *op, flow_tensor *t, int64_t axis) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  return flow_op_call1(op, &t, 1, &at);
}
flow_tensor *flow_softmax(flow_tensor *t, int64_t axis) { return softmax_call(&flow_op_softmax, t, axis); }
flow_tensor *flow_log_softmax(flow_tensor *t, int64_t axis) { return softmax_call(&flow_op_log_softmax, t, axis); }

/* ---- layer_norm ------------------------------------------------------------------------------
 * inputs: x [..., C], then the weight [C] if LN_WEIGHT, then the bias [C] if LN_BIAS.
 * outputs: y, mean [...], rstd [...] (in stat_dtype, saved for the backward; Lua sees only y, but the
 * gradient rule also takes theirs, so every output of the op is differentiable). */

static int check_affine(const flow_op *op, const flow_meta *p, const flow_meta *x, const char *what) {
  if (check_same_dtype(op, p, x, what) != 0) return -1;
  if (p->ndim == 1 && p->shape[0] == x->shape[x->ndim - 1]) return 0;
  char sp[128], sx[128];
  return flow_error_set("%s: %s must have shape {%lld} (the last axis of the input %s), got %s", op->name, what,
                        (long long)x->shape[x->ndim - 1], flow_shape_str(x->ndim, x->shape, sx, sizeof sx),
                        flow_shape_str(p->ndim, p->shape, sp, sizeof sp));
}

static int infer_layer_norm(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                            flow_meta *out) {
  bool hw = a->flags & LN_WEIGHT, hb = a->flags & LN_BIAS;
  if (nin != 1 + hw + hb)
    return flow_error_set("%s: expected %d tensor inputs, got %d", op->name, 1 + hw + hb, nin);
  const flow_meta *x = &in[0];
  if (check_real(op, x, "input") != 0) return -1;
  if (x->ndim < 1) return flow_error_set("%s: input must have at least 1 dimension (got a 0-d tensor)", op->name);
  if (hw && check_affine(op, &in[1], x, "weight") != 0) return -1;
  if (hb && check_affine(op, &in[nin - 1], x, "bias") != 0) return -1;
  if (!(a->eps >= 0)) return flow_error_set("%s: eps must be >= 0 (got %g)", op->name, a->eps);
  out[0] = *x;
  for (int j = 1; j < 3; j++) {
    out[j] = *x;
    out[j].ndim--;
    out[j].dtype = stat_dtype(x);
  }
  return 0;
}

static FLOW_KERNEL(cpu_layer_norm) {
  (void)nout;
  const flow_tensor *w = a->flags & LN_WEIGHT ? in[1] : NULL, *b = a->flags & LN_BIAS ? in[nin - 1] : NULL;
  return flow_cpu_layernorm_forward(out[0], out[1], out[2], in[0], w, b, a->eps);
}

/* layer_norm_grad inputs: dy, dmean, drstd, x, mean, rstd, then the weight if LN_WEIGHT.
 * outputs: dx, dw, db. */
static int infer_layer_norm_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                                 flow_meta *out) {
  (void)op; (void)nin; (void)a;
  meta_like(in, (const int[]){3, 3, 3}, 3, out);
  out[1].ndim = out[2].ndim = 1;
  out[1].shape[0] = out[2].shape[0] = in[3].shape[in[3].ndim - 1];
  return 0;
}

static FLOW_KERNEL(cpu_layer_norm_grad) {
  (void)nin; (void)nout;
  return flow_cpu_layernorm_backward(out[0], out[1], out[2], in[0], in[1], in[2], in[3],
                                     a->flags & LN_WEIGHT ? in[6] : NULL, in[4], in[5]);
}

static int grad_layer_norm(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g[3];
  int rc = gouts(c, g);
  if (rc != 0) return rc < 0 ? -1 : 0;
  bool hw = c->attrs->flags & LN_WEIGHT, hb = c->attrs->flags & LN_BIAS;
  flow_tensor *in[7] = {g[0], g[1], g[2], c->in[0], c->out[1], c->out[2], hw ? c->in[1] : NULL};
  int map[3] = {0, hw ? 1 : -1, hb ? 1 + hw : -1};
  rc = run_backward(c, &flow_op_layer_norm_grad, in, 6 + hw, map, gin);
  for (int j = 0; j < 3; j++) flow_tensor_decref(g[j]);
  return rc;
}

FLOW_OP(layer_norm) {.nin = -1, .nout = 3, .sbp = FLOW_SBP_RULE(layer_norm, 0),
                     .infer = infer_layer_norm, .grad = grad_layer_norm, .save_in = 3,
                     .save_out = 6};
FLOW_KERNEL_REGISTER(FLOW_CPU, layer_norm, cpu_layer_norm)
FLOW_OP(layer_norm_grad) {.nin = -1, .nout = 3,
                          .sbp = FLOW_SBP_RULE(layer_norm, FLOW_SBP_BACKWARD),
                          .infer = infer_layer_norm_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, layer_norm_grad, cpu_layer_norm_grad)

flow_tensor *flow_layer_norm(flow_tensor *x, flow_tensor *weight, flow_tensor *bias, double eps) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.eps = eps;
  flow_tensor *in[3] = {x};
  int n = 1;
  if (weight) { in[n++] = weight; at.flags |= LN_WEIGHT; }
  if (bias) { in[n++] = bias; at.flags |= LN_BIAS; }
  return flow_op_call1(&flow_op_layer_norm, in, n, &at);
}

/* ---- cross_entropy ---------------------------------------------------------------------------
 * inputs: logits [..., C], target int64 [...]. outputs: loss ([] or [...] for reduction "none"),
 * lse [...] (log-sum-exp of each row in stat_dtype, for the backward). The op's class axis is last;
 * flow_cross_entropy below takes PyTorch's (axis 1) and moves it there. */

static int infer_cross_entropy(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                               flow_meta *out) {
  (void)nin;
  const flow_meta *x = &in[0], *t = &in[1];
  if (check_real(op, x, "logits") != 0) return -1;
  if (t->dtype != FLOW_I64)
    return flow_error_set("%s: target must be an int64 tensor of class indices (got %s)", op->name,
                          flow_dtype_name(t->dtype));
  char sx[128], st[128];
  if (x->ndim < 1 || !flow_shape_eq(x->ndim - 1, x->shape, t->ndim, t->shape))
    return flow_error_set("%s: logits %s need a class axis last and target %s the shape of the other axes",
                          op->name, flow_shape_str(x->ndim, x->shape, sx, sizeof sx),
                          flow_shape_str(t->ndim, t->shape, st, sizeof st));
  out[1] = *t;
  out[0] = out[1];
  out[0].dtype = x->dtype;
  out[1].dtype = stat_dtype(x);
  if (a->flags & CE_REDUCE) out[0].ndim = 0;
  return 0;
}

static FLOW_KERNEL(cpu_cross_entropy) {
  (void)nin; (void)nout;
  return flow_cpu_cross_entropy_forward(out[0], out[1], in[0], in[1], a->ignore_index, a->flags & CE_REDUCE,
                                        a->flags & CE_MEAN);
}

/* cross_entropy_grad inputs: logits, target, lse, g (of the loss), glse (of lse). output: dlogits. */
static int infer_cross_entropy_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                                    flow_meta *out) {
  (void)op; (void)nin; (void)a;
  meta_like(in, (const int[]){0}, 1, out);
  return 0;
}

static FLOW_KERNEL(cpu_cross_entropy_grad) {
  (void)nin; (void)nout;
  return flow_cpu_cross_entropy_backward(out[0], in[0], in[1], in[2], in[3], in[4], a->ignore_index,
                                         a->flags & CE_REDUCE, a->flags & CE_MEAN);
}

static int grad_cross_entropy(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g[2];
  int rc = gouts(c, g);
  if (rc != 0) return rc < 0 ? -1 : 0;
  flow_tensor *in[5] = {c->in[0], c->in[1], c->out[1], g[0], g[1]};
  rc = run_backward(c, &flow_op_cross_entropy_grad, in, 5, (const int[]){0}, gin);
  flow_tensor_decref(g[0]);
  flow_tensor_decref(g[1]);
  return rc;
}

/* The fused mean divides by the count of targets on its shard: under split rows that is not the
 * logical mean, so a mean runs whole (flow_cross_entropy computes a global one from the sum). */
FLOW_OP(cross_entropy) {.nin = 2, .nout = 2, .sbp = FLOW_SBP_RULE_UNLESS(cross_entropy, 0, CE_MEAN),
                        .infer = infer_cross_entropy, .grad = grad_cross_entropy, .save_in = 3,
                        .save_out = 2, .nondiff_in = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, cross_entropy, cpu_cross_entropy)
FLOW_OP(cross_entropy_grad) {.nin = 5, .nout = 1,
                             .sbp = FLOW_SBP_RULE_UNLESS(cross_entropy, FLOW_SBP_BACKWARD, CE_MEAN),
                             .infer = infer_cross_entropy_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, cross_entropy_grad, cpu_cross_entropy_grad)

/* mean = sum / count, count = the targets that are not ignore_index: on global tensors the sum runs
 * on split rows (partial sums) and the count is a sum over the global target, so the division sees
 * logical values. Half-precision losses divide in float32: a count above 256 is not exact in
 * bfloat16 (nor above 2048 in float16). */
static flow_tensor *global_mean(flow_tensor *sum, flow_tensor *target, int64_t ignore_index) {
  bool half = flow_dtype_is_half(sum->dtype);
  flow_dtype acc = half ? FLOW_F32 : sum->dtype;
  flow_tensor *skip = flow_scalar_tensor((double)ignore_index, target->dtype, target->device);
  flow_tensor *valid = skip ? flow_ne(target, skip) : NULL;
  flow_tensor *w = valid ? flow_cast(valid, acc) : NULL;
  flow_tensor *count = w ? flow_sum(w, 0, NULL, false) : NULL;
  flow_tensor *s = !count ? NULL : half ? flow_cast(sum, acc) : (flow_tensor_incref(sum), sum);
  flow_tensor *mean = s ? flow_div(s, count) : NULL;
  if (mean && half) {
    flow_tensor *m = flow_cast(mean, sum->dtype);
    flow_tensor_decref(mean);
    mean = m;
  }
  flow_tensor_decref(skip);
  flow_tensor_decref(valid);
  flow_tensor_decref(w);
  flow_tensor_decref(count);
  flow_tensor_decref(s);
  return mean;
}

/* PyTorch's layout: logits [C], [N, C] or [N, C, d1, ...] with target [], [N] or [N, d1, ...]. The
 * op takes its class axis last, so N-D logits are viewed as [N, d1, ..., C] first (a permutation:
 * the loss of element (n, d1, ...) is that of its class vector, and the gradient flows back through
 * the view). */
flow_tensor *flow_cross_entropy(flow_tensor *logits, flow_tensor *target, int64_t ignore_index,
                                flow_reduction reduction) {
  flow_tensor *x = logits;
  if (logits->ndim > 2) {
    char sx[128], st[128];
    if (target->ndim != logits->ndim - 1 || target->shape[0] != logits->shape[0] ||
        !flow_shape_eq(target->ndim - 1, target->shape + 1, logits->ndim - 2, logits->shape + 2)) {
      flow_error_set("cross_entropy: logits %s are [N, C, d1, ...] and need target [N, d1, ...] (got %s)",
                     flow_shape_str(logits->ndim, logits->shape, sx, sizeof sx),
                     flow_shape_str(target->ndim, target->shape, st, sizeof st));
      return NULL;
    }
    int64_t dims[FLOW_MAX_DIMS];
    int n = 0;
    dims[n++] = 0;
    for (int i = 2; i < logits->ndim; i++) dims[n++] = i;
    dims[n++] = 1;
    if (!(x = flow_permute(logits, n, dims))) return NULL;
  } else {
    flow_tensor_incref(x);
  }
  flow_attrs at;
  flow_attrs_init(&at);
  at.ignore_index = ignore_index;
  if (reduction != FLOW_REDUCTION_NONE) at.flags |= CE_REDUCE;
  bool global = x->global || target->global;
  if (reduction == FLOW_REDUCTION_MEAN && !global) at.flags |= CE_MEAN; /* one fused kernel */
  flow_tensor *in[2] = {x, target};
  flow_tensor *loss = flow_op_call1(&flow_op_cross_entropy, in, 2, &at);
  flow_tensor_decref(x);
  if (!loss || reduction != FLOW_REDUCTION_MEAN || !global) return loss;
  flow_tensor *mean = global_mean(loss, target, ignore_index);
  flow_tensor_decref(loss);
  return mean;
}

/* ---- scaled_dot_product_attention ------------------------------------------------------------
 * inputs: q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv]; attrs: scalar = scale, FLOW_ATTR_CAUSAL.
 * outputs: o [B,H,Tq,Dv], lse [B,H,Tq] (log-sum-exp of each score row in stat_dtype, for the
 * backward). */

static int infer_attention(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                           flow_meta *out) {
  (void)nin;
  const flow_meta *q = &in[0], *k = &in[1], *v = &in[2];
  if (check_real(op, q, "q") != 0 || check_same_dtype(op, k, q, "k") != 0 || check_same_dtype(op, v, q, "v") != 0)
    return -1;
  char sq[128], sk[128], sv[128];
  flow_shape_str(q->ndim, q->shape, sq, sizeof sq);
  flow_shape_str(k->ndim, k->shape, sk, sizeof sk);
  flow_shape_str(v->ndim, v->shape, sv, sizeof sv);
  const char *why = NULL;
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) why = "q, k and v must be 4-d [B, H, T, D]";
  else if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] ||
           v->shape[1] != q->shape[1])
    why = "q, k and v must agree on B and H (axes 0 and 1)";
  else if (k->shape[2] != v->shape[2]) why = "k and v must have the same length (axis 2)";
  else if (k->shape[3] != q->shape[3]) why = "q and k must have the same head size D (axis 3)";
  else if (a->flags & FLOW_ATTR_CAUSAL && q->shape[2] != k->shape[2])
    why = "causal attention needs as many queries as keys (axis 2)";
  else if (k->shape[2] == 0 || q->shape[3] == 0) why = "need at least one key and a head size of at least 1";
  if (why) return flow_error_set("%s: %s; got q %s, k %s, v %s", op->name, why, sq, sk, sv);
  out[0] = *q;
  out[0].shape[3] = v->shape[3];
  out[1] = *q;
  out[1].ndim = 3;
  out[1].dtype = stat_dtype(q);
  return 0;
}

static FLOW_KERNEL(cpu_attention) {
  (void)nin; (void)nout;
  return flow_cpu_attention_forward(out[0], out[1], in[0], in[1], in[2], a->scalar, a->flags & FLOW_ATTR_CAUSAL);
}

/* scaled_dot_product_attention_grad inputs: q, k, v, o, lse, do, dlse. outputs: dq, dk, dv. */
static int infer_attention_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                                flow_meta *out) {
  (void)op; (void)nin; (void)a;
  meta_like(in, (const int[]){0, 1, 2}, 3, out);
  return 0;
}

static FLOW_KERNEL(cpu_attention_grad) {
  (void)nin; (void)nout;
  return flow_cpu_attention_backward(out[0], out[1], out[2], in[0], in[1], in[2], in[3], in[4], in[5], in[6],
                                     a->scalar, a->flags & FLOW_ATTR_CAUSAL);
}

static int grad_attention(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g[2];
  int rc = gouts(c, g);
  if (rc != 0) return rc < 0 ? -1 : 0;
  flow_tensor *in[7] = {c->in[0], c->in[1], c->in[2], c->out[0], c->out[1], g[0], g[1]};
  rc = run_backward(c, &flow_op_scaled_dot_product_attention_grad, in, 7, (const int[]){0, 1, 2}, gin);
  flow_tensor_decref(g[0]);
  flow_tensor_decref(g[1]);
  return rc;
}

FLOW_OP(scaled_dot_product_attention) {.nin = 3, .nout = 2, .cpu_half = true,
                                       .sbp = FLOW_SBP_RULE(attention, 0),
                                       .infer = infer_attention,
                                       .grad = grad_attention, .save_in = 7, .save_out = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, scaled_dot_product_attention, cpu_attention)
FLOW_OP(scaled_dot_product_attention_grad) {.nin = 7, .nout = 3, .cpu_half = true,
                                            .sbp = FLOW_SBP_RULE(attention, 0),
                                            .infer = infer_attention_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, scaled_dot_product_attention_grad, cpu_attention_grad)

flow_tensor *flow_scaled_dot_product_attention(flow_tensor *q, flow_tensor *k, flow_tensor *v, bool causal,
                                               double scale) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.flags = causal ? FLOW_ATTR_CAUSAL : 0;
  at.scalar = isnan(scale) && q->ndim >= 1 && q->shape[q->ndim - 1] > 0 ? 1 / sqrt((double)q->shape[q->ndim - 1])
                                                                         : scale;
  flow_tensor *in[3] = {q, k, v};
  return flow_op_call1(&flow_op_scaled_dot_product_attention, in, 3, &at);
}

/* ---- adamw_ ----------------------------------------------------------------------------------
 * inputs: param (written in place), grad, m, v (also written in place); attrs: lr, beta1, beta2,
 * eps, weight_decay, k = the 1-based step. */

static int infer_adamw(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  (void)nin;
  static const char *names[4] = {"param", "grad", "m", "v"};
  if (check_real(op, &in[0], "param") != 0) return -1;
  for (int i = 1; i < 4; i++) {
    if (check_same_dtype(op, &in[i], &in[0], names[i]) != 0) return -1;
    if (!flow_shape_eq(in[i].ndim, in[i].shape, in[0].ndim, in[0].shape)) {
      char s0[128], si[128];
      return flow_error_set("%s: %s has shape %s but param has shape %s", op->name, names[i],
                            flow_shape_str(in[i].ndim, in[i].shape, si, sizeof si),
                            flow_shape_str(in[0].ndim, in[0].shape, s0, sizeof s0));
    }
  }
  if (a->k < 1) return flow_error_set("%s: step must be >= 1 (it is 1-based), got %lld", op->name, (long long)a->k);
  *out = in[0];
  return 0;
}

static FLOW_KERNEL(cpu_adamw) {
  (void)nin; (void)nout; (void)out;
  flow_adamw_hyper h = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->k};
  if (flow_cpu_adamw(in[0], in[1], in[2], in[3], &h) != 0) return -1;
  /* dispatch bumps param's version; the moments were written too */
  in[2]->storage->version++;
  in[3]->storage->version++;
  return 0;
}

FLOW_OP(adamw_) {.nin = 4, .nout = 1, .sbp = FLOW_SBP_RULE(elementwise, 0),
                 .kind = FLOW_OP_INPLACE, .written_in = 1 << 2 | 1 << 3 /* the moments */,
                 .infer = infer_adamw};
FLOW_KERNEL_REGISTER(FLOW_CPU, adamw_, cpu_adamw)

int flow_adamw_(flow_tensor *param, flow_tensor *grad, flow_tensor *m, flow_tensor *v, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.lr = lr;
  at.beta1 = beta1;
  at.beta2 = beta2;
  at.eps = eps;
  at.weight_decay = weight_decay;
  at.k = step;
  flow_tensor *in[4] = {param, grad, m, v}, *out;
  if (flow_op_call(&flow_op_adamw_, in, 4, &at, &out) != 0) return -1;
  flow_tensor_decref(out);
  return 0;
}
