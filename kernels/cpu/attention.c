/* Scaled dot-product attention, fused forward and backward, float32 and float64. A block of query
 * rows at a time, for many (batch, head) pairs at once: the scores live only in a [heads, rows, Tk]
 * scratch, the [T, T] mask is never built (causal rows just stop at the diagonal), and the backward
 * recomputes the probabilities from q, k and the saved log-sum-exp. Each product is one batched
 * GEMM over the heads of a group of batch items (on oneDNN for float32): a step makes a few large
 * calls instead of one small GEMM per head and block. bfloat16 tensors, and float32 ones under bf16
 * autocast, run attention_bf16.c's kernels on AVX512-BF16 (without it, bfloat16 tensors run here on
 * float32 copies, and autocast runs float32).
 * The kernels after `#else` are written once against `real`; this file includes itself once per
 * dtype (Torch7's THGenerate pattern). */
#ifndef real

#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <tgmath.h>

#include "../registry.h"
#include "cpu.h"
#include "iter.h"
#include "nn.h"
#include "onednn.h"

/* Query rows per block: the scratch is heads x BLOCK x Tk, and a causal block needs keys up to its
 * last row. */
#define BLOCK 64
/* Bytes of score scratch per batched call at most: batch items are grouped to fit. */
#define SCRATCH_BYTES ((int64_t)8 << 20)

/* The [rows, cols] matrices of every (b, h) of a [B, H, rows, cols] operand: row-major with leading
 * dimension ld, head (b, h) starting at data + (b * sb + h * sh) elements. */
typedef struct heads {
  char *data;
  int64_t sb, sh, ld;
  size_t es;
} heads;

/* The view of tensor t, or of a dense copy (*tmp) when its last axis is not unit-stride. */
static int heads_of(heads *m, const flow_tensor *t, flow_tensor **tmp) {
  *tmp = NULL;
  int64_t rows = t->shape[2], cols = t->shape[3];
  bool ok = (t->stride[3] == 1 || cols == 1) && (rows == 1 || t->stride[2] >= cols);
  if (!ok) {
    if (!flow_cpu_dense(t, tmp)) return -1;
    t = *tmp;
  }
  int64_t ld = rows == 1 ? (cols > 1 ? cols : 1) : t->stride[2];
  *m = (heads){flow_tensor_data(t), t->stride[0], t->stride[1], ld < 1 ? 1 : ld, flow_dtype_size(t->dtype)};
  return 0;
}

/* A dense [B, H, rows, cols] buffer as heads. */
static heads dense_heads(void *data, int64_t H, int64_t rows, int64_t cols, size_t es) {
  return (heads){data, H * rows * cols, rows * cols, cols, es};
}

/* The same heads from batch item b0 and row r0 on. */
static heads heads_at(heads m, int64_t b0, int64_t r0) {
  m.data += (b0 * m.sb + r0 * m.ld) * (int64_t)m.es;
  return m;
}

/* The [rows, cols] operand op(m) of a batched GEMM over nb items and H heads, transposed when t. */
static flow_onednn_mat heads_mat(const heads *m, int64_t nb, int64_t H, int64_t rows, int64_t cols, bool t) {
  return (flow_onednn_mat){4, {nb, H, rows, cols}, {m->sb, m->sh, t ? 1 : m->ld, t ? m->ld : 1}, m->data};
}

/* C[b, h] = alpha op(A[b, h]) op(B[b, h]) + beta C[b, h] for b < nb, h < H: C [M, N], op(A) [M, K],
 * op(B) [K, N], op transposing when ta / tb. float32: one batched oneDNN matmul. */
static int heads_gemm_f32(int64_t nb, int64_t H, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const heads *A, const heads *B, float beta, const heads *C) {
  flow_onednn_mat a = heads_mat(A, nb, H, M, K, ta), b = heads_mat(B, nb, H, K, N, tb),
                  c = heads_mat(C, nb, H, M, N, false);
  return flow_onednn_gemm("scaled_dot_product_attention", &a, &b, &c, NULL, alpha, beta);
}

/* float64 (gradchecks): a GEMM per head on OpenBLAS. */
static int heads_gemm_f64(int64_t nb, int64_t H, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                          const heads *A, const heads *B, double beta, const heads *C) {
  for (int64_t b = 0; b < nb; b++)
    for (int64_t h = 0; h < H; h++) {
      const double *pa = (const double *)A->data + b * A->sb + h * A->sh;
      const double *pb = (const double *)B->data + b * B->sb + h * B->sh;
      double *pc = (double *)C->data + b * C->sb + h * C->sh;
      if (flow_cpu_gemm_f64("scaled_dot_product_attention", ta, tb, M, N, K, alpha, pa, A->ld, pb, B->ld, beta, pc,
                            C->ld))
        return -1;
    }
  return 0;
}

/* Keys visible to the block of query rows [r0, r0 + br): all of them, or up to the block's last row. */
static int64_t keys_for(int64_t r0, int64_t br, int64_t Tk, bool causal) { return causal ? r0 + br : Tk; }

/* Sizes of one call, from q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv]. */
typedef struct dims { int64_t B, H, Tq, Tk, D, Dv; } dims;

static dims dims_of(const flow_tensor *q, const flow_tensor *v) {
  return (dims){q->shape[0], q->shape[1], q->shape[2], v->shape[2], q->shape[3], v->shape[3]};
}

/* Batch items per group, so that `mats` score matrices [H, BLOCK, Tk] per item fit the scratch. */
static int64_t group_of(const dims *d, int mats, size_t es) {
  int64_t per = d->H * BLOCK * (d->Tk > 0 ? d->Tk : 1) * mats * (int64_t)es, g = SCRATCH_BYTES / (per > 0 ? per : 1);
  return g < 1 ? 1 : g > d->B ? d->B : g;
}

/* n elements of score scratch, from the tensor allocator: its cache hands back memory already
 * touched, where a fresh malloc of megabytes would page-fault inside every GEMM writing it. */
static flow_tensor *scratch_new(flow_dtype dt, int64_t n) {
  n = n > 0 ? n : 1;
  flow_tensor *t = flow_tensor_new(dt, FLOW_DEVICE_CPU, 1, &n);
  if (!t) flow_error_set("scaled_dot_product_attention: out of memory for the score scratch");
  return t;
}

#define FLOW_GENERIC_FILE "attention.c"
#include "generic.h"

/* One team of threads runs a whole float32 call: each thread its own batch items, with a score
 * scratch of its own, its GEMMs alone beside the others' (flow_onednn_run_alone) and its row loops
 * on itself. A call then makes one parallel region, where a GEMM and a row loop each made one per
 * block (forward and backward gained 1.2-1.3x on 2 threads that way). float64 (OpenBLAS's GEMMs,
 * for gradchecks) runs on one thread. */
static int team_of(const dims *d, flow_dtype dt) {
  if (dt != FLOW_F32 || d->B < 2) return 1;
  int t = flow_cpu_threads(d->B * d->H * d->Tq * (d->Tk + d->D), FLOW_GRAIN_COSTLY);
  return t < d->B ? t : (int)d->B;
}

/* One group of nb batch items from b0 on, with a thread's own score scratch. */
typedef int (*group_fn)(int64_t b0, int64_t nb, void *scratch, void *ctx);

/* Thread me of of's batch items, in groups of G, with its own part of the scratch. 0, or -1 with the
 * error set. */
static int team_part(int me, int of, const dims *d, int64_t G, int64_t n, flow_tensor *st, group_fn fn, void *ctx) {
  size_t es = flow_dtype_size(st->dtype);
  void *scratch = (char *)flow_tensor_data(st) + me * n * (int64_t)es;
  int r = 0;
  for (int64_t b0 = d->B * me / of, end = d->B * (me + 1) / of; r == 0 && b0 < end; b0 += G)
    r = fn(b0, end - b0 < G ? end - b0 : G, scratch, ctx);
  return r;
}

/* The batch items in groups of G, each thread of a team of t taking its own share with its own n
 * elements of scratch (st holds t of them): fn per group. The first error of any thread
 * ends up on the calling thread. A team of one runs on this thread outside any parallel region:
 * inside one (even an inactive `if (0)` one), each GEMM's pieces would open a nested team, and
 * libgomp made new threads for each (a batch of one on 2 threads, or on 1 whose OpenMP default is
 * 2, ran 3x slower). */
static int run_team(int t, const dims *d, int64_t G, int64_t n, flow_tensor *st, group_fn fn, void *ctx) {
  if (t <= 1) return team_part(0, 1, d, G, n, st, fn, ctx);
  bool failed = false;
  char msg[FLOW_ERROR_MAX] = "";
#pragma omp parallel num_threads(t)
  {
    if (team_part(omp_get_thread_num(), omp_get_num_threads(), d, G, n, st, fn, ctx) != 0) {
#pragma omp critical(flow_attention_error)
      if (!failed) {
        failed = true;
        snprintf(msg, sizeof msg, "%s", flow_error_get());
      }
    }
  }
  return failed ? flow_error_set("%s", msg) : 0;
}

/* A call's operands for run_team: forward o, lse, q, k, v; backward dq, dk, dv, q, k, v, o, lse,
 * dout, dlse. */
typedef struct attention_job {
  heads g[10];
  dims d;
  double scale;
  bool causal, f32;
} attention_job;

static int forward_group(int64_t b0, int64_t nb, void *scratch, void *ctx) {
  const attention_job *j = ctx;
  heads g[5];
  for (int i = 0; i < 5; i++) g[i] = heads_at(j->g[i], b0, 0);
  if (j->f32)
    return attention_forward_f32(&g[0], &g[1], &g[2], &g[3], &g[4], scratch, nb, &j->d, (float)j->scale, j->causal);
  return attention_forward_f64(&g[0], &g[1], &g[2], &g[3], &g[4], scratch, nb, &j->d, j->scale, j->causal);
}

static int backward_group(int64_t b0, int64_t nb, void *scratch, void *ctx) {
  const attention_job *j = ctx;
  heads g[10];
  for (int i = 0; i < 10; i++) g[i] = heads_at(j->g[i], b0, 0);
  if (j->f32) return attention_backward_f32(g, scratch, nb, &j->d, (float)j->scale, j->causal);
  return attention_backward_f64(g, scratch, nb, &j->d, j->scale, j->causal);
}

/* Where a call runs: bfloat16 tensors, and float32 ones under bf16 autocast, on AVX512-BF16 in
 * attention_bf16.c; float16, and bfloat16 without AVX512-BF16, on float32 copies (FLOW_KERNEL_F32);
 * the rest here. */
enum { HERE = 0, IN_BF16 = -2 };
static int route_of(const flow_tensor *q) {
  if (q->dtype == FLOW_F16 || (q->dtype == FLOW_BF16 && !flow_onednn_bf16_native())) return FLOW_KERNEL_F32;
  return q->dtype == FLOW_BF16 || (q->dtype == FLOW_F32 && flow_onednn_bf16()) ? IN_BF16 : HERE;
}

int flow_cpu_attention_forward(flow_tensor *o, flow_tensor *lse, const flow_tensor *q, const flow_tensor *k,
                               const flow_tensor *v, double scale, bool causal) {
  int route = route_of(q);
  if (route == FLOW_KERNEL_F32) return route;
  if (route == IN_BF16) return flow_cpu_attention_forward_bf16(o, lse, q, k, v, scale, causal);
  heads m[3] = {{0}};
  flow_tensor *tmp[3] = {NULL};
  const flow_tensor *in[3] = {q, k, v};
  dims d = dims_of(q, v);
  size_t es = flow_dtype_size(q->dtype);
  int t = team_of(&d, q->dtype);
  int64_t G = group_of(&d, 1, es), n = G * d.H * BLOCK * d.Tk;
  flow_tensor *st = scratch_new(q->dtype, t * n);
  int rc = st ? 0 : -1;
  for (int i = 0; rc == 0 && i < 3; i++) rc = heads_of(&m[i], in[i], &tmp[i]);
  attention_job job = {{dense_heads(flow_tensor_data(o), d.H, d.Tq, d.Dv, es),
                        dense_heads(flow_tensor_data(lse), d.H, d.Tq, 1, es), m[0], m[1], m[2]},
                       d, scale, causal, q->dtype == FLOW_F32};
  if (rc == 0) rc = run_team(t, &d, G, n, st, forward_group, &job);
  flow_tensor_decref(st);
  for (int i = 0; i < 3; i++) flow_tensor_decref(tmp[i]);
  return rc;
}

int flow_cpu_attention_backward(flow_tensor *dq, flow_tensor *dk, flow_tensor *dv, const flow_tensor *q,
                                const flow_tensor *k, const flow_tensor *v, const flow_tensor *o,
                                const flow_tensor *lse, const flow_tensor *dout, const flow_tensor *dlse,
                                double scale, bool causal) {
  int route = route_of(q);
  if (route == FLOW_KERNEL_F32) return route;
  if (route == IN_BF16) return flow_cpu_attention_backward_bf16(dq, dk, dv, q, k, v, o, lse, dout, dlse, scale, causal);
  heads m[5] = {{0}};
  flow_tensor *tmp[7] = {NULL};
  const flow_tensor *in[5] = {q, k, v, o, dout};
  dims d = dims_of(q, v);
  size_t es = flow_dtype_size(q->dtype);
  int t = team_of(&d, q->dtype);
  int64_t G = group_of(&d, 2, es), n = 2 * G * d.H * BLOCK * d.Tk;
  flow_tensor *st = scratch_new(q->dtype, t * n);
  int rc = st ? 0 : -1;
  for (int i = 0; rc == 0 && i < 5; i++) rc = heads_of(&m[i], in[i], &tmp[i]);
  const char *lp = rc == 0 ? flow_cpu_dense(lse, &tmp[5]) : NULL, *dlp = lp ? flow_cpu_dense(dlse, &tmp[6]) : NULL;
  if (rc == 0 && !dlp) rc = -1;
  attention_job job = {{dense_heads(flow_tensor_data(dq), d.H, d.Tq, d.D, es),
                        dense_heads(flow_tensor_data(dk), d.H, d.Tk, d.D, es),
                        dense_heads(flow_tensor_data(dv), d.H, d.Tk, d.Dv, es), m[0], m[1], m[2], m[3],
                        dense_heads((void *)lp, d.H, d.Tq, 1, es), m[4], dense_heads((void *)dlp, d.H, d.Tq, 1, es)},
                       d, scale, causal, q->dtype == FLOW_F32};
  if (rc == 0) rc = run_team(t, &d, G, n, st, backward_group, &job);
  flow_tensor_decref(st);
  for (int i = 0; i < 7; i++) flow_tensor_decref(tmp[i]);
  return rc;
}

#else

/* Row i of head (b, h) of m. */
static real *GEN(row)(const heads *m, int64_t b, int64_t h, int64_t i) {
  return (real *)m->data + b * m->sb + h * m->sh + i * m->ld;
}

/* The per-row work of the blocks below, on the CPU's widest vectors (FLOW_CPU_DISPATCH: the loops
 * that call them are OpenMP regions, compiled for the baseline). Loops run over a multiple of 32
 * first: -O2's vectoriser takes only loops without a scalar epilogue. */
#define UPTO32(n) ((n) & ~(int64_t)31)

/* s[0..lim) -> softmax(s[0..lim)), s[lim..nk) = 0 (keys a causal row does not see); returns the
 * row's log-sum-exp. */
FLOW_CPU_DISPATCH static real GEN(prob_row)(real *s, int64_t lim, int64_t nk) {
  real m = GEN(flow_cpu_row_max)(s, lim), sum = GEN(flow_cpu_exp_shift)(s, s, lim, m), r = 1 / sum;
  int64_t j = 0;
#pragma GCC ivdep
  for (; j < UPTO32(lim); j++) s[j] *= r;
  for (; j < lim; j++) s[j] *= r;
  memset(s + lim, 0, (size_t)(nk - lim) * sizeof(real));
  return m + log(sum);
}

/* dS for one row: dp[j] = p[j] (dp[j] - D), D = sum_c dO_c O_c - dlse (partial sums in LANES lanes,
 * as the row statistics elsewhere, so the dot product vectorises). */
#define LANES 8
FLOW_CPU_DISPATCH static void GEN(ds_row)(real *dp, const real *p, const real *gi, const real *oi, int64_t Dv,
                                          int64_t nk, real dlse) {
  real acc[LANES] = {0}, D = -dlse;
  int64_t c = 0;
  for (; c + LANES <= Dv; c += LANES)
    for (int l = 0; l < LANES; l++) acc[l] += gi[c + l] * oi[c + l];
  for (; c < Dv; c++) D += gi[c] * oi[c];
  for (int l = 0; l < LANES; l++) D += acc[l];
  int64_t j = 0;
#pragma GCC ivdep
  for (; j < UPTO32(nk); j++) dp[j] = p[j] * (dp[j] - D);
  for (; j < nk; j++) dp[j] = p[j] * (dp[j] - D);
}
#undef LANES

/* nb batch items of every head: for each block of query rows,
 *   S = scale * Q K^T,  row i sees keys j < lim(i) (lim = i + 1 when causal, else Tk),
 *   lse_i = log sum_j exp S_ij,  P = exp(S - lse) (0 beyond lim),  O = P V.
 * o and lse are dense; S is the [nb, H, BLOCK, Tk] scratch. Tk >= 1 and D >= 1 (the op checks), so
 * every row sees at least one key. */
static int GEN(attention_forward)(const heads *o, const heads *lse, const heads *q, const heads *k, const heads *v,
                                  real *S, int64_t nb, const dims *d, real scale, bool causal) {
  int64_t H = d->H;
  for (int64_t r0 = 0; r0 < d->Tq; r0 += BLOCK) {
    int64_t br = d->Tq - r0 < BLOCK ? d->Tq - r0 : BLOCK, nk = keys_for(r0, br, d->Tk, causal);
    heads hs = dense_heads(S, H, br, nk, sizeof(real)), qb = heads_at(*q, 0, r0);
    if (GEN(heads_gemm)(nb, H, false, true, br, nk, d->D, scale, &qb, k, 0, &hs)) return -1;
    int t = flow_cpu_threads(nb * H * br * nk, FLOW_GRAIN_COSTLY); /* rows are independent: same bits */
#pragma omp parallel for collapse(2) num_threads(t) if (t > 1)
    for (int64_t b = 0; b < nb; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < br; i++) {
          real *s = GEN(row)(&hs, b, h, i);
          *GEN(row)(lse, b, h, r0 + i) = GEN(prob_row)(s, causal ? r0 + i + 1 : nk, nk);
        }
    heads ob = heads_at(*o, 0, r0);
    if (d->Dv > 0 && GEN(heads_gemm)(nb, H, false, false, br, d->Dv, nk, 1, &hs, v, 0, &ob)) return -1;
  }
  return 0;
}

/* nb batch items of every head, with P recomputed per block from q, k and lse, Di = sum_d dO_id O_id,
 * and dlse the gradient of lse (d lse_i / d S_ij = P_ij):
 *   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - Di + dlse_i),  dQ = scale * dS K,  dK += scale * dS^T Q.
 * g: dq, dk, dv (dense), q, k, v, o, lse, dout, dlse. S holds two [nb, H, BLOCK, Tk] scratches (P and
 * dP, then dS in its place). */
static int GEN(attention_backward)(const heads *g, real *S, int64_t nb, const dims *d, real scale, bool causal) {
  const heads *dq = &g[0], *dk = &g[1], *dv = &g[2], *q = &g[3], *k = &g[4], *v = &g[5], *o = &g[6], *lse = &g[7],
              *dout = &g[8], *dlse = &g[9];
  int64_t H = d->H, Tk = d->Tk;
  if (d->Tq == 0) {
    memset(dk->data, 0, (size_t)(nb * H * Tk * d->D) * sizeof(real));
    memset(dv->data, 0, (size_t)(nb * H * Tk * d->Dv) * sizeof(real));
    return 0;
  }
  /* Blocks from the last: it sees every key (causal attention has Tq = Tk), so its GEMMs write dK
   * and dV (beta `into` 0) and the blocks after it add to them: no zero fill first. */
  real into = 0;
  for (int64_t r0 = (d->Tq - 1) / BLOCK * BLOCK; r0 >= 0; r0 -= BLOCK, into = 1) {
    int64_t br = d->Tq - r0 < BLOCK ? d->Tq - r0 : BLOCK, nk = keys_for(r0, br, Tk, causal);
    int64_t sz = nb * H * br * nk;
    heads P = dense_heads(S, H, br, nk, sizeof(real)), dP = dense_heads(S + sz, H, br, nk, sizeof(real));
    heads qb = heads_at(*q, 0, r0), db = heads_at(*dout, 0, r0), dqb = heads_at(*dq, 0, r0);
    if (GEN(heads_gemm)(nb, H, false, true, br, nk, d->D, scale, &qb, k, 0, &P)) return -1;
    int t = flow_cpu_threads(nb * H * br * nk, FLOW_GRAIN_COSTLY); /* rows are independent: same bits */
#pragma omp parallel for collapse(2) num_threads(t) if (t > 1)
    for (int64_t b = 0; b < nb; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < br; i++) {
          real *p = GEN(row)(&P, b, h, i);
          int64_t lim = causal ? r0 + i + 1 : nk;
          GEN(flow_cpu_exp_shift)(p, p, lim, *GEN(row)(lse, b, h, r0 + i));
          memset(p + lim, 0, (size_t)(nk - lim) * sizeof(real));
        }
    if (d->Dv > 0) {
      if (GEN(heads_gemm)(nb, H, true, false, nk, d->Dv, br, 1, &P, &db, into, dv)) return -1;
      if (GEN(heads_gemm)(nb, H, false, true, br, nk, d->Dv, 1, &db, v, 0, &dP)) return -1;
    } else {
      memset(dP.data, 0, (size_t)(nb * H * br * nk) * sizeof(real));
    }
#pragma omp parallel for collapse(2) num_threads(t) if (t > 1)
    for (int64_t b = 0; b < nb; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < br; i++) {
          real *dp = GEN(row)(&dP, b, h, i);
          GEN(ds_row)(dp, GEN(row)(&P, b, h, i), GEN(row)(&db, b, h, i), GEN(row)(o, b, h, r0 + i), d->Dv, nk,
                      *GEN(row)(dlse, b, h, r0 + i));
        }
    if (GEN(heads_gemm)(nb, H, false, false, br, d->D, nk, scale, &dP, k, 0, &dqb)) return -1;
    if (GEN(heads_gemm)(nb, H, true, false, nk, d->D, br, scale, &dP, &qb, into, dk)) return -1;
  }
  return 0;
}

#endif
