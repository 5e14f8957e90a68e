/* Sort and top-k along one axis on CUDA: a thread per element finds its rank in its line (how many
 * elements come before it: smaller, or equal and earlier, NaN the largest), which is a stable sort
 * in O(K) per element; elements of rank < k write themselves to that slot. */
#include "common.h"

/* a comes strictly before b in the order (descending: larger first), NaN above every number */
template <typename T>
__device__ __forceinline__ bool before(T a, T b, bool desc) {
  bool an = a != a, bn = b != b;
  if (desc) return (a > b) || (an && !bn);
  return (a < b) || (bn && !an);
}

/* x as [outer, K, inner] (dense); vals/idx as [outer, k, inner] */
template <typename T>
__global__ void sort_kernel(int64_t n, const T *x, T *vals, int64_t *idx, int64_t K, int64_t inner, int64_t k,
                            bool desc) {
  CUDA_LOOP(t, n) {
    int64_t o = t / (K * inner), r = t / inner % K, i = t % inner;
    const T *line = x + o * K * inner + i;
    T v = line[r * inner];
    int64_t rank = 0;
    for (int64_t j = 0; j < K; j++) {
      T w = line[j * inner];
      rank += before(w, v, desc) || (j < r && !before(v, w, desc));
    }
    if (rank < k) {
      int64_t at = (o * k + rank) * inner + i;
      vals[at] = v;
      idx[at] = r;
    }
  }
}

static FLOW_KERNEL(k_sort) {
  (void)nin; (void)nout;
  int nd = in[0]->ndim, axis = nd == 0 ? -1 : (int)(a->axis < 0 ? a->axis + nd : a->axis);
  int64_t outer = 1, K = 1, inner = 1, k = 1;
  if (axis >= 0) {
    K = in[0]->shape[axis];
    k = out[0]->shape[axis];
    for (int d = 0; d < axis; d++) outer *= in[0]->shape[d];
    for (int d = axis + 1; d < nd; d++) inner *= in[0]->shape[d];
  }
  int64_t n = outer * K * inner;
  if (n == 0 || k == 0) return 0;
  flow_tensor *x = cuda_dense(in[0]);
  if (!x) return -1;
  bool desc = a->flags & FLOW_ATTR_DESCENDING;
  cudaStream_t st = stream_of(out[0]);
  unsigned grid = grid_for(n, 256);
  int rc = 0;
  switch (x->dtype) {
  case FLOW_I64: sort_kernel<int64_t><<<grid, 256, 0, st>>>(n, data_of<int64_t>(x), data_of<int64_t>(out[0]), data_of<int64_t>(out[1]), K, inner, k, desc); break;
  case FLOW_I32: sort_kernel<int32_t><<<grid, 256, 0, st>>>(n, data_of<int32_t>(x), data_of<int32_t>(out[0]), data_of<int64_t>(out[1]), K, inner, k, desc); break;
  case FLOW_U8: case FLOW_BOOL: sort_kernel<uint8_t><<<grid, 256, 0, st>>>(n, data_of<uint8_t>(x), data_of<uint8_t>(out[0]), data_of<int64_t>(out[1]), K, inner, k, desc); break;
  case FLOW_F32: sort_kernel<float><<<grid, 256, 0, st>>>(n, data_of<float>(x), data_of<float>(out[0]), data_of<int64_t>(out[1]), K, inner, k, desc); break;
  case FLOW_F64: sort_kernel<double><<<grid, 256, 0, st>>>(n, data_of<double>(x), data_of<double>(out[0]), data_of<int64_t>(out[1]), K, inner, k, desc); break;
  default: rc = FLOW_CUDA_UNSUPPORTED(x->dtype, "sort");
  }
  flow_tensor_decref(x);
  return rc ? rc : launch_check("sort_kernel");
}

void flow_cuda_register_sort(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, sort, k_sort);
  FLOW_KERNEL_ADD(FLOW_CUDA, topk, k_sort);
}
