/* Tensors: a refcounted storage plus a view (offset, shape, strides), a dtype and a device.
 * Autograd and global (SBP) metadata hang off the tensor but are owned by higher layers. */
#ifndef FLOW_TENSOR_H
#define FLOW_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "dtype.h"

#define FLOW_MAX_DIMS 8

typedef struct flow_storage {
  int refcount;
  int cached;         /* of those, the bf16 cache's (kernels/cpu/onednn.c): no alias, as a copy matches one version */
  flow_device device;
  size_t nbytes;
  void *data;
  uint64_t version;   /* bumped by every in-place write; autograd checks it */
} flow_storage;

/* References to s that can see its data: all but the bf16 cache's. */
static inline int flow_storage_users(const flow_storage *s) {
  return __atomic_load_n(&s->refcount, __ATOMIC_ACQUIRE) - __atomic_load_n(&s->cached, __ATOMIC_ACQUIRE);
}

struct flow_node;

typedef struct flow_tensor {
  int refcount;
  flow_dtype dtype;
  flow_device device;
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
  int64_t stride[FLOW_MAX_DIMS];   /* in elements */
  int64_t offset;                  /* in elements, into storage */
  flow_storage *storage;
  /* autograd (ops/autograd.c) */
  bool requires_grad;
  struct flow_tensor *grad;
  struct flow_node *grad_fn;       /* the node that produced this tensor, NULL for leaves */
  int out_index;                   /* which output of grad_fn */
  /* global tensors (sbp/global.c): NULL for local tensors. For a global tensor the view above
   * is this rank's shard; the logical shape, placement and SBP live here. */
  void *global;
  void (*global_retain)(void *global);
  void (*global_free)(void *global);
  /* lazy tensors (actor/trace.c): a value of a graph being traced, no storage yet. 0 for real
   * tensors; otherwise the tracer's handle (graph id and value id). Views carry it along. */
  uint64_t lazy;
} flow_tensor;

/* A global tensor's metadata (sbp/global.h) starts with its logical shape laid out like this, so
 * layers below sbp/ (autograd metadata, shape helpers of gradient rules) can read it. */
typedef struct flow_logical_shape {
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
} flow_logical_shape;

/* The logical shape: a local tensor's own, a global tensor's whole (not its shard's). */
static inline int flow_tensor_lndim(const flow_tensor *t) {
  return t->global ? ((const flow_logical_shape *)t->global)->ndim : t->ndim;
}
static inline const int64_t *flow_tensor_lshape(const flow_tensor *t) {
  return t->global ? ((const flow_logical_shape *)t->global)->shape : t->shape;
}

/* Attributes of an op call: one bag of fields; each op documents which it reads. */
typedef struct flow_attrs {
  int64_t axes[FLOW_MAX_DIMS]; int naxes;    /* reduce axes, permutation, split sizes */
  int64_t shape[FLOW_MAX_DIMS]; int nshape;  /* target shape: view, expand, creation */
  int64_t axis;                              /* softmax/cat/narrow/select/gather axis */
  int64_t start, length, k;                  /* narrow/select start, length; tril/triu diagonal */
  int keepdim;
  int flags;                                 /* op-specific booleans (FLOW_ATTR_*) */
  double scalar, scalar2, eps;               /* fill value, exponent, clamp bounds, dropout p */
  double lr, beta1, beta2, weight_decay;     /* adamw_ (its eps is eps, its 1-based step is k) */
  flow_dtype dtype;                          /* cast / creation dtype */
  flow_device device;                        /* creation device (source ops) */
  uint64_t seed, rng_offset;                 /* random ops: element i depends on (seed, offset, i) */
  int64_t ignore_index;
  /* random ops on a shard: this tensor is the box [box_start, box_start+shape) of a logical
   * tensor of shape logical_shape (nlogical == 0: the tensor is the whole logical tensor). */
  int64_t box_start[FLOW_MAX_DIMS];
  int64_t logical_shape[FLOW_MAX_DIMS]; int nlogical;
} flow_attrs;

enum {
  FLOW_ATTR_CAUSAL = 1 << 0,
  FLOW_ATTR_TRANS_A = 1 << 1,
  FLOW_ATTR_TRANS_B = 1 << 2,
  FLOW_ATTR_HAS_MIN = 1 << 3,
  FLOW_ATTR_HAS_MAX = 1 << 4,
  FLOW_ATTR_UNBIASED = 1 << 6,
  FLOW_ATTR_REVERSE = 1 << 7,   /* cumsum from the end of the axis */
  FLOW_ATTR_DESCENDING = 1 << 8, /* sort largest first; topk's largest */
};

void flow_attrs_init(flow_attrs *a);
/* Shared read-only default attrs, for ops that take none (saves a memset per call). */
const flow_attrs *flow_attrs_default(void);

/* The signature every kernel has (flow_kernel_fn in kernels/registry.h). */
#define FLOW_KERNEL(name) \
  int name(flow_tensor *const *in, int nin, flow_tensor **out, int nout, const flow_attrs *a)

/* A thread that made tensors (an actor runtime's stream) gives its cached headers and host blocks
 * back before it ends: they are per thread. */
void flow_thread_release(void);

/* Storage */
flow_storage *flow_storage_new(flow_device dev, size_t nbytes);
/* Bytes held by live storages of a device type, and their high-water mark since the last reset
 * (what G:memory() and the benchmarks report as measured). */
void flow_mem_stats(flow_devtype d, int64_t *in_use, int64_t *peak);
/* The same summed over every device type. */
void flow_mem_stats_total(int64_t *in_use, int64_t *peak);
void flow_mem_reset_peak(flow_devtype d);
void flow_storage_decref(flow_storage *s);

/* Creation: a contiguous tensor with uninitialised memory. NULL + error on failure. */
flow_tensor *flow_tensor_new(flow_dtype dtype, flow_device dev, int ndim, const int64_t *shape);
/* A new tensor header viewing t's storage with the given geometry (no autograd, no global). */
flow_tensor *flow_tensor_view_of(const flow_tensor *t, int ndim, const int64_t *shape,
                                 const int64_t *stride, int64_t offset);
/* A lazy tensor: metadata and the tracer's handle, no storage (actor/trace.c makes these). */
flow_tensor *flow_tensor_new_lazy(flow_dtype dtype, flow_device dev, int ndim, const int64_t *shape, uint64_t handle);
/* Same view as t, sharing storage and global metadata, without autograd state: what autograd
 * saves and what detach returns. */
flow_tensor *flow_tensor_alias(const flow_tensor *t);

/* Refcounts are atomic: the actor runtime's threads share register tensors and their storage. */
static inline void flow_tensor_incref(flow_tensor *t) { __atomic_fetch_add(&t->refcount, 1, __ATOMIC_RELAXED); }
void flow_tensor_decref(flow_tensor *t);

/* Higher layers that hang state off tensors (autograd's grad_fn and grad) install a hook that
 * releases it when the last reference goes: core never calls up into them. */
typedef void (*flow_tensor_release_fn)(flow_tensor *t);
void flow_tensor_set_release_hook(flow_tensor_release_fn fn);
static inline bool flow_tensor_is_lazy(const flow_tensor *t) { return t->lazy != 0; }
/* The storage's write count (0 for a lazy tensor, which has none yet). */
static inline uint64_t flow_tensor_version(const flow_tensor *t) { return t->storage ? t->storage->version : 0; }

int64_t flow_shape_numel(int ndim, const int64_t *shape);
/* 0, or -1 with a message: ndim out of range, a negative size, or more bytes than int64 holds. */
int flow_shape_check(int ndim, const int64_t *shape, flow_dtype dtype);
static inline int64_t flow_tensor_numel(const flow_tensor *t) { return flow_shape_numel(t->ndim, t->shape); }
bool flow_tensor_is_contiguous(const flow_tensor *t);
void flow_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
static inline void *flow_tensor_data(const flow_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)flow_dtype_size(t->dtype);
}
static inline size_t flow_tensor_nbytes(const flow_tensor *t) {
  return (size_t)flow_tensor_numel(t) * flow_dtype_size(t->dtype);
}
bool flow_shape_eq(int na, const int64_t *a, int nb, const int64_t *b);

/* Normalise a possibly negative axis against ndim; -1 + error naming `op` if out of range. */
int flow_axis_norm(const char *op, int64_t axis, int ndim, int64_t *out);
/* Broadcast two shapes (numpy rules). -1 + error naming `op` on mismatch. */
int flow_broadcast_shape(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                         int *nout, int64_t *out);
/* "{4,8}" into buf; returns buf. */
char *flow_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

#endif
