/* Convolution, pooling and batch-norm kernels on the CPU (NCHW, float32 and float64), each with its
 * backward: float32 on oneDNN (bf16 convolution under autocast), float64 on the reference kernels
 * (conv2d by im2col + GEMM, plain loops for the rest), which the specs also check oneDNN against. */
#ifndef FLOW_CPU_CONV_H
#define FLOW_CPU_CONV_H

#include "cpu.h"

/* Geometry of a 2-d window op: input [N, C, H, W], output [N, O, OH, OW], window kh x kw with
 * stride (sh, sw), zero padding (ph, pw), dilation (dh, dw) and `groups` channel groups
 * (pooling: O = C, dilation 1, groups 1). */
typedef struct flow_conv_geom {
  int64_t N, C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, groups;
} flow_conv_geom;

/* y = conv(x, w) + bias (bias may be NULL). */
int flow_cpu_conv2d_forward(flow_tensor *y, const flow_tensor *x, const flow_tensor *w, const flow_tensor *bias,
                            const flow_conv_geom *g);
/* dx, dw, db ([O]) from dy, x and w. */
int flow_cpu_conv2d_backward(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                             const flow_tensor *x, const flow_tensor *w, const flow_conv_geom *g);

/* Max pooling ignores padded positions; its backward sends dy to the first maximum of each window.
 * Average pooling divides by kh * kw, padded zeros included (PyTorch's count_include_pad). */
/* Batch mean and biased variance of channel c of x [N, C, S], two passes in double (the batch
 * norm reference and the oneDNN path share it). */
void flow_cpu_bn_moments_f32(const float *x, int64_t N, int64_t C, int64_t S, int64_t c, double *mean, double *var);
void flow_cpu_bn_moments_f64(const double *x, int64_t N, int64_t C, int64_t S, int64_t c, double *mean, double *var);

int flow_cpu_pool2d_forward(flow_tensor *y, const flow_tensor *x, const flow_conv_geom *g, bool max);
int flow_cpu_pool2d_backward(flow_tensor *dx, const flow_tensor *dy, const flow_tensor *x, const flow_conv_geom *g,
                             bool max);

/* x [N, C, ...]: per channel, training uses the batch mean and biased variance over N and the
 * spatial axes and updates rm = (1 - momentum) rm + momentum mean, rv likewise with the unbiased
 * variance; eval uses rm, rv. y = (x - mean) / sqrt(var + eps) * w + b. */
int flow_cpu_batchnorm_forward(flow_tensor *y, const flow_tensor *x, const flow_tensor *w, const flow_tensor *b,
                               flow_tensor *rm, flow_tensor *rv, bool training, double momentum, double eps);
/* dx, dw, db from dy, recomputing the statistics the forward used. */
int flow_cpu_batchnorm_backward(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                const flow_tensor *x, const flow_tensor *w, const flow_tensor *rm,
                                const flow_tensor *rv, bool training, double eps);

/* The reference kernels, same contracts (conv.c). */
int flow_cpu_conv2d_forward_reference(flow_tensor *y, const flow_tensor *x, const flow_tensor *w,
                                      const flow_tensor *bias, const flow_conv_geom *g);
int flow_cpu_conv2d_backward_reference(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                       const flow_tensor *x, const flow_tensor *w, const flow_conv_geom *g);
int flow_cpu_pool2d_forward_reference(flow_tensor *y, const flow_tensor *x, const flow_conv_geom *g, bool max);
int flow_cpu_pool2d_backward_reference(flow_tensor *dx, const flow_tensor *dy, const flow_tensor *x,
                                       const flow_conv_geom *g, bool max);
int flow_cpu_batchnorm_forward_reference(flow_tensor *y, const flow_tensor *x, const flow_tensor *w,
                                         const flow_tensor *b, flow_tensor *rm, flow_tensor *rv, bool training,
                                         double momentum, double eps);
int flow_cpu_batchnorm_backward_reference(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                          const flow_tensor *x, const flow_tensor *w, const flow_tensor *rm,
                                          const flow_tensor *rv, bool training, double eps);
/* When true, float32 runs the reference kernels too (the specs compare the two paths). */
extern bool flow_cpu_conv_reference;

#endif
