/* The boxing cost model: bytes moved by one 1-D SBP conversion over p ranks (DESIGN.md 4). */
#ifndef FLOW_COST_H
#define FLOW_COST_H

#include "sbp.h"

/* Bytes moved to convert a tensor of `bytes` logical bytes from -> to over p ranks; the name of
 * the collective that does it in *collective (may be NULL). */
double flow_cost_1d(flow_sbp from, flow_sbp to, int p, double bytes, const char **collective);
/* The same plus a penalty for conversions into partial_sum (they move nothing now but leave a sum
 * to do later): priced as one copy of the tensor. What signature inference compares. */
double flow_cost_infer(flow_sbp from, flow_sbp to, int p, double bytes);

#endif
