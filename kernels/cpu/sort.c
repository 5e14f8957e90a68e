/* Sort and top-k along one axis: each line of the axis is merge-sorted (stable) by value, NaN
 * counting as the largest value, as torch; the first k of the order are written out. */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* a comes strictly before b: ascending a < b, descending a > b, with NaN above every number */
#define BEFORE_ASC(a, b) ((a) < (b) || ((b) != (b) && (a) == (a)))
#define BEFORE_DESC(a, b) ((a) > (b) || ((a) != (a) && (b) == (b)))

/* Over x as [outer, K, inner] (contiguous): for each line, the permutation ix[0..K) of its
 * positions in stable sorted order (a bottom-up merge sort through tmp), then the first k values
 * and positions into vals/idx laid out as [outer, k, inner]. */
#define DEF_SORT(T, NAME)                                                                         \
  static void sort_##NAME(void *vvals, int64_t *idx, const void *vx, int64_t outer, int64_t K,     \
                          int64_t inner, int64_t k, bool desc, T *line, int64_t *ix, int64_t *tmp) { \
    T *vals = vvals;                                                                              \
    const T *x = vx;                                                                              \
    for (int64_t o = 0; o < outer; o++)                                                           \
      for (int64_t j = 0; j < inner; j++) {                                                       \
        for (int64_t r = 0; r < K; r++) { line[r] = x[(o * K + r) * inner + j]; ix[r] = r; }      \
        int64_t *src = ix, *dst = tmp;                                                            \
        for (int64_t w = 1; w < K; w *= 2) {                                                      \
          for (int64_t lo = 0; lo < K; lo += 2 * w) {                                             \
            int64_t mid = lo + w < K ? lo + w : K, hi = lo + 2 * w < K ? lo + 2 * w : K;          \
            int64_t a = lo, b = mid, d = lo;                                                      \
            while (a < mid && b < hi) {                                                           \
              T va = line[src[a]], vb = line[src[b]];                                             \
              bool take_b = desc ? BEFORE_DESC(vb, va) : BEFORE_ASC(vb, va);                      \
              dst[d++] = take_b ? src[b++] : src[a++];                                            \
            }                                                                                     \
            while (a < mid) dst[d++] = src[a++];                                                  \
            while (b < hi) dst[d++] = src[b++];                                                   \
          }                                                                                       \
          int64_t *s = src; src = dst; dst = s;                                                   \
        }                                                                                         \
        for (int64_t r = 0; r < k; r++) {                                                         \
          int64_t at = (o * k + r) * inner + j;                                                   \
          vals[at] = line[src[r]];                                                                \
          idx[at] = src[r];                                                                       \
        }                                                                                         \
      }                                                                                           \
  }
DEF_SORT(float, f32)
DEF_SORT(double, f64)
DEF_SORT(int64_t, i64)
DEF_SORT(int32_t, i32)
DEF_SORT(uint8_t, u8)

int flow_cpu_sort(flow_tensor *values, flow_tensor *indices, const flow_tensor *in, int axis, int64_t k,
                  bool descending) {
  int64_t outer = 1, K = 1, inner = 1;
  if (axis >= 0) {
    K = in->shape[axis];
    for (int d = 0; d < axis; d++) outer *= in->shape[d];
    for (int d = axis + 1; d < in->ndim; d++) inner *= in->shape[d];
  }
  if (outer * inner == 0 || k == 0) return 0;
  size_t es = flow_dtype_size(in->dtype);
  flow_tensor *x = NULL;
  if (!flow_tensor_is_contiguous(in)) {
    if (!(x = flow_tensor_new(in->dtype, in->device, in->ndim, in->shape))) return -1;
    flow_cpu_copy(x, in);
  }
  char *line = malloc((size_t)K * es);
  int64_t *ix = malloc((size_t)K * 2 * sizeof(int64_t));
  int rc = 0;
  if (!line || !ix) rc = flow_error_set("sort: out of memory for a line of %lld elements", (long long)K);
  const void *xd = flow_tensor_data(x ? x : in);
  void *vd = flow_tensor_data(values);
  int64_t *id = flow_tensor_data(indices);
  if (rc == 0) switch (in->dtype) {
  case FLOW_F32: sort_f32(vd, id, xd, outer, K, inner, k, descending, (float *)line, ix, ix + K); break;
  case FLOW_F64: sort_f64(vd, id, xd, outer, K, inner, k, descending, (double *)line, ix, ix + K); break;
  case FLOW_I64: sort_i64(vd, id, xd, outer, K, inner, k, descending, (int64_t *)line, ix, ix + K); break;
  case FLOW_I32: sort_i32(vd, id, xd, outer, K, inner, k, descending, (int32_t *)line, ix, ix + K); break;
  case FLOW_U8: case FLOW_BOOL: sort_u8(vd, id, xd, outer, K, inner, k, descending, (uint8_t *)line, ix, ix + K); break;
  default: rc = flow_error_set("sort: no CPU kernel for dtype %s", flow_dtype_name(in->dtype));
  }
  free(line);
  free(ix);
  flow_tensor_decref(x);
  return rc;
}
