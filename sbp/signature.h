/* SBP signatures: for an op (by name) and the logical shapes of its inputs and outputs, the 1-D
 * signatures it can run under (DESIGN.md section 4). The n-D signature is chosen per mesh axis
 * (the Cartesian product of 1-D ones) by the dispatcher, cheapest boxing first. */
#ifndef FLOW_SIGNATURE_H
#define FLOW_SIGNATURE_H

#include "../core/tensor.h"
#include "sbp.h"

#define FLOW_SIG_MAX_IO 8
#define FLOW_SIG_MAX 48

typedef struct flow_sbp_sig {
  flow_sbp in[FLOW_SIG_MAX_IO];
  flow_sbp out[FLOW_SIG_MAX_IO];
} flow_sbp_sig;

typedef struct flow_sig_list {
  int n;
  flow_sbp_sig v[FLOW_SIG_MAX];
} flow_sig_list;

typedef struct flow_sig_query {
  const char *op;
  int nin, nout;
  int in_ndim[FLOW_SIG_MAX_IO];
  int64_t in_shape[FLOW_SIG_MAX_IO][FLOW_MAX_DIMS];
  int out_ndim[FLOW_SIG_MAX_IO];
  int64_t out_shape[FLOW_SIG_MAX_IO][FLOW_MAX_DIMS];
  const flow_attrs *attrs;
  int p;                       /* ranks on the mesh axis being decided */
} flow_sig_query;

/* Fill the candidates (the all-broadcast one always comes first). Returns false when no rule
 * knows the op: it then runs on broadcast inputs only. */
bool flow_sbp_candidates(const flow_sig_query *q, flow_sig_list *out);
/* The rule family that knows the op ("elementwise", "matmul", ...), or NULL. */
const char *flow_sbp_family(const char *op);

#endif
