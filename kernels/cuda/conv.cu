/* conv2d, max/avg pool2d and batch_norm on CUDA through cuDNN (float32, NCHW), with their
 * backward ops; other dtypes (and batch_norm's eval-mode backward, which cuDNN lacks) run the
 * CPU kernel on host copies. Attribute layout: see ops/conv.c. */
#include <cudnn.h>

#include "common.h"
#include "kernels.h"

enum { CONV_BIAS = 1 << 16, BN_TRAINING = 1 << 16 };  /* ops/conv.c */


static int cudnn_check(cudnnStatus_t s, const char *what) {
  if (s == CUDNN_STATUS_SUCCESS) return 0;
  return flow_error_set("%s: %s", what, cudnnGetErrorString(s));
}
#define CK(call, what) \
  do { if (cudnn_check((call), what) != 0) goto done; } while (0)

/* One cuDNN handle per device, bound to that device's compute stream. */
static cudnnHandle_t handle_for(const flow_tensor *t, const char *what) {
  static cudnnHandle_t handles[FLOW_CUDA_MAX_DEVICES];
  int d = t->device.index;
  if (d < 0 || d >= FLOW_CUDA_MAX_DEVICES) { flow_error_set("%s: device index %d out of range", what, d); return NULL; }
  cudaStream_t s = stream_of(t);
  if (!handles[d] && cudnn_check(cudnnCreate(&handles[d]), what) != 0) return NULL;
  if (cudnn_check(cudnnSetStream(handles[d], s), what) != 0) return NULL;
  return handles[d];
}

/* A 4-d NCHW descriptor of a dense tensor of the given dims. */
static int desc4(cudnnTensorDescriptor_t *d, int n, int c, int h, int w, const char *what) {
  if (cudnn_check(cudnnCreateTensorDescriptor(d), what) != 0) return -1;
  return cudnn_check(cudnnSetTensor4dDescriptor(*d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w), what);
}
static int desc_of(cudnnTensorDescriptor_t *d, const flow_tensor *t, const char *what) {
  return desc4(d, (int)t->shape[0], (int)t->shape[1], (int)t->shape[2], (int)t->shape[3], what);
}

/* A byte buffer from the caching allocator (as a uint8 tensor; NULL when n == 0). */
static int workspace(const flow_tensor *like, size_t n, flow_tensor **ws) {
  *ws = NULL;
  if (n == 0) return 0;
  int64_t len = (int64_t)n;
  *ws = flow_tensor_new(FLOW_U8, like->device, 1, &len);
  return *ws ? 0 : -1;
}

/* Dense device copies of in[0..n) into d[] (new references); -1 on failure (d[] released). */
static int dense_inputs(flow_tensor *const *in, int n, flow_tensor **d) {
  for (int i = 0; i < n; i++) d[i] = NULL;
  for (int i = 0; i < n; i++)
    if (!(d[i] = cuda_dense(in[i]))) {
      for (int j = 0; j < i; j++) flow_tensor_decref(d[j]);
      return -1;
    }
  return 0;
}
static void release(flow_tensor **t, int n) {
  for (int i = 0; i < n; i++) if (t[i]) flow_tensor_decref(t[i]);
}

/* ---- conv2d ---------------------------------------------------------------------------------- */

struct ConvDescs {
  cudnnTensorDescriptor_t x = NULL, y = NULL, b = NULL;
  cudnnFilterDescriptor_t w = NULL;
  cudnnConvolutionDescriptor_t conv = NULL;
  ~ConvDescs() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (b) cudnnDestroyTensorDescriptor(b);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

static int conv_descs(ConvDescs &d, const flow_tensor *x, const flow_tensor *w, const flow_tensor *y,
                      const flow_attrs *a, const char *what) {
  const int64_t *s = a->axes;  /* stride h, w; padding h, w; dilation h, w */
  if (desc_of(&d.x, x, what) != 0 || desc_of(&d.y, y, what) != 0 || desc4(&d.b, 1, (int)w->shape[0], 1, 1, what) != 0)
    return -1;
  if (cudnn_check(cudnnCreateFilterDescriptor(&d.w), what) != 0 ||
      cudnn_check(cudnnSetFilter4dDescriptor(d.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)w->shape[0],
                                             (int)w->shape[1], (int)w->shape[2], (int)w->shape[3]), what) != 0)
    return -1;
  if (cudnn_check(cudnnCreateConvolutionDescriptor(&d.conv), what) != 0 ||
      cudnn_check(cudnnSetConvolution2dDescriptor(d.conv, (int)s[2], (int)s[3], (int)s[0], (int)s[1], (int)s[4],
                                                  (int)s[5], CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), what) != 0 ||
      cudnn_check(cudnnSetConvolutionGroupCount(d.conv, (int)a->k), what) != 0)
    return -1;
  /* cuDNN's default math may use TF32 tensor cores for float32 on Ampere and later: only when
   * flow.backends.allow_tf32 says so, as for matmul; else plain FMA, the CPU's precision. */
  return cudnn_check(cudnnSetConvolutionMathType(d.conv, flow_cuda_allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
                     what);
}

static FLOW_KERNEL(k_conv2d) {
  if (in[0]->dtype != FLOW_F32) return flow_cuda_via_host("conv2d", in, nin, out, nout, a);
  const char *what = "conv2d (cudnn)";
  flow_tensor *d[3], *ws = NULL;
  if (dense_inputs(in, nin, d) != 0) return -1;
  int rc = -1;
  const float one = 1, zero = 0;
  ConvDescs c;
  cudnnHandle_t h = handle_for(out[0], what);
  if (!h || conv_descs(c, d[0], d[1], out[0], a, what) != 0) { release(d, nin); return -1; }
  {
    cudnnConvolutionFwdAlgoPerf_t perf;
    int found = 0;
    size_t n = 0;
    CK(cudnnGetConvolutionForwardAlgorithm_v7(h, c.x, c.w, c.conv, c.y, 1, &found, &perf), what);
    if (found < 1) { flow_error_set("%s: no forward algorithm for these shapes", what); goto done; }
    CK(cudnnGetConvolutionForwardWorkspaceSize(h, c.x, c.w, c.conv, c.y, perf.algo, &n), what);
    if (workspace(out[0], n, &ws) != 0) goto done;
    CK(cudnnConvolutionForward(h, &one, c.x, flow_tensor_data(d[0]), c.w, flow_tensor_data(d[1]), c.conv, perf.algo,
                               ws ? flow_tensor_data(ws) : NULL, n, &zero, c.y, flow_tensor_data(out[0])), what);
    if (a->flags & CONV_BIAS)
      CK(cudnnAddTensor(h, &one, c.b, flow_tensor_data(d[2]), &one, c.y, flow_tensor_data(out[0])), what);
    rc = 0;
  }
done:
  if (ws) flow_tensor_decref(ws);
  release(d, nin);
  return rc;
}

/* inputs dy, x, w; outputs dx, dw, db */
static FLOW_KERNEL(k_conv2d_grad) {
  if (in[1]->dtype != FLOW_F32) return flow_cuda_via_host("conv2d_grad", in, nin, out, nout, a);
  const char *what = "conv2d_grad (cudnn)";
  flow_tensor *d[3], *ws = NULL;
  if (dense_inputs(in, 3, d) != 0) return -1;
  int rc = -1;
  const float one = 1, zero = 0;
  ConvDescs c;
  cudnnHandle_t h = handle_for(out[0], what);
  if (!h || conv_descs(c, d[1], d[2], d[0], a, what) != 0) { release(d, 3); return -1; }
  {
    cudnnConvolutionBwdDataAlgoPerf_t pd;
    cudnnConvolutionBwdFilterAlgoPerf_t pf;
    int found = 0;
    size_t nd = 0, nf = 0;
    CK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w, c.y, c.conv, c.x, 1, &found, &pd), what);
    if (found < 1) { flow_error_set("%s: no backward-data algorithm for these shapes", what); goto done; }
    CK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x, c.y, c.conv, c.w, 1, &found, &pf), what);
    if (found < 1) { flow_error_set("%s: no backward-filter algorithm for these shapes", what); goto done; }
    CK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, c.w, c.y, c.conv, c.x, pd.algo, &nd), what);
    CK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c.x, c.y, c.conv, c.w, pf.algo, &nf), what);
    size_t n = nd > nf ? nd : nf;
    if (workspace(out[0], n, &ws) != 0) goto done;
    void *wp = ws ? flow_tensor_data(ws) : NULL;
    CK(cudnnConvolutionBackwardData(h, &one, c.w, flow_tensor_data(d[2]), c.y, flow_tensor_data(d[0]), c.conv,
                                    pd.algo, wp, n, &zero, c.x, flow_tensor_data(out[0])), what);
    CK(cudnnConvolutionBackwardFilter(h, &one, c.x, flow_tensor_data(d[1]), c.y, flow_tensor_data(d[0]), c.conv,
                                      pf.algo, wp, n, &zero, c.w, flow_tensor_data(out[1])), what);
    CK(cudnnConvolutionBackwardBias(h, &one, c.y, flow_tensor_data(d[0]), &zero, c.b, flow_tensor_data(out[2])), what);
    rc = 0;
  }
done:
  if (ws) flow_tensor_decref(ws);
  release(d, 3);
  return rc;
}

/* ---- pooling --------------------------------------------------------------------------------- */

struct PoolDescs {
  cudnnTensorDescriptor_t x = NULL, y = NULL;
  cudnnPoolingDescriptor_t pool = NULL;
  ~PoolDescs() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (pool) cudnnDestroyPoolingDescriptor(pool);
  }
};

/* shape = kernel, axes = stride h, w, padding h, w. Average pooling counts padding (as on the CPU). */
static int pool_descs(PoolDescs &d, const flow_tensor *x, const flow_tensor *y, const flow_attrs *a, bool max,
                      const char *what) {
  if (desc_of(&d.x, x, what) != 0 || desc_of(&d.y, y, what) != 0) return -1;
  if (cudnn_check(cudnnCreatePoolingDescriptor(&d.pool), what) != 0) return -1;
  return cudnn_check(cudnnSetPooling2dDescriptor(d.pool,
                                                 max ? CUDNN_POOLING_MAX_DETERMINISTIC
                                                     : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                                 CUDNN_PROPAGATE_NAN, (int)a->shape[0], (int)a->shape[1],
                                                 (int)a->axes[2], (int)a->axes[3], (int)a->axes[0], (int)a->axes[1]),
                     what);
}

static int pool_forward(flow_tensor *const *in, flow_tensor **out, const flow_attrs *a, bool max) {
  const char *what = max ? "max_pool2d (cudnn)" : "avg_pool2d (cudnn)";
  flow_tensor *x = cuda_dense(in[0]);
  if (!x) return -1;
  int rc = -1;
  const float one = 1, zero = 0;
  PoolDescs p;
  cudnnHandle_t h = handle_for(out[0], what);
  if (h && pool_descs(p, x, out[0], a, max, what) == 0)
    rc = cudnn_check(cudnnPoolingForward(h, p.pool, &one, p.x, flow_tensor_data(x), &zero, p.y,
                                         flow_tensor_data(out[0])), what);
  flow_tensor_decref(x);
  return rc;
}

/* inputs dy, x: cuDNN also wants y, recomputed here. */
static int pool_backward(flow_tensor *const *in, flow_tensor **out, const flow_attrs *a, bool max) {
  const char *what = max ? "max_pool2d_grad (cudnn)" : "avg_pool2d_grad (cudnn)";
  flow_tensor *d[2], *y = NULL;
  if (dense_inputs(in, 2, d) != 0) return -1;
  int rc = -1;
  const float one = 1, zero = 0;
  PoolDescs p;
  cudnnHandle_t h = handle_for(out[0], what);
  if (h && (y = flow_tensor_new(FLOW_F32, d[0]->device, d[0]->ndim, d[0]->shape)) &&
      pool_descs(p, d[1], y, a, max, what) == 0 &&
      cudnn_check(cudnnPoolingForward(h, p.pool, &one, p.x, flow_tensor_data(d[1]), &zero, p.y, flow_tensor_data(y)),
                  what) == 0)
    rc = cudnn_check(cudnnPoolingBackward(h, p.pool, &one, p.y, flow_tensor_data(y), p.y, flow_tensor_data(d[0]), p.x,
                                          flow_tensor_data(d[1]), &zero, p.x, flow_tensor_data(out[0])), what);
  if (y) flow_tensor_decref(y);
  release(d, 2);
  return rc;
}

static FLOW_KERNEL(k_max_pool2d) {
  return in[0]->dtype == FLOW_F32 ? pool_forward(in, out, a, true) : flow_cuda_via_host("max_pool2d", in, nin, out, nout, a);
}
static FLOW_KERNEL(k_avg_pool2d) {
  return in[0]->dtype == FLOW_F32 ? pool_forward(in, out, a, false) : flow_cuda_via_host("avg_pool2d", in, nin, out, nout, a);
}
static FLOW_KERNEL(k_max_pool2d_grad) {
  return in[1]->dtype == FLOW_F32 ? pool_backward(in, out, a, true)
                                  : flow_cuda_via_host("max_pool2d_grad", in, nin, out, nout, a);
}
static FLOW_KERNEL(k_avg_pool2d_grad) {
  return in[1]->dtype == FLOW_F32 ? pool_backward(in, out, a, false)
                                  : flow_cuda_via_host("avg_pool2d_grad", in, nin, out, nout, a);
}

/* ---- batch_norm ------------------------------------------------------------------------------
 * x [N, C, ...] is described to cuDNN as [N, C, S, 1] (spatial mode: statistics per channel). */

struct BnDescs {
  cudnnTensorDescriptor_t x = NULL, p = NULL;
  ~BnDescs() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (p) cudnnDestroyTensorDescriptor(p);
  }
};

static int bn_descs(BnDescs &d, const flow_tensor *x, const char *what) {
  int64_t S = flow_shape_numel(x->ndim - 2, x->shape + 2);
  if (desc4(&d.x, (int)x->shape[0], (int)x->shape[1], (int)S, 1, what) != 0) return -1;
  if (cudnn_check(cudnnCreateTensorDescriptor(&d.p), what) != 0) return -1;
  return cudnn_check(cudnnDeriveBNTensorDescriptor(d.p, d.x, CUDNN_BATCHNORM_SPATIAL), what);
}

/* cuDNN rejects eps below CUDNN_BN_MIN_EPSILON and writes the running stats in place, so those
 * must be dense: other cases take the host path. */
static bool bn_cudnn_ok(flow_tensor *const *in, const flow_attrs *a) {
  return in[0]->dtype == FLOW_F32 && a->eps >= CUDNN_BN_MIN_EPSILON && flow_tensor_is_contiguous(in[3]) &&
         flow_tensor_is_contiguous(in[4]);
}

/* inputs x, weight, bias, running_mean, running_var */
static FLOW_KERNEL(k_batch_norm) {
  if (!bn_cudnn_ok(in, a)) return flow_cuda_via_host("batch_norm", in, nin, out, nout, a);
  const char *what = "batch_norm (cudnn)";
  flow_tensor *d[3];
  if (dense_inputs(in, 3, d) != 0) return -1;
  int rc = -1;
  const float one = 1, zero = 0;
  BnDescs b;
  cudnnHandle_t h = handle_for(out[0], what);
  if (h && bn_descs(b, d[0], what) == 0) {
    if (a->flags & BN_TRAINING)
      rc = cudnn_check(cudnnBatchNormalizationForwardTraining(
                           h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, b.x, flow_tensor_data(d[0]), b.x,
                           flow_tensor_data(out[0]), b.p, flow_tensor_data(d[1]), flow_tensor_data(d[2]), a->scalar,
                           flow_tensor_data(in[3]), flow_tensor_data(in[4]), a->eps, NULL, NULL), what);
    else
      rc = cudnn_check(cudnnBatchNormalizationForwardInference(
                           h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, b.x, flow_tensor_data(d[0]), b.x,
                           flow_tensor_data(out[0]), b.p, flow_tensor_data(d[1]), flow_tensor_data(d[2]),
                           flow_tensor_data(in[3]), flow_tensor_data(in[4]), a->eps), what);
  }
  release(d, 3);
  return rc;
}

/* inputs dy, x, weight, running_mean, running_var; outputs dx, dweight, dbias. cuDNN's backward is
 * the training one (statistics recomputed from x); eval mode runs on the host. */
static FLOW_KERNEL(k_batch_norm_grad) {
  if (!(a->flags & BN_TRAINING) || in[1]->dtype != FLOW_F32 || a->eps < CUDNN_BN_MIN_EPSILON)
    return flow_cuda_via_host("batch_norm_grad", in, nin, out, nout, a);
  const char *what = "batch_norm_grad (cudnn)";
  flow_tensor *d[3];
  if (dense_inputs(in, 3, d) != 0) return -1;
  int rc = -1;
  const float one = 1, zero = 0;
  BnDescs b;
  cudnnHandle_t h = handle_for(out[0], what);
  if (h && bn_descs(b, d[1], what) == 0)
    rc = cudnn_check(cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, b.x,
                                                     flow_tensor_data(d[1]), b.x, flow_tensor_data(d[0]), b.x,
                                                     flow_tensor_data(out[0]), b.p, flow_tensor_data(d[2]),
                                                     flow_tensor_data(out[1]), flow_tensor_data(out[2]), a->eps, NULL,
                                                     NULL), what);
  release(d, 3);
  return rc;
}

void flow_cuda_register_conv(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, conv2d, k_conv2d);
  FLOW_KERNEL_ADD(FLOW_CUDA, conv2d_grad, k_conv2d_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, max_pool2d, k_max_pool2d);
  FLOW_KERNEL_ADD(FLOW_CUDA, avg_pool2d, k_avg_pool2d);
  FLOW_KERNEL_ADD(FLOW_CUDA, max_pool2d_grad, k_max_pool2d_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, avg_pool2d_grad, k_avg_pool2d_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, batch_norm, k_batch_norm);
  FLOW_KERNEL_ADD(FLOW_CUDA, batch_norm_grad, k_batch_norm_grad);
}
