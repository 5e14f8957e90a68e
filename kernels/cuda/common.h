/* Shared pieces of the CUDA kernels (C++, nvcc only): element types and their float conversions,
 * strided N-d geometry with broadcasting, launch checks; kernels register with FLOW_KERNEL_ADD. */
#ifndef FLOW_CUDA_COMMON_H
#define FLOW_CUDA_COMMON_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../../core/autocast.h"
#include "../../core/cuda/runtime.h"
#include "../../core/error.h"
#include "../../core/tensor.h"
#include "../registry.h"
}

typedef __nv_bfloat16 bf16;
typedef __half f16;

/* ---- element conversions: every float type computes in float (double stays double) ------------ */

template <typename T> __device__ __forceinline__ float to_f(T v) { return (float)v; }
template <> __device__ __forceinline__ float to_f<bf16>(bf16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<f16>(f16 v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v) { return (T)v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ f16 from_f<f16>(float v) { return __float2half(v); }

/* The type arithmetic runs in for storage type T. */
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
template <> struct Acc<int64_t> { typedef int64_t type; };
template <> struct Acc<int32_t> { typedef int64_t type; };
template <> struct Acc<uint8_t> { typedef int64_t type; };
template <> struct Acc<bool> { typedef int64_t type; };

template <typename C, typename T> __device__ __forceinline__ C load(const T *p) { return (C)to_f<T>(*p); }
template <> __device__ __forceinline__ double load<double, double>(const double *p) { return *p; }
template <> __device__ __forceinline__ int64_t load<int64_t, int64_t>(const int64_t *p) { return *p; }
template <> __device__ __forceinline__ int64_t load<int64_t, int32_t>(const int32_t *p) { return *p; }
template <> __device__ __forceinline__ int64_t load<int64_t, uint8_t>(const uint8_t *p) { return *p; }
template <> __device__ __forceinline__ int64_t load<int64_t, bool>(const bool *p) { return *p; }
template <typename T, typename C> __device__ __forceinline__ void store(T *p, C v) { *p = from_f<T>((float)v); }
template <> __device__ __forceinline__ void store<double, double>(double *p, double v) { *p = v; }
template <> __device__ __forceinline__ void store<int64_t, int64_t>(int64_t *p, int64_t v) { *p = v; }
template <> __device__ __forceinline__ void store<int32_t, int64_t>(int32_t *p, int64_t v) { *p = (int32_t)v; }
template <> __device__ __forceinline__ void store<uint8_t, int64_t>(uint8_t *p, int64_t v) { *p = (uint8_t)v; }
template <> __device__ __forceinline__ void store<bool, int64_t>(bool *p, int64_t v) { *p = v != 0; }
/* float storage read into double accumulators (sums, variances) and written back */
template <> __device__ __forceinline__ double load<double, float>(const float *p) { return *p; }
template <> __device__ __forceinline__ double load<double, bf16>(const bf16 *p) { return __bfloat162float(*p); }
template <> __device__ __forceinline__ double load<double, f16>(const f16 *p) { return __half2float(*p); }
template <> __device__ __forceinline__ void store<float, double>(float *p, double v) { *p = (float)v; }
template <> __device__ __forceinline__ void store<bf16, double>(bf16 *p, double v) { *p = __float2bfloat16((float)v); }
template <> __device__ __forceinline__ void store<f16, double>(f16 *p, double v) { *p = __float2half((float)v); }

/* The error for a dtype a CUDA kernel does not take. */
#define FLOW_CUDA_UNSUPPORTED(d, WHAT) flow_error_set("%s: dtype %s is not supported on cuda", WHAT, flow_dtype_name(d))

/* Run the body with T the storage type of float dtype d; `otherwise` (a statement) for any other. */
#define FLOW_CUDA_FLOAT_CASES(d, otherwise, ...)                                                   \
  switch (d) {                                                                                    \
  case FLOW_F32: { typedef float T; __VA_ARGS__; break; }                                         \
  case FLOW_F64: { typedef double T; __VA_ARGS__; break; }                                        \
  case FLOW_F16: { typedef f16 T; __VA_ARGS__; break; }                                           \
  case FLOW_BF16: { typedef bf16 T; __VA_ARGS__; break; }                                         \
  default: otherwise;                                                                             \
  }
/* ... returning -1 + error for other dtypes. */
#define FLOW_CUDA_DISPATCH_FLOAT(d, WHAT, ...) FLOW_CUDA_FLOAT_CASES(d, return FLOW_CUDA_UNSUPPORTED(d, WHAT), __VA_ARGS__)
/* Every dtype: the float ones, then the integer ones. */
#define FLOW_CUDA_DISPATCH_ALL(d, WHAT, ...)                                                        \
  switch (d) {                                                                                    \
  case FLOW_I64: { typedef int64_t T; __VA_ARGS__; break; }                                       \
  case FLOW_I32: { typedef int32_t T; __VA_ARGS__; break; }                                       \
  case FLOW_U8: { typedef uint8_t T; __VA_ARGS__; break; }                                        \
  case FLOW_BOOL: { typedef bool T; __VA_ARGS__; break; }                                         \
  default: FLOW_CUDA_DISPATCH_FLOAT(d, WHAT, __VA_ARGS__)                                         \
  }

/* ---- strided geometry ------------------------------------------------------------------------ */

#define GEO_MAX_OPS 4

/* Operand 0 is the output; inputs are broadcast to its shape (stride 0). Strides in elements.
 * Axes of size 1 are dropped and axes contiguous for every operand merged, so dense data is
 * one axis and the offset is a multiply. */
struct Geo {
  int ndim;
  bool small;   /* fewer than 2^31 elements: index arithmetic in 32 bits (64-bit division is slow) */
  int64_t shape[FLOW_MAX_DIMS];
  int64_t stride[GEO_MAX_OPS][FLOW_MAX_DIMS];
};

void geo_init(Geo *g, const flow_tensor *const *ops, int nops);

template <int N>
__device__ __forceinline__ void geo_offsets(const Geo &g, int64_t i, int64_t *off) {
#pragma unroll
  for (int k = 0; k < N; k++) off[k] = 0;
  if (g.ndim == 1) {
#pragma unroll
    for (int k = 0; k < N; k++) off[k] = i * g.stride[k][0];
    return;
  }
  if (g.small) {
    uint32_t u = (uint32_t)i;
    for (int d = g.ndim - 1; d >= 0; d--) {
      uint32_t n = (uint32_t)g.shape[d], idx = u % n;
      u /= n;
#pragma unroll
      for (int k = 0; k < N; k++) off[k] += (int64_t)idx * g.stride[k][d];
    }
    return;
  }
  for (int d = g.ndim - 1; d >= 0; d--) {
    int64_t idx = i % g.shape[d];
    i /= g.shape[d];
#pragma unroll
    for (int k = 0; k < N; k++) off[k] += idx * g.stride[k][d];
  }
}

/* ---- launches ---------------------------------------------------------------------------------- */

/* The compute stream of t's device (making it the current device). */
static inline cudaStream_t stream_of(const flow_tensor *t) { return (cudaStream_t)flow_cuda_stream(t->device.index); }

/* After a launch: 0, or -1 with an error naming the kernel. */
static inline int launch_check(const char *name) { return flow_cuda_check((int)cudaGetLastError(), name); }

static inline unsigned grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 65535 * 32 ? (b < 1 ? 1 : b) : 65535 * 32);
}

/* Grid-stride loop over [0, n). */
#define CUDA_LOOP(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

/* t's data typed. */
template <typename T> static inline T *data_of(const flow_tensor *t) { return (T *)flow_tensor_data(t); }

/* out = x (any strides, any dtype pair) and out[...] = v, on out's stream (elementwise.cu). */
int flow_cuda_copy(flow_tensor *out, const flow_tensor *x);
int flow_cuda_fill(flow_tensor *out, double v);

/* A dense copy of t on its device (t itself, new reference, when already contiguous). */
flow_tensor *cuda_dense(flow_tensor *t);
/* A contiguous cast of t to dtype on its device (new reference). */
flow_tensor *cuda_cast(flow_tensor *t, flow_dtype dtype);

/* ---- out-of-range indices ------------------------------------------------------------------------
 * A kernel cannot raise an error. One that meets an index out of range stays memory-safe (reads 0,
 * skips the write) and records the first such event of its device in pinned host memory mapped
 * into the device; the host raises it at the next synchronisation (errors.cu), as PyTorch does. */

/* Which op met the index: errors.cu holds each one's message, worded as its CPU kernel's. */
/* BAD_ZERO_DIV: an integer division by zero (extra: the flow_binary_code), no index at all. */
enum bad_index_op { BAD_GATHER = 1, BAD_SCATTER_ADD, BAD_INDEX_SELECT, BAD_EMBEDDING, BAD_CROSS_ENTROPY, BAD_ZERO_DIV };

struct BadIndex {
  int claimed;            /* 0 until a kernel claims the record (atomicCAS); the host clears it */
  int op;                 /* bad_index_op */
  int64_t index, size;    /* the index and the valid range [0, size) */
  int64_t extra;          /* the axis (gather, scatter_add, index_select) or ignore_index (cross_entropy) */
};

/* The device pointer of the record of t's device, made on first use; NULL + error if that fails. */
BadIndex *bad_index_record(const flow_tensor *t);
/* The sync check core/cuda.c calls (flow_cuda_set_sync_check): raises and clears the record. */
int flow_cuda_raise_bad_index(int device);

/* 0 <= i < size, or false after recording i (when it is the device's first bad index). */
__device__ __forceinline__ bool index_ok(BadIndex *rec, int op, int64_t i, int64_t size, int64_t extra) {
  if (i >= 0 && i < size) return true;
  if (atomicCAS(&rec->claimed, 0, 1) == 0) {
    rec->op = op;
    rec->index = i;
    rec->size = size;
    rec->extra = extra;
  }
  return false;
}

/* Per-file registration, called by flow_cuda_register_kernels. */
void flow_cuda_register_elementwise(void);
void flow_cuda_register_reduce(void);
void flow_cuda_register_sort(void);
void flow_cuda_register_matmul(void);
void flow_cuda_register_nn(void);
void flow_cuda_register_attention(void);
void flow_cuda_register_index(void);
void flow_cuda_register_shape(void);
void flow_cuda_register_random(void);
void flow_cuda_register_conv(void);

/* Run an op's CPU kernel on host copies of its inputs and copy the outputs back (register.cu). */
int flow_cuda_via_host(const char *name, flow_tensor *const *in, int nin, flow_tensor **out, int nout,
                       const flow_attrs *a);

/* Warp and block sums/maxes (blockDim.x a multiple of 32, at most 1024). */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* shared: at least 32 floats. Every thread gets the result. */
__device__ __forceinline__ float block_sum(float v, float *shared) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[w] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *shared) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[w] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : -INFINITY;
  return warp_max(v);
}

#endif
