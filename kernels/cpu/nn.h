/* Fused neural-network kernels on the CPU: softmax, layernorm, cross-entropy, attention (forward
 * and backward pairs) and the AdamW update. float32 and float64; inputs may have any strides. */
#ifndef FLOW_CPU_NN_H
#define FLOW_CPU_NN_H

#include "cpu.h"

/* y = softmax(x) (or log_softmax) along `axis`; dx from the saved output y and dy. */
int flow_cpu_softmax_forward(flow_tensor *y, const flow_tensor *x, int axis, bool log);
int flow_cpu_softmax_backward(flow_tensor *dx, const flow_tensor *y, const flow_tensor *dy, int axis,
                              bool log);

/* Over the last axis: y = (x - mean) * rstd * w + b, also writing mean and rstd ([rows]).
 * w and b may be NULL (1 and 0). The backward writes dx (rows split over the threads), then dw and
 * db ([C], columns split over the threads, so the sums keep their order on any thread count), from
 * the gradients of all three outputs (dmean and drstd are usually zeros). */
int flow_cpu_layernorm_forward(flow_tensor *y, flow_tensor *mean, flow_tensor *rstd, const flow_tensor *x,
                               const flow_tensor *w, const flow_tensor *b, double eps);
int flow_cpu_layernorm_backward(flow_tensor *dx, flow_tensor *dw, flow_tensor *db, const flow_tensor *dy,
                                const flow_tensor *dmean, const flow_tensor *drstd, const flow_tensor *x,
                                const flow_tensor *w, const flow_tensor *mean, const flow_tensor *rstd);

/* logits [rows, C] (any leading shape), target int64 [rows]: loss = lse - logits[target] per row,
 * written per row (reduce false) or summed (reduce true; divided by the count of non-ignored
 * rows when mean). lse [rows] is saved for the backward, which writes
 * dlogits = (softmax - onehot(target)) * g + softmax * glse (g per row, or g / count; glse is the
 * gradient of lse, usually zeros). */
int flow_cpu_cross_entropy_forward(flow_tensor *loss, flow_tensor *lse, const flow_tensor *logits,
                                   const flow_tensor *target, int64_t ignore_index, bool reduce, bool mean);
int flow_cpu_cross_entropy_backward(flow_tensor *dlogits, const flow_tensor *logits, const flow_tensor *target,
                                    const flow_tensor *lse, const flow_tensor *g, const flow_tensor *glse,
                                    int64_t ignore_index, bool reduce, bool mean);

/* q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv]: o = softmax(scale q k^T (+ causal mask)) v, with the
 * log-sum-exp of each score row in lse [B,H,Tq]. The backward recomputes the probabilities from
 * q, k and lse and writes dq, dk, dv from the gradients of o and of lse (dlse: usually zeros). */
int flow_cpu_attention_forward(flow_tensor *o, flow_tensor *lse, const flow_tensor *q, const flow_tensor *k,
                               const flow_tensor *v, double scale, bool causal);
int flow_cpu_attention_backward(flow_tensor *dq, flow_tensor *dk, flow_tensor *dv, const flow_tensor *q,
                                const flow_tensor *k, const flow_tensor *v, const flow_tensor *o,
                                const flow_tensor *lse, const flow_tensor *dout, const flow_tensor *dlse,
                                double scale, bool causal);
/* The same in bf16 on AVX512-BF16 (attention_bf16.c), for bfloat16 tensors and float32 ones under bf16
 * autocast: callers check flow_onednn_bf16_native(), Tq >= 1 and Dv >= 1 first. */
int flow_cpu_attention_forward_bf16(flow_tensor *o, flow_tensor *lse, const flow_tensor *q, const flow_tensor *k,
                                    const flow_tensor *v, double scale, bool causal);
int flow_cpu_attention_backward_bf16(flow_tensor *dq, flow_tensor *dk, flow_tensor *dv, const flow_tensor *q,
                                     const flow_tensor *k, const flow_tensor *v, const flow_tensor *o,
                                     const flow_tensor *lse, const flow_tensor *dout, const flow_tensor *dlse,
                                     double scale, bool causal);

/* One AdamW step (PyTorch's formula) on p, m and v in place; all four tensors share a shape. */
typedef struct flow_adamw_hyper {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;   /* 1-based, for the bias corrections */
} flow_adamw_hyper;
int flow_cpu_adamw(flow_tensor *p, const flow_tensor *g, flow_tensor *m, flow_tensor *v,
                   const flow_adamw_hyper *h);

/* Row primitives the kernels share (kernels/cpu/softmax.c): the max of x[0..n) (-inf when n == 0),
 * and y[j] = exp(x[j] - shift) for j < n, returning the sum of the y (y may be x). */
float flow_cpu_row_max_f32(const float *x, int64_t n);
double flow_cpu_row_max_f64(const double *x, int64_t n);
float flow_cpu_exp_shift_f32(float *y, const float *x, int64_t n, float shift);
double flow_cpu_exp_shift_f64(double *y, const double *x, int64_t n, double shift);

/* t's data as a dense row-major array: t itself when contiguous, else a copy left in *tmp
 * (the caller decrefs it). NULL + error if the copy cannot be made. */
static inline const void *flow_cpu_dense(const flow_tensor *t, flow_tensor **tmp) {
  *tmp = NULL;
  if (flow_tensor_is_contiguous(t)) return flow_tensor_data(t);
  *tmp = flow_tensor_new(t->dtype, t->device, t->ndim, t->shape);
  if (!*tmp) return NULL;
  flow_cpu_copy(*tmp, t);
  return flow_tensor_data(*tmp);
}

#endif
