/* SBP values: equality and printing. */
#include "sbp.h"

#include <stdio.h>
#include <string.h>

bool flow_nd_sbp_eq(const flow_nd_sbp *a, const flow_nd_sbp *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (!flow_sbp_eq(a->v[i], b->v[i])) return false;
  return true;
}

char *flow_sbp_str(flow_sbp s, char *buf, size_t n) {
  if (s.kind == FLOW_SBP_S) snprintf(buf, n, "S(%d)", s.axis);
  else snprintf(buf, n, "%s", s.kind == FLOW_SBP_B ? "B" : "P");
  return buf;
}

char *flow_nd_sbp_str(const flow_nd_sbp *s, char *buf, size_t n) {
  if (s->n == 1) return flow_sbp_str(s->v[0], buf, n);
  size_t len = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < s->n && len < n; i++) {
    char one[16];
    len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", flow_sbp_str(s->v[i], one, sizeof one));
  }
  if (len < n) snprintf(buf + len, n - len, ")");
  return buf;
}
