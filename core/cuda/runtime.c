/* The CUDA device runtime of the plugin (see runtime.h): device probe, per-device streams and
 * events, and the caching allocator behind the FLOW_CUDA device. */
#include "runtime.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "../error.h"

static int device_count;
static int (*sync_check)(int index);

void flow_cuda_set_sync_check(int (*check)(int index)) { sync_check = check; }

/* Size classes: 512 bytes, then four per power of two (2^e * {1.25, 1.5, 1.75, 2}), so a block
 * wastes at most a fifth of itself. A freed block goes to its class's list and is reused as is. */
#define NCLASSES 160

typedef struct block { void *p; struct block *next; } block;

typedef struct cuda_dev {
  pthread_mutex_t lock;
  bool ready;
  cudaStream_t compute, comm;
  cudaEvent_t compute_done, comm_done;
  block *free_list[NCLASSES];   /* cached blocks, all of the compute stream */
  flow_cuda_memory_stats stats;
} cuda_dev;

static cuda_dev devs[FLOW_CUDA_MAX_DEVICES];
static _Thread_local int current_device = -1;

int flow_cuda_check(int status, const char *call) {
  if (status == cudaSuccess) return 0;
  cudaGetLastError(); /* clear the sticky-free error state so later calls are not blamed */
  return flow_error_set("%s: %s (CUDA error %d)", call, cudaGetErrorString((cudaError_t)status), status);
}

static int size_class(size_t n, size_t *rounded) {
  if (n <= 512) { *rounded = 512; return 0; }
  int e = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^e <= n-1 < 2^(e+1) */
  size_t step = (size_t)1 << (e - 2);
  size_t q = (n - 1 - ((size_t)1 << e)) / step + 1;           /* 1..4 */
  *rounded = ((size_t)1 << e) + q * step;
  int c = (e - 9) * 4 + (int)q;
  return c < NCLASSES ? c : -1;
}

/* Streams and events are made on first use, so an unused GPU gets no context. */
static int dev_ready(int index) {
  if (index < 0 || index >= device_count)
    return flow_error_set("cuda:%d does not exist (%d GPU%s found)", index, device_count, device_count == 1 ? "" : "s");
  if (current_device != index) {
    if (flow_cuda_check(cudaSetDevice(index), "cudaSetDevice") != 0) return -1;
    current_device = index;
  }
  cuda_dev *d = &devs[index];
  if (d->ready) return 0;
  pthread_mutex_lock(&d->lock);
  int rc = 0;
  if (!d->ready) {
    rc = flow_cuda_check(cudaStreamCreateWithFlags(&d->compute, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!rc) rc = flow_cuda_check(cudaStreamCreateWithFlags(&d->comm, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!rc) rc = flow_cuda_check(cudaEventCreateWithFlags(&d->compute_done, cudaEventDisableTiming), "cudaEventCreate");
    if (!rc) rc = flow_cuda_check(cudaEventCreateWithFlags(&d->comm_done, cudaEventDisableTiming), "cudaEventCreate");
    d->ready = rc == 0;
  }
  pthread_mutex_unlock(&d->lock);
  return rc;
}

int flow_cuda_set_device(int index) { return dev_ready(index); }

void *flow_cuda_stream(int index) { return dev_ready(index) == 0 ? (void *)devs[index].compute : NULL; }
void *flow_cuda_comm_stream(int index) { return dev_ready(index) == 0 ? (void *)devs[index].comm : NULL; }

int flow_cuda_comm_wait_compute(int index) {
  if (dev_ready(index) != 0) return -1;
  cuda_dev *d = &devs[index];
  if (flow_cuda_check(cudaEventRecord(d->compute_done, d->compute), "cudaEventRecord") != 0) return -1;
  return flow_cuda_check(cudaStreamWaitEvent(d->comm, d->compute_done, 0), "cudaStreamWaitEvent");
}

int flow_cuda_compute_wait_comm(int index) {
  if (dev_ready(index) != 0) return -1;
  cuda_dev *d = &devs[index];
  if (flow_cuda_check(cudaEventRecord(d->comm_done, d->comm), "cudaEventRecord") != 0) return -1;
  return flow_cuda_check(cudaStreamWaitEvent(d->compute, d->comm_done, 0), "cudaStreamWaitEvent");
}

/* After a wait on the device: its status, then what its kernels recorded (sync_check). */
static int synced(int index, cudaError_t status, const char *call) {
  if (flow_cuda_check(status, call) != 0) return -1;
  return sync_check ? sync_check(index) : 0;
}

int flow_cuda_synchronize(int index) {
  if (index < 0) {
    for (int i = 0; i < device_count; i++)
      if (devs[i].ready && flow_cuda_synchronize(i) != 0) return -1;
    return 0;
  }
  if (dev_ready(index) != 0) return -1;
  return synced(index, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static size_t class_bytes(int c) {
  if (c == 0) return 512;
  int e = (c - 1) / 4 + 9, q = (c - 1) % 4 + 1;
  return ((size_t)1 << e) + (size_t)q * ((size_t)1 << (e - 2));
}

/* Hand every cached block back to the driver. Caller holds d->lock; the compute stream is idle. */
static void release_cached(cuda_dev *d) {
  for (int c = 0; c < NCLASSES; c++)
    while (d->free_list[c]) {
      block *b = d->free_list[c];
      d->free_list[c] = b->next;
      cudaFree(b->p);
      free(b);
      d->stats.reserved -= class_bytes(c);
    }
}

static int empty_cache(int index) {
  if (index < 0) {
    for (int i = 0; i < device_count; i++)
      if (devs[i].ready && empty_cache(i) != 0) return -1;
    return 0;
  }
  if (flow_cuda_synchronize(index) != 0) return -1;
  cuda_dev *d = &devs[index];
  pthread_mutex_lock(&d->lock);
  release_cached(d);
  pthread_mutex_unlock(&d->lock);
  return 0;
}

static int memory_stats(int index, flow_cuda_memory_stats *out) {
  if (index < 0 || index >= device_count)
    return flow_error_set("memory_stats: cuda:%d does not exist (%d GPUs found)", index, device_count);
  pthread_mutex_lock(&devs[index].lock);
  *out = devs[index].stats;
  pthread_mutex_unlock(&devs[index].lock);
  return 0;
}

static void *cuda_alloc(int index, size_t nbytes) {
  if (dev_ready(index) != 0) return NULL;
  size_t sz;
  int c = size_class(nbytes, &sz);
  if (c < 0) {
    flow_error_set("cuda: cannot allocate %zu bytes (larger than any size class)", nbytes);
    return NULL;
  }
  cuda_dev *d = &devs[index];
  pthread_mutex_lock(&d->lock);
  void *p = NULL;
  d->stats.num_allocs++;
  if (d->free_list[c]) { /* stream-ordered reuse: later compute work runs after earlier uses */
    block *b = d->free_list[c];
    d->free_list[c] = b->next;
    p = b->p;
    free(b);
    d->stats.cache_hits++;
  } else {
    cudaError_t st = cudaMalloc(&p, sz);
    if (st == cudaErrorMemoryAllocation) { /* give the cache back to the driver and try once more */
      cudaGetLastError();
      pthread_mutex_unlock(&d->lock);
      cudaStreamSynchronize(d->compute);
      pthread_mutex_lock(&d->lock);
      release_cached(d);
      st = cudaMalloc(&p, sz);
    }
    if (st != cudaSuccess) {
      cudaGetLastError();
      flow_error_set("cuda: out of memory allocating %zu bytes on cuda:%d (cudaMalloc: %s; allocated %zu, "
                     "reserved %zu)", nbytes, index, cudaGetErrorString(st), d->stats.allocated, d->stats.reserved);
      d->stats.num_allocs--;
      pthread_mutex_unlock(&d->lock);
      return NULL;
    }
    d->stats.num_mallocs++;
    d->stats.reserved += sz;
  }
  d->stats.allocated += sz;
  if (d->stats.allocated > d->stats.peak) d->stats.peak = d->stats.allocated;
  pthread_mutex_unlock(&d->lock);
  return p;
}

static void cuda_free(int index, void *p, size_t nbytes) {
  size_t sz;
  int c = size_class(nbytes, &sz);
  cuda_dev *d = &devs[index];
  block *b = malloc(sizeof *b);
  pthread_mutex_lock(&d->lock);
  d->stats.allocated -= sz;
  if (b) {
    b->p = p;
    b->next = d->free_list[c];
    d->free_list[c] = b;
  } else { /* no host memory for the list node: hand the block back once the stream is done */
    if (current_device != index && cudaSetDevice(index) == cudaSuccess) current_device = index;
    cudaStreamSynchronize(d->compute);
    cudaFree(p);
    d->stats.reserved -= sz;
  }
  pthread_mutex_unlock(&d->lock);
}

/* Copies run on the compute stream, after the kernels that produced the source; a copy that
 * touches host memory waits, since the host buffer may be read or freed right after. A copy
 * between two GPUs runs on the destination's stream: it waits for the source GPU first (whose
 * stream may still be writing src) and finishes before returning (src may be reused after). */
static int cuda_copy(void *dst, flow_device dd, const void *src, flow_device sd, size_t n) {
  int index = dd.type == FLOW_CUDA ? dd.index : sd.index;
  bool peer = dd.type == FLOW_CUDA && sd.type == FLOW_CUDA && dd.index != sd.index;
  if (n == 0) return 0;
  if (peer && flow_cuda_synchronize(sd.index) != 0) return -1;
  if (dev_ready(index) != 0) return -1;
  cudaStream_t s = devs[index].compute;
  if (flow_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s), "cudaMemcpyAsync") != 0) return -1;
  if (dd.type == FLOW_CPU || sd.type == FLOW_CPU || peer)
    return synced(index, cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return 0;
}

/* Device-to-device, so nothing waits: later kernels on the compute stream run after it. */
static int cuda_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                       flow_device dev) {
  if (width == 0 || height == 0) return 0;
  if (dev_ready(dev.index) != 0) return -1;
  return flow_cuda_check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice,
                                           devs[dev.index].compute), "cudaMemcpy2DAsync");
}

static int cuda_zero(void *p, flow_device dev, size_t nbytes) {
  if (nbytes == 0) return 0;
  if (dev_ready(dev.index) != 0) return -1;
  return flow_cuda_check(cudaMemsetAsync(p, 0, nbytes, devs[dev.index].compute), "cudaMemsetAsync");
}

static int cuda_sync(int index) { return flow_cuda_synchronize(index); }

static const flow_device_impl cuda_impl = {cuda_alloc, cuda_free, cuda_copy, cuda_copy2d, cuda_zero, cuda_sync};

int flow_cuda_runtime_open(flow_cuda_backend *b) {
  int n = 0;
  cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess || n <= 0) {
    cudaGetLastError();
    if (st == cudaSuccess || st == cudaErrorNoDevice || st == cudaErrorInsufficientDriver)
      snprintf(b->reason, sizeof b->reason, "no GPU found");
    else
      snprintf(b->reason, sizeof b->reason, "no GPU found: cudaGetDeviceCount: %s", cudaGetErrorString(st));
    return 0;
  }
  device_count = n < FLOW_CUDA_MAX_DEVICES ? n : FLOW_CUDA_MAX_DEVICES;
  for (int i = 0; i < device_count; i++) pthread_mutex_init(&devs[i].lock, NULL);
  b->device_count = device_count;
  b->device = &cuda_impl;
  b->synchronize = flow_cuda_synchronize;
  b->memory_stats = memory_stats;
  b->empty_cache = empty_cache;
  return 0;
}
