/* Eager global execution (eager_global.h): the interpreter ops hand global calls to: infer the logical result,
 * pick the cheapest SBP signature per mesh axis, box the inputs, run the local kernel on shards
 * and wrap the outputs. Boxing itself is the to_global op, whose gradient is the reverse boxing. */
#include "eager_global.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/hash.h"
#include "../core/nccl.h"
#include "autograd.h"
#include "elementwise.h"
#include "lazy.h"
#include "op.h"
#include "../sbp/cost.h"
#include "../sbp/signature.h"

/* ---- targets: (placement, nd-SBP, logical shape) interned so attrs can carry them as an id ---- */

typedef struct target {
  const flow_placement *placement;
  flow_nd_sbp sbp;
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
} target;

static target *targets;
static int ntargets, captargets;

static int target_id(const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape) {
  for (int i = ntargets - 1; i >= 0; i--) {
    target *t = &targets[i];
    if (t->placement == p && flow_nd_sbp_eq(&t->sbp, sbp) && flow_shape_eq(t->ndim, t->shape, ndim, shape)) return i;
  }
  if (ntargets == captargets) {
    int cap = captargets ? 2 * captargets : 64;
    target *n = realloc(targets, (size_t)cap * sizeof *n);
    if (!n) return flow_error_set("to_global: out of memory");
    targets = n;
    captargets = cap;
  }
  target *t = &targets[ntargets];
  memset(t, 0, sizeof *t);
  t->placement = p;
  t->sbp = *sbp;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
  return ntargets++;
}

/* ---- small helpers ----------------------------------------------------------------------------- */

static int rank_error(const char *fmt, ...) {
  char m[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return flow_error_set("[rank %d] %s", flow_comm_rank(), m);
}

/* Prefix the current error with the rank, once. */
static int rank_prefix(void) {
  const char *m = flow_error_get();
  if (strncmp(m, "[rank ", 6) == 0) return -1;
  char copy[1024];
  snprintf(copy, sizeof copy, "%s", m);
  return flow_error_set("[rank %d] %s", flow_comm_rank(), copy);
}

static void all_b(flow_nd_sbp *s, int n) {
  s->n = n;
  for (int i = 0; i < n; i++) s->v[i] = flow_sbp_broadcast();
}

/* t's current SBP on p: its own, or all-broadcast for a local tensor (same value on every rank). */
static void sbp_of(const flow_tensor *t, const flow_placement *p, flow_nd_sbp *s) {
  if (t->global) *s = flow_global_of(t)->sbp;
  else all_b(s, p->ndim);
}

static void logical_of(const flow_tensor *t, int *ndim, int64_t *shape) {
  const flow_global *g = flow_global_of(t);
  *ndim = g ? g->ndim : t->ndim;
  memcpy(shape, g ? g->shape : t->shape, (size_t)*ndim * sizeof(int64_t));
}

/* Give t (a plain local shard) global metadata. */
static int wrap(flow_tensor *t, const flow_placement *p, const flow_nd_sbp *sbp, int ndim, const int64_t *shape) {
  flow_global *g = flow_global_new(p, sbp, ndim, shape);
  if (!g) return -1;
  flow_global_attach(t, g);
  return 0;
}

/* ---- explain trace ----------------------------------------------------------------------------- */

static char *trace;
static size_t trace_len, trace_cap;
static bool tracing;

static void tracef(const char *fmt, ...) {
  if (!tracing) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) n = sizeof line - 1;
  if (trace_len + (size_t)n + 1 > trace_cap) {
    size_t cap = (trace_cap + (size_t)n + 1) * 2;
    char *t = realloc(trace, cap);
    if (!t) return;
    trace = t;
    trace_cap = cap;
  }
  memcpy(trace + trace_len, line, (size_t)n + 1);
  trace_len += (size_t)n;
}

void flow_global_trace_begin(void) {
  tracing = true;
  trace_len = 0;
  if (trace) trace[0] = 0;
}

char *flow_global_trace_end(void) {
  tracing = false;
  char *s = trace ? trace : calloc(1, 1);
  trace = NULL;
  trace_len = trace_cap = 0;
  return s;
}

/* CUDA shards that go through the host (see "device shards" below) */
static bool staged(flow_device dev) { return dev.type != FLOW_CPU && !flow_nccl_usable(); }

static void trace_plan(const char *indent, const flow_boxing_plan *plan, flow_device dev) {
  if (plan->nsteps == 0) { tracef("%sno data moves\n", indent); return; }
  if (dev.type != FLOW_CPU)
    tracef(staged(dev) ? "%sdevice memory goes through the host over MPI (NCCL is off: %s)\n"
                       : "%sin device memory over NCCL%s\n",
           indent, flow_nccl_unusable_reason());
  if (plan->via_broadcast)
    tracef("%sno axis-by-axis path: gather to broadcast, then slice\n", indent);
  for (int i = 0; i < plan->nsteps; i++) {
    const flow_boxing_step *s = &plan->steps[i];
    char a[16], b[16];
    char where[32];
    if (s->axis < 0) snprintf(where, sizeof where, "whole mesh");
    else snprintf(where, sizeof where, "mesh axis %d", s->axis);
    tracef("%s%s: %s -> %s by %s, %.0f bytes moved\n", indent, where, flow_sbp_str(s->from, a, sizeof a),
           flow_sbp_str(s->to, b, sizeof b), s->collective, s->bytes);
  }
}

/* ---- boxing a tensor ----------------------------------------------------------------------------- */

/* ---- device shards ---------------------------------------------------------------------------
 * CUDA shards are boxed in device memory over NCCL. When NCCL cannot carry the job (ranks share a
 * GPU, FLOW_NCCL=0: see flow_nccl_init) they go through the host and back over MPI instead. */

static flow_tensor *to_host(flow_tensor *t) {
  flow_tensor *plain = flow_tensor_view_of(t, t->ndim, t->shape, t->stride, t->offset);
  flow_tensor *c = plain ? flow_contiguous(plain) : NULL; /* on the device */
  flow_tensor_decref(plain);
  flow_tensor *h = c ? flow_tensor_new(c->dtype, FLOW_DEVICE_CPU, c->ndim, c->shape) : NULL;
  if (h && flow_device_get(c->device.type)->copy(flow_tensor_data(h), FLOW_DEVICE_CPU, flow_tensor_data(c), c->device,
                                                 flow_tensor_nbytes(c)) != 0) {
    flow_tensor_decref(h);
    h = NULL;
  }
  flow_tensor_decref(c);
  return h;
}

/* h (a host tensor, consumed) copied to dev */
static flow_tensor *to_device(flow_tensor *h, flow_device dev) {
  if (!h || dev.type == FLOW_CPU) return h;
  flow_tensor *d = flow_tensor_new(h->dtype, dev, h->ndim, h->shape);
  if (d && flow_device_get(dev.type)->copy(flow_tensor_data(d), dev, flow_tensor_data(h), FLOW_DEVICE_CPU,
                                           flow_tensor_nbytes(h)) != 0) {
    flow_tensor_decref(d);
    d = NULL;
  }
  flow_tensor_decref(h);
  return d;
}

static flow_tensor *run_plan(const flow_boxing_plan *plan, const flow_placement *p, const flow_nd_sbp *src, int ndim,
                             const int64_t *shape, flow_tensor *t) {
  if (!staged(t->device) || plan->nsteps == 0) return flow_boxing_run(plan, p, src, ndim, shape, t);
  flow_tensor *h = to_host(t);
  flow_tensor *y = h ? flow_boxing_run(plan, p, src, ndim, shape, h) : NULL;
  flow_tensor_decref(h);
  return to_device(y, t->device);
}

/* The shard of t under (p, dst): t itself (new reference) when nothing changes. */
static flow_tensor *box_shard(const char *what, flow_tensor *t, const flow_placement *p, const flow_nd_sbp *dst) {
  flow_nd_sbp src;
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
  sbp_of(t, p, &src);
  logical_of(t, &ndim, shape);
  if (flow_nd_sbp_eq(&src, dst)) { flow_tensor_incref(t); return t; }
  flow_boxing_plan plan;
  if (flow_boxing_plan_make(p, &src, dst, ndim, shape, t->dtype, &plan) != 0) return NULL;
  if (tracing) {
    char a[64], b[64];
    tracef("  %s: %s -> %s\n", what, flow_nd_sbp_str(&src, a, sizeof a), flow_nd_sbp_str(dst, b, sizeof b));
    trace_plan("    ", &plan, t->device);
  }
  if (flow_lazy_tracing()) {
    flow_box_desc d = {.src_p = p, .dst_p = p, .src = src, .dst = *dst, .ndim = ndim, .dtype = t->dtype};
    memcpy(d.shape, shape, (size_t)ndim * sizeof(int64_t));
    return flow_lazy_box(&d, t);
  }
  if (plan.nsteps > 0 && flow_global_settle(p) != 0) return NULL; /* data is about to move */
  return run_plan(&plan, p, &src, ndim, shape, t);
}

flow_tensor *flow_box_run(const flow_box_desc *d, flow_tensor *t) {
  if (d->src_p == d->dst_p) {
    flow_boxing_plan plan;
    if (flow_boxing_plan_make(d->src_p, &d->src, &d->dst, d->ndim, d->shape, d->dtype, &plan) != 0) return NULL;
    return run_plan(&plan, d->src_p, &d->src, d->ndim, d->shape, t);
  }
  flow_tensor *h = !staged(t->device) ? (flow_tensor_incref(t), t) : to_host(t);
  flow_tensor *y = h ? flow_boxing_between(d->src_p, &d->src, d->dst_p, &d->dst, d->ndim, d->shape, h) : NULL;
  flow_tensor_decref(h);
  return staged(t->device) ? to_device(y, t->device) : y;
}

/* ---- agreement check --------------------------------------------------------------------------- */

static bool check_on;   /* strict: every op */
static bool check_off;  /* no check at all (FLOW_CHECK=0) */
void flow_global_set_check(bool on) { check_on = on; }
bool flow_global_check_enabled(void) { return check_on; }

__attribute__((constructor)) static void read_check_env(void) {
  const char *e = getenv("FLOW_CHECK");
  check_off = e && strcmp(e, "0") == 0;
}

/* What the ranks of a placement must agree on for one op: the op, its inputs' logical shapes,
 * dtypes and SBP, the target SBP of a boxing, and the placement's ranks. */
static uint64_t op_hash(const flow_op *op, flow_tensor *const *in, int nin, const flow_placement *p,
                        const flow_nd_sbp *target) {
  uint64_t h = flow_fnv(FLOW_FNV_START, op->name, strlen(op->name));
  for (int m = 0; target && m < target->n; m++) {
    int v[2] = {target->v[m].kind, target->v[m].axis};
    h = flow_fnv(h, v, sizeof v);
  }
  for (int i = 0; i < nin; i++) {
    int nd;
    int64_t shape[FLOW_MAX_DIMS];
    flow_nd_sbp s;
    logical_of(in[i], &nd, shape);
    sbp_of(in[i], p, &s);
    h = flow_fnv(h, &nd, sizeof nd);
    h = flow_fnv(h, shape, (size_t)nd * sizeof(int64_t));
    h = flow_fnv(h, &in[i]->dtype, sizeof in[i]->dtype);
    for (int m = 0; m < s.n; m++) {
      int v[2] = {s.v[m].kind, s.v[m].axis};
      h = flow_fnv(h, v, sizeof v);
    }
  }
  return flow_fnv(h, p->ranks, (size_t)p->nranks * sizeof(int));
}

/* Set when an error was found by all the placement's ranks together (a handshake failed, or showed
 * the ranks disagree): the others know of it, so it is not announced (see run_global). */
static bool shared_error;

/* The handshake over p (every rank arrived, none failed: comm.h) comparing h. */
static int same_everywhere(const flow_placement *p, const char *what, uint64_t h, bool *same) {
  flow_comm *c = flow_comm_for_ranks(p->ranks, p->nranks);
  if (!c) { /* the members failed to make it together (comm.c), or it ran out of memory */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", flow_error_unranked(flow_error_get()));
    shared_error = true;
    return flow_error_set("[rank %d] %s: %s", flow_comm_rank(), what, msg);
  }
  long long lo, hi;
  if (c->ops->handshake(c, what, (long long)(h >> 2), &lo, &hi) != 0) { shared_error = true; return -1; }
  *same = lo == hi;
  shared_error = !*same;
  return 0;
}

/* The strict check (flow.set_check_consistency(true)): every op, before it runs. */
static int agree(const flow_op *op, flow_tensor *const *in, int nin, const flow_placement *p, const char *sig,
                 const flow_nd_sbp *target) {
  bool same;
  if (same_everywhere(p, op->name, op_hash(op, in, nin, p, target), &same) != 0) return -1;
  if (!same)
    return rank_error("%s: ranks disagree on this global op (the op, its input shapes or SBP differ between "
                      "ranks); this rank called %s", op->name, sig);
  return 0;
}

/* The default check, batched: each op folds its hash into its placement's running hash, and the
 * ranks compare it (one small collective) only before data moves on that placement or a value is
 * read. Ops between two such points run on shards alone, so a divergence is caught before it can
 * reach another rank or the user, at a cost of one all-reduce of two integers per boxing. */
#define PENDING_MAX 16
static struct pending {
  const flow_placement *p;
  uint64_t h;
  int n;
  const char *last;
} pending[PENDING_MAX];

static void fold(const flow_op *op, flow_tensor *const *in, int nin, const flow_placement *p, const flow_nd_sbp *target) {
  if (p->me < 0 || check_on || check_off) return;
  uint64_t h = op_hash(op, in, nin, p, target);
  int k = 0;
  while (k < PENDING_MAX && pending[k].p && pending[k].p != p) k++;
  if (k == PENDING_MAX) k = 0; /* more placements in flight than slots: share the first */
  pending[k].p = p;
  pending[k].h = flow_fnv(pending[k].h ? pending[k].h : FLOW_FNV_START, &h, sizeof h);
  pending[k].n++;
  pending[k].last = op->name;
}

/* Drops p's running hash, or every placement's when p is NULL (its ops failed before their check). */
static void forget(const flow_placement *p) {
  for (int k = 0; k < PENDING_MAX; k++)
    if (!p || pending[k].p == p) { pending[k].h = 0; pending[k].n = 0; }
}

void flow_global_forget_all(void) { forget(NULL); }

/* Folds into p's running hash the other placement of a transfer (its ranks in order and its mesh),
 * so ranks that name different placements for one transfer disagree before data moves. */
static void fold_other(const flow_placement *p, const flow_placement *other) {
  if (p->me < 0 || check_on || check_off) return;
  uint64_t h = flow_fnv(flow_fnv(FLOW_FNV_START, other->ranks, (size_t)other->nranks * sizeof(int)), other->shape,
                   (size_t)other->ndim * sizeof other->shape[0]);
  for (int k = 0; k < PENDING_MAX; k++)
    if (pending[k].p == p) { pending[k].h = flow_fnv(pending[k].h, &h, sizeof h); return; }
}

int flow_global_settle(const flow_placement *p) {
  if (check_off || p->me < 0) return 0;
  for (int k = 0; k < PENDING_MAX; k++) {
    if (pending[k].p != p || pending[k].n == 0) continue;
    struct pending was = pending[k];
    pending[k].h = 0;
    pending[k].n = 0;
    bool same;
    if (same_everywhere(p, was.last, was.h, &same) != 0) return -1;
    if (!same)
      return rank_error("ranks disagree on the global ops they ran on this placement since its last transfer (an op, "
                        "an input shape, dtype or SBP differs; %d ops here, the last was %s)", was.n, was.last);
  }
  return 0;
}

/* This rank failed in op on p alone: the placement's other ranks hear of it at their next
 * handshake, and raise with this rank's message instead of waiting for it (the failure channel).
 * The ops folded since the last handshake are dropped with the failure. */
static void announce_failure(const flow_op *op, const flow_placement *p) {
  if (check_off || p->me < 0 || p->nranks < 2) return;
  forget(p);
  flow_comm *c = flow_comm_for_ranks(p->ranks, p->nranks);
  if (c) c->ops->fail(c, op->name, flow_error_get());
}

/* "matmul({8,16} S(0), {16,32} B)" for messages and traces */
static void describe(const flow_op *op, flow_tensor *const *in, int nin, const flow_placement *p, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "%s(", op->name);
  for (int i = 0; i < nin && len < n; i++) {
    int nd;
    int64_t shape[FLOW_MAX_DIMS];
    flow_nd_sbp s;
    char a[96], b[64];
    logical_of(in[i], &nd, shape);
    sbp_of(in[i], p, &s);
    len += (size_t)snprintf(buf + len, n - len, "%s%s %s%s", i ? ", " : "", flow_shape_str(nd, shape, a, sizeof a),
                            flow_nd_sbp_str(&s, b, sizeof b), in[i]->global ? "" : " (local)");
  }
  if (len < n) snprintf(buf + len, n - len, ")");
}

/* ---- signature choice --------------------------------------------------------------------------- */

typedef struct choice {
  flow_nd_sbp in[FLOW_SIG_MAX_IO], out[FLOW_SIG_MAX_IO];
  bool ruled;
} choice;

static int choose(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a, const flow_meta *lmeta,
                  const flow_placement *p, choice *ch) {
  flow_sig_query q;
  memset(&q, 0, sizeof q);
  q.nin = nin;
  q.nout = op->nout;
  q.attrs = a;
  flow_nd_sbp cur[FLOW_SIG_MAX_IO];
  double bytes[FLOW_SIG_MAX_IO];
  for (int i = 0; i < nin; i++) {
    logical_of(in[i], &q.in_ndim[i], q.in_shape[i]);
    sbp_of(in[i], p, &cur[i]);
    bytes[i] = (double)flow_shape_numel(q.in_ndim[i], q.in_shape[i]) * (double)flow_dtype_size(in[i]->dtype);
    ch->in[i].n = p->ndim;
  }
  for (int j = 0; j < op->nout; j++) {
    q.out_ndim[j] = lmeta[j].ndim;
    memcpy(q.out_shape[j], lmeta[j].shape, sizeof q.out_shape[j]);
    ch->out[j].n = p->ndim;
  }
  ch->ruled = true;
  flow_sig_list list;
  for (int m = 0; m < p->ndim; m++) {
    q.p = p->shape[m];
    ch->ruled &= flow_sbp_candidates(op->sbp, &q, &list);
    int best = -1, best_moves = 0;
    double best_cost = 0;
    for (int c = 0; c < list.n; c++) {
      const flow_sbp_sig *s = &list.v[c];
      bool keeps = op->kind != FLOW_OP_INPLACE || flow_sbp_eq(s->out[0], cur[0].v[m]);
      /* inputs the op writes in place keep their layout (boxing would write a copy) */
      for (int i = 0; i < nin && keeps; i++) keeps = !flow_op_writes(op, i) || flow_sbp_eq(s->in[i], cur[i].v[m]);
      if (!keeps) continue;
      double cost = 0;
      int moves = 0;
      for (int i = 0; i < nin; i++) {
        cost += flow_cost_infer(cur[i].v[m], s->in[i], p->shape[m], bytes[i]);
        moves += !flow_sbp_eq(cur[i].v[m], s->in[i]);
      }
      /* ties: fewer conversions, then a split output over a broadcast one */
      bool better = best < 0 || cost < best_cost || (cost == best_cost && moves < best_moves) ||
                    (cost == best_cost && moves == best_moves && s->out[0].kind == FLOW_SBP_S &&
                     list.v[best].out[0].kind != FLOW_SBP_S);
      if (better) { best = c; best_cost = cost; best_moves = moves; }
    }
    if (best < 0) {
      char d[512];
      describe(op, in, nin, p, d, sizeof d);
      return rank_error("%s: an in-place op cannot keep the SBP of the tensors it writes here: %s (box them "
                        "first)", op->name, d);
    }
    for (int i = 0; i < nin; i++) ch->in[i].v[m] = list.v[best].in[i];
    for (int j = 0; j < op->nout; j++) ch->out[j].v[m] = list.v[best].out[j];
  }
  return 0;
}

/* ---- the boxing ops ------------------------------------------------------------------------------ */

extern flow_op flow_op_to_global, flow_op_to_local;

/* attrs of to_global: k = target id; start = the source's target id (-1 for a local source). */

static int infer_same(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  *out = in[0];
  return 0;
}

/* When the placement leaves ranks out, its first rank tells them the outcome over the world: the
 * logical rank, dtype and shape, or -1 when the members found the shards inconsistent (so every rank
 * raises instead of the outsiders waiting). Members and outsiders call this at the same point. */
static int tell_outsiders(const flow_placement *p, int64_t *msg) {
  if (p->nranks == flow_comm_size()) return 0;
  /* a handshake first, with a value of its own: a rank elsewhere is an error on all, not a hang */
  flow_comm *w = flow_comm_world();
  long long lo, hi, v = (long long)(flow_fnv(FLOW_FNV_START, "outsiders", 9) >> 2);
  if (w->ops->handshake(w, "to_global", v, &lo, &hi) != 0) return rank_prefix();
  char ps[128];
  if (lo != hi)
    return rank_error("to_global: a rank is not at this to_global onto %s (the ranks took different paths)",
                      flow_placement_str(p, ps, sizeof ps));
  return w->ops->broadcast(w, msg, 2 + FLOW_MAX_DIMS, FLOW_I64, p->ranks[0]);
}

/* attrs.flags of to_global from a local tensor: the logical shape was settled when it was traced
 * (it is the target's), so a planned run only moves data */
enum { TO_GLOBAL_SHAPE_KNOWN = 1 << 20 };

/* The logical shape of local shards put under (p, sbp): summed from the shards along split axes
 * (innermost first). Collective over the placement, and over the world when it leaves ranks out:
 * every rank checks its shard is the one the SBP gives it, all agree on the outcome, and the
 * outsiders learn it (local_to_global_outside). */
static int local_logical_shape(const flow_placement *p, const flow_nd_sbp *sbp, const flow_tensor *in, int64_t *shape) {
  int nd = in->ndim;
  int64_t start[FLOW_MAX_DIMS], box[FLOW_MAX_DIMS];
  memcpy(shape, in->shape, (size_t)nd * sizeof(int64_t));
  for (int m = p->ndim - 1; m >= 0; m--) {
    if (sbp->v[m].kind != FLOW_SBP_S || p->shape[m] == 1) continue;
    flow_comm *c = flow_placement_axis_comm(p, m);
    int ax = sbp->v[m].axis;
    if (!c || c->ops->allreduce(c, &shape[ax], &shape[ax], 1, FLOW_I64) != 0) return -1;
  }
  flow_global_box(p, sbp, nd, shape, p->coord, -1, start, box);
  flow_comm *all = flow_comm_for_ranks(p->ranks, p->nranks);
  long long lo, hi, fit = flow_shape_eq(nd, box, nd, in->shape);
  uint64_t h = flow_fnv(flow_fnv(FLOW_FNV_START, shape, (size_t)nd * sizeof(int64_t)), &in->dtype, sizeof in->dtype);
  if (!all || all->ops->handshake(all, "to_global", fit ? (long long)(h >> 2) : -1, &lo, &hi) != 0) return -1;
  int64_t msg[2 + FLOW_MAX_DIMS] = {lo != hi || lo < 0 ? -1 : nd, in->dtype};
  memcpy(msg + 2, shape, (size_t)nd * sizeof(int64_t));
  if (tell_outsiders(p, msg) != 0) return -1;
  if (lo != hi || lo < 0) {
    char s[96], l[96];
    return rank_error("to_global: the local shards do not form one tensor split as asked (this rank holds %s of a "
                      "logical %s; shapes and dtypes must agree and splits give the first n %% p ranks one more row)",
                      flow_shape_str(nd, in->shape, s, sizeof s), flow_shape_str(nd, shape, l, sizeof l));
  }
  return 0;
}

/* A local tensor becomes this rank's shard (see local_logical_shape), and broadcast axes take
 * coordinate 0's copy so the ranks hold the same values. */
static FLOW_KERNEL(kernel_local_to_global) {
  const target *tg = &targets[a->k];
  const flow_placement *p = tg->placement;
  if (p->me < 0) return rank_error("to_global: this rank is not in the placement"); /* see local_to_global_outside */
  /* data moves: every rank must be here, and agree on the ops so far and on this target (the
   * shards' shapes may differ, so they are checked below) */
  fold(&flow_op_to_global, NULL, 0, p, &tg->sbp);
  if (flow_global_settle(p) != 0) return -1;
  /* out[0] := in[0], densely */
  flow_device dev = in[0]->device;
  flow_tensor *d = flow_kernel_dense(in[0]);
  if (!d) return -1;
  int rc = flow_device_get(dev.type)->copy(flow_tensor_data(out[0]), dev, flow_tensor_data(d), dev, flow_tensor_nbytes(d));
  flow_tensor_decref(d);
  if (rc != 0) return -1;
  int nd = in[0]->ndim;
  int64_t shape[FLOW_MAX_DIMS];
  if (a->flags & TO_GLOBAL_SHAPE_KNOWN) memcpy(shape, tg->shape, sizeof shape);
  else if (local_logical_shape(p, &tg->sbp, in[0], shape) != 0) return -1;
  for (int m = 0; m < p->ndim; m++) {
    if (tg->sbp.v[m].kind != FLOW_SBP_B || p->shape[m] == 1) continue;
    flow_comm *c = staged(dev) ? flow_placement_axis_comm(p, m) : flow_placement_axis_data_comm(p, m, dev.type);
    flow_tensor *h = !c ? NULL : !staged(dev) ? (flow_tensor_incref(out[0]), out[0]) : to_host(out[0]);
    rc = !h || c->ops->broadcast(c, flow_tensor_data(h), (size_t)flow_tensor_numel(h), h->dtype, 0) != 0 ? -1 : 0;
    if (rc == 0 && staged(dev))
      rc = flow_device_get(dev.type)->copy(flow_tensor_data(out[0]), dev, flow_tensor_data(h), FLOW_DEVICE_CPU,
                                           flow_tensor_nbytes(h));
    flow_tensor_decref(h);
    if (rc != 0) return -1;
  }
  if (a->flags & TO_GLOBAL_SHAPE_KNOWN) return 0; /* a planned run: the graph keeps the metadata */
  return wrap(out[0], p, &tg->sbp, nd, shape);
}

/* A rank outside the placement takes part in nothing: it gets empty shards with the metadata. */
static int empty_outputs(const flow_op *op, const flow_placement *p, const flow_nd_sbp *sbp, int ndim,
                         const int64_t *shape, flow_dtype dt, flow_device dev, flow_tensor **out) {
  int64_t local[FLOW_MAX_DIMS];
  flow_global_local_shape(p, sbp, ndim, shape, local);
  out[0] = flow_tensor_new(dt, dev, ndim, local);
  if (out[0] && ndim == 0 && dev.type == FLOW_CPU) memset(flow_tensor_data(out[0]), 0, flow_tensor_nbytes(out[0]));
  if (!out[0] || wrap(out[0], p, sbp, ndim, shape) != 0) {
    flow_tensor_decref(out[0]);
    out[0] = NULL;
    return rank_error("%s: %s", op->name, flow_error_get());
  }
  return 0;
}

/* Global -> global: plan and run the boxing; the result shares nothing with the input. */
static int run_to_global(flow_tensor *in, const flow_attrs *a, flow_tensor **out) {
  const target *tg = &targets[a->k];
  const flow_global *g = flow_global_of(in);
  if (g->placement != tg->placement) {
    flow_box_desc d = {.src_p = g->placement, .dst_p = tg->placement, .src = g->sbp, .dst = tg->sbp,
                       .ndim = g->ndim, .dtype = in->dtype};
    memcpy(d.shape, g->shape, (size_t)g->ndim * sizeof(int64_t));
    if (!flow_lazy_tracing()) {
      fold(&flow_op_to_global, &in, 1, g->placement, &tg->sbp);
      fold_other(g->placement, tg->placement); /* both sides agree on where the data goes */
      fold(&flow_op_to_global, &in, 1, tg->placement, &tg->sbp);
      fold_other(tg->placement, g->placement);
      if (flow_global_settle(g->placement) != 0) { /* the target's share of this op is void too */
        forget(tg->placement);
        return -1;
      }
      if (flow_global_settle(tg->placement) != 0) return -1;
    }
    flow_tensor *plain = flow_tensor_view_of(in, in->ndim, in->shape, in->stride, in->offset);
    flow_tensor *y = !plain ? NULL : flow_lazy_tracing() ? flow_lazy_box(&d, plain) : flow_box_run(&d, plain);
    flow_tensor_decref(plain);
    if (!y) return rank_prefix();
    if (wrap(y, tg->placement, &tg->sbp, g->ndim, g->shape) != 0) { flow_tensor_decref(y); return -1; }
    out[0] = y;
    return 0;
  }
  if (g->placement->me < 0) return empty_outputs(&flow_op_to_global, g->placement, &tg->sbp, g->ndim, g->shape, in->dtype, in->device, out);
  char s[256] = "", t[64];
  if (check_on || tracing) {
    describe(&flow_op_to_global, &in, 1, g->placement, s, sizeof s);
    snprintf(s + strlen(s), sizeof s - strlen(s), " -> %s", flow_nd_sbp_str(&tg->sbp, t, sizeof t));
  }
  if (check_on && agree(&flow_op_to_global, &in, 1, g->placement, s, &tg->sbp) != 0) return -1;
  fold(&flow_op_to_global, &in, 1, g->placement, &tg->sbp);
  tracef("%s\n", s);
  flow_tensor *y = box_shard("input 1", in, tg->placement, &tg->sbp);
  if (!y) return rank_prefix();
  if (y == in) { /* nothing to move: a new header on the same shard */
    flow_tensor_decref(y);
    y = flow_tensor_view_of(in, in->ndim, in->shape, in->stride, in->offset);
    if (!y) return -1;
  }
  if (wrap(y, tg->placement, &tg->sbp, g->ndim, g->shape) != 0) { flow_tensor_decref(y); return -1; }
  out[0] = y;
  return 0;
}

/* Local gradient for a local source: the gradient's shard under the forward SBP with partial
 * sums made whole. Global source: the gradient boxed back to the source SBP, except that a
 * broadcast source keeps a partial gradient partial (the reverse of broadcast is partial_sum). */
static int grad_to_global(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g || !c->need[0]) return 0;
  const target *dst = &targets[c->attrs->k];
  flow_tensor *gg = g;
  flow_tensor_incref(gg);
  if (!g->global) { /* a local gradient is the same value everywhere: broadcast */
    flow_nd_sbp b;
    all_b(&b, dst->placement->ndim);
    flow_tensor *w = flow_tensor_alias(g);
    if (!w || wrap(w, dst->placement, &b, g->ndim, g->shape) != 0) { flow_tensor_decref(w); flow_tensor_decref(gg); return -1; }
    flow_tensor_decref(gg);
    gg = w;
  }
  flow_nd_sbp want;
  const flow_placement *p;
  if (c->attrs->start < 0) {
    p = dst->placement;
    want = dst->sbp;
    for (int m = 0; m < want.n; m++)
      if (want.v[m].kind == FLOW_SBP_P) want.v[m] = flow_sbp_broadcast();
  } else {
    const target *src = &targets[c->attrs->start];
    const flow_nd_sbp *gs = &flow_global_of(gg)->sbp;
    p = src->placement;
    want = src->sbp;
    for (int m = 0; m < want.n; m++)
      if (want.v[m].kind == FLOW_SBP_B && gs->v[m].kind == FLOW_SBP_P) want.v[m] = flow_sbp_partial();
  }
  flow_tensor *r = flow_to_global(gg, p, &want);
  flow_tensor_decref(gg);
  if (!r) return -1;
  if (c->attrs->start < 0) {
    gin[0] = flow_to_local(r);
    flow_tensor_decref(r);
    return gin[0] ? 0 : -1;
  }
  gin[0] = r;
  return 0;
}

/* The target ids come from flow_to_global; one from anywhere else (flow._call) is refused here. */
static int infer_to_global(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  if (a->k < 0 || a->k >= ntargets || a->start < -1 || a->start >= ntargets)
    return flow_error_set("%s: no boxing target %lld (from %lld): to_global targets come from t:to_global(placement, "
                          "sbp)", op->name, (long long)a->k, (long long)a->start);
  return infer_same(op, in, nin, a, out);
}

FLOW_OP(to_global) {.nin = 1, .nout = 1, .cpu_half = true, .infer = infer_to_global,
                    .grad = grad_to_global};
FLOW_KERNEL_REGISTER(FLOW_CPU, to_global, kernel_local_to_global)
FLOW_KERNEL_REGISTER(FLOW_CUDA, to_global, kernel_local_to_global)

/* to_local on a local tensor is the identity (a view). */
static FLOW_KERNEL(kernel_to_local) {
  out[0] = flow_tensor_view_of(in[0], in[0]->ndim, in[0]->shape, in[0]->stride, in[0]->offset);
  return out[0] ? 0 : -1;
}

/* The shard's gradient is the shard of the global gradient (attrs.k: the source's target). */
static int grad_to_local(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g || !c->need[0]) return 0;
  if (c->attrs->k < 0 || g->global) { flow_tensor_incref(g); gin[0] = g; return 0; }
  const target *t = &targets[c->attrs->k];
  flow_tensor *w = flow_tensor_alias(g);
  if (!w || wrap(w, t->placement, &t->sbp, t->ndim, t->shape) != 0) { flow_tensor_decref(w); return -1; }
  gin[0] = w;
  return 0;
}

FLOW_OP(to_local) {.nin = 1, .nout = 1, .kind = FLOW_OP_VIEW, .infer = infer_same, .grad = grad_to_local};
FLOW_KERNEL_REGISTER(FLOW_CPU, to_local, kernel_to_local)
FLOW_KERNEL_REGISTER(FLOW_CUDA, to_local, kernel_to_local)

/* A local tensor on a rank outside the placement: that rank holds nothing of the new tensor. It
 * learns the logical shape and dtype from the members (tell_outsiders) and gets an empty shard. */
static flow_tensor *local_to_global_outside(flow_tensor *t, const flow_placement *p, const flow_nd_sbp *sbp) {
  int64_t msg[2 + FLOW_MAX_DIMS];
  flow_tensor *out = NULL;
  if (tell_outsiders(p, msg) != 0) { rank_prefix(); return NULL; }
  if (msg[0] < 0) {
    rank_error("to_global: the placement's ranks found their local shards inconsistent (see their error)");
    return NULL;
  }
  if (empty_outputs(&flow_op_to_global, p, sbp, (int)msg[0], msg + 2, (flow_dtype)msg[1], t->device, &out) != 0)
    return NULL;
  return out;
}

flow_tensor *flow_to_global(flow_tensor *t, const flow_placement *p, const flow_nd_sbp *sbp) {
  int nd;
  int64_t shape[FLOW_MAX_DIMS];
  logical_of(t, &nd, shape);
  if (flow_global_check("to_global", p, sbp, nd) != 0) return NULL;
  if (!t->global && p->me < 0) return local_to_global_outside(t, p, sbp);
  flow_attrs at;
  flow_attrs_init(&at);
  at.start = -1;
  if (t->global) {
    const flow_global *g = flow_global_of(t);
    if ((at.start = target_id(g->placement, &g->sbp, g->ndim, g->shape)) < 0) return NULL;
  }
  if (!t->global && flow_lazy_tracing()) {
    /* traced: the logical shape is settled now, by every rank of the trace (SPMD), so the planned
     * run only moves data and ranks outside the placement take no part in it */
    if (local_logical_shape(p, sbp, t, shape) != 0) { rank_prefix(); return NULL; }
    at.flags |= TO_GLOBAL_SHAPE_KNOWN;
    if ((at.k = target_id(p, sbp, nd, shape)) < 0) return NULL;
    flow_tensor *y = flow_op_call1(&flow_op_to_global, &t, 1, &at);
    if (y && wrap(y, p, sbp, nd, shape) != 0) { flow_tensor_decref(y); return NULL; }
    return y;
  }
  /* for a local source this target carries the shard's shape: only its placement and SBP are read */
  if ((at.k = target_id(p, sbp, nd, shape)) < 0) return NULL;
  return flow_op_call1(&flow_op_to_global, &t, 1, &at);
}

flow_tensor *flow_to_local(flow_tensor *t) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.k = -1;
  if (t->global) {
    const flow_global *g = flow_global_of(t);
    if ((at.k = target_id(g->placement, &g->sbp, g->ndim, g->shape)) < 0) return NULL;
  }
  return flow_op_call1(&flow_op_to_local, &t, 1, &at);
}

char *flow_global_explain_boxing(const flow_tensor *t, const flow_placement *p, const flow_nd_sbp *sbp) {
  int nd;
  int64_t shape[FLOW_MAX_DIMS];
  flow_nd_sbp src;
  logical_of(t, &nd, shape);
  if (flow_global_check("explain", p, sbp, nd) != 0) return NULL;
  sbp_of(t, p, &src);
  bool saved = tracing;
  char *prev = trace;
  size_t plen = trace_len, pcap = trace_cap;
  trace = NULL;
  trace_len = trace_cap = 0;
  tracing = true;
  char a[96], b[64], c[64], d[160];
  tracef("to_global of %s %s on %s: %s -> %s\n", flow_shape_str(nd, shape, a, sizeof a), flow_dtype_name(t->dtype),
         flow_placement_str(p, d, sizeof d), flow_nd_sbp_str(&src, b, sizeof b), flow_nd_sbp_str(sbp, c, sizeof c));
  int rc = 0;
  if (t->global && flow_global_of(t)->placement != p) {
    char e[160];
    const flow_placement *ps = flow_global_of(t)->placement;
    tracef("  between placements %s -> %s: partial sums are reduce-scattered on the source first, then each destination "
           "rank receives only its slice from the source ranks holding it (send/recv)\n",
           flow_placement_str(ps, e, sizeof e), d);
  } else if (!t->global) {
    tracef("  a local tensor becomes this rank's shard (shapes are summed over split axes, broadcast axes "
           "take rank 0's copy)\n");
  } else {
    flow_boxing_plan plan;
    rc = flow_boxing_plan_make(p, &src, sbp, nd, shape, t->dtype, &plan);
    if (rc == 0) {
      trace_plan("  ", &plan, t->device);
      tracef("  total: %.0f bytes moved\n", plan.cost);
    }
  }
  char *s = flow_global_trace_end();
  trace = prev;
  trace_len = plen;
  trace_cap = pcap;
  tracing = saved;
  if (rc != 0) { free(s); return NULL; }
  return s;
}

/* ---- the dispatcher ------------------------------------------------------------------------------ */

static int run_global_op(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a, flow_tensor **out) {
  for (int j = 0; j < op->nout; j++) out[j] = NULL;
  if (op == &flow_op_to_global) return run_to_global(in[0], a, out);
  if (op == &flow_op_to_local) {
    out[0] = flow_tensor_view_of(in[0], in[0]->ndim, in[0]->shape, in[0]->stride, in[0]->offset);
    return out[0] ? 0 : -1;
  }
  const flow_placement *p = NULL;
  for (int i = 0; i < nin; i++) {
    if (!in[i]->global) continue;
    const flow_placement *q = flow_global_of(in[i])->placement;
    if (!p) p = q;
    else if (p != q) {
      char x[128], y[128];
      return rank_error("%s: inputs are on different placements (%s and %s); move one with to_global", op->name,
                        flow_placement_str(p, x, sizeof x), flow_placement_str(q, y, sizeof y));
    }
  }
  if (nin > FLOW_SIG_MAX_IO || op->nout > FLOW_SIG_MAX_IO)
    return rank_error("%s: too many inputs or outputs for a global op", op->name);
  char desc[768] = "";
  if (check_on || tracing) describe(op, in, nin, p, desc, sizeof desc);
  if (p->me >= 0 && check_on && agree(op, in, nin, p, desc, NULL) != 0) return -1;
  fold(op, in, nin, p, NULL);

  flow_meta lin[FLOW_SIG_MAX_IO], lmeta[FLOW_SIG_MAX_IO];
  for (int i = 0; i < nin; i++) flow_meta_from(&lin[i], in[i]); /* logical shapes */
  if (op->infer(op, lin, nin, a, lmeta) != 0) return rank_prefix();

  choice ch;
  if (choose(op, in, nin, a, lmeta, p, &ch) != 0) return -1;
  if (p->me < 0) { /* not in the placement: nothing to compute, only metadata */
    if (op->kind == FLOW_OP_INPLACE) { flow_tensor_incref(in[0]); out[0] = in[0]; return 0; }
    for (int j = 0; j < op->nout; j++)
      if (empty_outputs(op, p, &ch.out[j], lmeta[j].ndim, lmeta[j].shape, lmeta[j].dtype, lmeta[j].device, &out[j]) != 0) {
        for (int k = 0; k < j; k++) { flow_tensor_decref(out[k]); out[k] = NULL; }
        return -1;
      }
    return 0;
  }
  if (tracing) {
    char s[128];
    tracef("%s\n", desc);
    if (!ch.ruled) tracef("  no SBP rule for %s: every input is boxed to broadcast and the op runs whole on every rank\n", op->name);
    size_t len = (size_t)snprintf(s, sizeof s, "  signature [%s]: ", op->sbp ? op->sbp->family : "broadcast");
    for (int i = 0; i < nin && len < sizeof s; i++) {
      char b[48];
      len += (size_t)snprintf(s + len, sizeof s - len, "%s%s", i ? ", " : "", flow_nd_sbp_str(&ch.in[i], b, sizeof b));
    }
    tracef("%s -> ", s);
    for (int j = 0; j < op->nout; j++) {
      char b[48];
      tracef("%s%s", j ? ", " : "", flow_nd_sbp_str(&ch.out[j], b, sizeof b));
    }
    tracef("\n");
  }

  /* kernels see plain local shards (no global metadata: their shapes are the shards') */
  flow_tensor *shard[FLOW_SIG_MAX_IO] = {0};
  int rc = 0;
  for (int i = 0; i < nin && rc == 0; i++) {
    char what[32] = "";
    if (tracing) snprintf(what, sizeof what, "input %d", i + 1);
    flow_tensor *x = flow_op_writes(op, i) ? (flow_tensor_incref(in[i]), in[i]) : box_shard(what, in[i], p, &ch.in[i]);
    if (x && op->dense_shards) {
      flow_tensor *d = flow_tensor_is_lazy(x) ? flow_contiguous(x) : flow_kernel_dense(x);
      flow_tensor_decref(x);
      x = d;
    }
    shard[i] = x ? flow_tensor_view_of(x, x->ndim, x->shape, x->stride, x->offset) : NULL;
    flow_tensor_decref(x);
    if (!shard[i]) rc = -1;
  }
  int64_t start[FLOW_MAX_DIMS], box[FLOW_SIG_MAX_IO][FLOW_MAX_DIMS];
  for (int j = 0; j < op->nout; j++)
    flow_global_box(p, &ch.out[j], lmeta[j].ndim, lmeta[j].shape, p->coord, -1, start, box[j]);
  flow_attrs local = *a;
  if (rc == 0 && op->shard) {
    flow_shard_ctx sc = {.placement = p, .in = lin, .out = lmeta, .in_sbp = ch.in, .out_sbp = ch.out};
    op->shard(op, &sc, &local);
  }
  if (rc == 0) rc = flow_op_call_local(op, shard, nin, &local, out);
  for (int i = 0; i < nin; i++) flow_tensor_decref(shard[i]);
  if (rc != 0) return rank_prefix();
  if (op->kind == FLOW_OP_INPLACE) { /* out[0] is (a view of) in[0]: hand back in[0] itself */
    in[0]->lazy = out[0]->lazy; /* traced: in[0] now stands for the written value, as its shard does */
    flow_tensor_decref(out[0]);
    flow_tensor_incref(in[0]);
    out[0] = in[0];
    return 0;
  }
  for (int j = 0; j < op->nout && rc == 0; j++) {
    if (!flow_shape_eq(out[j]->ndim, out[j]->shape, lmeta[j].ndim, box[j])) {
      char x[96], y[96], s[48];
      rc = rank_error("%s: output %d shard has shape %s but %s of the logical result gives %s (an SBP rule "
                      "does not fit this op)", op->name, j + 1, flow_shape_str(out[j]->ndim, out[j]->shape, x, sizeof x),
                      flow_nd_sbp_str(&ch.out[j], s, sizeof s), flow_shape_str(lmeta[j].ndim, box[j], y, sizeof y));
      break;
    }
    rc = wrap(out[j], p, &ch.out[j], lmeta[j].ndim, lmeta[j].shape);
  }
  if (rc != 0)
    for (int j = 0; j < op->nout; j++) { flow_tensor_decref(out[j]); out[j] = NULL; }
  return rc;
}

/* An error on this rank alone is announced to the placement's other ranks. */
static int run_global(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a, flow_tensor **out) {
  shared_error = false;
  int rc = run_global_op(op, in, nin, a, out);
  if (rc == 0 || shared_error || flow_lazy_tracing()) return rc;
  for (int i = 0; i < nin; i++)
    if (in[i]->global) {
      announce_failure(op, flow_global_of(in[i])->placement);
      break;
    }
  return rc;
}

static _Thread_local bool partial_leaf_grads;

/* A broadcast parameter's gradient arrives partial (one piece per rank): box it to the leaf's
 * own SBP, which for data parallelism is the all-reduce. */
static flow_tensor *leaf_hook(flow_tensor *leaf, flow_tensor *g) {
  const flow_global *lg = flow_global_of(leaf), *gg = flow_global_of(g);
  if (!lg && !gg) { flow_tensor_incref(g); return g; }
  if (!lg) { /* a local leaf used in a global op: its gradient is the whole logical gradient */
    flow_nd_sbp b;
    all_b(&b, gg->placement->ndim);
    flow_tensor *full = flow_to_global(g, gg->placement, &b);
    flow_tensor *r = full ? flow_to_local(full) : NULL;
    flow_tensor_decref(full);
    return r;
  }
  if (gg && gg->placement == lg->placement && flow_nd_sbp_eq(&gg->sbp, &lg->sbp)) { flow_tensor_incref(g); return g; }
  flow_tensor *src = g;
  flow_tensor_incref(src);
  if (!gg) {
    flow_nd_sbp b;
    all_b(&b, lg->placement->ndim);
    flow_tensor *w = flow_tensor_alias(g);
    if (!w || wrap(w, lg->placement, &b, g->ndim, g->shape) != 0) { flow_tensor_decref(w); flow_tensor_decref(src); return NULL; }
    flow_tensor_decref(src);
    src = w;
  }
  flow_nd_sbp want = lg->sbp;
  if (partial_leaf_grads && gg && gg->placement == lg->placement) /* ZeRO-2: reduce-scatter later, not all-reduce now */
    for (int m = 0; m < want.n; m++)
      if (want.v[m].kind == FLOW_SBP_B && gg->sbp.v[m].kind == FLOW_SBP_P) want.v[m] = gg->sbp.v[m];
  flow_tensor *r = flow_to_global(src, lg->placement, &want);
  flow_tensor_decref(src);
  return r;
}

bool flow_global_set_partial_leaf_grads(bool on) {
  bool prev = partial_leaf_grads;
  partial_leaf_grads = on;
  return prev;
}

void flow_global_install(void) {
  flow_op_set_global_dispatch(run_global);
  flow_autograd_set_leaf_hook(leaf_hook);
}
