/* SBP values: split(axis), broadcast, partial_sum; one per mesh axis (nd-SBP). */
#ifndef FLOW_SBP_H
#define FLOW_SBP_H

#include <stdbool.h>
#include <stddef.h>

#define FLOW_MAX_MESH 4

typedef enum flow_sbp_kind { FLOW_SBP_B, FLOW_SBP_S, FLOW_SBP_P } flow_sbp_kind;

typedef struct flow_sbp {
  flow_sbp_kind kind;
  int axis;            /* split axis for FLOW_SBP_S, else 0 */
} flow_sbp;

typedef struct flow_nd_sbp {
  int n;               /* one value per mesh axis */
  flow_sbp v[FLOW_MAX_MESH];
} flow_nd_sbp;

static inline flow_sbp flow_sbp_split(int axis) { return (flow_sbp){FLOW_SBP_S, axis}; }
static inline flow_sbp flow_sbp_broadcast(void) { return (flow_sbp){FLOW_SBP_B, 0}; }
static inline flow_sbp flow_sbp_partial(void) { return (flow_sbp){FLOW_SBP_P, 0}; }
static inline bool flow_sbp_eq(flow_sbp a, flow_sbp b) {
  return a.kind == b.kind && (a.kind != FLOW_SBP_S || a.axis == b.axis);
}
bool flow_nd_sbp_eq(const flow_nd_sbp *a, const flow_nd_sbp *b);

/* "S(0)", "B", "P" */
char *flow_sbp_str(flow_sbp s, char *buf, size_t n);
/* "S(0)" for one axis, "(B, S(1))" for more */
char *flow_nd_sbp_str(const flow_nd_sbp *s, char *buf, size_t n);

#endif
