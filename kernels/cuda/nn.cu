/* Fused neural-network kernels on CUDA, forward and backward, with the CPU kernels' math
 * (kernels/cpu/nn.h): softmax/log_softmax, layernorm, cross-entropy, and the AdamW update.
 * float32, float64, float16 and bfloat16: a kernel loads T, computes and accumulates in acc_t<T>
 * (float; double for float64) and stores T. The row statistics saved for the backward (layernorm's
 * mean and rstd, cross-entropy's lse) stay in acc_t<T>, the dtype ops/nn.c declares for them.
 * Inputs are made dense. */
#include "common.h"

/* Sets rc on an unsupported dtype (no return: the callers release their dense copies first). */
#define REAL_DISPATCH(d, WHAT, ...) FLOW_CUDA_FLOAT_CASES(d, rc = FLOW_CUDA_UNSUPPORTED(d, WHAT), __VA_ARGS__)

/* The type a kernel for storage type T computes in. */
template <typename T> using acc_t = typename Acc<T>::type;

/* p[i] in the compute type A, or dflt where the optional tensor is absent (no weight, no bias). */
template <typename A, typename T> __device__ __forceinline__ A opt(const T *p, int64_t i, A dflt) {
  return p ? load<A>(p + i) : dflt;
}

/* Block-wide sum and max in the accumulation type (blockDim.x a multiple of 32). */
template <typename C> __device__ C bsum(C v) {
  __shared__ C sh[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : (C)0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename C> __device__ C bmax(C v) {
  __shared__ C sh[32];
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : (C)-INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Dense versions of up to n tensors (NULL stays NULL); returns false if a copy failed. */
static bool densify(flow_tensor *const *src, flow_tensor **dst, int n) {
  bool ok = true;
  for (int i = 0; i < n; i++) {
    dst[i] = src[i] && ok ? cuda_dense(src[i]) : NULL;
    if (src[i] && !dst[i]) ok = false;
  }
  return ok;
}
static void release(flow_tensor **t, int n) {
  for (int i = 0; i < n; i++) if (t[i]) flow_tensor_decref(t[i]);
}

template <typename T> static T *ptr(flow_tensor *t) { return t ? data_of<T>(t) : NULL; }

/* ---- softmax ---------------------------------------------------------------------------------- */
/* x seen as [outer, n, inner]: softmax along n. inner == 1: a block per row; else a thread per
 * (outer, inner) column walking n (adjacent threads read adjacent memory). */

/* y = x - m - log s (log_softmax) or exp(x - m) / s, with m the row's max and s = sum exp(x - m). */
template <typename A> __device__ __forceinline__ A softmax_of(A x, A m, A s, A ls, bool log_) {
  return log_ ? x - m - ls : exp(x - m) / s;
}

/* The row's max m and sum of exp(x - m) (one block per row; every thread gets both). */
template <typename A, typename T>
__device__ __forceinline__ void row_max_sumexp(const T *xr, int64_t n, A *m, A *s) {
  A mx = -INFINITY, sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max(mx, load<A>(xr + j));
  mx = bmax<A>(mx);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += exp(load<A>(xr + j) - mx);
  *m = mx;
  *s = bsum<A>(sum);
}

template <typename T>
__global__ void softmax_rows(const T *x, T *y, int64_t n, bool log_) {
  typedef acc_t<T> A;
  const T *xr = x + blockIdx.x * n;
  T *yr = y + blockIdx.x * n;
  A m, s;
  row_max_sumexp<A>(xr, n, &m, &s);
  A ls = log(s);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    store<T, A>(yr + j, softmax_of<A>(load<A>(xr + j), m, s, ls, log_));
}

template <typename T>
__global__ void softmax_cols(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, bool log_) {
  typedef acc_t<T> A;
  CUDA_LOOP(c, outer * inner) {
    const T *xc = x + (c / inner) * n * inner + c % inner;
    T *yc = y + (c / inner) * n * inner + c % inner;
    A m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; j++) m = max(m, load<A>(xc + j * inner));
    for (int64_t j = 0; j < n; j++) s += exp(load<A>(xc + j * inner) - m);
    A ls = log(s);
    for (int64_t j = 0; j < n; j++) store<T, A>(yc + j * inner, softmax_of<A>(load<A>(xc + j * inner), m, s, ls, log_));
  }
}

/* softmax: dx = y (dy - sum dy y);  log_softmax: dx = dy - exp(y) sum dy. */
template <typename A> __device__ __forceinline__ A softmax_grad_term(A y, A dy, bool log_) {
  return log_ ? dy : dy * y;
}
template <typename A> __device__ __forceinline__ A softmax_grad_of(A y, A dy, A s, bool log_) {
  return log_ ? dy - exp(y) * s : y * (dy - s);
}

template <typename T>
__global__ void softmax_grad_rows(const T *y, const T *dy, T *dx, int64_t n, bool log_) {
  typedef acc_t<T> A;
  const T *yr = y + blockIdx.x * n, *dr = dy + blockIdx.x * n;
  T *xr = dx + blockIdx.x * n;
  A s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    s += softmax_grad_term<A>(load<A>(yr + j), load<A>(dr + j), log_);
  s = bsum<A>(s);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    store<T, A>(xr + j, softmax_grad_of<A>(load<A>(yr + j), load<A>(dr + j), s, log_));
}

template <typename T>
__global__ void softmax_grad_cols(const T *y, const T *dy, T *dx, int64_t outer, int64_t n, int64_t inner, bool log_) {
  typedef acc_t<T> A;
  CUDA_LOOP(c, outer * inner) {
    int64_t base = (c / inner) * n * inner + c % inner;
    A s = 0;
    for (int64_t j = 0; j < n; j++) {
      int64_t k = base + j * inner;
      s += softmax_grad_term<A>(load<A>(y + k), load<A>(dy + k), log_);
    }
    for (int64_t j = 0; j < n; j++) {
      int64_t k = base + j * inner;
      store<T, A>(dx + k, softmax_grad_of<A>(load<A>(y + k), load<A>(dy + k), s, log_));
    }
  }
}

static void split_axis(const flow_tensor *t, int axis, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = *inner = 1;
  *n = t->ndim ? t->shape[axis] : 1;
  for (int d = 0; d < axis; d++) *outer *= t->shape[d];
  for (int d = axis + 1; d < t->ndim; d++) *inner *= t->shape[d];
}

static int axis_of(const flow_attrs *a, int ndim) { return ndim == 0 ? 0 : (int)(a->axis < 0 ? a->axis + ndim : a->axis); }

static int softmax_forward(flow_tensor *y, flow_tensor *x0, int axis, bool log_) {
  flow_tensor *x;
  if (!densify(&x0, &x, 1)) return -1;
  int64_t outer, n, inner;
  split_axis(x, axis, &outer, &n, &inner);
  cudaStream_t s = stream_of(y);
  int rc = 0;
  if (outer * inner > 0 && n > 0) {
    REAL_DISPATCH(x->dtype, "softmax",
      if (inner == 1) softmax_rows<T><<<(unsigned)outer, 256, 0, s>>>(data_of<T>(x), data_of<T>(y), n, log_);
      else softmax_cols<T><<<grid_for(outer * inner, 256), 256, 0, s>>>(data_of<T>(x), data_of<T>(y), outer, n, inner, log_))
    if (rc == 0) rc = launch_check("softmax_kernel");
  }
  flow_tensor_decref(x);
  return rc;
}

static int softmax_backward(flow_tensor *dx, flow_tensor *y0, flow_tensor *dy0, int axis, bool log_) {
  flow_tensor *src[2] = {y0, dy0}, *d[2];
  int rc = -1;
  if (densify(src, d, 2)) {
    int64_t outer, n, inner;
    split_axis(d[0], axis, &outer, &n, &inner);
    cudaStream_t s = stream_of(dx);
    rc = 0;
    if (outer * inner > 0 && n > 0) {
      REAL_DISPATCH(dx->dtype, "softmax_grad",
        if (inner == 1) softmax_grad_rows<T><<<(unsigned)outer, 256, 0, s>>>(data_of<T>(d[0]), data_of<T>(d[1]), data_of<T>(dx), n, log_);
        else softmax_grad_cols<T><<<grid_for(outer * inner, 256), 256, 0, s>>>(data_of<T>(d[0]), data_of<T>(d[1]), data_of<T>(dx),
                                                                             outer, n, inner, log_))
      if (rc == 0) rc = launch_check("softmax_grad_kernel");
    }
  }
  release(d, 2);
  return rc;
}

static FLOW_KERNEL(k_softmax) { return softmax_forward(out[0], in[0], axis_of(a, in[0]->ndim), false); }
static FLOW_KERNEL(k_log_softmax) { return softmax_forward(out[0], in[0], axis_of(a, in[0]->ndim), true); }
static FLOW_KERNEL(k_softmax_grad) { return softmax_backward(out[0], in[0], in[1], axis_of(a, in[0]->ndim), false); }
static FLOW_KERNEL(k_log_softmax_grad) { return softmax_backward(out[0], in[0], in[1], axis_of(a, in[0]->ndim), true); }

/* ---- layernorm (last axis) ---------------------------------------------------------------------- */

/* Per row: mean = sum x / C, var = sum (x - mean)^2 / C, rstd = 1/sqrt(var + eps),
 * y = (x - mean) rstd w + b. A block per row. */
template <typename T>
__global__ void layernorm_fwd(const T *x, const T *w, const T *b, T *y, acc_t<T> *mean, acc_t<T> *rstd, int64_t C,
                              double eps) {
  typedef acc_t<T> A;
  const T *xr = x + blockIdx.x * C;
  T *yr = y + blockIdx.x * C;
  A s = 0;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += load<A>(xr + i);
  A m = bsum<A>(s) / (A)C;
  A v = 0;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    A d = load<A>(xr + i) - m;
    v += d * d;
  }
  A r = (A)1 / sqrt(bsum<A>(v) / (A)C + (A)eps);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    store<T, A>(yr + i, (load<A>(xr + i) - m) * r * opt<A>(w, i, 1) + opt<A>(b, i, 0));
  if (threadIdx.x == 0) { mean[blockIdx.x] = m; rstd[blockIdx.x] = r; }
}

/* dx = (dn - mean(dn) - xhat mean(dn xhat)) rstd, dn = dy w, with the saved statistics' gradients
 * folded in: mean(dn) -= dmean / (rstd C) ... exactly as kernels/cpu/layernorm.c. */
template <typename T>
__global__ void layernorm_bwd_dx(const T *dy, const acc_t<T> *dmean, const acc_t<T> *drstd, const T *x, const T *w,
                                 const acc_t<T> *mean, const acc_t<T> *rstd, T *dx, int64_t C) {
  typedef acc_t<T> A;
  int64_t r = blockIdx.x;
  const T *xr = x + r * C, *dyr = dy + r * C;
  T *dxr = dx + r * C;
  A m = mean[r], s = rstd[r], a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    A dn = load<A>(dyr + i) * opt<A>(w, i, 1);
    a += dn;
    b += dn * (load<A>(xr + i) - m) * s;
  }
  a = bsum<A>(a);
  b = bsum<A>(b);
  a = (a - opt<A>(dmean, r, 0) / s) / (A)C;
  b = (b + opt<A>(drstd, r, 0) * s) / (A)C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    store<T, A>(dxr + i, (load<A>(dyr + i) * opt<A>(w, i, 1) - a - (load<A>(xr + i) - m) * s * b) * s);
}

/* dw[c] = sum_r dy xhat, db[c] = sum_r dy: partial sums over row chunks (grid.y), then a sum. */
#define LN_CHUNKS 64
template <typename T>
__global__ void layernorm_bwd_dwdb(const T *dy, const T *x, const acc_t<T> *mean, const acc_t<T> *rstd, acc_t<T> *pw,
                                   acc_t<T> *pb, int64_t rows, int64_t C) {
  typedef acc_t<T> A;
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  int64_t per = (rows + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
  A sw = 0, sb = 0;
  for (int64_t r = r0; r < r1; r++) {
    A g = load<A>(dy + r * C + c);
    sw += g * (load<A>(x + r * C + c) - mean[r]) * rstd[r];
    sb += g;
  }
  pw[blockIdx.y * C + c] = sw;
  pb[blockIdx.y * C + c] = sb;
}

template <typename T>
__global__ void sum_chunks(const acc_t<T> *p, T *out, int64_t chunks, int64_t C) {
  CUDA_LOOP(c, C) {
    acc_t<T> s = 0;
    for (int64_t k = 0; k < chunks; k++) s += p[k * C + c];
    store<T, acc_t<T>>(out + c, s);
  }
}

template <typename T>
static int layernorm_backward_t(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, flow_tensor **d, int64_t rows,
                                int64_t C) {
  typedef acc_t<T> A;
  cudaStream_t s = stream_of(dx);
  /* d: dy, dmean, drstd, x, w, mean, rstd (the statistics and their gradients in A) */
  layernorm_bwd_dx<T><<<(unsigned)rows, 256, 0, s>>>(ptr<T>(d[0]), ptr<A>(d[1]), ptr<A>(d[2]), ptr<T>(d[3]),
                                                     ptr<T>(d[4]), ptr<A>(d[5]), ptr<A>(d[6]), data_of<T>(dx), C);
  if (launch_check("layernorm_bwd_dx") != 0) return -1;
  int64_t chunks = rows < LN_CHUNKS ? rows : LN_CHUNKS;
  int64_t pshape[1] = {2 * chunks * C};
  flow_tensor *part = flow_tensor_new(d[5]->dtype, dx->device, 1, pshape); /* partial sums in A, as mean is */
  if (!part) return -1;
  A *pw = data_of<A>(part), *pb = pw + chunks * C;
  dim3 grid((unsigned)((C + 127) / 128), (unsigned)chunks);
  layernorm_bwd_dwdb<T><<<grid, 128, 0, s>>>(ptr<T>(d[0]), ptr<T>(d[3]), ptr<A>(d[5]), ptr<A>(d[6]), pw, pb, rows, C);
  sum_chunks<T><<<grid_for(C, 256), 256, 0, s>>>(pw, data_of<T>(dw), chunks, C);
  sum_chunks<T><<<grid_for(C, 256), 256, 0, s>>>(pb, data_of<T>(db), chunks, C);
  flow_tensor_decref(part);
  return launch_check("layernorm_bwd_dwdb");
}

enum { LN_WEIGHT = 1 << 16, LN_BIAS = 1 << 17, CE_REDUCE = 1 << 16, CE_MEAN = 1 << 17 }; /* ops/nn.c's bits */

static FLOW_KERNEL(k_layer_norm) {
  flow_tensor *src[3] = {in[0], a->flags & LN_WEIGHT ? in[1] : NULL, a->flags & LN_BIAS ? in[nin - 1] : NULL}, *d[3];
  int rc = -1;
  if (densify(src, d, 3)) {
    int64_t C = in[0]->ndim ? in[0]->shape[in[0]->ndim - 1] : 1, rows = C ? flow_tensor_numel(in[0]) / C : 0;
    cudaStream_t s = stream_of(out[0]);
    rc = 0;
    if (rows > 0) {
      REAL_DISPATCH(in[0]->dtype, "layer_norm",
        layernorm_fwd<T><<<(unsigned)rows, 256, 0, s>>>(data_of<T>(d[0]), ptr<T>(d[1]), ptr<T>(d[2]), data_of<T>(out[0]),
                                                        data_of<acc_t<T>>(out[1]), data_of<acc_t<T>>(out[2]), C, a->eps))
      if (rc == 0) rc = launch_check("layernorm_fwd");
    }
  }
  release(d, 3);
  return rc;
}

/* inputs: dy, dmean, drstd, x, mean, rstd[, w]; outputs dx, dw, db */
static FLOW_KERNEL(k_layer_norm_grad) {
  flow_tensor *src[7] = {in[0], in[1], in[2], in[3], a->flags & LN_WEIGHT ? in[6] : NULL, in[4], in[5]}, *d[7];
  int rc = -1;
  if (densify(src, d, 7)) {
    int64_t C = in[3]->shape[in[3]->ndim - 1], rows = C ? flow_tensor_numel(in[3]) / C : 0;
    if (rows == 0 || C == 0) rc = flow_cuda_fill(out[1], 0) || flow_cuda_fill(out[2], 0) ? -1 : 0;
    else REAL_DISPATCH(in[3]->dtype, "layer_norm_grad", rc = layernorm_backward_t<T>(out[0], out[1], out[2], d, rows, C))
  }
  release(d, 7);
  return rc;
}

/* ---- cross-entropy ------------------------------------------------------------------------------ */

/* Per row: lse = m + log sum exp(x - m), loss = lse - x[target] (0 if ignored; NaN for a target out
 * of range, which is reported at the next synchronisation). rowloss[r] = (loss, 1 if counted). */
template <typename T>
__global__ void ce_fwd(const T *x, const int64_t *t, T *loss, acc_t<T> *lse, double *rowloss, int64_t C, int64_t ignore,
                       BadIndex *bad) {
  typedef acc_t<T> A;
  int64_t r = blockIdx.x;
  const T *xr = x + r * C;
  A m, s;
  row_max_sumexp<A>(xr, C, &m, &s);
  if (threadIdx.x == 0) {
    A l = m + log(s);
    lse[r] = l;
    int64_t tr = t[r];
    A v = tr == ignore ? (A)0 : index_ok(bad, BAD_CROSS_ENTROPY, tr, C, ignore) ? l - load<A>(xr + tr) : (A)NAN;
    if (loss) store<T, A>(loss + r, v);
    if (rowloss) { rowloss[2 * r] = (double)v; rowloss[2 * r + 1] = tr == ignore ? 0.0 : 1.0; }
  }
}

/* loss = the sum of the row losses, divided by the count of rows not ignored when mean. */
template <typename T>
__global__ void ce_total(const double *rowloss, int64_t rows, T *loss, bool mean) {
  double s = 0, c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) { s += rowloss[2 * r]; c += rowloss[2 * r + 1]; }
  s = bsum<double>(s);
  c = bsum<double>(c);
  if (threadIdx.x == 0) store<T, double>(loss, mean ? s / c : s);
}

/* count[0] = the number of targets that are not ignore_index (the mean's divisor). */
__global__ void ce_count(const int64_t *t, int64_t rows, int64_t ignore, double *count) {
  double c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) c += t[r] != ignore;
  c = bsum<double>(c);
  if (threadIdx.x == 0) count[0] = c;
}

/* dlogits = (exp(x - lse) - onehot(target)) sr + exp(x - lse) glse, sr = g[r], or g / count (mean),
 * or g (sum); 0 for ignored rows. A target out of range has no onehot (and is reported). */
template <typename T>
__global__ void ce_bwd(const T *x, const int64_t *t, const acc_t<T> *lse, const T *g, const acc_t<T> *glse,
                       const double *count, T *dx, int64_t C, int64_t ignore, bool reduce, BadIndex *bad) {
  typedef acc_t<T> A;
  int64_t r = blockIdx.x;
  int64_t tr = t[r];
  bool ignored = tr == ignore;
  if (threadIdx.x == 0 && !ignored) index_ok(bad, BAD_CROSS_ENTROPY, tr, C, ignore);
  A sr = ignored ? (A)0 : reduce ? load<A>(g) / (A)(count ? count[0] : 1.0) : load<A>(g + r);
  A sp = sr + glse[r], l = lse[r];
  const T *xr = x + r * C;
  T *dr = dx + r * C;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    store<T, A>(dr + j, exp(load<A>(xr + j) - l) * sp - (j == tr ? sr : (A)0));
}

static FLOW_KERNEL(k_cross_entropy) {
  flow_tensor *src[2] = {in[0], in[1]}, *d[2];
  int rc = -1;
  bool reduce = a->flags & CE_REDUCE, mean = a->flags & CE_MEAN;
  if (densify(src, d, 2)) {
    int64_t C = in[0]->shape[in[0]->ndim - 1], rows = flow_tensor_numel(in[1]);
    cudaStream_t s = stream_of(out[0]);
    flow_tensor *scratch = NULL;
    int64_t sshape[1] = {2 * rows};
    BadIndex *bad = rows > 0 ? bad_index_record(out[0]) : NULL;
    rc = rows > 0 && !bad ? -1 : 0;
    if (rc == 0 && reduce && !(scratch = flow_tensor_new(FLOW_F64, out[0]->device, 1, sshape))) rc = -1;
    if (rc == 0 && rows > 0) {
      REAL_DISPATCH(in[0]->dtype, "cross_entropy",
        ce_fwd<T><<<(unsigned)rows, 256, 0, s>>>(data_of<T>(d[0]), data_of<int64_t>(d[1]), reduce ? NULL : data_of<T>(out[0]),
                                                 data_of<acc_t<T>>(out[1]), scratch ? data_of<double>(scratch) : NULL, C,
                                                 a->ignore_index, bad);
        if (reduce) ce_total<T><<<1, 1024, 0, s>>>(data_of<double>(scratch), rows, data_of<T>(out[0]), mean))
      if (rc == 0) rc = launch_check("cross_entropy_fwd");
    } else if (rc == 0 && reduce) {
      rc = flow_cuda_fill(out[0], mean ? NAN : 0);
    }
    if (scratch) flow_tensor_decref(scratch);
  }
  release(d, 2);
  return rc;
}

/* inputs: logits, target, lse, g, glse (lse and glse in acc_t, as the forward's lse); output dlogits */
static FLOW_KERNEL(k_cross_entropy_grad) {
  flow_tensor *src[5] = {in[0], in[1], in[2], in[3], in[4]}, *d[5];
  int rc = -1;
  bool reduce = a->flags & CE_REDUCE, mean = a->flags & CE_MEAN;
  if (densify(src, d, 5)) {
    int64_t C = in[0]->shape[in[0]->ndim - 1], rows = flow_tensor_numel(in[1]);
    cudaStream_t s = stream_of(out[0]);
    flow_tensor *scratch = NULL;
    int64_t sshape[1] = {1};
    BadIndex *bad = rows > 0 ? bad_index_record(out[0]) : NULL;
    rc = rows > 0 && !bad ? -1 : 0;
    if (rc == 0 && rows > 0 && mean && !(scratch = flow_tensor_new(FLOW_F64, out[0]->device, 1, sshape))) rc = -1;
    if (rc == 0 && rows > 0) {
      double *cnt = scratch ? data_of<double>(scratch) : NULL;
      if (cnt) ce_count<<<1, 1024, 0, s>>>(data_of<int64_t>(d[1]), rows, a->ignore_index, cnt);
      REAL_DISPATCH(in[0]->dtype, "cross_entropy_grad",
        ce_bwd<T><<<(unsigned)rows, 256, 0, s>>>(data_of<T>(d[0]), data_of<int64_t>(d[1]), data_of<acc_t<T>>(d[2]),
                                                 data_of<T>(d[3]), data_of<acc_t<T>>(d[4]), cnt, data_of<T>(out[0]), C,
                                                 a->ignore_index, reduce, bad))
      if (rc == 0) rc = launch_check("cross_entropy_bwd");
    }
    if (scratch) flow_tensor_decref(scratch);
  }
  release(d, 5);
  return rc;
}

/* ---- AdamW ---------------------------------------------------------------------------------------- */

/* p *= 1 - lr wd;  m += (1 - b1)(g - m);  v = b2 v + (1 - b2) g^2;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)  (PyTorch's AdamW).
 * float16/bfloat16 param, grad and moments compute in float but store rounded: with b2 near 1, v
 * then decays in coarse steps (no float32 master copy, as with PyTorch's AdamW on a bf16 model). */
template <typename T, typename A = acc_t<T>>
__global__ void adamw_kernel(Geo g, int64_t n, T *p, const T *gr, T *m, T *v, A decay, A b1, A b2, A step, A bc2,
                             A eps) {
  CUDA_LOOP(i, n) {
    int64_t off[4];
    geo_offsets<4>(g, i, off);
    A gi = load<A>(gr + off[1]), mi = load<A>(m + off[2]), vi = load<A>(v + off[3]);
    mi += (1 - b1) * (gi - mi);
    vi = b2 * vi + (1 - b2) * gi * gi;
    store<T, A>(m + off[2], mi);
    store<T, A>(v + off[3], vi);
    store<T, A>(p + off[0], load<A>(p + off[0]) * decay - step * (mi / (sqrt(vi) / bc2 + eps)));
  }
}

static FLOW_KERNEL(k_adamw) {
  int64_t n = flow_tensor_numel(in[0]);
  if (n == 0) return 0;
  const flow_tensor *ops[4] = {in[0], in[1], in[2], in[3]};
  Geo g;
  geo_init(&g, ops, 4);
  double decay = 1 - a->lr * a->weight_decay, step = a->lr / (1 - pow(a->beta1, (double)a->k));
  double bc2 = sqrt(1 - pow(a->beta2, (double)a->k));
  cudaStream_t s = stream_of(in[0]);
  int rc = 0;
  REAL_DISPATCH(in[0]->dtype, "adamw_",
    adamw_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<T>(in[0]), data_of<T>(in[1]), data_of<T>(in[2]),
                                                    data_of<T>(in[3]), (acc_t<T>)decay, (acc_t<T>)a->beta1,
                                                    (acc_t<T>)a->beta2, (acc_t<T>)step, (acc_t<T>)bc2, (acc_t<T>)a->eps))
  if (rc != 0 || launch_check("adamw_kernel") != 0) return -1;
  in[2]->storage->version++; /* dispatch bumps param's version; the moments were written too */
  in[3]->storage->version++;
  return 0;
}

void flow_cuda_register_nn(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, softmax, k_softmax);
  FLOW_KERNEL_ADD(FLOW_CUDA, log_softmax, k_log_softmax);
  FLOW_KERNEL_ADD(FLOW_CUDA, softmax_grad, k_softmax_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, log_softmax_grad, k_log_softmax_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, layer_norm, k_layer_norm);
  FLOW_KERNEL_ADD(FLOW_CUDA, layer_norm_grad, k_layer_norm_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, cross_entropy, k_cross_entropy);
  FLOW_KERNEL_ADD(FLOW_CUDA, cross_entropy_grad, k_cross_entropy_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, adamw_, k_adamw);
}
