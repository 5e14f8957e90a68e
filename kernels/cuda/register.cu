/* The CUDA plugin's entry point (flow_cuda_plugin_open, see core/cuda.h), and
 * flow_cuda_register_kernels: registers every CUDA kernel file's kernels in the kernel table, and
 * gives the ops that have no CUDA kernel of their own (arange, linspace, eye, randint) one that
 * runs their CPU kernel on host copies: slow, but the same numbers as on the CPU (randint
 * included: its draws are counter-based, so element i does not depend on the device). */
#include "common.h"
#include "kernels.h"

/* Copy inputs to the host, run the op's CPU kernel, copy the outputs back. */
int flow_cuda_via_host(const char *name, flow_tensor *const *in, int nin, flow_tensor **out, int nout,
                       const flow_attrs *a) {
  flow_kernel_fn cpu = flow_kernel_find(FLOW_CPU, name);
  const flow_device_impl *dev = flow_device_get(FLOW_CUDA);
  if (!cpu || !dev) return flow_error_set("%s: no CPU kernel to run for cuda", name);
  flow_tensor *hin[16] = {NULL}, *hout[8] = {NULL};
  if (nin > 16 || nout > 8) return flow_error_set("%s: too many tensors for the host fallback", name);
  int rc = 0;
  for (int i = 0; i < nin && rc == 0; i++) {
    flow_tensor *d = cuda_dense(in[i]);
    hin[i] = d ? flow_tensor_new(d->dtype, FLOW_DEVICE_CPU, d->ndim, d->shape) : NULL;
    rc = hin[i] ? dev->copy(flow_tensor_data(hin[i]), FLOW_DEVICE_CPU, flow_tensor_data(d), d->device,
                            flow_tensor_nbytes(d))
                : -1;
    if (d) flow_tensor_decref(d);
  }
  for (int j = 0; j < nout && rc == 0; j++)
    if (!(hout[j] = flow_tensor_new(out[j]->dtype, FLOW_DEVICE_CPU, out[j]->ndim, out[j]->shape))) rc = -1;
  if (rc == 0) {
    flow_attrs ha = *a;
    ha.device = FLOW_DEVICE_CPU;
    rc = cpu(hin, nin, hout, nout, &ha);
  }
  for (int j = 0; j < nout && rc == 0; j++)
    rc = dev->copy(flow_tensor_data(out[j]), out[j]->device, flow_tensor_data(hout[j]), FLOW_DEVICE_CPU,
                   flow_tensor_nbytes(out[j]));
  for (int i = 0; i < nin; i++) if (hin[i]) flow_tensor_decref(hin[i]);
  for (int j = 0; j < nout; j++) if (hout[j]) flow_tensor_decref(hout[j]);
  return rc;
}

/* the host fallback for op `id`, unless a CUDA kernel of its own was registered */
#define VIA_HOST(id)                                                                          \
  static FLOW_KERNEL(host_##id) { return flow_cuda_via_host(#id, in, nin, out, nout, a); }    \
  static void register_host_##id(void) {                                                     \
    if (!flow_kernel_find(FLOW_CUDA, #id)) FLOW_KERNEL_ADD(FLOW_CUDA, id, host_##id);         \
  }
VIA_HOST(arange)
VIA_HOST(linspace)
VIA_HOST(eye)
VIA_HOST(randint)

void flow_cuda_register_kernels(void) {
  flow_cuda_set_sync_check(flow_cuda_raise_bad_index);
  flow_kernel_set_copy(FLOW_CUDA, flow_cuda_copy);
  register_host_arange();
  register_host_linspace();
  register_host_eye();
  register_host_randint();
  flow_cuda_register_elementwise();
  flow_cuda_register_reduce();
  flow_cuda_register_sort();
  flow_cuda_register_matmul();
  flow_cuda_register_nn();
  flow_cuda_register_attention();
  flow_cuda_register_index();
  flow_cuda_register_shape();
  flow_cuda_register_random();
  flow_cuda_register_conv();
}

/* The device runtime, every kernel (GPU or not: the kernel-list spec reads them) and NCCL. */
extern "C" __attribute__((visibility("default"))) int flow_cuda_plugin_open(int abi, flow_cuda_backend *b) {
  if (abi != FLOW_CUDA_PLUGIN_ABI)
    return flow_error_set("built for interface %d, this flowlua has %d (a plugin of another build)",
                          FLOW_CUDA_PLUGIN_ABI, abi);
  if (flow_cuda_runtime_open(b) != 0) return -1;
  flow_cuda_register_kernels();
  b->bench_gemm = flow_cuda_bench_gemm;
  b->nccl_comm = flow_cuda_nccl_comm;
  return 0;
}
