/* Creation and random ops (see create.h): shape inference for source ops, the dropout gradient,
 * and the C entry points that reserve generator ranges. */
#include "create.h"

#include <math.h>
#include <string.h>

#include "../kernels/cpu/random.h"
#include "../sbp/global.h"
#include "../sbp/signature.h"
#include "device.h"

/* ---- source ops: the shape is in the attrs ------------------------------------------------ */

static int infer_source(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)in; (void)nin;
  if (a->nshape > FLOW_MAX_DIMS) return flow_error_set("%s: at most %d dimensions", op->name, FLOW_MAX_DIMS);
  out->dtype = a->dtype;
  out->device = a->device;
  out->ndim = a->nshape;
  for (int i = 0; i < a->nshape; i++) {
    if (a->shape[i] < 0) {
      char s[128];
      return flow_error_set("%s: negative size in shape %s", op->name, flow_shape_str(a->nshape, a->shape, s, sizeof s));
    }
    out->shape[i] = a->shape[i];
  }
  return 0;
}

static int infer_float_source(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                              flow_meta *out) {
  if (!flow_dtype_is_float(a->dtype))
    return flow_error_set("%s: dtype must be a floating-point type (got %s; use randint for integers)",
                          op->name, flow_dtype_name(a->dtype));
  return infer_source(op, in, nin, a, out);
}

static int infer_eye(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  if (a->nshape != 2) return flow_error_set("eye: expected a 2-d shape (got %d-d)", a->nshape);
  return infer_source(op, in, nin, a, out);
}

static int infer_range(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  if (a->nshape != 1) return flow_error_set("%s: expected a 1-d shape (got %d-d)", op->name, a->nshape);
  return infer_source(op, in, nin, a, out);
}

static int infer_randint(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  if (a->naxes != 2) return flow_error_set("randint: expected the bounds low, high in attrs axes[0..1]");
  if (a->axes[1] <= a->axes[0])
    return flow_error_set("randint: high (%lld) must be greater than low (%lld)", (long long)a->axes[1],
                          (long long)a->axes[0]);
  return infer_source(op, in, nin, a, out);
}

static FLOW_KERNEL(cpu_arange) { (void)in; (void)nin; (void)nout; return flow_cpu_arange(out[0], a); }
static FLOW_KERNEL(cpu_linspace) { (void)in; (void)nin; (void)nout; return flow_cpu_linspace(out[0], a); }
static FLOW_KERNEL(cpu_eye) { (void)in; (void)nin; (void)nout; return flow_cpu_eye(out[0], a); }
static FLOW_KERNEL(cpu_rand) { (void)in; (void)nin; (void)nout; return flow_cpu_rand_uniform(out[0], a); }
static FLOW_KERNEL(cpu_randn) { (void)in; (void)nin; (void)nout; return flow_cpu_rand_normal(out[0], a); }
static FLOW_KERNEL(cpu_randint) {
  (void)in; (void)nin; (void)nout;
  return flow_cpu_rand_int(out[0], a, a->axes[0], a->axes[1]);
}

FLOW_OP(arange) {.nin = 0, .nout = 1, .kind = FLOW_OP_SOURCE, .infer = infer_range};
FLOW_KERNEL_REGISTER(FLOW_CPU, arange, cpu_arange)
FLOW_OP(linspace) {.nin = 0, .nout = 1, .kind = FLOW_OP_SOURCE, .infer = infer_range};
FLOW_KERNEL_REGISTER(FLOW_CPU, linspace, cpu_linspace)
FLOW_OP(eye) {.nin = 0, .nout = 1, .kind = FLOW_OP_SOURCE, .infer = infer_eye};
FLOW_KERNEL_REGISTER(FLOW_CPU, eye, cpu_eye)
FLOW_OP(rand) {.nin = 0, .nout = 1, .kind = FLOW_OP_SOURCE, .random = true, .infer = infer_float_source};
FLOW_KERNEL_REGISTER(FLOW_CPU, rand, cpu_rand)
FLOW_OP(randn) {.nin = 0, .nout = 1, .kind = FLOW_OP_SOURCE, .random = true, .infer = infer_float_source};
FLOW_KERNEL_REGISTER(FLOW_CPU, randn, cpu_randn)
FLOW_OP(randint) {.nin = 0, .nout = 1, .kind = FLOW_OP_SOURCE, .random = true, .infer = infer_randint};
FLOW_KERNEL_REGISTER(FLOW_CPU, randint, cpu_randint)

/* Run a source op on at->device; where that device has no kernel for it, make the tensor on the
 * host and copy it over (the same numbers on every device; flow_create_shard does the same). */
static flow_tensor *make_source(const flow_op *op, flow_attrs *at) {
  flow_device dev = at->device;
  if (dev.type == FLOW_CPU || flow_op_has_kernel(op, dev.type)) return flow_op_call1(op, NULL, 0, at);
  at->device = FLOW_DEVICE_CPU;
  flow_tensor *host = flow_op_call1(op, NULL, 0, at);
  if (!host) return NULL;
  flow_tensor *t = flow_to_device(host, dev);
  flow_tensor_decref(host);
  return t;
}

static void source_attrs(flow_attrs *at, int ndim, const int64_t *shape, flow_dtype dtype, flow_device dev) {
  flow_attrs_init(at);
  at->nshape = ndim;
  for (int i = 0; i < ndim && i < FLOW_MAX_DIMS; i++) at->shape[i] = shape[i];
  at->dtype = dtype;
  at->device = dev;
}

int flow_arange_length(double start, double stop, double step, int64_t *n) {
  if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step))
    return flow_error_set("arange: start, stop and step must be finite and step non-zero (got %g, %g, %g)",
                          start, stop, step);
  double len = ceil((stop - start) / step);
  if (len < 0) return flow_error_set("arange: step %g goes away from stop (start %g, stop %g)", step, start, stop);
  if (len > 9e15) return flow_error_set("arange: %g elements are too many", len);
  *n = (int64_t)len;
  return 0;
}

flow_tensor *flow_arange(double start, double stop, double step, flow_dtype dtype, flow_device dev) {
  int64_t n;
  if (flow_arange_length(start, stop, step, &n) != 0) return NULL;
  flow_attrs at;
  source_attrs(&at, 1, &n, dtype, dev);
  at.scalar = start;
  at.scalar2 = step;
  return make_source(&flow_op_arange, &at);
}

flow_tensor *flow_linspace(double start, double stop, int64_t n, flow_dtype dtype, flow_device dev) {
  if (n < 0) { flow_error_set("linspace: the number of points must be >= 0 (got %lld)", (long long)n); return NULL; }
  flow_attrs at;
  source_attrs(&at, 1, &n, dtype, dev);
  at.scalar = start;
  at.scalar2 = stop;
  return make_source(&flow_op_linspace, &at);
}

flow_tensor *flow_eye(int64_t n, int64_t m, flow_dtype dtype, flow_device dev) {
  int64_t shape[2] = {n, m};
  flow_attrs at;
  source_attrs(&at, 2, shape, dtype, dev);
  return make_source(&flow_op_eye, &at);
}

static flow_tensor *random_source(const flow_op *op, flow_attrs *at) {
  if (at->nshape > FLOW_MAX_DIMS) {
    flow_error_set("%s: at most %d dimensions", op->name, FLOW_MAX_DIMS);
    return NULL;
  }
  int64_t n = flow_shape_numel(at->nshape, at->shape);
  if (n < 0) n = 0; /* a negative size: inference reports it */
  flow_rng_state s = flow_rng_reserve((uint64_t)n);
  at->seed = s.seed;
  at->rng_offset = s.offset;
  return make_source(op, at);
}

flow_tensor *flow_rand(int ndim, const int64_t *shape, flow_dtype dtype, flow_device dev) {
  flow_attrs at;
  source_attrs(&at, ndim, shape, dtype, dev);
  return random_source(&flow_op_rand, &at);
}

flow_tensor *flow_randn(int ndim, const int64_t *shape, flow_dtype dtype, flow_device dev) {
  flow_attrs at;
  source_attrs(&at, ndim, shape, dtype, dev);
  return random_source(&flow_op_randn, &at);
}

flow_tensor *flow_randint(int64_t low, int64_t high, int ndim, const int64_t *shape, flow_dtype dtype,
                          flow_device dev) {
  flow_attrs at;
  source_attrs(&at, ndim, shape, dtype, dev);
  at.axes[0] = low;
  at.axes[1] = high;
  at.naxes = 2;
  return random_source(&flow_op_randint, &at);
}

flow_tensor *flow_create_shard(const flow_op *op, const flow_attrs *logical, const int64_t *box_start,
                               const int64_t *box_shape) {
  flow_attrs at = *logical;
  at.nlogical = logical->nshape;
  for (int d = 0; d < logical->nshape; d++) {
    at.logical_shape[d] = logical->shape[d];
    at.box_start[d] = box_start[d];
    at.shape[d] = box_shape[d];
  }
  flow_device dev = at.device;
  bool via_host = dev.type != FLOW_CPU && !flow_op_has_kernel(op, dev.type);
  if (via_host) at.device = FLOW_DEVICE_CPU;
  flow_tensor *out;
  if (flow_op_call_local(op, NULL, 0, &at, &out) != 0) return NULL;
  if (!via_host) return out;
  flow_tensor *t = flow_to_device(out, dev);
  flow_tensor_decref(out);
  return t;
}

/* ---- dropout ------------------------------------------------------------------------------ */

static int infer_dropout(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                         flow_meta *out) {
  (void)nin;
  if (in[0].dtype != FLOW_F32 && in[0].dtype != FLOW_F64)
    return flow_error_set("dropout: input must be float32 or float64 (got %s)", flow_dtype_name(in[0].dtype));
  if (!(a->scalar >= 0 && a->scalar <= 1)) return flow_error_set("dropout: p must be in [0, 1] (got %g)", a->scalar);
  *out = in[0];
  (void)op;
  return 0;
}

static FLOW_KERNEL(cpu_dropout) { (void)nin; (void)nout; return flow_cpu_dropout(out[0], in[0], a); }

/* dropout is linear in x with the same mask: its gradient is dropout of the incoming gradient
 * drawn at the same (seed, offset), so nothing but the attrs is saved. */
static int grad_dropout(const flow_grad_ctx *c, flow_tensor **gin) {
  if (!c->gout[0] || !c->need[0]) return 0;
  return (gin[0] = flow_op_call1(&flow_op_dropout, &c->gout[0], 1, c->attrs)) ? 0 : -1;
}

/* The mask of logical element i is drawn at i: on a shard the kernel learns where its box sits. */
static void shard_dropout(const flow_op *op, const flow_shard_ctx *c, flow_attrs *local) {
  (void)op;
  int64_t box[FLOW_MAX_DIMS];
  flow_global_box(c->placement, &c->out_sbp[0], c->out[0].ndim, c->out[0].shape, c->placement->coord, -1,
                  local->box_start, box);
  local->nlogical = c->out[0].ndim;
  memcpy(local->logical_shape, c->out[0].shape, sizeof local->logical_shape);
}

FLOW_OP(dropout) {.nin = 1, .nout = 1, .random = true, .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
                  .shard = shard_dropout, .infer = infer_dropout, .grad = grad_dropout};
FLOW_KERNEL_REGISTER(FLOW_CPU, dropout, cpu_dropout)

/* On a device without a dropout kernel the input goes through the host and back: both copies
 * are differentiable, so the gradient takes the same way. */
flow_tensor *flow_dropout_at(flow_tensor *t, double p, flow_rng_state rng) {
  if (p == 0) { flow_tensor_incref(t); return t; }
  flow_attrs at;
  flow_attrs_init(&at);
  at.scalar = p;
  at.seed = rng.seed;
  at.rng_offset = rng.offset;
  if (t->device.type == FLOW_CPU || flow_op_has_kernel(&flow_op_dropout, t->device.type) || t->global)
    return flow_op_call1(&flow_op_dropout, &t, 1, &at);
  flow_tensor *host = flow_to_device(t, FLOW_DEVICE_CPU);
  flow_tensor *d = host ? flow_op_call1(&flow_op_dropout, &host, 1, &at) : NULL;
  flow_tensor *r = d ? flow_to_device(d, t->device) : NULL;
  flow_tensor_decref(host);
  flow_tensor_decref(d);
  return r;
}

flow_tensor *flow_dropout(flow_tensor *t, double p) {
  if (p == 0) { flow_tensor_incref(t); return t; }
  return flow_dropout_at(t, p, flow_rng_reserve((uint64_t)flow_tensor_numel(t)));
}
