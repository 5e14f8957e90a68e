/* Elementwise ops: C entry points (used by gradient rules, the bindings and the nn code).
 * Each returns a new reference, or NULL with the error set. */
#ifndef FLOW_OPS_ELEMENTWISE_H
#define FLOW_OPS_ELEMENTWISE_H

#include "op.h"

extern flow_op flow_op_add, flow_op_sub, flow_op_mul, flow_op_div, flow_op_add_,
    flow_op_copy, flow_op_cast, flow_op_full, flow_op_copy_;

flow_tensor *flow_add(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_sub(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_mul(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_div(flow_tensor *a, flow_tensor *b);
flow_tensor *flow_binary(const flow_op *op, flow_tensor *a, flow_tensor *b);
/* a + b with b a scalar of a's dtype (and likewise) */
flow_tensor *flow_add_scalar(flow_tensor *a, double s);
flow_tensor *flow_mul_scalar(flow_tensor *a, double s);
/* a += b in place (b broadcast to a); 0 or -1 */
int flow_add_inplace(flow_tensor *a, flow_tensor *b);
/* dst[...] = src (broadcast, cast) in place; 0 or -1 */
int flow_copy_inplace(flow_tensor *dst, flow_tensor *src);

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

#endif
