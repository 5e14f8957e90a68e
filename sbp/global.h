/* Global tensor metadata: placement, nd-SBP and logical shape, hung off flow_tensor.global.
 * The tensor's own view is this rank's shard; shards follow DESIGN.md section 4 (splits nest
 * in mesh-axis order; uneven sizes give the first n % p ranks one more). */
#ifndef FLOW_GLOBAL_H
#define FLOW_GLOBAL_H

#include "../core/tensor.h"
#include "placement.h"

typedef struct flow_global {
  int ndim;                       /* logical shape, first: laid out as flow_logical_shape */
  int64_t shape[FLOW_MAX_DIMS];
  int refcount;
  const flow_placement *placement;
  flow_nd_sbp sbp;
} flow_global;

/* NULL + error when the SBP does not fit the placement or the shape. */
flow_global *flow_global_new(const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape);
/* Attach g to t (takes the caller's reference to g; replaces any previous metadata). */
void flow_global_attach(flow_tensor *t, flow_global *g);
static inline const flow_global *flow_global_of(const flow_tensor *t) { return (const flow_global *)t->global; }

/* Is the SBP valid for this placement and shape? 0 or -1 + error naming `op`. */
int flow_global_check(const char *op, const flow_placement *p, const flow_nd_sbp *sbp, int ndim);

/* [start, start+len) of part idx of n split into parts (the first n % parts get one more). */
void flow_split_range(int64_t n, int parts, int idx, int64_t *start, int64_t *len);
/* The box of the logical tensor held at mesh coordinate coord: start/size per tensor axis.
 * Mesh axis `skip` (or -1) is treated as broadcast: the box a whole group along it shares. */
void flow_global_box(const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape,
                     const int *coord, int skip, int64_t *start, int64_t *size);

/* This rank's shard shape of a logical tensor on (p, sbp); ranks outside the placement hold an
 * empty shard (every axis 0; a 0-d tensor keeps its one element). */
void flow_global_local_shape(const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape,
                             int64_t *local);

#endif
