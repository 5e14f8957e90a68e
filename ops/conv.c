/* conv2d, max_pool2d, avg_pool2d and batch_norm (NCHW): shape and dtype rules, and gradient rules
 * that call a fused backward op (itself not differentiable) on the saved inputs.
 *
 * Attributes:
 *   conv2d      axes = {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w}, k = groups,
 *               flags & CONV_BIAS: input 2 is the bias [O].
 *   *_pool2d    shape = {kernel_h, kernel_w}, axes = {stride_h, stride_w, pad_h, pad_w}.
 *   batch_norm  flags & BN_TRAINING: batch statistics (and running stats updated in place),
 *               scalar = momentum, eps = eps. */
#include "conv.h"

#include "../kernels/cpu/conv.h"
#include "../sbp/signature.h"
#include "autograd.h"
#include "elementwise.h"
#include "reduce.h"
#include "shape.h"

enum {
  CONV_BIAS = 1 << 16,
  BN_TRAINING = 1 << 16,
};

extern flow_op flow_op_conv2d_grad, flow_op_max_pool2d_grad, flow_op_avg_pool2d_grad, flow_op_batch_norm_grad;

static int check_real(const flow_op *op, const flow_meta *t, const char *what) {
  if (t->dtype == FLOW_F32 || t->dtype == FLOW_F64) return 0;
  return flow_error_set("%s: %s must be float32 or float64 (got %s)", op->name, what, flow_dtype_name(t->dtype));
}

static int check_like(const flow_op *op, const flow_meta *t, const flow_meta *x, const char *what) {
  if (check_real(op, t, what) != 0) return -1;
  if (t->dtype != x->dtype)
    return flow_error_set("%s: %s is %s but the input is %s", op->name, what, flow_dtype_name(t->dtype),
                          flow_dtype_name(x->dtype));
  return 0;
}

static int check_4d(const flow_op *op, const flow_meta *x, const char *what) {
  if (check_real(op, x, what) != 0) return -1;
  if (x->ndim == 4) return 0;
  char s[128];
  return flow_error_set("%s: %s must be 4-d [N, C, H, W], got %s", op->name, what,
                        flow_shape_str(x->ndim, x->shape, s, sizeof s));
}

/* Output extent of one spatial axis; -1 + error when the window does not fit. */
static int out_extent(const flow_op *op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, int64_t *out) {
  if (k < 1 || s < 1 || p < 0 || d < 1)
    return flow_error_set("%s: kernel %lld, stride %lld, dilation %lld must be >= 1 and padding %lld >= 0", op->name,
                          (long long)k, (long long)s, (long long)d, (long long)p);
  int64_t span = d * (k - 1) + 1;
  if (in + 2 * p < span)
    return flow_error_set("%s: window of %lld (kernel %lld, dilation %lld) does not fit the padded input size %lld",
                          op->name, (long long)span, (long long)k, (long long)d, (long long)(in + 2 * p));
  *out = (in + 2 * p - span) / s + 1;
  return 0;
}

/* ---- conv2d ------------------------------------------------------------------------------- */

static int conv_geom(const flow_op *op, const flow_meta *x, const flow_meta *w, const flow_attrs *a,
                     flow_conv_geom *g) {
  if (a->naxes != 6) return flow_error_set("%s: attrs axes must hold stride, padding and dilation (6 values)", op->name);
  char sx[128], sw[128];
  int64_t G = a->k;
  if (G < 1 || w->shape[1] < 1 || x->shape[1] % G || w->shape[0] % G || w->shape[1] * G != x->shape[1])
    return flow_error_set("%s: input %s and weight %s do not match with groups = %lld (need C = weight.shape[1] * groups "
                          "and O divisible by groups)", op->name, flow_shape_str(x->ndim, x->shape, sx, sizeof sx),
                          flow_shape_str(w->ndim, w->shape, sw, sizeof sw), (long long)G);
  *g = (flow_conv_geom){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .O = w->shape[0],
                        .kh = w->shape[2], .kw = w->shape[3], .sh = a->axes[0], .sw = a->axes[1], .ph = a->axes[2],
                        .pw = a->axes[3], .dh = a->axes[4], .dw = a->axes[5], .groups = G};
  if (out_extent(op, g->H, g->kh, g->sh, g->ph, g->dh, &g->OH) != 0) return -1;
  return out_extent(op, g->W, g->kw, g->sw, g->pw, g->dw, &g->OW);
}

static int infer_conv2d(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  bool hb = a->flags & CONV_BIAS;
  if (nin != 2 + hb) return flow_error_set("%s: expected %d tensor inputs, got %d", op->name, 2 + hb, nin);
  if (check_4d(op, &in[0], "input") != 0 || check_4d(op, &in[1], "weight") != 0 ||
      check_like(op, &in[1], &in[0], "weight") != 0)
    return -1;
  flow_conv_geom g;
  if (conv_geom(op, &in[0], &in[1], a, &g) != 0) return -1;
  if (hb) {
    if (check_like(op, &in[2], &in[0], "bias") != 0) return -1;
    if (in[2].ndim != 1 || in[2].shape[0] != g.O) {
      char s[128];
      return flow_error_set("%s: bias must have shape {%lld} (the weight's out channels), got %s", op->name,
                            (long long)g.O, flow_shape_str(in[2].ndim, in[2].shape, s, sizeof s));
    }
  }
  *out = in[0];
  out->shape[1] = g.O;
  out->shape[2] = g.OH;
  out->shape[3] = g.OW;
  return 0;
}

static FLOW_KERNEL(cpu_conv2d) {
  (void)nin; (void)nout;
  flow_conv_geom g;
  flow_meta x, w;
  flow_meta_from(&x, in[0]);
  flow_meta_from(&w, in[1]);
  if (conv_geom(&flow_op_conv2d_grad, &x, &w, a, &g) != 0) return -1;
  return flow_cpu_conv2d_forward(out[0], in[0], in[1], a->flags & CONV_BIAS ? in[2] : NULL, &g);
}

/* conv2d_grad inputs: dy, x, w; outputs dx, dw, db [O]. */
static int infer_conv2d_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                             flow_meta *out) {
  (void)op; (void)nin; (void)a;
  out[0] = in[1];
  out[1] = in[2];
  out[2] = in[2];
  out[2].ndim = 1;
  return 0;
}

static FLOW_KERNEL(cpu_conv2d_grad) {
  (void)nin; (void)nout;
  flow_conv_geom g;
  flow_meta x, w;
  flow_meta_from(&x, in[1]);
  flow_meta_from(&w, in[2]);
  if (conv_geom(&flow_op_conv2d_grad, &x, &w, a, &g) != 0) return -1;
  return flow_cpu_conv2d_backward(out[0], out[1], out[2], in[0], in[1], in[2], &g);
}

/* Run a backward op and hand output j to input map[j] when it wants a gradient. */
static int run_backward(const flow_grad_ctx *c, const flow_op *op, flow_tensor *const *in, int nin, const int *map,
                        flow_tensor **gin) {
  flow_tensor *out[4];
  if (flow_op_call(op, in, nin, c->attrs, out) != 0) return -1;
  for (int j = 0; j < op->nout; j++) {
    if (map[j] >= 0 && c->need[map[j]]) gin[map[j]] = out[j];
    else flow_tensor_decref(out[j]);
  }
  return 0;
}

static int grad_conv2d(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0]) return 0;
  flow_tensor *in[3] = {c->gout[0], c->in[0], c->in[1]};
  int map[3] = {0, 1, c->attrs->flags & CONV_BIAS ? 2 : -1};
  return run_backward(c, &flow_op_conv2d_grad, in, 3, map, gin);
}

FLOW_OP(conv2d) {.nin = -1, .nout = 1, .infer = infer_conv2d,
                 .grad = grad_conv2d, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, conv2d, cpu_conv2d)
FLOW_OP(conv2d_grad) {.nin = 3, .nout = 3, .infer = infer_conv2d_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, conv2d_grad, cpu_conv2d_grad)

/* ---- max_pool2d, avg_pool2d --------------------------------------------------------------- */

static int pool_geom(const flow_op *op, const flow_meta *x, const flow_attrs *a, flow_conv_geom *g) {
  if (a->nshape != 2 || a->naxes != 4)
    return flow_error_set("%s: attrs need shape = kernel (2 values) and axes = stride, padding (4 values)", op->name);
  *g = (flow_conv_geom){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .O = x->shape[1],
                        .kh = a->shape[0], .kw = a->shape[1], .sh = a->axes[0], .sw = a->axes[1], .ph = a->axes[2],
                        .pw = a->axes[3], .dh = 1, .dw = 1, .groups = 1};
  if (out_extent(op, g->H, g->kh, g->sh, g->ph, 1, &g->OH) != 0 ||
      out_extent(op, g->W, g->kw, g->sw, g->pw, 1, &g->OW) != 0)
    return -1;
  if (2 * g->ph > g->kh || 2 * g->pw > g->kw)
    return flow_error_set("%s: padding (%lld, %lld) must be at most half the kernel (%lld, %lld)", op->name,
                          (long long)g->ph, (long long)g->pw, (long long)g->kh, (long long)g->kw);
  return 0;
}

static int infer_pool(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  (void)nin;
  flow_conv_geom g;
  if (check_4d(op, &in[0], "input") != 0 || pool_geom(op, &in[0], a, &g) != 0) return -1;
  *out = in[0];
  out->shape[2] = g.OH;
  out->shape[3] = g.OW;
  return 0;
}

/* *_pool2d_grad inputs: dy, x; output dx. */
static int infer_pool_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  (void)op; (void)nin; (void)a;
  *out = in[1];
  return 0;
}

static int pool_fwd(flow_tensor *const *in, flow_tensor **out, const flow_attrs *a, const flow_op *op, bool max) {
  flow_conv_geom g;
  flow_meta x;
  flow_meta_from(&x, in[0]);
  if (pool_geom(op, &x, a, &g) != 0) return -1;
  return flow_cpu_pool2d_forward(out[0], in[0], &g, max);
}
static int pool_bwd(flow_tensor *const *in, flow_tensor **out, const flow_attrs *a, const flow_op *op, bool max) {
  flow_conv_geom g;
  flow_meta x;
  flow_meta_from(&x, in[1]);
  if (pool_geom(op, &x, a, &g) != 0) return -1;
  return flow_cpu_pool2d_backward(out[0], in[0], in[1], &g, max);
}
static FLOW_KERNEL(cpu_max_pool2d) { (void)nin; (void)nout; return pool_fwd(in, out, a, &flow_op_max_pool2d_grad, true); }
static FLOW_KERNEL(cpu_avg_pool2d) { (void)nin; (void)nout; return pool_fwd(in, out, a, &flow_op_avg_pool2d_grad, false); }
static FLOW_KERNEL(cpu_max_pool2d_grad) { (void)nin; (void)nout; return pool_bwd(in, out, a, &flow_op_max_pool2d_grad, true); }
static FLOW_KERNEL(cpu_avg_pool2d_grad) { (void)nin; (void)nout; return pool_bwd(in, out, a, &flow_op_avg_pool2d_grad, false); }

static int grad_pool(const flow_grad_ctx *c, flow_tensor **gin, const flow_op *bwd) {
  if (!c->gout[0] || !c->need[0]) return 0;
  flow_tensor *in[2] = {c->gout[0], c->in[0]};
  return run_backward(c, bwd, in, 2, (const int[]){0}, gin);
}
static int grad_max_pool2d(const flow_grad_ctx *c, flow_tensor **gin) { return grad_pool(c, gin, &flow_op_max_pool2d_grad); }
static int grad_avg_pool2d(const flow_grad_ctx *c, flow_tensor **gin) { return grad_pool(c, gin, &flow_op_avg_pool2d_grad); }

FLOW_OP(max_pool2d) {.nin = 1, .nout = 1, .infer = infer_pool, .grad = grad_max_pool2d, .save_in = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, max_pool2d, cpu_max_pool2d)
FLOW_OP(avg_pool2d) {.nin = 1, .nout = 1, .infer = infer_pool, .grad = grad_avg_pool2d, .save_in = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, avg_pool2d, cpu_avg_pool2d)
FLOW_OP(max_pool2d_grad) {.nin = 2, .nout = 1, .infer = infer_pool_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, max_pool2d_grad, cpu_max_pool2d_grad)
FLOW_OP(avg_pool2d_grad) {.nin = 2, .nout = 1, .infer = infer_pool_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, avg_pool2d_grad, cpu_avg_pool2d_grad)

/* ---- batch_norm ----------------------------------------------------------------------------
 * inputs: x [N, C, ...], weight [C], bias [C], running_mean [C], running_var [C]. */

static int infer_batch_norm(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                            flow_meta *out) {
  (void)nin;
  const flow_meta *x = &in[0];
  if (check_real(op, x, "input") != 0) return -1;
  char sx[128], sp[128];
  if (x->ndim < 2)
    return flow_error_set("%s: input must be at least 2-d [N, C, ...], got %s", op->name,
                          flow_shape_str(x->ndim, x->shape, sx, sizeof sx));
  static const char *what[] = {NULL, "weight", "bias", "running_mean", "running_var"};
  for (int i = 1; i < 5; i++) {
    if (check_like(op, &in[i], x, what[i]) != 0) return -1;
    if (in[i].ndim != 1 || in[i].shape[0] != x->shape[1])
      return flow_error_set("%s: %s must have shape {%lld} (the channels of the input %s), got %s", op->name, what[i],
                            (long long)x->shape[1], flow_shape_str(x->ndim, x->shape, sx, sizeof sx),
                            flow_shape_str(in[i].ndim, in[i].shape, sp, sizeof sp));
  }
  if (!(a->eps >= 0)) return flow_error_set("%s: eps must be >= 0 (got %g)", op->name, a->eps);
  if ((a->flags & BN_TRAINING) && flow_shape_numel(x->ndim, x->shape) / x->shape[1] < 1 && x->shape[1] > 0)
    return flow_error_set("%s: training needs at least one value per channel", op->name);
  *out = *x;
  return 0;
}

static FLOW_KERNEL(cpu_batch_norm) {
  (void)nin; (void)nout;
  return flow_cpu_batchnorm_forward(out[0], in[0], in[1], in[2], in[3], in[4], a->flags & BN_TRAINING, a->scalar,
                                    a->eps);
}

/* batch_norm_grad inputs: dy, x, weight, running_mean, running_var; outputs dx, dweight, dbias. */
static int infer_batch_norm_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                                 flow_meta *out) {
  (void)op; (void)nin; (void)a;
  out[0] = in[1];
  out[1] = in[2];
  out[2] = in[2];
  return 0;
}

static FLOW_KERNEL(cpu_batch_norm_grad) {
  (void)nin; (void)nout;
  return flow_cpu_batchnorm_backward(out[0], out[1], out[2], in[0], in[1], in[2], in[3], in[4],
                                     a->flags & BN_TRAINING, a->eps);
}

static int grad_batch_norm(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0]) return 0;
  flow_tensor *in[5] = {c->gout[0], c->in[0], c->in[1], c->in[3], c->in[4]};
  return run_backward(c, &flow_op_batch_norm_grad, in, 5, (const int[]){0, 1, 2}, gin);
}

/* On shards, the kernels see only their rows: evaluation (running statistics) splits like an
 * elementwise op; training statistics are the whole batch's, so global training is lowered to ops
 * by flow_batch_norm below and the fused op runs whole. */
FLOW_OP(batch_norm) {.nin = 5, .nout = 1, .sbp = FLOW_SBP_RULE_UNLESS(batch_norm, 0, BN_TRAINING),
                     .infer = infer_batch_norm, .grad = grad_batch_norm, .save_in = 0x1b, .nondiff_in = 0x18};
FLOW_KERNEL_REGISTER(FLOW_CPU, batch_norm, cpu_batch_norm)
FLOW_OP(batch_norm_grad) {.nin = 5, .nout = 3, .sbp = FLOW_SBP_RULE_UNLESS(batch_norm, FLOW_SBP_BACKWARD, BN_TRAINING),
                          .infer = infer_batch_norm_grad};
FLOW_KERNEL_REGISTER(FLOW_CPU, batch_norm_grad, cpu_batch_norm_grad)

/* ---- C entry points ------------------------------------------------------------------------ */

flow_tensor *flow_conv2d(flow_tensor *x, flow_tensor *w, flow_tensor *bias, const int64_t stride[2],
                         const int64_t padding[2], const int64_t dilation[2], int64_t groups) {
  flow_attrs at;
  flow_attrs_init(&at);
  int64_t v[6] = {stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1]};
  for (int i = 0; i < 6; i++) at.axes[i] = v[i];
  at.naxes = 6;
  at.k = groups;
  if (bias) at.flags |= CONV_BIAS;
  flow_tensor *in[3] = {x, w, bias};
  return flow_op_call1(&flow_op_conv2d, in, bias ? 3 : 2, &at);
}

static flow_tensor *pool_call(const flow_op *op, flow_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                              const int64_t padding[2]) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.shape[0] = kernel[0];
  at.shape[1] = kernel[1];
  at.nshape = 2;
  int64_t v[4] = {stride[0], stride[1], padding[0], padding[1]};
  for (int i = 0; i < 4; i++) at.axes[i] = v[i];
  at.naxes = 4;
  return flow_op_call1(op, &x, 1, &at);
}
flow_tensor *flow_max_pool2d(flow_tensor *x, const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2]) {
  return pool_call(&flow_op_max_pool2d, x, kernel, stride, padding);
}
flow_tensor *flow_avg_pool2d(flow_tensor *x, const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2]) {
  return pool_call(&flow_op_avg_pool2d, x, kernel, stride, padding);
}

/* Training on global tensors (SyncBatchNorm): the statistics of the logical batch, from ops whose
 * rules make them global. With x split on the batch, the per-channel sums are partial sums,
 * all-reduced where the next op needs them whole; autograd derives the backward, whose sums over
 * the batch are all-reduced the same way. Two passes (mean, then the squares about it) as the
 * kernel does, so the result matches a one-rank run to rounding:
 *   mean = sum(x) / n,  var = sum((x - mean)^2) / n,  y = (x - mean) * weight / sqrt(var + eps) + bias
 *   running_mean += momentum (mean - running_mean),  running_var likewise with var n / (n - 1). */
static flow_tensor *global_batch_norm(flow_tensor *x, flow_tensor *weight, flow_tensor *bias, flow_tensor *running_mean,
                                      flow_tensor *running_var, double momentum, double eps) {
  int nd = flow_tensor_lndim(x);
  const int64_t *xs = flow_tensor_lshape(x);
  int64_t axes[FLOW_MAX_DIMS], cshape[FLOW_MAX_DIMS], naxes = 0;
  for (int d = 0; d < nd; d++) {
    if (d != 1) axes[naxes++] = d;
    cshape[d] = d == 1 ? xs[1] : 1;
  }
  double n = (double)(flow_shape_numel(nd, xs) / (xs[1] ? xs[1] : 1));
  flow_tensor *sum = flow_sum(x, (int)naxes, axes, true);
  flow_tensor *mean = sum ? flow_mul_scalar(sum, 1 / n) : NULL;
  flow_tensor *xc = mean ? flow_sub(x, mean) : NULL;
  flow_tensor *sq = xc ? flow_mul(xc, xc) : NULL;
  flow_tensor *ssq = sq ? flow_sum(sq, (int)naxes, axes, true) : NULL;
  flow_tensor *var = ssq ? flow_mul_scalar(ssq, 1 / n) : NULL;
  flow_tensor *ve = var ? flow_add_scalar(var, eps) : NULL;
  flow_tensor *rstd = ve ? flow_rsqrt(ve) : NULL;
  flow_tensor *w = rstd ? flow_reshape(weight, nd, cshape) : NULL;
  flow_tensor *scale = w ? flow_mul(w, rstd) : NULL;
  flow_tensor *xs_ = scale ? flow_mul(xc, scale) : NULL;
  flow_tensor *b = xs_ ? flow_reshape(bias, nd, cshape) : NULL;
  flow_tensor *y = b ? flow_add(xs_, b) : NULL;
  if (y) {
    bool prev = flow_grad_set_enabled(false);
    flow_tensor *stat[2] = {mean, var}, *run[2] = {running_mean, running_var};
    for (int i = 0; i < 2 && y; i++) {
      double unbias = i == 1 && n > 1 ? n / (n - 1) : 1;
      flow_tensor *s = flow_reshape(stat[i], 1, &xs[1]);
      flow_tensor *ms = s ? flow_mul_scalar(s, momentum * unbias) : NULL;
      flow_tensor *keep = ms ? flow_mul_scalar(run[i], 1 - momentum) : NULL;
      flow_tensor *upd = keep ? flow_add(keep, ms) : NULL;
      if (!upd || flow_copy_inplace(run[i], upd) != 0) { flow_tensor_decref(y); y = NULL; }
      flow_decref_all((flow_tensor *[]){s, ms, keep, upd}, 4);
    }
    flow_grad_set_enabled(prev);
  }
  flow_decref_all((flow_tensor *[]){sum, mean, xc, sq, ssq, var, ve, rstd, w, scale, xs_, b}, 12);
  return y;
}

flow_tensor *flow_batch_norm(flow_tensor *x, flow_tensor *weight, flow_tensor *bias, flow_tensor *running_mean,
                             flow_tensor *running_var, bool training, double momentum, double eps) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (training) at.flags |= BN_TRAINING;
  at.scalar = momentum;
  at.eps = eps;
  flow_tensor *in[5] = {x, weight, bias, running_mean, running_var};
  bool global = false;
  for (int i = 0; i < 5; i++) global |= in[i]->global != NULL;
  if (!training || !global) return flow_op_call1(&flow_op_batch_norm, in, 5, &at);
  /* the op's own checks first, on the logical metadata: the lowering's ops would not name batch_norm */
  flow_meta m[5], out;
  for (int i = 0; i < 5; i++) flow_meta_from(&m[i], in[i]);
  if (infer_batch_norm(&flow_op_batch_norm, m, 5, &at, &out) != 0) return NULL;
  return global_batch_norm(x, weight, bias, running_mean, running_var, momentum, eps);
}
