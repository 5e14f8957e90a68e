/* Storage and tensor headers (see tensor.h). */
#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "error.h"

/* Tensor and storage headers are recycled through per-thread free lists (see cpu_alloc). */
#define HEADER_CACHE 4096

typedef struct header_cache { void *head; int count; } header_cache;
static _Thread_local header_cache tensor_cache, storage_cache;

static void *cache_get(header_cache *c, size_t size) {
  void *p = c->head;
  if (!p) return malloc(size);
  c->head = *(void **)p;
  c->count--;
  return p;
}

static void cache_put(header_cache *c, void *p) {
  if (c->count >= HEADER_CACHE) { free(p); return; }
  *(void **)p = c->head;
  c->head = p;
  c->count++;
}

static void cache_drain(header_cache *c) {
  while (c->head) {
    void *p = c->head;
    c->head = *(void **)p;
    free(p);
  }
  c->count = 0;
}

void flow_thread_release(void) {
  cache_drain(&tensor_cache);
  cache_drain(&storage_cache);
  flow_device_cpu_empty_cache();
}

void flow_attrs_init(flow_attrs *a) {
  memset(a, 0, sizeof *a);
  a->ignore_index = -100;
}

static const flow_attrs default_attrs = {.ignore_index = -100};

const flow_attrs *flow_attrs_default(void) { return &default_attrs; }

/* Bytes held by live storages per device type, and the high-water mark since the last reset. */
static int64_t mem_in_use[FLOW_NDEVTYPES], mem_peak[FLOW_NDEVTYPES];

static void mem_count(flow_devtype d, int64_t delta) {
  int64_t now = __atomic_add_fetch(&mem_in_use[d], delta, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&mem_peak[d], __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&mem_peak[d], &peak, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

void flow_mem_stats(flow_devtype d, int64_t *in_use, int64_t *peak) {
  *in_use = __atomic_load_n(&mem_in_use[d], __ATOMIC_RELAXED);
  *peak = __atomic_load_n(&mem_peak[d], __ATOMIC_RELAXED);
}

void flow_mem_stats_total(int64_t *in_use, int64_t *peak) {
  *in_use = *peak = 0;
  for (int d = 0; d < FLOW_NDEVTYPES; d++) {
    int64_t u, p;
    flow_mem_stats((flow_devtype)d, &u, &p);
    *in_use += u;
    *peak += p;
  }
}

void flow_mem_reset_peak(flow_devtype d) {
  __atomic_store_n(&mem_peak[d], __atomic_load_n(&mem_in_use[d], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

flow_storage *flow_storage_new(flow_device dev, size_t nbytes) {
  const flow_device_impl *impl = flow_device_get(dev.type);
  if (!impl) {
    char name[32];
    flow_device_name(dev, name, sizeof name);
    flow_error_set("device %s is not available in this build", name);
    return NULL;
  }
  flow_storage *s = cache_get(&storage_cache, sizeof *s);
  if (!s) { flow_error_set("out of host memory"); return NULL; }
  s->data = impl->alloc(dev.index, nbytes);
  if (!s->data) { cache_put(&storage_cache, s); return NULL; }
  s->refcount = 1;
  s->cached = 0;
  s->device = dev;
  s->nbytes = nbytes;
  mem_count(dev.type, (int64_t)nbytes);
  s->version = 0;
  return s;
}

void flow_storage_decref(flow_storage *s) {
  if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  flow_device_get(s->device.type)->free(s->device.index, s->data, s->nbytes);
  mem_count(s->device.type, -(int64_t)s->nbytes);
  cache_put(&storage_cache, s);
}

/* Saturates at INT64_MAX instead of wrapping: no tensor has that many elements (flow_shape_check
 * refuses the shape), so a caller that sizes something from unchecked metadata fails cleanly. */
int64_t flow_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return 0;
  for (int i = 0; i < ndim; i++)
    if (__builtin_mul_overflow(n, shape[i], &n)) return INT64_MAX;
  return n;
}

int flow_shape_check(int ndim, const int64_t *shape, flow_dtype dtype) {
  char buf[160];
  if (ndim < 0 || ndim > FLOW_MAX_DIMS)
    return flow_error_set("tensors have at most %d dimensions (got %d)", FLOW_MAX_DIMS, ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) return flow_error_set("negative size in shape %s", flow_shape_str(ndim, shape, buf, sizeof buf));
  int64_t n = flow_shape_numel(ndim, shape), bytes;
  if (n == INT64_MAX || __builtin_mul_overflow(n, (int64_t)flow_dtype_size(dtype), &bytes))
    return flow_error_set("shape %s of %s is too large (its byte count does not fit in 63 bits)",
                          flow_shape_str(ndim, shape, buf, sizeof buf), flow_dtype_name(dtype));
  return 0;
}

/* Every stride fits: a shape that passed flow_shape_check has fewer than 2^63 elements (axes of
 * size 0 or 1 contribute 1, so the product stays within that bound too). */
void flow_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    stride[i] = s;
    if (__builtin_mul_overflow(s, shape[i] > 1 ? shape[i] : 1, &s)) s = INT64_MAX;
  }
}

bool flow_tensor_is_contiguous(const flow_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

static flow_tensor *header(flow_dtype dtype, flow_device dev, int ndim, const int64_t *shape) {
  if (flow_shape_check(ndim, shape, dtype) != 0) return NULL;
  flow_tensor *t = cache_get(&tensor_cache, sizeof *t);
  if (!t) { flow_error_set("out of host memory"); return NULL; }
  memset(t, 0, sizeof *t);
  t->refcount = 1;
  t->dtype = dtype;
  t->device = dev;
  t->ndim = ndim;
  if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  return t;
}

flow_tensor *flow_tensor_new(flow_dtype dtype, flow_device dev, int ndim, const int64_t *shape) {
  flow_tensor *t = header(dtype, dev, ndim, shape);
  if (!t) return NULL;
  flow_contiguous_strides(ndim, shape, t->stride);
  t->storage = flow_storage_new(dev, (size_t)flow_shape_numel(ndim, shape) * flow_dtype_size(dtype));
  if (!t->storage) { free(t); return NULL; }
  return t;
}

flow_tensor *flow_tensor_view_of(const flow_tensor *src, int ndim, const int64_t *shape,
                                 const int64_t *stride, int64_t offset) {
  flow_tensor *t = header(src->dtype, src->device, ndim, shape);
  if (!t) return NULL;
  if (ndim) memcpy(t->stride, stride, (size_t)ndim * sizeof *stride);
  t->offset = offset;
  t->storage = src->storage;
  t->lazy = src->lazy;
  if (t->storage) __atomic_fetch_add(&t->storage->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

flow_tensor *flow_tensor_new_lazy(flow_dtype dtype, flow_device dev, int ndim, const int64_t *shape, uint64_t handle) {
  flow_tensor *t = header(dtype, dev, ndim, shape);
  if (!t) return NULL;
  flow_contiguous_strides(ndim, shape, t->stride);
  t->lazy = handle;
  return t;
}

flow_tensor *flow_tensor_alias(const flow_tensor *t) {
  flow_tensor *a = flow_tensor_view_of(t, t->ndim, t->shape, t->stride, t->offset);
  if (a && t->global) {
    a->global = t->global;
    a->global_retain = t->global_retain;
    a->global_free = t->global_free;
    if (a->global_retain) a->global_retain(a->global);
  }
  return a;
}

static flow_tensor_release_fn release_hook;
void flow_tensor_set_release_hook(flow_tensor_release_fn fn) { release_hook = fn; }

void flow_tensor_decref(flow_tensor *t) {
  if (!t || __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (release_hook) release_hook(t);
  if (t->global && t->global_free) t->global_free(t->global);
  flow_storage_decref(t->storage);
  cache_put(&tensor_cache, t);
}

bool flow_shape_eq(int na, const int64_t *a, int nb, const int64_t *b) {
  return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

int flow_axis_norm(const char *op, int64_t axis, int ndim, int64_t *out) {
  int64_t n = ndim ? ndim : 1;
  if (axis < -n || axis >= n)
    return flow_error_set("%s: axis %lld out of range for a tensor of %d dimensions (expected %lld..%lld)",
                          op, (long long)axis, ndim, (long long)-n, (long long)n - 1);
  *out = axis < 0 ? axis + n : axis;
  return 0;
}

int flow_broadcast_shape(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                         int *nout, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t x = i < n - na ? 1 : a[i - (n - na)];
    int64_t y = i < n - nb ? 1 : b[i - (n - nb)];
    if (x != y && x != 1 && y != 1) {
      char sa[128], sb[128];
      return flow_error_set("%s: shapes %s and %s cannot be broadcast (axis %d: %lld vs %lld)", op,
                            flow_shape_str(na, a, sa, sizeof sa), flow_shape_str(nb, b, sb, sizeof sb),
                            i, (long long)x, (long long)y);
    }
    out[i] = x == 1 ? y : x;
  }
  *nout = n;
  return 0;
}

char *flow_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "{");
  for (int i = 0; i < ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)shape[i]);
  if (k < n) snprintf(buf + k, n - k, "}");
  return buf;
}
