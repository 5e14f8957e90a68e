/* The op registry: every op is defined once, with shape/dtype inference on metadata, its gradient
 * rule and (for global tensors) its SBP rule and per-shard hook; its kernels live in the kernel
 * table (kernels/registry.h) under its name. Eager local, eager global and the graph tracer all
 * call ops through flow_op_call. */
#ifndef FLOW_OP_H
#define FLOW_OP_H

#include <stdbool.h>

#include "../core/error.h"
#include "../core/tensor.h"
#include "../kernels/registry.h"

typedef struct flow_op flow_op;

/* What inference says about one output. */
typedef struct flow_meta {
  flow_dtype dtype;
  flow_device device;
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
} flow_meta;

/* Fill out[0..nout) from the inputs' metadata (logical shapes for global tensors) and attrs; -1 +
 * flow_error_set naming the op on bad input. Inference never sees data, strides or storage. */
typedef int (*flow_infer_fn)(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                             flow_meta *out);

/* Everything a gradient rule sees. in[i]/out[j] are saved aliases (NULL unless the op asked to
 * save them in save_in/save_out); in_meta/out_meta always hold shapes. gout[j] may be NULL:
 * that output received no gradient (treat it as zeros). */
typedef struct flow_grad_ctx {
  const flow_op *op;
  const flow_attrs *attrs;
  int nin, nout;
  flow_tensor *const *in;
  flow_tensor *const *out;
  const flow_meta *in_meta;
  const flow_meta *out_meta;
  flow_tensor *const *gout;
  const bool *need;            /* need[i]: input i wants a gradient */
  /* acc[i]: the gradient input i has gathered so far from its other consumers, when nobody else
   * sees it (a dense local buffer), else NULL. A rule may add its gradient for input i into it in
   * place and leave gin[i] NULL (narrow does: the pieces of a split fill one buffer). */
  flow_tensor *const *acc;
} flow_grad_ctx;

/* Set gin[i] (a new reference) for each i with need[i]; leaving gin[i] NULL means zero. */
typedef int (*flow_grad_fn)(const flow_grad_ctx *c, flow_tensor **gin);

struct flow_sbp_rule;  /* sbp/signature.h */
struct flow_placement; /* sbp/placement.h */
struct flow_nd_sbp;    /* sbp/sbp.h */

/* What a per-shard hook sees when a global op runs on this rank's shards: the logical metas, the
 * n-D signature chosen (in_sbp[i], out_sbp[j]) and the placement (its coord is this rank's). */
typedef struct flow_shard_ctx {
  const struct flow_placement *placement;
  const flow_meta *in, *out;
  const struct flow_nd_sbp *in_sbp, *out_sbp;
} flow_shard_ctx;

/* Adjust the attrs the kernel gets on a shard, where they describe the logical tensor (a target
 * shape, a position in the logical index space). */
typedef void (*flow_shard_fn)(const flow_op *op, const flow_shard_ctx *c, flow_attrs *local);

enum flow_op_kind {
  FLOW_OP_COMPUTE,   /* fresh contiguous outputs */
  FLOW_OP_VIEW,      /* outputs alias input 0's storage; the kernel makes them */
  FLOW_OP_INPLACE,   /* writes into input 0, which is also output 0 */
  FLOW_OP_SOURCE,    /* no tensor inputs (creation, random) */
};

struct flow_op {
  const char *name;
  int nin;                    /* -1: variadic (cat, stack) */
  int nout;
  enum flow_op_kind kind;
  flow_infer_fn infer;
  flow_grad_fn grad;          /* NULL: not differentiable */
  unsigned save_in, save_out; /* bitmasks: which inputs/outputs the grad rule reads */
  unsigned nondiff_in;        /* bitmask: inputs that never receive gradients (ids, masks) */
  unsigned written_in;        /* bitmask: inputs besides an in-place destination the kernel writes */
  const struct flow_sbp_rule *sbp; /* NULL: global inputs are boxed to broadcast */
  flow_shard_fn shard;        /* NULL: shards take the logical attrs as they are */
  bool dense_shards;          /* global: kernels need dense shards (a viewable tensor's shard may not be) */
  bool random;                /* draws at (attrs.seed, attrs.rng_offset): a plan feeds fresh counters each run */
  bool cpu_half;              /* its CPU kernel takes float16 and bfloat16 as they are (it only moves elements,
                               * or widens them in registers for its float32 loop: iter.h), unstaged (dispatch.c) */
  struct flow_op *next;       /* registry list, set by flow_op_register */
  /* not part of the definition: the kernel table's entries for this op, looked up by dispatch.c.
   * A kernel finds its outputs allocated (contiguous, per inference), except a FLOW_OP_VIEW op's,
   * which makes them as views of the inputs. */
  flow_kernel_fn kernel_at[FLOW_NDEVTYPES];
};

#define FLOW_ALL (~0u)

/* Does op write input i in place (an in-place op's destination, or an input named in written_in)? */
static inline bool flow_op_writes(const flow_op *op, int i) {
  return (op->kind == FLOW_OP_INPLACE && i == 0) || (op->written_in >> i & 1);
}

void flow_op_register(flow_op *op);
const flow_op *flow_op_find(const char *name);
const flow_op *flow_op_first(void);   /* iterate with op->next */

/* Define and self-register an op named by its identifier: FLOW_OP(add) {.nin = 2, ...}; defines
 * flow_op_add, named "add" (its kernels register under the same identifier). */
#define FLOW_OP(id)                                                            \
  flow_op flow_op_##id;                                                        \
  __attribute__((constructor)) static void flow_register_##id(void) {          \
    flow_op_##id.name = #id;                                                   \
    flow_op_register(&flow_op_##id);                                           \
  }                                                                            \
  flow_op flow_op_##id =

/* Run an op: checks inputs, dispatches to the global layer when any input is global, infers,
 * allocates, runs the kernel and records autograd. out[] receives new references.
 * For variadic ops nin is the count. Returns 0 or -1 with the error set. */
int flow_op_call(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                 flow_tensor **out);
/* Has op a kernel for dev (its own, or one the device's backend gave every op)? */
bool flow_op_has_kernel(const flow_op *op, flow_devtype dev);
/* Single-output convenience: NULL on error. */
flow_tensor *flow_op_call1(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a);
/* The local path alone (no global dispatch, no autograd): what the global layer runs on shards. */
int flow_op_call_local(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                       flow_tensor **out);

/* The global layer registers itself here (dependency inversion: ops does not include sbp/). */
typedef int (*flow_global_dispatch_fn)(const flow_op *op, flow_tensor *const *in, int nin,
                                       const flow_attrs *a, flow_tensor **out);
void flow_op_set_global_dispatch(flow_global_dispatch_fn fn);

/* Same dtype/device checks used by many infer functions; name the op in the message. */
int flow_check_same_dtype(const flow_op *op, const flow_meta *in, int nin);
int flow_check_float(const flow_op *op, const flow_meta *t, const char *what);
void flow_meta_from(flow_meta *m, const flow_tensor *t);

#endif
