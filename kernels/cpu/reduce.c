/* Reduction kernels over any set of axes. The accumulator is viewed with the input's shape and
 * stride 0 on reduced axes, so one strided iteration adds every input element into its output
 * slot; threads split the kept axes (iter.h), so each slot adds the same elements in the same
 * order on any number of them. max/min along one axis (with indices) work on a contiguous
 * [outer, axis, inner] layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../registry.h"
#include "cpu.h"
#include "iter.h"

/* acc (type TO) += LOAD(x) (x of type TI). Reducing along the inner loop (acc stride 0) uses eight
 * partial sums, which vectorise and keep the rounding error of long float sums small. */
#define DEF_SUM(fname, TI, TO, LOAD)                                                    \
  FLOW_CPU_DISPATCH static void fname(char **p, const int64_t *s, int64_t n, void *ctx) { \
    (void)ctx;                                                                          \
    int64_t i = 0;                                                                      \
    if (s[0] == 0) {                                                                    \
      TO acc = 0;                                                                       \
      if (s[1] == sizeof(TI)) {                                                         \
        const TI *x = (const TI *)p[1];                                                 \
        TO part[8] = {0};                                                               \
        for (; i + 8 <= n; i += 8)                                                      \
          for (int j = 0; j < 8; j++) part[j] += LOAD(x[i + j]);                        \
        acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])); \
      }                                                                                 \
      for (const char *x = p[1] + i * s[1]; i < n; i++, x += s[1]) acc += LOAD(*(const TI *)x); \
      *(TO *)p[0] += acc;                                                               \
    } else if (s[0] == sizeof(TO) && s[1] == sizeof(TI)) {                             \
      TO *o = (TO *)p[0];                                                               \
      const TI *x = (const TI *)p[1];                                                   \
      int64_t m = n & ~(int64_t)31;                                                     \
      _Pragma("GCC ivdep") for (i = 0; i < m; i++) o[i] += LOAD(x[i]);                  \
      for (i = m; i < n; i++) o[i] += LOAD(x[i]);                                       \
    } else {                                                                            \
      char *o = p[0];                                                                   \
      const char *x = p[1];                                                             \
      for (; i < n; i++, o += s[0], x += s[1]) *(TO *)o += LOAD(*(const TI *)x);        \
    }                                                                                   \
  }
/* bfloat16 adds up in double as its float32 values would (what a float32 copy gives); float16, whose
 * widening is no shift, goes through float32 copies (FLOW_KERNEL_F32, F16C's vector conversion) */
#define AS_DOUBLE(v) ((double)(v))
#define AS_INT64(v) ((int64_t)(v))
#define BF16_DOUBLE(v) ((double)flow_bf16_to_float(v))
DEF_SUM(sum_f32, float, double, AS_DOUBLE)
DEF_SUM(sum_f64, double, double, AS_DOUBLE)
DEF_SUM(sum_bf16, uint16_t, double, BF16_DOUBLE)
DEF_SUM(sum_i64, int64_t, int64_t, AS_INT64)
DEF_SUM(sum_i32, int32_t, int64_t, AS_INT64)
DEF_SUM(sum_u8, uint8_t, int64_t, AS_INT64)

/* sq += (x - mean)^2, in double; along the inner loop (sq and mean fixed) in a register */
#define DEF_SQDEV(fname, T)                                                             \
  static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {                 \
    (void)ctx;                                                                          \
    char *o = p[0];                                                                     \
    const char *x = p[1], *m = p[2];                                                    \
    if (s[0] == 0 && s[2] == 0) {                                                       \
      double acc = 0, mean = *(const double *)m;                                        \
      for (int64_t i = 0; i < n; i++, x += s[1]) {                                      \
        double d = (double)*(const T *)x - mean;                                        \
        acc += d * d;                                                                   \
      }                                                                                 \
      *(double *)o += acc;                                                              \
      return;                                                                           \
    }                                                                                   \
    for (int64_t i = 0; i < n; i++, o += s[0], x += s[1], m += s[2]) {                  \
      double d = (double)*(const T *)x - *(const double *)m;                            \
      *(double *)o += d * d;                                                            \
    }                                                                                   \
  }
DEF_SQDEV(sqdev_f32, float)
DEF_SQDEV(sqdev_f64, double)

/* The output seen with the input's shape: stride 0 where the axis was reduced. */
void flow_cpu_reduce_view(const flow_tensor *out, const flow_tensor *in, const bool *mask,
                          flow_tensor *view) {
  memset(view, 0, sizeof *view);
  view->dtype = out->dtype;
  view->device = out->device;
  view->storage = out->storage;
  view->offset = out->offset;
  view->ndim = in->ndim;
  int64_t s = 1;
  for (int d = in->ndim - 1; d >= 0; d--) {
    view->shape[d] = in->shape[d];
    view->stride[d] = mask[d] ? 0 : s;
    if (!mask[d]) s *= in->shape[d];
  }
}

/* Run fn over (acc viewed with in's shape, in[, extra viewed likewise]). */
static void accumulate(flow_tensor *acc, const flow_tensor *in, const flow_tensor *extra,
                       const bool *mask, flow_iter_fn fn) {
  flow_tensor view, eview;
  flow_cpu_reduce_view(acc, in, mask, &view);
  flow_tensor *ops[3] = {&view, (flow_tensor *)in, &eview};
  if (extra) flow_cpu_reduce_view(extra, in, mask, &eview);
  flow_iter it;
  flow_iter_init(&it, ops, extra ? 3 : 2);
  flow_iter_run_parallel(&it, fn, NULL, FLOW_GRAIN_CHEAP);
}

/* A sum of all of a large contiguous input into one slot has no kept axis to split. It is cut
 * into fixed blocks instead, summed on any threads, and the block sums are added in order: the
 * bits depend on the block size, never on the thread count. */
#define SUM_BLOCK (int64_t)65536

typedef struct block_sums {
  flow_iter_fn fn;     /* a DEF_SUM loop */
  const char *x;
  int64_t n, esize;
  void *part;          /* one accumulator (double or int64) per block, zeroed */
} block_sums;

static void sum_blocks(int64_t lo, int64_t hi, int part, void *vjob) {
  const block_sums *j = vjob;
  for (int64_t b = lo; b < hi; b++) {
    char *p[2] = {(char *)j->part + b * 8, (char *)j->x + b * SUM_BLOCK * j->esize};
    int64_t s[2] = {0, j->esize}, len = j->n - b * SUM_BLOCK;
    j->fn(p, s, len < SUM_BLOCK ? len : SUM_BLOCK, NULL);
  }
}

/* A sum over the leading axes of a contiguous input, [R, C] -> [C] (a bias's gradient): threads
 * splitting the columns each read every row in pieces, which ran slower on 2 threads than on 1.
 * The rows go in fixed blocks instead, each block's column sums into a row of its own on any
 * thread (whole rows, read in order), and the blocks are added in order: the bits depend on the
 * block size, never on the thread count. */
#define ROW_BLOCK (int64_t)128

typedef struct row_sums {
  flow_iter_fn fn;     /* a DEF_SUM loop */
  const char *x;
  int64_t R, C, esize;
  char *part;          /* one row of C accumulators (8 bytes each) per block, zeroed */
} row_sums;

static void sum_row_blocks(int64_t lo, int64_t hi, int part, void *vjob) {
  const row_sums *j = vjob;
  (void)part;
  int64_t s[2] = {8, j->esize};
  for (int64_t b = lo; b < hi; b++)
    for (int64_t r = b * ROW_BLOCK; r < j->R && r < (b + 1) * ROW_BLOCK; r++) {
      char *p[2] = {j->part + b * j->C * 8, (char *)j->x + r * j->C * j->esize};
      j->fn(p, s, j->C, NULL);
    }
}

/* R and C when in is contiguous and mask takes exactly its leading axes (at least one, not all). */
static bool leading_axes(const flow_tensor *in, const bool *mask, int64_t *R, int64_t *C) {
  int d = 0;
  *R = *C = 1;
  while (d < in->ndim && mask[d]) *R *= in->shape[d++];
  if (d == 0 || d == in->ndim || !flow_tensor_is_contiguous(in)) return false;
  for (; d < in->ndim; d++) {
    if (mask[d]) return false;
    *C *= in->shape[d];
  }
  return true;
}

static int sum_rows(flow_tensor *acc, const flow_tensor *in, int64_t R, int64_t C, flow_iter_fn fn) {
  int64_t blocks = (R + ROW_BLOCK - 1) / ROW_BLOCK, n = blocks * C;
  /* from the tensor allocator's cache: a fresh calloc each call page-faulted (expensive here) */
  flow_tensor *part = flow_tensor_new(FLOW_F64, FLOW_DEVICE_CPU, 1, &n);
  if (!part) return flow_error_set("sum: out of memory");
  flow_cpu_fill(part, 0);
  row_sums job = {fn, flow_tensor_data(in), R, C, (int64_t)flow_dtype_size(in->dtype), flow_tensor_data(part)};
  flow_cpu_parallel(flow_cpu_threads(R * C, FLOW_GRAIN_CHEAP), blocks, 1, sum_row_blocks, &job);
  if (acc->dtype == FLOW_F64) {
    double *out = flow_tensor_data(acc);
    for (int64_t b = 0; b < blocks; b++)
      for (int64_t c = 0; c < C; c++) out[c] += ((const double *)job.part)[b * C + c];
  } else {
    int64_t *out = flow_tensor_data(acc);
    for (int64_t b = 0; b < blocks; b++)
      for (int64_t c = 0; c < C; c++) out[c] += ((const int64_t *)job.part)[b * C + c];
  }
  flow_tensor_decref(part);
  return 0;
}

/* acc (double or int64, zeroed) += the sum over masked axes of in, by fn */
static int sum_into(flow_tensor *acc, const flow_tensor *in, const bool *mask, flow_iter_fn fn) {
  int64_t n = flow_tensor_numel(in), R, C;
  if (n >= 2 * FLOW_GRAIN_CHEAP && leading_axes(in, mask, &R, &C) && R >= 2 * ROW_BLOCK && C >= 32 &&
      flow_tensor_is_contiguous(acc))
    return sum_rows(acc, in, R, C, fn);
  if (flow_tensor_numel(acc) != 1 || n < 2 * SUM_BLOCK || !flow_tensor_is_contiguous(in)) {
    accumulate(acc, in, NULL, mask, fn);
    return 0;
  }
  int64_t blocks = (n + SUM_BLOCK - 1) / SUM_BLOCK;
  block_sums job = {fn, flow_tensor_data(in), n, (int64_t)flow_dtype_size(in->dtype), calloc((size_t)blocks, 8)};
  if (!job.part) return flow_error_set("sum: out of memory");
  flow_cpu_parallel(flow_cpu_threads(n, FLOW_GRAIN_CHEAP), blocks, 1, sum_blocks, &job);
  if (acc->dtype == FLOW_F64) {
    double total = 0;
    for (int64_t b = 0; b < blocks; b++) total += ((const double *)job.part)[b];
    *(double *)flow_tensor_data(acc) += total;
  } else {
    int64_t total = 0;
    for (int64_t b = 0; b < blocks; b++) total += ((const int64_t *)job.part)[b];
    *(int64_t *)flow_tensor_data(acc) += total;
  }
  free(job.part);
  return 0;
}

/* A zeroed contiguous accumulator with out's shape. */
static flow_tensor *new_acc(const flow_tensor *out, flow_dtype dtype) {
  flow_tensor *acc = flow_tensor_new(dtype, out->device, out->ndim, out->shape);
  if (acc) flow_cpu_fill(acc, 0);
  return acc;
}

static void scale_f64(flow_tensor *t, double scale) {
  double *p = flow_tensor_data(t);
  int64_t n = flow_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) p[i] *= scale;
}

/* out = scale * sum over masked axes. Accumulates in double (floats) or int64 (integers); when
 * that is out's own dtype the sum goes straight into out. */
static int sum_scaled(flow_tensor *out, const flow_tensor *in, const bool *mask, double scale) {
  static const flow_iter_fn fns[FLOW_NDTYPES] = {[FLOW_F32] = sum_f32, [FLOW_F64] = sum_f64,
                                                  [FLOW_BF16] = sum_bf16,
                                                  [FLOW_I64] = sum_i64, [FLOW_I32] = sum_i32,
                                                  [FLOW_U8] = sum_u8, [FLOW_BOOL] = sum_u8};
  if (in->dtype == FLOW_F16) return FLOW_KERNEL_F32;
  if (!fns[in->dtype]) return flow_error_set("no CPU sum for dtype %s", flow_dtype_name(in->dtype));
  flow_dtype acc_dtype = flow_dtype_is_float(in->dtype) ? FLOW_F64 : FLOW_I64;
  if (out->dtype == acc_dtype) {
    flow_cpu_fill(out, 0);
    if (sum_into(out, in, mask, fns[in->dtype]) != 0) return -1;
    if (scale != 1) scale_f64(out, scale);
    return 0;
  }
  flow_tensor *acc = new_acc(out, acc_dtype);
  if (!acc) return -1;
  int rc = sum_into(acc, in, mask, fns[in->dtype]);
  if (rc == 0 && scale != 1) scale_f64(acc, scale);
  if (rc == 0) flow_cpu_copy(out, acc);
  flow_tensor_decref(acc);
  return rc;
}

int flow_cpu_sum(flow_tensor *out, const flow_tensor *in, const bool *mask) {
  return sum_scaled(out, in, mask, 1);
}

int flow_cpu_mean(flow_tensor *out, const flow_tensor *in, const bool *mask, double scale) {
  return sum_scaled(out, in, mask, scale);
}

/* Two passes in double: the mean, then the squared deviations from it. */
int flow_cpu_var(flow_tensor *out, const flow_tensor *in, const bool *mask, int ddof) {
  if (in->dtype != FLOW_F32 && in->dtype != FLOW_F64)
    return flow_error_set("no CPU var for dtype %s", flow_dtype_name(in->dtype));
  int64_t count = 1;
  for (int d = 0; d < in->ndim; d++) if (mask[d]) count *= in->shape[d];
  flow_tensor *mean = new_acc(out, FLOW_F64), *sq = mean ? new_acc(out, FLOW_F64) : NULL;
  if (!sq) { flow_tensor_decref(mean); return -1; }
  if (sum_into(mean, in, mask, in->dtype == FLOW_F32 ? sum_f32 : sum_f64) != 0) {
    flow_tensor_decref(mean);
    flow_tensor_decref(sq);
    return -1;
  }
  scale_f64(mean, 1.0 / (double)count);
  accumulate(sq, in, mean, mask, in->dtype == FLOW_F32 ? sqdev_f32 : sqdev_f64);
  scale_f64(sq, count > ddof ? 1.0 / (double)(count - ddof) : NAN); /* too few elements: nan, as torch */
  flow_cpu_copy(out, sq);
  flow_tensor_decref(mean);
  flow_tensor_decref(sq);
  return 0;
}

/* acc (type TO) *= x (type TI), acc viewed with the input's shape (stride 0 where reduced). */
#define DEF_PROD(fname, TI, TO)                                                            \
  static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {                    \
    (void)ctx;                                                                             \
    char *o = p[0];                                                                        \
    const char *x = p[1];                                                                  \
    for (int64_t i = 0; i < n; i++, o += s[0], x += s[1]) *(TO *)o *= (TO) * (const TI *)x; \
  }
DEF_PROD(prod_f32, float, double)
DEF_PROD(prod_f64, double, double)
DEF_PROD(prod_i64, int64_t, int64_t)
DEF_PROD(prod_i32, int32_t, int64_t)
DEF_PROD(prod_u8, uint8_t, int64_t)

int flow_cpu_prod(flow_tensor *out, const flow_tensor *in, const bool *mask) {
  static const flow_iter_fn fns[FLOW_NDTYPES] = {[FLOW_F32] = prod_f32, [FLOW_F64] = prod_f64,
                                                  [FLOW_I64] = prod_i64, [FLOW_I32] = prod_i32,
                                                  [FLOW_U8] = prod_u8, [FLOW_BOOL] = prod_u8};
  if (!fns[in->dtype]) return flow_error_set("prod: no CPU kernel for dtype %s", flow_dtype_name(in->dtype));
  flow_dtype acc_dtype = flow_dtype_is_float(in->dtype) ? FLOW_F64 : FLOW_I64;
  flow_tensor *acc = out->dtype == acc_dtype ? out : flow_tensor_new(acc_dtype, out->device, out->ndim, out->shape);
  if (!acc) return -1;
  flow_cpu_fill(acc, 1);
  accumulate(acc, in, NULL, mask, fns[in->dtype]);
  if (acc != out) {
    flow_cpu_copy(out, acc);
    flow_tensor_decref(acc);
  }
  return 0;
}

/* ---- amax / amin ------------------------------------------------------------------------------ */

/* acc = x when x beats acc (BETTER below: larger or smaller, a NaN beating any number), acc
 * viewed with the input's shape; once a slice's acc is NaN it stays NaN. */
#define DEF_BEST(fname, T, BETTER)                                                          \
  static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {                     \
    (void)ctx;                                                                              \
    char *o = p[0];                                                                         \
    const char *x = p[1];                                                                   \
    for (int64_t i = 0; i < n; i++, o += s[0], x += s[1])                                   \
      if (BETTER(*(const T *)x, *(T *)o)) *(T *)o = *(const T *)x;                          \
  }

/* ---- max / min with indices ----------------------------------------------------------------- */

/* Over x as [outer, K, inner] (contiguous): best value and its first index along K for each
 * (outer, inner). Rows of K are walked in order, so the inner loop is a dense array loop. */
#define DEF_ARG(fname, T, BETTER)                                                                \
  static void fname(void *vvals, int64_t *idx, const void *vx, int64_t outer, int64_t K,        \
                    int64_t inner) {                                                             \
    T *vals = vvals;                                                                             \
    const T *x = vx;                                                                             \
    if (inner == 1) { /* along the contiguous last axis: a scan with the best in registers */   \
      for (int64_t o = 0; o < outer; o++) {                                                      \
        const T *row = x + o * K;                                                                \
        T best = row[0];                                                                         \
        int64_t bi = 0;                                                                          \
        for (int64_t k = 1; k < K; k++)                                                          \
          if (BETTER(row[k], best)) { best = row[k]; bi = k; }                                   \
        vals[o] = best;                                                                          \
        idx[o] = bi;                                                                             \
      }                                                                                          \
      return;                                                                                    \
    }                                                                                            \
    for (int64_t o = 0; o < outer; o++) {                                                        \
      T *v = vals + o * inner;                                                                   \
      int64_t *ix = idx + o * inner;                                                             \
      const T *row = x + o * K * inner;                                                          \
      for (int64_t j = 0; j < inner; j++) { v[j] = row[j]; ix[j] = 0; }                          \
      for (int64_t k = 1; k < K; k++) {                                                          \
        row += inner;                                                                            \
        for (int64_t j = 0; j < inner; j++)                                                      \
          if (BETTER(row[j], v[j])) { v[j] = row[j]; ix[j] = k; }                                \
      }                                                                                          \
    }                                                                                            \
  }
/* a replaces the best b when strictly better, or when a is the first NaN */
#define GT(a, b) ((a) > (b) || ((a) != (a) && (b) == (b)))
#define LT(a, b) ((a) < (b) || ((a) != (a) && (b) == (b)))
#define DEF_BEST2(T, NAME) DEF_BEST(amax_##NAME, T, GT) DEF_BEST(amin_##NAME, T, LT)
DEF_BEST2(float, f32)
DEF_BEST2(double, f64)
DEF_BEST2(int64_t, i64)
DEF_BEST2(int32_t, i32)
DEF_BEST2(uint8_t, u8)

/* out starts at the first element of each slice (in viewed at index 0 of every reduced axis). */
int flow_cpu_amaxmin(flow_tensor *out, const flow_tensor *in, const bool *mask, bool is_max) {
  static const flow_iter_fn fns[2][FLOW_NDTYPES] = {
    {[FLOW_F32] = amin_f32, [FLOW_F64] = amin_f64, [FLOW_I64] = amin_i64, [FLOW_I32] = amin_i32,
     [FLOW_U8] = amin_u8, [FLOW_BOOL] = amin_u8},
    {[FLOW_F32] = amax_f32, [FLOW_F64] = amax_f64, [FLOW_I64] = amax_i64, [FLOW_I32] = amax_i32,
     [FLOW_U8] = amax_u8, [FLOW_BOOL] = amax_u8}};
  flow_iter_fn fn = fns[is_max][in->dtype];
  if (!fn) return flow_error_set("%s: no CPU kernel for dtype %s", is_max ? "amax" : "amin", flow_dtype_name(in->dtype));
  if (flow_tensor_numel(out) == 0) return 0;
  flow_tensor first;
  memset(&first, 0, sizeof first);
  first.dtype = in->dtype;
  first.device = in->device;
  first.storage = in->storage;
  first.offset = in->offset;
  first.ndim = out->ndim;
  for (int d = 0, k = 0; d < in->ndim; d++) {
    if (!mask[d]) { first.shape[k] = in->shape[d]; first.stride[k++] = in->stride[d]; }
    else if (out->ndim == in->ndim) { first.shape[k] = 1; first.stride[k++] = 0; }
  }
  flow_cpu_copy(out, &first);
  accumulate(out, in, NULL, mask, fn);
  return 0;
}

typedef void (*arg_fn)(void *, int64_t *, const void *, int64_t, int64_t, int64_t);
#define DEF_ARG2(T, NAME) DEF_ARG(max_##NAME, T, GT) DEF_ARG(min_##NAME, T, LT)
DEF_ARG2(float, f32)
DEF_ARG2(double, f64)
DEF_ARG2(int64_t, i64)
DEF_ARG2(int32_t, i32)
DEF_ARG2(uint8_t, u8)

int flow_cpu_argreduce(flow_tensor *values, flow_tensor *indices, const flow_tensor *in, int axis, bool is_max) {
  static const arg_fn fns[2][FLOW_NDTYPES] = {
    {[FLOW_F32] = min_f32, [FLOW_F64] = min_f64, [FLOW_I64] = min_i64, [FLOW_I32] = min_i32,
     [FLOW_U8] = min_u8, [FLOW_BOOL] = min_u8},
    {[FLOW_F32] = max_f32, [FLOW_F64] = max_f64, [FLOW_I64] = max_i64, [FLOW_I32] = max_i32,
     [FLOW_U8] = max_u8, [FLOW_BOOL] = max_u8}};
  arg_fn fn = fns[is_max][in->dtype];
  if (!fn) return flow_error_set("no CPU max/min for dtype %s", flow_dtype_name(in->dtype));
  int64_t outer = 1, K = flow_tensor_numel(in), inner = 1;
  if (axis >= 0) {
    K = in->shape[axis];
    for (int d = 0; d < axis; d++) outer *= in->shape[d];
    for (int d = axis + 1; d < in->ndim; d++) inner *= in->shape[d];
  }
  if (K == 0) return flow_error_set("cannot take the max/min over an empty axis");
  flow_tensor *x = NULL, *v = NULL, *ix = NULL;
  if (!flow_tensor_is_contiguous(in)) {
    if (!(x = flow_tensor_new(in->dtype, in->device, in->ndim, in->shape))) goto fail;
    flow_cpu_copy(x, in);
  }
  /* scratch for whichever output the caller does not want */
  int64_t kept = outer * inner;
  if (!values && !(v = flow_tensor_new(in->dtype, in->device, 1, &kept))) goto fail;
  if (!indices && !(ix = flow_tensor_new(FLOW_I64, in->device, 1, &kept))) goto fail;
  fn(flow_tensor_data(values ? values : v), flow_tensor_data(indices ? indices : ix),
     flow_tensor_data(x ? x : in), outer, K, inner);
  flow_tensor_decref(x);
  flow_tensor_decref(v);
  flow_tensor_decref(ix);
  return 0;
fail:
  flow_tensor_decref(x);
  flow_tensor_decref(v);
  return -1;
}

int flow_cpu_index_put_axis(flow_tensor *out, const flow_tensor *g, const flow_tensor *idx, int axis) {
  size_t es = flow_dtype_size(out->dtype);
  int64_t outer = 1, K = flow_tensor_numel(out), inner = 1;
  if (axis >= 0) {
    K = out->shape[axis];
    for (int d = 0; d < axis; d++) outer *= out->shape[d];
    for (int d = axis + 1; d < out->ndim; d++) inner *= out->shape[d];
  }
  flow_tensor *gc = NULL, *ic = NULL;
  if (!flow_tensor_is_contiguous(g)) {
    if (!(gc = flow_tensor_new(g->dtype, g->device, g->ndim, g->shape))) return -1;
    flow_cpu_copy(gc, g);
  }
  if (!flow_tensor_is_contiguous(idx)) {
    if (!(ic = flow_tensor_new(idx->dtype, idx->device, idx->ndim, idx->shape))) { flow_tensor_decref(gc); return -1; }
    flow_cpu_copy(ic, idx);
  }
  flow_cpu_fill(out, 0);
  char *o = flow_tensor_data(out);
  const char *gp = flow_tensor_data(gc ? gc : g);
  const int64_t *ip = flow_tensor_data(ic ? ic : idx);
  for (int64_t b = 0; b < outer; b++)
    for (int64_t j = 0; j < inner; j++) {
      int64_t k = ip[b * inner + j];
      if (k >= 0 && k < K) memcpy(o + ((b * K + k) * inner + j) * (int64_t)es, gp + (b * inner + j) * (int64_t)es, es);
    }
  flow_tensor_decref(gc);
  flow_tensor_decref(ic);
  return 0;
}

/* ---- cumsum ------------------------------------------------------------------------------------ */

/* Over x as [outer, K, inner] (contiguous): out[o, k, i] = sum_{j <= k} x[o, j, i] (j >= k when
 * reverse), accumulated in ACC. The running sums of one row of K advance together over inner. */
#define DEF_CUMSUM(fname, TI, TO, ACC)                                                            \
  static void fname(void *vout, const void *vx, int64_t outer, int64_t K, int64_t inner, bool rev) { \
    TO *out = vout;                                                                              \
    const TI *x = vx;                                                                            \
    for (int64_t o = 0; o < outer; o++)                                                          \
      for (int64_t i = 0; i < inner; i++) {                                                      \
        ACC acc = 0;                                                                             \
        for (int64_t j = 0; j < K; j++) {                                                        \
          int64_t k = rev ? K - 1 - j : j, at = (o * K + k) * inner + i;                          \
          acc += (ACC)x[at];                                                                     \
          out[at] = (TO)acc;                                                                     \
        }                                                                                        \
      }                                                                                          \
  }
typedef void (*cumsum_fn)(void *, const void *, int64_t, int64_t, int64_t, bool);
DEF_CUMSUM(cumsum_f32, float, float, double)
DEF_CUMSUM(cumsum_f64, double, double, double)
DEF_CUMSUM(cumsum_i64, int64_t, int64_t, int64_t)
DEF_CUMSUM(cumsum_i32, int32_t, int64_t, int64_t)
DEF_CUMSUM(cumsum_u8, uint8_t, int64_t, int64_t)

int flow_cpu_cumsum(flow_tensor *out, const flow_tensor *in, int axis, bool reverse) {
  static const cumsum_fn fns[FLOW_NDTYPES] = {[FLOW_F32] = cumsum_f32, [FLOW_F64] = cumsum_f64,
                                               [FLOW_I64] = cumsum_i64, [FLOW_I32] = cumsum_i32,
                                               [FLOW_U8] = cumsum_u8, [FLOW_BOOL] = cumsum_u8};
  if (!fns[in->dtype]) return flow_error_set("cumsum: no CPU kernel for dtype %s", flow_dtype_name(in->dtype));
  int64_t outer = 1, K = 1, inner = 1;
  if (in->ndim > 0) {
    K = in->shape[axis];
    for (int d = 0; d < axis; d++) outer *= in->shape[d];
    for (int d = axis + 1; d < in->ndim; d++) inner *= in->shape[d];
  }
  flow_tensor *x = NULL;
  if (!flow_tensor_is_contiguous(in)) {
    if (!(x = flow_tensor_new(in->dtype, in->device, in->ndim, in->shape))) return -1;
    flow_cpu_copy(x, in);
  }
  fns[in->dtype](flow_tensor_data(out), flow_tensor_data(x ? x : in), outer, K, inner, reverse);
  flow_tensor_decref(x);
  return 0;
}
