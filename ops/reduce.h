/* Reductions: C entry points. New references, NULL + error on failure. */
#ifndef FLOW_OPS_REDUCE_H
#define FLOW_OPS_REDUCE_H

#include "op.h"

extern flow_op flow_op_sum;

/* Sum over axes (naxes == 0: all axes). */
flow_tensor *flow_sum(flow_tensor *t, int naxes, const int64_t *axes, bool keepdim);
/* Sum a broadcast result back to `shape` (the autograd rule of broadcasting). */
flow_tensor *flow_sum_to_shape(flow_tensor *g, int ndim, const int64_t *shape);
/* Parse attrs axes against ndim into a mask; -1 + error naming op on a bad axis. */
int flow_reduce_mask(const flow_op *op, const flow_attrs *a, int ndim, bool *mask);
/* Output meta of a reduction with the given mask. */
void flow_reduce_meta(const flow_tensor *t, const bool *mask, bool keepdim, flow_meta *out);

#endif
