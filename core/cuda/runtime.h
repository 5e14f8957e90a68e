/* The CUDA device runtime inside the plugin (flow_cuda.so): device probe, one compute stream and
 * one collective stream per device, and the caching allocator behind the FLOW_CUDA device. The CUDA
 * kernels and the NCCL communicator call this; the core reaches it only through flow_cuda_backend
 * (../cuda.h). Streams travel as void * (cudaStream_t), so C files need no CUDA headers. */
#ifndef FLOW_CUDA_RUNTIME_H
#define FLOW_CUDA_RUNTIME_H

#include "../cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Probe the GPUs and fill b's device part (device_count or reason, device, synchronize,
 * memory_stats, empty_cache). 0 even without a GPU. */
int flow_cuda_runtime_open(flow_cuda_backend *b);

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

/* Check a CUDA runtime status (an int holding cudaError_t): 0, or -1 with an error naming the
 * call, e.g. "cudaMalloc: out of memory". */
int flow_cuda_check(int status, const char *call);

/* The NCCL communicator backend (core/cuda/nccl.c): flow_cuda_backend.nccl_comm. */
flow_comm *flow_cuda_nccl_comm(flow_comm *boot, int device);

#ifdef __cplusplus
}
#endif

#endif
