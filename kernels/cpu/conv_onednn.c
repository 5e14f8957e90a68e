/* conv2d, max/avg pool2d and batch norm on oneDNN (float32, NCHW as stored), forward and backward;
 * bf16 convolution under autocast. float64, and shapes oneDNN declines, run the reference kernels
 * in conv.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "nn.h"
#include "onednn.h"

bool flow_cpu_conv_reference = false;

/* Which primitive a key builds. */
enum kind { CONV_FWD, CONV_BWD_DATA, CONV_BWD_WEIGHTS, POOL_FWD, POOL_BWD, BN_FWD, BN_BWD };

typedef struct desc {
  enum kind kind;
  const flow_conv_geom *g;
  dnnl_data_type_t dt;   /* conv src/weights (and diff_dst): f32, or bf16 under autocast */
  bool bias, max, training;
  int64_t S;             /* batch norm: spatial size; N = g->N, C = g->C */
  float eps;
} desc;

static dnnl_status_t md4(dnnl_memory_desc_t *md, int64_t a, int64_t b, int64_t c, int64_t d, dnnl_data_type_t dt) {
  dnnl_dims_t dims = {a, b, c, d};
  return dnnl_memory_desc_init_by_tag(md, 4, dims, dt, dnnl_nchw);
}

/* Convolution operands as the tensors hold them (float32 NCHW images, goihw weights), or with the
 * layout left to oneDNN (`any`): its direct convolutions want blocked layouts (nChw16c, ...), and
 * on the plain ones it falls back to im2col + GEMM, 5-10x slower on small images. */
static dnnl_status_t conv_mds(const flow_conv_geom *g, dnnl_data_type_t dx, dnnl_data_type_t dw, dnnl_data_type_t dy,
                              bool any, dnnl_memory_desc_t *x, dnnl_memory_desc_t *w, dnnl_memory_desc_t *y) {
  dnnl_dims_t xd = {g->N, g->C, g->H, g->W}, yd = {g->N, g->O, g->OH, g->OW};
  dnnl_dims_t wd = {g->groups, g->O / g->groups, g->C / g->groups, g->kh, g->kw};
  dnnl_status_t s;
  if ((s = dnnl_memory_desc_init_by_tag(x, 4, xd, dx, any ? dnnl_format_tag_any : dnnl_nchw)) ||
      (s = dnnl_memory_desc_init_by_tag(y, 4, yd, dy, any ? dnnl_format_tag_any : dnnl_nchw)))
    return s;
  return dnnl_memory_desc_init_by_tag(w, 5, wd, dw, any ? dnnl_format_tag_any : dnnl_goihw);
}

/* oneDNN's right padding: the output size fixes it, (OH - 1) sh + (kh - 1) dh + 1 = H + ph + pr. */
static void pads(const flow_conv_geom *g, dnnl_dims_t l, dnnl_dims_t r) {
  l[0] = g->ph;
  l[1] = g->pw;
  r[0] = (g->OH - 1) * g->sh + (g->kh - 1) * g->dh + 1 - g->H - g->ph;
  r[1] = (g->OW - 1) * g->sw + (g->kw - 1) * g->dw + 1 - g->W - g->pw;
}

static dnnl_status_t conv_fwd_pd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const desc *d) {
  const flow_conv_geom *g = d->g;
  dnnl_memory_desc_t x, w, b, y;
  dnnl_dims_t bd = {g->O}, st = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1}, pl, pr;
  pads(g, pl, pr);
  dnnl_status_t s;
  if ((s = conv_mds(g, d->dt, d->dt, dnnl_f32, true, &x, &w, &y)) ||
      (s = dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_a)))
    return s;
  dnnl_convolution_desc_t cd;
  if ((s = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &x, &w,
                                                      d->bias ? &b : NULL, &y, st, dil, pl, pr)))
    return s;
  return dnnl_primitive_desc_create(pd, &cd, NULL, eng, NULL);
}

static dnnl_status_t conv_bwd_pd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const desc *d) {
  const flow_conv_geom *g = d->g;
  dnnl_primitive_desc_t hint;
  dnnl_status_t s = conv_fwd_pd(&hint, eng, d);
  if (s) return s;
  dnnl_memory_desc_t x, w, b, y;
  dnnl_dims_t bd = {g->O}, st = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1}, pl, pr;
  pads(g, pl, pr);
  bool data = d->kind == CONV_BWD_DATA;
  /* backward data: dx f32 from bf16 w, dy; backward weights: dw, db f32 from bf16 x, dy */
  if (!(s = conv_mds(g, data ? dnnl_f32 : d->dt, data ? d->dt : dnnl_f32, d->dt, true, &x, &w, &y)) &&
      !(s = dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_a))) {
    dnnl_convolution_desc_t cd;
    s = data ? dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &x, &w, &y, st, dil,
                                                                pl, pr)
             : dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &x, &w, &b, &y, st,
                                                                   dil, pl, pr);
    if (!s) s = dnnl_primitive_desc_create(pd, &cd, NULL, eng, hint);
  }
  dnnl_primitive_desc_destroy(hint);
  return s;
}

static dnnl_status_t pool_pd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const desc *d, bool fwd) {
  const flow_conv_geom *g = d->g;
  dnnl_memory_desc_t x, y;
  dnnl_dims_t st = {g->sh, g->sw}, k = {g->kh, g->kw}, dil = {0, 0}, pl, pr;
  pads(g, pl, pr);
  dnnl_alg_kind_t alg = d->max ? dnnl_pooling_max : dnnl_pooling_avg_include_padding;
  dnnl_status_t s;
  if ((s = md4(&x, g->N, g->C, g->H, g->W, dnnl_f32)) || (s = md4(&y, g->N, g->C, g->OH, g->OW, dnnl_f32)))
    return s;
  dnnl_pooling_v2_desc_t fd, bd;
  if ((s = dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_training, alg, &x, &y, st, k, dil, pl, pr))) return s;
  if (fwd) return dnnl_primitive_desc_create(pd, &fd, NULL, eng, NULL);
  dnnl_primitive_desc_t hint;
  if ((s = dnnl_primitive_desc_create(&hint, &fd, NULL, eng, NULL))) return s;
  s = dnnl_pooling_v2_backward_desc_init(&bd, alg, &x, &y, st, k, dil, pl, pr);
  if (!s) s = dnnl_primitive_desc_create(pd, &bd, NULL, eng, hint);
  dnnl_primitive_desc_destroy(hint);
  return s;
}

/* Batch norm over x seen as [N, C, S, 1]. Training forward computes the batch statistics; eval and
 * every backward take mean and variance as inputs. */
static dnnl_status_t bn_pd(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const desc *d, bool fwd) {
  dnnl_memory_desc_t x;
  dnnl_status_t s = md4(&x, d->g->N, d->g->C, d->S, 1, dnnl_f32);
  if (s) return s;
  unsigned flags = dnnl_use_scaleshift | (d->training ? 0 : dnnl_use_global_stats);
  dnnl_batch_normalization_desc_t fd, bd;
  if ((s = dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &x, d->eps, flags))) return s;
  if (fwd) return dnnl_primitive_desc_create(pd, &fd, NULL, eng, NULL);
  dnnl_primitive_desc_t hint;
  if ((s = dnnl_primitive_desc_create(&hint, &fd, NULL, eng, NULL))) return s;
  s = dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &x, &x, d->eps, flags);
  if (!s) s = dnnl_primitive_desc_create(pd, &bd, NULL, eng, hint);
  dnnl_primitive_desc_destroy(hint);
  return s;
}

static dnnl_status_t build(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const void *ctx) {
  const desc *d = ctx;
  switch (d->kind) {
  case CONV_FWD: return conv_fwd_pd(pd, eng, d);
  case CONV_BWD_DATA:
  case CONV_BWD_WEIGHTS: return conv_bwd_pd(pd, eng, d);
  case POOL_FWD: return pool_pd(pd, eng, d, true);
  case POOL_BWD: return pool_pd(pd, eng, d, false);
  case BN_FWD: return bn_pd(pd, eng, d, true);
  case BN_BWD: return bn_pd(pd, eng, d, false);
  }
  return dnnl_invalid_arguments;
}

static flow_onednn_key key_of(const desc *d) {
  flow_onednn_key k = {0};
  const int64_t *g = &d->g->N;
  flow_onednn_key_add(&k, 'C');
  flow_onednn_key_add(&k, d->kind);
  for (size_t i = 0; i < sizeof *d->g / sizeof *g; i++) flow_onednn_key_add(&k, g[i]);
  flow_onednn_key_add(&k, d->dt);
  flow_onednn_key_add(&k, d->bias | d->max << 1 | d->training << 2);
  flow_onednn_key_add(&k, d->S);
  union { float f; uint32_t u; } e = {d->eps};
  flow_onednn_key_add(&k, e.u);
  return k;
}

static int run(const char *op, const desc *d, int nargs, const flow_onednn_arg *args) {
  flow_onednn_key k = key_of(d);
  return flow_onednn_run(op, &k, build, d, nargs, args);
}

/* Whether the oneDNN path takes this call: float32, and the reference not asked for. */
static bool takes(const flow_tensor *x) { return x->dtype == FLOW_F32 && !flow_cpu_conv_reference; }

/* ---- convolution ----------------------------------------------------------------------------- */

/* One operand of the convolution d: `plain` says how the tensor holds it (float32, NCHW or goihw),
 * the primitive's own descriptor how it wants it. Where they differ the data goes through tmp, a
 * buffer from the tensor allocator, reordered (and rounded to bf16 under autocast) on the way in,
 * or back to the tensor after the run for an output. */
typedef struct operand {
  int arg;
  dnnl_memory_desc_t plain, want;
  void *data;         /* the tensor's */
  flow_tensor *tmp;   /* NULL when the layouts agree */
} operand;

/* Point o at data; make its buffer when the primitive wants another layout; reorder an input in. */
static int operand_in(const desc *d, operand *o, const void *data, bool input) {
  flow_onednn_key k = key_of(d);
  o->data = (void *)data;
  o->tmp = NULL;
  if (flow_onednn_arg_md("conv2d", &k, build, d, o->arg, &o->want) != 0) return -1;
  if (dnnl_memory_desc_equal(&o->plain, &o->want)) return 0;
  int64_t n = (int64_t)((dnnl_memory_desc_get_size(&o->want) + sizeof(float) - 1) / sizeof(float));
  if (!(o->tmp = flow_tensor_new(FLOW_F32, FLOW_DEVICE_CPU, 1, &n))) return -1;
  if (!input) return 0;
  flow_onednn_key_add(&k, 'I');
  flow_onednn_key_add(&k, o->arg);
  return flow_onednn_reorder("conv2d", &k, &o->plain, data, &o->want, flow_tensor_data(o->tmp));
}

/* The pointer the primitive runs on. */
static const void *operand_data(const operand *o) { return o->tmp ? flow_tensor_data(o->tmp) : o->data; }

/* An output computed into the buffer goes back to the tensor. */
static int operand_out(const desc *d, const operand *o) {
  if (!o->tmp) return 0;
  flow_onednn_key k = key_of(d);
  flow_onednn_key_add(&k, 'O');
  flow_onednn_key_add(&k, o->arg);
  return flow_onednn_reorder("conv2d", &k, &o->want, flow_tensor_data(o->tmp), &o->plain, o->data);
}

static void operands_free(operand *o, int n) {
  for (int i = 0; i < n; i++) flow_tensor_decref(o[i].tmp);
}

/* The plain descriptors of x, w and y (as the tensors hold them). */
static int plain_mds(const flow_conv_geom *g, operand *x, operand *w, operand *y) {
  if (conv_mds(g, dnnl_f32, dnnl_f32, dnnl_f32, false, &x->plain, &w->plain, &y->plain) != dnnl_success)
    return flow_error_set("conv2d: oneDNN cannot describe this convolution");
  return 0;
}

int flow_cpu_conv2d_forward(flow_tensor *y, const flow_tensor *x, const flow_tensor *w, const flow_tensor *bias,
                            const flow_conv_geom *g) {
  if (!takes(x)) return flow_cpu_conv2d_forward_reference(y, x, w, bias, g);
  flow_tensor *tx, *tw = NULL, *tb = NULL;
  const float *px = flow_cpu_dense(x, &tx), *pw = px ? flow_cpu_dense(w, &tw) : NULL;
  const float *pb = pw && bias ? flow_cpu_dense(bias, &tb) : NULL;
  operand o[3] = {{.arg = DNNL_ARG_SRC}, {.arg = DNNL_ARG_WEIGHTS}, {.arg = DNNL_ARG_DST}};
  int rc = -1;
  if (pw && (!bias || pb)) {
    desc d = {CONV_FWD, g, flow_onednn_bf16() ? dnnl_bf16 : dnnl_f32, bias != NULL, false, false, 0, 0};
    rc = plain_mds(g, &o[0], &o[1], &o[2]);
    if (rc == 0) rc = operand_in(&d, &o[0], px, true);
    if (rc == 0) rc = operand_in(&d, &o[1], pw, true);
    if (rc == 0) rc = operand_in(&d, &o[2], flow_tensor_data(y), false);
    if (rc == 0) {
      flow_onednn_arg args[4] = {{DNNL_ARG_SRC, operand_data(&o[0])}, {DNNL_ARG_WEIGHTS, operand_data(&o[1])},
                                 {DNNL_ARG_DST, operand_data(&o[2])}, {DNNL_ARG_BIAS, pb}};
      rc = run("conv2d", &d, bias ? 4 : 3, args);
    }
    if (rc == 0) rc = operand_out(&d, &o[2]);
  }
  operands_free(o, 3);
  flow_tensor_decref(tx);
  flow_tensor_decref(tw);
  flow_tensor_decref(tb);
  return rc;
}

/* backward data: dx from dy and w; backward weights: dw and db from dy and x. */
int flow_cpu_conv2d_backward(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                             const flow_tensor *x, const flow_tensor *w, const flow_conv_geom *g) {
  if (!takes(x)) return flow_cpu_conv2d_backward_reference(dx, dw, db, dy, x, w, g);
  flow_tensor *ty, *tx = NULL, *tw = NULL;
  const float *py = flow_cpu_dense(dy, &ty), *px = py ? flow_cpu_dense(x, &tx) : NULL;
  const float *pw = px ? flow_cpu_dense(w, &tw) : NULL;
  /* bwd data: dy, w -> dx; bwd weights: dy, x -> dw */
  operand od[3] = {{.arg = DNNL_ARG_DIFF_DST}, {.arg = DNNL_ARG_WEIGHTS}, {.arg = DNNL_ARG_DIFF_SRC}};
  operand ow[3] = {{.arg = DNNL_ARG_DIFF_DST}, {.arg = DNNL_ARG_SRC}, {.arg = DNNL_ARG_DIFF_WEIGHTS}};
  int rc = -1;
  if (pw) {
    dnnl_data_type_t dt = flow_onednn_bf16() ? dnnl_bf16 : dnnl_f32;
    desc dd = {CONV_BWD_DATA, g, dt, true, false, false, 0, 0};
    desc dwd = {CONV_BWD_WEIGHTS, g, dt, true, false, false, 0, 0};
    rc = plain_mds(g, &od[2], &od[1], &od[0]);
    if (rc == 0) rc = plain_mds(g, &ow[1], &ow[2], &ow[0]);
    if (rc == 0) rc = operand_in(&dd, &od[0], py, true);
    if (rc == 0) rc = operand_in(&dd, &od[1], pw, true);
    if (rc == 0) rc = operand_in(&dd, &od[2], flow_tensor_data(dx), false);
    if (rc == 0) {
      flow_onednn_arg a[3] = {{DNNL_ARG_DIFF_DST, operand_data(&od[0])}, {DNNL_ARG_WEIGHTS, operand_data(&od[1])},
                              {DNNL_ARG_DIFF_SRC, operand_data(&od[2])}};
      rc = run("conv2d", &dd, 3, a);
    }
    if (rc == 0) rc = operand_out(&dd, &od[2]);
    if (rc == 0) rc = operand_in(&dwd, &ow[0], py, true);
    if (rc == 0) rc = operand_in(&dwd, &ow[1], px, true);
    if (rc == 0) rc = operand_in(&dwd, &ow[2], flow_tensor_data(dw), false);
    if (rc == 0) {
      flow_onednn_arg a[4] = {{DNNL_ARG_DIFF_DST, operand_data(&ow[0])}, {DNNL_ARG_SRC, operand_data(&ow[1])},
                              {DNNL_ARG_DIFF_WEIGHTS, operand_data(&ow[2])}, {DNNL_ARG_DIFF_BIAS, flow_tensor_data(db)}};
      rc = run("conv2d", &dwd, 4, a);
    }
    if (rc == 0) rc = operand_out(&dwd, &ow[2]);
  }
  operands_free(od, 3);
  operands_free(ow, 3);
  flow_tensor_decref(ty);
  flow_tensor_decref(tx);
  flow_tensor_decref(tw);
  return rc;
}

/* ---- pooling --------------------------------------------------------------------------------- */

int flow_cpu_pool2d_forward(flow_tensor *y, const flow_tensor *x, const flow_conv_geom *g, bool max) {
  if (!takes(x)) return flow_cpu_pool2d_forward_reference(y, x, g, max);
  desc d = {POOL_FWD, g, dnnl_f32, false, max, false, 0, 0};
  flow_onednn_key k = key_of(&d);
  size_t ws = 0;
  if (max && flow_onednn_workspace_size("pool2d", &k, build, &d, &ws) != 0) return -1;
  flow_tensor *tx;
  const float *px = flow_cpu_dense(x, &tx);
  void *work = px && ws ? malloc(ws) : NULL;
  int rc = -1;
  if (px && (work || !ws)) {
    flow_onednn_arg args[3] = {{DNNL_ARG_SRC, px}, {DNNL_ARG_DST, flow_tensor_data(y)}, {DNNL_ARG_WORKSPACE, work}};
    rc = flow_onednn_run("pool2d", &k, build, &d, ws ? 3 : 2, args);
  } else if (px) {
    flow_error_set("pool2d: out of memory for a %zu-byte workspace", ws);
  }
  free(work);
  flow_tensor_decref(tx);
  return rc;
}

/* Max pooling's backward needs the forward's argmax (its workspace): the forward runs again into a
 * scratch output. */
int flow_cpu_pool2d_backward(flow_tensor *dx, const flow_tensor *dy, const flow_tensor *x, const flow_conv_geom *g,
                             bool max) {
  if (!takes(x)) return flow_cpu_pool2d_backward_reference(dx, dy, x, g, max);
  desc fd = {POOL_FWD, g, dnnl_f32, false, max, false, 0, 0}, bd = fd;
  bd.kind = POOL_BWD;
  flow_onednn_key k = key_of(&fd);
  size_t ws = 0;
  if (max && flow_onednn_workspace_size("pool2d", &k, build, &fd, &ws) != 0) return -1;
  flow_tensor *ty, *tx = NULL;
  const float *py = flow_cpu_dense(dy, &ty), *px = py && max ? flow_cpu_dense(x, &tx) : NULL;
  void *work = ws ? malloc(ws) : NULL;
  float *scratch = ws ? malloc((size_t)flow_tensor_numel(dy) * sizeof(float) + 1) : NULL;
  int rc = -1;
  if (ws && (!work || !scratch)) flow_error_set("pool2d: out of memory for a %zu-byte workspace", ws);
  else if (py && (px || !max)) {
    flow_onednn_arg fa[3] = {{DNNL_ARG_SRC, px}, {DNNL_ARG_DST, scratch}, {DNNL_ARG_WORKSPACE, work}};
    flow_onednn_arg ba[3] = {{DNNL_ARG_DIFF_DST, py}, {DNNL_ARG_DIFF_SRC, flow_tensor_data(dx)},
                             {DNNL_ARG_WORKSPACE, work}};
    rc = max ? flow_onednn_run("pool2d", &k, build, &fd, 3, fa) : 0;
    if (rc == 0) rc = run("pool2d", &bd, ws ? 3 : 2, ba);
  }
  free(work);
  free(scratch);
  flow_tensor_decref(ty);
  flow_tensor_decref(tx);
  return rc;
}

/* ---- batch norm ------------------------------------------------------------------------------ */

/* [C] values of t (any stride) as dense floats into out. */
static void gather(float *out, const flow_tensor *t) {
  const float *p = flow_tensor_data(t);
  for (int64_t c = 0; c < t->shape[0]; c++) out[c] = p[c * t->stride[0]];
}

/* Per channel of x [N, C, S]: the batch mean and biased variance (the reference's moments). */
static void moments(const float *x, int64_t N, int64_t C, int64_t S, float *mean, float *var) {
  for (int64_t c = 0; c < C; c++) {
    double m, v;
    flow_cpu_bn_moments_f32(x, N, C, S, c, &m, &v);
    mean[c] = (float)m;
    var[c] = (float)v;
  }
}

int flow_cpu_batchnorm_forward(flow_tensor *y, const flow_tensor *x, const flow_tensor *w, const flow_tensor *b,
                               flow_tensor *rm, flow_tensor *rv, bool training, double momentum, double eps) {
  int64_t S = flow_shape_numel(x->ndim - 2, x->shape + 2), N = x->shape[0], C = x->shape[1];
  if (!takes(x) || N * S == 0)
    return flow_cpu_batchnorm_forward_reference(y, x, w, b, rm, rv, training, momentum, eps);
  flow_conv_geom g = {.N = N, .C = C};
  desc d = {BN_FWD, &g, dnnl_f32, false, false, training, S, (float)eps};
  float *stats = malloc((size_t)(4 * C + 1) * sizeof(float));   /* scale, shift, mean, var */
  flow_tensor *tx;
  const float *px = stats ? flow_cpu_dense(x, &tx) : NULL;
  if (!px) {
    free(stats);
    return stats ? -1 : flow_error_set("batch_norm: out of memory for %lld channels", (long long)C);
  }
  float *scale = stats, *shift = stats + C, *mean = stats + 2 * C, *var = stats + 3 * C;
  gather(scale, w);
  gather(shift, b);
  if (!training) {
    gather(mean, rm);
    gather(var, rv);
  }
  flow_onednn_arg args[5] = {{DNNL_ARG_SRC, px}, {DNNL_ARG_DST, flow_tensor_data(y)}, {DNNL_ARG_SCALE_SHIFT, scale},
                             {DNNL_ARG_MEAN, mean}, {DNNL_ARG_VARIANCE, var}};
  int rc = run("batch_norm", &d, 5, args);
  if (rc == 0 && training) {
    /* rm = (1 - m) rm + m mean;  rv = (1 - m) rv + m var M / (M - 1) (unbiased) */
    int64_t M = N * S;
    float *prm = flow_tensor_data(rm), *prv = flow_tensor_data(rv);
    for (int64_t c = 0; c < C; c++) {
      float *a = prm + c * rm->stride[0], *v = prv + c * rv->stride[0];
      *a = (float)((1 - momentum) * *a + momentum * mean[c]);
      *v = (float)((1 - momentum) * *v + momentum * (M > 1 ? (double)var[c] * M / (M - 1) : var[c]));
    }
  }
  free(stats);
  flow_tensor_decref(tx);
  return rc;
}

int flow_cpu_batchnorm_backward(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                const flow_tensor *x, const flow_tensor *w, const flow_tensor *rm,
                                const flow_tensor *rv, bool training, double eps) {
  int64_t S = flow_shape_numel(x->ndim - 2, x->shape + 2), N = x->shape[0], C = x->shape[1];
  if (!takes(x) || N * S == 0)
    return flow_cpu_batchnorm_backward_reference(dx, dw, db, dy, x, w, rm, rv, training, eps);
  flow_conv_geom g = {.N = N, .C = C};
  desc d = {BN_BWD, &g, dnnl_f32, false, false, training, S, (float)eps};
  float *stats = malloc((size_t)(6 * C + 1) * sizeof(float));   /* scale and shift, mean, var, d(scale and shift) */
  flow_tensor *tx = NULL, *ty = NULL;
  const float *px = stats ? flow_cpu_dense(x, &tx) : NULL, *py = px ? flow_cpu_dense(dy, &ty) : NULL;
  int rc = -1;
  if (!stats) {
    flow_error_set("batch_norm: out of memory for %lld channels", (long long)C);
  } else if (py) {
    float *scale = stats, *mean = stats + 2 * C, *var = stats + 3 * C, *dss = stats + 4 * C;
    gather(scale, w);
    memset(scale + C, 0, (size_t)C * sizeof(float));
    if (training) moments(px, N, C, S, mean, var);
    else {
      gather(mean, rm);
      gather(var, rv);
    }
    flow_onednn_arg args[7] = {{DNNL_ARG_SRC, px},     {DNNL_ARG_DIFF_DST, py},  {DNNL_ARG_SCALE_SHIFT, scale},
                               {DNNL_ARG_MEAN, mean},  {DNNL_ARG_VARIANCE, var}, {DNNL_ARG_DIFF_SRC, flow_tensor_data(dx)},
                               {DNNL_ARG_DIFF_SCALE_SHIFT, dss}};
    rc = run("batch_norm", &d, 7, args);
    if (rc == 0) {
      memcpy(flow_tensor_data(dw), dss, (size_t)C * sizeof(float));
      memcpy(flow_tensor_data(db), dss + C, (size_t)C * sizeof(float));
    }
  }
  free(stats);
  flow_tensor_decref(tx);
  flow_tensor_decref(ty);
  return rc;
}
