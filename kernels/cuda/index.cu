/* Index kernels on CUDA: gather, scatter_add (atomic adds), index_select and embedding. Indices are
 * int64. An out-of-range index reads 0 (gather, embedding) or is skipped (scatter_add), and the
 * first one is reported as an error, worded as on the CPU, at the next synchronisation (common.h). */
#include "common.h"

/* t seen over the index's shape with stride 0 on axis: the index supplies that coordinate. */
static flow_tensor axis_free_view(const flow_tensor *t, const flow_tensor *like, int axis) {
  flow_tensor v = *t;
  v.ndim = like->ndim;
  for (int d = 0; d < like->ndim; d++) {
    v.shape[d] = d == axis ? 1 : like->shape[d];
    v.stride[d] = d == axis ? 0 : t->stride[d];
  }
  return v;
}

/* out[p] = t[p with p[axis] = idx[p]]; operands: out, idx, t (axis-free). */
template <typename T>
__global__ void gather_kernel(Geo g, int64_t n, T *out, const int64_t *idx, const T *t, int64_t tstride, int64_t len,
                              BadIndex *bad, int op, int axis) {
  CUDA_LOOP(i, n) {
    int64_t off[3];
    geo_offsets<3>(g, i, off);
    int64_t k = idx[off[1]];
    out[off[0]] = index_ok(bad, op, k, len, axis) ? t[off[2] + k * tstride] : T(0);
  }
}

template <typename T> __device__ __forceinline__ void atomic_add(T *p, T v) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void atomic_add<int64_t>(int64_t *p, int64_t v) {
  atomicAdd((unsigned long long *)p, (unsigned long long)v);
}

/* out[p with p[axis] = idx[p]] += src[p]; operands: idx, src, out (axis-free). */
template <typename T>
__global__ void scatter_add_kernel(Geo g, int64_t n, const int64_t *idx, const T *src, T *out, int64_t ostride,
                                   int64_t len, BadIndex *bad, int axis) {
  CUDA_LOOP(i, n) {
    int64_t off[3];
    geo_offsets<3>(g, i, off);
    int64_t k = idx[off[0]];
    if (index_ok(bad, BAD_SCATTER_ADD, k, len, axis)) atomic_add<T>(out + off[2] + k * ostride, src[off[1]]);
  }
}

/* op: BAD_GATHER or BAD_INDEX_SELECT, the op a bad index is reported for */
static int gather(flow_tensor *out, const flow_tensor *t, const flow_tensor *idx, int axis, int op) {
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  BadIndex *bad = bad_index_record(out);
  if (!bad) return -1;
  flow_tensor tv = axis_free_view(t, out, axis);
  const flow_tensor *ops[3] = {out, idx, &tv};
  Geo g;
  geo_init(&g, ops, 3);
  cudaStream_t s = stream_of(out);
  int64_t tstride = t->ndim ? t->stride[axis] : 0, len = t->ndim ? t->shape[axis] : 1;
  FLOW_CUDA_DISPATCH_ALL(t->dtype, "gather",
    gather_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<T>(out), data_of<int64_t>(idx), data_of<T>(t), tstride, len,
                                                    bad, op, axis))
  return launch_check("gather_kernel");
}

static int scatter_add(flow_tensor *out, const flow_tensor *idx, const flow_tensor *src, int axis) {
  int64_t n = flow_tensor_numel(idx);
  if (n == 0) return 0;
  BadIndex *bad = bad_index_record(out);
  if (!bad) return -1;
  flow_tensor ov = axis_free_view(out, idx, axis);
  const flow_tensor *ops[3] = {idx, src, &ov};
  Geo g;
  geo_init(&g, ops, 3);
  cudaStream_t s = stream_of(out);
  int64_t ostride = out->ndim ? out->stride[axis] : 0, len = out->ndim ? out->shape[axis] : 1;
  switch (out->dtype) {
  case FLOW_F32: scatter_add_kernel<float><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<int64_t>(idx), data_of<float>(src), data_of<float>(out), ostride, len, bad, axis); break;
  case FLOW_F64: scatter_add_kernel<double><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<int64_t>(idx), data_of<double>(src), data_of<double>(out), ostride, len, bad, axis); break;
  case FLOW_BF16: scatter_add_kernel<bf16><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<int64_t>(idx), data_of<bf16>(src), data_of<bf16>(out), ostride, len, bad, axis); break;
  case FLOW_F16: scatter_add_kernel<f16><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<int64_t>(idx), data_of<f16>(src), data_of<f16>(out), ostride, len, bad, axis); break;
  case FLOW_I64: scatter_add_kernel<int64_t><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<int64_t>(idx), data_of<int64_t>(src), data_of<int64_t>(out), ostride, len, bad, axis); break;
  case FLOW_I32: scatter_add_kernel<int32_t><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<int64_t>(idx), data_of<int32_t>(src), data_of<int32_t>(out), ostride, len, bad, axis); break;
  default: return flow_error_set("scatter_add: dtype %s is not supported on cuda", flow_dtype_name(out->dtype));
  }
  return launch_check("scatter_add_kernel");
}

static int axis_of(int64_t axis, int ndim) { return (int)(axis < 0 ? axis + ndim : axis); }

static FLOW_KERNEL(k_gather) { return gather(out[0], in[0], in[1], axis_of(a->axis, in[0]->ndim), BAD_GATHER); }

static FLOW_KERNEL(k_scatter_add) {
  if (flow_cuda_copy(out[0], in[0]) != 0) return -1;
  return scatter_add(out[0], in[1], in[2], axis_of(a->axis, in[0]->ndim));
}

/* index_select: the 1-d index seen over out's shape (stride 0 except on axis), then a gather. */
static FLOW_KERNEL(k_index_select) {
  int axis = axis_of(a->axis, in[0]->ndim);
  flow_tensor e = *in[1];
  e.ndim = out[0]->ndim;
  for (int d = 0; d < e.ndim; d++) {
    e.shape[d] = out[0]->shape[d];
    e.stride[d] = d == axis ? in[1]->stride[0] : 0;
  }
  return gather(out[0], in[0], &e, axis, BAD_INDEX_SELECT);
}

/* out[p, c] = weight[ids[p] - start, c]: the ids are checked against the vocabulary V, and rows
 * outside weight's [start, start + rows) (another rank's vocab shard) give 0. */
template <typename T>
__global__ void embedding_kernel(int64_t n, int64_t D, T *out, const int64_t *ids, const T *w, int64_t ws0, int64_t ws1,
                                 int64_t V, int64_t start, int64_t rows, BadIndex *bad) {
  CUDA_LOOP(i, n) {
    int64_t p = i / D, c = i % D, id = ids[p], r = id - start;
    bool ok = index_ok(bad, BAD_EMBEDDING, id, V, 0) && r >= 0 && r < rows;
    out[i] = ok ? w[r * ws0 + c * ws1] : T(0);
  }
}

/* ids dense; a vocab shard (attrs nlogical == 2, set by the global dispatcher) as on the CPU. */
static int embedding(flow_tensor *out, const flow_tensor *ids, const flow_tensor *w, const flow_attrs *a) {
  int64_t D = w->shape[1], n = flow_tensor_numel(out), rows = w->shape[0];
  bool shard = a->nlogical == 2;
  int64_t V = shard ? a->logical_shape[0] : rows, start = shard ? a->start : 0;
  if (n == 0) return 0;
  BadIndex *bad = bad_index_record(out);
  if (!bad) return -1;
  cudaStream_t s = stream_of(out);
  FLOW_CUDA_DISPATCH_FLOAT(w->dtype, "embedding",
    embedding_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(n, D, data_of<T>(out), data_of<int64_t>(ids), data_of<T>(w),
                                                         w->stride[0], w->stride[1], V, start, rows, bad))
  return launch_check("embedding_kernel");
}

static FLOW_KERNEL(k_embedding) {
  flow_tensor *ids = cuda_dense(in[0]);
  if (!ids) return -1;
  int rc = embedding(out[0], ids, in[1], a);
  flow_tensor_decref(ids);
  return rc;
}

void flow_cuda_register_index(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, gather, k_gather);
  FLOW_KERNEL_ADD(FLOW_CUDA, scatter_add, k_scatter_add);
  FLOW_KERNEL_ADD(FLOW_CUDA, index_select, k_index_select);
  FLOW_KERNEL_ADD(FLOW_CUDA, embedding, k_embedding);
}
