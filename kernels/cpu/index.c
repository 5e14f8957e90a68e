/* Gather, scatter-add and embedding on the CPU. The walk over the index tensor keeps one element
 * offset per operand and updates it as an odometer, so any strides (and stride-0 broadcast
 * indices, which index_select and embedding's backward use) cost the same. */
#include "index.h"

#include <string.h>

#include "../../core/error.h"
#include "cpu.h"
#include "iter.h"

enum { OP_A, OP_B, OP_IDX, NOPS };

typedef struct walk {
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];
  int64_t stride[NOPS][FLOW_MAX_DIMS];   /* elements */
  int64_t pos[FLOW_MAX_DIMS];
  int64_t off[NOPS];
} walk;

/* The walk covers idx's shape. The indexed operand (OP_A or OP_B, or -1 for none) gets stride 0
 * on axis: its coordinate there comes from the index value, not from the position. */
static void walk_init(walk *w, const flow_tensor *a, const flow_tensor *b, const flow_tensor *idx,
                      int indexed, int axis) {
  memset(w, 0, sizeof *w);
  w->ndim = idx->ndim;
  const flow_tensor *ops[NOPS] = {a, b, idx};
  for (int d = 0; d < w->ndim; d++) {
    w->shape[d] = idx->shape[d];
    for (int k = 0; k < NOPS; k++) w->stride[k][d] = ops[k] && !(k == indexed && d == axis) ? ops[k]->stride[d] : 0;
  }
}

static void walk_next(walk *w) {
  for (int d = w->ndim - 1; d >= 0; d--) {
    if (++w->pos[d] < w->shape[d]) {
      for (int k = 0; k < NOPS; k++) w->off[k] += w->stride[k][d];
      return;
    }
    w->pos[d] = 0;
    for (int k = 0; k < NOPS; k++) w->off[k] -= (w->shape[d] - 1) * w->stride[k][d];
  }
}

static int out_of_range(int64_t i, int64_t size, int axis) {
  return flow_error_set("index %lld out of range [0, %lld) on axis %d", (long long)i, (long long)size, axis);
}

int flow_cpu_gather(flow_tensor *out, const flow_tensor *t, const flow_tensor *idx, int axis) {
  walk w;
  walk_init(&w, out, t, idx, OP_B, axis);
  size_t es = flow_dtype_size(t->dtype);
  char *po = flow_tensor_data(out);
  const char *pt = flow_tensor_data(t);
  const int64_t *pi = flow_tensor_data(idx);
  int64_t n = flow_tensor_numel(idx), size = t->shape[axis];
  for (int64_t e = 0; e < n; e++, walk_next(&w)) {
    int64_t i = pi[w.off[OP_IDX]];
    if (i < 0 || i >= size) return out_of_range(i, size, axis);
    memcpy(po + w.off[OP_A] * (int64_t)es, pt + (w.off[OP_B] + i * t->stride[axis]) * (int64_t)es, es);
  }
  return 0;
}

#define SCATTER_ADD(T)                                                                  \
  for (int64_t e = 0; e < n; e++, walk_next(&w)) {                                      \
    int64_t i = pi[w.off[OP_IDX]];                                                      \
    if (i < 0 || i >= size) return out_of_range(i, size, axis);                         \
    ((T *)po)[w.off[OP_A] + i * out->stride[axis]] += ((const T *)ps)[w.off[OP_B]];     \
  }                                                                                     \
  return 0;

/* o[0..n) += s[0..n), over a multiple of 32 first (-O2's vectoriser takes only loops without a
 * scalar epilogue) */
#define ADD_ROW(T)                                                                                  \
  FLOW_CPU_DISPATCH static void add_row_##T(T *o, const T *s, int64_t n) {                          \
    int64_t m = n & ~(int64_t)31, j = 0;                                                            \
    _Pragma("GCC ivdep") for (; j < m; j++) o[j] += s[j];                                           \
    for (; j < n; j++) o[j] += s[j];                                                                \
  }
ADD_ROW(float)
ADD_ROW(double)

/* Whole rows: out[idx[r, 0], :] += src[r, :] for the rows r of a 2-D src, with the index of each
 * row broadcast along it (stride 0: embedding's backward, index_add). Rows land in order, as in
 * the general walk, so the sums are the same bits. Returns 1 when it did the work, 0 when the
 * layout is not that one, -1 on an index out of range. */
static int scatter_add_rows(flow_tensor *out, const flow_tensor *idx, const flow_tensor *src, int axis) {
  if (axis != 0 || idx->ndim != 2 || src->ndim != 2 || out->ndim != 2 || idx->stride[1] != 0 ||
      src->stride[1] != 1 || out->stride[1] != 1 || src->shape[1] != idx->shape[1] ||
      out->shape[1] != idx->shape[1] || (out->dtype != FLOW_F32 && out->dtype != FLOW_F64))
    return 0;
  const int64_t *pi = flow_tensor_data(idx);
  int64_t rows = idx->shape[0], n = idx->shape[1], size = out->shape[0];
  for (int64_t r = 0; r < rows; r++) {
    int64_t i = pi[r * idx->stride[0]];
    if (i < 0 || i >= size) return out_of_range(i, size, axis);
    if (out->dtype == FLOW_F32)
      add_row_float((float *)flow_tensor_data(out) + i * out->stride[0], (const float *)flow_tensor_data(src) + r * src->stride[0], n);
    else
      add_row_double((double *)flow_tensor_data(out) + i * out->stride[0], (const double *)flow_tensor_data(src) + r * src->stride[0], n);
  }
  return 1;
}

int flow_cpu_scatter_add(flow_tensor *out, const flow_tensor *idx, const flow_tensor *src, int axis) {
  int rows = scatter_add_rows(out, idx, src, axis);
  if (rows) return rows < 0 ? -1 : 0;
  walk w;
  walk_init(&w, out, src, idx, OP_A, axis);
  char *po = flow_tensor_data(out);
  const char *ps = flow_tensor_data(src);
  const int64_t *pi = flow_tensor_data(idx);
  int64_t n = flow_tensor_numel(idx), size = out->shape[axis];
  switch (out->dtype) {
  case FLOW_F32: SCATTER_ADD(float)
  case FLOW_F64: SCATTER_ADD(double)
  case FLOW_I64: SCATTER_ADD(int64_t)
  case FLOW_I32: SCATTER_ADD(int32_t)
  default: return flow_error_set("no kernel for dtype %s", flow_dtype_name(out->dtype));
  }
}

/* out[e] = weight[ids[e]] for the ids e in [lo, hi) (ids contiguous here, already checked) */
typedef struct embed_job {
  char *out;
  const char *w;
  const int64_t *ids;
  int64_t dim, stride0, stride1, esize;
} embed_job;

static void embed_rows(int64_t lo, int64_t hi, int part, void *vjob) {
  const embed_job *j = vjob;
  for (int64_t e = lo; e < hi; e++) {
    const char *row = j->w + j->ids[e] * j->stride0 * j->esize;
    char *dst = j->out + e * j->dim * j->esize;
    if (j->stride1 == 1) memcpy(dst, row, (size_t)(j->dim * j->esize));
    else
      for (int64_t d = 0; d < j->dim; d++)
        memcpy(dst + d * j->esize, row + d * j->stride1 * j->esize, (size_t)j->esize);
  }
}

/* Contiguous ids (the usual batch of tokens) are checked first, then copied on several threads
 * when there are many rows; other layouts walk the ids on one thread. */
int flow_cpu_embedding(flow_tensor *out, const flow_tensor *ids, const flow_tensor *weight) {
  int64_t rows = weight->shape[0], n = flow_tensor_numel(ids);
  embed_job job = {flow_tensor_data(out), flow_tensor_data(weight), flow_tensor_data(ids), weight->shape[1],
                   weight->stride[0], weight->stride[1], (int64_t)flow_dtype_size(weight->dtype)};
  walk w;
  walk_init(&w, NULL, NULL, ids, -1, -1);
  bool dense_ids = flow_tensor_is_contiguous(ids);
  for (int64_t e = 0; e < n; e++, walk_next(&w)) {
    int64_t i = job.ids[w.off[OP_IDX]];
    if (i < 0 || i >= rows) return flow_error_set("index %lld out of range [0, %lld) (the rows of weight)",
                                                  (long long)i, (long long)rows);
    if (!dense_ids) { /* one row at a time, as the walk finds it */
      embed_job one = job;
      one.out += e * job.dim * job.esize;
      one.ids = &i;
      embed_rows(0, 1, 0, &one);
    }
  }
  if (dense_ids) flow_cpu_parallel(flow_cpu_threads(n * job.dim, FLOW_GRAIN_CHEAP), n, 1, embed_rows, &job);
  return 0;
}
