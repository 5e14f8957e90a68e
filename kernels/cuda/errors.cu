/* The host side of the out-of-range index records (common.h): one record per device in pinned host
 * memory mapped into the device, made on first use, raised and cleared at each synchronisation. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

extern "C" {
#include "../cpu/cpu.h"
}


static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static BadIndex *host_rec[FLOW_CUDA_MAX_DEVICES], *dev_rec[FLOW_CUDA_MAX_DEVICES];

BadIndex *bad_index_record(const flow_tensor *t) {
  int d = t->device.index;
  if (d < 0 || d >= FLOW_CUDA_MAX_DEVICES) {
    flow_error_set("cuda:%d: no index error record beyond %d devices", d, FLOW_CUDA_MAX_DEVICES);
    return NULL;
  }
  if (!stream_of(t)) return NULL; /* makes d the current device, which cudaHostGetDevicePointer reads */
  pthread_mutex_lock(&lock);
  if (!dev_rec[d]) {
    void *h = NULL, *p = NULL;
    int rc = flow_cuda_check(cudaHostAlloc(&h, sizeof(BadIndex), cudaHostAllocMapped), "cudaHostAlloc");
    if (rc == 0) rc = flow_cuda_check(cudaHostGetDevicePointer(&p, h, 0), "cudaHostGetDevicePointer");
    if (rc == 0) {
      memset(h, 0, sizeof(BadIndex));
      host_rec[d] = (BadIndex *)h;
      dev_rec[d] = (BadIndex *)p;
    } else if (h) {
      cudaFreeHost(h);
    }
  }
  BadIndex *r = dev_rec[d];
  pthread_mutex_unlock(&lock);
  return r;
}

/* The CPU kernels' wording (kernels/cpu/index.c, kernels/cpu/loss.c), so a message reads the same
 * on either device. */
static void describe(const BadIndex &e, char *buf, size_t n) {
  long long i = (long long)e.index, size = (long long)e.size, extra = (long long)e.extra;
  switch (e.op) {
  case BAD_EMBEDDING:
    snprintf(buf, n, "embedding: index %lld out of range [0, %lld) (the rows of weight)", i, size);
    break;
  case BAD_ZERO_DIV:
    snprintf(buf, n, "%s: ZeroDivisionError (integer division by zero)", flow_binary_name((flow_binary_code)extra));
    break;
  case BAD_CROSS_ENTROPY:
    snprintf(buf, n, "cross_entropy: target %lld is out of range for %lld classes (expected 0 <= target < %lld, or "
             "ignore_index %lld)", i, size, size, extra);
    break;
  default: {
    const char *op = e.op == BAD_GATHER ? "gather" : e.op == BAD_SCATTER_ADD ? "scatter_add" : "index_select";
    snprintf(buf, n, "%s: index %lld out of range [0, %lld) on axis %lld", op, i, size, extra);
  }
  }
}

/* Called after the device's work up to now is done, so no kernel that ran before is still writing.
 * A kernel of another thread running meanwhile may claim the record as it is cleared: its event is
 * then reported at a later synchronisation, or lost, never misreported. */
int flow_cuda_raise_bad_index(int device) {
  if (device < 0 || device >= FLOW_CUDA_MAX_DEVICES) return 0;
  volatile BadIndex *r = host_rec[device];
  if (!r || !r->claimed) return 0;
  BadIndex e;
  e.op = r->op;
  e.index = r->index;
  e.size = r->size;
  e.extra = r->extra;
  r->claimed = 0;
  char what[256];
  describe(e, what, sizeof what);
  return flow_error_set("%s (found by a CUDA kernel on cuda:%d; reported at the next synchronisation)", what,
                        device);
}
