/* The kernel table: every kernel registers under (device type, op name); the op layer looks its
 * kernels up by the op's name. Kernels know no op definitions, only the name they compute. */
#ifndef FLOW_KERNELS_REGISTRY_H
#define FLOW_KERNELS_REGISTRY_H

#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What FLOW_KERNEL (core/tensor.h) defines: out[] are preallocated for compute ops, made by the
 * kernel for views. 0 or -1 + flow_error_set; or, from a CPU kernel given float16/bfloat16 operands
 * that it has no path for, FLOW_KERNEL_F32: "run me on float32 copies" (ops/dispatch.c). */
#define FLOW_KERNEL_F32 1
typedef int (*flow_kernel_fn)(flow_tensor *const *in, int nin, flow_tensor **out, int nout,
                              const flow_attrs *a);

/* Register (or replace) op's kernel on dev; -1 + error when the table is full. */
int flow_kernel_register(flow_devtype dev, const char *op, flow_kernel_fn fn);
/* The kernel for op on dev, or NULL. */
flow_kernel_fn flow_kernel_find(flow_devtype dev, const char *op);
/* Grows with every registration: lookups cached before it changed may be stale. */
unsigned flow_kernel_generation(void);
/* The op names registered on dev, in registration order: the count, and the names in *names
 * (valid until the next registration). */
int flow_kernel_names(flow_devtype dev, const char *const **names);

/* Each device's strided copy (out contiguous, same shape; dtypes may differ): the one way below the
 * op layer to make a tensor dense (boxing, host staging). The device's kernels install it. */
typedef int (*flow_copy_fn)(flow_tensor *out, const flow_tensor *x);
void flow_kernel_set_copy(flow_devtype dev, flow_copy_fn fn);
/* out = x converted to out's dtype, by the device's copy (same shape; on the CPU out may have any
 * strides). 0, or -1 + error. */
int flow_kernel_copy(flow_tensor *out, const flow_tensor *x);
/* t as a dense tensor on its device: t itself (new reference) when contiguous, else a copy with
 * its shard's shape and no global metadata. NULL + error. */
flow_tensor *flow_kernel_dense(flow_tensor *t);

/* Register fn for the op named by the identifier `op` (the name is written once, by the
 * preprocessor): the statement form, for registration functions, and the file-scope form. */
#define FLOW_KERNEL_ADD(dev, op, fn) flow_kernel_register(dev, #op, fn)
#define FLOW_KERNEL_REGISTER(dev, op, fn)                                                 \
  __attribute__((constructor)) static void flow_kernel_register_##op##_##dev(void) {      \
    (void)FLOW_KERNEL_ADD(dev, op, fn);                                                   \
  }

#ifdef __cplusplus
}
#endif

#endif
