/* Boxing: plan and run SBP conversions on a placement (boxing.h).
 * A step converts one mesh axis inside the group of ranks that differ only on that axis; that
 * group holds one "sub-logical" box of the tensor (the box the other axes give it), and the step
 * is the 1-D conversion of that box. Splits nest in mesh-axis order, so a step is valid unless a
 * later (inner) mesh axis splits the same tensor axis the step splits or gathers. */
#include "boxing.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "cost.h"

/* ---- planning --------------------------------------------------------------------------------- */

static bool splits(flow_sbp s, int axis) { return s.kind == FLOW_SBP_S && s.axis == axis; }

/* Does an inner mesh axis (k > m) split a tensor axis that step m splits or gathers? */
static bool conflicts(const flow_placement *p, const flow_nd_sbp *cur, int m, flow_sbp from, flow_sbp to) {
  for (int k = m + 1; k < cur->n; k++) {
    if (p->shape[k] == 1 || cur->v[k].kind != FLOW_SBP_S) continue;
    if ((from.kind == FLOW_SBP_S && splits(cur->v[k], from.axis)) || (to.kind == FLOW_SBP_S && splits(cur->v[k], to.axis)))
      return true;
  }
  return false;
}

static double group_bytes(const flow_placement *p, const flow_nd_sbp *cur, int m, int ndim, const int64_t *shape,
                          flow_dtype dtype) {
  int64_t start[FLOW_MAX_DIMS], size[FLOW_MAX_DIMS];
  int zero[FLOW_MAX_MESH] = {0};
  flow_global_box(p, cur, ndim, shape, p->me >= 0 ? p->coord : zero, m, start, size);
  return (double)flow_shape_numel(ndim, size) * (double)flow_dtype_size(dtype);
}

static void add_step(flow_boxing_plan *plan, const flow_placement *p, flow_nd_sbp *cur, int m, flow_sbp to,
                     int ndim, const int64_t *shape, flow_dtype dtype) {
  flow_boxing_step *s = &plan->steps[plan->nsteps++];
  s->axis = m;
  s->from = cur->v[m];
  s->to = to;
  s->bytes = flow_cost_1d(s->from, to, p->shape[m], group_bytes(p, cur, m, ndim, shape, dtype), &s->collective);
  plan->cost += s->bytes;
  cur->v[m] = to;
}

/* Axis by axis in the given order; false if some step would be invalid. */
static bool plan_direct(const flow_placement *p, const flow_nd_sbp *src, const flow_nd_sbp *dst, bool reverse,
                        int ndim, const int64_t *shape, flow_dtype dtype, flow_boxing_plan *plan) {
  flow_nd_sbp cur = *src;
  plan->nsteps = 0;
  plan->cost = 0;
  for (int i = 0; i < src->n; i++) {
    int m = reverse ? src->n - 1 - i : i;
    if (p->shape[m] == 1 || flow_sbp_eq(cur.v[m], dst->v[m])) continue;
    if (conflicts(p, &cur, m, cur.v[m], dst->v[m])) return false;
    add_step(plan, p, &cur, m, dst->v[m], ndim, shape, dtype);
  }
  return true;
}

/* The whole mesh acts as one axis when every mesh axis holds the same value and, for a split,
 * the axis divides evenly by the rank count (nested even splits are the flat split then):
 * [2,2]:(S(0), S(0)) is [4]:S(0). *v receives that value. */
static bool flat(const flow_placement *p, const flow_nd_sbp *s, int ndim, const int64_t *shape, flow_sbp *v) {
  for (int m = 1; m < s->n; m++)
    if (!flow_sbp_eq(s->v[m], s->v[0])) return false;
  *v = s->v[0];
  return v->kind != FLOW_SBP_S || (v->axis < ndim && shape[v->axis] % p->nranks == 0);
}

int flow_boxing_plan_make(const flow_placement *p, const flow_nd_sbp *src, const flow_nd_sbp *dst,
                          int ndim, const int64_t *shape, flow_dtype dtype, flow_boxing_plan *plan) {
  memset(plan, 0, sizeof *plan);
  if (src->n != p->ndim || dst->n != p->ndim)
    return flow_error_set("to_global: %d SBP values for a placement with %d mesh axes", dst->n, p->ndim);
  flow_sbp fs, fd;
  if (p->ndim > 1 && flat(p, src, ndim, shape, &fs) && flat(p, dst, ndim, shape, &fd)) {
    if (flow_sbp_eq(fs, fd)) return 0;
    flow_boxing_step *s = &plan->steps[plan->nsteps++];
    double bytes = (double)flow_shape_numel(ndim, shape) * (double)flow_dtype_size(dtype);
    const char *name;
    double cost = flow_cost_1d(fs, fd, p->nranks, bytes, &name);
    *s = (flow_boxing_step){-1, fs, fd, name, cost};
    plan->cost = s->bytes;
    return 0;
  }
  if (plan_direct(p, src, dst, true, ndim, shape, dtype, plan)) return 0;
  if (plan_direct(p, src, dst, false, ndim, shape, dtype, plan)) return 0;
  /* gather every axis to broadcast, innermost first, then slice outermost first */
  flow_nd_sbp cur = *src;
  plan->nsteps = 0;
  plan->cost = 0;
  plan->via_broadcast = true;
  for (int m = src->n - 1; m >= 0; m--)
    if (p->shape[m] > 1 && cur.v[m].kind != FLOW_SBP_B)
      add_step(plan, p, &cur, m, flow_sbp_broadcast(), ndim, shape, dtype);
  for (int m = 0; m < src->n; m++)
    if (p->shape[m] > 1 && dst->v[m].kind != FLOW_SBP_B) add_step(plan, p, &cur, m, dst->v[m], ndim, shape, dtype);
  return 0;
}

/* ---- moving bytes ----------------------------------------------------------------------------- */

/* Copy the box `size` at sstart of a dense array of shape sshape to dstart of a dense array of
 * shape dshape. Trailing axes copied whole merge into one memcpy. */
static void copy_box(char *dst, const int64_t *dshape, const int64_t *dstart, const char *src,
                     const int64_t *sshape, const int64_t *sstart, const int64_t *size, int ndim, size_t es) {
  if (flow_shape_numel(ndim, size) == 0) return;
  int k = ndim - 1;
  size_t chunk = es;
  while (k > 0 && size[k] == dshape[k] && size[k] == sshape[k]) chunk *= (size_t)size[k--];
  if (ndim == 0) { memcpy(dst, src, es); return; }
  chunk *= (size_t)size[k];
  int64_t dstr[FLOW_MAX_DIMS], sstr[FLOW_MAX_DIMS], idx[FLOW_MAX_DIMS] = {0};
  flow_contiguous_strides(ndim, dshape, dstr);
  flow_contiguous_strides(ndim, sshape, sstr);
  for (;;) {
    int64_t doff = 0, soff = 0;
    for (int d = 0; d <= k; d++) {
      int64_t i = d < k ? idx[d] : 0;
      doff += (dstart[d] + i) * dstr[d];
      soff += (sstart[d] + i) * sstr[d];
    }
    memcpy(dst + doff * (int64_t)es, src + soff * (int64_t)es, chunk);
    int d = k - 1;
    while (d >= 0 && ++idx[d] == size[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

flow_tensor *flow_boxing_dense(flow_tensor *t) {
  if (flow_tensor_is_contiguous(t)) { flow_tensor_incref(t); return t; }
  flow_tensor *d = flow_tensor_new(t->dtype, t->device, t->ndim, t->shape);
  if (!d) return NULL;
  size_t es = flow_dtype_size(t->dtype);
  int64_t n = flow_tensor_numel(t), idx[FLOW_MAX_DIMS] = {0};
  const char *base = (const char *)t->storage->data;
  char *out = flow_tensor_data(d);
  for (int64_t e = 0; e < n; e++) {
    int64_t off = t->offset;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->stride[i];
    memcpy(out + e * (int64_t)es, base + off * (int64_t)es, es);
    for (int i = t->ndim - 1; i >= 0 && ++idx[i] == t->shape[i]; i--) idx[i] = 0;
  }
  return d;
}

static flow_tensor *zeros(flow_dtype dt, flow_device dev, int ndim, const int64_t *shape) {
  flow_tensor *t = flow_tensor_new(dt, dev, ndim, shape);
  if (t) memset(flow_tensor_data(t), 0, flow_tensor_nbytes(t));
  return t;
}

/* All axes before `axis` have size 1: blocks along `axis` are contiguous. */
static bool leading(int ndim, const int64_t *shape, int axis) {
  for (int d = 0; d < axis && d < ndim; d++)
    if (shape[d] != 1) return false;
  return true;
}

typedef struct group {
  flow_comm *comm;
  int p, r;              /* group size, this rank's index */
  int ndim;
  const int64_t *sub;    /* the box the group holds */
} group;

/* Shape of part q along axis a of the sub box, and where it starts. */
static int64_t part(const group *g, int a, int q, int64_t *shape) {
  int64_t s, l;
  flow_split_range(g->sub[a], g->p, q, &s, &l);
  memcpy(shape, g->sub, (size_t)g->ndim * sizeof(int64_t));
  shape[a] = l;
  return s;
}

static flow_tensor *gather(const group *g, flow_tensor *x, int a) {
  int64_t yshape[FLOW_MAX_DIMS], bshape[FLOW_MAX_DIMS], zero[FLOW_MAX_DIMS] = {0}, start[FLOW_MAX_DIMS] = {0};
  size_t es = flow_dtype_size(x->dtype), *counts = malloc(2 * (size_t)g->p * sizeof(size_t));
  flow_tensor *y = flow_tensor_new(x->dtype, x->device, g->ndim, g->sub);
  char *tmp = NULL;
  if (!counts || !y) goto fail;
  memcpy(yshape, g->sub, sizeof yshape);
  size_t off = 0;
  for (int q = 0; q < g->p; q++) {
    part(g, a, q, bshape);
    counts[q] = (size_t)flow_shape_numel(g->ndim, bshape);
    counts[g->p + q] = off;
    off += counts[q];
  }
  bool direct = leading(g->ndim, g->sub, a);
  if (!direct && !(tmp = malloc(off * es + 1))) { flow_error_set("to_global: out of memory"); goto fail; }
  if (g->comm->ops->allgatherv(g->comm, flow_tensor_data(x), (size_t)flow_tensor_numel(x),
                               direct ? flow_tensor_data(y) : tmp, counts, counts + g->p, x->dtype) != 0)
    goto fail;
  for (int q = 0; !direct && q < g->p; q++) {
    start[a] = part(g, a, q, bshape);
    copy_box(flow_tensor_data(y), yshape, start, tmp + counts[g->p + q] * es, bshape, zero, bshape, g->ndim, es);
  }
  free(tmp);
  free(counts);
  return y;
fail:
  free(tmp);
  free(counts);
  flow_tensor_decref(y);
  return NULL;
}

static flow_tensor *reduce_scatter(const group *g, flow_tensor *x, int a) {
  int64_t yshape[FLOW_MAX_DIMS], start[FLOW_MAX_DIMS] = {0}, zero[FLOW_MAX_DIMS] = {0};
  size_t es = flow_dtype_size(x->dtype), *counts = malloc((size_t)g->p * sizeof(size_t));
  part(g, a, g->r, yshape);
  flow_tensor *y = flow_tensor_new(x->dtype, x->device, g->ndim, yshape);
  char *tmp = NULL;
  if (!counts || !y) goto fail;
  bool direct = leading(g->ndim, g->sub, a);
  if (!direct && !(tmp = malloc(flow_tensor_nbytes(x) + 1))) { flow_error_set("to_global: out of memory"); goto fail; }
  size_t off = 0;
  for (int q = 0; q < g->p; q++) {
    int64_t bshape[FLOW_MAX_DIMS];
    start[a] = part(g, a, q, bshape);
    counts[q] = (size_t)flow_shape_numel(g->ndim, bshape);
    if (!direct) copy_box(tmp + off * es, bshape, zero, flow_tensor_data(x), g->sub, start, bshape, g->ndim, es);
    off += counts[q];
  }
  if (g->comm->ops->reduce_scatterv(g->comm, direct ? flow_tensor_data(x) : tmp, flow_tensor_data(y), counts,
                                    x->dtype) != 0)
    goto fail;
  free(tmp);
  free(counts);
  return y;
fail:
  free(tmp);
  free(counts);
  flow_tensor_decref(y);
  return NULL;
}

/* The block of a dense array of shape `shape` narrowed to [start, start+len) on axis k. */
static flow_comm_block block_of(int ndim, const int64_t *shape, int k, int64_t start, int64_t len) {
  size_t outer = 1, inner = 1;
  for (int d = 0; d < k; d++) outer *= (size_t)shape[d];
  for (int d = k + 1; d < ndim; d++) inner *= (size_t)shape[d];
  return (flow_comm_block){(size_t)start * inner, outer, (size_t)len * inner, (size_t)shape[k] * inner};
}

/* S(a) -> S(b): rank r sends part q (along b) of its shard to rank q and receives part r (along b)
 * of q's shard, which lands at q's offset along a. Both are strided blocks: no packing pass. */
static flow_tensor *all_to_all(const group *g, flow_tensor *x, int a, int b) {
  int n = g->p, nd = g->ndim;
  int64_t xshape[FLOW_MAX_DIMS], yshape[FLOW_MAX_DIMS], tmp[FLOW_MAX_DIMS];
  flow_comm_block *blk = malloc(2 * (size_t)n * sizeof *blk);
  part(g, a, g->r, xshape);
  part(g, b, g->r, yshape);
  flow_tensor *y = flow_tensor_new(x->dtype, x->device, nd, yshape);
  if (!blk || !y) {
    free(blk);
    flow_tensor_decref(y);
    if (!blk) flow_error_set("to_global: out of memory");
    return NULL;
  }
  for (int q = 0; q < n; q++) {
    int64_t sb = part(g, b, q, tmp), lb = tmp[b];
    int64_t sa = part(g, a, q, tmp), la = tmp[a];
    blk[q] = block_of(nd, xshape, b, sb, lb);
    blk[n + q] = block_of(nd, yshape, a, sa, la);
  }
  int rc = g->comm->ops->alltoall_blocks(g->comm, flow_tensor_data(x), blk, flow_tensor_data(y), blk + n, x->dtype);
  free(blk);
  if (rc != 0) { flow_tensor_decref(y); return NULL; }
  return y;
}

/* One 1-D conversion of the group's box; x is this rank's dense shard under `from`. */
static flow_tensor *box1d(const group *g, flow_tensor *x, flow_sbp from, flow_sbp to) {
  int nd = g->ndim;
  size_t es = flow_dtype_size(x->dtype);
  int64_t shape[FLOW_MAX_DIMS], start[FLOW_MAX_DIMS] = {0}, zero[FLOW_MAX_DIMS] = {0};
  if (flow_sbp_eq(from, to) || g->p == 1) { flow_tensor_incref(x); return x; }
  if (from.kind == FLOW_SBP_S && to.kind == FLOW_SBP_S) return all_to_all(g, x, from.axis, to.axis);
  if (from.kind == FLOW_SBP_S && to.kind == FLOW_SBP_B) return gather(g, x, from.axis);
  if (from.kind == FLOW_SBP_P && to.kind == FLOW_SBP_S) return reduce_scatter(g, x, to.axis);
  if (from.kind == FLOW_SBP_P) { /* -> B */
    flow_tensor *y = flow_tensor_new(x->dtype, x->device, nd, g->sub);
    if (y && g->comm->ops->allreduce(g->comm, flow_tensor_data(x), flow_tensor_data(y), (size_t)flow_tensor_numel(x),
                                     x->dtype) != 0) { flow_tensor_decref(y); return NULL; }
    return y;
  }
  if (to.kind == FLOW_SBP_S) { /* B -> S: keep my part */
    start[to.axis] = part(g, to.axis, g->r, shape);
    flow_tensor *y = flow_tensor_new(x->dtype, x->device, nd, shape);
    if (y) copy_box(flow_tensor_data(y), shape, zero, flow_tensor_data(x), g->sub, start, shape, nd, es);
    return y;
  }
  /* -> P: one copy of the data survives, the rest is zeros */
  flow_tensor *y = zeros(x->dtype, x->device, nd, g->sub);
  if (!y) return NULL;
  if (from.kind == FLOW_SBP_B) {
    if (g->r == 0) memcpy(flow_tensor_data(y), flow_tensor_data(x), flow_tensor_nbytes(x));
  } else {
    start[from.axis] = part(g, from.axis, g->r, shape);
    copy_box(flow_tensor_data(y), g->sub, start, flow_tensor_data(x), shape, zero, shape, nd, es);
  }
  return y;
}

flow_tensor *flow_boxing_run(const flow_boxing_plan *plan, const flow_placement *p, const flow_nd_sbp *src,
                             int ndim, const int64_t *shape, flow_tensor *local) {
  if (local->device.type != FLOW_CPU && plan->nsteps > 0) { /* the caller stages device shards on the host */
    flow_error_set("to_global: boxing runs on host memory (got a device shard)");
    return NULL;
  }
  int64_t start[FLOW_MAX_DIMS], sub[FLOW_MAX_DIMS];
  flow_global_box(p, src, ndim, shape, p->coord, -1, start, sub);
  if (!flow_shape_eq(local->ndim, local->shape, ndim, sub)) {
    char a[96], b[96];
    flow_error_set("[rank %d] to_global: this rank's shard has shape %s but the SBP gives %s", flow_comm_rank(),
                   flow_shape_str(local->ndim, local->shape, a, sizeof a), flow_shape_str(ndim, sub, b, sizeof b));
    return NULL;
  }
  flow_tensor *x = flow_boxing_dense(local);
  flow_nd_sbp cur = *src;
  for (int i = 0; x && i < plan->nsteps; i++) {
    const flow_boxing_step *s = &plan->steps[i];
    if (s->axis < 0) { /* the whole mesh at once (see flat) */
      group g = {flow_comm_for_ranks(p->ranks, p->nranks), p->nranks, p->me, ndim, shape};
      flow_tensor *y = g.comm ? box1d(&g, x, s->from, s->to) : NULL;
      flow_tensor_decref(x);
      return y;
    }
    group g = {flow_placement_axis_comm(p, s->axis), p->shape[s->axis], p->coord[s->axis], ndim, sub};
    if (!g.comm) { flow_tensor_decref(x); return NULL; }
    flow_global_box(p, &cur, ndim, shape, p->coord, s->axis, start, sub);
    flow_tensor *y = box1d(&g, x, s->from, s->to);
    flow_tensor_decref(x);
    x = y;
    cur.v[s->axis] = s->to;
  }
  return x;
}

static flow_tensor *run_on(const flow_placement *p, const flow_nd_sbp *from, const flow_nd_sbp *to, int ndim,
                          const int64_t *shape, flow_tensor *x) {
  flow_boxing_plan plan;
  if (flow_boxing_plan_make(p, from, to, ndim, shape, x->dtype, &plan) != 0) return NULL;
  return flow_boxing_run(&plan, p, from, ndim, shape, x);
}

/* The sender of destination rank j's pieces among the replicas of a source box: the source
 * broadcast axes pick coordinate j mod their size (spreads the load over the copies). */
static bool is_sender(const flow_placement *ps, const flow_nd_sbp *src, const int *coord, int j) {
  for (int m = 0; m < ps->ndim; m++)
    if (src->v[m].kind == FLOW_SBP_B && coord[m] != j % ps->shape[m]) return false;
  return true;
}

/* The intersection of two boxes; false when empty. */
static bool overlap(int ndim, const int64_t *as, const int64_t *an, const int64_t *bs, const int64_t *bn,
                    int64_t *start, int64_t *size) {
  for (int d = 0; d < ndim; d++) {
    int64_t lo = as[d] > bs[d] ? as[d] : bs[d], hi = as[d] + an[d] < bs[d] + bn[d] ? as[d] + an[d] : bs[d] + bn[d];
    if (hi <= lo) return false;
    start[d] = lo;
    size[d] = hi - lo;
  }
  return true;
}

typedef struct piece {
  int peer;                /* world rank */
  int64_t start[FLOW_MAX_DIMS], size[FLOW_MAX_DIMS];
  char *buf;
} piece;

flow_tensor *flow_boxing_between(const flow_placement *ps, const flow_nd_sbp *src, const flow_placement *pd,
                                 const flow_nd_sbp *dst, int ndim, const int64_t *shape, flow_tensor *local) {
  size_t es = flow_dtype_size(local->dtype);
  int me = flow_comm_rank();
  flow_nd_sbp s2 = *src;
  for (int m = 0; m < s2.n; m++) /* partial sums are summed on the source first (reduce-scatter) */
    if (s2.v[m].kind == FLOW_SBP_P) s2.v[m] = ndim > 0 ? flow_sbp_split(0) : flow_sbp_broadcast();
  flow_tensor *x = NULL;
  if (ps->me >= 0 && !(x = run_on(ps, src, &s2, ndim, shape, local))) return NULL;
  int64_t xs[FLOW_MAX_DIMS], xn[FLOW_MAX_DIMS];
  if (ps->me >= 0) flow_global_box(ps, &s2, ndim, shape, ps->coord, -1, xs, xn);

  /* this rank's output: its box under dst; along partial axes only coordinate 0 holds data */
  int64_t ys[FLOW_MAX_DIMS] = {0}, yn[FLOW_MAX_DIMS];
  flow_global_local_shape(pd, dst, ndim, shape, yn);
  if (pd->me >= 0) flow_global_box(pd, dst, ndim, shape, pd->coord, -1, ys, yn);
  flow_tensor *y = flow_tensor_new(local->dtype, local->device, ndim, yn);
  if (!y) { flow_tensor_decref(x); return NULL; }
  memset(flow_tensor_data(y), 0, flow_tensor_nbytes(y));

  int cap = ps->nranks + pd->nranks, nsend = 0, nrecv = 0, rc = 0;
  piece *sends = calloc((size_t)cap, sizeof *sends), *recvs = calloc((size_t)cap, sizeof *recvs);
  flow_comm_msg *msgs = calloc(2 * (size_t)cap, sizeof *msgs);
  if (!sends || !recvs || !msgs) { rc = flow_error_set("to_global: out of memory"); goto done; }
  int64_t zero[FLOW_MAX_DIMS] = {0};
  for (int j = 0; j < pd->nranks && rc == 0; j++) {
    int cj[FLOW_MAX_MESH];
    int64_t bs[FLOW_MAX_DIMS], bn[FLOW_MAX_DIMS];
    flow_placement_coord(pd, j, cj);
    bool holder = true;
    for (int m = 0; m < dst->n; m++) holder &= dst->v[m].kind != FLOW_SBP_P || cj[m] == 0;
    if (!holder) continue;
    flow_global_box(pd, dst, ndim, shape, cj, -1, bs, bn);
    for (int i = 0; i < ps->nranks; i++) {
      int ci[FLOW_MAX_MESH];
      int64_t as[FLOW_MAX_DIMS], an[FLOW_MAX_DIMS], os[FLOW_MAX_DIMS], on[FLOW_MAX_DIMS];
      flow_placement_coord(ps, i, ci);
      if (!is_sender(ps, &s2, ci, j)) continue;
      flow_global_box(ps, &s2, ndim, shape, ci, -1, as, an);
      if (!overlap(ndim, as, an, bs, bn, os, on)) continue;
      int from = ps->ranks[i], to = pd->ranks[j];
      int64_t xo[FLOW_MAX_DIMS], yo[FLOW_MAX_DIMS];
      for (int d = 0; d < ndim; d++) { xo[d] = os[d] - as[d]; yo[d] = os[d] - bs[d]; }
      if (from == me && to == me) {
        copy_box(flow_tensor_data(y), yn, yo, flow_tensor_data(x), xn, xo, on, ndim, es);
      } else if (from == me || to == me) {
        piece *pc = from == me ? &sends[nsend++] : &recvs[nrecv++];
        pc->peer = from == me ? to : from;
        memcpy(pc->start, from == me ? xo : yo, sizeof pc->start);
        memcpy(pc->size, on, sizeof pc->size);
        if (!(pc->buf = malloc((size_t)flow_shape_numel(ndim, on) * es + 1))) { rc = flow_error_set("to_global: out of memory"); break; }
        if (from == me) copy_box(pc->buf, on, zero, flow_tensor_data(x), xn, xo, on, ndim, es);
      }
    }
  }
  if (rc == 0) {
    for (int k = 0; k < nsend; k++) msgs[k] = (flow_comm_msg){sends[k].peer, sends[k].buf, (size_t)flow_shape_numel(ndim, sends[k].size)};
    for (int k = 0; k < nrecv; k++) msgs[cap + k] = (flow_comm_msg){recvs[k].peer, recvs[k].buf, (size_t)flow_shape_numel(ndim, recvs[k].size)};
    flow_comm *w = flow_comm_world();
    rc = w->ops->exchange(w, msgs, nsend, msgs + cap, nrecv, local->dtype, 12);
  }
  for (int k = 0; rc == 0 && k < nrecv; k++)
    copy_box(flow_tensor_data(y), yn, recvs[k].start, recvs[k].buf, recvs[k].size, zero, recvs[k].size, ndim, es);
done:
  for (int k = 0; sends && k < cap; k++) free(sends[k].buf);
  for (int k = 0; recvs && k < cap; k++) free(recvs[k].buf);
  free(sends);
  free(recvs);
  free(msgs);
  flow_tensor_decref(x);
  if (rc != 0) { flow_tensor_decref(y); return NULL; }
  return y;
}
