/* The CUDA device runtime: device discovery, one compute stream and one collective stream per
 * device, a caching allocator, and autocast state. No CUDA headers here: streams travel as void *
 * (cudaStream_t), so C code that never touches a kernel can include this in every build. */
#ifndef FLOW_CUDA_H
#define FLOW_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

/* Probe the GPUs once and register the FLOW_CUDA device backend. Without a GPU (or without CUDA in
 * this build) a stand-in backend is registered whose every call fails with the reason, so creating
 * a CUDA tensor reports "cuda is not available (...)" instead of a generic error. */
void flow_cuda_init(void);
/* GPUs per process that flowlua drives (a build-time bound for per-device tables). */
#define FLOW_CUDA_MAX_DEVICES 16
bool flow_cuda_is_available(void);
/* Why CUDA is unavailable ("no GPU found", "this build has no CUDA support", a driver error). */
const char *flow_cuda_unavailable_reason(void);
int flow_cuda_device_count(void);

/* Make `index` the calling thread's current device; -1 + error if it does not exist. */
int flow_cuda_set_device(int index);
/* Wait for all work on the device (index -1: every device). */
int flow_cuda_synchronize(int index);
/* Called after every synchronisation with device `index` (flow_cuda_synchronize, copies that touch
 * host memory): the CUDA kernels register here the check that raises what their kernels recorded
 * but could not raise themselves (an out-of-range index). 0, or -1 with the error set. */
void flow_cuda_set_sync_check(int (*check)(int index));

/* cudaStream_t of the device's compute stream (every kernel runs there) and of its collective
 * stream (NCCL). The two are ordered with events: the collective stream waits for the compute
 * work issued so far before a collective, and the compute stream waits for the collective after
 * it. So memory freed by the caching allocator (which reuses in compute-stream order) is never
 * still in use by a collective. */
void *flow_cuda_stream(int index);
void *flow_cuda_comm_stream(int index);
int flow_cuda_comm_wait_compute(int index);
int flow_cuda_compute_wait_comm(int index);

/* Caching allocator statistics, in bytes (allocated: held by tensors; reserved: obtained from the
 * driver, cached blocks included; peak: highest allocated). */
typedef struct flow_cuda_memory_stats {
  size_t allocated, reserved, peak;
  uint64_t num_allocs;    /* allocations served */
  uint64_t cache_hits;    /* of those, served from the cache without cudaMalloc */
  uint64_t num_mallocs;   /* cudaMalloc calls */
} flow_cuda_memory_stats;
int flow_cuda_get_memory_stats(int index, flow_cuda_memory_stats *out);
/* Return every cached (unused) block to the driver. */
int flow_cuda_empty_cache(int index);

/* Check a CUDA runtime status (an int holding cudaError_t): 0, or -1 with an error naming the
 * call, e.g. "cudaMalloc: out of memory". */
int flow_cuda_check(int status, const char *call);

/* Read by the CUDA kernels: tf32 for float32 matmul (autocast lives in autocast.h). */
extern bool flow_cuda_allow_tf32;

#endif
