/* Boxing: plan and run SBP conversions on a placement (boxing.h).
 * A step converts one mesh axis inside the group of ranks that differ only on that axis; that
 * group holds one "sub-logical" box of the tensor (the box the other axes give it), and the step
 * is the 1-D conversion of that box. Splits nest in mesh-axis order, so a step is valid unless a
 * later (inner) mesh axis splits the same tensor axis the step splits or gathers. */
#include "boxing.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/nccl.h"
#include "../kernels/registry.h"
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

/* ---- moving bytes ----------------------------------------------------------------------------
 * Everything below runs on the shard's own device: host memory with MPI, or CUDA memory with NCCL
 * (collectives on the collective stream, copies on the compute stream, ordered by events). The
 * byte moves go through the device's memory interface (copy, copy2d, zero), so one code serves
 * both. */

static const flow_device_impl *mem(flow_device d) { return flow_device_get(d.type); }

/* The communicator that moves this device's data among these world ranks. */
static flow_comm *data_comm(const int *ranks, int n, flow_device dev) {
  return dev.type == FLOW_CPU ? flow_comm_for_ranks(ranks, n) : flow_nccl_for_ranks(ranks, n);
}

/* A dense scratch tensor of n elements on dev. */
static flow_tensor *scratch(flow_dtype dt, flow_device dev, size_t n) {
  int64_t len = (int64_t)n;
  return flow_tensor_new(dt, dev, 1, &len);
}

/* Copy the box `size` at sstart of a dense array of shape sshape to dstart of a dense array of
 * shape dshape. Trailing axes copied whole merge into one run; the axis before them gives the rows
 * of one 2-D copy, and the loop walks the axes before that. */
static int copy_box(flow_device dev, char *dst, const int64_t *dshape, const int64_t *dstart, const char *src,
                    const int64_t *sshape, const int64_t *sstart, const int64_t *size, int ndim, size_t es) {
  const flow_device_impl *m = mem(dev);
  if (flow_shape_numel(ndim, size) == 0) return 0;
  if (ndim == 0) return m->copy2d(dst, es, src, es, es, 1, dev);
  int k = ndim - 1;
  size_t run = es;
  while (k > 0 && size[k] == dshape[k] && size[k] == sshape[k]) run *= (size_t)size[k--];
  run *= (size_t)size[k];
  int64_t dstr[FLOW_MAX_DIMS], sstr[FLOW_MAX_DIMS], idx[FLOW_MAX_DIMS] = {0};
  flow_contiguous_strides(ndim, dshape, dstr);
  flow_contiguous_strides(ndim, sshape, sstr);
  int r = k - 1; /* the rows axis, -1 when the run is the whole box */
  size_t rows = r >= 0 ? (size_t)size[r] : 1;
  size_t dpitch = r >= 0 ? (size_t)dstr[r] * es : run, spitch = r >= 0 ? (size_t)sstr[r] * es : run;
  for (;;) {
    int64_t doff = 0, soff = 0;
    for (int d = 0; d <= k; d++) {
      int64_t i = d < r ? idx[d] : 0;
      doff += (dstart[d] + i) * dstr[d];
      soff += (sstart[d] + i) * sstr[d];
    }
    if (m->copy2d(dst + doff * (int64_t)es, dpitch, src + soff * (int64_t)es, spitch, run, rows, dev) != 0) return -1;
    int d = r - 1;
    while (d >= 0 && ++idx[d] == size[d]) idx[d--] = 0;
    if (d < 0) return 0;
  }
}

static flow_tensor *zeros(flow_dtype dt, flow_device dev, int ndim, const int64_t *shape) {
  flow_tensor *t = flow_tensor_new(dt, dev, ndim, shape);
  if (t && mem(dev)->zero(flow_tensor_data(t), dev, flow_tensor_nbytes(t)) != 0) {
    flow_tensor_decref(t);
    return NULL;
  }
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
  flow_tensor *y = flow_tensor_new(x->dtype, x->device, g->ndim, g->sub), *tmp = NULL;
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
  if (!direct && !(tmp = scratch(x->dtype, x->device, off))) goto fail;
  char *recv = flow_tensor_data(direct ? y : tmp);
  if (g->comm->ops->allgatherv(g->comm, flow_tensor_data(x), (size_t)flow_tensor_numel(x), recv, counts,
                               counts + g->p, x->dtype) != 0)
    goto fail;
  for (int q = 0; !direct && q < g->p; q++) {
    start[a] = part(g, a, q, bshape);
    if (copy_box(x->device, flow_tensor_data(y), yshape, start, recv + counts[g->p + q] * es, bshape, zero, bshape,
                 g->ndim, es) != 0)
      goto fail;
  }
  flow_tensor_decref(tmp);
  free(counts);
  return y;
fail:
  flow_tensor_decref(tmp);
  free(counts);
  flow_tensor_decref(y);
  return NULL;
}

static flow_tensor *reduce_scatter(const group *g, flow_tensor *x, int a) {
  int64_t yshape[FLOW_MAX_DIMS], start[FLOW_MAX_DIMS] = {0}, zero[FLOW_MAX_DIMS] = {0};
  size_t es = flow_dtype_size(x->dtype), *counts = malloc((size_t)g->p * sizeof(size_t));
  part(g, a, g->r, yshape);
  flow_tensor *y = flow_tensor_new(x->dtype, x->device, g->ndim, yshape), *tmp = NULL;
  if (!counts || !y) goto fail;
  bool direct = leading(g->ndim, g->sub, a);
  if (!direct && !(tmp = scratch(x->dtype, x->device, (size_t)flow_tensor_numel(x)))) goto fail;
  size_t off = 0;
  for (int q = 0; q < g->p; q++) {
    int64_t bshape[FLOW_MAX_DIMS];
    start[a] = part(g, a, q, bshape);
    counts[q] = (size_t)flow_shape_numel(g->ndim, bshape);
    if (!direct && copy_box(x->device, (char *)flow_tensor_data(tmp) + off * es, bshape, zero, flow_tensor_data(x),
                            g->sub, start, bshape, g->ndim, es) != 0)
      goto fail;
    off += counts[q];
  }
  if (g->comm->ops->reduce_scatterv(g->comm, flow_tensor_data(direct ? x : tmp), flow_tensor_data(y), counts,
                                    x->dtype) != 0)
    goto fail;
  flow_tensor_decref(tmp);
  free(counts);
  return y;
fail:
  flow_tensor_decref(tmp);
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

bool flow_boxing_pack_blocks;

/* The all-to-all of strided blocks by packing: each send block is copied dense into one scratch
 * buffer (a 2-D copy), the dense blocks go by alltoallv, and each received block is copied into
 * its strided place. The way for a backend without strided transfers (NCCL); on the host MPI moves
 * strided blocks itself, and flow_boxing_pack_blocks makes it pack too (the specs check the
 * packing this way on machines without a GPU). */
static int alltoall_packed(flow_comm *c, flow_device dev, const char *send, const flow_comm_block *sb, char *recv,
                           const flow_comm_block *rb, flow_dtype dt) {
  int n = c->size, rc = -1;
  size_t es = flow_dtype_size(dt), *cnt = malloc(4 * (size_t)n * sizeof *cnt), stot = 0, rtot = 0;
  flow_tensor *sbuf = NULL, *rbuf = NULL;
  if (!cnt) return flow_error_set("to_global: out of memory");
  for (int q = 0; q < n; q++) {
    cnt[q] = sb[q].rows * sb[q].run;           /* send counts, then displacements */
    cnt[n + q] = stot;
    stot += cnt[q];
    cnt[2 * n + q] = rb[q].rows * rb[q].run;   /* receive counts, then displacements */
    cnt[3 * n + q] = rtot;
    rtot += cnt[2 * n + q];
  }
  if (!(sbuf = scratch(dt, dev, stot)) || !(rbuf = scratch(dt, dev, rtot))) goto done;
  char *sp = flow_tensor_data(sbuf), *rp = flow_tensor_data(rbuf);
  const flow_device_impl *m = mem(dev);
  for (int q = 0; q < n; q++)
    if (cnt[q] && m->copy2d(sp + cnt[n + q] * es, sb[q].run * es, send + sb[q].offset * es, sb[q].stride * es,
                            sb[q].run * es, sb[q].rows, dev) != 0)
      goto done;
  if (c->ops->alltoallv(c, sp, cnt, cnt + n, rp, cnt + 2 * n, cnt + 3 * n, dt) != 0) goto done;
  for (int q = 0; q < n; q++)
    if (cnt[2 * n + q] && m->copy2d(recv + rb[q].offset * es, rb[q].stride * es, rp + cnt[3 * n + q] * es,
                                    rb[q].run * es, rb[q].run * es, rb[q].rows, dev) != 0)
      goto done;
  rc = 0;
done:
  flow_tensor_decref(sbuf);
  flow_tensor_decref(rbuf);
  free(cnt);
  return rc;
}

/* S(a) -> S(b): rank r sends part q (along b) of its shard to rank q and receives part r (along b)
 * of q's shard, which lands at q's offset along a. Both are strided blocks. */
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
  flow_comm *c = g->comm;
  int rc = c->ops->alltoall_blocks && !flow_boxing_pack_blocks
               ? c->ops->alltoall_blocks(c, flow_tensor_data(x), blk, flow_tensor_data(y), blk + n, x->dtype)
               : alltoall_packed(c, x->device, flow_tensor_data(x), blk, flow_tensor_data(y), blk + n, x->dtype);
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
    if (y && copy_box(x->device, flow_tensor_data(y), shape, zero, flow_tensor_data(x), g->sub, start, shape, nd, es) != 0) {
      flow_tensor_decref(y);
      return NULL;
    }
    return y;
  }
  /* -> P: one copy of the data survives, the rest is zeros */
  flow_tensor *y = zeros(x->dtype, x->device, nd, g->sub);
  if (!y) return NULL;
  int rc = 0;
  if (from.kind == FLOW_SBP_B) {
    if (g->r == 0) rc = mem(x->device)->copy(flow_tensor_data(y), y->device, flow_tensor_data(x), x->device, flow_tensor_nbytes(x));
  } else {
    start[from.axis] = part(g, from.axis, g->r, shape);
    rc = copy_box(x->device, flow_tensor_data(y), g->sub, start, flow_tensor_data(x), shape, zero, shape, nd, es);
  }
  if (rc != 0) { flow_tensor_decref(y); return NULL; }
  return y;
}

flow_tensor *flow_boxing_run(const flow_boxing_plan *plan, const flow_placement *p, const flow_nd_sbp *src,
                             int ndim, const int64_t *shape, flow_tensor *local) {
  int64_t start[FLOW_MAX_DIMS], sub[FLOW_MAX_DIMS];
  flow_global_box(p, src, ndim, shape, p->coord, -1, start, sub);
  if (!flow_shape_eq(local->ndim, local->shape, ndim, sub)) {
    char a[96], b[96];
    flow_error_set("[rank %d] to_global: this rank's shard has shape %s but the SBP gives %s", flow_comm_rank(),
                   flow_shape_str(local->ndim, local->shape, a, sizeof a), flow_shape_str(ndim, sub, b, sizeof b));
    return NULL;
  }
  flow_tensor *x = flow_kernel_dense(local);
  flow_nd_sbp cur = *src;
  for (int i = 0; x && i < plan->nsteps; i++) {
    const flow_boxing_step *s = &plan->steps[i];
    if (s->axis < 0) { /* the whole mesh at once (see flat) */
      group g = {data_comm(p->ranks, p->nranks, x->device), p->nranks, p->me, ndim, shape};
      flow_tensor *y = g.comm ? box1d(&g, x, s->from, s->to) : NULL;
      flow_tensor_decref(x);
      return y;
    }
    group g = {flow_placement_axis_data_comm(p, s->axis, x->device.type), p->shape[s->axis], p->coord[s->axis], ndim,
               sub};
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
  flow_tensor *buf;
} piece;

static int index_of(const int *ranks, int n, int rank) {
  for (int i = 0; i < n; i++)
    if (ranks[i] == rank) return i;
  return -1;
}

flow_tensor *flow_boxing_between(const flow_placement *ps, const flow_nd_sbp *src, const flow_placement *pd,
                                 const flow_nd_sbp *dst, int ndim, const int64_t *shape, flow_tensor *local) {
  size_t es = flow_dtype_size(local->dtype);
  flow_device dev = local->device;
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
  flow_tensor *y = zeros(local->dtype, dev, ndim, yn);
  if (!y) { flow_tensor_decref(x); return NULL; }

  int cap = ps->nranks + pd->nranks, nsend = 0, nrecv = 0, rc = 0, nu = 0;
  piece *sends = calloc((size_t)cap, sizeof *sends), *recvs = calloc((size_t)cap, sizeof *recvs);
  flow_comm_msg *msgs = calloc(2 * (size_t)cap, sizeof *msgs);
  int *uranks = NULL;
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
    for (int i = 0; i < ps->nranks && rc == 0; i++) {
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
        rc = copy_box(dev, flow_tensor_data(y), yn, yo, flow_tensor_data(x), xn, xo, on, ndim, es);
      } else if (from == me || to == me) {
        piece *pc = from == me ? &sends[nsend++] : &recvs[nrecv++];
        pc->peer = from == me ? to : from;
        memcpy(pc->start, from == me ? xo : yo, sizeof pc->start);
        memcpy(pc->size, on, sizeof pc->size);
        if (!(pc->buf = scratch(local->dtype, dev, (size_t)flow_shape_numel(ndim, on)))) rc = -1;
        else if (from == me)
          rc = copy_box(dev, flow_tensor_data(pc->buf), on, zero, flow_tensor_data(x), xn, xo, on, ndim, es);
      }
    }
  }
  /* Host data goes point to point over the world, so nothing collective precedes the transfer
   * (a group made for it would hang, not time out, when a peer skips this boxing), with a tag of
   * the thread's comm channel so a graph's two collective streams never match each other's
   * messages. Device data goes over an NCCL communicator of the ranks of either placement. */
  if (rc == 0 && (ps->me >= 0 || pd->me >= 0)) {
    flow_comm *c = NULL;
    int tag = 12;
    if (dev.type == FLOW_CPU) {
      c = flow_comm_world();
      tag += 16 * flow_comm_channel();
    } else if ((uranks = flow_placement_union(ps, pd, &nu))) {
      c = data_comm(uranks, nu, dev);
    }
    if (!c) rc = -1;
    /* peers are world ranks, or indices into the union's communicator */
    for (int k = 0; rc == 0 && k < nsend; k++)
      msgs[k] = (flow_comm_msg){uranks ? index_of(uranks, nu, sends[k].peer) : sends[k].peer,
                                flow_tensor_data(sends[k].buf), (size_t)flow_shape_numel(ndim, sends[k].size)};
    for (int k = 0; rc == 0 && k < nrecv; k++)
      msgs[cap + k] = (flow_comm_msg){uranks ? index_of(uranks, nu, recvs[k].peer) : recvs[k].peer,
                                      flow_tensor_data(recvs[k].buf), (size_t)flow_shape_numel(ndim, recvs[k].size)};
    if (rc == 0) rc = c->ops->exchange(c, msgs, nsend, msgs + cap, nrecv, local->dtype, tag);
  }
  for (int k = 0; rc == 0 && k < nrecv; k++)
    rc = copy_box(dev, flow_tensor_data(y), yn, recvs[k].start, flow_tensor_data(recvs[k].buf), recvs[k].size, zero,
                  recvs[k].size, ndim, es);
done:
  for (int k = 0; sends && k < cap; k++) flow_tensor_decref(sends[k].buf);
  for (int k = 0; recvs && k < cap; k++) flow_tensor_decref(recvs[k].buf);
  free(sends);
  free(recvs);
  free(msgs);
  free(uranks);
  flow_tensor_decref(x);
  if (rc != 0) { flow_tensor_decref(y); return NULL; }
  return y;
}
