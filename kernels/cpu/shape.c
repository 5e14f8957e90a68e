/* CPU kernels of cat, narrow's backward and tril/triu. All are moves of whole elements, so they
 * work for every dtype by copying through a window header onto the output. */
#include "shape.h"

#include <string.h>

#include "cpu.h"

/* A header for t[..., start:start+len, ...] along axis, on the stack: kernels need no refcounts. */
static flow_tensor window(const flow_tensor *t, int axis, int64_t start, int64_t len) {
  flow_tensor w = *t;
  w.shape[axis] = len;
  w.offset += start * t->stride[axis];
  return w;
}

int flow_cpu_cat(flow_tensor *out, flow_tensor *const *in, int nin, int axis) {
  int64_t at = 0;
  for (int i = 0; i < nin; i++) {
    int64_t len = in[i]->shape[axis];
    if (len == 0) continue;
    flow_tensor w = window(out, axis, at, len);
    if (flow_cpu_copy(&w, in[i]) != 0) return -1;
    at += len;
  }
  return 0;
}

int flow_cpu_narrow_scatter(flow_tensor *out, const flow_tensor *g, int axis, int64_t start) {
  if (flow_cpu_fill(out, 0) != 0) return -1;
  if (flow_tensor_numel(g) == 0) return 0;
  flow_tensor w = window(out, axis, start, g->shape[axis]);
  return flow_cpu_copy(&w, g);
}

int flow_cpu_tri(flow_tensor *out, const flow_tensor *x, int64_t k, bool upper) {
  if (flow_cpu_copy(out, x) != 0) return -1;
  int64_t rows = out->shape[out->ndim - 2], cols = out->shape[out->ndim - 1];
  if (rows == 0 || cols == 0) return 0;
  int64_t mats = flow_tensor_numel(out) / (rows * cols);
  size_t es = flow_dtype_size(out->dtype);
  char *p = flow_tensor_data(out);
  if (k > cols) k = cols;   /* beyond these every row is kept or dropped whole; avoids overflow */
  if (k < -rows) k = -rows;
  /* all-zero bytes are zero in every dtype, so masking is a memset of each row's dropped span */
  for (int64_t m = 0; m < mats; m++)
    for (int64_t i = 0; i < rows; i++) {
      char *row = p + ((m * rows + i) * cols) * (int64_t)es;
      int64_t lo, hi; /* dropped columns [lo, hi) */
      if (upper) { lo = 0; hi = i + k; }
      else { lo = i + k + 1; hi = cols; }
      if (lo < 0) lo = 0;
      if (hi > cols) hi = cols;
      if (lo < hi) memset(row + lo * (int64_t)es, 0, (size_t)(hi - lo) * es);
    }
  return 0;
}

/* x seen from the far end of each flipped axis (offset at its last element, stride negated) is the
 * flipped tensor: one strided copy. */
int flow_cpu_flip(flow_tensor *out, const flow_tensor *x, const bool *flip) {
  if (flow_tensor_numel(out) == 0) return 0;
  flow_tensor v = *x;
  for (int d = 0; d < x->ndim; d++)
    if (flip[d]) {
      v.offset += (x->shape[d] - 1) * x->stride[d];
      v.stride[d] = -x->stride[d];
    }
  return flow_cpu_copy(out, &v);
}
