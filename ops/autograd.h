/* Reverse-mode autograd over the op registry. Nodes are recorded by flow_op_call; backward walks
 * them in dependency order and runs each op's gradient rule (which itself calls ops, so it works
 * unchanged on global tensors). Lives in ops/ rather than core/ because it runs op rules and
 * accumulates with the add op: core must not depend on ops. */
#ifndef FLOW_AUTOGRAD_H
#define FLOW_AUTOGRAD_H

#include "op.h"

bool flow_grad_enabled(void);
bool flow_grad_set_enabled(bool on);      /* returns the previous mode */

/* Record a node for op(in) -> out when grad mode is on and an input requires grad. */
int flow_autograd_record(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                         flow_tensor *const *out, int nout);

/* t:backward(grad): grad may be NULL for a one-element t (the seed is then ones, times the seed
 * scale). */
int flow_backward(flow_tensor *t, flow_tensor *grad, bool retain_graph);
/* The implicit seed's scale (1 by default): gradient accumulation over M micro-batches traces
 * each backward with 1/M, so the summed gradients are those of the whole batch. Returns the
 * previous scale. Per thread. */
double flow_autograd_set_seed_scale(double s);
/* While deferring, backward calls are queued instead of run; run_deferred runs them in call order
 * (a pipeline traces every micro-batch's forward before the backwards: GPipe's order). Per thread;
 * defer returns the previous setting. */
bool flow_autograd_defer(bool on);
int flow_autograd_run_deferred(void);

/* The global layer may convert a gradient before it lands in leaf->grad (e.g. box P -> B so a
 * broadcast parameter gets an all-reduced gradient). Returns a new reference or NULL on error. */
typedef flow_tensor *(*flow_leaf_grad_hook)(flow_tensor *leaf, flow_tensor *grad);
void flow_autograd_set_leaf_hook(flow_leaf_grad_hook hook);

/* The name of the op whose node produced t (its grad_fn), NULL for a leaf: for printing. */
const char *flow_autograd_op_name(const flow_tensor *t);

/* Called by flow_tensor_decref: drops grad_fn and grad. */
void flow_autograd_release(flow_tensor *t);

#endif
