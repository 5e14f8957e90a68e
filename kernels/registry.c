/* The kernel table (registry.h): a list per device type, searched by name (lookups are rare: the
 * op layer caches them per op; registrations happen at start-up and when the CUDA plugin loads,
 * which may be while other threads look up kernels: an entry is filled before it is counted),
 * and each device's dense copy. */
#include "registry.h"

#include <stdatomic.h>
#include <string.h>

#include "../core/error.h"

enum { MAX_KERNELS = 256 };

static struct table {
  atomic_int n;
  const char *names[MAX_KERNELS];
  flow_kernel_fn fns[MAX_KERNELS];
} tables[FLOW_NDEVTYPES];

static atomic_uint generation;

static int slot(const struct table *t, const char *op) {
  int n = atomic_load_explicit(&t->n, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (strcmp(t->names[i], op) == 0) return i;
  return -1;
}

int flow_kernel_register(flow_devtype dev, const char *op, flow_kernel_fn fn) {
  struct table *t = &tables[dev];
  int i = slot(t, op);
  if (i >= 0) {
    t->fns[i] = fn;
  } else {
    i = atomic_load_explicit(&t->n, memory_order_relaxed);
    if (i == MAX_KERNELS) return flow_error_set("%s: the kernel table is full (raise MAX_KERNELS)", op);
    t->names[i] = op;
    t->fns[i] = fn;
    atomic_store_explicit(&t->n, i + 1, memory_order_release);
  }
  atomic_fetch_add(&generation, 1);
  return 0;
}

flow_kernel_fn flow_kernel_find(flow_devtype dev, const char *op) {
  int i = slot(&tables[dev], op);
  return i < 0 ? NULL : tables[dev].fns[i];
}

unsigned flow_kernel_generation(void) { return atomic_load(&generation); }

int flow_kernel_names(flow_devtype dev, const char *const **names) {
  *names = tables[dev].names;
  return atomic_load_explicit(&tables[dev].n, memory_order_acquire);
}

/* ---- dense copies ------------------------------------------------------------------------------ */

static flow_copy_fn copies[FLOW_NDEVTYPES];

void flow_kernel_set_copy(flow_devtype dev, flow_copy_fn fn) { copies[dev] = fn; }

int flow_kernel_copy(flow_tensor *out, const flow_tensor *x) {
  flow_copy_fn copy = copies[x->device.type];
  if (!copy) {
    char name[32];
    flow_device_name(x->device, name, sizeof name);
    return flow_error_set("no dense copy for device %s", name);
  }
  return copy(out, x);
}

flow_tensor *flow_kernel_dense(flow_tensor *t) {
  if (flow_tensor_is_contiguous(t)) { flow_tensor_incref(t); return t; }
  flow_tensor *d = flow_tensor_new(t->dtype, t->device, t->ndim, t->shape);
  if (d && flow_kernel_copy(d, t) != 0) {
    flow_tensor_decref(d);
    d = NULL;
  }
  return d;
}
