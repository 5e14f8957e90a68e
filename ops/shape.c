/* Shape and view ops: view/reshape, expand, permute/transpose, narrow/select, squeeze/unsqueeze/
 * flatten, cat/stack, tril/triu. Each view's gradient maps the output gradient back to the
 * input's geometry. */
#include "shape.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/shape.h"
#include "../sbp/global.h"
#include "../sbp/signature.h"
#include "elementwise.h"
#include "reduce.h"

/* Infer one -1 and check the element count; names the op in errors. */
/* The target shape with its -1 resolved, for a tensor of shape (tnd, tshape). */
static int resolve_shape(const char *op, int tnd, const int64_t *tshape, int ndim, const int64_t *in, int64_t *out) {
  int64_t known = 1;
  int infer = -1;
  for (int i = 0; i < ndim; i++) {
    if (in[i] == -1) {
      if (infer >= 0) return flow_error_set("%s: only one size may be -1", op);
      infer = i;
    } else if (in[i] < 0) return flow_error_set("%s: negative size %lld", op, (long long)in[i]);
    else known *= in[i];
    out[i] = in[i];
  }
  int64_t n = flow_shape_numel(tnd, tshape);
  if (infer >= 0) {
    if (known == 0 || n % known != 0) goto bad;
    out[infer] = n / known;
  } else if (known != n) goto bad;
  return 0;
bad:;
  char a[128], b[128];
  return flow_error_set("%s: cannot view a tensor of shape %s (%lld elements) as %s", op,
                        flow_shape_str(tnd, tshape, a, sizeof a), (long long)n,
                        flow_shape_str(ndim, in, b, sizeof b));
}

/* Chunks of input axes that are contiguous with each other may be regrouped freely; a view
 * exists when every output axis falls inside one such chunk (the rule ATen uses). */
bool flow_view_strides(const flow_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
  if (t->ndim == 0 || flow_tensor_numel(t) == 0) {
    flow_contiguous_strides(ndim, shape, stride);
    return true;
  }
  int view_d = ndim - 1;
  int64_t base = t->stride[t->ndim - 1], tensor_n = 1, view_n = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    tensor_n *= t->shape[d];
    if (d == 0 || (t->shape[d - 1] != 1 && t->stride[d - 1] != tensor_n * base)) {
      while (view_d >= 0 && (view_n < tensor_n || shape[view_d] == 1)) {
        stride[view_d] = view_n * base;
        view_n *= shape[view_d];
        view_d--;
      }
      if (view_n != tensor_n) return false;
      if (d > 0) {
        base = t->stride[d - 1];
        tensor_n = 1;
        view_n = 1;
      }
    }
  }
  return view_d == -1;
}

static int infer_view(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)nin;
  *out = in[0];
  out->ndim = a->nshape;
  if (a->nshape > FLOW_MAX_DIMS) return flow_error_set("%s: at most %d dimensions", op->name, FLOW_MAX_DIMS);
  return resolve_shape(op->name, in[0].ndim, in[0].shape, a->nshape, a->shape, out->shape);
}

static FLOW_KERNEL(kernel_view) {
  (void)nin; (void)nout;
  int64_t shape[FLOW_MAX_DIMS], st[FLOW_MAX_DIMS];
  if (resolve_shape("view", in[0]->ndim, in[0]->shape, a->nshape, a->shape, shape) != 0) return -1;
  if (!flow_view_strides(in[0], a->nshape, shape, st)) { /* strides are not metadata: checked here */
    char s[128];
    return flow_error_set("view: the tensor's strides do not allow a view as %s (use reshape, which copies)",
                          flow_shape_str(a->nshape, shape, s, sizeof s));
  }
  out[0] = flow_tensor_view_of(in[0], a->nshape, shape, st, in[0]->offset);
  return out[0] ? 0 : -1;
}

/* Shape attrs are logical: on a shard the kernel makes this rank's box of the output (view,
 * expand, narrow_backward). */
static void shard_target_shape(const flow_op *op, const flow_shard_ctx *c, flow_attrs *local) {
  (void)op;
  int64_t start[FLOW_MAX_DIMS];
  flow_global_box(c->placement, &c->out_sbp[0], c->out[0].ndim, c->out[0].shape, c->placement->coord, -1,
                  start, local->shape);
  local->nshape = c->out[0].ndim;
}

static int grad_view(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_reshape(c->gout[0], c->in_meta[0].ndim, c->in_meta[0].shape);
  return gin[0] ? 0 : -1;
}

FLOW_OP(view) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(view, 0),
               .shard = shard_target_shape, .dense_shards = true, .kind = FLOW_OP_VIEW, .infer = infer_view,
               .grad = grad_view};
FLOW_KERNEL_REGISTER(FLOW_CPU, view, kernel_view)
FLOW_KERNEL_REGISTER(FLOW_CUDA, view, kernel_view)

flow_tensor *flow_reshape(flow_tensor *t, int ndim, const int64_t *shape) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (ndim > FLOW_MAX_DIMS) { flow_error_set("reshape: at most %d dimensions", FLOW_MAX_DIMS); return NULL; }
  at.nshape = ndim;
  for (int i = 0; i < ndim; i++) at.shape[i] = shape[i];
  if (t->global) return flow_op_call1(&flow_op_view, &t, 1, &at); /* the global layer reshapes shards */
  int64_t resolved[FLOW_MAX_DIMS], st[FLOW_MAX_DIMS];
  if (resolve_shape("reshape", t->ndim, t->shape, ndim, shape, resolved) != 0) return NULL;
  if (flow_view_strides(t, ndim, resolved, st)) return flow_op_call1(&flow_op_view, &t, 1, &at);
  flow_tensor *c = flow_contiguous_copy(t);
  if (!c) return NULL;
  flow_tensor *r = flow_op_call1(&flow_op_view, &c, 1, &at);
  flow_tensor_decref(c);
  return r;
}

/* ---- expand --------------------------------------------------------------------------------- */

/* The shape (and, given t's strides, the strides) of t (shape tnd/tshape) expanded to want. */
static int expand_geometry(const char *op, int tnd, const int64_t *tshape, const int64_t *tstride, int ndim,
                           const int64_t *want, int64_t *shape, int64_t *stride) {
  if (ndim < tnd) {
    char a[128], b[128];
    return flow_error_set("%s: cannot expand shape %s to fewer dimensions %s", op,
                          flow_shape_str(tnd, tshape, a, sizeof a), flow_shape_str(ndim, want, b, sizeof b));
  }
  int lead = ndim - tnd;
  for (int d = 0; d < ndim; d++) {
    int td = d - lead;
    int64_t have = td >= 0 ? tshape[td] : 1;
    int64_t w = want[d] == -1 ? have : want[d];
    if (td >= 0 && have != 1 && have != w) {
      char a[128], b[128];
      return flow_error_set("%s: cannot expand shape %s to %s (axis %d: %lld vs %lld)", op,
                            flow_shape_str(tnd, tshape, a, sizeof a),
                            flow_shape_str(ndim, want, b, sizeof b), d, (long long)have, (long long)w);
    }
    shape[d] = w;
    if (stride) stride[d] = (td < 0 || have == 1) ? 0 : tstride[td];
  }
  return 0;
}

static int infer_expand(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)nin;
  *out = in[0];
  out->ndim = a->nshape;
  return expand_geometry(op->name, in[0].ndim, in[0].shape, NULL, a->nshape, a->shape, out->shape, NULL);
}

static FLOW_KERNEL(kernel_expand) {
  (void)nin; (void)nout;
  int64_t shape[FLOW_MAX_DIMS], st[FLOW_MAX_DIMS];
  expand_geometry("expand", in[0]->ndim, in[0]->shape, in[0]->stride, a->nshape, a->shape, shape, st);
  out[0] = flow_tensor_view_of(in[0], a->nshape, shape, st, in[0]->offset);
  return out[0] ? 0 : -1;
}

static int grad_expand(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_sum_to_shape(c->gout[0], c->in_meta[0].ndim, c->in_meta[0].shape);
  return gin[0] ? 0 : -1;
}

FLOW_OP(expand) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(expand, 0),
                 .shard = shard_target_shape, .kind = FLOW_OP_VIEW, .infer = infer_expand, .grad = grad_expand};
FLOW_KERNEL_REGISTER(FLOW_CPU, expand, kernel_expand)
FLOW_KERNEL_REGISTER(FLOW_CUDA, expand, kernel_expand)

flow_tensor *flow_expand(flow_tensor *t, int ndim, const int64_t *shape) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.nshape = ndim;
  for (int i = 0; i < ndim && i < FLOW_MAX_DIMS; i++) at.shape[i] = shape[i];
  return flow_op_call1(&flow_op_expand, &t, 1, &at);
}

/* Kernels run after inference has validated the attrs: this only resolves a negative axis. */
static int axis_of(int64_t axis, int ndim) { return (int)(axis < 0 ? axis + ndim : axis); }

static flow_tensor *view_as(flow_tensor *t, int ndim, const int64_t *shape) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.nshape = ndim;
  memcpy(at.shape, shape, (size_t)ndim * sizeof *shape);
  return flow_op_call1(&flow_op_view, &t, 1, &at);
}

/* ---- permute / transpose ------------------------------------------------------------------- */

static int check_permutation(const char *op, const flow_meta *t, int n, const int64_t *dims, int64_t *perm) {
  char a[128], b[128];
  bool seen[FLOW_MAX_DIMS] = {false};
  if (n != t->ndim) goto bad;
  for (int i = 0; i < n; i++) {
    if (dims[i] < -n || dims[i] >= n) goto bad;
    perm[i] = dims[i] < 0 ? dims[i] + n : dims[i];
    if (seen[perm[i]]) goto bad;
    seen[perm[i]] = true;
  }
  return 0;
bad:
  return flow_error_set("%s: dims %s are not a permutation of the %d axes of a tensor of shape %s", op,
                        flow_shape_str(n, dims, a, sizeof a), t->ndim, flow_shape_str(t->ndim, t->shape, b, sizeof b));
}

static int infer_permute(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  (void)nin;
  int64_t perm[FLOW_MAX_DIMS];
  if (check_permutation(op->name, &in[0], a->naxes, a->axes, perm) != 0) return -1;
  *out = in[0];
  for (int i = 0; i < a->naxes; i++) out->shape[i] = in[0].shape[perm[i]];
  return 0;
}

static FLOW_KERNEL(kernel_permute) {
  (void)nin; (void)nout;
  int64_t shape[FLOW_MAX_DIMS], st[FLOW_MAX_DIMS];
  for (int i = 0; i < a->naxes; i++) {
    int d = axis_of(a->axes[i], a->naxes);
    shape[i] = in[0]->shape[d];
    st[i] = in[0]->stride[d];
  }
  out[0] = flow_tensor_view_of(in[0], a->naxes, shape, st, in[0]->offset);
  return out[0] ? 0 : -1;
}

/* out axis i is input axis perm[i], so the gradient goes back through the inverse permutation */
static int grad_permute(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  int n = c->attrs->naxes;
  int64_t inv[FLOW_MAX_DIMS];
  for (int i = 0; i < n; i++) inv[axis_of(c->attrs->axes[i], n)] = i;
  gin[0] = flow_permute(c->gout[0], n, inv);
  return gin[0] ? 0 : -1;
}

FLOW_OP(permute) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(permute, 0),
                  .kind = FLOW_OP_VIEW, .infer = infer_permute, .grad = grad_permute};
FLOW_KERNEL_REGISTER(FLOW_CPU, permute, kernel_permute)
FLOW_KERNEL_REGISTER(FLOW_CUDA, permute, kernel_permute)

flow_tensor *flow_permute(flow_tensor *t, int n, const int64_t *dims) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (n > FLOW_MAX_DIMS) { flow_error_set("permute: at most %d dimensions", FLOW_MAX_DIMS); return NULL; }
  at.naxes = n;
  memcpy(at.axes, dims, (size_t)n * sizeof *dims);
  return flow_op_call1(&flow_op_permute, &t, 1, &at);
}

flow_tensor *flow_transpose(flow_tensor *t, int64_t a, int64_t b) {
  int64_t perm[FLOW_MAX_DIMS], x, y;
  if (flow_axis_norm("transpose", a, t->ndim, &x) != 0 || flow_axis_norm("transpose", b, t->ndim, &y) != 0)
    return NULL;
  if (t->ndim == 0) { flow_tensor_incref(t); return t; }
  for (int i = 0; i < t->ndim; i++) perm[i] = i;
  perm[x] = y;
  perm[y] = x;
  return flow_permute(t, t->ndim, perm);
}

/* ---- flip ------------------------------------------------------------------------------------- */

/* flip(x, axes): y[.., i_d, ..] = x[.., n_d - 1 - i_d, ..] on each listed axis d; a copy, as torch. */
static int flip_mask(const char *op, const flow_attrs *a, int ndim, bool *flip) {
  for (int d = 0; d < ndim; d++) flip[d] = false;
  for (int i = 0; i < a->naxes; i++) {
    int64_t d;
    if (flow_axis_norm(op, a->axes[i], ndim, &d) != 0) return -1;
    if (ndim == 0) continue;
    if (flip[d]) return flow_error_set("%s: axis %lld given twice", op, (long long)a->axes[i]);
    flip[d] = true;
  }
  return 0;
}

static int infer_flip(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  (void)nin;
  bool flip[FLOW_MAX_DIMS];
  if (flip_mask(op->name, a, in[0].ndim, flip) != 0) return -1;
  *out = in[0];
  return 0;
}

static FLOW_KERNEL(cpu_flip) {
  (void)nin; (void)nout;
  bool flip[FLOW_MAX_DIMS];
  if (flip_mask("flip", a, in[0]->ndim, flip) != 0) return -1;
  return flow_cpu_flip(out[0], in[0], flip);
}

/* flip is its own inverse (a permutation of the elements): dx = flip(g). */
static int grad_flip(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_flip(c->gout[0], c->attrs->naxes, c->attrs->axes);
  return gin[0] ? 0 : -1;
}

FLOW_OP(flip) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(along_axes, 0),
               .infer = infer_flip, .grad = grad_flip};
FLOW_KERNEL_REGISTER(FLOW_CPU, flip, cpu_flip)

flow_tensor *flow_flip(flow_tensor *t, int naxes, const int64_t *axes) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (naxes > FLOW_MAX_DIMS) { flow_error_set("flip: at most %d axes", FLOW_MAX_DIMS); return NULL; }
  at.naxes = naxes;
  memcpy(at.axes, axes, (size_t)naxes * sizeof *axes);
  return flow_op_call1(&flow_op_flip, &t, 1, &at);
}

/* ---- narrow and its backward ---------------------------------------------------------------- */

/* attrs: axis, start (negative counts from the end), length. */
static int narrow_geometry(const char *op, const flow_meta *t, const flow_attrs *a, int *axis, int64_t *start) {
  char s[128];
  int64_t ax;
  if (t->ndim == 0) return flow_error_set("%s: cannot narrow a 0-d tensor", op);
  if (flow_axis_norm(op, a->axis, t->ndim, &ax) != 0) return -1;
  int64_t size = t->shape[ax], st = a->start < 0 ? a->start + size : a->start;
  if (st < 0 || st > size)
    return flow_error_set("%s: start %lld out of range for axis %lld of size %lld (shape %s)", op,
                          (long long)a->start, (long long)ax, (long long)size, flow_shape_str(t->ndim, t->shape, s, sizeof s));
  if (a->length < 0) return flow_error_set("%s: negative length %lld", op, (long long)a->length);
  if (a->length > size - st)
    return flow_error_set("%s: start %lld + length %lld goes past the end of axis %lld (size %lld, shape %s)", op,
                          (long long)st, (long long)a->length, (long long)ax, (long long)size,
                          flow_shape_str(t->ndim, t->shape, s, sizeof s));
  *axis = (int)ax;
  *start = st;
  return 0;
}

static int infer_narrow(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)nin;
  int axis;
  int64_t start;
  if (narrow_geometry(op->name, &in[0], a, &axis, &start) != 0) return -1;
  *out = in[0];
  out->shape[axis] = a->length;
  return 0;
}

static FLOW_KERNEL(kernel_narrow) {
  (void)nin; (void)nout;
  int axis;
  int64_t start, shape[FLOW_MAX_DIMS];
  flow_meta m;
  flow_meta_from(&m, in[0]);
  if (narrow_geometry("narrow", &m, a, &axis, &start) != 0) return -1;
  memcpy(shape, in[0]->shape, sizeof shape);
  shape[axis] = a->length;
  out[0] = flow_tensor_view_of(in[0], in[0]->ndim, shape, in[0]->stride,
                               in[0]->offset + start * in[0]->stride[axis]);
  return out[0] ? 0 : -1;
}

/* The gradient of narrow: g placed at [start, start+len) along axis of zeros of the input's shape
 * (attrs: shape/nshape = the input's shape, axis and start normalised). */
static flow_tensor *narrow_backward(flow_tensor *g, const flow_meta *in, int axis, int64_t start);

static int grad_narrow(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  const flow_meta *m = &c->in_meta[0];
  int axis = axis_of(c->attrs->axis, m->ndim);
  int64_t start = c->attrs->start < 0 ? c->attrs->start + m->shape[axis] : c->attrs->start;
  if (c->acc[0] && c->acc[0]->dtype == c->gout[0]->dtype && !c->gout[0]->global) {
    /* another piece of the input already has its gradient there: add into this piece's place */
    flow_tensor *piece = flow_narrow(c->acc[0], axis, start, c->out_meta[0].shape[axis]);
    int rc = piece ? flow_add_inplace(piece, c->gout[0]) : -1;
    flow_tensor_decref(piece);
    return rc;
  }
  gin[0] = narrow_backward(c->gout[0], m, axis, start);
  return gin[0] ? 0 : -1;
}

FLOW_OP(narrow) {.nin = 1, .nout = 1, .sbp = FLOW_SBP_RULE(along_axis, 0),
                 .kind = FLOW_OP_VIEW, .infer = infer_narrow, .grad = grad_narrow};
FLOW_KERNEL_REGISTER(FLOW_CPU, narrow, kernel_narrow)
FLOW_KERNEL_REGISTER(FLOW_CUDA, narrow, kernel_narrow)

static int infer_narrow_backward(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                                 flow_meta *out) {
  (void)nin;
  *out = in[0];
  out->ndim = a->nshape;
  memcpy(out->shape, a->shape, sizeof out->shape);
  bool ok = a->nshape == in[0].ndim && a->axis >= 0 && a->axis < a->nshape && a->start >= 0 &&
            a->start + in[0].shape[a->axis] <= a->shape[a->axis];
  for (int d = 0; ok && d < a->nshape; d++) ok = d == a->axis || a->shape[d] == in[0].shape[d];
  if (!ok) {
    char s[128], t[128];
    return flow_error_set("%s: a gradient of shape %s does not fit at %lld on axis %lld of shape %s", op->name,
                          flow_shape_str(in[0].ndim, in[0].shape, s, sizeof s), (long long)a->start,
                          (long long)a->axis, flow_shape_str(a->nshape, a->shape, t, sizeof t));
  }
  return 0;
}

static FLOW_KERNEL(cpu_narrow_backward) {
  (void)nin; (void)nout;
  return flow_cpu_narrow_scatter(out[0], in[0], (int)a->axis, a->start);
}

static int grad_narrow_backward(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_narrow(c->gout[0], c->attrs->axis, c->attrs->start, c->in_meta[0].shape[c->attrs->axis]);
  return gin[0] ? 0 : -1;
}

FLOW_OP(narrow_backward) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(along_axis, 0),
                          .shard = shard_target_shape, .infer = infer_narrow_backward,
                          .grad = grad_narrow_backward};
FLOW_KERNEL_REGISTER(FLOW_CPU, narrow_backward, cpu_narrow_backward)

static flow_tensor *narrow_backward(flow_tensor *g, const flow_meta *in, int axis, int64_t start) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.nshape = in->ndim;
  memcpy(at.shape, in->shape, sizeof at.shape);
  at.axis = axis;
  at.start = start;
  return flow_op_call1(&flow_op_narrow_backward, &g, 1, &at);
}

flow_tensor *flow_narrow(flow_tensor *t, int64_t axis, int64_t start, int64_t length) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  at.start = start;
  at.length = length;
  return flow_op_call1(&flow_op_narrow, &t, 1, &at);
}

/* select = a narrow of length 1, then a view without that axis. */
flow_tensor *flow_select(flow_tensor *t, int64_t axis, int64_t index) {
  int64_t ax, shape[FLOW_MAX_DIMS];
  if (flow_tensor_lndim(t) == 0) { flow_error_set("select: cannot select from a 0-d tensor"); return NULL; }
  if (flow_axis_norm("select", axis, flow_tensor_lndim(t), &ax) != 0) return NULL;
  int64_t size = flow_tensor_lshape(t)[ax];
  if (index < -size || index >= size) {
    char s[128];
    flow_error_set("select: index %lld out of range for axis %lld of size %lld (expected %lld..%lld; shape %s)",
                   (long long)index, (long long)ax, (long long)size, (long long)-size, (long long)size - 1,
                   flow_shape_str(flow_tensor_lndim(t), flow_tensor_lshape(t), s, sizeof s));
    return NULL;
  }
  flow_tensor *n = flow_narrow(t, ax, index < 0 ? index + size : index, 1);
  if (!n) return NULL;
  for (int d = 0, k = 0; d < flow_tensor_lndim(t); d++)
    if (d != ax) shape[k++] = flow_tensor_lshape(t)[d];
  flow_tensor *r = view_as(n, flow_tensor_lndim(t) - 1, shape);
  flow_tensor_decref(n);
  return r;
}

/* ---- squeeze / unsqueeze / flatten: views through the view op ------------------------------- */

flow_tensor *flow_squeeze(flow_tensor *t, int naxes, const int64_t *axes) {
  bool drop[FLOW_MAX_DIMS] = {false};
  int64_t shape[FLOW_MAX_DIMS], ax;
  for (int i = 0; i < naxes; i++) {
    if (flow_axis_norm("squeeze", axes[i], flow_tensor_lndim(t), &ax) != 0) return NULL;
    if (flow_tensor_lndim(t)) drop[ax] = flow_tensor_lshape(t)[ax] == 1;
  }
  int n = 0;
  for (int d = 0; d < flow_tensor_lndim(t); d++)
    if (!(naxes ? drop[d] : flow_tensor_lshape(t)[d] == 1)) shape[n++] = flow_tensor_lshape(t)[d];
  return view_as(t, n, shape);
}

flow_tensor *flow_unsqueeze(flow_tensor *t, int64_t axis) {
  int64_t ax, shape[FLOW_MAX_DIMS];
  if (flow_tensor_lndim(t) == FLOW_MAX_DIMS) {
    flow_error_set("unsqueeze: the tensor already has the maximum of %d dimensions", FLOW_MAX_DIMS);
    return NULL;
  }
  if (flow_axis_norm("unsqueeze", axis, flow_tensor_lndim(t) + 1, &ax) != 0) return NULL;
  for (int d = 0, k = 0; d <= flow_tensor_lndim(t); d++) shape[d] = d == ax ? 1 : flow_tensor_lshape(t)[k++];
  return view_as(t, flow_tensor_lndim(t) + 1, shape);
}

flow_tensor *flow_flatten(flow_tensor *t, int64_t start, int64_t end) {
  int64_t s, e, shape[FLOW_MAX_DIMS];
  if (flow_axis_norm("flatten", start, flow_tensor_lndim(t), &s) != 0 || flow_axis_norm("flatten", end, flow_tensor_lndim(t), &e) != 0)
    return NULL;
  if (flow_tensor_lndim(t) == 0) return flow_reshape(t, 1, (int64_t[]){1});
  if (s > e) {
    flow_error_set("flatten: start axis %lld comes after end axis %lld", (long long)s, (long long)e);
    return NULL;
  }
  int n = 0;
  for (int d = 0; d < flow_tensor_lndim(t); d++) {
    if (d <= s || d > e) shape[n++] = flow_tensor_lshape(t)[d];
    else shape[n - 1] *= flow_tensor_lshape(t)[d];
  }
  return flow_reshape(t, n, shape);
}

/* ---- cat / stack ---------------------------------------------------------------------------- */

static int infer_cat(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                     flow_meta *out) {
  int64_t ax;
  if (nin < 1) return flow_error_set("%s: needs at least one tensor", op->name);
  if (flow_check_same_dtype(op, in, nin) != 0) return -1;
  if (in[0].ndim == 0) return flow_error_set("%s: cannot concatenate 0-d tensors (unsqueeze them or use stack)", op->name);
  if (flow_axis_norm(op->name, a->axis, in[0].ndim, &ax) != 0) return -1;
  *out = in[0];
  for (int i = 1; i < nin; i++) {
    bool ok = in[i].ndim == in[0].ndim;
    for (int d = 0; ok && d < in[0].ndim; d++) ok = d == ax || in[i].shape[d] == in[0].shape[d];
    if (!ok) {
      char s0[128], s1[128];
      return flow_error_set("%s: shapes %s (input 1) and %s (input %d) differ outside the concatenation axis %lld",
                            op->name, flow_shape_str(in[0].ndim, in[0].shape, s0, sizeof s0),
                            flow_shape_str(in[i].ndim, in[i].shape, s1, sizeof s1), i + 1, (long long)ax);
    }
    out->shape[ax] += in[i].shape[ax];
  }
  return 0;
}

static FLOW_KERNEL(cpu_cat) {
  (void)nout;
  return flow_cpu_cat(out[0], in, nin, axis_of(a->axis, in[0]->ndim));
}

/* Each input's gradient is its window of the output gradient. */
static int grad_cat(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0]) return 0;
  int axis = axis_of(c->attrs->axis, c->in_meta[0].ndim);
  int64_t at = 0;
  for (int i = 0; i < c->nin; i++) {
    int64_t len = c->in_meta[i].shape[axis];
    if (c->need[i] && !(gin[i] = flow_narrow(c->gout[0], axis, at, len))) return -1;
    at += len;
  }
  return 0;
}

FLOW_OP(cat) {.nin = -1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(along_axis, 0),
              .infer = infer_cat,
              .grad = grad_cat};
FLOW_KERNEL_REGISTER(FLOW_CPU, cat, cpu_cat)

/* Mixed dtypes are promoted first, as torch.cat (the cast's gradient casts back). */
flow_tensor *flow_cat(int n, flow_tensor *const *ts, int64_t axis) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.axis = axis;
  bool mixed = false;
  flow_dtype d = n > 0 ? ts[0]->dtype : FLOW_F32;
  for (int i = 1; i < n; i++) {
    mixed |= ts[i]->dtype != d;
    d = flow_promote_types(d, ts[i]->dtype);
  }
  if (!mixed) return flow_op_call1(&flow_op_cat, ts, n, &at);
  flow_tensor **c = calloc((size_t)n, sizeof *c), *r = NULL;
  if (!c) { flow_error_set("cat: out of memory"); return NULL; }
  int k = 0;
  while (k < n && (c[k] = flow_cast(ts[k], d))) k++;
  if (k == n) r = flow_op_call1(&flow_op_cat, c, n, &at);
  flow_decref_all(c, k);
  free(c);
  return r;
}

/* stack = unsqueeze each at axis, then cat. */
flow_tensor *flow_stack(int n, flow_tensor *const *ts, int64_t axis) {
  if (n < 1) { flow_error_set("stack: needs at least one tensor"); return NULL; }
  for (int i = 1; i < n; i++)
    if (!flow_shape_eq(ts[i]->ndim, ts[i]->shape, ts[0]->ndim, ts[0]->shape)) {
      char s0[128], s1[128];
      flow_error_set("stack: all tensors must have the same shape: %s (input 1) and %s (input %d)",
                     flow_shape_str(ts[0]->ndim, ts[0]->shape, s0, sizeof s0),
                     flow_shape_str(ts[i]->ndim, ts[i]->shape, s1, sizeof s1), i + 1);
      return NULL;
    }
  int64_t ax;
  if (flow_axis_norm("stack", axis, ts[0]->ndim + 1, &ax) != 0) return NULL;
  flow_tensor **u = calloc((size_t)n, sizeof *u), *r = NULL;
  if (!u) { flow_error_set("stack: out of memory"); return NULL; }
  int k = 0;
  while (k < n && (u[k] = flow_unsqueeze(ts[k], ax))) k++;
  if (k == n) r = flow_cat(n, u, ax);
  if (!r) flow_error_prefix("stack");
  for (int i = 0; i < k; i++) flow_tensor_decref(u[i]);
  free(u);
  return r;
}

/* ---- tril / triu ------------------------------------------------------------------------------ */

/* attrs: k (diagonal offset); which triangle is kept is the op itself (tril or triu). */
static int infer_tri(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                     flow_meta *out) {
  (void)nin; (void)a;
  if (in[0].ndim < 2) {
    char s[128];
    return flow_error_set("%s: needs a tensor of at least 2 dimensions (got shape %s)", op->name,
                          flow_shape_str(in[0].ndim, in[0].shape, s, sizeof s));
  }
  *out = in[0];
  return 0;
}

static FLOW_KERNEL(cpu_tril) {
  (void)nin; (void)nout;
  return flow_cpu_tri(out[0], in[0], a->k, false);
}

static FLOW_KERNEL(cpu_triu) {
  (void)nin; (void)nout;
  return flow_cpu_tri(out[0], in[0], a->k, true);
}

/* The mask is linear: the gradient is masked the same way. */
static int grad_tri(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_tri(c->gout[0], c->attrs->k, c->op == &flow_op_triu);
  return gin[0] ? 0 : -1;
}

FLOW_OP(tril) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(triangle, 0),
               .infer = infer_tri,
               .grad = grad_tri};
FLOW_KERNEL_REGISTER(FLOW_CPU, tril, cpu_tril)
FLOW_OP(triu) {.nin = 1, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(triangle, 0),
               .infer = infer_tri,
               .grad = grad_tri};
FLOW_KERNEL_REGISTER(FLOW_CPU, triu, cpu_triu)

flow_tensor *flow_tri(flow_tensor *t, int64_t k, bool upper) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.k = k;
  return flow_op_call1(upper ? &flow_op_triu : &flow_op_tril, &t, 1, &at);
}
