/* Moving tensors between devices (host <-> GPU, GPU <-> GPU) as a differentiable op. */
#ifndef FLOW_OPS_DEVICE_H
#define FLOW_OPS_DEVICE_H

#include "op.h"

extern flow_op flow_op_to_device;

/* A contiguous copy of t on dev (a new reference; t itself when already there); NULL + error. */
flow_tensor *flow_to_device(flow_tensor *t, flow_device dev);

#endif
