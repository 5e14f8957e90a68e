/* Placements (placement.h). */
#include "placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/nccl.h"

static flow_placement *interned;

void flow_placement_coord(const flow_placement *p, int index, int *coord) {
  for (int d = p->ndim - 1; d >= 0; d--) {
    coord[d] = index % p->shape[d];
    index /= p->shape[d];
  }
}

const flow_placement *flow_placement_get(flow_devtype devtype, int ndim, const int *shape, const int *ranks) {
  if (ndim < 1 || ndim > FLOW_MAX_MESH) {
    flow_error_set("placement: a mesh has 1 to %d axes (got %d)", FLOW_MAX_MESH, ndim);
    return NULL;
  }
  int n = 1, world = flow_comm_size();
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1) { flow_error_set("placement: mesh axis %d is empty", d); return NULL; }
    n *= shape[d];
  }
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= world) {
      flow_error_set("placement: rank %d is out of range (world size %d)", ranks[i], world);
      return NULL;
    }
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i]) { flow_error_set("placement: rank %d appears twice", ranks[i]); return NULL; }
  }
  for (flow_placement *p = interned; p; p = p->next)
    if (p->devtype == devtype && p->ndim == ndim && memcmp(p->shape, shape, (size_t)ndim * sizeof(int)) == 0 &&
        memcmp(p->ranks, ranks, (size_t)n * sizeof(int)) == 0)
      return p;
  flow_placement *p = calloc(1, sizeof *p);
  if (p) p->ranks = malloc((size_t)n * sizeof(int));
  if (!p || !p->ranks) { free(p); flow_error_set("placement: out of memory"); return NULL; }
  p->devtype = devtype;
  p->ndim = ndim;
  memcpy(p->shape, shape, (size_t)ndim * sizeof(int));
  memcpy(p->ranks, ranks, (size_t)n * sizeof(int));
  p->nranks = n;
  p->me = -1;
  for (int i = 0; i < n; i++)
    if (ranks[i] == flow_comm_rank()) p->me = i;
  if (p->me >= 0) flow_placement_coord(p, p->me, p->coord);
  p->next = interned;
  interned = p;
  return p;
}

/* The world ranks of the group along mesh axis `axis` through this rank; n of them. */
static int axis_members(const flow_placement *p, int axis, int *members, int cap) {
  if (p->me < 0)
    return flow_error_set("[rank %d] placement: this rank is not in the placement", flow_comm_rank());
  if (p->shape[axis] > cap) return flow_error_set("placement: mesh axis too large");
  int coord[FLOW_MAX_MESH];
  memcpy(coord, p->coord, sizeof coord);
  for (int k = 0; k < p->shape[axis]; k++) {
    coord[axis] = k;
    int idx = 0;
    for (int d = 0; d < p->ndim; d++) idx = idx * p->shape[d] + coord[d];
    members[k] = p->ranks[idx];
  }
  return 0;
}

flow_comm *flow_placement_axis_comm(const flow_placement *p, int axis) {
  flow_placement *mp = (flow_placement *)p; /* the cache is not part of the value */
  int members[1024];
  if (flow_comm_channel() != 0) /* another thread's channel: comm.c caches those */
    return axis_members(p, axis, members, 1024) == 0 ? flow_comm_for_ranks(members, p->shape[axis]) : NULL;
  if (!mp->axis_comm[axis] && axis_members(p, axis, members, 1024) == 0)
    mp->axis_comm[axis] = flow_comm_for_ranks(members, p->shape[axis]);
  return mp->axis_comm[axis];
}

flow_comm *flow_placement_axis_data_comm(const flow_placement *p, int axis, flow_devtype dev) {
  if (dev == FLOW_CPU) return flow_placement_axis_comm(p, axis);
  flow_placement *mp = (flow_placement *)p;
  int members[1024];
  if (flow_comm_channel() != 0) /* another thread's channel: nccl.c caches those */
    return axis_members(p, axis, members, 1024) == 0 ? flow_nccl_for_ranks(members, p->shape[axis]) : NULL;
  if (!mp->axis_nccl[axis] && axis_members(p, axis, members, 1024) == 0)
    mp->axis_nccl[axis] = flow_nccl_for_ranks(members, p->shape[axis]);
  return mp->axis_nccl[axis];
}

/* Append s to buf (size n) at *len; stops quietly when full. */
static void put(char *buf, size_t n, size_t *len, const char *s) {
  size_t k = strlen(s);
  if (*len + k >= n) return;
  memcpy(buf + *len, s, k + 1);
  *len += k;
}

char *flow_placement_str(const flow_placement *p, char *buf, size_t n) {
  static const char *names[] = {"cpu", "cuda"};
  size_t len = 0;
  if (n == 0) return buf;
  buf[0] = 0;
  put(buf, n, &len, names[p->devtype]);
  for (int i = 0; i < p->nranks; i++) {
    /* a brace opens for every mesh axis whose block starts at i, and closes where one ends */
    int opens = 0, closes = 0, stride = 1;
    for (int d = p->ndim - 1; d >= 0; d--) {
      stride *= p->shape[d];
      opens += i % stride == 0;
      closes += (i + 1) % stride == 0;
    }
    char r[16];
    snprintf(r, sizeof r, "%d", p->ranks[i]);
    if (i) put(buf, n, &len, ", ");
    for (int k = 0; k < opens; k++) put(buf, n, &len, "{");
    put(buf, n, &len, r);
    for (int k = 0; k < closes; k++) put(buf, n, &len, "}");
  }
  return buf;
}

int *flow_placement_union(const flow_placement *a, const flow_placement *b, int *n) {
  int world = flow_comm_size(), k = 0;
  char *in = calloc((size_t)world, 1);
  int *r = malloc(((size_t)a->nranks + (size_t)b->nranks) * sizeof *r);
  if (!in || !r) { free(in); free(r); flow_error_set("placement: out of memory"); return NULL; }
  for (int i = 0; i < a->nranks; i++) in[a->ranks[i]] = 1;
  for (int i = 0; i < b->nranks; i++) in[b->ranks[i]] = 1;
  for (int q = 0; q < world; q++)
    if (in[q]) r[k++] = q;
  free(in);
  *n = k;
  return r;
}

void flow_placement_free_all(void) {
  while (interned) {
    flow_placement *p = interned;
    interned = p->next;
    free(p->ranks);
    free(p);
  }
}
