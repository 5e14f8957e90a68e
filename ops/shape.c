/* Shape and view ops: view/reshape, expand. Each view's gradient maps the output gradient back
 * to the input's geometry. */
#include "shape.h"

#include <string.h>

#include "elementwise.h"
#include "reduce.h"

/* Infer one -1 and check the element count; names the op in errors. */
static int resolve_shape(const char *op, const flow_tensor *t, int ndim, const int64_t *in, int64_t *out) {
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
  int64_t n = flow_tensor_numel(t);
  if (infer >= 0) {
    if (known == 0 || n % known != 0) goto bad;
    out[infer] = n / known;
  } else if (known != n) goto bad;
  return 0;
bad:;
  char a[128], b[128];
  return flow_error_set("%s: cannot view a tensor of shape %s (%lld elements) as %s", op,
                        flow_shape_str(t->ndim, t->shape, a, sizeof a), (long long)n,
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

static int infer_view(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)nin;
  flow_meta_from(out, in[0]);
  out->ndim = a->nshape;
  if (a->nshape > FLOW_MAX_DIMS) return flow_error_set("%s: at most %d dimensions", op->name, FLOW_MAX_DIMS);
  if (resolve_shape(op->name, in[0], a->nshape, a->shape, out->shape) != 0) return -1;
  int64_t st[FLOW_MAX_DIMS];
  if (!flow_view_strides(in[0], out->ndim, out->shape, st)) {
    char s[128];
    return flow_error_set("%s: the tensor's strides do not allow a view as %s (use reshape, which copies)",
                          op->name, flow_shape_str(out->ndim, out->shape, s, sizeof s));
  }
  return 0;
}

static FLOW_KERNEL(kernel_view) {
  (void)nin; (void)nout;
  int64_t shape[FLOW_MAX_DIMS], st[FLOW_MAX_DIMS];
  resolve_shape("view", in[0], a->nshape, a->shape, shape);
  flow_view_strides(in[0], a->nshape, shape, st);
  out[0] = flow_tensor_view_of(in[0], a->nshape, shape, st, in[0]->offset);
  return out[0] ? 0 : -1;
}

static int grad_view(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_reshape(c->gout[0], c->in_meta[0].ndim, c->in_meta[0].shape);
  return gin[0] ? 0 : -1;
}

FLOW_OP(view) {.name = "view", .nin = 1, .nout = 1, .kind = FLOW_OP_VIEW, .infer = infer_view,
               .kernel = {[FLOW_CPU] = kernel_view, [FLOW_CUDA] = kernel_view}, .grad = grad_view};

flow_tensor *flow_reshape(flow_tensor *t, int ndim, const int64_t *shape) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (ndim > FLOW_MAX_DIMS) { flow_error_set("reshape: at most %d dimensions", FLOW_MAX_DIMS); return NULL; }
  at.nshape = ndim;
  for (int i = 0; i < ndim; i++) at.shape[i] = shape[i];
  int64_t resolved[FLOW_MAX_DIMS], st[FLOW_MAX_DIMS];
  if (resolve_shape("reshape", t, ndim, shape, resolved) != 0) return NULL;
  if (flow_view_strides(t, ndim, resolved, st)) return flow_op_call1(&flow_op_view, &t, 1, &at);
  flow_tensor *c = flow_contiguous_copy(t);
  if (!c) return NULL;
  flow_tensor *r = flow_op_call1(&flow_op_view, &c, 1, &at);
  flow_tensor_decref(c);
  return r;
}

/* ---- expand --------------------------------------------------------------------------------- */

static int expand_geometry(const char *op, const flow_tensor *t, int ndim, const int64_t *want,
                           int64_t *shape, int64_t *stride) {
  if (ndim < t->ndim) {
    char a[128], b[128];
    return flow_error_set("%s: cannot expand shape %s to fewer dimensions %s", op,
                          flow_shape_str(t->ndim, t->shape, a, sizeof a), flow_shape_str(ndim, want, b, sizeof b));
  }
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    int td = d - lead;
    int64_t have = td >= 0 ? t->shape[td] : 1;
    int64_t w = want[d] == -1 ? have : want[d];
    if (td >= 0 && have != 1 && have != w) {
      char a[128], b[128];
      return flow_error_set("%s: cannot expand shape %s to %s (axis %d: %lld vs %lld)", op,
                            flow_shape_str(t->ndim, t->shape, a, sizeof a),
                            flow_shape_str(ndim, want, b, sizeof b), d, (long long)have, (long long)w);
    }
    shape[d] = w;
    stride[d] = (td < 0 || have == 1) ? 0 : t->stride[td];
  }
  return 0;
}

static int infer_expand(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)nin;
  int64_t st[FLOW_MAX_DIMS];
  flow_meta_from(out, in[0]);
  out->ndim = a->nshape;
  return expand_geometry(op->name, in[0], a->nshape, a->shape, out->shape, st);
}

static FLOW_KERNEL(kernel_expand) {
  (void)nin; (void)nout;
  int64_t shape[FLOW_MAX_DIMS], st[FLOW_MAX_DIMS];
  expand_geometry("expand", in[0], a->nshape, a->shape, shape, st);
  out[0] = flow_tensor_view_of(in[0], a->nshape, shape, st, in[0]->offset);
  return out[0] ? 0 : -1;
}

static int grad_expand(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  gin[0] = flow_sum_to_shape(c->gout[0], c->in_meta[0].ndim, c->in_meta[0].shape);
  return gin[0] ? 0 : -1;
}

FLOW_OP(expand) {.name = "expand", .nin = 1, .nout = 1, .kind = FLOW_OP_VIEW, .infer = infer_expand,
                 .kernel = {[FLOW_CPU] = kernel_expand, [FLOW_CUDA] = kernel_expand}, .grad = grad_expand};

flow_tensor *flow_expand(flow_tensor *t, int ndim, const int64_t *shape) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.nshape = ndim;
  for (int i = 0; i < ndim && i < FLOW_MAX_DIMS; i++) at.shape[i] = shape[i];
  return flow_op_call1(&flow_op_expand, &t, 1, &at);
}
