/* The lazy interpreter's seam (DESIGN.md section 6): while a graph is being traced, ops do not run.
 * flow_op_call_local hands every op call to the tracer (actor/trace.c) after inference, and the
 * eager-global interpreter hands it every boxing; everything above those two points (inference,
 * SBP choice, per-shard attrs, autograd) is shared with eager mode. The tracer registers itself
 * here: ops/ never includes actor/. */
#ifndef FLOW_OPS_LAZY_H
#define FLOW_OPS_LAZY_H

#include "../sbp/boxing.h"
#include "op.h"

/* One boxing of a shard: the logical tensor (ndim, shape, dtype) goes from (src_p, src) to
 * (dst_p, dst). Same placement: a collective on that placement; different ones: send/recv. */
typedef struct flow_box_desc {
  const flow_placement *src_p, *dst_p;
  flow_nd_sbp src, dst;
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
  flow_dtype dtype;
} flow_box_desc;

typedef struct flow_lazy_interp {
  /* Record op(in) whose outputs inference described in meta[0..op->nout); set out[] to new lazy
   * tensors (for an in-place op out[0] is in[0], which becomes the written value). */
  int (*record_op)(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                   const flow_meta *meta, flow_tensor **out);
  /* Record the boxing of shard `t` (lazy or a captured real tensor): a new lazy shard, or NULL. */
  flow_tensor *(*record_box)(const flow_box_desc *d, flow_tensor *t);
} flow_lazy_interp;

/* Install the tracer (NULL: none). Tracing is per thread: flow_lazy_begin/end bracket it. */
void flow_lazy_install(const flow_lazy_interp *li);
void flow_lazy_set_tracing(bool on);
bool flow_lazy_tracing(void);

/* Hand a boxing to the tracer (only while tracing). */
flow_tensor *flow_lazy_box(const flow_box_desc *d, flow_tensor *t);
/* Run a boxing for real on a plain shard (what a traced boxing does when its plan runs); the
 * result is a new plain shard, or NULL + error. */
flow_tensor *flow_box_run(const flow_box_desc *d, flow_tensor *shard);

/* Run op's kernel on real tensors: out[] are preallocated (contiguous, per inference) for
 * compute and source ops, made by the kernel for views, in[0] for in-place ops. No inference,
 * no autograd: what a planned task does each time it acts. */
int flow_op_run_kernel(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a, flow_tensor **out);

#endif
