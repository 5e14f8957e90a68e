/* The CUDA kernels' C interface: registering them in the kernel table, and the cuBLAS reference used
 * by the matmul benchmark. Only compiled into CUDA builds (FLOW_HAVE_CUDA). */
#ifndef FLOW_CUDA_KERNELS_H
#define FLOW_CUDA_KERNELS_H

#include "../../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Register every CUDA kernel in the kernel table (kernels/registry.h) under its op's name. Safe to
 * call more than once. */
void flow_cuda_register_kernels(void);

/* Seconds per call of c = a @ b run straight on cuBLAS (2-d, contiguous, same dtype, on cuda). */
int flow_cuda_bench_gemm(flow_tensor *c, const flow_tensor *a, const flow_tensor *b, int iters, double *secs);

#ifdef __cplusplus
}
#endif

#endif
