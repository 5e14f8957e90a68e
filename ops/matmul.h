/* Matmul: C entry points. */
#ifndef FLOW_OPS_MATMUL_H
#define FLOW_OPS_MATMUL_H

#include "op.h"

extern flow_op flow_op_matmul;

/* op(a) @ op(b), batched with broadcast batch axes; trans_* transposes the last two axes. */
flow_tensor *flow_matmul(flow_tensor *a, flow_tensor *b, bool trans_a, bool trans_b);

#endif
