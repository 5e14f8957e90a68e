/* The lazy interpreter (ops/lazy.h) and the graph it builds (graph.h). While a graph traces, an
 * op call appends a node instead of running: its inputs are values of the graph (lazy tensors) or
 * real tensors, which become captured values read in place at each run (parameters, optimizer
 * state, constants). Views run their kernel on the headers at trace time, so a lazy view has the
 * strides the real one will have. */
#include <stdlib.h>
#include <string.h>

#include "../ops/eager_global.h"
#include "../core/autocast.h"
#include "../core/comm.h"
#include "../core/rng.h"
#include "../ops/elementwise.h"
#include "graph.h"

static _Thread_local flow_graph *current;
static int next_graph_id = 1;

static uint64_t handle(const flow_graph *g, int v) { return ((uint64_t)(uint32_t)g->id << 32) | (uint32_t)(v + 1); }

flow_graph *flow_graph_new(void) {
  flow_graph *g = calloc(1, sizeof *g);
  if (!g) { flow_error_set("nn.Graph: out of memory"); return NULL; }
  g->id = __atomic_fetch_add(&next_graph_id, 1, __ATOMIC_RELAXED);
  g->pieces = 1;
  return g;
}

void flow_graph_free(flow_graph *g) {
  if (!g) return;
  if (current == g) flow_graph_end(g);
  for (int n = 0; n < g->nnodes; n++) {
    flow_tensor_decref(g->nodes[n].captured);
    free(g->nodes[n].in);
    free(g->nodes[n].ctrl);
  }
  for (int i = 0; i < g->nsegments; i++) free(g->segments[i].out);
  free(g->segments);
  free(g->nodes);
  free(g->values);
  free(g->outputs);
  free(g);
}

int flow_graph_begin(flow_graph *g) {
  if (current) return flow_error_set("nn.Graph: a graph is already being traced on this thread (build calls a graph?)");
  current = g;
  flow_lazy_set_tracing(true);
  g->rng_base = flow_rng_get_state().offset;
  return 0;
}

/* The trace drew no numbers: the generator goes back to where it was, and each run reserves the
 * span the trace used. */
void flow_graph_end(flow_graph *g) {
  if (current != g) return;
  current = NULL;
  flow_lazy_set_tracing(false);
  flow_rng_state s = flow_rng_get_state();
  g->rng_span = s.offset - g->rng_base;
  s.offset = g->rng_base;
  flow_rng_set_state(s);
}

/* ---- nodes and values ------------------------------------------------------------------------ */

static int new_node(flow_graph *g, enum flow_gnode_kind kind) {
  if (g->nnodes == g->capnodes) {
    int cap = g->capnodes ? 2 * g->capnodes : 256;
    flow_gnode *n = realloc(g->nodes, (size_t)cap * sizeof *n);
    if (!n) return flow_error_set("nn.Graph: out of memory");
    g->nodes = n;
    g->capnodes = cap;
  }
  flow_gnode *n = &g->nodes[g->nnodes];
  memset(n, 0, sizeof *n);
  n->kind = kind;
  n->out0 = g->nvalues;
  n->tag = g->tag;
  n->phase = g->phase;
  return g->nnodes++;
}

static int new_value(flow_graph *g, int node, flow_dtype dt, flow_device dev, int ndim, const int64_t *shape) {
  if (g->nvalues == g->capvalues) {
    int cap = g->capvalues ? 2 * g->capvalues : 256;
    flow_gvalue *v = realloc(g->values, (size_t)cap * sizeof *v);
    if (!v) return flow_error_set("nn.Graph: out of memory");
    g->values = v;
    g->capvalues = cap;
  }
  flow_gvalue *v = &g->values[g->nvalues];
  memset(v, 0, sizeof *v);
  v->node = node;
  v->index = g->nodes[node].nout++;
  v->dtype = dt;
  v->device = dev;
  v->ndim = ndim;
  memcpy(v->shape, shape, (size_t)ndim * sizeof(int64_t));
  v->alias = -1;
  return g->nvalues++;
}

static flow_tensor *lazy_tensor(const flow_graph *g, int v) {
  const flow_gvalue *x = &g->values[v];
  return flow_tensor_new_lazy(x->dtype, x->device, x->ndim, x->shape, handle(g, v));
}

static bool same_view(const flow_tensor *a, const flow_tensor *b) {
  return a->storage == b->storage && a->offset == b->offset && a->dtype == b->dtype &&
         flow_shape_eq(a->ndim, a->shape, b->ndim, b->shape) &&
         (a->ndim == 0 || memcmp(a->stride, b->stride, (size_t)a->ndim * sizeof(int64_t)) == 0);
}

/* A real tensor read by the graph: one captured value per distinct view. */
static int capture(flow_graph *g, flow_tensor *t) {
  for (int n = 0; n < g->nnodes; n++)
    if (g->nodes[n].kind == FLOW_GNODE_CAPTURE && same_view(g->nodes[n].captured, t)) return g->nodes[n].out0;
  int n = new_node(g, FLOW_GNODE_CAPTURE);
  if (n < 0) return -1;
  flow_tensor *c = flow_tensor_view_of(t, t->ndim, t->shape, t->stride, t->offset);
  if (!c) return -1;
  g->nodes[n].captured = c;
  return new_value(g, n, t->dtype, t->device, t->ndim, t->shape);
}

int flow_graph_value_of(const flow_graph *g, const flow_tensor *t, const char *what) {
  if (!t->lazy) return flow_error_set("%s: the tensor is not a value of this graph", what);
  if ((int)(t->lazy >> 32) != g->id)
    return flow_error_set("%s: a lazy tensor of another graph's trace was used (lazy tensors live only inside the "
                          "build function that made them)", what);
  int v = (int)(uint32_t)t->lazy - 1;
  if (v < 0 || v >= g->nvalues) return flow_error_set("%s: a stale lazy tensor", what);
  return v;
}

static int value_of(flow_graph *g, flow_tensor *t, const char *what) {
  return t->lazy ? flow_graph_value_of(g, t, what) : capture(g, t);
}

int flow_graph_root(const flow_graph *g, int v) {
  while (g->values[v].alias >= 0) v = g->values[v].alias;
  return v;
}

static int add_ctrl(flow_gnode *n, int before) {
  for (int i = 0; i < n->nctrl; i++)
    if (n->ctrl[i] == before) return 0;
  int *c = realloc(n->ctrl, (size_t)(n->nctrl + 1) * sizeof *c);
  if (!c) return flow_error_set("nn.Graph: out of memory");
  c[n->nctrl++] = before;
  n->ctrl = c;
  return 0;
}

/* Node `w` writes the memory of value v in place: every earlier reader of that memory acts first. */
static int order_readers_before(flow_graph *g, int w, int v) {
  int root = flow_graph_root(g, v);
  for (int k = 0; k < w; k++) {
    const flow_gnode *r = &g->nodes[k];
    for (int i = 0; i < r->nin; i++)
      if (flow_graph_root(g, r->in[i]) == root) {
        if (add_ctrl(&g->nodes[w], k) != 0) return -1;
        break;
      }
  }
  return 0;
}

/* ---- the lazy interpreter ------------------------------------------------------------------------ */

static int record_op(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a, const flow_meta *meta,
                     flow_tensor **out) {
  flow_graph *g = current;
  int *ids = malloc((size_t)(nin ? nin : 1) * sizeof(int));
  if (!ids) return flow_error_set("nn.Graph: out of memory");
  for (int i = 0; i < nin; i++)
    if ((ids[i] = value_of(g, in[i], op->name)) < 0) { free(ids); return -1; }
  int n = new_node(g, FLOW_GNODE_OP); /* after the captures: they may move g->nodes */
  if (n < 0) { free(ids); return -1; }
  flow_gnode *node = &g->nodes[n];
  node->op = op;
  node->attrs = *a;
  node->autocast = flow_autocast_dtype();
  node->in = ids;
  node->nin = nin;
  if (op->kind == FLOW_OP_VIEW) {
    /* the view kernel only computes geometry: run it on the headers to learn the real strides */
    flow_tensor *tmp[8] = {0};
    if (flow_op_run_kernel(op, in, nin, a, tmp) != 0) return -1;
    int rc = 0;
    for (int j = 0; j < op->nout; j++) {
      int v = rc ? -1 : new_value(g, n, tmp[j]->dtype, tmp[j]->device, tmp[j]->ndim, tmp[j]->shape);
      if (v < 0) rc = -1;
      else {
        g->values[v].alias = ids[0];
        out[j] = lazy_tensor(g, v);
        if (!out[j]) rc = -1;
        else {
          memcpy(out[j]->stride, tmp[j]->stride, sizeof out[j]->stride);
          out[j]->offset = tmp[j]->offset;
        }
      }
      flow_tensor_decref(tmp[j]);
    }
    return rc;
  }
  if (op->kind == FLOW_OP_INPLACE) {
    if (order_readers_before(g, n, ids[0]) != 0) return -1;
    int v = new_value(g, n, meta[0].dtype, meta[0].device, in[0]->ndim, in[0]->shape);
    if (v < 0) return -1;
    g->values[v].alias = ids[0];
    if (in[0]->lazy) in[0]->lazy = handle(g, v); /* later readers see the written value */
    flow_tensor_incref(in[0]);
    out[0] = in[0];
    return 0;
  }
  for (int j = 0; j < op->nout; j++) {
    int v = new_value(g, n, meta[j].dtype, meta[j].device, meta[j].ndim, meta[j].shape);
    if (v < 0 || !(out[j] = lazy_tensor(g, v))) return -1;
  }
  return 0;
}

/* Is a boxing's source the same at every piece: a tensor the graph captures (a parameter), not a
 * value of the trace? Ranks outside the source placement hold only an empty stand-in and cannot
 * tell, so between placements the source's ranks decide for all: one min over the ranks of both
 * placements, at trace time. Returns 1, 0, or -1 + error. */
static int invariant_source(const flow_box_desc *d, const flow_tensor *t) {
  bool mine = t->lazy == 0, in_src = d->src_p->me >= 0;
  if (d->src_p == d->dst_p || (!in_src && d->dst_p->me < 0)) return mine;
  int n, *ranks = flow_placement_union(d->src_p, d->dst_p, &n);
  if (!ranks) return -1;
  flow_comm *c = flow_comm_for_ranks(ranks, n);
  free(ranks);
  long long lo, hi;
  if (!c || c->ops->minmax(c, in_src ? mine : 1, &lo, &hi) != 0) return -1;
  return lo == 1;
}

static flow_tensor *record_box(const flow_box_desc *d, flow_tensor *t) {
  flow_graph *g = current;
  int src = value_of(g, t, "to_global");
  if (src < 0) return NULL;
  int repeat = g->pieces > 1 && g->phase == FLOW_PHASE_FORWARD ? invariant_source(d, t) : 0;
  if (repeat < 0) return NULL;
  int n = new_node(g, FLOW_GNODE_BOX);
  if (n < 0) return NULL;
  flow_gnode *node = &g->nodes[n];
  node->box = *d;
  node->repeat = repeat;
  node->in = malloc(sizeof(int));
  if (!node->in) { flow_error_set("nn.Graph: out of memory"); return NULL; }
  node->in[0] = src;
  node->nin = 1;
  int64_t local[FLOW_MAX_DIMS];
  flow_global_local_shape(d->dst_p, &d->dst, d->ndim, d->shape, local);
  int v = new_value(g, n, d->dtype, t->device, d->ndim, local);
  return v < 0 ? NULL : lazy_tensor(g, v);
}

static const flow_lazy_interp tracer = {.record_op = record_op, .record_box = record_box};

__attribute__((constructor)) static void install(void) { flow_lazy_install(&tracer); }

/* ---- inputs, outputs, pruning ---------------------------------------------------------------------- */

/* A lazy tensor for value v carrying global metadata gl (NULL: local), logical axis 0 divided by
 * `div`; the value records it too. */
static flow_tensor *lazy_global(flow_graph *g, int v, const flow_global *gl, int64_t div) {
  flow_tensor *x = lazy_tensor(g, v);
  if (!x || !gl) return x;
  flow_gvalue *val = &g->values[v];
  val->placement = gl->placement;
  val->sbp = gl->sbp;
  val->lndim = gl->ndim;
  memcpy(val->lshape, gl->shape, sizeof val->lshape);
  if (gl->ndim > 0) val->lshape[0] /= div;
  flow_global *copy = flow_global_new(gl->placement, &gl->sbp, val->lndim, val->lshape);
  if (!copy) { flow_tensor_decref(x); return NULL; }
  flow_global_attach(x, copy);
  return x;
}

flow_tensor *flow_graph_input(flow_graph *g, const flow_tensor *t) {
  int64_t M = g->pieces, shape[FLOW_MAX_DIMS];
  memcpy(shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
  if (M > 1 && (t->ndim == 0 || shape[0] % M != 0)) {
    char s[96];
    flow_error_set("nn.Graph: %lld micro-batches do not divide input %d (shard %s): axis 0 must be a multiple",
                   (long long)M, g->ninputs + 1, flow_shape_str(t->ndim, t->shape, s, sizeof s));
    return NULL;
  }
  if (M > 1) shape[0] /= M;
  int n = new_node(g, FLOW_GNODE_INPUT);
  if (n < 0) return NULL;
  g->nodes[n].input = g->ninputs++;
  int v = new_value(g, n, t->dtype, t->device, t->ndim, shape);
  return v < 0 ? NULL : lazy_global(g, v, flow_global_of(t), M);
}

flow_tensor *flow_graph_acc(flow_graph *g, const flow_tensor *t) {
  const flow_global *gl = flow_global_of(t);
  if (gl && gl->placement->me < 0) { /* another stage's tensor: nothing of it here */
    flow_tensor_incref((flow_tensor *)t);
    return (flow_tensor *)t;
  }
  int src = flow_graph_value_of(g, t, "nn.Graph accumulation");
  if (src < 0) return NULL;
  const flow_gvalue *sv = &g->values[src];
  flow_tensor *buf = flow_tensor_new(sv->dtype, sv->device, sv->ndim, sv->shape);
  if (!buf) return NULL;
  int cap = capture(g, buf);
  flow_tensor_decref(buf);
  if (cap < 0) return NULL;
  int n = new_node(g, FLOW_GNODE_ACC);
  if (n < 0) return NULL;
  flow_gnode *node = &g->nodes[n];
  if (!(node->in = malloc(2 * sizeof(int)))) { flow_error_set("nn.Graph: out of memory"); return NULL; }
  node->in[0] = cap;
  node->in[1] = src;
  node->nin = 2;
  sv = &g->values[src];
  int v = new_value(g, n, sv->dtype, sv->device, sv->ndim, sv->shape);
  if (v < 0) return NULL;
  g->values[v].alias = cap;
  return lazy_global(g, v, gl, 1);
}

int flow_graph_output(flow_graph *g, const flow_tensor *t) {
  int v = t->lazy ? flow_graph_value_of(g, t, "nn.Graph output") : capture(g, (flow_tensor *)t);
  if (v < 0) return -1;
  int *o = realloc(g->outputs, (size_t)(g->noutputs + 1) * sizeof *o);
  if (!o) return flow_error_set("nn.Graph: out of memory");
  g->outputs = o;
  g->outputs[g->noutputs++] = v;
  const flow_global *gl = flow_global_of(t);
  if (gl) {
    flow_gvalue *val = &g->values[v];
    val->placement = gl->placement;
    val->sbp = gl->sbp;
    val->lndim = gl->ndim;
    memcpy(val->lshape, gl->shape, sizeof val->lshape);
  }
  return 0;
}

/* Creation order is a topological order, so one backward sweep marks everything an output, a
 * write of captured state (an optimizer update) or a communication needs. Communication stays even
 * when this rank has no use for its result: another rank may (a pipeline stage sends what only
 * the next stage reads), and every rank must take part in the same transfers in the same order. */
int flow_graph_prune(flow_graph *g) {
  for (int n = 0; n < g->nnodes; n++) {
    flow_gnode *x = &g->nodes[n];
    x->live = x->kind == FLOW_GNODE_INPUT || x->kind == FLOW_GNODE_ACC || flow_gnode_communicates(x);
    if (x->kind == FLOW_GNODE_OP && x->op->kind == FLOW_OP_INPLACE) {
      int root = flow_graph_root(g, x->in[0]);
      x->live = g->nodes[g->values[root].node].kind == FLOW_GNODE_CAPTURE;
    }
  }
  for (int i = 0; i < g->noutputs; i++) g->nodes[g->values[g->outputs[i]].node].live = true;
  int live = 0;
  for (int n = g->nnodes - 1; n >= 0; n--) {
    flow_gnode *x = &g->nodes[n];
    if (!x->live) continue;
    live++;
    for (int i = 0; i < x->nin; i++) g->nodes[g->values[x->in[i]].node].live = true;
  }
  return live;
}

bool flow_gnode_communicates(const flow_gnode *n) {
  return n->kind == FLOW_GNODE_BOX || (n->kind == FLOW_GNODE_OP && n->op == &flow_op_to_global);
}

/* ---- fusion: add to output ------------------------------------------------------------------------ */

int flow_graph_fuse_add_to_output(flow_graph *g) {
  /* last[r]: the last live node reading memory root r; comm[r]: a collective reads it */
  int *last = malloc((size_t)(g->nvalues ? g->nvalues : 1) * sizeof *last);
  bool *comm = calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *comm);
  if (!last || !comm) { free(last); free(comm); return flow_error_set("nn.Graph: out of memory"); }
  for (int v = 0; v < g->nvalues; v++) last[v] = -1;
  for (int n = 0; n < g->nnodes; n++) {
    const flow_gnode *x = &g->nodes[n];
    if (!x->live) continue;
    for (int i = 0; i < x->nin; i++) {
      int r = flow_graph_root(g, x->in[i]);
      last[r] = n;
      comm[r] |= flow_gnode_communicates(x);
    }
  }
  for (int i = 0; i < g->noutputs; i++) last[flow_graph_root(g, g->outputs[i])] = g->nnodes; /* returned: stays */
  int fused = 0;
  for (int n = 0; n < g->nnodes; n++) {
    flow_gnode *x = &g->nodes[n];
    if (!x->live || x->kind != FLOW_GNODE_OP || x->op != &flow_op_add || x->in[0] == x->in[1]) continue;
    int a = x->in[0], r = flow_graph_root(g, a);
    const flow_gnode *prod = &g->nodes[g->values[r].node];
    const flow_gvalue *va = &g->values[a], *out = &g->values[x->out0];
    /* the sum must fit a's buffer exactly, and a's memory must be a compute output that dies here */
    if (r != a || prod->kind != FLOW_GNODE_OP || prod->op->kind != FLOW_OP_COMPUTE || last[r] != n || comm[r] ||
        prod->phase != x->phase || /* another stream may still be reading a's earlier pieces */
        va->dtype != out->dtype || !flow_shape_eq(va->ndim, va->shape, out->ndim, out->shape) ||
        flow_graph_root(g, x->in[1]) == r)
      continue;
    x->op = &flow_op_add_;
    g->values[x->out0].alias = a;
    fused++;
  }
  free(last);
  free(comm);
  return fused;
}

/* ---- activation checkpointing: the recompute pass ------------------------------------------------- */

int flow_graph_segment_begin(flow_graph *g) { return g->nnodes; }

int flow_graph_segment_end(flow_graph *g, int begin, flow_tensor *const *outs, int nout) {
  struct flow_gsegment *s = realloc(g->segments, (size_t)(g->nsegments + 1) * sizeof *s);
  if (!s) return flow_error_set("nn.Graph: out of memory");
  g->segments = s;
  struct flow_gsegment *seg = &s[g->nsegments];
  seg->first = begin;
  seg->last = g->nnodes - 1;
  seg->nout = 0;
  seg->out = malloc((size_t)(nout ? nout : 1) * sizeof(int));
  if (!seg->out) return flow_error_set("nn.Graph: out of memory");
  for (int i = 0; i < nout; i++)
    if (outs[i]->lazy && (int)(outs[i]->lazy >> 32) == g->id) seg->out[seg->nout++] = (int)(uint32_t)outs[i]->lazy - 1;
  g->nsegments++;
  return 0;
}

static int in_list(const int *a, int n, int v) {
  for (int i = 0; i < n; i++)
    if (a[i] == v) return 1;
  return 0;
}

/* Clone node n (inside a segment) with inputs remapped through map[] (internal value -> clone);
 * the clone's outputs are recorded in map. Appends to g; returns the clone's index or -1. */
static int clone_node(flow_graph *g, int n, int *map) {
  int c = new_node(g, g->nodes[n].kind);
  if (c < 0) return -1;
  flow_gnode *src = &g->nodes[n], *dst = &g->nodes[c];
  dst->op = src->op;
  dst->attrs = src->attrs;
  dst->autocast = src->autocast;
  dst->box = src->box;
  dst->tag = src->tag;
  dst->phase = src->phase;
  dst->in = malloc((size_t)(src->nin ? src->nin : 1) * sizeof(int));
  if (!dst->in) return flow_error_set("nn.Graph: out of memory");
  dst->nin = src->nin;
  for (int i = 0; i < src->nin; i++) dst->in[i] = map[src->in[i]] >= 0 ? map[src->in[i]] : src->in[i];
  for (int j = 0; j < src->nout; j++) {
    const flow_gvalue o = g->values[src->out0 + j];
    int v = new_value(g, c, o.dtype, o.device, o.ndim, o.shape);
    if (v < 0) return -1;
    g->values[v].alias = o.alias >= 0 && map[o.alias] >= 0 ? map[o.alias] : o.alias;
    map[src->out0 + j] = v;
  }
  return c;
}

/* Put the nodes in the order order[0..nnodes) (a topological order), renumbering node ids. */
static int reorder(flow_graph *g, const int *order) {
  int n = g->nnodes;
  int *newid = malloc((size_t)n * sizeof *newid);
  flow_gnode *nodes = malloc((size_t)g->capnodes * sizeof *nodes);
  if (!newid || !nodes) { free(newid); free(nodes); return flow_error_set("nn.Graph: out of memory"); }
  for (int k = 0; k < n; k++) {
    newid[order[k]] = k;
    nodes[k] = g->nodes[order[k]];
  }
  for (int k = 0; k < n; k++)
    for (int c = 0; c < nodes[k].nctrl; c++) nodes[k].ctrl[c] = newid[nodes[k].ctrl[c]];
  for (int v = 0; v < g->nvalues; v++) g->values[v].node = newid[g->values[v].node];
  free(g->nodes);
  g->nodes = nodes;
  free(newid);
  return 0;
}

int flow_graph_recompute(flow_graph *g) {
  int nseg = g->nsegments, nbase = g->nnodes, added = 0;
  /* per segment: where its clones go (before its first late reader; -1: none) and their range */
  int *at = malloc((size_t)(nseg ? nseg : 1) * 3 * sizeof *at), *lo = at + nseg, *hi = lo + nseg;
  if (!at) return flow_error_set("nn.Graph: out of memory");
  int rc = 0;
  for (int si = 0; si < nseg && rc == 0; si++) {
    const struct flow_gsegment *s = &g->segments[si];
    at[si] = -1;
    lo[si] = hi[si] = g->nnodes;
    int nvals = g->nvalues;
    int *map = malloc((size_t)nvals * 2 * sizeof *map), *need = map + nvals;
    if (!map) { rc = flow_error_set("nn.Graph: out of memory"); break; }
    for (int v = 0; v < nvals; v++) {
      map[v] = -1;
      need[v] = 0;
    }
    /* values made inside the segment (not its results) and read after it: saved activations */
    /* made by an op of the segment (captured tensors are shared, never recomputed) */
#define MADE(v) (g->values[v].node >= s->first && g->values[v].node <= s->last && \
                 g->nodes[g->values[v].node].kind != FLOW_GNODE_CAPTURE)
#define INSIDE(v) (MADE(v) && !in_list(s->out, s->nout, v))
    for (int n = s->last + 1; n < nbase; n++) {
      const flow_gnode *x = &g->nodes[n];
      for (int i = 0; i < x->nin; i++)
        if (INSIDE(x->in[i])) {
          need[x->in[i]] = 1;
          if (at[si] < 0) at[si] = n;
        }
    }
    if (at[si] >= 0) {
      /* the segment's nodes they need, transitively; an in-place write inside stops the pass for
       * this segment (recomputing it would write twice) */
      for (int n = s->last; n >= s->first && rc == 0; n--) {
        const flow_gnode *x = &g->nodes[n];
        bool wanted = false;
        for (int j = 0; j < x->nout; j++) wanted |= need[x->out0 + j];
        if (!wanted) continue;
        if (x->kind != FLOW_GNODE_OP || x->op->kind == FLOW_OP_INPLACE || x->op->kind == FLOW_OP_SOURCE) {
          at[si] = -1; /* a boxing, an in-place write or a source inside: keep this segment's activations */
          break;
        }
        for (int i = 0; i < x->nin; i++)
          if (MADE(x->in[i])) need[x->in[i]] = 1;
      }
    }
    if (at[si] >= 0) {
      for (int n = s->first; n <= s->last && rc == 0; n++) {
        bool wanted = false;
        for (int j = 0; j < g->nodes[n].nout; j++) wanted |= need[g->nodes[n].out0 + j];
        if (wanted && clone_node(g, n, map) < 0) rc = -1;
      }
      hi[si] = g->nnodes;
      added += hi[si] - lo[si];
      for (int c = lo[si]; c < hi[si]; c++) g->nodes[c].phase = g->nodes[at[si]].phase; /* they run with their reader */
      for (int n = s->last + 1; n < nbase && rc == 0; n++) { /* late readers take the clones */
        flow_gnode *x = &g->nodes[n];
        for (int i = 0; i < x->nin; i++)
          if (x->in[i] < nvals && INSIDE(x->in[i]) && map[x->in[i]] >= 0) x->in[i] = map[x->in[i]];
      }
    }
#undef INSIDE
#undef MADE
    free(map);
  }
  if (rc == 0 && added > 0) {
    int *order = malloc((size_t)g->nnodes * sizeof *order), k = 0;
    if (!order) rc = flow_error_set("nn.Graph: out of memory");
    for (int n = 0; rc == 0 && n < nbase; n++) {
      for (int si = 0; si < nseg; si++)
        if (at[si] == n)
          for (int c = lo[si]; c < hi[si]; c++) order[k++] = c;
      order[k++] = n;
    }
    if (rc == 0) rc = reorder(g, order);
    free(order);
  }
  free(at);
  return rc < 0 ? -1 : added;
}
