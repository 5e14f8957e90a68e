/* Matmul through OpenBLAS: C[b] = op(A[b]) @ op(B[b]) for every (broadcast) batch index b.
 * Operands whose last two axes are row- or column-major go straight to GEMM with the right
 * transpose flag; anything else is copied to contiguous first. */
#include <cblas.h>
#include <string.h>

#include "cpu.h"

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

/* C = op(A) op(B), or with a bias: C = op(A) op(B) + bias (bias [N] contiguous, broadcast over
 * rows), written into C first so GEMM adds onto it (beta = 1): one pass over C instead of GEMM's
 * zero fill plus a separate add. */
static int matmul(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool ta, bool tb,
                  const flow_tensor *bias) {
  if (a->dtype != FLOW_F32 && a->dtype != FLOW_F64)
    return flow_error_set("no CPU matmul for dtype %s (use float32 or float64)", flow_dtype_name(a->dtype));
  operand A, B;
  if (prepare(&A, a) != 0) return -1;
  if (prepare(&B, b) != 0) { flow_tensor_decref(A.tmp); return -1; }
  int n = out->ndim;
  int64_t M = out->shape[n - 2], N = out->shape[n - 1];
  int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
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
    if (a->dtype == FLOW_F32)
      cblas_sgemm(CblasRowMajor, opA, opB, (int)M, (int)N, (int)K, 1.0f, (const float *)xa, (int)A.ld,
                  (const float *)xb, (int)B.ld, bias ? 1.0f : 0.0f, (float *)xc, (int)N);
    else
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
