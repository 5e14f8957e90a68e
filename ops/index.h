/* Index ops: C entry points. Indices are int64 tensors, 0-based; an index out of range is an
 * error naming the op, the index and the valid range (on CUDA raised by the next call that
 * synchronises with the device, kernels/cuda/errors.cu). New references, NULL + error on failure. */
#ifndef FLOW_OPS_INDEX_H
#define FLOW_OPS_INDEX_H

#include "op.h"

extern flow_op flow_op_gather, flow_op_scatter_add, flow_op_index_select, flow_op_embedding;

/* weight[ids]: ids of any shape (int64, or int32 taken as int64), weight [V, D] -> [ids.shape..., D]. */
flow_tensor *flow_embedding(flow_tensor *ids, flow_tensor *weight);
/* t's entries at positions idx (1-D, int64 or int32) along axis. */
flow_tensor *flow_index_select(flow_tensor *t, int64_t axis, flow_tensor *idx);
/* out[p] = t[p with p[axis] = idx[p]] (torch.gather); idx has t's rank, out has idx's shape. */
flow_tensor *flow_gather(flow_tensor *t, int64_t axis, flow_tensor *idx);
/* A copy of t with src[p] added at p with p[axis] = idx[p]; idx and src have the same shape. */
flow_tensor *flow_scatter_add(flow_tensor *t, int64_t axis, flow_tensor *idx, flow_tensor *src);
/* What gradient rules scatter into: zeros shaped and typed like m with src added at idx along axis. */
flow_tensor *flow_scatter_into_zeros(const flow_meta *m, int64_t axis, flow_tensor *idx, flow_tensor *src);

#endif
