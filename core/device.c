/* Device parsing and the host (CPU) memory backend. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

const flow_device FLOW_DEVICE_CPU = {FLOW_CPU, 0};

/* Small host blocks are cached per thread in power-of-two size classes (64 B .. 64 KiB): eager
 * code creates and drops many small tensors, and malloc's bookkeeping for them dominated the cost
 * of a small op. Larger blocks go straight to the C allocator. */
#define SMALL_CLASSES 11            /* 64 << 10 == 64 KiB */
#define SMALL_CACHE_BYTES (8u << 20) /* per class */

typedef struct block { struct block *next; } block;
static _Thread_local block *small_free[SMALL_CLASSES];
static _Thread_local size_t small_cached[SMALL_CLASSES];

static int size_class(size_t nbytes) {
  int c = 0;
  while (((size_t)64 << c) < nbytes) c++;
  return c;
}

/* 64-byte alignment keeps AVX-512 loads and cache lines happy. */
static void *cpu_alloc(int index, size_t nbytes) {
  (void)index;
  int c = size_class(nbytes);
  if (c < SMALL_CLASSES) {
    block *b = small_free[c];
    if (b) {
      small_free[c] = b->next;
      small_cached[c] -= (size_t)64 << c;
      return b;
    }
    nbytes = (size_t)64 << c;
  }
  void *p = NULL;
  if (posix_memalign(&p, 64, nbytes ? nbytes : 64) != 0) {
    flow_error_set("out of host memory allocating %zu bytes", nbytes);
    return NULL;
  }
  return p;
}

static void cpu_free(int index, void *p, size_t nbytes) {
  (void)index;
  int c = size_class(nbytes);
  if (c < SMALL_CLASSES && small_cached[c] < SMALL_CACHE_BYTES) {
    block *b = p;
    b->next = small_free[c];
    small_free[c] = b;
    small_cached[c] += (size_t)64 << c;
    return;
  }
  free(p);
}

static int cpu_copy(void *dst, flow_device dd, const void *src, flow_device sd, size_t n) {
  (void)dd; (void)sd;
  memcpy(dst, src, n);
  return 0;
}

static int cpu_sync(int index) { (void)index; return 0; }

static const flow_device_impl cpu_impl = {cpu_alloc, cpu_free, cpu_copy, cpu_sync};
static const flow_device_impl *impls[FLOW_NDEVTYPES] = {[FLOW_CPU] = &cpu_impl};

void flow_device_register(flow_devtype type, const flow_device_impl *impl) { impls[type] = impl; }
const flow_device_impl *flow_device_get(flow_devtype type) { return impls[type]; }

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
