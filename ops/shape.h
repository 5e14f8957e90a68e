/* Shape and view ops: C entry points. Views share storage with their input. */
#ifndef FLOW_OPS_SHAPE_H
#define FLOW_OPS_SHAPE_H

#include "op.h"

extern flow_op flow_op_view, flow_op_expand, flow_op_permute, flow_op_narrow, flow_op_narrow_backward,
    flow_op_cat, flow_op_tril, flow_op_triu, flow_op_flip;

/* A view when the strides allow, else a contiguous copy reshaped. One -1 in shape is inferred. */
flow_tensor *flow_reshape(flow_tensor *t, int ndim, const int64_t *shape);
/* Broadcast size-1 axes (stride 0); -1 keeps a size. */
flow_tensor *flow_expand(flow_tensor *t, int ndim, const int64_t *shape);

/* Views. Axes and indices are 0-based; negative ones count from the end. */
flow_tensor *flow_permute(flow_tensor *t, int n, const int64_t *dims);
flow_tensor *flow_transpose(flow_tensor *t, int64_t a, int64_t b);
flow_tensor *flow_narrow(flow_tensor *t, int64_t axis, int64_t start, int64_t length);
/* The slice at index along axis, without that axis. */
flow_tensor *flow_select(flow_tensor *t, int64_t axis, int64_t index);
/* Drop the listed size-1 axes (listed axes of another size stay); naxes == 0: every size-1 axis. */
flow_tensor *flow_squeeze(flow_tensor *t, int naxes, const int64_t *axes);
flow_tensor *flow_unsqueeze(flow_tensor *t, int64_t axis);
/* Merge axes start..end (inclusive) into one: a view when the strides allow, else a copy. */
flow_tensor *flow_flatten(flow_tensor *t, int64_t start, int64_t end);

/* Fresh tensors. */
/* A copy with the listed axes reversed. */
flow_tensor *flow_flip(flow_tensor *t, int naxes, const int64_t *axes);
flow_tensor *flow_cat(int n, flow_tensor *const *ts, int64_t axis);
flow_tensor *flow_stack(int n, flow_tensor *const *ts, int64_t axis);
/* tril (upper = false) or triu (upper = true) over the last two axes, diagonal offset k. */
flow_tensor *flow_tri(flow_tensor *t, int64_t k, bool upper);

/* Strides for viewing t with a new shape without copying; false if impossible. */
bool flow_view_strides(const flow_tensor *t, int ndim, const int64_t *shape, int64_t *stride);

#endif
