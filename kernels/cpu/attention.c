/* Scaled dot-product attention, fused forward and backward, float32 and float64. One (batch, head)
 * at a time, a block of query rows at a time: the scores live only in a [rows x Tk] scratch, the
 * [T, T] mask is never built (causal rows just stop at the diagonal), and the backward recomputes
 * the probabilities from q, k and the saved log-sum-exp. The per-head products go to GEMM.
 * The kernels after `#else` are written once against `real`; this file includes itself once per
 * dtype (Torch7's THGenerate pattern). */
#ifndef real

#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "nn.h"

/* Query rows per block: the scratch is BLOCK x Tk, and a causal block needs keys up to its last row. */
#define BLOCK 64

/* One head's [rows, cols] matrix inside a [B, H, rows, cols] tensor: row-major with leading
 * dimension ld, starting `off` elements into the data; per (b, h) add b * sb + h * sh. */
typedef struct head {
  const flow_tensor *t;
  flow_tensor *tmp;   /* dense copy when the last axis is not unit-stride */
  char *data;
  int64_t sb, sh, ld;
} head;

static int head_init(head *m, const flow_tensor *t) {
  m->t = t;
  m->tmp = NULL;
  int64_t rows = t->shape[2], cols = t->shape[3];
  bool ok = (t->stride[3] == 1 || cols == 1) && (rows == 1 || t->stride[2] >= cols);
  if (!ok) {
    if (!flow_cpu_dense(t, &m->tmp)) return -1;
    t = m->tmp;
  }
  m->data = flow_tensor_data(t);
  m->sb = t->stride[0];
  m->sh = t->stride[1];
  m->ld = rows == 1 ? (cols > 1 ? cols : 1) : t->stride[2];
  if (m->ld < 1) m->ld = 1;
  return 0;
}

static void *head_at(const head *m, int64_t b, int64_t h) {
  return m->data + (b * m->sb + h * m->sh) * (int64_t)flow_dtype_size(m->t->dtype);
}

static void heads_free(head *m, int n) {
  for (int i = 0; i < n; i++) flow_tensor_decref(m[i].tmp);
}

/* Keys visible to the block of query rows [r0, r0 + br): all of them, or up to the block's last row. */
static int64_t keys_for(int64_t r0, int64_t br, int64_t Tk, bool causal) { return causal ? r0 + br : Tk; }

static const char OP[] = "scaled_dot_product_attention";

#define FLOW_GENERIC_FILE "attention.c"
#include "generic.h"

/* Sizes of one call, from q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv]. */
typedef struct dims { int64_t B, H, Tq, Tk, D, Dv; } dims;

static dims dims_of(const flow_tensor *q, const flow_tensor *v) {
  return (dims){q->shape[0], q->shape[1], q->shape[2], v->shape[2], q->shape[3], v->shape[3]};
}

int flow_cpu_attention_forward(flow_tensor *o, flow_tensor *lse, const flow_tensor *q, const flow_tensor *k,
                               const flow_tensor *v, double scale, bool causal) {
  head m[3];
  int n = 0;
  const flow_tensor *in[3] = {q, k, v};
  for (; n < 3; n++)
    if (head_init(&m[n], in[n]) != 0) { heads_free(m, n); return -1; }
  dims d = dims_of(q, v);
  size_t es = flow_dtype_size(q->dtype);
  void *scratch = malloc((size_t)(BLOCK * d.Tk) * es);
  int rc = scratch ? 0 : flow_error_set("scaled_dot_product_attention: out of memory for the score scratch");
  for (int64_t b = 0; rc == 0 && b < d.B; b++)
    for (int64_t h = 0; rc == 0 && h < d.H; h++) {
      int64_t bh = b * d.H + h;
      char *op = (char *)flow_tensor_data(o) + bh * d.Tq * d.Dv * (int64_t)es;
      char *lp = (char *)flow_tensor_data(lse) + bh * d.Tq * (int64_t)es;
      if (q->dtype == FLOW_F32)
        rc = attention_forward_f32((float *)op, (float *)lp, head_at(&m[0], b, h), m[0].ld, head_at(&m[1], b, h),
                              m[1].ld, head_at(&m[2], b, h), m[2].ld, scratch, d.Tq, d.Tk, d.D, d.Dv,
                              (float)scale, causal);
      else
        rc = attention_forward_f64((double *)op, (double *)lp, head_at(&m[0], b, h), m[0].ld, head_at(&m[1], b, h),
                              m[1].ld, head_at(&m[2], b, h), m[2].ld, scratch, d.Tq, d.Tk, d.D, d.Dv, scale,
                              causal);
    }
  free(scratch);
  heads_free(m, 3);
  return rc;
}

int flow_cpu_attention_backward(flow_tensor *dq, flow_tensor *dk, flow_tensor *dv, const flow_tensor *q,
                                const flow_tensor *k, const flow_tensor *v, const flow_tensor *o,
                                const flow_tensor *lse, const flow_tensor *dout, const flow_tensor *dlse,
                                double scale, bool causal) {
  head m[5];
  int n = 0;
  const flow_tensor *in[5] = {q, k, v, o, dout};
  for (; n < 5; n++)
    if (head_init(&m[n], in[n]) != 0) { heads_free(m, n); return -1; }
  flow_tensor *tl, *tdl = NULL;
  const char *lp = flow_cpu_dense(lse, &tl), *dlp = lp ? flow_cpu_dense(dlse, &tdl) : NULL;
  if (!dlp) { flow_tensor_decref(tl); heads_free(m, 5); return -1; }
  dims d = dims_of(q, v);
  size_t es = flow_dtype_size(q->dtype);
  void *scratch = malloc((size_t)(2 * BLOCK * d.Tk) * es);
  int rc = scratch ? 0 : flow_error_set("scaled_dot_product_attention: out of memory for the score scratch");
  for (int64_t b = 0; rc == 0 && b < d.B; b++)
    for (int64_t h = 0; rc == 0 && h < d.H; h++) {
      int64_t bh = b * d.H + h;
      char *pq = (char *)flow_tensor_data(dq) + bh * d.Tq * d.D * (int64_t)es;
      char *pk = (char *)flow_tensor_data(dk) + bh * d.Tk * d.D * (int64_t)es;
      char *pv = (char *)flow_tensor_data(dv) + bh * d.Tk * d.Dv * (int64_t)es;
      const char *pl = lp + bh * d.Tq * (int64_t)es, *pdl = dlp + bh * d.Tq * (int64_t)es;
      if (q->dtype == FLOW_F32)
        rc = attention_backward_f32((float *)pq, (float *)pk, (float *)pv, head_at(&m[0], b, h), m[0].ld,
                               head_at(&m[1], b, h), m[1].ld, head_at(&m[2], b, h), m[2].ld, head_at(&m[3], b, h),
                               m[3].ld, (const float *)pl, head_at(&m[4], b, h), m[4].ld, (const float *)pdl,
                               scratch, d.Tq, d.Tk, d.D, d.Dv, (float)scale, causal);
      else
        rc = attention_backward_f64((double *)pq, (double *)pk, (double *)pv, head_at(&m[0], b, h), m[0].ld,
                               head_at(&m[1], b, h), m[1].ld, head_at(&m[2], b, h), m[2].ld, head_at(&m[3], b, h),
                               m[3].ld, (const double *)pl, head_at(&m[4], b, h), m[4].ld, (const double *)pdl,
                               scratch, d.Tq, d.Tk, d.D, d.Dv, scale, causal);
    }
  free(scratch);
  flow_tensor_decref(tl);
  flow_tensor_decref(tdl);
  heads_free(m, 5);
  return rc;
}

#else

/* One head: for each block of query rows,
 *   S = scale * Q K^T,  row i sees keys j < lim(i) (lim = i + 1 when causal, else Tk),
 *   lse_i = log sum_j exp S_ij,  P = exp(S - lse) (0 beyond lim),  O = P V.
 * o [Tq, Dv] and lse [Tq] dense; q, k, v row-major with leading dimensions lq, lk, lv.
 * Tk >= 1 and D >= 1 (the op checks), so every row sees at least one key. */
static int GEN(attention_forward)(real *o, real *lse, const real *q, int64_t lq, const real *k, int64_t lk,
                                  const real *v, int64_t lv, real *S, int64_t Tq, int64_t Tk, int64_t D,
                                  int64_t Dv, real scale, bool causal) {
  for (int64_t r0 = 0; r0 < Tq; r0 += BLOCK) {
    int64_t br = Tq - r0 < BLOCK ? Tq - r0 : BLOCK, nk = keys_for(r0, br, Tk, causal);
    if (GEN(flow_cpu_gemm)(OP, false, true, br, nk, D, scale, q + r0 * lq, lq, k, lk, 0, S, nk)) return -1;
    for (int64_t i = 0; i < br; i++) {
      real *s = S + i * nk;
      int64_t lim = causal ? r0 + i + 1 : nk;
      real m = GEN(flow_cpu_row_max)(s, lim), sum = GEN(flow_cpu_exp_shift)(s, s, lim, m);
      for (int64_t j = lim; j < nk; j++) s[j] = 0;
      real r = 1 / sum;
      for (int64_t j = 0; j < lim; j++) s[j] *= r;
      lse[r0 + i] = m + log(sum);
    }
    if (Dv > 0 && GEN(flow_cpu_gemm)(OP, false, false, br, Dv, nk, 1, S, nk, v, lv, 0, o + r0 * Dv, Dv)) return -1;
  }
  return 0;
}

/* One head, with P recomputed per block from q, k and lse, Di = sum_d dO_id O_id, and dlse the
 * gradient of lse (d lse_i / d S_ij = P_ij):
 *   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - Di + dlse_i),  dQ = scale * dS K,  dK += scale * dS^T Q.
 * dq [Tq, D], dk [Tk, D], dv [Tk, Dv] dense; S holds two [BLOCK, Tk] scratch matrices. */
static int GEN(attention_backward)(real *dq, real *dk, real *dv, const real *q, int64_t lq, const real *k,
                                   int64_t lk, const real *v, int64_t lv, const real *o, int64_t lo,
                                   const real *lse, const real *dout, int64_t ld, const real *dlse, real *S,
                                   int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, real scale, bool causal) {
  real *P = S, *dP = S + BLOCK * Tk;
  memset(dk, 0, (size_t)(Tk * D) * sizeof(real));
  memset(dv, 0, (size_t)(Tk * Dv) * sizeof(real));
  for (int64_t r0 = 0; r0 < Tq; r0 += BLOCK) {
    int64_t br = Tq - r0 < BLOCK ? Tq - r0 : BLOCK, nk = keys_for(r0, br, Tk, causal);
    const real *qb = q + r0 * lq, *db = dout + r0 * ld;
    if (GEN(flow_cpu_gemm)(OP, false, true, br, nk, D, scale, qb, lq, k, lk, 0, P, nk)) return -1;
    for (int64_t i = 0; i < br; i++) {
      real *p = P + i * nk;
      int64_t lim = causal ? r0 + i + 1 : nk;
      GEN(flow_cpu_exp_shift)(p, p, lim, lse[r0 + i]);
      for (int64_t j = lim; j < nk; j++) p[j] = 0;
    }
    if (Dv > 0) {
      if (GEN(flow_cpu_gemm)(OP, true, false, nk, Dv, br, 1, P, nk, db, ld, 1, dv, Dv)) return -1;
      if (GEN(flow_cpu_gemm)(OP, false, true, br, nk, Dv, 1, db, ld, v, lv, 0, dP, nk)) return -1;
    } else {
      memset(dP, 0, (size_t)(br * nk) * sizeof(real));
    }
    for (int64_t i = 0; i < br; i++) {
      const real *oi = o + (r0 + i) * lo, *gi = db + i * ld;
      real Di = -dlse[r0 + i], *p = P + i * nk, *dp = dP + i * nk;
      for (int64_t c = 0; c < Dv; c++) Di += gi[c] * oi[c];
      for (int64_t j = 0; j < nk; j++) dp[j] = p[j] * (dp[j] - Di);
    }
    if (GEN(flow_cpu_gemm)(OP, false, false, br, D, nk, scale, dP, nk, k, lk, 0, dq + r0 * D, D)) return -1;
    if (GEN(flow_cpu_gemm)(OP, true, false, nk, D, br, scale, dP, nk, qb, lq, 1, dk, D)) return -1;
  }
  return 0;
}

#endif
