/* flow_cuda_register_kernels: attaches every CUDA kernel file's kernels to the op registry. */
#include "common.h"
#include "kernels.h"

void flow_cuda_register_kernels(void) {
  flow_cuda_register_elementwise();
  flow_cuda_register_matmul();
}
