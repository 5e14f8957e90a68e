/* Shape kernels on CUDA that move data: cat and narrow_backward (copies into windows of the
 * output), tril/triu (a mask over the last two axes) and flip (a gather from mirrored indices). */
#include "common.h"

/* The window [start, start + len) of out along axis, as a view with out's strides. */
static flow_tensor *window(flow_tensor *out, int axis, int64_t start, const int64_t *shape) {
  return flow_tensor_view_of(out, out->ndim, shape, out->stride, out->offset + start * out->stride[axis]);
}

/* out = zeros with g at [start, start + len) along axis. */
static FLOW_KERNEL(k_narrow_backward) {
  if (flow_cuda_fill(out[0], 0) != 0) return -1;
  flow_tensor *w = window(out[0], (int)a->axis, a->start, in[0]->shape);
  if (!w) return -1;
  int rc = flow_cuda_copy(w, in[0]);
  flow_tensor_decref(w);
  return rc;
}

static FLOW_KERNEL(k_cat) {
  int axis = (int)(a->axis < 0 ? a->axis + in[0]->ndim : a->axis);
  int64_t at = 0;
  for (int i = 0; i < nin; i++) {
    if (flow_tensor_numel(in[i]) > 0) {
      flow_tensor *w = window(out[0], axis, at, in[i]->shape);
      int rc = w ? flow_cuda_copy(w, in[i]) : -1;
      if (w) flow_tensor_decref(w);
      if (rc != 0) return -1;
    }
    at += in[i]->shape[axis];
  }
  return 0;
}

/* tril keeps j <= i + k, triu keeps j >= i + k, over the last two axes (o and x dense). */
template <typename T>
__global__ void tri_kernel(int64_t n, T *o, const T *x, int64_t rows, int64_t cols, int64_t k, bool upper) {
  CUDA_LOOP(e, n) {
    int64_t j = e % cols, i = (e / cols) % rows;
    bool keep = upper ? j >= i + k : j <= i + k;
    o[e] = keep ? x[e] : T(0);
  }
}

/* o = the kept triangle of x (both dense, any dtype: whole elements move, as on the CPU). */
static int tri_launch(flow_tensor *o, const flow_tensor *x, int64_t k, bool upper) {
  int64_t n = flow_tensor_numel(o), rows = o->shape[o->ndim - 2], cols = o->shape[o->ndim - 1];
  cudaStream_t s = stream_of(o);
  FLOW_CUDA_DISPATCH_ALL(o->dtype, "tril/triu",
    tri_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(n, data_of<T>(o), data_of<T>(x), rows, cols, k, upper))
  return launch_check("tri_kernel");
}

static int tri(flow_tensor *const *in, flow_tensor **out, const flow_attrs *a, bool upper) {
  flow_tensor *o = out[0];
  if (flow_tensor_numel(o) == 0) return 0;
  if (o->ndim < 2 || !flow_tensor_is_contiguous(o)) return flow_error_set("tril/triu: expected a contiguous output of at least 2-d");
  flow_tensor *x = cuda_dense(in[0]);
  if (!x) return -1;
  int rc = tri_launch(o, x, a->k, upper);
  flow_tensor_decref(x);
  return rc;
}

static FLOW_KERNEL(k_tril) { return tri(in, out, a, false); }
static FLOW_KERNEL(k_triu) { return tri(in, out, a, true); }

/* The dense shape and which axes flip, passed by value. */
struct FlipGeo {
  int nd;
  int64_t shape[FLOW_MAX_DIMS];
  bool flip[FLOW_MAX_DIMS];
};

/* o[i] = x[i'] with i'_d = n_d - 1 - i_d on the flipped axes (o and x dense, any dtype). */
template <typename T>
__global__ void flip_kernel(int64_t n, T *o, const T *x, FlipGeo g) {
  CUDA_LOOP(e, n) {
    int64_t rest = e, src = 0, step = 1;
    for (int d = g.nd - 1; d >= 0; d--) {
      int64_t i = rest % g.shape[d];
      rest /= g.shape[d];
      src += (g.flip[d] ? g.shape[d] - 1 - i : i) * step;
      step *= g.shape[d];
    }
    o[e] = x[src];
  }
}

static FLOW_KERNEL(k_flip) {
  flow_tensor *o = out[0];
  int64_t n = flow_tensor_numel(o);
  if (n == 0) return 0;
  FlipGeo g;
  g.nd = in[0]->ndim;
  for (int d = 0; d < g.nd; d++) { g.shape[d] = in[0]->shape[d]; g.flip[d] = false; }
  for (int i = 0; g.nd > 0 && i < a->naxes; i++) g.flip[a->axes[i] < 0 ? a->axes[i] + g.nd : a->axes[i]] = true;
  flow_tensor *x = cuda_dense(in[0]);
  if (!x) return -1;
  cudaStream_t st = stream_of(o);
  int rc = 0;
  switch (o->dtype) {
  case FLOW_I64: flip_kernel<int64_t><<<grid_for(n, 256), 256, 0, st>>>(n, data_of<int64_t>(o), data_of<int64_t>(x), g); break;
  case FLOW_I32: flip_kernel<int32_t><<<grid_for(n, 256), 256, 0, st>>>(n, data_of<int32_t>(o), data_of<int32_t>(x), g); break;
  case FLOW_U8: flip_kernel<uint8_t><<<grid_for(n, 256), 256, 0, st>>>(n, data_of<uint8_t>(o), data_of<uint8_t>(x), g); break;
  case FLOW_BOOL: flip_kernel<bool><<<grid_for(n, 256), 256, 0, st>>>(n, data_of<bool>(o), data_of<bool>(x), g); break;
  default:
    FLOW_CUDA_FLOAT_CASES(o->dtype, rc = FLOW_CUDA_UNSUPPORTED(o->dtype, "flip"),
      flip_kernel<T><<<grid_for(n, 256), 256, 0, st>>>(n, data_of<T>(o), data_of<T>(x), g))
  }
  flow_tensor_decref(x);
  return rc ? rc : launch_check("flip_kernel");
}

void flow_cuda_register_shape(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, narrow_backward, k_narrow_backward);
  FLOW_KERNEL_ADD(FLOW_CUDA, cat, k_cat);
  FLOW_KERNEL_ADD(FLOW_CUDA, tril, k_tril);
  FLOW_KERNEL_ADD(FLOW_CUDA, triu, k_triu);
  FLOW_KERNEL_ADD(FLOW_CUDA, flip, k_flip);
}
