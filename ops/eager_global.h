/* Eager global execution (DESIGN.md section 5): the dispatcher ops hand global calls to, the
 * boxing ops (to_global / to_local, differentiable), the autograd leaf hook, the cross-rank
 * agreement check and the explain trace. */
#ifndef FLOW_OPS_GLOBAL_H
#define FLOW_OPS_GLOBAL_H

#include "../sbp/boxing.h"
#include "op.h"

/* The boxing op (to_global): a traced local -> global conversion communicates, so the plan puts it
 * on the collective stream. */
extern flow_op flow_op_to_global;

/* Register the dispatcher and the leaf hook with ops/ (idempotent). */
void flow_global_install(void);

/* t (global or local) as a global tensor on (p, sbp), through the to_global op (autograd flows
 * back through it). A local t is this rank's shard: its logical shape is assembled from every
 * rank's shard, and broadcast axes take rank 0's copy. New reference or NULL + error. */
flow_tensor *flow_to_global(flow_tensor *t, const flow_placement *p, const flow_nd_sbp *sbp);
/* This rank's shard as a local tensor (a view; the gradient comes back as the shard of the
 * global gradient). A local t comes back unchanged (new reference). */
flow_tensor *flow_to_local(flow_tensor *t);

/* While on, a broadcast leaf keeps a partial-sum gradient partial instead of all-reducing it (ZeRO
 * stage 2 reduce-scatters it in the optimizer). Per thread; returns the previous setting. */
bool flow_global_set_partial_leaf_grads(bool on);

/* The default agreement check is batched: every global op folds a hash of itself into its
 * placement's running hash, and the ranks compare it before data moves on that placement (this
 * call) or a value is read. FLOW_CHECK=0 turns it off; set_check below makes it strict. */
int flow_global_settle(const flow_placement *p);
/* Drops every placement's pending ops (not yet checked): after a failure every rank knows of (the
 * REPL's failed line), so the ops some ranks ran before it do not fail the next check. */
void flow_global_forget_all(void);

/* The strict cross-rank agreement check, before each global op (off by default). */
void flow_global_set_check(bool on);
bool flow_global_check_enabled(void);

/* Explain: while a trace is open, every global op appends what it chose and what it moved. */
void flow_global_trace_begin(void);
/* The text collected (malloc'ed; the caller frees), closing the trace. */
char *flow_global_trace_end(void);
/* Describe boxing t to (p, sbp) without running it; malloc'ed text or NULL + error. */
char *flow_global_explain_boxing(const flow_tensor *t, const flow_placement *p, const flow_nd_sbp *sbp);

#endif
