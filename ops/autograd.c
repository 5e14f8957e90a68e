/* Reverse-mode autograd (see autograd.h). */
#include "autograd.h"

#include <stdlib.h>
#include <string.h>

#include "elementwise.h"

typedef struct edge {
  struct flow_node *node;   /* producer of this input, or NULL */
  int index;                /* which output of node */
  flow_tensor *leaf;        /* leaf tensor to accumulate into (requires_grad, no grad_fn) */
} edge;

typedef struct flow_node {
  int refcount;
  const flow_op *op;
  flow_attrs attrs;
  int nin, nout;
  bool released;            /* saved tensors dropped after a backward without retain_graph */
  flow_tensor **saved_in, **saved_out;
  uint64_t *in_version, *out_version;
  flow_meta *in_meta, *out_meta;
  bool *need;
  edge *next;
  /* backward bookkeeping */
  int deps;
  flow_tensor **gbuf;
  struct flow_node *queue_next;
} flow_node;

static _Thread_local bool grad_on = true;
static _Thread_local double seed_scale = 1;
static flow_leaf_grad_hook leaf_hook;

bool flow_grad_enabled(void) { return grad_on; }
bool flow_grad_set_enabled(bool on) { bool prev = grad_on; grad_on = on; return prev; }
void flow_autograd_set_leaf_hook(flow_leaf_grad_hook hook) { leaf_hook = hook; }
double flow_autograd_set_seed_scale(double s) { double prev = seed_scale; seed_scale = s; return prev; }

static void drop_saved(flow_node *n) {
  for (int i = 0; i < n->nin; i++) { flow_tensor_decref(n->saved_in[i]); n->saved_in[i] = NULL; }
  for (int j = 0; j < n->nout; j++) { flow_tensor_decref(n->saved_out[j]); n->saved_out[j] = NULL; }
  n->released = true;
}

/* Freeing a node drops its producers; done with a worklist so long chains don't recurse. */
static void node_decref(flow_node *n) {
  flow_node *work = NULL;
  if (n && --n->refcount == 0) { n->queue_next = work; work = n; }
  while (work) {
    flow_node *cur = work;
    work = cur->queue_next;
    drop_saved(cur);
    for (int i = 0; i < cur->nin; i++) {
      flow_node *p = cur->next[i].node;
      if (p && --p->refcount == 0) { p->queue_next = work; work = p; }
      flow_tensor_decref(cur->next[i].leaf);
    }
    free(cur);
  }
}

const char *flow_autograd_op_name(const flow_tensor *t) { return t->grad_fn ? t->grad_fn->op->name : NULL; }

void flow_autograd_release(flow_tensor *t) {
  if (t->grad_fn) node_decref(t->grad_fn);
  t->grad_fn = NULL;
  flow_tensor_decref(t->grad);
  t->grad = NULL;
}

/* core/tensor.c releases grad_fn and grad through this hook when a tensor's last reference goes */
__attribute__((constructor)) static void install_release_hook(void) { flow_tensor_set_release_hook(flow_autograd_release); }

int flow_autograd_record(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                         flow_tensor *const *out, int nout) {
  bool any = false;
  for (int i = 0; i < nin; i++)
    any |= in[i]->requires_grad && !((op->nondiff_in >> i) & 1);
  if (!any) return 0;
  /* one allocation, carved into the per-input and per-output arrays */
  size_t sz = sizeof(flow_node) + (size_t)nin * (sizeof(flow_tensor *) + sizeof(uint64_t) +
              sizeof(flow_meta) + sizeof(bool) + sizeof(edge)) +
              (size_t)nout * (2 * sizeof(flow_tensor *) + sizeof(uint64_t) + sizeof(flow_meta)) + 64;
  flow_node *n = calloc(1, sz);
  if (!n) return flow_error_set("%s: out of memory recording autograd", op->name);
  char *p = (char *)(n + 1);
#define CARVE(field, count) n->field = (void *)p; p += (count) * sizeof(*n->field); \
  p = (char *)(((uintptr_t)p + 7) & ~(uintptr_t)7)
  n->refcount = 1;
  n->op = op;
  n->attrs = *a;
  n->nin = nin;
  n->nout = nout;
  n->saved_in = (flow_tensor **)p; p += (size_t)nin * sizeof(flow_tensor *);
  CARVE(saved_out, nout);
  CARVE(gbuf, nout);
  CARVE(in_version, nin);
  CARVE(out_version, nout);
  CARVE(in_meta, nin);
  CARVE(out_meta, nout);
  CARVE(next, nin);
  CARVE(need, nin);
#undef CARVE
  for (int i = 0; i < nin; i++) {
    flow_meta_from(&n->in_meta[i], in[i]);
    n->need[i] = in[i]->requires_grad && !((op->nondiff_in >> i) & 1);
    if ((op->save_in >> i) & 1) {
      n->saved_in[i] = flow_tensor_alias(in[i]);
      n->in_version[i] = flow_tensor_version(in[i]);
    }
    if (!n->need[i]) continue;
    if (in[i]->grad_fn) {
      n->next[i].node = in[i]->grad_fn;
      n->next[i].index = in[i]->out_index;
      in[i]->grad_fn->refcount++;
    } else {
      n->next[i].leaf = in[i];
      flow_tensor_incref(in[i]);
    }
  }
  for (int j = 0; j < nout; j++) {
    flow_meta_from(&n->out_meta[j], out[j]);
    if ((op->save_out >> j) & 1) {
      n->saved_out[j] = flow_tensor_alias(out[j]);
      n->out_version[j] = flow_tensor_version(out[j]);
    }
    /* every output holds the node; for integer outputs (indices) no gradient flows */
    if (!flow_dtype_is_float(out[j]->dtype)) continue;
    if (out[j]->grad_fn) node_decref(out[j]->grad_fn); /* views re-recorded in place */
    out[j]->grad_fn = n;
    out[j]->out_index = j;
    out[j]->requires_grad = true;
    n->refcount++;
  }
  node_decref(n); /* drop the creation reference: outputs own it now */
  return 0;
}

/* Is t a gradient nobody else sees: this reference is its only one, it owns its whole storage
 * (no view shares it; the bf16 cache's references are no views: its copies match only the version
 * they were made from, and an in-place add bumps it), it is dense, real (not a value being traced)
 * and local? Such a tensor may be added into in place, or kept as a leaf's .grad without a copy. */
static bool exclusive(const flow_tensor *t) {
  return t->refcount == 1 && !t->global && !t->lazy && !t->grad_fn && t->storage &&
         flow_storage_users(t->storage) == 1 && t->offset == 0 && flow_tensor_is_contiguous(t) &&
         t->storage->nbytes == (size_t)flow_tensor_numel(t) * flow_dtype_size(t->dtype);
}

/* acc := acc + g (new reference in *acc); g is consumed. An accumulator nobody else sees takes g
 * in place: no new buffer per contribution. */
static int accumulate(flow_tensor **acc, flow_tensor *g) {
  if (!*acc) { *acc = g; return 0; }
  if (exclusive(*acc) && g->dtype == (*acc)->dtype && !g->global &&
      flow_shape_eq(g->ndim, g->shape, (*acc)->ndim, (*acc)->shape)) {
    int rc = flow_add_inplace(*acc, g);
    flow_tensor_decref(g);
    return rc;
  }
  flow_tensor *sum = flow_add(*acc, g);
  flow_tensor_decref(g);
  if (!sum) return -1;
  flow_tensor_decref(*acc);
  *acc = sum;
  return 0;
}

static int accumulate_leaf(flow_tensor *leaf, flow_tensor *g) {
  if (leaf_hook) {
    flow_tensor *h = leaf_hook(leaf, g);
    flow_tensor_decref(g);
    if (!h) return -1;
    g = h;
  }
  if (!flow_shape_eq(g->ndim, g->shape, leaf->ndim, leaf->shape)) {
    char a[128], b[128];
    flow_tensor_decref(g);
    return flow_error_set("backward: gradient of shape %s for a leaf of shape %s",
                          flow_shape_str(g->ndim, g->shape, a, sizeof a),
                          flow_shape_str(leaf->ndim, leaf->shape, b, sizeof b));
  }
  /* the stored grad is never an alias of a live tensor: later accumulation may be in place */
  if (!leaf->grad && exclusive(g) && g->dtype == leaf->dtype) {
    leaf->grad = g;
    return 0;
  }
  if (!leaf->grad) {
    flow_tensor *c = flow_contiguous_copy(g);
    flow_tensor_decref(g);
    if (!c) return -1;
    leaf->grad = c;
    return 0;
  }
  int rc = flow_add_inplace(leaf->grad, g);
  flow_tensor_decref(g);
  return rc;
}

static int check_versions(flow_node *n) {
  if (n->released)
    return flow_error_set("backward: trying to backward through %s a second time; its saved tensors "
                          "were freed (pass retain_graph = true to the first backward)", n->op->name);
  for (int i = 0; i < n->nin; i++)
    if (n->saved_in[i] && flow_tensor_version(n->saved_in[i]) != n->in_version[i])
      return flow_error_set("backward: input %d of %s, needed for its gradient, was modified by an "
                            "in-place operation", i + 1, n->op->name);
  for (int j = 0; j < n->nout; j++)
    if (n->saved_out[j] && flow_tensor_version(n->saved_out[j]) != n->out_version[j])
      return flow_error_set("backward: output %d of %s, needed for its gradient, was modified by an "
                            "in-place operation", j + 1, n->op->name);
  return 0;
}

/* Collect the nodes reachable from root and count, for each, how many edges point at it. */
static int collect(flow_node *root, flow_node ***list, int *count) {
  int cap = 64, n = 0, sp = 0, scap = 64;
  flow_node **all = malloc(cap * sizeof *all), **stack = malloc(scap * sizeof *stack);
  if (!all || !stack) { free(all); free(stack); return flow_error_set("backward: out of memory"); }
  root->deps = -1; /* -1 marks "not yet seen" after the reset below */
  stack[sp++] = root;
  root->deps = 0;
  all[n++] = root;
  while (sp) {
    flow_node *cur = stack[--sp];
    for (int i = 0; i < cur->nin; i++) {
      flow_node *p = cur->next[i].node;
      if (!p) continue;
      if (p->gbuf[0] == (flow_tensor *)p) { p->deps++; continue; } /* seen marker */
      p->gbuf[0] = (flow_tensor *)p;
      p->deps = 1;
      if (n == cap) { cap *= 2; flow_node **q = realloc(all, cap * sizeof *all); if (!q) goto oom; all = q; }
      if (sp == scap) { scap *= 2; flow_node **q = realloc(stack, scap * sizeof *stack); if (!q) goto oom; stack = q; }
      all[n++] = p;
      stack[sp++] = p;
    }
  }
  for (int k = 0; k < n; k++) all[k]->gbuf[0] = NULL;
  free(stack);
  *list = all;
  *count = n;
  return 0;
oom:
  for (int k = 0; k < n; k++) all[k]->gbuf[0] = NULL;
  free(all);
  free(stack);
  return flow_error_set("backward: out of memory");
}

static int run_node(flow_node *n) {
  if (check_versions(n) != 0) return -1;
  flow_tensor *small[32] = {0}, **gin = small;
  if (n->nin > 16 && !(gin = calloc(2 * (size_t)n->nin, sizeof *gin)))
    return flow_error_set("backward: out of memory for the gradients of %s", n->op->name);
  flow_tensor **acc = gin + n->nin;
  for (int i = 0; i < n->nin; i++) {
    edge *e = &n->next[i];
    flow_tensor *a = n->need[i] && e->node ? e->node->gbuf[e->index] : NULL;
    acc[i] = a && exclusive(a) ? a : NULL;
  }
  flow_grad_ctx c = {n->op, &n->attrs, n->nin, n->nout, n->saved_in, n->saved_out,
                     n->in_meta, n->out_meta, n->gbuf, n->need, acc};
  if (n->op->grad(&c, gin) != 0) {
    for (int i = 0; i < n->nin; i++) flow_tensor_decref(gin[i]);
    if (gin != small) free(gin);
    return flow_error_prefix("backward of %s", n->op->name);
  }
  int rc = 0;
  for (int i = 0; i < n->nin; i++) {
    flow_tensor *g = gin[i];
    if (!g) continue;
    if (rc != 0 || !n->need[i]) { flow_tensor_decref(g); continue; }
    edge *e = &n->next[i];
    if (e->node) rc = accumulate(&e->node->gbuf[e->index], g);
    else rc = accumulate_leaf(e->leaf, g);
  }
  if (gin != small) free(gin);
  return rc;
}

/* Deferred backward calls (in call order), with the seed scale each was made under. */
typedef struct deferred {
  flow_tensor *t, *grad;
  bool retain;
  double scale;
  struct deferred *next;
} deferred;
static _Thread_local bool deferring;
static _Thread_local deferred *dhead, *dtail;

bool flow_autograd_defer(bool on) {
  bool prev = deferring;
  deferring = on;
  return prev;
}

int flow_autograd_run_deferred(void) {
  bool prev = deferring;
  deferring = false;
  int rc = 0;
  while (dhead) {
    deferred *d = dhead;
    dhead = d->next;
    if (!dhead) dtail = NULL;
    double s = flow_autograd_set_seed_scale(d->scale);
    if (rc == 0) rc = flow_backward(d->t, d->grad, d->retain);
    flow_autograd_set_seed_scale(s);
    flow_tensor_decref(d->t);
    flow_tensor_decref(d->grad);
    free(d);
  }
  deferring = prev;
  return rc;
}

int flow_backward(flow_tensor *t, flow_tensor *grad, bool retain_graph) {
  if (deferring && t->requires_grad) {
    deferred *d = malloc(sizeof *d);
    if (!d) return flow_error_set("backward: out of memory");
    *d = (deferred){t, grad, retain_graph, seed_scale, NULL};
    flow_tensor_incref(t);
    if (grad) flow_tensor_incref(grad);
    if (dtail) dtail->next = d;
    else dhead = d;
    dtail = d;
    return 0;
  }
  if (!t->requires_grad)
    return flow_error_set("backward: the tensor does not require grad and has no grad_fn");
  flow_tensor *g0 = grad;
  if (!g0) {
    if (flow_tensor_numel(t) != 1 && !t->global) {
      char s[128];
      return flow_error_set("backward: grad can be created implicitly only for one-element outputs "
                            "(got shape %s); pass a gradient", flow_shape_str(t->ndim, t->shape, s, sizeof s));
    }
    g0 = flow_ones_like(t);
    if (g0 && seed_scale != 1) {
      flow_tensor *scaled = flow_mul_scalar(g0, seed_scale);
      flow_tensor_decref(g0);
      g0 = scaled;
    }
    if (!g0) return -1;
  } else {
    if (!flow_shape_eq(grad->ndim, grad->shape, t->ndim, t->shape)) {
      char a[128], b[128];
      return flow_error_set("backward: gradient shape %s does not match the tensor's shape %s",
                            flow_shape_str(grad->ndim, grad->shape, a, sizeof a),
                            flow_shape_str(t->ndim, t->shape, b, sizeof b));
    }
    /* a gradient of another dtype is cast to the tensor's, as torch's engine does (an int64
     * gradient read as float32 had summed its bits) */
    if (grad->dtype != t->dtype) {
      if (!(g0 = flow_cast(grad, t->dtype))) return flow_error_prefix("backward");
    } else {
      flow_tensor_incref(g0);
    }
  }
  bool prev = flow_grad_set_enabled(false);
  int rc = 0;
  if (!t->grad_fn) { /* a leaf */
    rc = accumulate_leaf(t, g0);
    flow_grad_set_enabled(prev);
    return rc;
  }
  flow_node **all = NULL;
  int count = 0;
  if (collect(t->grad_fn, &all, &count) != 0) { flow_tensor_decref(g0); flow_grad_set_enabled(prev); return -1; }
  t->grad_fn->gbuf[t->out_index] = g0;
  /* ready queue (LIFO): a node runs once every consumer has delivered its gradient */
  flow_node *ready = t->grad_fn;
  ready->queue_next = NULL;
  while (ready && rc == 0) {
    flow_node *n = ready;
    ready = n->queue_next;
    rc = run_node(n);
    for (int j = 0; j < n->nout; j++) { flow_tensor_decref(n->gbuf[j]); n->gbuf[j] = NULL; }
    for (int i = 0; i < n->nin && rc == 0; i++) {
      flow_node *p = n->next[i].node;
      if (p && --p->deps == 0) { p->queue_next = ready; ready = p; }
    }
  }
  for (int k = 0; k < count; k++) {
    for (int j = 0; j < all[k]->nout; j++) { flow_tensor_decref(all[k]->gbuf[j]); all[k]->gbuf[j] = NULL; }
    if (!retain_graph) drop_saved(all[k]);
  }
  free(all);
  flow_grad_set_enabled(prev);
  return rc;
}
