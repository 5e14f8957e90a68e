/* to_device: copy a tensor to another device. The gradient is the copy back to the input's device.
 * One kernel serves every direction: it makes the source dense on its own device, then hands the
 * bytes to the device backend that owns the non-host side. */
#include "device.h"

#include "../sbp/signature.h"
#include "elementwise.h"

static int infer_to_device(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a,
                           flow_meta *out) {
  (void)op; (void)nin;
  *out = in[0];
  out->device = a->device;
  return 0;
}

static FLOW_KERNEL(any_to_device) {
  (void)nin; (void)nout; (void)a;
  flow_tensor *src = in[0];
  if (!flow_tensor_is_contiguous(src) && flow_op_call_local(&flow_op_contiguous, in, 1, a, &src) != 0) return -1;
  flow_device sd = src->device, dd = out[0]->device;
  const flow_device_impl *impl = flow_device_get(dd.type != FLOW_CPU ? dd.type : sd.type);
  int rc = impl ? impl->copy(flow_tensor_data(out[0]), dd, flow_tensor_data(src), sd, flow_tensor_nbytes(src))
                : flow_error_set("to_device: no backend for this device");
  if (src != in[0]) flow_tensor_decref(src);
  return rc;
}

static int grad_to_device(const flow_grad_ctx *c, flow_tensor **gin) {
  if (c->gout[0] && c->need[0] && !(gin[0] = flow_to_device(c->gout[0], c->in_meta[0].device))) return -1;
  return 0;
}

FLOW_OP(to_device) {.nin = 1, .nout = 1, .cpu_half = true,
                    .sbp = FLOW_SBP_RULE(elementwise, FLOW_SBP_LINEAR),
                    .infer = infer_to_device,
                    .grad = grad_to_device};
FLOW_KERNEL_REGISTER(FLOW_CPU, to_device, any_to_device)
FLOW_KERNEL_REGISTER(FLOW_CUDA, to_device, any_to_device)

flow_tensor *flow_to_device(flow_tensor *t, flow_device dev) {
  if (flow_device_eq(t->device, dev)) { flow_tensor_incref(t); return t; }
  flow_attrs at;
  flow_attrs_init(&at);
  at.device = dev;
  return flow_op_call1(&flow_op_to_device, &t, 1, &at);
}
