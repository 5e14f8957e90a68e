/* The CUDA kernels' C interface: attaching them to the op registry, and the cuBLAS reference used
 * by the matmul benchmark. Only compiled into CUDA builds (FLOW_HAVE_CUDA). */
#ifndef FLOW_CUDA_KERNELS_H
#define FLOW_CUDA_KERNELS_H

#include "../../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Set op->kernel[FLOW_CUDA] for every registered op that has a CUDA kernel (ops missing from the
 * registry are skipped). Safe to call more than once. */
void flow_cuda_register_kernels(void);

/* Names given a CUDA kernel for which no op is registered (a renamed op leaves its kernel behind):
 * the count, and the names in *names. The specs require none. */
int flow_cuda_unmatched_kernels(const char *const **names);

/* Seconds per call of c = a @ b run straight on cuBLAS (2-d, contiguous, same dtype, on cuda). */
int flow_cuda_bench_gemm(flow_tensor *c, const flow_tensor *a, const flow_tensor *b, int iters, double *secs);

#ifdef __cplusplus
}
#endif

#endif
