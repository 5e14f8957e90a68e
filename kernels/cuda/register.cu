/* flow_cuda_register_kernels: attaches every CUDA kernel file's kernels to the op registry, and
 * gives the ops that have no CUDA kernel of their own (arange, linspace, eye, randint) one that
 * runs their CPU kernel on host copies: slow, but the same numbers as on the CPU (randint
 * included: its draws are counter-based, so element i does not depend on the device). */
#include "common.h"
#include "kernels.h"

/* Copy inputs to the host, run the op's CPU kernel, copy the outputs back. */
int flow_cuda_via_host(const char *name, flow_tensor *const *in, int nin, flow_tensor **out, int nout,
                       const flow_attrs *a) {
  const flow_op *op = flow_op_find(name);
  const flow_device_impl *dev = flow_device_get(FLOW_CUDA);
  if (!op || !op->kernel[FLOW_CPU] || !dev) return flow_error_set("%s: no CPU kernel to run for cuda", name);
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
    rc = op->kernel[FLOW_CPU](hin, nin, hout, nout, &ha);
  }
  for (int j = 0; j < nout && rc == 0; j++)
    rc = dev->copy(flow_tensor_data(out[j]), out[j]->device, flow_tensor_data(hout[j]), FLOW_DEVICE_CPU,
                   flow_tensor_nbytes(out[j]));
  for (int i = 0; i < nin; i++) if (hin[i]) flow_tensor_decref(hin[i]);
  for (int j = 0; j < nout; j++) if (hout[j]) flow_tensor_decref(hout[j]);
  return rc;
}

#define VIA_HOST(id) \
  static FLOW_KERNEL(host_##id) { return flow_cuda_via_host(#id, in, nin, out, nout, a); }
VIA_HOST(arange)
VIA_HOST(linspace)
VIA_HOST(eye)
VIA_HOST(randint)

void flow_cuda_register_kernels(void) {
  flow_cuda_set_sync_check(flow_cuda_raise_bad_index);
  static const struct { const char *name; flow_kernel_fn fn; } fallback[] = {
    {"arange", host_arange}, {"linspace", host_linspace}, {"eye", host_eye},
    {"randint", host_randint},
  };
  for (size_t i = 0; i < sizeof fallback / sizeof fallback[0]; i++) {
    const flow_op *op = flow_op_find(fallback[i].name);
    if (op && !op->kernel[FLOW_CUDA]) cuda_attach(fallback[i].name, fallback[i].fn);
  }
  flow_cuda_register_elementwise();
  flow_cuda_register_reduce();
  flow_cuda_register_matmul();
  flow_cuda_register_nn();
  flow_cuda_register_attention();
  flow_cuda_register_index();
  flow_cuda_register_shape();
  flow_cuda_register_random();
  flow_cuda_register_conv();
}
