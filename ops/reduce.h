/* Reductions: C entry points. New references, NULL + error on failure. */
#ifndef FLOW_OPS_REDUCE_H
#define FLOW_OPS_REDUCE_H

#include "op.h"

extern flow_op flow_op_sum, flow_op_mean, flow_op_var, flow_op_max, flow_op_min, flow_op_argmax,
    flow_op_argmin, flow_op_argreduce_backward, flow_op_cumsum, flow_op_prod, flow_op_amax, flow_op_amin;

/* Sum over axes (naxes == 0: all axes). */
flow_tensor *flow_sum(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim);
/* Mean over axes (float dtypes). */
flow_tensor *flow_mean(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim);
/* Variance over axes: sum (x - mean)^2 / (count - 1) when unbiased, else / count. */
flow_tensor *flow_var(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim, bool unbiased);
/* Product over everything (has_axis false) or along axis; integer inputs give int64. */
flow_tensor *flow_prod(flow_tensor *t, bool has_axis, int64_t axis, bool keepdim);
/* Running sum along axis (from the end when reverse); integer inputs give int64. */
flow_tensor *flow_cumsum(flow_tensor *t, int64_t axis, bool reverse);
/* max (is_max) or min: over everything (has_axis false: 0-d value, flat index) or along axis.
 * *values and *indices (int64; may be NULL if not wanted) receive new references. 0 or -1. */
int flow_maxmin(flow_tensor *t, bool is_max, bool has_axis, int64_t axis, bool keepdim,
                flow_tensor **values, flow_tensor **indices);
/* amax (is_max) or amin over axes (naxes == 0: all axes): values only, the input's dtype, NaN
 * propagating. */
flow_tensor *flow_amaxmin(flow_tensor *t, bool is_max, int naxes, const int64_t *axes, bool keepdim);
/* The int64 index of the max (min) along axis, or the flat index over everything. */
flow_tensor *flow_argmaxmin(flow_tensor *t, bool is_max, bool has_axis, int64_t axis, bool keepdim);
/* Sum a broadcast result back to `shape` (the autograd rule of broadcasting). */
flow_tensor *flow_sum_to_shape(flow_tensor *g, int ndim, const int64_t *shape);
/* Parse attrs axes against ndim into a mask; -1 + error naming op on a bad axis. */
int flow_reduce_mask(const flow_op *op, const flow_attrs *a, int ndim, bool *mask);
/* Output meta of a reduction with the given mask. */
void flow_reduce_meta(const flow_meta *t, const bool *mask, bool keepdim, flow_meta *out);

#endif
