/* CPU kernels of the shape ops that produce fresh tensors (cat, narrow's backward, triangles).
 * Pure views need no kernel: they only make new headers. */
#ifndef FLOW_CPU_SHAPE_H
#define FLOW_CPU_SHAPE_H

#include <stdbool.h>

#include "../../core/tensor.h"

/* out = the inputs laid end to end along axis (shapes already checked). */
int flow_cpu_cat(flow_tensor *out, flow_tensor *const *in, int nin, int axis);
/* out = zeros, with out[..., start:start+g.shape[axis], ...] = g: the gradient of narrow. */
int flow_cpu_narrow_scatter(flow_tensor *out, const flow_tensor *g, int axis, int64_t start);
/* out = x with the elements above (lower) or below (upper) diagonal k of the last two axes
 * zeroed: keeps j - i <= k for tril, j - i >= k for triu. out is contiguous. */
int flow_cpu_tri(flow_tensor *out, const flow_tensor *x, int64_t k, bool upper);
/* out[i] = x[i'] where i' = size - 1 - i on the axes where flip[d] (out contiguous, any dtype). */
int flow_cpu_flip(flow_tensor *out, const flow_tensor *x, const bool *flip);

#endif
