/* The boxing cost model (cost.h). */
#include "cost.h"

double flow_cost_1d(flow_sbp from, flow_sbp to, int p, double bytes, const char **collective) {
  const char *name;
  double cost;
  if (flow_sbp_eq(from, to) || p == 1) { name = "none"; cost = 0; }
  else if (from.kind == FLOW_SBP_S && to.kind == FLOW_SBP_S) { name = "all-to-all"; cost = (p - 1) * bytes / p; }
  else if (from.kind == FLOW_SBP_S && to.kind == FLOW_SBP_B) { name = "all-gather"; cost = (p - 1) * bytes; }
  else if (from.kind == FLOW_SBP_P && to.kind == FLOW_SBP_S) { name = "reduce-scatter"; cost = (p - 1) * bytes; }
  else if (from.kind == FLOW_SBP_P && to.kind == FLOW_SBP_B) { name = "all-reduce"; cost = 2 * (p - 1) * bytes; }
  else if (from.kind == FLOW_SBP_B && to.kind == FLOW_SBP_S) { name = "local slice"; cost = 0; }
  else if (from.kind == FLOW_SBP_B) { name = "local (rank 0 keeps the data, others zero)"; cost = 0; }
  else { name = "local (shard zero-padded)"; cost = 0; }
  if (collective) *collective = name;
  return cost;
}

double flow_cost_infer(flow_sbp from, flow_sbp to, int p, double bytes) {
  double c = flow_cost_1d(from, to, p, bytes, NULL);
  if (p > 1 && to.kind == FLOW_SBP_P && from.kind != FLOW_SBP_P) c += bytes;
  return c;
}
