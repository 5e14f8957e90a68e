/* Shape and view ops: C entry points. Views share storage with their input. */
#ifndef FLOW_OPS_SHAPE_H
#define FLOW_OPS_SHAPE_H

#include "op.h"

extern flow_op flow_op_view, flow_op_expand;

/* A view when the strides allow, else a contiguous copy reshaped. One -1 in shape is inferred. */
flow_tensor *flow_reshape(flow_tensor *t, int ndim, const int64_t *shape);
/* Broadcast size-1 axes (stride 0); -1 keeps a size. */
flow_tensor *flow_expand(flow_tensor *t, int ndim, const int64_t *shape);

/* Strides for viewing t with a new shape without copying; false if impossible. */
bool flow_view_strides(const flow_tensor *t, int ndim, const int64_t *shape, int64_t *stride);

#endif
