/* Boxing: converting a global tensor between nd-SBPs on a placement, one mesh axis at a time,
 * each step a collective inside that axis' sub-communicator (or a local slice). Planned and
 * costed here, run on raw shards; the op that makes boxing differentiable lives in dispatch.c. */
#ifndef FLOW_BOXING_H
#define FLOW_BOXING_H

#include "global.h"

typedef struct flow_boxing_step {
  int axis;                 /* mesh axis; -1: the whole mesh as one axis (nranks ranks) */
  flow_sbp from, to;
  const char *collective;   /* "all-gather", "local slice", ... */
  double bytes;             /* modelled bytes moved (cost.h) */
} flow_boxing_step;

typedef struct flow_boxing_plan {
  int nsteps;
  flow_boxing_step steps[2 * FLOW_MAX_MESH];
  bool via_broadcast;       /* no axis-by-axis path: gather everything, then slice */
  double cost;
} flow_boxing_plan;

/* Plan src -> (p, dst) for a tensor of this logical shape and dtype. -1 + error when the
 * conversion is not supported (different placements). */
int flow_boxing_plan_make(const flow_placement *p, const flow_nd_sbp *src, const flow_nd_sbp *dst,
                          int ndim, const int64_t *shape, flow_dtype dtype, flow_boxing_plan *plan);
/* Run the plan on this rank's shard `local` (the shard of src); returns the shard of dst (a new
 * reference, a plain local tensor) or NULL + error. */
flow_tensor *flow_boxing_run(const flow_boxing_plan *plan, const flow_placement *p, const flow_nd_sbp *src,
                             int ndim, const int64_t *shape, flow_tensor *local);

/* Between placements: partial sums are summed on the source first, then every destination rank
 * receives exactly its slice, piece by piece, from the source ranks holding it (replicas take
 * turns), by point-to-point messages. Every rank of either placement calls this; the result is
 * this rank's shard under (pd, dst), empty outside pd. */
flow_tensor *flow_boxing_between(const flow_placement *ps, const flow_nd_sbp *src, const flow_placement *pd,
                                 const flow_nd_sbp *dst, int ndim, const int64_t *shape, flow_tensor *local);

/* Make the all-to-all of strided blocks pack them into dense buffers on every backend, as it does on
 * NCCL (a test switch: the specs check the packing on machines without a GPU). */
extern bool flow_boxing_pack_blocks;

#endif
