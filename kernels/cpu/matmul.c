/* Matmul: C[b] = op(A[b]) @ op(B[b]) for every (broadcast) batch index b. float32 and bfloat16
 * (where the CPU has AVX512-BF16) run on oneDNN's matmul primitive, all batches in one call;
 * float64 on OpenBLAS's dgemm (oneDNN has no f64 on the CPU), a batch at a time; int64/int32 on the
 * plain loop. Operands whose last two axes are row- or column-major go straight to GEMM; anything
 * else is copied to contiguous first. A plain loop serves as the tests' reference and the integer
 * product. */
#include <cblas.h>
#include <string.h>

#include "../registry.h"
#include "cpu.h"
#include "onednn.h"

/* How GEMM can read a matrix with strides (rs, cs): row-major (ld = rs), column-major (ld = cs). */
static bool gemm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *trans, int64_t *ld) {
  int64_t r_ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
  if ((cs == 1 || cols == 1) && r_ld >= (cols > 1 ? cols : 1)) { *trans = false; *ld = r_ld; return true; }
  int64_t c_ld = cols == 1 ? (rows > 1 ? rows : 1) : cs;
  if ((rs == 1 || rows == 1) && c_ld >= (rows > 1 ? rows : 1)) { *trans = true; *ld = c_ld; return true; }
  return false;
}

typedef struct operand {
  const flow_tensor *t;
  flow_tensor *tmp;   /* contiguous copy when the layout did not fit GEMM */
  bool trans;         /* as stored, relative to the logical (pre-flag) matrix */
  int64_t ld;
} operand;

static int prepare(operand *o, const flow_tensor *t) {
  o->t = t;
  o->tmp = NULL;
  int n = t->ndim;
  if (gemm_layout(t->shape[n - 2], t->shape[n - 1], t->stride[n - 2], t->stride[n - 1], &o->trans, &o->ld))
    return 0;
  o->tmp = flow_tensor_new(t->dtype, t->device, t->ndim, t->shape);
  if (!o->tmp) return -1;
  flow_cpu_copy(o->tmp, t);
  o->t = o->tmp;
  o->trans = false;
  o->ld = t->shape[n - 1];
  return 0;
}

/* Element offset of batch index `bi` (over out's batch shape) into operand t, with broadcast. */
static int64_t batch_offset(const flow_tensor *t, const flow_tensor *out, int64_t bi) {
  int nb_out = out->ndim - 2, nb = t->ndim - 2;
  int64_t off = 0;
  for (int d = nb_out - 1; d >= 0; d--) {
    int64_t idx = bi % out->shape[d];
    bi /= out->shape[d];
    int td = d - (nb_out - nb);
    if (td >= 0 && t->shape[td] != 1) off += idx * t->stride[td];
  }
  return off;
}

/* Operand o as oneDNN's logical matrix op(t) [batch..., rows, cols] over out's ndim: batch axes
 * padded with 1 on the left (1 broadcasts), the transpose folded into the strides. */
static flow_onednn_mat logical(const operand *o, const flow_tensor *out, bool trans) {
  const flow_tensor *t = o->t;
  /* a contiguous copy made here is a temporary: only the caller's tensor is worth a cached bf16 copy */
  flow_onednn_mat m = {.ndim = out->ndim, .data = flow_tensor_data(t), .storage = o->tmp ? NULL : t->storage};
  int pad = out->ndim - t->ndim;
  for (int d = 0; d < out->ndim - 2; d++) {
    bool bcast = d < pad || t->stride[d - pad] == 0;   /* an expanded axis broadcasts like a 1 */
    m.dims[d] = bcast ? 1 : t->shape[d - pad];
    m.strides[d] = bcast ? 0 : t->stride[d - pad];
  }
  int n = out->ndim;
  int64_t r = t->shape[t->ndim - 2], c = t->shape[t->ndim - 1];
  /* stored (r, c) read with leading dimension ld; flipped when stored transposed */
  int64_t rs = o->trans ? 1 : o->ld, cs = o->trans ? o->ld : 1;
  m.dims[n - 2] = trans ? c : r;
  m.dims[n - 1] = trans ? r : c;
  m.strides[n - 2] = trans ? cs : rs;
  m.strides[n - 1] = trans ? rs : cs;
  return m;
}

/* float32, or bf16 operands and output (bias float32) */
static int matmul_f32(flow_tensor *out, const operand *A, const operand *B, bool ta, bool tb,
                      const flow_tensor *bias) {
  flow_onednn_mat a = logical(A, out, ta), b = logical(B, out, tb);
  a.bf16 = b.bf16 = A->t->dtype == FLOW_BF16;
  flow_onednn_mat c = {.ndim = out->ndim, .data = flow_tensor_data(out), .bf16 = out->dtype == FLOW_BF16};
  for (int d = 0; d < out->ndim; d++) {
    c.dims[d] = out->shape[d];
    c.strides[d] = out->stride[d];
  }
  return flow_onednn_gemm(bias ? "linear" : "matmul", &a, &b, &c, bias ? flow_tensor_data(bias) : NULL, 1, 0);
}

/* C = op(A) op(B), or with a bias: C = op(A) op(B) + bias (bias [N] contiguous, broadcast over
 * rows). float64 writes the bias into C first so GEMM adds onto it (beta = 1): one pass over C
 * instead of GEMM's zero fill plus a separate add; oneDNN takes the bias as an input. */
static int matmul(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool ta, bool tb,
                  const flow_tensor *bias) {
  /* bf16 on oneDNN's bf16 GEMM where the CPU has one; other half cases on float32 copies */
  int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
  if (a->dtype == FLOW_F16 || (a->dtype == FLOW_BF16 && (!flow_onednn_bf16_native() || K == 0)))
    return FLOW_KERNEL_F32;
  if (a->dtype != FLOW_F32 && a->dtype != FLOW_F64 && a->dtype != FLOW_BF16)
    return flow_cpu_matmul_reference(out, a, b, ta, tb); /* integers */
  operand A, B;
  if (prepare(&A, a) != 0) return -1;
  if (prepare(&B, b) != 0) { flow_tensor_decref(A.tmp); return -1; }
  if (a->dtype != FLOW_F64) {
    flow_tensor *wide = NULL;   /* a bf16 bias, in the float32 oneDNN adds */
    int rc = 0;
    if (bias && bias->dtype == FLOW_BF16) {
      if (!(wide = flow_tensor_new(FLOW_F32, bias->device, 1, bias->shape))) rc = -1;
      else flow_cpu_copy(wide, bias);
    }
    if (rc == 0) rc = matmul_f32(out, &A, &B, ta, tb, wide ? wide : bias);
    flow_tensor_decref(wide);
    flow_tensor_decref(A.tmp);
    flow_tensor_decref(B.tmp);
    return rc;
  }
  int n = out->ndim;
  int64_t M = out->shape[n - 2], N = out->shape[n - 1];
  int64_t batches = flow_shape_numel(n - 2, out->shape);
  CBLAS_TRANSPOSE opA = (A.trans != ta) ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE opB = (B.trans != tb) ? CblasTrans : CblasNoTrans;
  /* GEMM reads row-major matrices; a transposed-stored operand is the same memory read column-major */
  size_t es = flow_dtype_size(a->dtype);
  char *pa = flow_tensor_data(A.t), *pb = flow_tensor_data(B.t), *pc = flow_tensor_data(out);
  for (int64_t bi = 0; bi < batches; bi++) {
    char *xa = pa + batch_offset(A.t, out, bi) * (int64_t)es;
    char *xb = pb + batch_offset(B.t, out, bi) * (int64_t)es;
    char *xc = pc + bi * M * N * (int64_t)es;
    if (bias) {
      const char *pbias = flow_tensor_data(bias);
      for (int64_t r = 0; r < M; r++) memcpy(xc + r * N * (int64_t)es, pbias, (size_t)N * es);
    } else if (K == 0) {
      memset(xc, 0, (size_t)(M * N) * es);
    }
    if (K == 0) continue;
    cblas_dgemm(CblasRowMajor, opA, opB, (int)M, (int)N, (int)K, 1.0, (const double *)xa, (int)A.ld,
                (const double *)xb, (int)B.ld, bias ? 1.0 : 0.0, (double *)xc, (int)N);
  }
  flow_tensor_decref(A.tmp);
  flow_tensor_decref(B.tmp);
  return 0;
}

int flow_cpu_matmul(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool ta, bool tb) {
  return matmul(out, a, b, ta, tb, NULL);
}

int flow_cpu_linear(flow_tensor *out, const flow_tensor *x, const flow_tensor *w, const flow_tensor *bias) {
  flow_tensor *tmp = NULL;
  if (bias->stride[0] != 1 && bias->shape[0] > 1) {
    tmp = flow_tensor_new(bias->dtype, bias->device, 1, bias->shape);
    if (!tmp) return -1;
    flow_cpu_copy(tmp, bias);
    bias = tmp;
  }
  int rc = matmul(out, x, w, false, true, bias);
  flow_tensor_decref(tmp);
  return rc;
}

/* One GEMM for kernels that work a matrix at a time (generic.h's GEMM): C [M, N] (leading
 * dimension ldc) = alpha op(A) op(B) + beta C, row-major operands. */
int flow_cpu_gemm_f32(const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  return flow_onednn_sgemm(op, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int flow_cpu_gemm_f64(const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                      const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
                      int64_t ldc) {
  (void)op;
  if (M == 0 || N == 0) return 0;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
              alpha, A, (int)(lda > 0 ? lda : 1), B, (int)(ldb > 0 ? ldb : 1), beta, C, (int)(ldc > 0 ? ldc : 1));
  return 0;
}

/* ---- the plain loop: the tests' reference, and the integer matmul ---------------------------- */

/* out[b, i, j] = sum_k op(A)[b, i, k] op(B)[b, k, j] over any strides and broadcast batch axes,
 * accumulated in ACC: double for float32/float64, int64 (wrapping, as torch) for int64/int32. */
#define DEF_PLAIN(NAME, T, ACC)                                                                          \
  static void NAME(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool ta, bool tb) {     \
    int n = out->ndim, na = a->ndim, nb = b->ndim;                                                       \
    int64_t M = out->shape[n - 2], N = out->shape[n - 1], K = ta ? a->shape[na - 2] : a->shape[na - 1];  \
    int64_t ars = a->stride[na - 2], acs = a->stride[na - 1], brs = b->stride[nb - 2], bcs = b->stride[nb - 1]; \
    int64_t sam = ta ? acs : ars, sak = ta ? ars : acs, sbk = tb ? bcs : brs, sbn = tb ? brs : bcs;      \
    int64_t batches = flow_shape_numel(n - 2, out->shape);                                               \
    const T *pa = flow_tensor_data(a), *pb = flow_tensor_data(b);                                        \
    T *pc = flow_tensor_data(out);                                                                       \
    for (int64_t bi = 0; bi < batches; bi++) {                                                           \
      int64_t oa = batch_offset(a, out, bi), ob = batch_offset(b, out, bi), oc = 0, rest = bi;           \
      for (int d = n - 3; d >= 0; d--) {                                                                 \
        oc += (rest % out->shape[d]) * out->stride[d];                                                   \
        rest /= out->shape[d];                                                                           \
      }                                                                                                  \
      for (int64_t i = 0; i < M; i++)                                                                    \
        for (int64_t j = 0; j < N; j++) {                                                                \
          ACC s = 0;                                                                                     \
          for (int64_t k = 0; k < K; k++) s += (ACC)pa[oa + i * sam + k * sak] * (ACC)pb[ob + k * sbk + j * sbn]; \
          pc[oc + i * out->stride[n - 2] + j * out->stride[n - 1]] = (T)s;                               \
        }                                                                                                \
    }                                                                                                    \
  }
DEF_PLAIN(plain_f32, float, double)
DEF_PLAIN(plain_f64, double, double)
DEF_PLAIN(plain_i64, int64_t, int64_t)
DEF_PLAIN(plain_i32, int32_t, int64_t)

int flow_cpu_matmul_reference(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool ta, bool tb) {
  if (a->dtype != out->dtype || b->dtype != out->dtype)
    return flow_error_set("matmul_reference: operands of one dtype");
  switch (a->dtype) {
  case FLOW_F32: plain_f32(out, a, b, ta, tb); return 0;
  case FLOW_F64: plain_f64(out, a, b, ta, tb); return 0;
  case FLOW_I64: plain_i64(out, a, b, ta, tb); return 0;
  case FLOW_I32: plain_i32(out, a, b, ta, tb); return 0;
  default: return flow_error_set("matmul: no CPU kernel for dtype %s", flow_dtype_name(a->dtype));
  }
}
