/* Matmul: C entry points. */
#ifndef FLOW_OPS_MATMUL_H
#define FLOW_OPS_MATMUL_H

#include "op.h"

extern flow_op flow_op_matmul;

/* op(a) @ op(b), batched with broadcast batch axes; trans_* transposes the last two axes. A 1-D
 * operand is a vector, as in torch.matmul (vector . vector gives a 0-d tensor). */
flow_tensor *flow_matmul(flow_tensor *a, flow_tensor *b, bool trans_a, bool trans_b);

/* y = x W^T + b (x [N, in], W [out, in], b [out]): the bias written first, GEMM adding onto it. */
flow_tensor *flow_linear(flow_tensor *x, flow_tensor *w, flow_tensor *b);

#endif
