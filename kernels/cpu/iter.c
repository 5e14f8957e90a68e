/* Strided N-d iteration (see iter.h). */
#include "iter.h"

#include <string.h>

/* The common case: every operand contiguous with the output's shape -> one flat loop. */
static bool iter_flat(flow_iter *it, flow_tensor *const *ops, int nops) {
  const flow_tensor *out = ops[0];
  for (int k = 0; k < nops; k++) {
    const flow_tensor *t = ops[k];
    if (t->ndim != out->ndim) return false;
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (t->shape[d] != out->shape[d] || (t->shape[d] != 1 && t->stride[d] != s)) return false;
      s *= t->shape[d];
    }
  }
  it->ndim = 1;
  it->shape[0] = it->numel;
  for (int k = 0; k < nops; k++) {
    it->data[k] = flow_tensor_data(ops[k]);
    it->stride[k][0] = (int64_t)flow_dtype_size(ops[k]->dtype);
  }
  return true;
}

void flow_iter_init(flow_iter *it, flow_tensor *const *ops, int nops) {
  const flow_tensor *out = ops[0];
  int nd = out->ndim;
  it->nops = nops;
  it->numel = flow_tensor_numel(out);
  if (iter_flat(it, ops, nops)) return;
  for (int k = 0; k < nops; k++) {
    const flow_tensor *t = ops[k];
    int64_t es = (int64_t)flow_dtype_size(t->dtype);
    it->data[k] = flow_tensor_data(t);
    for (int d = 0; d < nd; d++) {
      int td = d - (nd - t->ndim);
      it->stride[k][d] = (td < 0 || t->shape[td] == 1) ? 0 : t->stride[td] * es;
    }
  }
  /* merge axis d into d+1 when, for every operand, stride[d] == stride[d+1] * shape[d+1] */
  int64_t shape[FLOW_MAX_DIMS];
  int64_t stride[FLOW_ITER_MAX_OPS][FLOW_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < nd; d++) {
    if (out->shape[d] == 1) continue;
    if (n > 0) {
      bool merge = true;
      for (int k = 0; k < nops && merge; k++)
        merge = stride[k][n - 1] == it->stride[k][d] * out->shape[d];
      if (merge) {
        shape[n - 1] *= out->shape[d];
        for (int k = 0; k < nops; k++) stride[k][n - 1] = it->stride[k][d];
        continue;
      }
    }
    shape[n] = out->shape[d];
    for (int k = 0; k < nops; k++) stride[k][n] = it->stride[k][d];
    n++;
  }
  if (n == 0) { /* scalar or all-ones shape: one element */
    shape[0] = 1;
    for (int k = 0; k < nops; k++) stride[k][0] = 0;
    n = 1;
  }
  it->ndim = n;
  memcpy(it->shape, shape, sizeof shape);
  for (int k = 0; k < nops; k++) memcpy(it->stride[k], stride[k], sizeof stride[k]);
}

void flow_iter_run(const flow_iter *it, flow_iter_fn fn, void *ctx) {
  if (it->numel == 0) return;
  int nd = it->ndim, nops = it->nops;
  int64_t inner = it->shape[nd - 1];
  int64_t istride[FLOW_ITER_MAX_OPS];
  char *ptr[FLOW_ITER_MAX_OPS];
  for (int k = 0; k < nops; k++) istride[k] = it->stride[k][nd - 1];
  if (nd == 1) {
    for (int k = 0; k < nops; k++) ptr[k] = it->data[k];
    fn(ptr, istride, inner, ctx);
    return;
  }
  int64_t idx[FLOW_MAX_DIMS] = {0};
  int64_t outer = it->numel / inner;
  for (int64_t o = 0; o < outer; o++) {
    for (int k = 0; k < nops; k++) {
      char *p = it->data[k];
      for (int d = 0; d < nd - 1; d++) p += idx[d] * it->stride[k][d];
      ptr[k] = p;
    }
    fn(ptr, istride, inner, ctx);
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < it->shape[d]) break;
      idx[d] = 0;
    }
  }
}
