/* Reductions on CUDA: sum, mean, var over any set of axes, prod over one axis or all, cumsum along
 * one, max/min/argmax/argmin along one axis (or over everything) with its gradient scatter, and
 * amax/amin over any set of axes. Float sums accumulate in double, as on the CPU;
 * bool/uint8/int32/int64 sum into int64. */
#include "common.h"

/* Input seen as [kept..., reduced...]: output element o reduces the R elements at
 * koff(o) + roff(r). Kept axes are in output (row-major) order. */
struct Split {
  int nk, nr;
  int64_t kshape[FLOW_MAX_DIMS], kstride[FLOW_MAX_DIMS];
  int64_t rshape[FLOW_MAX_DIMS], rstride[FLOW_MAX_DIMS];
};

__device__ __forceinline__ int64_t split_off(int n, const int64_t *shape, const int64_t *stride, int64_t i) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    off += (i % shape[d]) * stride[d];
    i /= shape[d];
  }
  return off;
}

static void split_init(Split *s, const flow_tensor *t, const bool *mask, int64_t *O, int64_t *R) {
  s->nk = s->nr = 0;
  *O = *R = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (mask[d]) { s->rshape[s->nr] = t->shape[d]; s->rstride[s->nr++] = t->stride[d]; *R *= t->shape[d]; }
    else { s->kshape[s->nk] = t->shape[d]; s->kstride[s->nk++] = t->stride[d]; *O *= t->shape[d]; }
  }
}

template <typename T, typename C, typename O>
__global__ void reduce_rows(Split s, int64_t R, O *out, const T *x, double scale, int sq, const O *center) {
  __shared__ double shared[32];
  int64_t o = blockIdx.x;
  const T *base = x + split_off(s.nk, s.kshape, s.kstride, o);
  C acc = 0;
  C mu = sq ? (C)load<double, O>(center + o) : (C)0;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    C v = load<C, T>(base + split_off(s.nr, s.rshape, s.rstride, r));
    acc += sq ? (v - mu) * (v - mu) : v;
  }
  /* block sum in C */
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  C *sh = (C *)shared;
  if (lane == 0) sh[w] = acc;
  __syncthreads();
  if (w == 0) {
    acc = lane < nw ? sh[lane] : (C)0;
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) store<O, C>(out + o, scale == 1 ? acc : (C)(acc * scale));
  }
}

/* One thread per output: adjacent outputs are adjacent in memory when the kept axis is inner. */
template <typename T, typename C, typename O>
__global__ void reduce_cols(Split s, int64_t Onum, int64_t R, O *out, const T *x, double scale, int sq, const O *center) {
  CUDA_LOOP(o, Onum) {
    const T *base = x + split_off(s.nk, s.kshape, s.kstride, o);
    C acc = 0;
    C mu = sq ? (C)load<double, O>(center + o) : (C)0;
    for (int64_t r = 0; r < R; r++) {
      C v = load<C, T>(base + split_off(s.nr, s.rshape, s.rstride, r));
      acc += sq ? (v - mu) * (v - mu) : v;
    }
    store<O, C>(out + o, scale == 1 ? acc : (C)(acc * scale));
  }
}


template <typename T, typename C, typename O>
static void launch_reduce(const Split &s, int64_t Onum, int64_t R, bool rows, O *out, const T *x, double scale,
                          int sq, const O *center, cudaStream_t st) {
  if (rows) reduce_rows<T, C, O><<<(unsigned)Onum, 256, 0, st>>>(s, R, out, x, scale, sq, center);
  else reduce_cols<T, C, O><<<grid_for(Onum, 256), 256, 0, st>>>(s, Onum, R, out, x, scale, sq, center);
}

/* out = scale * sum over masked axes of x (or of (x - center)^2 when center is given). */
static int cuda_reduce(flow_tensor *out, const flow_tensor *x, const bool *mask, double scale, const flow_tensor *center) {
  Split s;
  int64_t Onum, R;
  split_init(&s, x, mask, &Onum, &R);
  if (Onum == 0) return 0;
  /* the empty sum times scale: 0 for sum, NaN for mean and var (scale inf or NaN), as on the CPU */
  if (R == 0) return flow_cuda_fill(out, 0 * scale);
  if (Onum > 2147483647) return flow_error_set("reduce: too many outputs for one launch");
  /* A block per output when the reduced elements are adjacent (the innermost axis is reduced), or
   * when there are too few outputs for a thread each to fill the GPU (a bias gradient: 768 sums of
   * 8192 rows); else a thread per output, adjacent threads reading adjacent memory. */
  bool inner = s.nr > 0 && s.rstride[s.nr - 1] == 1;
  bool rows = s.nk == 0 || inner || Onum < 65536;
  cudaStream_t st = stream_of(out);
  int sq = center != NULL;
  if (flow_dtype_is_int(x->dtype)) {
    if (out->dtype != FLOW_I64) return flow_error_set("reduce: integer sums must write int64");
    switch (x->dtype) {
    case FLOW_I64: launch_reduce<int64_t, int64_t, int64_t>(s, Onum, R, rows, data_of<int64_t>(out), data_of<int64_t>(x), 1, 0, NULL, st); break;
    case FLOW_I32: launch_reduce<int32_t, int64_t, int64_t>(s, Onum, R, rows, data_of<int64_t>(out), data_of<int32_t>(x), 1, 0, NULL, st); break;
    case FLOW_U8: launch_reduce<uint8_t, int64_t, int64_t>(s, Onum, R, rows, data_of<int64_t>(out), data_of<uint8_t>(x), 1, 0, NULL, st); break;
    default: launch_reduce<bool, int64_t, int64_t>(s, Onum, R, rows, data_of<int64_t>(out), data_of<bool>(x), 1, 0, NULL, st); break;
    }
    return launch_check("reduce_kernel");
  }
  FLOW_CUDA_DISPATCH_FLOAT(x->dtype, "reduce",
    launch_reduce<T, double, T>(s, Onum, R, rows, data_of<T>(out), data_of<T>(x), scale, sq,
                                center ? data_of<T>(center) : NULL, st))
  return launch_check("reduce_kernel");
}

static void mask_of(const flow_attrs *a, int ndim, bool *mask) {
  for (int d = 0; d < ndim; d++) mask[d] = a->naxes == 0;
  for (int i = 0; ndim > 0 && i < a->naxes; i++) mask[a->axes[i] < 0 ? a->axes[i] + ndim : a->axes[i]] = true;
}

static int64_t count_of(const flow_tensor *t, const bool *mask) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) if (mask[d]) n *= t->shape[d];
  return n;
}

static FLOW_KERNEL(k_sum) {
  bool mask[FLOW_MAX_DIMS];
  mask_of(a, in[0]->ndim, mask);
  return cuda_reduce(out[0], in[0], mask, 1, NULL);
}

static FLOW_KERNEL(k_mean) {
  bool mask[FLOW_MAX_DIMS];
  mask_of(a, in[0]->ndim, mask);
  return cuda_reduce(out[0], in[0], mask, 1.0 / (double)count_of(in[0], mask), NULL);
}

/* var = sum((x - mean)^2) / (count - ddof): the mean first (out's shape), then the squares. */
static FLOW_KERNEL(k_var) {
  bool mask[FLOW_MAX_DIMS];
  mask_of(a, in[0]->ndim, mask);
  int64_t n = count_of(in[0], mask), ddof = a->flags & FLOW_ATTR_UNBIASED ? 1 : 0;
  flow_tensor *mean = flow_tensor_new(out[0]->dtype, out[0]->device, out[0]->ndim, out[0]->shape);
  if (!mean) return -1;
  int rc = cuda_reduce(mean, in[0], mask, 1.0 / (double)n, NULL);
  if (rc == 0) rc = cuda_reduce(out[0], in[0], mask, n - ddof > 0 ? 1.0 / (double)(n - ddof) : NAN, mean);
  flow_tensor_decref(mean);
  return rc;
}

/* ---- max / min with indices ------------------------------------------------------------------- */

/* (a, ia) beats (b, ib): the larger (or smaller) value, NaN beating numbers, first index on ties. */
template <typename C> __device__ __forceinline__ bool beats(C a, int64_t ia, C b, int64_t ib, bool is_max) {
  bool an = a != a, bn = b != b;
  if (an || bn) return an && (!bn || ia < ib);
  if (a == b) return ia < ib;
  return is_max ? a > b : a < b;
}

/* One warp per output. */
template <typename T>
__global__ void argreduce_kernel(Split s, int64_t Onum, int64_t R, T *vals, int64_t *idx, const T *x, bool is_max) {
  typedef typename Acc<T>::type C;
  int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (o >= Onum) return;
  const T *base = x + split_off(s.nk, s.kshape, s.kstride, o);
  C best = 0;
  int64_t bi = -1;
  for (int64_t r = lane; r < R; r += 32) {
    C v = load<C, T>(base + split_off(s.nr, s.rshape, s.rstride, r));
    if (bi < 0 || beats<C>(v, r, best, bi, is_max)) { best = v; bi = r; }
  }
  for (int off = 16; off > 0; off >>= 1) {
    C ov = __shfl_xor_sync(0xffffffffu, best, off);
    int64_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (oi >= 0 && (bi < 0 || beats<C>(ov, oi, best, bi, is_max))) { best = ov; bi = oi; }
  }
  if (lane == 0) {
    if (vals) store<T, C>(vals + o, best);
    if (idx) idx[o] = bi;
  }
}

/* values and/or indices of the extreme element over the masked axes (amax/amin: several axes,
 * values only; max/min/argmax/argmin: one axis or all, flat index then). */
static int cuda_argreduce_mask(flow_tensor *values, flow_tensor *indices, const flow_tensor *x, const bool *mask,
                               bool is_max) {
  Split s;
  int64_t Onum, R;
  split_init(&s, x, mask, &Onum, &R);
  if (R == 0) return flow_error_set("cannot take the max/min over an empty axis");
  if (Onum == 0) return 0;
  cudaStream_t st = stream_of(x);
  unsigned grid = (unsigned)((Onum * 32 + 255) / 256);
  FLOW_CUDA_DISPATCH_ALL(x->dtype, "max/min",
    argreduce_kernel<T><<<grid, 256, 0, st>>>(s, Onum, R, values ? data_of<T>(values) : NULL,
                                              indices ? data_of<int64_t>(indices) : NULL, data_of<T>(x), is_max))
  return launch_check("argreduce_kernel");
}

static int cuda_argreduce(flow_tensor *values, flow_tensor *indices, const flow_tensor *x, int axis, bool is_max) {
  bool mask[FLOW_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) mask[d] = axis < 0 || d == axis;
  return cuda_argreduce_mask(values, indices, x, mask, is_max);
}

static int axis_of(const flow_attrs *a, const flow_tensor *t) {
  if (a->naxes == 0 || t->ndim == 0) return -1;
  return (int)(a->axes[0] < 0 ? a->axes[0] + t->ndim : a->axes[0]);
}

static FLOW_KERNEL(k_max) { return cuda_argreduce(out[0], out[1], in[0], axis_of(a, in[0]), true); }
static FLOW_KERNEL(k_min) { return cuda_argreduce(out[0], out[1], in[0], axis_of(a, in[0]), false); }
static FLOW_KERNEL(k_argmax) { return cuda_argreduce(NULL, out[0], in[0], axis_of(a, in[0]), true); }
static FLOW_KERNEL(k_argmin) { return cuda_argreduce(NULL, out[0], in[0], axis_of(a, in[0]), false); }

static FLOW_KERNEL(k_amax) {
  bool mask[FLOW_MAX_DIMS];
  mask_of(a, in[0]->ndim, mask);
  return cuda_argreduce_mask(out[0], NULL, in[0], mask, true);
}
static FLOW_KERNEL(k_amin) {
  bool mask[FLOW_MAX_DIMS];
  mask_of(a, in[0]->ndim, mask);
  return cuda_argreduce_mask(out[0], NULL, in[0], mask, false);
}

/* out (contiguous, zeroed here) gets g[j] at index idx[j] along axis, j running over the other
 * axes in order (axis < 0: idx is a flat index). */
template <typename T>
__global__ void index_put_kernel(int64_t n, T *out, const T *g, const int64_t *idx, int64_t inner, int64_t len) {
  CUDA_LOOP(j, n) {
    int64_t outer = j / inner, in_ = j % inner;
    out[(outer * len + idx[j]) * inner + in_] = g[j];
  }
}

static FLOW_KERNEL(k_arg_backward) {
  flow_tensor *o = out[0];
  int axis = a->naxes == 0 || a->nshape == 0 ? -1 : (int)(a->axes[0] < 0 ? a->axes[0] + a->nshape : a->axes[0]);
  if (flow_cuda_fill(o, 0) != 0) return -1;
  flow_tensor *g = cuda_dense(in[0]), *idx = g ? cuda_dense(in[1]) : NULL;
  int rc = -1;
  if (idx) {
    int64_t n = flow_tensor_numel(g), inner = 1, len = flow_tensor_numel(o);
    if (axis >= 0) {
      len = o->shape[axis];
      for (int d = axis + 1; d < o->ndim; d++) inner *= o->shape[d];
    }
    cudaStream_t st = stream_of(o);
    if (n > 0) {
      FLOW_CUDA_DISPATCH_ALL(o->dtype, "argreduce_backward",
        index_put_kernel<T><<<grid_for(n, 256), 256, 0, st>>>(n, data_of<T>(o), data_of<T>(g), data_of<int64_t>(idx),
                                                               inner, len))
    }
    rc = launch_check("index_put_kernel");
  }
  if (g) flow_tensor_decref(g);
  if (idx) flow_tensor_decref(idx);
  return rc;
}

/* ---- prod -------------------------------------------------------------------------------------- */

/* out[o] = prod_r x[koff(o) + roff(r)] (the empty product 1), one thread per output, in C. */
template <typename T, typename C, typename O>
__global__ void prod_kernel(Split s, int64_t Onum, int64_t R, O *out, const T *x) {
  CUDA_LOOP(o, Onum) {
    const T *base = x + split_off(s.nk, s.kshape, s.kstride, o);
    C acc = 1;
    for (int64_t r = 0; r < R; r++) acc *= load<C, T>(base + split_off(s.nr, s.rshape, s.rstride, r));
    store<O, C>(out + o, acc);
  }
}

static FLOW_KERNEL(k_prod) {
  bool mask[FLOW_MAX_DIMS];
  mask_of(a, in[0]->ndim, mask);
  const flow_tensor *x = in[0];
  flow_tensor *o = out[0];
  Split s;
  int64_t Onum, R;
  split_init(&s, x, mask, &Onum, &R);
  if (Onum == 0) return 0;
  cudaStream_t st = stream_of(o);
  unsigned grid = grid_for(Onum, 256);
  switch (x->dtype) {
  case FLOW_I64: prod_kernel<int64_t, int64_t, int64_t><<<grid, 256, 0, st>>>(s, Onum, R, data_of<int64_t>(o), data_of<int64_t>(x)); break;
  case FLOW_I32: prod_kernel<int32_t, int64_t, int64_t><<<grid, 256, 0, st>>>(s, Onum, R, data_of<int64_t>(o), data_of<int32_t>(x)); break;
  case FLOW_U8: prod_kernel<uint8_t, int64_t, int64_t><<<grid, 256, 0, st>>>(s, Onum, R, data_of<int64_t>(o), data_of<uint8_t>(x)); break;
  case FLOW_BOOL: prod_kernel<bool, int64_t, int64_t><<<grid, 256, 0, st>>>(s, Onum, R, data_of<int64_t>(o), data_of<bool>(x)); break;
  default:
    FLOW_CUDA_DISPATCH_FLOAT(x->dtype, "prod",
      prod_kernel<T, double, T><<<grid, 256, 0, st>>>(s, Onum, R, data_of<T>(o), data_of<T>(x)))
  }
  return launch_check("prod_kernel");
}

/* ---- cumsum ------------------------------------------------------------------------------------ */

/* Over x as [outer, K, inner] (dense): out[o, k, i] = sum_{j <= k} x[o, j, i] (j >= k when rev),
 * one thread per (o, i) running down its column, accumulating in C (double for floats). */
template <typename T, typename C, typename O>
__global__ void cumsum_kernel(int64_t n, O *out, const T *x, int64_t K, int64_t inner, bool rev) {
  CUDA_LOOP(t, n) {
    int64_t o = t / inner, i = t % inner;
    C acc = 0;
    for (int64_t j = 0; j < K; j++) {
      int64_t at = (o * K + (rev ? K - 1 - j : j)) * inner + i;
      acc += load<C, T>(x + at);
      store<O, C>(out + at, acc);
    }
  }
}

static FLOW_KERNEL(k_cumsum) {
  flow_tensor *o = out[0];
  int nd = in[0]->ndim, axis = nd == 0 ? 0 : (int)(a->axis < 0 ? a->axis + nd : a->axis);
  int64_t outer = 1, K = 1, inner = 1;
  if (nd > 0) {
    K = in[0]->shape[axis];
    for (int d = 0; d < axis; d++) outer *= in[0]->shape[d];
    for (int d = axis + 1; d < nd; d++) inner *= in[0]->shape[d];
  }
  int64_t n = outer * inner;
  if (n == 0 || K == 0) return 0;
  flow_tensor *x = cuda_dense(in[0]);
  if (!x) return -1;
  bool rev = a->flags & FLOW_ATTR_REVERSE;
  cudaStream_t st = stream_of(o);
  unsigned grid = grid_for(n, 256);
  int rc = 0;
  switch (x->dtype) {
  case FLOW_I64: cumsum_kernel<int64_t, int64_t, int64_t><<<grid, 256, 0, st>>>(n, data_of<int64_t>(o), data_of<int64_t>(x), K, inner, rev); break;
  case FLOW_I32: cumsum_kernel<int32_t, int64_t, int64_t><<<grid, 256, 0, st>>>(n, data_of<int64_t>(o), data_of<int32_t>(x), K, inner, rev); break;
  case FLOW_U8: cumsum_kernel<uint8_t, int64_t, int64_t><<<grid, 256, 0, st>>>(n, data_of<int64_t>(o), data_of<uint8_t>(x), K, inner, rev); break;
  case FLOW_BOOL: cumsum_kernel<bool, int64_t, int64_t><<<grid, 256, 0, st>>>(n, data_of<int64_t>(o), data_of<bool>(x), K, inner, rev); break;
  default:
    FLOW_CUDA_FLOAT_CASES(x->dtype, rc = FLOW_CUDA_UNSUPPORTED(x->dtype, "cumsum"),
      cumsum_kernel<T, double, T><<<grid, 256, 0, st>>>(n, data_of<T>(o), data_of<T>(x), K, inner, rev))
  }
  flow_tensor_decref(x);
  return rc ? rc : launch_check("cumsum_kernel");
}

void flow_cuda_register_reduce(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, sum, k_sum);
  FLOW_KERNEL_ADD(FLOW_CUDA, mean, k_mean);
  FLOW_KERNEL_ADD(FLOW_CUDA, var, k_var);
  FLOW_KERNEL_ADD(FLOW_CUDA, max, k_max);
  FLOW_KERNEL_ADD(FLOW_CUDA, min, k_min);
  FLOW_KERNEL_ADD(FLOW_CUDA, argmax, k_argmax);
  FLOW_KERNEL_ADD(FLOW_CUDA, argmin, k_argmin);
  FLOW_KERNEL_ADD(FLOW_CUDA, amax, k_amax);
  FLOW_KERNEL_ADD(FLOW_CUDA, amin, k_amin);
  FLOW_KERNEL_ADD(FLOW_CUDA, argreduce_backward, k_arg_backward);
  FLOW_KERNEL_ADD(FLOW_CUDA, cumsum, k_cumsum);
  FLOW_KERNEL_ADD(FLOW_CUDA, prod, k_prod);
}
