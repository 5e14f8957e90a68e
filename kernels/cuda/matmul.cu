/* Matmul on cuBLAS: Y = op(A) @ op(B) over broadcast batch axes, as strided-batched GEMM whenever
 * each operand's batch axes collapse to one stride (else one GEMM per batch entry). float32 may use
 * tf32 (flow.backends.allow_tf32); bfloat16/float16 accumulate in float32. Under autocast, float32
 * inputs are cast to the autocast dtype and the float32 output is written by the same GEMM. */
#include <cublas_v2.h>
#include <limits.h>
#include <time.h>

#include "common.h"
#include "kernels.h"


static cublasHandle_t handles[FLOW_CUDA_MAX_DEVICES];

static int cublas_check(cublasStatus_t st, const char *call) {
  if (st == CUBLAS_STATUS_SUCCESS) return 0;
  return flow_error_set("%s: %s (cuBLAS status %d)", call, cublasGetStatusString(st), (int)st);
}

/* The device's handle, bound to its compute stream. */
static cublasHandle_t handle_for(int index) {
  if (index < 0 || index >= FLOW_CUDA_MAX_DEVICES) { flow_error_set("matmul: bad cuda device %d", index); return NULL; }
  cudaStream_t s = (cudaStream_t)flow_cuda_stream(index);
  if (!s) return NULL;
  if (!handles[index] && cublas_check(cublasCreate(&handles[index]), "cublasCreate") != 0) return NULL;
  if (cublas_check(cublasSetStream(handles[index], s), "cublasSetStream") != 0) return NULL;
  return handles[index];
}

static cudaDataType_t cuda_type(flow_dtype d) {
  switch (d) {
  case FLOW_F64: return CUDA_R_64F;
  case FLOW_F16: return CUDA_R_16F;
  case FLOW_BF16: return CUDA_R_16BF;
  default: return CUDA_R_32F;
  }
}

/* One operand as cuBLAS sees it. Row-major Y = A B is column-major Y^T = B^T A^T, so cuBLAS gets
 * (B, A) and each operand's column-major view of its memory: a row-major matrix (unit column
 * stride) reads as its transpose, a column-major one (unit row stride) as itself. */
typedef struct operand {
  cublasOperation_t op;
  int64_t ld;
  int64_t batch_stride;   /* elements; -1: batch axes do not collapse */
  const flow_tensor *t;
} operand;

/* t [..., r, c] used as op(t) (trans: the transpose); out_batch the broadcast batch shape. False
 * when GEMM cannot read t's last two axes as they are: neither axis unit-stride, or rows (columns)
 * closer than a row (column) is long, e.g. an expanded matrix with stride 0 (kernels/cpu/matmul.c's
 * rule). */
static bool describe(operand *o, const flow_tensor *t, bool trans, int nb, const int64_t *out_batch) {
  int n = t->ndim;
  int64_t r = t->shape[n - 2], c = t->shape[n - 1], rs = t->stride[n - 2], cs = t->stride[n - 1];
  int64_t r_ld = r == 1 ? (c > 1 ? c : 1) : rs, c_ld = c == 1 ? (r > 1 ? r : 1) : cs;
  bool row_major;
  if ((c == 1 || cs == 1) && r_ld >= (c > 1 ? c : 1)) { row_major = true; o->ld = r_ld; }
  else if ((r == 1 || rs == 1) && c_ld >= (r > 1 ? r : 1)) { row_major = false; o->ld = c_ld; }
  else return false;
  /* cuBLAS needs op(t)^T. The column-major view of row-major memory already is t^T; of
   * column-major memory it is t itself. */
  o->op = row_major == trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  o->t = t;
  /* batch: operand strides per output batch axis (0 where broadcast), collapsed when uniform */
  int64_t st[FLOW_MAX_DIMS];
  for (int d = 0; d < nb; d++) {
    int td = d - (nb - (n - 2));
    st[d] = td < 0 || t->shape[td] == 1 ? 0 : t->stride[td];
  }
  int64_t stride = 0, expect = -1;
  for (int d = nb - 1; d >= 0; d--) {
    if (out_batch[d] == 1) continue;
    if (expect < 0) { stride = st[d]; expect = st[d] * out_batch[d]; continue; }
    if (st[d] != expect) { o->batch_stride = -1; return true; }
    expect = st[d] * out_batch[d];
  }
  o->batch_stride = stride;
  return true;
}

/* Offset (elements) of batch entry b of operand t, for the per-entry fallback. */
static int64_t batch_offset(const flow_tensor *t, int64_t b, int nb, const int64_t *out_batch) {
  int64_t off = 0;
  for (int d = nb - 1; d >= 0; d--) {
    int64_t idx = b % out_batch[d];
    b /= out_batch[d];
    int td = d - (nb - (t->ndim - 2));
    if (td >= 0 && t->shape[td] != 1) off += idx * t->stride[td];
  }
  return off;
}

/* Y (contiguous, [batch..., m, n]) = op(A) op(B), or Y += op(A) op(B) with accumulate. A and B
 * share a dtype, or (autocast) both are bf16/f16 while Y is float32. */
static int gemm(flow_tensor *y, const flow_tensor *A, const flow_tensor *B, bool ta, bool tb, bool accumulate) {
  flow_tensor *Ad = NULL, *Bd = NULL;
  int nb = y->ndim - 2, rc = -1;
  const int64_t *out_batch = y->shape;
  int64_t m = y->shape[nb], n = y->shape[nb + 1];
  int64_t k = A->shape[A->ndim - (ta ? 2 : 1)];
  int64_t batch = flow_shape_numel(nb, out_batch);
  operand a, b;
  if (m == 0 || n == 0 || batch == 0) return 0;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX)
    return flow_error_set("matmul: [%lld, %lld] x [%lld, %lld] (%lld batches) is too large for one cuBLAS call",
                          (long long)m, (long long)k, (long long)k, (long long)n, (long long)batch);
  if (k == 0) return accumulate ? 0 : flow_cuda_fill(y, 0);
  if (!describe(&a, A, ta, nb, out_batch)) {
    if (!(Ad = cuda_dense((flow_tensor *)A))) return -1;
    describe(&a, Ad, ta, nb, out_batch);
  }
  if (!describe(&b, B, tb, nb, out_batch)) {
    if (!(Bd = cuda_dense((flow_tensor *)B))) goto done;
    describe(&b, Bd, tb, nb, out_batch);
  }
  if (a.ld > INT_MAX || b.ld > INT_MAX) {
    flow_error_set("matmul: a leading dimension above %d does not fit cuBLAS", INT_MAX);
    goto done;
  }
  {
    cublasHandle_t h = handle_for(y->device.index);
    if (!h) goto done;
    cudaDataType_t ti = cuda_type(A->dtype), to = cuda_type(y->dtype);
    cublasComputeType_t ct = y->dtype == FLOW_F64 ? CUBLAS_COMPUTE_64F
                           : (A->dtype == FLOW_F32 && flow_cuda_allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                           : CUBLAS_COMPUTE_32F;
    float one_f = 1, zero_f = 0;
    double one_d = 1, zero_d = 0;
    const void *alpha = y->dtype == FLOW_F64 ? (const void *)&one_d : (const void *)&one_f;
    const void *beta = y->dtype == FLOW_F64 ? (const void *)(accumulate ? &one_d : &zero_d)
                                             : (const void *)(accumulate ? &one_f : &zero_f);
    size_t ea = flow_dtype_size(A->dtype);
    const char *pa = (const char *)flow_tensor_data(a.t), *pb = (const char *)flow_tensor_data(b.t);
    char *py = (char *)flow_tensor_data(y);
    size_t ey = flow_dtype_size(y->dtype);
    if (a.batch_stride >= 0 && b.batch_stride >= 0) {
      rc = cublas_check(cublasGemmStridedBatchedEx(h, b.op, a.op, (int)n, (int)m, (int)k, alpha, pb, ti, (int)b.ld,
                                                   b.batch_stride, pa, ti, (int)a.ld, a.batch_stride, beta, py, to,
                                                   (int)n, m * n, (int)batch, ct, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmStridedBatchedEx");
    } else {
      rc = 0;
      for (int64_t i = 0; i < batch && rc == 0; i++)
        rc = cublas_check(cublasGemmEx(h, b.op, a.op, (int)n, (int)m, (int)k, alpha,
                                       pb + batch_offset(b.t, i, nb, out_batch) * (int64_t)ea, ti, (int)b.ld,
                                       pa + batch_offset(a.t, i, nb, out_batch) * (int64_t)ea, ti, (int)a.ld, beta,
                                       py + i * m * n * (int64_t)ey, to, (int)n, ct, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx");
    }
  }
done:
  if (Ad) flow_tensor_decref(Ad);
  if (Bd) flow_tensor_decref(Bd);
  return rc;
}

/* GEMM under autocast: float32 inputs are cast down (bf16/f16), the output stays float32. */
static int autocast_gemm(flow_tensor *y, flow_tensor *A, flow_tensor *B, bool ta, bool tb, bool accumulate) {
  flow_dtype ac = flow_autocast_dtype();
  if (ac == FLOW_F32 || A->dtype != FLOW_F32) return gemm(y, A, B, ta, tb, accumulate);
  flow_tensor *x = cuda_cast(A, ac), *w = x ? cuda_cast(B, ac) : NULL;
  int rc = w ? gemm(y, x, w, ta, tb, accumulate) : -1;
  if (x) flow_tensor_decref(x);
  if (w) flow_tensor_decref(w);
  return rc;
}

/* Integer operands (cuBLAS has no int64 GEMM) run the CPU's loop on host copies. */
static FLOW_KERNEL(k_matmul) {
  if (!flow_dtype_is_float(in[0]->dtype)) return flow_cuda_via_host("matmul", in, nin, out, nout, a);
  return autocast_gemm(out[0], in[0], in[1], a->flags & FLOW_ATTR_TRANS_A, a->flags & FLOW_ATTR_TRANS_B, false);
}

/* linear: Y [N, out] = X W^T + b. The bias is written first (broadcast over the rows) and the
 * GEMM adds onto it (beta = 1): no separate pass over Y for the bias. */
static FLOW_KERNEL(k_linear) {
  flow_tensor rows = *in[2]; /* the bias seen as [N, out] with stride 0 over the rows */
  rows.ndim = 2;
  rows.shape[0] = out[0]->shape[0];
  rows.shape[1] = in[2]->shape[0];
  rows.stride[0] = 0;
  rows.stride[1] = in[2]->stride[0];
  if (flow_cuda_copy(out[0], &rows) != 0) return -1;
  return autocast_gemm(out[0], in[0], in[1], false, true, true);
}

void flow_cuda_register_matmul(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, matmul, k_matmul);
  FLOW_KERNEL_ADD(FLOW_CUDA, linear, k_linear);
}

int flow_cuda_bench_gemm(flow_tensor *c, const flow_tensor *a, const flow_tensor *b, int iters, double *secs) {
  const flow_tensor *ts[3] = {c, a, b};
  for (int i = 0; i < 3; i++)
    if (ts[i]->device.type != FLOW_CUDA || ts[i]->ndim != 2 || !flow_tensor_is_contiguous(ts[i]) ||
        ts[i]->dtype != c->dtype)
      return flow_error_set("_bench_gemm: a, b, c must be 2-d contiguous cuda tensors of one dtype");
  int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
  if (b->shape[0] != k || c->shape[0] != m || c->shape[1] != n)
    return flow_error_set("_bench_gemm: shapes do not chain (a [m,k], b [k,n], c [m,n])");
  cublasHandle_t h = handle_for(c->device.index);
  if (!h) return -1;
  cudaDataType_t t = cuda_type(c->dtype);
  cublasComputeType_t ct = c->dtype == FLOW_F64 ? CUBLAS_COMPUTE_64F
                         : (c->dtype == FLOW_F32 && flow_cuda_allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                         : CUBLAS_COMPUTE_32F;
  float one = 1, zero = 0;
  double one_d = 1, zero_d = 0;
  const void *al = c->dtype == FLOW_F64 ? (const void *)&one_d : (const void *)&one;
  const void *be = c->dtype == FLOW_F64 ? (const void *)&zero_d : (const void *)&zero;
  struct timespec t0, t1;
  for (int it = -1; it < iters; it++) { /* iteration -1 warms up */
    if (it == 0) {
      if (flow_cuda_synchronize(c->device.index) != 0) return -1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    if (cublas_check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k, al, flow_tensor_data(b), t,
                                  (int)n, flow_tensor_data(a), t, (int)k, be, flow_tensor_data(c), t, (int)n, ct,
                                  CUBLAS_GEMM_DEFAULT), "cublasGemmEx") != 0)
      return -1;
  }
  if (flow_cuda_synchronize(c->device.index) != 0) return -1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *secs = ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / (iters > 0 ? iters : 1);
  return 0;
}
