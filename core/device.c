/* Device parsing and the host (CPU) memory backend. */
#include "device.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

const flow_device FLOW_DEVICE_CPU = {FLOW_CPU, 0};

/* Host blocks are cached after free, because eager code creates and drops tensors all the time:
 * - small blocks (64 B .. 64 KiB), per thread, in power-of-two classes: malloc's bookkeeping for
 *   them dominated the cost of a small op;
 * - large blocks, shared under a lock, in classes of a quarter power of two, up to a total of
 *   LARGE_CACHE_BYTES: a fresh large block costs a page fault per 4 KiB on first touch, which made
 *   a 16 MB elementwise op 60x slower than the same op into reused memory. */
#define SMALL_CLASSES 11             /* 64 << 10 == 64 KiB */
#define SMALL_CACHE_BYTES (8u << 20) /* per class */
#define LARGE_CLASSES 160
#define LARGE_CACHE_BYTES ((size_t)1 << 30)

typedef struct block { struct block *next; } block;
static _Thread_local block *small_free[SMALL_CLASSES];
static _Thread_local size_t small_cached[SMALL_CLASSES];
static block *large_free[LARGE_CLASSES];
static size_t large_cached;
static pthread_mutex_t large_lock = PTHREAD_MUTEX_INITIALIZER;

static int small_class(size_t nbytes) {
  if (nbytes <= 64) return 0;
  return 64 - __builtin_clzll((unsigned long long)(nbytes - 1)) - 6; /* ceil(log2(n)) - 6 */
}

/* Class of a large block and the size it is rounded up to: 2^e * (4 + q) / 4, q in 0..3. */
static int large_class(size_t nbytes, size_t *rounded) {
  if (nbytes > (size_t)1 << (16 + LARGE_CLASSES / 4)) return -1; /* beyond the last class */
  int e = 16;
  while (((size_t)1 << (e + 1)) < nbytes) e++;
  size_t step = (size_t)1 << (e - 2);
  size_t q = (nbytes - ((size_t)1 << e) + step - 1) / step; /* 1..4 */
  *rounded = ((size_t)1 << e) + q * step;
  int c = (e - 16) * 4 + (int)q - 1;
  return c < LARGE_CLASSES ? c : -1;
}

static void *host_alloc(size_t nbytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, nbytes ? nbytes : 64) != 0) {
    flow_error_set("out of host memory allocating %zu bytes", nbytes);
    return NULL;
  }
  return p;
}

/* A request beyond physical memory would only succeed through overcommit and die later on first
 * touch, so it is refused up front. */
size_t flow_device_cpu_max_alloc(void) {
  static size_t limit;
  size_t l = __atomic_load_n(&limit, __ATOMIC_RELAXED);
  if (l) return l;
  const char *env = getenv("FLOW_MAX_ALLOC_BYTES");
  char *end;
  unsigned long long v = env ? strtoull(env, &end, 10) : 0;
  if (env && *env && !*end && v > 0) l = (size_t)v;
  else {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    l = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : SIZE_MAX;
  }
  __atomic_store_n(&limit, l, __ATOMIC_RELAXED);
  return l;
}

/* 64-byte alignment keeps AVX-512 loads and cache lines happy. */
static void *cpu_alloc(int index, size_t nbytes) {
  (void)index;
  if (nbytes > flow_device_cpu_max_alloc()) {
    flow_error_set("allocating %zu bytes (%.1f GiB) exceeds the host limit of %zu bytes (%s)", nbytes,
                   (double)nbytes / (1 << 30), flow_device_cpu_max_alloc(),
                   getenv("FLOW_MAX_ALLOC_BYTES") ? "FLOW_MAX_ALLOC_BYTES" : "physical memory; FLOW_MAX_ALLOC_BYTES sets another");
    return NULL;
  }
  int c = small_class(nbytes);
  if (c < SMALL_CLASSES) {
    block *b = small_free[c];
    if (b) {
      small_free[c] = b->next;
      small_cached[c] -= (size_t)64 << c;
      return b;
    }
    return host_alloc((size_t)64 << c);
  }
  size_t rounded;
  int lc = large_class(nbytes, &rounded);
  if (lc < 0) return host_alloc(nbytes);
  pthread_mutex_lock(&large_lock);
  block *b = large_free[lc];
  if (b) {
    large_free[lc] = b->next;
    large_cached -= rounded;
  }
  pthread_mutex_unlock(&large_lock);
  return b ? (void *)b : host_alloc(rounded);
}

static void cpu_free(int index, void *p, size_t nbytes) {
  (void)index;
  int c = small_class(nbytes);
  if (c < SMALL_CLASSES) {
    if (small_cached[c] < SMALL_CACHE_BYTES) {
      block *b = p;
      b->next = small_free[c];
      small_free[c] = b;
      small_cached[c] += (size_t)64 << c;
      return;
    }
  } else {
    size_t rounded;
    int lc = large_class(nbytes, &rounded);
    if (lc >= 0) {
      pthread_mutex_lock(&large_lock);
      bool keep = large_cached + rounded <= LARGE_CACHE_BYTES;
      if (keep) {
        block *b = p;
        b->next = large_free[lc];
        large_free[lc] = b;
        large_cached += rounded;
      }
      pthread_mutex_unlock(&large_lock);
      if (keep) return;
    }
  }
  free(p);
}

/* Give cached host blocks back to the C allocator (this thread's small ones, all large ones). */
void flow_device_cpu_empty_cache(void) {
  for (int c = 0; c < SMALL_CLASSES; c++) {
    while (small_free[c]) { block *b = small_free[c]; small_free[c] = b->next; free(b); }
    small_cached[c] = 0;
  }
  pthread_mutex_lock(&large_lock);
  for (int c = 0; c < LARGE_CLASSES; c++)
    while (large_free[c]) { block *b = large_free[c]; large_free[c] = b->next; free(b); }
  large_cached = 0;
  pthread_mutex_unlock(&large_lock);
}

static int cpu_copy(void *dst, flow_device dd, const void *src, flow_device sd, size_t n) {
  (void)dd; (void)sd;
  memcpy(dst, src, n);
  return 0;
}

static int cpu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                      flow_device dev) {
  (void)dev;
  if (dpitch == width && spitch == width) {
    memcpy(dst, src, width * height);
    return 0;
  }
  for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return 0;
}

static int cpu_zero(void *p, flow_device dev, size_t nbytes) {
  (void)dev;
  memset(p, 0, nbytes);
  return 0;
}

static int cpu_sync(int index) { (void)index; return 0; }

static const flow_device_impl cpu_impl = {cpu_alloc, cpu_free, cpu_copy, cpu_copy2d, cpu_zero, cpu_sync};
static const flow_device_impl *_Atomic impls[FLOW_NDEVTYPES] = {[FLOW_CPU] = &cpu_impl};
static void (*loaders[FLOW_NDEVTYPES])(void);

void flow_device_register(flow_devtype type, const flow_device_impl *impl) { impls[type] = impl; }
void flow_device_set_loader(flow_devtype type, void (*load)(void)) { loaders[type] = load; }

const flow_device_impl *flow_device_get(flow_devtype type) {
  const flow_device_impl *impl = atomic_load_explicit(&impls[type], memory_order_acquire);
  if (!impl && loaders[type]) {
    loaders[type]();
    impl = impls[type];
  }
  return impl;
}

int flow_device_parse(const char *s, flow_device *out) {
  if (strcmp(s, "cpu") == 0) { *out = FLOW_DEVICE_CPU; return 0; }
  if (strncmp(s, "cuda", 4) == 0) {
    int idx = 0;
    if (s[4] == ':') {
      char *end;
      long v = strtol(s + 5, &end, 10);
      if (*end || v < 0 || end == s + 5) goto bad;
      idx = (int)v;
    } else if (s[4]) goto bad;
    out->type = FLOW_CUDA;
    out->index = idx;
    return 0;
  }
bad:
  return flow_error_set("unknown device '%s' (expected \"cpu\", \"cuda\" or \"cuda:N\")", s);
}

void flow_device_name(flow_device d, char *buf, size_t n) {
  if (d.type == FLOW_CPU) snprintf(buf, n, "cpu");
  else snprintf(buf, n, "cuda:%d", d.index);
}

bool flow_device_eq(flow_device a, flow_device b) { return a.type == b.type && a.index == b.index; }
