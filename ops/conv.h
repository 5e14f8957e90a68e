/* Convolution, pooling and batch-norm ops (NCHW): conv2d, max_pool2d, avg_pool2d, batch_norm. */
#ifndef FLOW_OPS_CONV_H
#define FLOW_OPS_CONV_H

#include "op.h"

/* stride, padding, dilation: {h, w} pairs. bias may be NULL. */
flow_tensor *flow_conv2d(flow_tensor *x, flow_tensor *w, flow_tensor *bias, const int64_t stride[2],
                         const int64_t padding[2], const int64_t dilation[2], int64_t groups);
flow_tensor *flow_max_pool2d(flow_tensor *x, const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2]);
flow_tensor *flow_avg_pool2d(flow_tensor *x, const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2]);
/* Updates running_mean / running_var in place when training. */
flow_tensor *flow_batch_norm(flow_tensor *x, flow_tensor *weight, flow_tensor *bias, flow_tensor *running_mean,
                             flow_tensor *running_var, bool training, double momentum, double eps);

#endif
