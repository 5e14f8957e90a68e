/* CPU kernels, declared for the op definitions in ops/. Kernels know tensors and attrs only:
 * no SBP, no autograd, no Lua. Op files wrap them in FLOW_KERNEL functions. */
#ifndef FLOW_CPU_H
#define FLOW_CPU_H

#include <stdbool.h>

#include "../../core/error.h"
#include "../../core/tensor.h"

/* Run-time dispatch for the hot loops. In a build for the x86-64 baseline (FLOW_ARCH=x86-64: no
 * AVX2 assumed at compile time) a function marked FLOW_CPU_DISPATCH is compiled three times, for
 * x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the baseline, and the loader binds its name to
 * the best copy this CPU runs (GCC's target_clones: an ifunc). What the function inlines is
 * compiled into each copy, so mark the loop, not each helper. A build that assumes AVX2
 * (x86-64-v3, native) compiles it once, as before. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(__AVX2__)
#define FLOW_CPU_DISPATCH __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLOW_CPU_DISPATCH
#endif

/* Elementwise binary ops with broadcasting (out = a OP b). */
typedef enum flow_binary_code {
  FLOW_BIN_ADD, FLOW_BIN_SUB, FLOW_BIN_MUL, FLOW_BIN_DIV, FLOW_BIN_POW, FLOW_BIN_MAX, FLOW_BIN_MIN,
  FLOW_BIN_REM, FLOW_BIN_FMOD, FLOW_BIN_FLOORDIV, FLOW_BIN_TRUNCDIV, /* integer ones raise on a zero divisor */
  FLOW_BIN_EQ, FLOW_BIN_NE, FLOW_BIN_LT, FLOW_BIN_LE, FLOW_BIN_GT, FLOW_BIN_GE,
  FLOW_NBINARY
} flow_binary_code;
int flow_cpu_binary(flow_binary_code code, flow_tensor *out, const flow_tensor *x, const flow_tensor *y);
/* The op a code computes, for messages ("remainder", "floor_divide", ...). */
const char *flow_binary_name(flow_binary_code code);

/* Elementwise unary ops: out = f(x), x and out of one dtype. Float ops take float32/float64; neg,
 * abs, relu, clamp, sign, floor, ceil, round and trunc also int64/int32. clamp reads lo/hi (pass -inf/inf for an absent bound). */
typedef enum flow_unary_code {
  FLOW_UN_NEG, FLOW_UN_ABS, FLOW_UN_EXP, FLOW_UN_LOG, FLOW_UN_SQRT, FLOW_UN_RSQRT, FLOW_UN_TANH,
  FLOW_UN_SIGMOID, FLOW_UN_RELU, FLOW_UN_GELU, FLOW_UN_GELU_TANH, FLOW_UN_CLAMP, FLOW_UN_SILU,
  FLOW_UN_SIN, FLOW_UN_COS, FLOW_UN_ERF, FLOW_UN_LOG1P, FLOW_UN_EXPM1, FLOW_UN_SOFTPLUS, FLOW_UN_SIGN,
  FLOW_UN_FLOOR, FLOW_UN_CEIL, FLOW_UN_ROUND, FLOW_UN_TRUNC,
  FLOW_NUNARY
} flow_unary_code;
int flow_cpu_unary(flow_unary_code code, flow_tensor *out, const flow_tensor *x, double lo, double hi);
/* gin = f'(.) * g in one pass; s is what the gradient needs: the output y = f(x) for exp, sqrt,
 * rsqrt, tanh, sigmoid, relu, expm1, and the input x for abs, log, gelu, gelu_tanh, clamp, silu,
 * sin, cos, erf, log1p, softplus. Float dtypes only (sign, floor, ... have no gradient kernel). */
int flow_cpu_unary_backward(flow_unary_code code, flow_tensor *gin, const flow_tensor *s,
                            const flow_tensor *g, double lo, double hi);

/* out = cond ? a : b (cond bool, broadcast to out); out = mask ? v : x. Any dtype. */
int flow_cpu_where(flow_tensor *out, const flow_tensor *cond, const flow_tensor *a, const flow_tensor *b);
int flow_cpu_masked_fill(flow_tensor *out, const flow_tensor *x, const flow_tensor *mask, double v);

/* out = x (any strides, any dtype pair: this is also cast). */
int flow_cpu_copy(flow_tensor *out, const flow_tensor *x);
/* every element of out = v */
int flow_cpu_fill(flow_tensor *out, double v);

/* Reductions: mask[d] marks reduced axes; out (contiguous) has the kept axes (keepdim or not:
 * same data). Float32 accumulates in double; bool/uint8/int32 sum into an int64 out.
 * mean = sum * scale; var = sum((x - mean)^2) / (count - ddof), computed in double. */
int flow_cpu_sum(flow_tensor *out, const flow_tensor *in, const bool *mask);
int flow_cpu_mean(flow_tensor *out, const flow_tensor *in, const bool *mask, double scale);
int flow_cpu_var(flow_tensor *out, const flow_tensor *in, const bool *mask, int ddof);
/* max/min along one axis (axis < 0: over all elements, flat index): values (may be NULL) and
 * int64 indices (may be NULL) of the first extreme element; NaN counts as the extreme. */
int flow_cpu_argreduce(flow_tensor *values, flow_tensor *indices, const flow_tensor *in, int axis, bool is_max);
/* The largest (is_max) or smallest value over masked axes (none of them empty), NaN if the slice
 * holds one; out has in's dtype. */
int flow_cpu_amaxmin(flow_tensor *out, const flow_tensor *in, const bool *mask, bool is_max);
/* Product over masked axes (the empty product is 1): floats multiply in double, bool/uint8/int32/
 * int64 in int64 (out int64). */
int flow_cpu_prod(flow_tensor *out, const flow_tensor *in, const bool *mask);
/* Running sum along axis (x any strides, out contiguous): out[.., k, ..] = sum_{j <= k} x[.., j, ..],
 * or sum_{j >= k} when reverse. Floats accumulate in double; bool/uint8/int32/int64 into int64 out. */
int flow_cpu_cumsum(flow_tensor *out, const flow_tensor *in, int axis, bool reverse);
/* Sort along axis (axis < 0: x is 0-d, one element) and keep the first k of each line: values
 * and int64 positions, [.., k, ..] contiguous. Stable; NaN is the largest value (first when
 * descending, last when ascending), as torch. */
int flow_cpu_sort(flow_tensor *values, flow_tensor *indices, const flow_tensor *in, int axis, int64_t k,
                  bool descending);
/* The inverse for gradients: out (zeroed, contiguous) gets g at index idx along axis. */
int flow_cpu_index_put_axis(flow_tensor *out, const flow_tensor *g, const flow_tensor *idx, int axis);
/* out seen with in's shape, stride 0 on reduced axes (shared by every reduction kernel). */
void flow_cpu_reduce_view(const flow_tensor *out, const flow_tensor *in, const bool *mask,
                          flow_tensor *view);

/* out = op(a) @ op(b) over broadcast batch axes; op transposes the last two axes when asked.
 * out is contiguous with the broadcast batch shape. float32 on oneDNN (bf16 under autocast),
 * float64 on OpenBLAS, int64/int32 on a plain loop. */
int flow_cpu_matmul(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool trans_a, bool trans_b);
/* out [M, N] = x [M, K] w[N, K]^T + bias [N] (nn's Linear; the bias fused into the GEMM) */
int flow_cpu_linear(flow_tensor *out, const flow_tensor *x, const flow_tensor *w, const flow_tensor *bias);
/* The same product by a plain loop (any strides; floats accumulate in double, int64/int32 in int64):
 * the tests' reference, and the integer matmul. */
int flow_cpu_matmul_reference(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool trans_a,
                              bool trans_b);
/* One matrix product for kernels working a matrix at a time: C [M, N] (leading dimension ldc) =
 * alpha op(A) op(B) + beta C, row-major operands with leading dimensions lda, ldb. float32 on
 * oneDNN (bf16 under autocast), float64 on OpenBLAS. `op` names the caller in errors. */
int flow_cpu_gemm_f32(const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
int flow_cpu_gemm_f64(const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                      const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
                      int64_t ldc);

#endif
