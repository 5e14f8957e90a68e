/* Reduction kernels over any set of axes. The output is viewed with the input's shape and
 * stride 0 on reduced axes, so one strided iteration accumulates every input element into its
 * output slot. */
#include <string.h>

#include "cpu.h"
#include "iter.h"

#define DEF_SUM(fname, T, ACC)                                                      \
  static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {             \
    (void)ctx;                                                                      \
    if (s[0] == 0) { /* reducing along the inner loop: accumulate in registers */  \
      ACC acc = 0;                                                                  \
      const char *x = p[1];                                                         \
      for (int64_t i = 0; i < n; i++, x += s[1]) acc += *(const T *)x;              \
      *(T *)p[0] += (T)acc;                                                         \
    } else if (s[0] == sizeof(T) && s[1] == sizeof(T)) {                           \
      T *o = (T *)p[0];                                                             \
      const T *x = (const T *)p[1];                                                 \
      for (int64_t i = 0; i < n; i++) o[i] += x[i];                                 \
    } else {                                                                        \
      char *o = p[0];                                                               \
      const char *x = p[1];                                                         \
      for (int64_t i = 0; i < n; i++, o += s[0], x += s[1]) *(T *)o += *(const T *)x; \
    }                                                                               \
  }
DEF_SUM(sum_f32, float, double)
DEF_SUM(sum_f64, double, double)
DEF_SUM(sum_i64, int64_t, int64_t)
DEF_SUM(sum_i32, int32_t, int64_t)

/* The output seen with the input's shape: stride 0 where the axis was reduced. */
void flow_cpu_reduce_view(const flow_tensor *out, const flow_tensor *in, const bool *mask,
                          flow_tensor *view) {
  memset(view, 0, sizeof *view);
  view->dtype = out->dtype;
  view->device = out->device;
  view->storage = out->storage;
  view->offset = out->offset;
  view->ndim = in->ndim;
  int64_t s = 1;
  for (int d = in->ndim - 1; d >= 0; d--) {
    view->shape[d] = in->shape[d];
    view->stride[d] = mask[d] ? 0 : s;
    if (!mask[d]) s *= in->shape[d];
  }
}

int flow_cpu_sum(flow_tensor *out, const flow_tensor *in, const bool *mask) {
  static const flow_iter_fn fns[FLOW_NDTYPES] = {[FLOW_F32] = sum_f32, [FLOW_F64] = sum_f64,
                                                  [FLOW_I64] = sum_i64, [FLOW_I32] = sum_i32};
  if (!fns[in->dtype]) return flow_error_set("no CPU sum for dtype %s", flow_dtype_name(in->dtype));
  flow_cpu_fill(out, 0);
  flow_tensor view;
  flow_cpu_reduce_view(out, in, mask, &view);
  flow_iter it;
  flow_tensor *ops[2] = {&view, (flow_tensor *)in};
  flow_iter_init(&it, ops, 2);
  flow_iter_run(&it, fns[in->dtype], NULL);
  return 0;
}
