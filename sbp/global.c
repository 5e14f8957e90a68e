/* Global tensor metadata (global.h). */
#include "global.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

_Static_assert(offsetof(flow_global, shape) == offsetof(flow_logical_shape, shape),
               "flow_global must start like flow_logical_shape (core/tensor.h)");

static void retain(void *g) { ((flow_global *)g)->refcount++; }
static void release(void *g) {
  flow_global *x = g;
  if (x && --x->refcount == 0) free(x);
}

int flow_global_check(const char *op, const flow_placement *p, const flow_nd_sbp *sbp, int ndim) {
  if (sbp->n != p->ndim)
    return flow_error_set("%s: the placement has %d mesh axes but %d SBP value%s given", op, p->ndim, sbp->n,
                          sbp->n == 1 ? " is" : "s are");
  for (int i = 0; i < sbp->n; i++)
    if (sbp->v[i].kind == FLOW_SBP_S && (sbp->v[i].axis < 0 || sbp->v[i].axis >= ndim))
      return flow_error_set("%s: split axis %d is out of range for a %d-d tensor", op, sbp->v[i].axis, ndim);
  return 0;
}

flow_global *flow_global_new(const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape) {
  if (flow_global_check("global", p, sbp, ndim) != 0) return NULL;
  flow_global *g = calloc(1, sizeof *g);
  if (!g) { flow_error_set("global: out of memory"); return NULL; }
  g->refcount = 1;
  g->placement = p;
  g->sbp = *sbp;
  g->ndim = ndim;
  memcpy(g->shape, shape, (size_t)ndim * sizeof(int64_t));
  return g;
}

void flow_global_attach(flow_tensor *t, flow_global *g) {
  if (t->global && t->global_free) t->global_free(t->global);
  t->global = g;
  t->global_retain = retain;
  t->global_free = release;
}

void flow_split_range(int64_t n, int parts, int idx, int64_t *start, int64_t *len) {
  int64_t base = n / parts, extra = n % parts;
  *len = base + (idx < extra);
  *start = idx * base + (idx < extra ? idx : extra);
}

void flow_global_box(const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape,
                     const int *coord, int skip, int64_t *start, int64_t *size) {
  for (int d = 0; d < ndim; d++) { start[d] = 0; size[d] = shape[d]; }
  for (int m = 0; m < sbp->n; m++) {
    if (m == skip || sbp->v[m].kind != FLOW_SBP_S) continue;
    int a = sbp->v[m].axis;
    int64_t s, l;
    flow_split_range(size[a], p->shape[m], coord[m], &s, &l);
    start[a] += s;
    size[a] = l;
  }
}

void flow_global_local_shape(const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape,
                             int64_t *local) {
  int64_t start[FLOW_MAX_DIMS];
  if (p->me < 0) {
    for (int d = 0; d < ndim; d++) local[d] = 0;
    return;
  }
  flow_global_box(p, sbp, ndim, shape, p->coord, -1, start, local);
}
