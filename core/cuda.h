/* The CUDA backend as the core sees it: a plugin (flow_cuda.so: the device runtime, the CUDA kernels
 * and NCCL) loaded with dlopen on first CUDA use, so a process that never touches CUDA never loads
 * the CUDA libraries. No CUDA headers here. The plugin's own runtime API is core/cuda/runtime.h. */
#ifndef FLOW_CUDA_H
#define FLOW_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "device.h"
#include "dtype.h"
#include "tensor.h"

/* GPUs per process that flowlua drives (a build-time bound for per-device tables). */
#define FLOW_CUDA_MAX_DEVICES 16

/* Caching allocator statistics, in bytes (allocated: held by tensors; reserved: obtained from the
 * driver, cached blocks included; peak: highest allocated). */
typedef struct flow_cuda_memory_stats {
  size_t allocated, reserved, peak;
  uint64_t num_allocs;    /* allocations served */
  uint64_t cache_hits;    /* of those, served from the cache without cudaMalloc */
  uint64_t num_mallocs;   /* cudaMalloc calls */
} flow_cuda_memory_stats;

/* ---- the contract between the core and the plugin --------------------------------------------
 * The core dlopens the plugin (its symbols visible to the plugin, which calls core functions
 * directly) and calls FLOW_CUDA_PLUGIN_ENTRY. The entry registers the CUDA kernels in the kernel
 * table and fills the backend; the core registers `device` as the FLOW_CUDA memory interface last,
 * so no tensor is made before the kernels are in place. Without a GPU the entry still succeeds:
 * device_count 0 and `reason` says why. */
#define FLOW_CUDA_PLUGIN_ENTRY "flow_cuda_plugin_open"
#define FLOW_CUDA_PLUGIN_ABI 1   /* bump when this struct changes: a plugin of another build is refused */

typedef struct flow_cuda_backend {
  int device_count;
  char reason[512];                       /* why device_count is 0 */
  const flow_device_impl *device;         /* allocator and copies (NULL without a GPU) */
  int (*synchronize)(int index);          /* -1: every device */
  int (*memory_stats)(int index, flow_cuda_memory_stats *out);
  int (*empty_cache)(int index);          /* -1: every device */
  /* Seconds per call of c = a @ b run straight on cuBLAS (the reference of bench/gpu_matmul). */
  int (*bench_gemm)(flow_tensor *c, const flow_tensor *a, const flow_tensor *b, int iters, double *secs);
  /* An NCCL communicator over boot's ranks (boot: the MPI one over the same ranks; collective
   * over them) on GPU `device`; NULL + error. Its ops->free destroys it. */
  flow_comm *(*nccl_comm)(flow_comm *boot, int device);
} flow_cuda_backend;

typedef int (*flow_cuda_plugin_open_fn)(int abi, flow_cuda_backend *out);

/* ---- what the core and the bindings call --------------------------------------------------- */

/* Make the "cuda" device load the plugin on its first use (flow_device_get(FLOW_CUDA)), and call
 * `loaded` once the plugin is in (or failed to load), before the device is usable: the op layer's
 * chance to give every op without a CUDA kernel one that says why. `loaded` must not call back
 * into this file. Called once when flow opens. */
void flow_cuda_install(void (*loaded)(bool available));
/* Load the plugin now, once (thread-safe). Without it (a CPU build, a missing or broken
 * flow_cuda.so, no GPU) a stand-in device is registered whose every call fails with the reason,
 * so creating a CUDA tensor reports "cuda is not available (...)". */
void flow_cuda_init(void);
/* Whether the plugin was loaded already (nothing loads it). */
bool flow_cuda_loaded(void);
/* The loaded backend with at least one GPU, or NULL (loads the plugin). */
const flow_cuda_backend *flow_cuda_backend_get(void);
bool flow_cuda_is_available(void);
/* Why CUDA is unavailable ("no GPU found", "this build has no CUDA support", a missing plugin). */
const char *flow_cuda_unavailable_reason(void);
int flow_cuda_device_count(void);
/* Whether this machine may have an NVIDIA GPU at all (a driver's device node exists), without
 * loading anything: false means no GPU for certain. */
bool flow_cuda_driver_present(void);

/* Read by the CUDA kernels: tf32 for float32 matmul (autocast lives in autocast.h). */
extern bool flow_cuda_allow_tf32;

#endif
