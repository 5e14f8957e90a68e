/* Index ops: gather, scatter_add, index_select and embedding, with their shape and gradient rules.
 * gather and scatter_add are each other's gradient; index_select and embedding's backward are
 * scatter_adds with the index broadcast (stride 0) over the non-indexed axes. */
#include "index.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu.h"
#include "../kernels/cpu/index.h"
#include "../sbp/global.h"
#include "../sbp/signature.h"
#include "elementwise.h"
#include "shape.h"

static int check_index(const flow_op *op, const flow_meta *idx, const char *what) {
  if (idx->dtype != FLOW_I64)
    return flow_error_set("%s: %s must be an int64 tensor (got %s)", op->name, what, flow_dtype_name(idx->dtype));
  return 0;
}

/* A 0-d zero expanded (stride 0) costs no memory; scatter_add's fresh output is the only full-size
 * tensor. */
flow_tensor *flow_scatter_into_zeros(const flow_meta *m, int64_t axis, flow_tensor *idx, flow_tensor *src) {
  flow_tensor *zero = flow_scalar_tensor(0, m->dtype, m->device);
  flow_tensor *z = zero ? flow_expand(zero, m->ndim, m->shape) : NULL;
  flow_tensor *r = z ? flow_scatter_add(z, axis, idx, src) : NULL;
  flow_tensor_decref(zero);
  flow_tensor_decref(z);
  return r;
}

/* idx (int64) must have t's rank and fit t outside axis. */
static int check_gather_shapes(const flow_op *op, const flow_meta *t, const flow_meta *idx, int64_t axis,
                               int64_t *ax) {
  char s0[128], s1[128];
  if (check_index(op, idx, "index") != 0) return -1;
  if (t->ndim == 0) return flow_error_set("%s: the input must have at least 1 dimension", op->name);
  if (flow_axis_norm(op->name, axis, t->ndim, ax) != 0) return -1;
  bool ok = idx->ndim == t->ndim;
  for (int d = 0; ok && d < t->ndim; d++) ok = d == *ax || idx->shape[d] <= t->shape[d];
  if (!ok)
    return flow_error_set("%s: index of shape %s does not fit the input of shape %s (same rank, and no larger "
                          "outside axis %lld)", op->name, flow_shape_str(idx->ndim, idx->shape, s0, sizeof s0),
                          flow_shape_str(t->ndim, t->shape, s1, sizeof s1), (long long)*ax);
  return 0;
}

static int axis_of(int64_t axis, int ndim) { return (int)(axis < 0 ? axis + ndim : axis); }

/* ---- gather ---------------------------------------------------------------------------------- */

static int infer_gather(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)nin;
  int64_t ax;
  if (check_gather_shapes(op, &in[0], &in[1], a->axis, &ax) != 0) return -1;
  *out = in[1];
  out->dtype = in[0].dtype;
  return 0;
}

static FLOW_KERNEL(cpu_gather) {
  (void)nin; (void)nout;
  return flow_cpu_gather(out[0], in[0], in[1], axis_of(a->axis, in[0]->ndim));
}

static int grad_gather(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_scatter_into_zeros(&c->in_meta[0], c->attrs->axis, c->in[1], c->gout[0]);
  return gin[0] ? 0 : -1;
}

FLOW_OP(gather) {.nin = 2, .nout = 1, .cpu_half = true, .infer = infer_gather,
                 .grad = grad_gather, .save_in = 2, .nondiff_in = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, gather, cpu_gather)

flow_tensor *flow_gather(flow_tensor *t, int64_t axis, flow_tensor *idx) {
  flow_tensor *in[2] = {t, idx};
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  return flow_op_call1(&flow_op_gather, in, 2, &at);
}

/* ---- scatter_add ----------------------------------------------------------------------------- */

static int infer_scatter_add(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                             flow_meta *out) {
  (void)nin;
  int64_t ax;
  const flow_meta *t = &in[0], *idx = &in[1], *src = &in[2];
  if (check_gather_shapes(op, t, idx, a->axis, &ax) != 0) return -1;
  if (src->dtype != t->dtype)
    return flow_error_set("%s: dtype mismatch: input is %s, src is %s", op->name, flow_dtype_name(t->dtype),
                          flow_dtype_name(src->dtype));
  if (!flow_dtype_is_float(t->dtype) && t->dtype != FLOW_I64 && t->dtype != FLOW_I32)
    return flow_error_set("%s: unsupported dtype %s (expected a floating-point, int64 or int32 tensor)", op->name,
                          flow_dtype_name(t->dtype));
  if (!flow_shape_eq(idx->ndim, idx->shape, src->ndim, src->shape)) {
    char s0[128], s1[128];
    return flow_error_set("%s: index shape %s and src shape %s must be equal", op->name,
                          flow_shape_str(idx->ndim, idx->shape, s0, sizeof s0),
                          flow_shape_str(src->ndim, src->shape, s1, sizeof s1));
  }
  *out = *t;
  return 0;
}

static FLOW_KERNEL(cpu_scatter_add) {
  (void)nin; (void)nout;
  if (flow_cpu_copy(out[0], in[0]) != 0) return -1;
  return flow_cpu_scatter_add(out[0], in[1], in[2], axis_of(a->axis, in[0]->ndim));
}

/* out = t + scatter(src): dt = g, dsrc = g gathered at the scattered positions. */
static int grad_scatter_add(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  if (c->need[0]) { gin[0] = g; flow_tensor_incref(g); }
  if (c->need[2] && !(gin[2] = flow_gather(g, c->attrs->axis, c->in[1]))) return -1;
  return 0;
}

FLOW_OP(scatter_add) {.nin = 3, .nout = 1, .sbp = FLOW_SBP_RULE(scatter_add, 0),
                      .infer = infer_scatter_add, .grad = grad_scatter_add, .save_in = 2,
                      .nondiff_in = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, scatter_add, cpu_scatter_add)

flow_tensor *flow_scatter_add(flow_tensor *t, int64_t axis, flow_tensor *idx, flow_tensor *src) {
  flow_tensor *in[3] = {t, idx, src};
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  return flow_op_call1(&flow_op_scatter_add, in, 3, &at);
}

/* ---- index_select: a gather with the 1-D index broadcast over the other axes ---------------- */

static int infer_index_select(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                              flow_meta *out) {
  (void)nin;
  int64_t ax;
  if (check_index(op, &in[1], "index") != 0) return -1;
  if (in[1].ndim != 1) {
    char s[128];
    return flow_error_set("%s: index must be 1-D (got shape %s)", op->name,
                          flow_shape_str(in[1].ndim, in[1].shape, s, sizeof s));
  }
  if (in[0].ndim == 0) return flow_error_set("%s: the input must have at least 1 dimension", op->name);
  if (flow_axis_norm(op->name, a->axis, in[0].ndim, &ax) != 0) return -1;
  *out = in[0];
  out->shape[ax] = in[1].shape[0];
  return 0;
}

/* idx seen with shape `shape` (which has idx's length on axis): stride 0 everywhere else. */
static flow_tensor broadcast_index(const flow_tensor *idx, int ndim, const int64_t *shape, int axis) {
  flow_tensor e = *idx;
  e.ndim = ndim;
  for (int d = 0; d < ndim; d++) {
    e.shape[d] = shape[d];
    e.stride[d] = d == axis ? idx->stride[0] : 0;
  }
  return e;
}

static FLOW_KERNEL(cpu_index_select) {
  (void)nin; (void)nout;
  int axis = axis_of(a->axis, in[0]->ndim);
  flow_tensor e = broadcast_index(in[1], out[0]->ndim, out[0]->shape, axis);
  return flow_cpu_gather(out[0], in[0], &e, axis);
}

static int grad_index_select(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g || !c->need[0]) return 0;
  int axis = axis_of(c->attrs->axis, g->ndim);
  int64_t shape[FLOW_MAX_DIMS];
  for (int d = 0; d < g->ndim; d++) shape[d] = d == axis ? g->shape[d] : 1;
  flow_tensor *r = flow_reshape(c->in[1], g->ndim, shape);
  flow_tensor *e = r ? flow_expand(r, g->ndim, g->shape) : NULL;
  gin[0] = e ? flow_scatter_into_zeros(&c->in_meta[0], axis, e, g) : NULL;
  flow_tensor_decref(r);
  flow_tensor_decref(e);
  return gin[0] ? 0 : -1;
}

FLOW_OP(index_select) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(index_select, 0),
                       .infer = infer_index_select, .grad = grad_index_select, .save_in = 2,
                       .nondiff_in = 2};
FLOW_KERNEL_REGISTER(FLOW_CPU, index_select, cpu_index_select)

/* int32 indices (which torch takes for index_select and embedding) as int64, the ops' index dtype. */
static flow_tensor *as_int64(flow_tensor *idx) {
  if (idx->dtype == FLOW_I32) return flow_cast(idx, FLOW_I64);
  flow_tensor_incref(idx);
  return idx;
}

flow_tensor *flow_index_select(flow_tensor *t, int64_t axis, flow_tensor *idx) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  flow_tensor *i64 = as_int64(idx);
  flow_tensor *r = i64 ? flow_op_call1(&flow_op_index_select, (flow_tensor *[]){t, i64}, 2, &at) : NULL;
  flow_tensor_decref(i64);
  return r;
}

/* ---- embedding ------------------------------------------------------------------------------- */

static int infer_embedding(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                           flow_meta *out) {
  (void)nin; (void)a;
  const flow_meta *ids = &in[0], *w = &in[1];
  char s[128];
  if (check_index(op, ids, "ids") != 0) return -1;
  if (w->ndim != 2)
    return flow_error_set("%s: weight must be 2-D [V, D] (got shape %s)", op->name,
                          flow_shape_str(w->ndim, w->shape, s, sizeof s));
  if (ids->ndim + 1 > FLOW_MAX_DIMS)
    return flow_error_set("%s: ids may have at most %d dimensions", op->name, FLOW_MAX_DIMS - 1);
  *out = *ids;
  out->dtype = w->dtype;
  out->shape[out->ndim++] = w->shape[1];
  return 0;
}

/* A vocab shard (set only by the global dispatcher: nlogical == 2): weight holds rows
 * [start, start + rows) of a [V, D] table. Ids are checked against V; ids outside the shard give
 * zero rows, so the sum over the shards is the full lookup. */
static int cpu_embedding_shard(flow_tensor *out, const flow_tensor *ids, const flow_tensor *w, const flow_attrs *a) {
  int64_t vocab = a->logical_shape[0], rows = w->shape[0], n = flow_tensor_numel(ids);
  int64_t row_bytes = w->shape[1] * (int64_t)flow_dtype_size(out->dtype);
  if (!flow_tensor_is_contiguous(out))
    return flow_error_set("embedding: a vocab shard's output must be contiguous");
  flow_tensor *loc = flow_tensor_new(FLOW_I64, ids->device, ids->ndim, ids->shape);
  if (!loc) return -1;
  int rc = flow_cpu_copy(loc, ids);
  int64_t *v = flow_tensor_data(loc);
  bool *outside = rc == 0 ? malloc((size_t)(n > 0 ? n : 1)) : NULL;
  if (rc == 0 && !outside) rc = flow_error_set("embedding: out of memory");
  for (int64_t e = 0; rc == 0 && e < n; e++) {
    if (v[e] < 0 || v[e] >= vocab)
      rc = flow_error_set("embedding: index %lld out of range [0, %lld) (the rows of weight)", (long long)v[e],
                          (long long)vocab);
    v[e] -= a->start;
    outside[e] = v[e] < 0 || v[e] >= rows;
    if (outside[e]) v[e] = 0;
  }
  if (rc == 0 && rows > 0) rc = flow_cpu_embedding(out, loc, w);
  char *po = flow_tensor_data(out);
  for (int64_t e = 0; rc == 0 && e < n; e++)
    if (outside[e]) memset(po + e * row_bytes, 0, (size_t)row_bytes);
  free(outside);
  flow_tensor_decref(loc);
  return rc;
}

static FLOW_KERNEL(cpu_embedding) {
  (void)nin; (void)nout;
  if (a->nlogical == 2) return cpu_embedding_shard(out[0], in[0], in[1], a);
  return flow_cpu_embedding(out[0], in[0], in[1]);
}

/* dweight[v] = sum of g rows whose id is v: a scatter_add along axis 0 of g seen as [N, D],
 * with the ids broadcast across D. */
static int grad_embedding(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g || !c->need[1]) return 0;
  int64_t n = flow_shape_numel(c->in_meta[0].ndim, c->in_meta[0].shape), dim = c->in_meta[1].shape[1];
  int64_t col[2] = {n, 1}, rows[2] = {n, dim};
  flow_tensor *ids = flow_reshape(c->in[0], 2, col);
  flow_tensor *e = ids ? flow_expand(ids, 2, rows) : NULL;
  flow_tensor *g2 = e ? flow_reshape(g, 2, rows) : NULL;
  gin[1] = g2 ? flow_scatter_into_zeros(&c->in_meta[1], 0, e, g2) : NULL;
  flow_tensor_decref(ids);
  flow_tensor_decref(e);
  flow_tensor_decref(g2);
  return gin[1] ? 0 : -1;
}

/* A vocab-split table: the kernel looks up only the ids inside its rows [start, start+rows). */
static void shard_embedding(const flow_op *op, const flow_shard_ctx *c, flow_attrs *local) {
  (void)op;
  const flow_meta *w = &c->in[1];
  int64_t wstart[FLOW_MAX_DIMS], wbox[FLOW_MAX_DIMS];
  flow_global_box(c->placement, &c->in_sbp[1], w->ndim, w->shape, c->placement->coord, -1, wstart, wbox);
  if (w->ndim == 2 && wbox[0] != w->shape[0]) {
    local->start = wstart[0];
    local->nlogical = 2;
    memcpy(local->logical_shape, w->shape, 2 * sizeof(int64_t));
  }
}

FLOW_OP(embedding) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(embedding, 0),
                    .shard = shard_embedding, .infer = infer_embedding, .grad = grad_embedding, .save_in = 1,
                    .nondiff_in = 1};
FLOW_KERNEL_REGISTER(FLOW_CPU, embedding, cpu_embedding)

flow_tensor *flow_embedding(flow_tensor *ids, flow_tensor *weight) {
  flow_attrs at;
  flow_attrs_init(&at);
  flow_tensor *i64 = as_int64(ids);
  flow_tensor *r = i64 ? flow_op_call1(&flow_op_embedding, (flow_tensor *[]){i64, weight}, 2, &at) : NULL;
  flow_tensor_decref(i64);
  return r;
}
