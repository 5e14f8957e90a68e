/* Elementwise binary ops (add sub mul div), copy/cast and fill: shape, dtype and gradient rules. */
#include "elementwise.h"

#include "../kernels/cpu/cpu.h"
#include "reduce.h"

/* ---- binary with broadcasting ------------------------------------------------------------ */

static int infer_binary(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)nin; (void)a;
  if (flow_check_same_dtype(op, in, 2) != 0) return -1;
  if (in[0]->dtype == FLOW_F16 || in[0]->dtype == FLOW_BF16)
    return flow_error_set("%s: %s tensors are storage-only on the CPU (cast to float32 first)", op->name,
                          flow_dtype_name(in[0]->dtype));
  out->dtype = in[0]->dtype;
  out->device = in[0]->device;
  return flow_broadcast_shape(op->name, in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape,
                              &out->ndim, out->shape);
}

#define CPU_BINARY(NAME, CODE)                                                       \
  static FLOW_KERNEL(cpu_##NAME) {                                             \
    (void)nin; (void)nout; (void)a;                                                \
    return flow_cpu_binary(CODE, out[0], in[0], in[1]);                            \
  }
CPU_BINARY(add, FLOW_BIN_ADD)
CPU_BINARY(sub, FLOW_BIN_SUB)
CPU_BINARY(mul, FLOW_BIN_MUL)
CPU_BINARY(div, FLOW_BIN_DIV)

/* Reduce a broadcast gradient back to the input's shape, then scale if asked. */
static flow_tensor *unbroadcast(flow_tensor *g, const flow_meta *m) {
  return flow_sum_to_shape(g, m->ndim, m->shape);
}

static int grad_add(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  for (int i = 0; i < 2; i++)
    if (c->need[i] && !(gin[i] = unbroadcast(g, &c->in_meta[i]))) return -1;
  return 0;
}

static int grad_sub(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  if (c->need[0] && !(gin[0] = unbroadcast(g, &c->in_meta[0]))) return -1;
  if (c->need[1]) {
    flow_tensor *n = flow_mul_scalar(g, -1);
    if (!n) return -1;
    gin[1] = unbroadcast(n, &c->in_meta[1]);
    flow_tensor_decref(n);
    if (!gin[1]) return -1;
  }
  return 0;
}

/* d(a*b) = g*b, g*a */
static int grad_mul(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  for (int i = 0; i < 2; i++) {
    if (!c->need[i]) continue;
    flow_tensor *p = flow_mul(g, c->in[1 - i]);
    if (!p) return -1;
    gin[i] = unbroadcast(p, &c->in_meta[i]);
    flow_tensor_decref(p);
    if (!gin[i]) return -1;
  }
  return 0;
}

/* d(a/b) = g/b, -g*a/b^2 = -g*out/b */
static int grad_div(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  flow_tensor *gb = flow_div(g, c->in[1]);
  if (!gb) return -1;
  int rc = 0;
  if (c->need[0] && !(gin[0] = unbroadcast(gb, &c->in_meta[0]))) rc = -1;
  if (rc == 0 && c->need[1]) {
    flow_tensor *q = flow_div(c->in[0], c->in[1]);
    flow_tensor *p = q ? flow_mul(gb, q) : NULL;
    flow_tensor *n = p ? flow_mul_scalar(p, -1) : NULL;
    gin[1] = n ? unbroadcast(n, &c->in_meta[1]) : NULL;
    flow_tensor_decref(q); flow_tensor_decref(p); flow_tensor_decref(n);
    if (!gin[1]) rc = -1;
  }
  flow_tensor_decref(gb);
  return rc;
}

FLOW_OP(add) {.name = "add", .nin = 2, .nout = 1, .infer = infer_binary,
              .kernel = {[FLOW_CPU] = cpu_add}, .grad = grad_add};
FLOW_OP(sub) {.name = "sub", .nin = 2, .nout = 1, .infer = infer_binary,
              .kernel = {[FLOW_CPU] = cpu_sub}, .grad = grad_sub};
FLOW_OP(mul) {.name = "mul", .nin = 2, .nout = 1, .infer = infer_binary,
              .kernel = {[FLOW_CPU] = cpu_mul}, .grad = grad_mul, .save_in = 3};
FLOW_OP(div) {.name = "div", .nin = 2, .nout = 1, .infer = infer_binary,
              .kernel = {[FLOW_CPU] = cpu_div}, .grad = grad_div, .save_in = 3};

flow_tensor *flow_binary(const flow_op *op, flow_tensor *a, flow_tensor *b) {
  flow_tensor *in[2] = {a, b};
  flow_attrs at;
  flow_attrs_init(&at);
  return flow_op_call1(op, in, 2, &at);
}

flow_tensor *flow_add(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_add, a, b); }
flow_tensor *flow_sub(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_sub, a, b); }
flow_tensor *flow_mul(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_mul, a, b); }
flow_tensor *flow_div(flow_tensor *a, flow_tensor *b) { return flow_binary(&flow_op_div, a, b); }

static flow_tensor *with_scalar(const flow_op *op, flow_tensor *a, double s) {
  flow_tensor *b = flow_scalar_tensor(s, a->dtype, a->device);
  if (!b) return NULL;
  flow_tensor *r = flow_binary(op, a, b);
  flow_tensor_decref(b);
  return r;
}
flow_tensor *flow_add_scalar(flow_tensor *a, double s) { return with_scalar(&flow_op_add, a, s); }
flow_tensor *flow_mul_scalar(flow_tensor *a, double s) { return with_scalar(&flow_op_mul, a, s); }

/* ---- in-place add and copy (optimizers, gradient accumulation) ------------------------------ */

static int infer_inplace(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  (void)nin; (void)a;
  int nd;
  int64_t shape[FLOW_MAX_DIMS];
  if (flow_broadcast_shape(op->name, in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &nd, shape) != 0)
    return -1;
  if (!flow_shape_eq(nd, shape, in[0]->ndim, in[0]->shape)) {
    char s0[128], s1[128];
    return flow_error_set("%s: cannot write a result of shape %s into a tensor of shape %s", op->name,
                          flow_shape_str(nd, shape, s0, sizeof s0),
                          flow_shape_str(in[0]->ndim, in[0]->shape, s1, sizeof s1));
  }
  flow_meta_from(out, in[0]);
  return 0;
}

static int infer_add_(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  if (flow_check_same_dtype(op, in, 2) != 0) return -1;
  return infer_inplace(op, in, nin, a, out);
}

static FLOW_KERNEL(cpu_add_) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_binary(FLOW_BIN_ADD, out[0], in[0], in[1]);
}

static FLOW_KERNEL(cpu_copy_) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_copy(out[0], in[1]);
}

FLOW_OP(add_) {.name = "add_", .nin = 2, .nout = 1, .kind = FLOW_OP_INPLACE, .infer = infer_add_,
               .kernel = {[FLOW_CPU] = cpu_add_}};
FLOW_OP(copy_) {.name = "copy_", .nin = 2, .nout = 1, .kind = FLOW_OP_INPLACE, .infer = infer_inplace,
                .kernel = {[FLOW_CPU] = cpu_copy_}};

static int call_inplace(const flow_op *op, flow_tensor *dst, flow_tensor *src) {
  flow_tensor *in[2] = {dst, src}, *out;
  flow_attrs at;
  flow_attrs_init(&at);
  if (flow_op_call(op, in, 2, &at, &out) != 0) return -1;
  flow_tensor_decref(out);
  return 0;
}
int flow_add_inplace(flow_tensor *a, flow_tensor *b) { return call_inplace(&flow_op_add_, a, b); }
int flow_copy_inplace(flow_tensor *dst, flow_tensor *src) { return call_inplace(&flow_op_copy_, dst, src); }

/* ---- copy / cast --------------------------------------------------------------------------- */

static int infer_copy(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)op; (void)nin; (void)a;
  flow_meta_from(out, in[0]);
  return 0;
}

static int infer_cast(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)op; (void)nin;
  flow_meta_from(out, in[0]);
  out->dtype = a->dtype;
  return 0;
}

static FLOW_KERNEL(cpu_copy) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_copy(out[0], in[0]);
}

static int grad_copy(const flow_grad_ctx *c, flow_tensor **gin) {
  if (c->gout[0] && c->need[0]) {
    gin[0] = c->gout[0];
    flow_tensor_incref(gin[0]);
  }
  return 0;
}

static int grad_cast(const flow_grad_ctx *c, flow_tensor **gin) {
  if (c->gout[0] && c->need[0] && !(gin[0] = flow_cast(c->gout[0], c->in_meta[0].dtype))) return -1;
  return 0;
}

FLOW_OP(copy) {.name = "contiguous", .nin = 1, .nout = 1, .infer = infer_copy,
               .kernel = {[FLOW_CPU] = cpu_copy}, .grad = grad_copy};
FLOW_OP(cast) {.name = "cast", .nin = 1, .nout = 1, .infer = infer_cast,
               .kernel = {[FLOW_CPU] = cpu_copy}, .grad = grad_cast};

flow_tensor *flow_contiguous_copy(flow_tensor *t) {
  flow_attrs at;
  flow_attrs_init(&at);
  return flow_op_call1(&flow_op_copy, &t, 1, &at);
}

flow_tensor *flow_contiguous(flow_tensor *t) {
  if (flow_tensor_is_contiguous(t)) { flow_tensor_incref(t); return t; }
  return flow_contiguous_copy(t);
}

flow_tensor *flow_cast(flow_tensor *t, flow_dtype dtype) {
  if (t->dtype == dtype) { flow_tensor_incref(t); return t; }
  flow_attrs at;
  flow_attrs_init(&at);
  at.dtype = dtype;
  return flow_op_call1(&flow_op_cast, &t, 1, &at);
}

/* ---- full (zeros, ones, full) -------------------------------------------------------------- */

/* attrs: shape/nshape, dtype, device, scalar */
static int infer_full(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                      flow_meta *out) {
  (void)op; (void)in; (void)nin;
  out->dtype = a->dtype;
  out->device = a->device;
  out->ndim = a->nshape;
  for (int i = 0; i < a->nshape; i++) {
    if (a->shape[i] < 0) return flow_error_set("full: negative size %lld", (long long)a->shape[i]);
    out->shape[i] = a->shape[i];
  }
  return 0;
}

static FLOW_KERNEL(cpu_full) {
  (void)in; (void)nin; (void)nout;
  return flow_cpu_fill(out[0], a->scalar);
}

FLOW_OP(full) {.name = "full", .nin = 0, .nout = 1, .kind = FLOW_OP_SOURCE, .infer = infer_full,
               .kernel = {[FLOW_CPU] = cpu_full}};

flow_tensor *flow_full(int ndim, const int64_t *shape, double v, flow_dtype dtype, flow_device dev) {
  flow_attrs at;
  flow_attrs_init(&at);
  if (ndim > FLOW_MAX_DIMS) { flow_error_set("full: at most %d dimensions", FLOW_MAX_DIMS); return NULL; }
  at.nshape = ndim;
  for (int i = 0; i < ndim; i++) at.shape[i] = shape[i];
  at.dtype = dtype;
  at.scalar = v;
  at.device = dev;
  return flow_op_call1(&flow_op_full, NULL, 0, &at);
}

flow_tensor *flow_full_like(flow_tensor *t, double v) {
  return flow_full(t->ndim, t->shape, v, t->dtype, t->device);
}
flow_tensor *flow_zeros_like(flow_tensor *t) { return flow_full_like(t, 0); }
flow_tensor *flow_ones_like(flow_tensor *t) { return flow_full_like(t, 1); }

flow_tensor *flow_scalar_tensor(double v, flow_dtype dtype, flow_device dev) {
  return flow_full(0, NULL, v, dtype, dev);
}
