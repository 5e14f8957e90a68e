/* CPU kernels of the index ops: gather, scatter_add and embedding. Indices are int64; every
 * index is bounds-checked and an out-of-range one is an error, never a stray read or write. */
#ifndef FLOW_CPU_INDEX_H
#define FLOW_CPU_INDEX_H

#include "../../core/tensor.h"

/* out[p] = t[p with p[axis] = idx[p]] over out's shape (== idx's; idx may be a stride-0 view). */
int flow_cpu_gather(flow_tensor *out, const flow_tensor *t, const flow_tensor *idx, int axis);
/* out[p with p[axis] = idx[p]] += src[p] over idx's shape; out already holds the base values.
 * float32, float64, int64, int32. */
int flow_cpu_scatter_add(flow_tensor *out, const flow_tensor *idx, const flow_tensor *src, int axis);
/* out[p, :] = weight[ids[p], :]; out is contiguous [ids.shape..., D]. */
int flow_cpu_embedding(flow_tensor *out, const flow_tensor *ids, const flow_tensor *weight);

#endif
