/* Elementwise ops: C entry points (used by gradient rules, the bindings and the nn code).
 * Each returns a new reference, or NULL with the error set. */
#ifndef FLOW_OPS_ELEMENTWISE_H
#define FLOW_OPS_ELEMENTWISE_H

#include "op.h"

extern flow_op flow_op_add, flow_op_sub, flow_op_mul, flow_op_div, flow_op_pow, flow_op_maximum,
    flow_op_minimum, flow_op_eq, flow_op_ne, flow_op_lt, flow_op_le, flow_op_gt, flow_op_ge,
    flow_op_where, flow_op_masked_fill, flow_op_neg, flow_op_abs, flow_op_exp, flow_op_log,
    flow_op_sqrt, flow_op_rsqrt, flow_op_tanh, flow_op_sigmoid, flow_op_relu, flow_op_gelu,
    flow_op_clamp, flow_op_add_, flow_op_mul_, flow_op_copy_, flow_op_fill_, flow_op_zero_,
    flow_op_contiguous, flow_op_cast, flow_op_full, flow_op_remainder, flow_op_fmod, flow_op_floor_divide,
    flow_op_trunc_divide;

/* Binary, with broadcasting; both operands of one dtype. Comparisons give bool. */
/* a OP b in the dtype torch promotes them to (int / int is true division to float32). */
flow_tensor *flow_binary(const flow_op *op, flow_tensor *a, flow_tensor *b);
/* torch.promote_types, and torch.result_type of n operands given their dtypes, ranks and which
 * are Lua numbers (number may be NULL: none); flow_binary_dtype adds div's true division. */
flow_dtype flow_promote_types(flow_dtype a, flow_dtype b);
flow_dtype flow_result_type(int n, const flow_dtype *dtype, const int *ndim, const bool *number);
flow_dtype flow_binary_dtype(const flow_op *op, const flow_dtype *dtype, const int *ndim, const bool *number);
flow_tensor *flow_add(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_sub(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_mul(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_div(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_pow(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_maximum(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_minimum(flow_tensor *a, flow_tensor *b);
/* a - floor(a/b) b (the divisor's sign), a - trunc(a/b) b (the dividend's sign), floor(a/b); an
 * integer division by zero is an error (torch's ZeroDivisionError). */
flow_tensor *flow_remainder(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_fmod(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_floor_divide(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_eq(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_ne(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_lt(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_le(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_gt(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_ge(flow_tensor *a, flow_tensor *b);
/* op(a, s) with s a 0-d tensor of a's dtype */
flow_tensor *flow_binary_scalar(const flow_op *op, flow_tensor *a, double s);
flow_tensor *flow_add_scalar(flow_tensor *a, double s);
flow_tensor *flow_mul_scalar(flow_tensor *a, double s);
flow_tensor *flow_pow_scalar(flow_tensor *a, double s);
flow_tensor *flow_eq_scalar(flow_tensor *a, double s);

/* cond ? a : b (cond bool; all three broadcast); t with value where mask (bool) is true. */
flow_tensor *flow_where(flow_tensor *cond, flow_tensor *a, flow_tensor *b);
flow_tensor *flow_masked_fill(flow_tensor *t, flow_tensor *mask, double value);

/* Unary. gelu is the tanh approximation (GPT-2's). */
flow_tensor *flow_neg(flow_tensor *t);
flow_tensor *flow_abs(flow_tensor *t);
flow_tensor *flow_exp(flow_tensor *t);
flow_tensor *flow_log(flow_tensor *t);
flow_tensor *flow_sqrt(flow_tensor *t);
flow_tensor *flow_rsqrt(flow_tensor *t);
flow_tensor *flow_tanh(flow_tensor *t);
flow_tensor *flow_sigmoid(flow_tensor *t);
flow_tensor *flow_relu(flow_tensor *t);
flow_tensor *flow_gelu(flow_tensor *t);      /* exact: x Phi(x) */
flow_tensor *flow_gelu_tanh(flow_tensor *t); /* the tanh approximation */
flow_tensor *flow_silu(flow_tensor *t);
flow_tensor *flow_sin(flow_tensor *t);
flow_tensor *flow_cos(flow_tensor *t);
flow_tensor *flow_erf(flow_tensor *t);
flow_tensor *flow_log1p(flow_tensor *t);
flow_tensor *flow_expm1(flow_tensor *t);
flow_tensor *flow_softplus(flow_tensor *t);
flow_tensor *flow_sign(flow_tensor *t);
flow_tensor *flow_floor(flow_tensor *t);
flow_tensor *flow_ceil(flow_tensor *t);
flow_tensor *flow_round(flow_tensor *t);
flow_tensor *flow_trunc(flow_tensor *t);
flow_tensor *flow_clamp(flow_tensor *t, bool has_min, double min, bool has_max, double max);

/* In place, no autograd (refused on a tensor that requires grad while grad mode is on); 0 or -1.
 * a op= b with b broadcast to a; dst[...] = src (broadcast, cast); every element = v. */
int flow_add_inplace(flow_tensor *a, flow_tensor *b);
int flow_mul_inplace(flow_tensor *a, flow_tensor *b);
int flow_copy_inplace(flow_tensor *dst, flow_tensor *src);
int flow_fill_inplace(flow_tensor *t, double v);

/* A contiguous copy (always a new storage). */
flow_tensor *flow_contiguous_copy(flow_tensor *t);
/* t itself (new reference) if contiguous, else a contiguous copy. */
flow_tensor *flow_contiguous(flow_tensor *t);
flow_tensor *flow_cast(flow_tensor *t, flow_dtype dtype);

/* Creation on a device: zeros/ones/full. */
flow_tensor *flow_full(int ndim, const int64_t *shape, double v, flow_dtype dtype, flow_device dev);
flow_tensor *flow_full_like(flow_tensor *t, double v);
flow_tensor *flow_zeros_like(flow_tensor *t);
flow_tensor *flow_ones_like(flow_tensor *t);
/* A 0-d tensor holding v (for mixing Lua numbers with tensors). */
flow_tensor *flow_scalar_tensor(double v, flow_dtype dtype, flow_device dev);

/* Drop n references (NULL entries skipped): the cleanup of a chain of temporaries. */
void flow_decref_all(flow_tensor *const *ts, int n);

#endif
