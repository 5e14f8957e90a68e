/* Fused neural-network ops: C entry points. Each returns a new reference (NULL + error on failure),
 * except adamw_, which updates its tensors in place and returns 0 or -1. */
#ifndef FLOW_OPS_NN_H
#define FLOW_OPS_NN_H

#include "op.h"

extern flow_op flow_op_softmax, flow_op_log_softmax, flow_op_layer_norm, flow_op_cross_entropy,
    flow_op_scaled_dot_product_attention, flow_op_adamw_;

typedef enum flow_reduction { FLOW_REDUCTION_MEAN, FLOW_REDUCTION_SUM, FLOW_REDUCTION_NONE } flow_reduction;

/* softmax / log_softmax along axis (negative counts from the end). */
flow_tensor *flow_softmax(flow_tensor *t, int64_t axis);
flow_tensor *flow_log_softmax(flow_tensor *t, int64_t axis);
/* Over the last axis; weight and bias ([C]) may be NULL. */
flow_tensor *flow_layer_norm(flow_tensor *x, flow_tensor *weight, flow_tensor *bias, double eps);
/* logits [..., C], target int64 [...] (0-based classes); mean is over non-ignored targets (of the
 * logical tensors for global ones: sum over split rows, then / the global count). */
flow_tensor *flow_cross_entropy(flow_tensor *logits, flow_tensor *target, int64_t ignore_index,
                                flow_reduction reduction);
/* q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv] -> [B,H,Tq,Dv]; scale NaN means 1/sqrt(D). */
flow_tensor *flow_scaled_dot_product_attention(flow_tensor *q, flow_tensor *k, flow_tensor *v, bool causal,
                                               double scale);
/* One AdamW step on param (and its moments m, v) in place; step is 1-based. */
int flow_adamw_(flow_tensor *param, flow_tensor *grad, flow_tensor *m, flow_tensor *v, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step);

#endif
