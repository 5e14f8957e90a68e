/* Compiling a traced graph into a physical plan, and running it (plan.h). Streams: ops on the
 * compute stream, boxings (collectives, send/recv) on the collective stream, inputs on the copy
 * stream. Each value with a consumer is a register of its producer; in-place writes are ordered
 * after every reader of the memory they write by control registers (no payload). Memory: values
 * made and read only on the compute stream are packed into one arena per device by lifetime in
 * that stream's order. That stream acts in order, so two values sharing bytes never live at the
 * same time; everything else gets its own buffer. */
#include "plan.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/autocast.h"
#include "../core/comm.h"
#include "../core/rng.h"
#include "../ops/elementwise.h"

#define ALIGN 64

typedef struct pvalue {
  int reg;                   /* runtime register, or -1 (captured, or nobody reads it) */
  int out_pos;               /* its position among the producer's registers */
  int nslots;
  flow_tensor **slot;        /* what each slot holds (preallocated for compute outputs) */
  int last;                  /* slot written last */
  int64_t offset, bytes;     /* arena placement (offset < 0: not in the arena) */
  bool fresh;                /* pieces, outside the arena: a new buffer per act (readers of earlier
                              * pieces on other streams keep theirs alive by reference) */
  int first_use, last_use;   /* compute-stream positions, for packing */
} pvalue;

typedef struct ptask {
  flow_plan *plan;
  int node, id, stream;
  int *in_pos;               /* per op input: index into in_slot, or -1 for a captured value */
  bool repeat;               /* pieces: a boxing of a parameter (sent to the stage that reads it, a
                              * ZeRO-3 all-gather) moves data at piece 0 only; later pieces hand on
                              * the same result (OneFlow's repeat actor) */
  flow_attrs attrs;          /* the node's, with the feeds applied */
} ptask;

struct flow_plan {
  flow_graph *g;
  flow_rt *rt;
  int ntasks;
  ptask *tasks;
  int *task_of;              /* node -> task, -1 */
  pvalue *v;
  flow_tensor *const *feed;  /* this run's inputs */
  flow_tensor *arena[FLOW_NDEVTYPES][2];  /* per device, for the forward and backward compute streams */
  int64_t npieces;           /* micro-batches per run (graph->pieces) */
  int64_t arena_bytes, arena_bound, unpacked_bytes, dedicated_bytes, captured_bytes, measured_peak;
  int fused;                 /* adds fused into their first input's buffer */
  int recomputed;            /* nodes the recompute pass added (activation checkpointing) */
  bool global;               /* global tensors: every rank runs it, and all agree on the outcome */
};

static int stream_of(const flow_gnode *n) {
  if (n->kind == FLOW_GNODE_INPUT) return FLOW_STREAM_COPY;
  bool b = n->phase != FLOW_PHASE_FORWARD;
  if (flow_gnode_communicates(n)) return b ? FLOW_STREAM_COMM_B : FLOW_STREAM_COMM;
  return b ? FLOW_STREAM_COMPUTE_B : FLOW_STREAM_COMPUTE;
}

static bool is_compute_stream(int s) { return s == FLOW_STREAM_COMPUTE || s == FLOW_STREAM_COMPUTE_B; }

/* Step nodes act once per run, at its last piece; at the others they pass. */
static bool passes(const flow_plan *p, const flow_gnode *n, int64_t piece) {
  return n->phase == FLOW_PHASE_STEP && piece != p->npieces - 1;
}

static bool owns_memory(const flow_gnode *n) {
  return n->kind == FLOW_GNODE_OP && (n->op->kind == FLOW_OP_COMPUTE || n->op->kind == FLOW_OP_SOURCE);
}

static flow_tensor *captured_of(const flow_plan *p, int v) { return p->g->nodes[p->g->values[v].node].captured; }

static void store(pvalue *pv, int slot, flow_tensor *t) {
  flow_tensor_decref(pv->slot[slot]);
  pv->slot[slot] = t;
  pv->last = slot;
}

/* ---- acting ------------------------------------------------------------------------------------- */

static flow_tensor *input_tensor(flow_plan *p, const ptask *t, int i, const int *in_slot) {
  int v = p->g->nodes[t->node].in[i];
  return t->in_pos[i] < 0 ? captured_of(p, v) : p->v[v].slot[in_slot[t->in_pos[i]]];
}

static int out_slot_of(const flow_plan *p, int v, const int *out_slot) {
  return p->v[v].reg >= 0 ? out_slot[p->v[v].out_pos] : 0;
}

static int act_op(void *ctx, int64_t piece, const int *in_slot, const int *out_slot, bool failed) {
  ptask *t = ctx;
  flow_plan *p = t->plan;
  const flow_gnode *n = &p->g->nodes[t->node];
  if (failed || passes(p, n, piece)) return 0;
  flow_comm_set_channel(t->stream == FLOW_STREAM_COMM_B); /* a traced to_global */
  flow_tensor *stack_in[16], **in = n->nin <= 16 ? stack_in : malloc((size_t)n->nin * sizeof *in);
  if (!in) return flow_error_set("nn.Graph: out of memory");
  int rc = 0;
  for (int i = 0; i < n->nin && rc == 0; i++)
    if (!(in[i] = input_tensor(p, t, i, in_slot))) rc = flow_error_set("%s: input %d was never produced", n->op->name, i + 1);
  flow_tensor *out[8] = {0};
  for (int j = 0; j < n->nout && rc == 0; j++) {
    int v = n->out0 + j;
    if (n->op->kind != FLOW_OP_COMPUTE && n->op->kind != FLOW_OP_SOURCE) continue;
    int s = out_slot_of(p, v, out_slot);
    if (p->v[v].fresh) {
      const flow_gvalue *gv = &p->g->values[v];
      flow_tensor *b = flow_tensor_new(gv->dtype, gv->device, gv->ndim, gv->shape);
      if (!b) rc = -1;
      else store(&p->v[v], s, b);
    }
    out[j] = p->v[v].slot[s];
  }
  flow_attrs attrs = t->attrs;
  if (n->op->random) attrs.rng_offset += (uint64_t)piece * p->g->rng_span; /* each piece draws afresh */
  if (rc == 0 && n->op->kind == FLOW_OP_INPLACE) out[0] = in[0];
  if (rc == 0) { /* under the autocast the op was traced with: the setting is per thread */
    flow_dtype prev = flow_set_autocast(n->autocast);
    rc = flow_op_run_kernel(n->op, in, n->nin, &attrs, out);
    flow_set_autocast(prev);
  }
  if (rc == 0 && n->op->kind == FLOW_OP_VIEW)
    for (int j = 0; j < n->nout; j++) store(&p->v[n->out0 + j], out_slot_of(p, n->out0 + j, out_slot), out[j]);
  if (rc == 0 && n->op->kind == FLOW_OP_INPLACE) {
    flow_tensor_incref(in[0]);
    store(&p->v[n->out0], out_slot_of(p, n->out0, out_slot), in[0]);
  }
  if (rc == 0 && (n->op->kind == FLOW_OP_COMPUTE || n->op->kind == FLOW_OP_SOURCE))
    for (int j = 0; j < n->nout; j++) p->v[n->out0 + j].last = out_slot_of(p, n->out0 + j, out_slot);
  if (in != stack_in) free(in);
  return rc;
}

/* A boxing acts even after a failure elsewhere (on zeros if its input never came), so that the
 * other ranks' collectives complete and the run ends everywhere. */
static int act_box(void *ctx, int64_t piece, const int *in_slot, const int *out_slot, bool failed) {
  ptask *t = ctx;
  flow_plan *p = t->plan;
  const flow_gnode *n = &p->g->nodes[t->node];
  if (passes(p, n, piece)) return 0;
  pvalue *out = &p->v[n->out0];
  if (t->repeat && piece > 0) {
    flow_tensor *y = out->slot[out->last];
    if (!y) return failed ? 0 : flow_error_set("boxing: its piece-0 result is missing");
    flow_tensor_incref(y);
    store(out, out_slot_of(p, n->out0, out_slot), y);
    return 0;
  }
  flow_comm_set_channel(t->stream == FLOW_STREAM_COMM_B);
  flow_tensor *x = input_tensor(p, t, 0, in_slot), *zeros = NULL;
  if (!x) {
    const flow_gvalue *iv = &p->g->values[n->in[0]];
    x = zeros = flow_tensor_new(iv->dtype, iv->device, iv->ndim, iv->shape);
    if (!x) return -1;
    flow_device_get(x->device.type)->zero(flow_tensor_data(x), x->device, flow_tensor_nbytes(x));
  }
  flow_tensor *y = flow_box_run(&n->box, x);
  flow_tensor_decref(zeros);
  if (!y) return -1;
  store(&p->v[n->out0], out_slot_of(p, n->out0, out_slot), y);
  return 0;
}

static int act_input(void *ctx, int64_t piece, const int *in_slot, const int *out_slot, bool failed) {
  ptask *t = ctx;
  flow_plan *p = t->plan;
  const flow_gnode *n = &p->g->nodes[t->node];
  flow_tensor *x = p->feed[n->input];
  int64_t shape[FLOW_MAX_DIMS], offset = x->offset;
  memcpy(shape, x->shape, sizeof shape);
  if (p->npieces > 1) { /* unpack: piece k is rows [k*mb, (k+1)*mb) of this rank's shard */
    shape[0] /= p->npieces;
    offset += piece * shape[0] * x->stride[0];
  }
  flow_tensor *plain = flow_tensor_view_of(x, x->ndim, shape, x->stride, offset);
  if (!plain) return -1;
  store(&p->v[n->out0], out_slot_of(p, n->out0, out_slot), plain);
  return 0;
}

/* Gradient accumulation: the first piece copies into the graph's buffer, later ones add. */
static int act_acc(void *ctx, int64_t piece, const int *in_slot, const int *out_slot, bool failed) {
  ptask *t = ctx;
  flow_plan *p = t->plan;
  const flow_gnode *n = &p->g->nodes[t->node];
  if (failed) return 0;
  flow_tensor *in[2] = {captured_of(p, n->in[0]), input_tensor(p, t, 1, in_slot)}, *out[1] = {in[0]};
  if (!in[1]) return flow_error_set("accumulation: its input was never produced");
  flow_attrs none = {0};
  if (flow_op_run_kernel(piece == 0 ? &flow_op_copy_ : &flow_op_add_, in, 2, &none, out) != 0) return -1;
  flow_tensor_incref(in[0]);
  store(&p->v[n->out0], out_slot_of(p, n->out0, out_slot), in[0]);
  return 0;
}

/* ---- building ----------------------------------------------------------------------------------- */

static int64_t value_bytes(const flow_gvalue *v) {
  return flow_shape_numel(v->ndim, v->shape) * (int64_t)flow_dtype_size(v->dtype);
}

/* A contiguous tensor of v's shape at byte `offset` of the arena. */
static flow_tensor *arena_view(flow_tensor *arena, const flow_gvalue *v, int64_t offset) {
  int64_t stride[FLOW_MAX_DIMS];
  flow_contiguous_strides(v->ndim, v->shape, stride);
  flow_tensor *t = flow_tensor_view_of(arena, v->ndim, v->shape, stride, 0);
  if (!t) return NULL;
  t->dtype = v->dtype;
  t->offset = offset / (int64_t)flow_dtype_size(v->dtype);
  return t;
}

typedef struct interval { int64_t lo, hi; } interval;
static int by_lo(const void *a, const void *b) {
  int64_t x = ((const interval *)a)->lo, y = ((const interval *)b)->lo;
  return (x > y) - (x < y);
}

/* Greedy packing, largest first: each value takes the lowest offset free of every packed value
 * whose lifetime overlaps its own. */
static int pack(flow_plan *p, int *cand, int ncand, flow_tensor **arena) {
  for (int i = 1; i < ncand; i++) /* insertion sort by size, descending (stable) */
    for (int j = i; j > 0 && p->v[cand[j]].bytes > p->v[cand[j - 1]].bytes; j--) {
      int x = cand[j]; cand[j] = cand[j - 1]; cand[j - 1] = x;
    }
  interval *busy = malloc((size_t)(ncand ? ncand : 1) * sizeof *busy);
  if (!busy) return flow_error_set("nn.Graph: out of memory");
  int64_t total = 0;
  for (int i = 0; i < ncand; i++) {
    pvalue *a = &p->v[cand[i]];
    int nb = 0;
    for (int j = 0; j < i; j++) {
      pvalue *b = &p->v[cand[j]];
      if (b->first_use <= a->last_use && a->first_use <= b->last_use) busy[nb++] = (interval){b->offset, b->offset + b->bytes};
    }
    qsort(busy, (size_t)nb, sizeof *busy, by_lo);
    int64_t off = 0, need = (a->bytes + ALIGN - 1) / ALIGN * ALIGN;
    for (int k = 0; k < nb; k++) {
      if (busy[k].lo >= off + need) break;
      if (busy[k].hi > off) off = (busy[k].hi + ALIGN - 1) / ALIGN * ALIGN;
    }
    a->offset = off;
    if (off + need > total) total = off + need;
    p->unpacked_bytes += need;
  }
  free(busy);
  /* the bound no packing beats: the most bytes alive at one position */
  int64_t bound = 0;
  for (int i = 0; i < ncand; i++) {
    int64_t at = 0;
    const pvalue *a = &p->v[cand[i]];
    for (int j = 0; j < ncand; j++) {
      const pvalue *b = &p->v[cand[j]];
      if (b->first_use <= a->first_use && a->first_use <= b->last_use) at += (b->bytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    if (at > bound) bound = at;
  }
  p->arena_bound += bound;
  if (ncand == 0) return 0;
  const flow_gvalue *first = &p->g->values[cand[0]];
  int64_t shape[1] = {total};
  *arena = flow_tensor_new(FLOW_U8, first->device, 1, shape);
  if (!*arena) return -1;
  p->arena_bytes += total;
  for (int i = 0; i < ncand; i++)
    if (!(p->v[cand[i]].slot[0] = arena_view(*arena, &p->g->values[cand[i]], p->v[cand[i]].offset))) return -1;
  return 0;
}

static int plan_memory(flow_plan *p, const int *pos, const bool *is_output) {
  flow_graph *g = p->g;
  /* a value's memory is its root's: views and in-place writes extend the root's lifetime, and a
   * root read on another stream than its producer's (or returned) cannot share its bytes */
  bool *shareable = malloc((size_t)(g->nvalues ? g->nvalues : 1) * sizeof *shareable);
  if (!shareable) return flow_error_set("nn.Graph: out of memory");
  for (int v = 0; v < g->nvalues; v++) {
    shareable[v] = true;
    p->v[v].first_use = p->v[v].last_use = -1;
    p->v[v].offset = -1;
  }
  for (int n = 0; n < g->nnodes; n++) {
    const flow_gnode *x = &g->nodes[n];
    if (!x->live || p->task_of[n] < 0) continue;
    int s = stream_of(x);
    for (int i = 0; i < x->nin; i++) {
      int r = flow_graph_root(g, x->in[i]);
      if (!is_compute_stream(s) || stream_of(&g->nodes[g->values[r].node]) != s) shareable[r] = false;
      if (pos[n] > p->v[r].last_use) p->v[r].last_use = pos[n];
    }
    for (int j = 0; j < x->nout; j++) {
      int v = x->out0 + j, r = flow_graph_root(g, v);
      if (is_output[v] || p->v[v].nslots > 1 || stream_of(&g->nodes[g->values[r].node]) != s) shareable[r] = false;
      if (r == v) p->v[v].first_use = pos[n];
      if (pos[n] > p->v[r].last_use) p->v[r].last_use = pos[n];
    }
  }
  int *cand = malloc((size_t)(g->nvalues ? g->nvalues : 1) * sizeof *cand);
  if (!cand) { free(shareable); return flow_error_set("nn.Graph: out of memory"); }
  int rc = 0;
  for (int dt = 0; dt < FLOW_NDEVTYPES && rc == 0; dt++)
    for (int b = 0; b < 2 && rc == 0; b++) { /* one arena per device and compute stream */
      int ncand = 0, stream = b ? FLOW_STREAM_COMPUTE_B : FLOW_STREAM_COMPUTE;
      for (int n = 0; n < g->nnodes; n++) {
        const flow_gnode *x = &g->nodes[n];
        if (!x->live || !owns_memory(x) || stream_of(x) != stream) continue;
        for (int j = 0; j < x->nout; j++) {
          int v = x->out0 + j;
          const flow_gvalue *gv = &g->values[v];
          p->v[v].bytes = value_bytes(gv);
          if ((int)gv->device.type == dt && shareable[v] && p->v[v].bytes > 0) cand[ncand++] = v;
        }
      }
      rc = pack(p, cand, ncand, &p->arena[dt][b]);
    }
  /* the rest: a buffer of their own per slot (pieces: a new one per act) */
  for (int n = 0; n < g->nnodes && rc == 0; n++) {
    const flow_gnode *x = &g->nodes[n];
    if (!x->live) continue;
    if (x->kind == FLOW_GNODE_CAPTURE) {
      p->captured_bytes += (int64_t)x->captured->storage->nbytes;
      continue;
    }
    if (!owns_memory(x)) continue;
    for (int j = 0; j < x->nout && rc == 0; j++) {
      int v = x->out0 + j;
      const flow_gvalue *gv = &g->values[v];
      for (int s = 0; s < p->v[v].nslots && rc == 0; s++) {
        if (p->v[v].slot[s]) continue;
        p->dedicated_bytes += value_bytes(gv);
        if (p->npieces > 1) p->v[v].fresh = true;
        else if (!(p->v[v].slot[s] = flow_tensor_new(gv->dtype, gv->device, gv->ndim, gv->shape))) rc = -1;
      }
    }
  }
  free(cand);
  free(shareable);
  return rc;
}

static const char *node_name(const flow_gnode *n) {
  switch (n->kind) {
  case FLOW_GNODE_INPUT: return "input";
  case FLOW_GNODE_CAPTURE: return "variable";
  case FLOW_GNODE_BOX: return "boxing";
  case FLOW_GNODE_ACC: return "acc";
  default: return n->op->name;
  }
}

flow_plan *flow_plan_build(flow_graph *g, const flow_plan_options *o) {
  int rnum = o && o->register_num > 0 ? o->register_num : 1;
  /* the pipeline-buffer pass: with pieces, an edge between streams holds `buffer` of them, so a
   * producer runs that far ahead of its consumer (a stage's forward of its backward, a compute
   * stream of its sends) */
  int crossnum = g->pieces > 1 && o && o->buffer > rnum ? o->buffer : rnum;
  int recomputed = flow_graph_recompute(g);
  if (recomputed < 0) return NULL;
  flow_graph_prune(g);
  int fused = o && o->no_fusion ? 0 : flow_graph_fuse_add_to_output(g);
  if (fused < 0) return NULL;
  flow_plan *p = calloc(1, sizeof *p);
  if (!p) { flow_error_set("nn.Graph: out of memory"); return NULL; }
  p->g = g;
  p->npieces = g->pieces > 1 ? g->pieces : 1;
  p->fused = fused;
  p->recomputed = recomputed;
  p->task_of = malloc((size_t)(g->nnodes ? g->nnodes : 1) * sizeof(int));
  p->tasks = calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof(ptask));
  p->v = calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(pvalue));
  int *pos = calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof(int));
  int *nread = calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(int));
  int *ctrl_reg = malloc((size_t)(g->nnodes ? g->nnodes : 1) * sizeof(int));
  bool *is_output = calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(bool));
  p->rt = flow_rt_new(FLOW_NSTREAMS);
  if (!p->task_of || !p->tasks || !p->v || !pos || !nread || !ctrl_reg || !is_output || !p->rt) {
    if (p->rt) flow_error_set("nn.Graph: out of memory");
    goto fail;
  }
  for (int i = 0; i < g->noutputs; i++) is_output[g->outputs[i]] = true;
  /* with pieces, a stage's backward goes before its forward when both could act (backward
   * first, as 1F1B): it frees the buffer's slots and feeds the stage before */
  if (p->npieces > 1 && flow_rt_set_nice(p->rt, FLOW_STREAM_COMPUTE, 5) != 0) goto fail;

  /* tasks, in creation (topological) order; positions count within each stream */
  int next_pos[FLOW_NSTREAMS] = {0};
  for (int n = 0; n < g->nnodes; n++) {
    const flow_gnode *x = &g->nodes[n];
    p->task_of[n] = -1;
    ctrl_reg[n] = -1;
    if (!x->live || x->kind == FLOW_GNODE_CAPTURE) continue;
    ptask *t = &p->tasks[p->ntasks];
    t->plan = p;
    t->node = n;
    t->stream = stream_of(x);
    if (x->kind == FLOW_GNODE_OP) t->attrs = x->attrs;
    t->repeat = g->pieces > 1 && x->kind == FLOW_GNODE_BOX && x->repeat;
    flow_rt_act_fn fn = x->kind == FLOW_GNODE_INPUT ? act_input
                        : x->kind == FLOW_GNODE_BOX ? act_box
                        : x->kind == FLOW_GNODE_ACC ? act_acc : act_op;
    if ((t->id = flow_rt_add_task(p->rt, t->stream, node_name(x), fn, t)) < 0) goto fail;
    pos[n] = next_pos[t->stream]++;
    p->task_of[n] = p->ntasks++;
    for (int i = 0; i < x->nin; i++) /* nread: readers, negative once one is on another stream */
      if (nread[x->in[i]] >= 0) nread[x->in[i]] = stream_of(&g->nodes[g->values[x->in[i]].node]) == t->stream ? nread[x->in[i]] + 1 : -1;
    p->global |= x->kind == FLOW_GNODE_BOX || (x->nout && g->values[x->out0].placement);
  }
  /* registers: one per value somebody reads; the rest keep one slot, outside the runtime */
  for (int n = 0; n < g->nnodes; n++) {
    const flow_gnode *x = &g->nodes[n];
    for (int j = 0; j < x->nout; j++) {
      int v = x->out0 + j;
      pvalue *pv = &p->v[v];
      pv->reg = -1;
      pv->nslots = 1;
      if (p->task_of[n] >= 0 && nread[v] != 0) {
        pv->nslots = nread[v] < 0 ? crossnum : rnum;
        pv->out_pos = 0;
        for (int k = 0; k < j; k++) pv->out_pos += p->v[x->out0 + k].reg >= 0;
        if ((pv->reg = flow_rt_add_register(p->rt, p->tasks[p->task_of[n]].id, pv->nslots)) < 0) goto fail;
      }
      if (!(pv->slot = calloc((size_t)pv->nslots, sizeof(flow_tensor *)))) { flow_error_set("nn.Graph: out of memory"); goto fail; }
    }
  }
  /* consumers, then control registers for readers on another stream than the writer after them */
  for (int n = 0; n < g->nnodes; n++) {
    const flow_gnode *x = &g->nodes[n];
    if (p->task_of[n] < 0) continue;
    ptask *t = &p->tasks[p->task_of[n]];
    if (!(t->in_pos = malloc((size_t)(x->nin ? x->nin : 1) * sizeof(int)))) { flow_error_set("nn.Graph: out of memory"); goto fail; }
    int nconsumed = 0;
    for (int i = 0; i < x->nin; i++) {
      int v = x->in[i];
      t->in_pos[i] = -1;
      for (int k = 0; k < i; k++)
        if (x->in[k] == v) t->in_pos[i] = t->in_pos[k];
      if (t->in_pos[i] >= 0 || p->v[v].reg < 0) continue;
      if (flow_rt_add_consumer(p->rt, p->v[v].reg, t->id) < 0) goto fail;
      t->in_pos[i] = nconsumed++;
    }
    for (int c = 0; c < x->nctrl; c++) {
      int k = x->ctrl[c];
      if (p->task_of[k] < 0 || p->tasks[p->task_of[k]].stream == t->stream) continue;
      if (ctrl_reg[k] < 0 && (ctrl_reg[k] = flow_rt_add_register(p->rt, p->tasks[p->task_of[k]].id, crossnum)) < 0) goto fail;
      if (flow_rt_add_consumer(p->rt, ctrl_reg[k], t->id) < 0) goto fail;
      nconsumed++;
    }
  }
  if (plan_memory(p, pos, is_output) != 0) goto fail;
  free(pos);
  free(nread);
  free(ctrl_reg);
  free(is_output);
  return p;
fail:
  free(pos);
  free(nread);
  free(ctrl_reg);
  free(is_output);
  flow_plan_free(p);
  return NULL;
}

void flow_plan_free(flow_plan *p) {
  if (!p) return;
  flow_rt_free(p->rt);
  for (int v = 0; p->v && v < p->g->nvalues; v++) {
    for (int s = 0; s < p->v[v].nslots && p->v[v].slot; s++) flow_tensor_decref(p->v[v].slot[s]);
    free(p->v[v].slot);
  }
  for (int i = 0; i < p->ntasks; i++) free(p->tasks[i].in_pos);
  for (int d = 0; d < FLOW_NDEVTYPES; d++) {
    flow_tensor_decref(p->arena[d][0]);
    flow_tensor_decref(p->arena[d][1]);
  }
  free(p->v);
  free(p->tasks);
  free(p->task_of);
  free(p);
}

void flow_plan_set_feed(flow_plan *p, int tag, double lr, int64_t step) {
  for (int i = 0; i < p->ntasks; i++)
    if (p->g->nodes[p->tasks[i].node].tag == tag) {
      p->tasks[i].attrs.lr = lr;
      p->tasks[i].attrs.k = step;
    }
}

/* ---- running ------------------------------------------------------------------------------------ */

/* Every rank learns whether any failed; the lowest failing rank's message wins. A graph of global
 * tensors is traced by every rank (SPMD), and its stages may live on different placements, so the
 * world agrees. */
static int agree_on_outcome(const flow_plan *p, int rc) {
  flow_comm *c = flow_comm_world();
  if (!p->global || !c || c->size < 2) return rc;
  long long lo, hi;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", rc == 0 ? "" : flow_error_get());
  if (c->ops->minmax(c, rc == 0 ? LLONG_MAX : c->rank, &lo, &hi) != 0) return -1;
  if (lo == LLONG_MAX) return 0;
  if (c->ops->broadcast(c, msg, sizeof msg, FLOW_U8, (int)lo) != 0) return -1;
  msg[sizeof msg - 1] = 0;
  if (strncmp(msg, "[rank ", 6) == 0) return flow_error_set("nn.Graph: %s", msg);
  return flow_error_set("nn.Graph: [rank %d] %s", (int)lo, msg);
}

/* With pieces, what the slots hold outside the arena (buffers made per act, and the views, boxing
 * results and inputs over them) goes back between runs: the next run makes its own. */
static void release_slots(flow_plan *p) {
  if (p->npieces == 1) return;
  for (int v = 0; v < p->g->nvalues; v++)
    for (int s = 0; p->v[v].offset < 0 && s < p->v[v].nslots; s++) {
      flow_tensor_decref(p->v[v].slot[s]);
      p->v[v].slot[s] = NULL;
    }
}

static int run_plan(flow_plan *p, flow_tensor *const *inputs, flow_tensor **outputs);

int flow_plan_run(flow_plan *p, flow_tensor *const *inputs, flow_tensor **outputs) {
  int rc = run_plan(p, inputs, outputs);
  release_slots(p);
  return rc;
}

static int run_plan(flow_plan *p, flow_tensor *const *inputs, flow_tensor **outputs) {
  flow_graph *g = p->g;
  for (int i = 0; i < g->noutputs; i++) outputs[i] = NULL;
  p->feed = inputs;
  if (g->rng_span) { /* fresh counters for the random ops, advancing the generator as eager would */
    flow_rng_state r = flow_rng_reserve(g->rng_span * (uint64_t)p->npieces);
    for (int i = 0; i < p->ntasks; i++) {
      const flow_gnode *n = &g->nodes[p->tasks[i].node];
      if (n->kind != FLOW_GNODE_OP || !n->op->random) continue;
      p->tasks[i].attrs.seed = r.seed;
      p->tasks[i].attrs.rng_offset = n->attrs.rng_offset - g->rng_base + r.offset;
    }
  }
  int64_t use[FLOW_NDEVTYPES], peak;
  for (int d = 0; d < FLOW_NDEVTYPES; d++) flow_mem_reset_peak((flow_devtype)d);
  int rc = flow_rt_run(p->rt, p->npieces);
  p->measured_peak = 0;
  for (int d = 0; d < FLOW_NDEVTYPES; d++) {
    flow_mem_stats((flow_devtype)d, &use[d], &peak);
    p->measured_peak += peak;
  }
  p->feed = NULL;
  if (rc != 0) flow_error_prefix("[rank %d]", flow_comm_rank());
  if (agree_on_outcome(p, rc) != 0) return -1;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const flow_gvalue *gv = &g->values[v];
    flow_tensor *src = p->v[v].reg >= 0 || p->task_of[gv->node] >= 0 ? p->v[v].slot[p->v[v].last] : captured_of(p, v);
    flow_tensor *plain = src ? flow_tensor_view_of(src, src->ndim, src->shape, src->stride, src->offset) : NULL;
    flow_tensor *copy = plain ? flow_contiguous_copy(plain) : NULL;
    flow_tensor_decref(plain);
    if (copy && gv->placement) {
      flow_global *gl = flow_global_new(gv->placement, &gv->sbp, gv->lndim, gv->lshape);
      if (!gl) { flow_tensor_decref(copy); copy = NULL; }
      else flow_global_attach(copy, gl);
    }
    if (!copy) {
      for (int k = 0; k < i; k++) { flow_tensor_decref(outputs[k]); outputs[k] = NULL; }
      if (!src) flow_error_set("nn.Graph: output %d was never produced", i + 1);
      return -1;
    }
    outputs[i] = copy;
  }
  return 0;
}

/* ---- tools -------------------------------------------------------------------------------------- */

void flow_plan_memory_of(const flow_plan *p, flow_plan_memory *m) {
  m->arena_bytes = p->arena_bytes;
  m->arena_bound = p->arena_bound;
  m->unpacked_bytes = p->unpacked_bytes;
  m->dedicated_bytes = p->dedicated_bytes;
  m->captured_bytes = p->captured_bytes;
  m->measured_peak = p->measured_peak;
}

int flow_plan_fused(const flow_plan *p) { return p->fused; }
int flow_plan_recomputed(const flow_plan *p) { return p->recomputed; }

int flow_plan_repeated(const flow_plan *p) {
  int n = 0;
  for (int i = 0; i < p->ntasks; i++) n += p->tasks[i].repeat;
  return n;
}

int flow_plan_ntasks(const flow_plan *p, int stream) {
  int n = 0;
  for (int i = 0; i < p->ntasks; i++) n += stream < 0 || p->tasks[i].stream == stream;
  return n;
}

typedef struct sbuf { char *s; size_t len, cap; } sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->s && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
    size_t cap = (b->cap + (size_t)n + 1) * 2;
    char *s = realloc(b->s, cap);
    if (!s) return;
    b->s = s;
    b->cap = cap;
  }
}

static const char *const stream_names[FLOW_NSTREAMS] = {"compute", "collective", "copy", "compute-backward",
                                                        "collective-backward"};
static const char *const stream_colors[FLOW_NSTREAMS] = {"lightblue", "orange", "palegreen", "lightskyblue", "sandybrown"};

char *flow_plan_dot(const flow_plan *p) {
  const flow_graph *g = p->g;
  sbuf b = {0};
  put(&b, "digraph plan {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=\"monospace\"];\n");
  for (int s = 0; s < FLOW_NSTREAMS; s++)
    put(&b, "  legend_%d [label=\"%s stream\", fillcolor=%s, shape=note];\n", s, stream_names[s], stream_colors[s]);
  for (int n = 0; n < g->nnodes; n++) {
    const flow_gnode *x = &g->nodes[n];
    if (!x->live) continue;
    char shape[96] = "";
    if (x->nout) {
      const flow_gvalue *v = &g->values[x->out0];
      flow_shape_str(v->ndim, v->shape, shape, sizeof shape);
    }
    if (x->kind == FLOW_GNODE_CAPTURE) {
      put(&b, "  n%d [label=\"variable %s %s\", shape=ellipse, fillcolor=white];\n", n, shape,
          flow_dtype_name(x->captured->dtype));
      continue;
    }
    int s = stream_of(x);
    char extra[160] = "";
    if (x->kind == FLOW_GNODE_BOX) {
      char a[64], c[64];
      snprintf(extra, sizeof extra, "\\n%s -> %s", flow_nd_sbp_str(&x->box.src, a, sizeof a), flow_nd_sbp_str(&x->box.dst, c, sizeof c));
    }
    put(&b, "  n%d [label=\"%s %s%s\", fillcolor=%s];\n", n, node_name(x), shape, extra, stream_colors[s]);
  }
  for (int n = 0; n < g->nnodes; n++) {
    const flow_gnode *x = &g->nodes[n];
    if (!x->live) continue;
    for (int i = 0; i < x->nin; i++) {
      int v = x->in[i];
      const pvalue *pv = &p->v[v];
      if (pv->reg >= 0) put(&b, "  n%d -> n%d [label=\"r%d x%d\"];\n", g->values[v].node, n, pv->reg, pv->nslots);
      else put(&b, "  n%d -> n%d [style=dashed];\n", g->values[v].node, n);
    }
    for (int c = 0; c < x->nctrl; c++)
      if (g->nodes[x->ctrl[c]].live) put(&b, "  n%d -> n%d [style=dotted, label=\"ctrl\"];\n", x->ctrl[c], n);
  }
  put(&b, "}\n");
  return b.s;
}

void flow_plan_trace(flow_plan *p, bool on) { flow_rt_trace(p->rt, on); }

char *flow_plan_trace_events(const flow_plan *p, int rank) {
  const flow_rt_event *ev;
  int n = flow_rt_events(p->rt, &ev);
  sbuf b = {0};
  put(&b, "%s", "");
  for (int i = 0; i < n; i++)
    put(&b, "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"piece\":%lld}}",
        i ? ",\n" : "", flow_rt_task_name(p->rt, ev[i].task), rank, stream_names[ev[i].stream], (double)ev[i].t0_ns / 1e3,
        (double)(ev[i].t1_ns - ev[i].t0_ns) / 1e3, (long long)ev[i].piece);
  return b.s;
}
