/* Matmul: Y = op(A) @ op(B) over broadcast batch axes (op = optional transpose of the last two
 * axes, so gradients need no transpose copies). Shape, dtype and gradient rules. */
#include "matmul.h"

#include "../kernels/cpu/cpu.h"
#include "../sbp/signature.h"
#include "elementwise.h"
#include "reduce.h"
#include "shape.h"

static int infer_matmul(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)nin;
  const flow_meta *x = &in[0], *y = &in[1];
  char sa[128], sb[128];
  if (x->ndim < 2 || y->ndim < 2)
    return flow_error_set("%s: expected tensors of at least 2 dimensions, got shapes %s and %s", op->name,
                          flow_shape_str(x->ndim, x->shape, sa, sizeof sa),
                          flow_shape_str(y->ndim, y->shape, sb, sizeof sb));
  if (flow_check_same_dtype(op, in, 2) != 0) return -1;
  if (!flow_dtype_is_float(x->dtype) && x->dtype != FLOW_I64 && x->dtype != FLOW_I32)
    return flow_error_set("%s: expected floating-point, int64 or int32 tensors (got %s)", op->name,
                          flow_dtype_name(x->dtype));
  bool ta = a->flags & FLOW_ATTR_TRANS_A, tb = a->flags & FLOW_ATTR_TRANS_B;
  int64_t m = x->shape[x->ndim - (ta ? 1 : 2)], k1 = x->shape[x->ndim - (ta ? 2 : 1)];
  int64_t k2 = y->shape[y->ndim - (tb ? 1 : 2)], n = y->shape[y->ndim - (tb ? 2 : 1)];
  if (k1 != k2)
    return flow_error_set("%s: shapes %s and %s do not match on the contracted axis (%lld vs %lld)",
                          op->name, flow_shape_str(x->ndim, x->shape, sa, sizeof sa),
                          flow_shape_str(y->ndim, y->shape, sb, sizeof sb), (long long)k1, (long long)k2);
  if (flow_broadcast_shape(op->name, x->ndim - 2, x->shape, y->ndim - 2, y->shape, &out->ndim, out->shape) != 0)
    return -1;
  out->shape[out->ndim++] = m;
  out->shape[out->ndim++] = n;
  out->dtype = x->dtype;
  out->device = x->device;
  return 0;
}

static FLOW_KERNEL(cpu_matmul) {
  (void)nin; (void)nout;
  return flow_cpu_matmul(out[0], in[0], in[1], a->flags & FLOW_ATTR_TRANS_A, a->flags & FLOW_ATTR_TRANS_B);
}

/* Y = A B:  dA = G B^T,  dB = A^T G  (with the transpose flags folded in), then summed over
 * batch axes the input was broadcast along. */
static int grad_matmul(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  bool ta = c->attrs->flags & FLOW_ATTR_TRANS_A, tb = c->attrs->flags & FLOW_ATTR_TRANS_B;
  flow_tensor *A = c->in[0], *B = c->in[1];
  for (int i = 0; i < 2; i++) {
    if (!c->need[i]) continue;
    flow_tensor *d;
    if (i == 0) d = ta ? flow_matmul(B, g, tb, true) : flow_matmul(g, B, false, !tb);
    else d = tb ? flow_matmul(g, A, true, ta) : flow_matmul(A, g, !ta, false);
    if (!d) return -1;
    gin[i] = flow_sum_to_shape(d, c->in_meta[i].ndim, c->in_meta[i].shape);
    flow_tensor_decref(d);
    if (!gin[i]) return -1;
  }
  return 0;
}

FLOW_OP(matmul) {.nin = 2, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(matmul, 0),
                 .infer = infer_matmul, .grad = grad_matmul, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, matmul, cpu_matmul)

/* torch.matmul's 1-D operands: a vector a is a row [1, k] and b a column [k, 1], batched with the
 * other operand, and the axis added is taken away again (vector . vector is 0-d). The views carry
 * the gradient back. */
flow_tensor *flow_matmul(flow_tensor *a, flow_tensor *b, bool trans_a, bool trans_b) {
  flow_attrs at;
  flow_attrs_init(&at);
  at.flags = (trans_a ? FLOW_ATTR_TRANS_A : 0) | (trans_b ? FLOW_ATTR_TRANS_B : 0);
  int na = flow_tensor_lndim(a), nb = flow_tensor_lndim(b);
  const int64_t *sa = flow_tensor_lshape(a), *sb = flow_tensor_lshape(b);
  bool va = na == 1, vb = nb == 1;
  if (!va && !vb && na && nb) return flow_op_call1(&flow_op_matmul, (flow_tensor *[]){a, b}, 2, &at);
  char s0[128], s1[128];
  flow_shape_str(na, sa, s0, sizeof s0);
  flow_shape_str(nb, sb, s1, sizeof s1);
  if (!na || !nb) {
    flow_error_set("matmul: both operands need at least 1 dimension (got shapes %s and %s)", s0, s1);
    return NULL;
  }
  if ((va && trans_a) || (vb && trans_b)) {
    flow_error_set("matmul: a 1-D operand cannot be transposed");
    return NULL;
  }
  int64_t ka = sa[na - (trans_a ? 2 : 1)], kb = sb[vb ? 0 : nb - (trans_b ? 1 : 2)];
  if (ka != kb) {
    flow_error_set("matmul: shapes %s and %s do not match on the contracted axis (%lld vs %lld)", s0, s1,
                   (long long)ka, (long long)kb);
    return NULL;
  }
  flow_tensor *a2 = va ? flow_unsqueeze(a, 0) : (flow_tensor_incref(a), a);
  flow_tensor *b2 = a2 ? (vb ? flow_unsqueeze(b, 1) : (flow_tensor_incref(b), b)) : NULL;
  flow_tensor *y = b2 ? flow_op_call1(&flow_op_matmul, (flow_tensor *[]){a2, b2}, 2, &at) : NULL;
  int nd = y ? flow_tensor_lndim(y) : 0;
  int64_t added[2] = {nd - 2, nd - 1};
  flow_tensor *r = !y ? NULL : va && vb ? flow_squeeze(y, 2, added) : flow_squeeze(y, 1, &added[va ? 0 : 1]);
  flow_decref_all((flow_tensor *[]){a2, b2, y}, 3);
  return r;
}

/* Linear: Y [N, out] = X [N, in] W[out, in]^T + b [out], the bias written before the GEMM adds onto
 * it (no separate add pass). flow.linear (nn.functional.linear with a bias) calls it
 * when a bias is given, on local and global tensors alike. */
static int infer_linear(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                        flow_meta *out) {
  (void)a;
  char sa[128], sb[128], sc[128];
  if (in[0].ndim != 2 || in[1].ndim != 2 || in[2].ndim != 1)
    return flow_error_set("%s: expected x [N, in], weight [out, in] and bias [out], got shapes %s, %s and %s",
                          op->name, flow_shape_str(in[0].ndim, in[0].shape, sa, sizeof sa),
                          flow_shape_str(in[1].ndim, in[1].shape, sb, sizeof sb),
                          flow_shape_str(in[2].ndim, in[2].shape, sc, sizeof sc));
  if (flow_check_same_dtype(op, in, nin) != 0) return -1;
  flow_attrs at;
  flow_attrs_init(&at);
  at.flags = FLOW_ATTR_TRANS_B;
  if (infer_matmul(op, in, 2, &at, out) != 0) return -1;
  if (in[2].shape[0] != out->shape[1])
    return flow_error_set("%s: bias has %lld elements, expected %lld (the weight's rows)", op->name,
                          (long long)in[2].shape[0], (long long)out->shape[1]);
  return 0;
}

static FLOW_KERNEL(cpu_linear) {
  (void)nin; (void)nout; (void)a;
  return flow_cpu_linear(out[0], in[0], in[1], in[2]);
}

/* dX = G W,  dW = G^T X,  db = G summed over rows (ops, so global tensors take their own rules) */
static int grad_linear(const flow_grad_ctx *c, flow_tensor **gin) {
  flow_tensor *g = c->gout[0];
  if (!g) return 0;
  if (c->need[0] && !(gin[0] = flow_matmul(g, c->in[1], false, false))) return -1;
  if (c->need[1] && !(gin[1] = flow_matmul(g, c->in[0], true, false))) return -1;
  if (c->need[2] && !(gin[2] = flow_sum_to_shape(g, c->in_meta[2].ndim, c->in_meta[2].shape))) return -1;
  return 0;
}

FLOW_OP(linear) {.nin = 3, .nout = 1, .cpu_half = true, .sbp = FLOW_SBP_RULE(linear, 0),
                 .infer = infer_linear, .grad = grad_linear, .save_in = 3};
FLOW_KERNEL_REGISTER(FLOW_CPU, linear, cpu_linear)

flow_tensor *flow_linear(flow_tensor *x, flow_tensor *w, flow_tensor *b) {
  return flow_op_call1(&flow_op_linear, (flow_tensor *[]){x, w, b}, 3, flow_attrs_default());
}
