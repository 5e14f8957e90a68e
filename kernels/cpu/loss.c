/* Cross-entropy from logits: fused log-softmax + NLL forward and fused backward, float32 and
 * float64. The kernels after `#else` are written once against `real`: this file includes itself
 * once per dtype (Torch7's THGenerate pattern). */
#ifndef real

#include <stdlib.h>
#include <tgmath.h>

#include "iter.h"
#include "nn.h"

/* One cross-entropy pass over rows [lo, hi) (iter.h's flow_cpu_parallel): rows are independent. */
typedef struct ce_job {
  void *out;                 /* forward: per-row losses (unless reduce); backward: dlogits */
  void *lse;                 /* forward writes it, backward reads it */
  const void *x;             /* logits [rows, C] */
  const int64_t *t;
  const void *g, *glse;      /* backward: per-row gradient (NULL: `scale`), gradient of lse */
  double scale;
  int64_t C, ignore_index;
  bool reduce;
  size_t row_bytes;          /* forward: a scratch row of C exps per part, then each row's loss */
  char *scratch;
  double *losses;
} ce_job;

#define FLOW_GENERIC_FILE "loss.c"
#include "generic.h"

/* Every target is ignore_index or in [0, C); counts the others. */
static int check_targets(const int64_t *t, int64_t rows, int64_t C, int64_t ignore_index, int64_t *count) {
  *count = 0;
  for (int64_t r = 0; r < rows; r++) {
    if (t[r] == ignore_index) continue;
    if (t[r] < 0 || t[r] >= C)
      return flow_error_set("cross_entropy: target %lld is out of range for %lld classes (expected 0 <= "
                            "target < %lld, or ignore_index %lld)", (long long)t[r], (long long)C,
                            (long long)C, (long long)ignore_index);
    (*count)++;
  }
  return 0;
}

int flow_cpu_cross_entropy_forward(flow_tensor *loss, flow_tensor *lse, const flow_tensor *logits,
                                   const flow_tensor *target, int64_t ignore_index, bool reduce, bool mean) {
  flow_tensor *tx, *tt;
  const void *x = flow_cpu_dense(logits, &tx);
  const int64_t *t = x ? flow_cpu_dense(target, &tt) : NULL;
  if (!t) { flow_tensor_decref(tx); return -1; }
  int64_t C = logits->shape[logits->ndim - 1], rows = flow_tensor_numel(target), count;
  int rc = check_targets(t, rows, C, ignore_index, &count);
  int threads = flow_cpu_threads(rows * C, FLOW_GRAIN_COSTLY);
  /* scratch: a row of exps per thread (whole cache lines, which keeps the doubles after them
   * aligned), then each row's loss, summed in row order after the rows */
  size_t row_bytes = ((size_t)(C ? C : 1) * flow_dtype_size(logits->dtype) + 63) / 64 * 64;
  char *scratch = rc == 0 ? malloc(row_bytes * (size_t)threads + (size_t)rows * sizeof(double)) : NULL;
  if (rc == 0 && !scratch) rc = flow_error_set("cross_entropy: out of memory");
  if (rc == 0) {
    ce_job job = {.out = flow_tensor_data(loss), .lse = flow_tensor_data(lse), .x = x, .t = t, .C = C,
                  .ignore_index = ignore_index, .reduce = reduce, .row_bytes = row_bytes, .scratch = scratch,
                  .losses = (double *)(scratch + row_bytes * (size_t)threads)};
    flow_cpu_parallel(threads, rows, 1, logits->dtype == FLOW_F32 ? cross_entropy_forward_f32 : cross_entropy_forward_f64,
                      &job);
    /* summed in double: a mean over many rows should not lose digits in float32 */
    double total = 0;
    for (int64_t r = 0; r < rows; r++) total += job.losses[r];
    if (reduce) flow_dtype_store(loss->dtype, flow_tensor_data(loss), mean ? total / (double)count : total);
  }
  free(scratch);
  flow_tensor_decref(tx);
  flow_tensor_decref(tt);
  return rc;
}

int flow_cpu_cross_entropy_backward(flow_tensor *dlogits, const flow_tensor *logits, const flow_tensor *target,
                                    const flow_tensor *lse, const flow_tensor *g, const flow_tensor *glse,
                                    int64_t ignore_index, bool reduce, bool mean) {
  flow_tensor *tmp[5] = {NULL, NULL, NULL, NULL, NULL};
  const void *x = flow_cpu_dense(logits, &tmp[0]);
  const int64_t *t = x ? flow_cpu_dense(target, &tmp[1]) : NULL;
  const void *l = t ? flow_cpu_dense(lse, &tmp[2]) : NULL;
  const void *gp = l ? flow_cpu_dense(g, &tmp[3]) : NULL;
  const void *gl = gp ? flow_cpu_dense(glse, &tmp[4]) : NULL;
  int rc = gl ? 0 : -1;
  int64_t C = logits->shape[logits->ndim - 1], rows = flow_tensor_numel(target), count = 0;
  if (rc == 0 && mean) rc = check_targets(t, rows, C, ignore_index, &count);
  if (rc == 0) {
    /* per-row gradient scale: g[r] (none), g (sum), g / count (mean) */
    double scale = reduce ? flow_dtype_load(g->dtype, gp) / (mean ? (double)count : 1.0) : 0;
    ce_job job = {.out = flow_tensor_data(dlogits), .lse = (void *)l, .x = x, .t = t, .g = reduce ? NULL : gp,
                  .glse = gl, .scale = scale, .C = C, .ignore_index = ignore_index};
    flow_cpu_parallel(flow_cpu_threads(rows * C, FLOW_GRAIN_COSTLY), rows, 1,
                      logits->dtype == FLOW_F32 ? cross_entropy_backward_f32 : cross_entropy_backward_f64, &job);
  }
  for (int i = 0; i < 5; i++) flow_tensor_decref(tmp[i]);
  return rc;
}

#else

/* Per row: lse = m + log sum exp(x - m) (m = max x),  loss = lse - x[target]; ignored rows lose 0.
 * Writes per-row losses unless reduce, and each row's loss in double into job->losses. */
static void GEN(cross_entropy_forward)(int64_t lo, int64_t hi, int part, void *vjob) {
  const ce_job *j = vjob;
  const real *x = j->x;
  real *lse = j->lse, *loss = j->out, *row = (real *)(j->scratch + (size_t)part * j->row_bytes);
  int64_t C = j->C;
  for (int64_t r = lo; r < hi; r++) {
    const real *xr = x + r * C;
    real m = GEN(flow_cpu_row_max)(xr, C);
    lse[r] = m + log(GEN(flow_cpu_exp_shift)(row, xr, C, m));
    real l = j->t[r] == j->ignore_index ? 0 : lse[r] - xr[j->t[r]];
    if (!j->reduce) loss[r] = l;
    j->losses[r] = l;
  }
}

/* dlogits = (exp(x - lse) - onehot(target)) * scale_r + exp(x - lse) * glse_r, with scale_r = g[r]
 * when g is given, else `scale`, and 0 for rows with an ignored target. */
static void GEN(cross_entropy_backward)(int64_t lo, int64_t hi, int part, void *vjob) {
  const ce_job *j = vjob;
  const real *x = j->x, *lse = j->lse, *g = j->g, *glse = j->glse;
  real *dx = j->out, scale = (real)j->scale;
  int64_t C = j->C;
  for (int64_t r = lo; r < hi; r++) {
    const real *xr = x + r * C;
    real *dr = dx + r * C;
    bool ignored = j->t[r] == j->ignore_index;
    real sr = ignored ? 0 : g ? g[r] : scale, sp = sr + glse[r];
    GEN(flow_cpu_exp_shift)(dr, xr, C, lse[r]);
    for (int64_t k = 0; k < C; k++) dr[k] *= sp;
    if (!ignored) dr[j->t[r]] -= sr;
  }
}

#endif
