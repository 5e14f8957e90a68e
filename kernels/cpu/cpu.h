/* CPU kernels, declared for the op definitions in ops/. Kernels know tensors and attrs only:
 * no SBP, no autograd, no Lua. Op files wrap them in FLOW_KERNEL functions. */
#ifndef FLOW_CPU_H
#define FLOW_CPU_H

#include <stdbool.h>

#include "../../core/error.h"
#include "../../core/tensor.h"

/* Elementwise binary ops with broadcasting (out = a OP b). */
typedef enum flow_binary_code {
  FLOW_BIN_ADD, FLOW_BIN_SUB, FLOW_BIN_MUL, FLOW_BIN_DIV, FLOW_BIN_POW, FLOW_BIN_MAX, FLOW_BIN_MIN,
  FLOW_BIN_EQ, FLOW_BIN_NE, FLOW_BIN_LT, FLOW_BIN_LE, FLOW_BIN_GT, FLOW_BIN_GE,
  FLOW_NBINARY
} flow_binary_code;
int flow_cpu_binary(flow_binary_code code, flow_tensor *out, const flow_tensor *x, const flow_tensor *y);

/* out = x (any strides, any dtype pair: this is also cast). */
int flow_cpu_copy(flow_tensor *out, const flow_tensor *x);
/* every element of out = v */
int flow_cpu_fill(flow_tensor *out, double v);

/* Reductions: mask[d] marks reduced axes; out has the kept axes (keepdim or not: same data). */
int flow_cpu_sum(flow_tensor *out, const flow_tensor *in, const bool *mask);
/* out seen with in's shape, stride 0 on reduced axes (shared by every reduction kernel). */
void flow_cpu_reduce_view(const flow_tensor *out, const flow_tensor *in, const bool *mask,
                          flow_tensor *view);

/* out = op(a) @ op(b) over broadcast batch axes; op transposes the last two axes when asked.
 * out is contiguous with the broadcast batch shape. float32/float64 (OpenBLAS). */
int flow_cpu_matmul(flow_tensor *out, const flow_tensor *a, const flow_tensor *b, bool trans_a, bool trans_b);

#endif
