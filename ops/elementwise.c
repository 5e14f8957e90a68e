/* Elementwise ops: binary arithmetic and comparisons with broadcasting, where and masked_fill,
 * the unary math ops, in-place updates, copy/cast and fill: shape, dtype and gradient rules. */
#include "elementwise.h"

#include <math.h>

#include "../kernels/cpu/cpu.h"
#include "../sbp/signature.h"
#include "reduce.h"

/* ---- binary with broadcasting ------------------------------------------------------------ */

/* Same dtype in and out, bool included: for add, mul, maximum and minimum, whose kernels keep
 * {0, 1} closed as torch's bool results are (add is or, mul and, maximum or, minimum and). */
static int infer_binary_bool(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                             flow_meta *out) {
  (void)nin; (void)a;
  if (flow_check_same_dtype(op, in, 2) != 0) return -1;
  out->dtype = in[0].dtype;
  out->device = in[0].device;
  return flow_broadcast_shape(op->name, in[0].ndim, in[0].shape, in[1].ndim, in[1].shape,
                              &out->ndim, out->shape);
}

/* The other arithmetic: no bool, as torch ("not implemented for 'Bool'"). */
static int infer_binary(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  if (in[0].dtype == FLOW_BOOL && in[1].dtype == FLOW_BOOL)
    return flow_error_set("%s: not implemented for bool tensors, as in torch (cast to an integer or float dtype first)",
                          op->name);
  return infer_binary_bool(op, in, nin, a, out);
}

/* torch refuses `-` with a bool operand, even one another operand would promote. */
static int bool_sub_error(const flow_op *op, flow_dtype a, flow_dtype b) {
  if (a == FLOW_BOOL && b == FLOW_BOOL)
    return flow_error_set("%s: subtraction, the `-` operator, with two bool tensors is not supported, as in torch; "
                          "for a logical xor use ne(a, b)", op->name);
  return flow_error_set("%s: subtraction, the `-` operator, with a bool tensor is not supported, as in torch; "
                        "to invert a mask use eq(mask, false)", op->name);
}

static int infer_sub(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  if (in[0].dtype == FLOW_BOOL || in[1].dtype == FLOW_BOOL) return bool_sub_error(op, in[0].dtype, in[1].dtype);
  return infer_binary(op, in, nin, a, out);
}

/* Comparisons: any (same) dtype in, bool out. */
static int infer_compare(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  (void)nin; (void)a;
  if (flow_check_same_dtype(op, in, 2) != 0) return -1;
  out->dtype = FLOW_BOOL;
  out->device = in[0].device;
  return flow_broadcast_shape(op->name, in[0].ndim, in[0].shape, in[1].ndim, in[1].shape,
                              &out->ndim, out->shape);
}

#define CPU_BINARY(NAME, CODE)                                                       \
  static FLOW_KERNEL(cpu_##NAME) {                                             \
    (void)nin; (void)nout; (void)a;                                                \
    return flow_cpu_binary(CODE, out[0], in[0], in[1]);                            \
  }
CPU_BINARY(add, FLOW_BIN_ADD)
CPU_BINARY(sub, FLOW_BIN_SUB)
CPU_BINARY(mul, FLOW_BIN_MUL)
CPU_BINARY(div, FLOW_BIN_DIV)
CPU_BINARY(pow, FLOW_BIN_POW)
CPU_BINARY(maximum, FLOW_BIN_MAX)
CPU_BINARY(minimum, FLOW_BIN_MIN)
CPU_BINARY(remainder, FLOW_BIN_REM)
CPU_BINARY(fmod, FLOW_BIN_FMOD)
CPU_BINARY(floor_divide, FLOW_BIN_FLOORDIV)
CPU_BINARY(trunc_divide, FLOW_BIN_TRUNCDIV)
CPU_BINARY(eq, FLOW_BIN_EQ)
CPU_BINARY(ne, FLOW_BIN_NE)
CPU_BINARY(lt, FLOW_BIN_LT)
CPU_BINARY(le, FLOW_BIN_LE)
CPU_BINARY(gt, FLOW_BIN_GT)
CPU_BINARY(ge, FLOW_BIN_GE)

/* Reduce a broadcast gradient back to the input's shape. */
static flow_tensor *unbroadcast(flow_tensor *g, const flow_meta *m) {
  return flow_sum_to_shape(g, m->ndim, m->shape);
}

/* gin[i] = unbroadcast(g) for input i, consuming g (which may be NULL after an error). */
static int give(flow_tensor **gin, int i, flow_tensor *g, const flow_grad_ctx *c) {
  if (!g) return -1;
  gin[i] = unbroadcast(g, &c->in_meta[i]);
  flow_tensor_decref(g);
  return gin[i] ? 0 : -1;
}

static int grad_add(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  for (int i = 0; i < 2; i++)
    if (c->need[i] && !(gin[i] = unbroadcast(g, &c->in_meta[i]))) return -1;
  return 0;
}

static int grad_sub(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  if (c->need[0] && !(gin[0] = unbroadcast(g, &c->in_meta[0]))) return -1;
  if (c->need[1] && give(gin, 1, flow_neg(g), c) != 0) return -1;
  return 0;
}

/* d(a*b) = g*b, g*a */
static int grad_mul(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  for (int i = 0; i < 2; i++)
    if (c->need[i] && give(gin, i, flow_mul(g, c->in[1 - i]), c) != 0) return -1;
  return 0;
}

/* d(a/b) = g/b, -g*a/b^2 = -(g/b)*(a/b) */
static int grad_div(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  flow_tensor *gb = flow_div(g, c->in[1]);
  if (!gb) return -1;
  int rc = 0;
  if (c->need[0] && !(gin[0] = unbroadcast(gb, &c->in_meta[0]))) rc = -1;
  if (rc == 0 && c->need[1]) {
    flow_tensor *q = flow_div(c->in[0], c->in[1]);
    flow_tensor *p = q ? flow_mul(gb, q) : NULL;
    rc = give(gin, 1, p ? flow_neg(p) : NULL, c);
    flow_tensor_decref(q); flow_tensor_decref(p);
  }
  flow_tensor_decref(gb);
  return rc;
}

/* y = a^b: da = g b a^(b-1), db = g y log(a). At a = 0 follow torch: da is 0 where b = 0 (not
 * 0 * inf), db is 0 where a = 0 (not y * -inf). */
static int grad_pow(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
  if (!g) return 0;
  if (c->need[0]) {
    flow_tensor *bm1 = flow_add_scalar(b, -1);
    flow_tensor *p = bm1 ? flow_pow(a, bm1) : NULL;
    flow_tensor *q = p ? flow_mul(p, b) : NULL;
    flow_tensor *r = q ? flow_mul(g, q) : NULL;
    flow_tensor *bz = r ? flow_eq_scalar(b, 0) : NULL;
    flow_tensor *d = bz ? flow_masked_fill(r, bz, 0) : NULL;
    flow_decref_all((flow_tensor *[]){bm1, p, q, r, bz}, 5);
    if (give(gin, 0, d, c) != 0) return -1;
  }
  if (c->need[1]) {
    flow_tensor *l = flow_log(a);
    flow_tensor *q = l ? flow_mul(c->out[0], l) : NULL;
    flow_tensor *r = q ? flow_mul(g, q) : NULL;
    flow_tensor *az = r ? flow_eq_scalar(a, 0) : NULL;
    flow_tensor *d = az ? flow_masked_fill(r, az, 0) : NULL;
    flow_decref_all((flow_tensor *[]){l, q, r, az}, 4);
    if (give(gin, 1, d, c) != 0) return -1;
  }
  return 0;
}

/* maximum/minimum, as torch: h = g/2 where a == b, else g; each input gets h except where the
 * other input wins (0). At a NaN neither wins, so both get g. */
static int grad_maxmin(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
  if (!g) return 0;
  bool is_max = c->op == &flow_op_maximum;
  flow_tensor *tie = flow_eq(a, b);
  flow_tensor *half = tie ? flow_mul_scalar(g, 0.5) : NULL;
  flow_tensor *h = half ? flow_where(tie, half, g) : NULL;
  flow_decref_all((flow_tensor *[]){tie, half}, 2);
  if (!h) return -1;
  int rc = 0;
  for (int i = 0; i < 2 && rc == 0; i++) {
    if (!c->need[i]) continue;
    /* a loses to b where a < b (maximum) or a > b (minimum); b the other way round */
    flow_tensor *loses = is_max == (i == 0) ? flow_lt(a, b) : flow_gt(a, b);
    rc = give(gin, i, loses ? flow_masked_fill(h, loses, 0) : NULL, c);
    flow_tensor_decref(loses);
  }
  flow_tensor_decref(h);
  return rc;
}

/* remainder = a - floor(a/b) b and fmod = a - trunc(a/b) b, with the quotient piecewise constant:
 * da = g, db = -g q (q = floor_divide or trunc_divide of a, b), as torch. */
static int grad_mod(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  if (c->need[0] && !(gin[0] = unbroadcast(g, &c->in_meta[0]))) return -1;
  if (!c->need[1]) return 0;
  const flow_op *quot = c->op == &flow_op_remainder ? &flow_op_floor_divide : &flow_op_trunc_divide;
  flow_tensor *q = flow_op_call1(quot, c->in, 2, flow_attrs_default());
  flow_tensor *p = q ? flow_mul(g, q) : NULL;
  flow_tensor_decref(q);
  int rc = give(gin, 1, p ? flow_neg(p) : NULL, c);
  flow_tensor_decref(p);
  return rc;
}

FLOW_OP(add) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
              .infer = infer_binary_bool, .grad = grad_add};
FLOW_KERNEL_REGISTER(FLOW_CPU, add, cpu_add)
FLOW_OP(sub) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
              .infer = infer_sub, .grad = grad_sub};
FLOW_KERNEL_REGISTER(FLOW_CPU, sub, cpu_sub)
FLOW_OP(mul) {.nin = 2, .nout = 1, .cpu_half = true,
              .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_P_FIRST | FLOW_SBP_P_SECOND),
              .infer = infer_binary_bool, .grad = grad_mul, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, mul, cpu_mul)
FLOW_OP(div) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_P_FIRST),
              .infer = infer_binary, .grad = grad_div, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, div, cpu_div)
FLOW_OP(pow) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0), .infer = infer_binary,
              .grad = grad_pow, .save_in = 3, .save_out = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, pow, cpu_pow)
FLOW_OP(maximum) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                  .infer = infer_binary_bool, .grad = grad_maxmin, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, maximum, cpu_maximum)
FLOW_OP(minimum) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                  .infer = infer_binary_bool, .grad = grad_maxmin, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, minimum, cpu_minimum)
FLOW_OP(remainder) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                    .infer = infer_binary, .grad = grad_mod, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, remainder, cpu_remainder)
FLOW_OP(fmod) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
               .infer = infer_binary, .grad = grad_mod, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, fmod, cpu_fmod)
/* floor(a / b) and trunc(a / b) (div's rounding modes) are piecewise constant: zero gradients, as
 * torch gives for div's rounding modes. */
static int grad_quotient(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0]) return 0;
  for (int i = 0; i < 2; i++) {
    const flow_meta *m = &c->in_meta[i];
    if (c->need[i] && !(gin[i] = flow_full(m->ndim, m->shape, 0, m->dtype, m->device))) return -1;
  }
  return 0;
}

FLOW_OP(floor_divide) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                       .infer = infer_binary, .grad = grad_quotient};
FLOW_KERNEL_REGISTER(FLOW_CPU, floor_divide, cpu_floor_divide)
FLOW_OP(trunc_divide) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                       .infer = infer_binary, .grad = grad_quotient};
FLOW_KERNEL_REGISTER(FLOW_CPU, trunc_divide, cpu_trunc_divide)
FLOW_OP(eq) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
             .infer = infer_compare};
FLOW_KERNEL_REGISTER(FLOW_CPU, eq, cpu_eq)
FLOW_OP(ne) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
             .infer = infer_compare};
FLOW_KERNEL_REGISTER(FLOW_CPU, ne, cpu_ne)
FLOW_OP(lt) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
             .infer = infer_compare};
FLOW_KERNEL_REGISTER(FLOW_CPU, lt, cpu_lt)
FLOW_OP(le) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
             .infer = infer_compare};
FLOW_KERNEL_REGISTER(FLOW_CPU, le, cpu_le)
FLOW_OP(gt) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
             .infer = infer_compare};
FLOW_KERNEL_REGISTER(FLOW_CPU, gt, cpu_gt)
FLOW_OP(ge) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
             .infer = infer_compare};
FLOW_KERNEL_REGISTER(FLOW_CPU, ge, cpu_ge)

void flow_decref_all(flow_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++) flow_tensor_decref(ts[i]);
}

/* ---- type promotion, as torch.result_type ------------------------------------------------- */

/* bool < integers < floats */
static int category(flow_dtype d) { return d == FLOW_BOOL ? 0 : flow_dtype_is_float(d) ? 2 : 1; }

flow_dtype flow_promote_types(flow_dtype a, flow_dtype b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if ((a == FLOW_F16 && b == FLOW_BF16) || (a == FLOW_BF16 && b == FLOW_F16)) return FLOW_F32;
  return flow_dtype_size(a) >= flow_dtype_size(b) ? a : b; /* u8 < i32 < i64, f16 < f32 < f64 */
}

/* torch's combine_categories: a class of lower priority (0-d tensors below tensors with axes,
 * numbers below both) changes the result only by a higher category. -1: no operand of the class. */
static int combine(int higher, int lower) {
  if (higher < 0) return lower;
  if (lower < 0 || category(higher) == 2) return higher;
  if (higher == FLOW_BOOL || category(lower) == 2) return flow_promote_types(higher, lower);
  return higher;
}

flow_dtype flow_result_type(int n, const flow_dtype *dtype, const int *ndim, const bool *number) {
  int r[3] = {-1, -1, -1}; /* tensors with axes, 0-d tensors, numbers */
  for (int i = 0; i < n; i++) {
    int cls = number && number[i] ? 2 : ndim[i] > 0 ? 0 : 1;
    flow_dtype d = cls == 2 && category(dtype[i]) == 2 ? FLOW_F32 : dtype[i]; /* a float number: the default dtype */
    r[cls] = r[cls] < 0 ? (int)d : (int)flow_promote_types((flow_dtype)r[cls], d);
  }
  return (flow_dtype)combine(r[0], combine(r[1], r[2]));
}

flow_dtype flow_binary_dtype(const flow_op *op, const flow_dtype *dtype, const int *ndim, const bool *number) {
  flow_dtype d = flow_result_type(2, dtype, ndim, number);
  if (op == &flow_op_div && !flow_dtype_is_float(d)) d = FLOW_F32; /* true division */
  return d;
}

flow_tensor *flow_binary(const flow_op *op, flow_tensor *a, flow_tensor *b) {
  flow_tensor *in[2] = {a, b};
  if (op == &flow_op_sub && (a->dtype == FLOW_BOOL || b->dtype == FLOW_BOOL)) { /* before promotion */
    bool_sub_error(op, a->dtype, b->dtype);
    return NULL;
  }
  flow_dtype d = flow_binary_dtype(op, (flow_dtype[]){a->dtype, b->dtype},
                                   (int[]){flow_tensor_lndim(a), flow_tensor_lndim(b)}, NULL);
  if (a->dtype == d && b->dtype == d) return flow_op_call1(op, in, 2, flow_attrs_default());
  flow_tensor *ca = flow_cast(a, d), *cb = ca ? flow_cast(b, d) : NULL;
  flow_tensor *r = cb ? flow_op_call1(op, (flow_tensor *[]){ca, cb}, 2, flow_attrs_default()) : NULL;
  flow_decref_all((flow_tensor *[]){ca, cb}, 2);
  return r;
}

flow_tensor *flow_add(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_add, a, b); }
flow_tensor *flow_sub(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_sub, a, b); }
flow_tensor *flow_mul(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_mul, a, b); }
flow_tensor *flow_div(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_div, a, b); }
flow_tensor *flow_pow(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_pow, a, b); }
flow_tensor *flow_maximum(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_maximum, a, b); }
flow_tensor *flow_minimum(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_minimum, a, b); }
flow_tensor *flow_remainder(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_remainder, a, b); }
flow_tensor *flow_fmod(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_fmod, a, b); }
flow_tensor *flow_floor_divide(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_floor_divide, a, b); }
flow_tensor *flow_eq(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_eq, a, b); }
flow_tensor *flow_ne(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_ne, a, b); }
flow_tensor *flow_lt(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_lt, a, b); }
flow_tensor *flow_le(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_le, a, b); }
flow_tensor *flow_gt(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_gt, a, b); }
flow_tensor *flow_ge(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_ge, a, b); }

flow_tensor *flow_binary_scalar(const flow_op *op, flow_tensor *a, double s) {
  flow_tensor *b = flow_scalar_tensor(s, a->dtype, a->device);
  if (!b) return NULL;
  flow_tensor *r = flow_binary(op, a, b);
  flow_tensor_decref(b);
  return r;
}
flow_tensor *flow_add_scalar(flow_tensor *a, double s) { return flow_binary_scalar(&flow_op_add, a, s); }
flow_tensor *flow_mul_scalar(flow_tensor *a, double s) { return flow_binary_scalar(&flow_op_mul, a, s); }
flow_tensor *flow_pow_scalar(flow_tensor *a, double s) { return flow_binary_scalar(&flow_op_pow, a, s); }
flow_tensor *flow_eq_scalar(flow_tensor *a, double s) { return flow_binary_scalar(&flow_op_eq, a, s); }

/* ---- where and masked_fill ------------------------------------------------------------------ */

static int check_mask(const flow_op *op, const flow_meta *m, const char *what) {
  if (m->dtype != FLOW_BOOL)
    return flow_error_set("%s: %s must be a bool tensor (got %s; make one with a comparison or :bool())",
                          op->name, what, flow_dtype_name(m->dtype));
  return 0;
}

/* where(cond, a, b): all three broadcast together; a and b share a dtype. */
static int infer_where(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                       flow_meta *out) {
  (void)nin; (void)a;
  if (check_mask(op, &in[0], "the condition") != 0 || flow_check_same_dtype(op, in + 1, 2) != 0) return -1;
  int nd;
  int64_t shape[FLOW_MAX_DIMS];
  if (flow_broadcast_shape(op->name, in[0].ndim, in[0].shape, in[1].ndim, in[1].shape, &nd, shape) != 0 ||
      flow_broadcast_shape(op->name, nd, shape, in[2].ndim, in[2].shape, &out->ndim, out->shape) != 0)
    return -1;
  out->dtype = in[1].dtype;
  out->device = in[1].device;
  return 0;
}

static FLOW_KERNEL(cpu_where) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_where(out[0], in[0], in[1], in[2]);
}

/* da = where(cond, g, 0), db = where(cond, 0, g) */
static int grad_where(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  flow_tensor *zero = flow_scalar_tensor(0, g->dtype, g->device);
  if (!zero) return -1;
  int rc = 0;
  if (c->need[1]) rc = give(gin, 1, flow_where(c->in[0], g, zero), c);
  if (rc == 0 && c->need[2]) rc = give(gin, 2, flow_where(c->in[0], zero, g), c);
  flow_tensor_decref(zero);
  return rc;
}

FLOW_OP(where) {.nin = 3, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                .infer = infer_where, .grad = grad_where, .save_in = 1, .nondiff_in = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, where, cpu_where)

/* a and b of different dtypes are promoted first, as torch.where (the cast's gradient casts back). */
flow_tensor *flow_where(flow_tensor *cond, flow_tensor *a, flow_tensor *b) {
  flow_dtype d = flow_result_type(2, (flow_dtype[]){a->dtype, b->dtype},
                                  (int[]){flow_tensor_lndim(a), flow_tensor_lndim(b)}, NULL);
  if (a->dtype == d && b->dtype == d) return flow_op_call1(&flow_op_where, (flow_tensor *[]){cond, a, b}, 3, flow_attrs_default());
  flow_tensor *ca = flow_cast(a, d), *cb = ca ? flow_cast(b, d) : NULL;
  flow_tensor *r = cb ? flow_op_call1(&flow_op_where, (flow_tensor *[]){cond, ca, cb}, 3, flow_attrs_default()) : NULL;
  flow_decref_all((flow_tensor *[]){ca, cb}, 2);
  return r;
}

/* masked_fill(x, mask, value): attrs.scalar is the value; x and mask broadcast together. */
static int infer_masked_fill(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                             flow_meta *out) {
  (void)nin; (void)a;
  if (check_mask(op, &in[1], "the mask") != 0) return -1;
  out->dtype = in[0].dtype;
  out->device = in[0].device;
  return flow_broadcast_shape(op->name, in[0].ndim, in[0].shape, in[1].ndim, in[1].shape,
                              &out->ndim, out->shape);
}

static FLOW_KERNEL(cpu_masked_fill) {
  (void)nin; (void)nout;
  return flow_cpu_masked_fill(out[0], in[0], in[1], a->scalar);
}

/* the gradient passes where the mask is false */
static int grad_masked_fill(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  return give(gin, 0, flow_masked_fill(c->gout[0], c->in[1], 0), c);
}

FLOW_OP(masked_fill) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                      .infer = infer_masked_fill, .grad = grad_masked_fill, .save_in = 2,
                      .nondiff_in = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, masked_fill, cpu_masked_fill)

flow_tensor *flow_masked_fill(flow_tensor *t, flow_tensor *mask, double value) {
  flow_tensor *in[2] = {t, mask};
  flow_attrs at;
  flow_attrs_init(&at);
  at.scalar = value;
  return flow_op_call1(&flow_op_masked_fill, in, 2, &at);
}

/* ---- unary ---------------------------------------------------------------------------------- */

/* Math ops (exp, log, ...) want floating point. */
static int infer_unary_float(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                             flow_meta *out) {
  (void)nin; (void)a;
  if (flow_check_float(op, &in[0], "input") != 0) return -1;
  *out = in[0];
  return 0;
}

/* neg, abs, relu, clamp, sign, floor, ceil, round, trunc: floating point, also int64/int32. */
static int infer_unary_signed(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                              flow_meta *out) {
  (void)nin; (void)a;
  flow_dtype d = in[0].dtype;
  if (d == FLOW_BOOL && op == &flow_op_neg)
    return flow_error_set("%s: negation, the `-` operator, on a bool tensor is not supported, as in torch; "
                          "to invert a mask use eq(mask, false)", op->name);
  if (!flow_dtype_is_float(d) && d != FLOW_I64 && d != FLOW_I32)
    return flow_error_set("%s: expected a floating-point, int64 or int32 tensor (got %s)", op->name,
                          flow_dtype_name(d));
  *out = in[0];
  return 0;
}

/* clamp reads attrs.scalar (min) when FLOW_ATTR_HAS_MIN, attrs.scalar2 (max) when HAS_MAX. */
static int infer_clamp(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                       flow_meta *out) {
  if (!(a->flags & (FLOW_ATTR_HAS_MIN | FLOW_ATTR_HAS_MAX)))
    return flow_error_set("%s: give a min, a max or both (got neither)", op->name);
  return infer_unary_signed(op, in, nin, a, out);
}

static double clamp_lo(const flow_attrs *a) { return a->flags & FLOW_ATTR_HAS_MIN ? a->scalar : -INFINITY; }
static double clamp_hi(const flow_attrs *a) { return a->flags & FLOW_ATTR_HAS_MAX ? a->scalar2 : INFINITY; }

/* <op>_grad(s, g) = f'(.) g in one pass, where s is the forward op's saved output (exp, sqrt,
 * rsqrt, tanh, sigmoid, relu) or input (abs, log, gelu, clamp); clamp_grad reads clamp's attrs. */
static int infer_unary_grad(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                            flow_meta *out) {
  (void)nin; (void)a;
  if (flow_check_same_dtype(op, in, 2) != 0 || flow_check_float(op, &in[1], "gradient") != 0) return -1;
  out->dtype = in[1].dtype;
  out->device = in[1].device;
  return flow_broadcast_shape(op->name, in[0].ndim, in[0].shape, in[1].ndim, in[1].shape,
                              &out->ndim, out->shape);
}

static int grad_unary(const flow_grad_ctx *c, flow_tensor **gin, const flow_op *grad_op) {
  if (!c->gout[0] || !c->need[0]) return 0;
  flow_tensor *in[2] = {c->op->save_out ? c->out[0] : c->in[0], c->gout[0]};
  gin[0] = flow_op_call1(grad_op, in, 2, c->attrs);
  return gin[0] ? 0 : -1;
}

static int grad_neg(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  return (gin[0] = flow_neg(c->gout[0])) ? 0 : -1;
}

/* Piecewise-constant unary ops (sign, floor, ...): a zero gradient (a tensor, as torch gives). */
static int grad_zero(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  return (gin[0] = flow_zeros_like(c->gout[0])) ? 0 : -1;
}

/* The op `id` (kernel and registration) with the rule GRAD; SBP_FLAGS: where it is linear. */
#define UNARY_OP(id, CODE, INFER, SAVE_IN, SAVE_OUT, SBP_FLAGS, GRAD)                         \
  static FLOW_KERNEL(cpu_##id) {                                                              \
    (void)nin; (void)nout;                                                                    \
    return flow_cpu_unary(CODE, out[0], in[0], clamp_lo(a), clamp_hi(a));                     \
  }                                                                                           \
  FLOW_KERNEL_REGISTER(FLOW_CPU, id, cpu_##id)                                                \
  FLOW_OP(id) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, SBP_FLAGS), \
               .infer = INFER, .grad = GRAD, .save_in = SAVE_IN, .save_out = SAVE_OUT};

/* The op `<id>_grad` and the rule grad_<id> that runs it. */
#define UNARY_GRAD(id, CODE)                                                                  \
  static FLOW_KERNEL(cpu_##id##_grad) {                                                       \
    (void)nin; (void)nout;                                                                    \
    return flow_cpu_unary_backward(CODE, out[0], in[0], in[1], clamp_lo(a), clamp_hi(a));     \
  }                                                                                           \
  FLOW_KERNEL_REGISTER(FLOW_CPU, id##_grad, cpu_##id##_grad)                                  \
  FLOW_OP(id##_grad) {.nin = 2, .nout = 1, .cpu_half = true, .infer = infer_unary_grad,      \
                      .sbp = FLOW_SBP_RULE(elementwise, 0)};                                  \
  static int grad_##id(const flow_grad_ctx *c, flow_tensor **gin) {                          \
    return grad_unary(c, gin, &flow_op_##id##_grad);                                          \
  }

#define UNARY_ENTRY(id) \
  flow_tensor *flow_##id(flow_tensor *t) { return flow_op_call1(&flow_op_##id, &t, 1, flow_attrs_default()); }

UNARY_OP(neg, FLOW_UN_NEG, infer_unary_signed, 0, 0, FLOW_SBP_LINEAR, grad_neg)
UNARY_ENTRY(neg)

#define UNARY(id, CODE, INFER, SAVE_IN, SAVE_OUT) \
  UNARY_GRAD(id, CODE) UNARY_OP(id, CODE, INFER, SAVE_IN, SAVE_OUT, 0, grad_##id) UNARY_ENTRY(id)
#define STEP(id, CODE) UNARY_OP(id, CODE, infer_unary_signed, 0, 0, 0, grad_zero) UNARY_ENTRY(id)
UNARY(abs, FLOW_UN_ABS, infer_unary_signed, 1, 0)
UNARY(exp, FLOW_UN_EXP, infer_unary_float, 0, 1)
UNARY(log, FLOW_UN_LOG, infer_unary_float, 1, 0)
UNARY(sqrt, FLOW_UN_SQRT, infer_unary_float, 0, 1)
UNARY(rsqrt, FLOW_UN_RSQRT, infer_unary_float, 0, 1)
UNARY(tanh, FLOW_UN_TANH, infer_unary_float, 0, 1)
UNARY(sigmoid, FLOW_UN_SIGMOID, infer_unary_float, 0, 1)
UNARY(relu, FLOW_UN_RELU, infer_unary_signed, 0, 1)
UNARY(gelu, FLOW_UN_GELU, infer_unary_float, 1, 0)
UNARY(gelu_tanh, FLOW_UN_GELU_TANH, infer_unary_float, 1, 0)
UNARY(silu, FLOW_UN_SILU, infer_unary_float, 1, 0)
UNARY(sin, FLOW_UN_SIN, infer_unary_float, 1, 0)
UNARY(cos, FLOW_UN_COS, infer_unary_float, 1, 0)
UNARY(erf, FLOW_UN_ERF, infer_unary_float, 1, 0)
UNARY(log1p, FLOW_UN_LOG1P, infer_unary_float, 1, 0)
UNARY(expm1, FLOW_UN_EXPM1, infer_unary_float, 0, 1)
UNARY(softplus, FLOW_UN_SOFTPLUS, infer_unary_float, 1, 0)
STEP(sign, FLOW_UN_SIGN)
STEP(floor, FLOW_UN_FLOOR)
STEP(ceil, FLOW_UN_CEIL)
STEP(round, FLOW_UN_ROUND)
STEP(trunc, FLOW_UN_TRUNC)
UNARY_GRAD(clamp, FLOW_UN_CLAMP)
UNARY_OP(clamp, FLOW_UN_CLAMP, infer_clamp, 1, 0, 0, grad_clamp)

flow_tensor *flow_clamp(flow_tensor *t, bool has_min, double min, bool has_max, double max) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.flags = (has_min ? FLOW_ATTR_HAS_MIN : 0) | (has_max ? FLOW_ATTR_HAS_MAX : 0);
  at.scalar = min;
  at.scalar2 = max;
  return flow_op_call1(&flow_op_clamp, &t, 1, &at);
}

/* ---- in place: add_, mul_, copy_, fill_ (optimizers, gradient accumulation; no autograd) ---- */

static int infer_inplace(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  (void)nin; (void)a;
  int nd;
  int64_t shape[FLOW_MAX_DIMS];
  if (flow_broadcast_shape(op->name, in[0].ndim, in[0].shape, in[1].ndim, in[1].shape, &nd, shape) != 0)
    return -1;
  if (!flow_shape_eq(nd, shape, in[0].ndim, in[0].shape)) {
    char s0[128], s1[128];
    return flow_error_set("%s: cannot write a result of shape %s into a tensor of shape %s", op->name,
                          flow_shape_str(nd, shape, s0, sizeof s0),
                          flow_shape_str(in[0].ndim, in[0].shape, s1, sizeof s1));
  }
  *out = in[0];
  return 0;
}

static int infer_arith_(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  if (flow_check_same_dtype(op, in, 2) != 0) return -1;
  return infer_inplace(op, in, nin, a, out);
}

static int infer_fill_(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                       flow_meta *out) {
  (void)op; (void)nin; (void)a;
  *out = in[0];
  return 0;
}

static FLOW_KERNEL(cpu_add_) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_binary(FLOW_BIN_ADD, out[0], in[0], in[1]);
}

static FLOW_KERNEL(cpu_mul_) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_binary(FLOW_BIN_MUL, out[0], in[0], in[1]);
}

static FLOW_KERNEL(cpu_copy_) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_copy(out[0], in[1]);
}

/* attrs.scalar is the value */
static FLOW_KERNEL(cpu_fill_) {
  (void)in; (void)nin; (void)nout;
  return flow_cpu_fill(out[0], a->scalar);
}

FLOW_OP(add_) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
               .kind = FLOW_OP_INPLACE, .infer = infer_arith_};
FLOW_KERNEL_REGISTER(FLOW_CPU, add_, cpu_add_)
FLOW_OP(mul_) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_P_FIRST),
               .kind = FLOW_OP_INPLACE, .infer = infer_arith_};
FLOW_KERNEL_REGISTER(FLOW_CPU, mul_, cpu_mul_)
FLOW_OP(copy_) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
                .kind = FLOW_OP_INPLACE, .infer = infer_inplace};
FLOW_KERNEL_REGISTER(FLOW_CPU, copy_, cpu_copy_)
FLOW_OP(fill_) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, 0),
                .kind = FLOW_OP_INPLACE, .infer = infer_fill_};
FLOW_KERNEL_REGISTER(FLOW_CPU, fill_, cpu_fill_)
/* zero_ is fill_ with 0, an op of its own because, unlike fill_, it is linear (a partial sum stays
 * one: what the SBP rules need to know) */
FLOW_OP(zero_) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
                .kind = FLOW_OP_INPLACE, .infer = infer_fill_};
FLOW_KERNEL_REGISTER(FLOW_CPU, zero_, cpu_fill_)

static int call_inplace(const flow_op *op, flow_tensor **in, int nin, const flow_attrs *a) {
  flow_tensor *out;
  if (flow_op_call(op, in, nin, a, &out) != 0) return -1;
  flow_tensor_decref(out);
  return 0;
}
int flow_add_inplace(flow_tensor *a, flow_tensor *b) {
  return call_inplace(&flow_op_add_, (flow_tensor *[]){a, b}, 2, flow_attrs_default());
}
int flow_mul_inplace(flow_tensor *a, flow_tensor *b) {
  return call_inplace(&flow_op_mul_, (flow_tensor *[]){a, b}, 2, flow_attrs_default());
}
int flow_copy_inplace(flow_tensor *dst, flow_tensor *src) {
  return call_inplace(&flow_op_copy_, (flow_tensor *[]){dst, src}, 2, flow_attrs_default());
}
int flow_fill_inplace(flow_tensor *t, double v) {
  if (v == 0) return call_inplace(&flow_op_zero_, &t, 1, flow_attrs_default());
  flow_attrs at;
  flow_attrs_init(&at);
  at.scalar = v;
  return call_inplace(&flow_op_fill_, &t, 1, &at);
}

/* ---- copy / cast --------------------------------------------------------------------------- */

static int infer_copy(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)op; (void)nin; (void)a;
  *out = in[0];
  return 0;
}

static int infer_cast(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)op; (void)nin;
  *out = in[0];
  out->dtype = a->dtype;
  return 0;
}

static FLOW_KERNEL(cpu_copy) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_copy(out[0], in[0]);
}

static int grad_copy(const flow_grad_ctx *c, flow_tensor **gin) {
  if (c->gout[0] && c->need[0]) {
    gin[0] = c->gout[0];
    flow_tensor_incref(gin[0]);
  }
  return 0;
}

static int grad_cast(const flow_grad_ctx *c, flow_tensor **gin) {
  if (c->gout[0] && c->need[0] && !(gin[0] = flow_cast(c->gout[0], c->in_meta[0].dtype))) return -1;
  return 0;
}

FLOW_OP(contiguous) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
               .infer = infer_copy, .grad = grad_copy};
FLOW_KERNEL_REGISTER(FLOW_CPU, contiguous, cpu_copy)
FLOW_OP(cast) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
               .infer = infer_cast, .grad = grad_cast};
FLOW_KERNEL_REGISTER(FLOW_CPU, cast, cpu_copy)

flow_tensor *flow_contiguous_copy(flow_tensor *t) {
  flow_attrs at;
  flow_attrs_init(&at);
  return flow_op_call1(&flow_op_contiguous, &t, 1, &at);
}

flow_tensor *flow_contiguous(flow_tensor *t) {
  if (flow_tensor_is_contiguous(t)) { flow_tensor_incref(t); return t; }
  return flow_contiguous_copy(t);
}

flow_tensor *flow_cast(flow_tensor *t, flow_dtype dtype) {
  if (t->dtype == dtype) { flow_tensor_incref(t); return t; }
  flow_attrs at;
  flow_attrs_init(&at);
  at.dtype = dtype;
  return flow_op_call1(&flow_op_cast, &t, 1, &at);
}

/* ---- full (zeros, ones, full) -------------------------------------------------------------- */

/* attrs: shape/nshape, dtype, device, scalar */
static int infer_full(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)op; (void)in; (void)nin;
  out->dtype = a->dtype;
  out->device = a->device;
  out->ndim = a->nshape;
  for (int i = 0; i < a->nshape; i++) {
    if (a->shape[i] < 0) return flow_error_set("full: negative size %lld", (long long)a->shape[i]);
    out->shape[i] = a->shape[i];
  }
  return 0;
}

static FLOW_KERNEL(cpu_full) {
  (void)in; (void)nin; (void)nout;
  return flow_cpu_fill(out[0], a->scalar);
}

FLOW_OP(full) {.nin = 0, .nout = 1, .cpu_half = true, .kind = FLOW_OP_SOURCE, .infer = infer_full};
FLOW_KERNEL_REGISTER(FLOW_CPU, full, cpu_full)

flow_tensor *flow_full(int ndim, const int64_t *shape, double v, flow_dtype dtype, flow_device dev) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (ndim > FLOW_MAX_DIMS) { flow_error_set("full: at most %d dimensions", FLOW_MAX_DIMS); return NULL; }
  at.nshape = ndim;
  for (int i = 0; i < ndim; i++) at.shape[i] = shape[i];
  at.dtype = dtype;
  at.scalar = v;
  at.device = dev;
  return flow_op_call1(&flow_op_full, NULL, 0, &at);
}

/* For a global t: a local tensor of its logical shape (the same on every rank, so it acts as broadcast). */
flow_tensor *flow_full_like(flow_tensor *t, double v) {
  return flow_full(flow_tensor_lndim(t), flow_tensor_lshape(t), v, t->dtype, t->device);
}
flow_tensor *flow_zeros_like(flow_tensor *t) { return flow_full_like(t, 0); }
flow_tensor *flow_ones_like(flow_tensor *t) { return flow_full_like(t, 1); }

flow_tensor *flow_scalar_tensor(double v, flow_dtype dtype, flow_device dev) {
  return flow_full(0, NULL, v, dtype, dev);
}
