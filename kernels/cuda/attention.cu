/* Scaled dot-product attention on CUDA, flash-style: scores are never stored. q [B,H,Tq,D],
 * k [B,H,Tk,D], v [B,H,Tk,Dv]; o = softmax(scale q k^T (+ causal mask)) v and lse per query row.
 * One thread owns one query row (forward, dq) or one key row (dk, dv), keeping it and its
 * accumulator in registers while tiles of the other side stream through shared memory with an
 * online softmax. Head sizes up to 128. float32, bfloat16 and float16; the math is float32 and lse
 * stays float32. Under autocast, float32 q/k/v are rounded to bf16/f16 first. */
#include "common.h"

#define TILE 64      /* query (or key) rows per block: one per thread */
#define DMAX 128
/* rows per shared-memory tile: two tiles of KT x D floats stay within 48 KiB */
#define KT(D) ((D) <= 64 ? 64 : 32)

/* Forward: m, l = running max and sum of exp; o accumulates p v. */
template <typename T, int D>
__global__ void attn_fwd(const T *q, const T *k, const T *v, T *o, float *lse, int64_t Tq, int64_t Tk, int d, int dv,
                         float scale, bool causal) {
  __shared__ float ks[KT(D)][D], vs[KT(D)][D];
  int64_t bh = blockIdx.x, i = (int64_t)blockIdx.y * TILE + threadIdx.x;
  const T *qb = q + bh * Tq * d, *kb = k + bh * Tk * d, *vb = v + bh * Tk * dv;
  bool live = i < Tq;
  float qi[D], acc[D];
#pragma unroll
  for (int c = 0; c < D; c++) { qi[c] = live && c < d ? to_f<T>(qb[i * d + c]) * scale : 0.f; acc[c] = 0.f; }
  float m = -INFINITY, l = 0.f;
  int64_t kend = causal ? min(Tk, ((int64_t)blockIdx.y + 1) * TILE) : Tk;
  for (int64_t j0 = 0; j0 < kend; j0 += KT(D)) {
    __syncthreads();
    for (int e = threadIdx.x; e < KT(D) * D; e += blockDim.x) {
      int r = e / D, c = e % D;
      int64_t j = j0 + r;
      ks[r][c] = j < Tk && c < d ? to_f<T>(kb[j * d + c]) : 0.f;
      vs[r][c] = j < Tk && c < dv ? to_f<T>(vb[j * dv + c]) : 0.f;
    }
    __syncthreads();
    if (!live) continue;
    for (int r = 0; r < KT(D); r++) {
      int64_t j = j0 + r;
      if (j >= Tk || (causal && j > i)) break;
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < D; c++) s += qi[c] * ks[r][c];
      float mn = fmaxf(m, s), corr = __expf(m - mn), p = __expf(s - mn);
      l = l * corr + p;
#pragma unroll
      for (int c = 0; c < D; c++) acc[c] = acc[c] * corr + p * vs[r][c];
      m = mn;
    }
  }
  if (!live) return;
#pragma unroll
  for (int c = 0; c < D; c++) /* constant indices keep acc in registers */
    if (c < dv) o[(bh * Tq + i) * dv + c] = from_f<T>(acc[c] / l);
  lse[bh * Tq + i] = m + logf(l);
}

/* delta_i = sum_c dO_ic O_ic - dlse_i (the softmax backward's row term). */
template <typename T>
__global__ void attn_delta(const T *o, const T *dout, const float *dlse, float *delta, int64_t rows, int dv) {
  CUDA_LOOP(r, rows) {
    float s = 0.f;
    for (int c = 0; c < dv; c++) s += to_f<T>(o[r * dv + c]) * to_f<T>(dout[r * dv + c]);
    delta[r] = s - (dlse ? dlse[r] : 0.f);
  }
}

/* dq_i = scale sum_j P_ij (dO_i . v_j - delta_i) k_j, P_ij = exp(scale q_i . k_j - lse_i). */
template <typename T, int D>
__global__ void attn_dq(const T *q, const T *k, const T *v, const float *lse, const T *dout, const float *delta, T *dq,
                        int64_t Tq, int64_t Tk, int d, int dv, float scale, bool causal) {
  __shared__ float ks[KT(D)][D], vs[KT(D)][D];
  int64_t bh = blockIdx.x, i = (int64_t)blockIdx.y * TILE + threadIdx.x;
  const T *qb = q + bh * Tq * d, *kb = k + bh * Tk * d, *vb = v + bh * Tk * dv;
  bool live = i < Tq;
  float qi[D], gi[D], acc[D];
#pragma unroll
  for (int c = 0; c < D; c++) {
    qi[c] = live && c < d ? to_f<T>(qb[i * d + c]) * scale : 0.f;
    gi[c] = live && c < dv ? to_f<T>(dout[(bh * Tq + i) * dv + c]) : 0.f;
    acc[c] = 0.f;
  }
  float li = live ? lse[bh * Tq + i] : 0.f, di = live ? delta[bh * Tq + i] : 0.f;
  int64_t kend = causal ? min(Tk, ((int64_t)blockIdx.y + 1) * TILE) : Tk;
  for (int64_t j0 = 0; j0 < kend; j0 += KT(D)) {
    __syncthreads();
    for (int e = threadIdx.x; e < KT(D) * D; e += blockDim.x) {
      int r = e / D, c = e % D;
      int64_t j = j0 + r;
      ks[r][c] = j < Tk && c < d ? to_f<T>(kb[j * d + c]) : 0.f;
      vs[r][c] = j < Tk && c < dv ? to_f<T>(vb[j * dv + c]) : 0.f;
    }
    __syncthreads();
    if (!live) continue;
    for (int r = 0; r < KT(D); r++) {
      int64_t j = j0 + r;
      if (j >= Tk || (causal && j > i)) break;
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int c = 0; c < D; c++) { s += qi[c] * ks[r][c]; dp += gi[c] * vs[r][c]; }
      float ds = __expf(s - li) * (dp - di);
#pragma unroll
      for (int c = 0; c < D; c++) acc[c] += ds * ks[r][c];
    }
  }
  if (live)
#pragma unroll
    for (int c = 0; c < D; c++)
      if (c < d) dq[(bh * Tq + i) * d + c] = from_f<T>(acc[c] * scale);
}

/* For key row j: dv_j = sum_i P_ij dO_i and dk_j = scale sum_i P_ij (dO_i . v_j - delta_i) q_i.
 * want_dk picks which one this launch computes (keeping fewer rows in registers). */
template <typename T, int D>
__global__ void attn_dkv(const T *q, const T *k, const T *v, const float *lse, const T *dout, const float *delta, T *dst,
                         int64_t Tq, int64_t Tk, int d, int dv, float scale, bool causal, bool want_dk) {
  __shared__ float qs[KT(D)][D], gs[KT(D)][D];
  __shared__ float ls[KT(D)], ds_[KT(D)];
  int64_t bh = blockIdx.x, j = (int64_t)blockIdx.y * TILE + threadIdx.x;
  const T *qb = q + bh * Tq * d, *gb = dout + bh * Tq * dv;
  bool live = j < Tk;
  float kj[D], vj[D], acc[D];
#pragma unroll
  for (int c = 0; c < D; c++) {
    kj[c] = live && c < d ? to_f<T>(k[(bh * Tk + j) * d + c]) * scale : 0.f;
    vj[c] = live && want_dk && c < dv ? to_f<T>(v[(bh * Tk + j) * dv + c]) : 0.f;
    acc[c] = 0.f;
  }
  int64_t istart = causal ? (int64_t)blockIdx.y * TILE : 0;
  for (int64_t i0 = istart; i0 < Tq; i0 += KT(D)) {
    __syncthreads();
    for (int e = threadIdx.x; e < KT(D) * D; e += blockDim.x) {
      int r = e / D, c = e % D;
      int64_t i = i0 + r;
      qs[r][c] = i < Tq && c < d ? to_f<T>(qb[i * d + c]) : 0.f;
      gs[r][c] = i < Tq && c < dv ? to_f<T>(gb[i * dv + c]) : 0.f;
    }
    for (int r = threadIdx.x; r < KT(D); r += blockDim.x) {
      int64_t i = i0 + r;
      ls[r] = i < Tq ? lse[bh * Tq + i] : 0.f;
      ds_[r] = i < Tq ? delta[bh * Tq + i] : 0.f;
    }
    __syncthreads();
    if (!live) continue;
    for (int r = 0; r < KT(D); r++) {
      int64_t i = i0 + r;
      if (i >= Tq) break;
      if (causal && j > i) continue;
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < D; c++) s += kj[c] * qs[r][c];
      float p = __expf(s - ls[r]);
      if (want_dk) {
        float dp = 0.f;
#pragma unroll
        for (int c = 0; c < D; c++) dp += gs[r][c] * vj[c];
        float dsv = p * (dp - ds_[r]);
#pragma unroll
        for (int c = 0; c < D; c++) acc[c] += dsv * qs[r][c];
      } else {
#pragma unroll
        for (int c = 0; c < D; c++) acc[c] += p * gs[r][c];
      }
    }
  }
  if (!live) return;
  int w = want_dk ? d : dv;
#pragma unroll
  for (int c = 0; c < D; c++)
    if (c < w) dst[(bh * Tk + j) * w + c] = from_f<T>(want_dk ? acc[c] * scale : acc[c]);
}

/* ---- launchers -------------------------------------------------------------------------------- */

/* Blocks are (batch x head, tile of rows): grid.x takes any B*H, grid.y (at most 65535) the tiles. */
static int check_dims(const flow_tensor *q, const flow_tensor *k, const flow_tensor *v) {
  int64_t d = q->shape[3], dv = v->shape[3], T = q->shape[2] > k->shape[2] ? q->shape[2] : k->shape[2];
  if (d > DMAX || dv > DMAX)
    return flow_error_set("scaled_dot_product_attention: head sizes up to %d are supported on cuda (got %lld and %lld)",
                          DMAX, (long long)d, (long long)dv);
  if ((T + TILE - 1) / TILE > 65535)
    return flow_error_set("scaled_dot_product_attention: sequences up to %d are supported on cuda (got %lld)",
                          65535 * TILE, (long long)T);
  return 0;
}

/* Dense copies: the tensors in `stats` (lse, dlse) as float32, the rest in the compute dtype (the
 * autocast dtype when it is on and the inputs are float32). */
static bool prepare(flow_tensor *const *src, flow_tensor **dst, int n, unsigned stats, flow_dtype *compute) {
  flow_dtype ac = flow_autocast_dtype();
  *compute = ac != FLOW_F32 && src[0]->dtype == FLOW_F32 ? ac : src[0]->dtype;
  bool ok = true;
  for (int i = 0; i < n; i++) {
    dst[i] = NULL;
    if (!src[i] || !ok) continue;
    flow_dtype want = stats >> i & 1 ? FLOW_F32 : *compute;
    dst[i] = src[i]->dtype == want ? cuda_dense(src[i]) : cuda_cast(src[i], want);
    if (!dst[i]) ok = false;
  }
  return ok;
}

static void release(flow_tensor **t, int n) {
  for (int i = 0; i < n; i++) if (t[i]) flow_tensor_decref(t[i]);
}

/* Outputs in the compute dtype, copied into out[] (float32 under autocast) when they differ. */
static flow_tensor *scratch_like(flow_tensor *out, flow_dtype dt) {
  if (out->dtype == dt) { flow_tensor_incref(out); return out; }
  return flow_tensor_new(dt, out->device, out->ndim, out->shape);
}

static int finish(flow_tensor *out, flow_tensor *tmp, int rc) {
  if (rc == 0 && tmp != out) rc = flow_cuda_copy(out, tmp);
  flow_tensor_decref(tmp);
  return rc;
}

#define ATTN_DISPATCH(dt, WHAT, ...)                                                            \
  switch (dt) {                                                                                   \
  case FLOW_F32: { typedef float T; __VA_ARGS__; break; }                                           \
  case FLOW_BF16: { typedef bf16 T; __VA_ARGS__; break; }                                           \
  case FLOW_F16: { typedef f16 T; __VA_ARGS__; break; }                                             \
  default: rc = FLOW_CUDA_UNSUPPORTED(dt, WHAT);                                                    \
  }

/* D picks the register row size: 64 covers GPT-2's heads, 128 the rest. */
#define BY_D(dmax, ...) do { if (dmax <= 64) { const int D = 64; __VA_ARGS__; } else { const int D = 128; __VA_ARGS__; } } while (0)

static FLOW_KERNEL(k_attention) {
  if (check_dims(in[0], in[1], in[2]) != 0) return -1;
  flow_tensor *src[3] = {in[0], in[1], in[2]}, *d[3];
  flow_dtype ct;
  int rc = -1;
  if (prepare(src, d, 3, 0, &ct)) {
    flow_tensor *o = scratch_like(out[0], ct), *lse = o ? scratch_like(out[1], FLOW_F32) : NULL;
    if (lse) {
      int64_t B = in[0]->shape[0] * in[0]->shape[1], Tq = in[0]->shape[2], Tk = in[1]->shape[2];
      int dd = (int)in[0]->shape[3], dv = (int)in[2]->shape[3], dmax = dd > dv ? dd : dv;
      dim3 grid((unsigned)B, (unsigned)((Tq + TILE - 1) / TILE));
      cudaStream_t s = stream_of(out[0]);
      bool causal = a->flags & FLOW_ATTR_CAUSAL;
      rc = 0;
      if (B > 0 && Tq > 0) {
        ATTN_DISPATCH(ct, "scaled_dot_product_attention",
          BY_D(dmax, attn_fwd<T, D><<<grid, TILE, 0, s>>>(data_of<T>(d[0]), data_of<T>(d[1]), data_of<T>(d[2]), data_of<T>(o),
                                                           data_of<float>(lse), Tq, Tk, dd, dv, (float)a->scalar, causal)))
        if (rc == 0) rc = launch_check("attention_fwd");
      }
      rc = finish(out[1], lse, finish(out[0], o, rc));
    } else if (o) {
      flow_tensor_decref(o);
    }
  }
  release(d, 3);
  return rc;
}

/* inputs: q, k, v, o, lse, do, dlse; outputs dq, dk, dv */
static FLOW_KERNEL(k_attention_grad) {
  if (check_dims(in[0], in[1], in[2]) != 0) return -1;
  flow_tensor *src[7] = {in[0], in[1], in[2], in[3], in[4], in[5], in[6]}, *d[7];
  flow_dtype ct;
  int rc = -1;
  if (prepare(src, d, 7, 1u << 4 | 1u << 6, &ct)) {
    flow_tensor *g[3] = {NULL, NULL, NULL};
    bool ok = true;
    for (int j = 0; j < 3 && ok; j++) ok = (g[j] = scratch_like(out[j], ct)) != NULL;
    int64_t B = in[0]->shape[0] * in[0]->shape[1], Tq = in[0]->shape[2], Tk = in[1]->shape[2];
    int64_t rows = B * Tq;
    flow_tensor *delta = ok ? flow_tensor_new(FLOW_F32, in[0]->device, 1, &rows) : NULL;
    if (delta) {
      int dd = (int)in[0]->shape[3], dv = (int)in[2]->shape[3], dmax = dd > dv ? dd : dv;
      cudaStream_t s = stream_of(out[0]);
      bool causal = a->flags & FLOW_ATTR_CAUSAL;
      float scale = (float)a->scalar;
      dim3 gq((unsigned)B, (unsigned)((Tq + TILE - 1) / TILE)), gk((unsigned)B, (unsigned)((Tk + TILE - 1) / TILE));
      rc = 0;
      if (B > 0 && Tq > 0 && Tk > 0) {
        ATTN_DISPATCH(ct, "scaled_dot_product_attention_grad",
          attn_delta<T><<<grid_for(rows, 256), 256, 0, s>>>(data_of<T>(d[3]), data_of<T>(d[5]), data_of<float>(d[6]),
                                                           data_of<float>(delta), rows, dv);
          BY_D(dmax,
            attn_dq<T, D><<<gq, TILE, 0, s>>>(data_of<T>(d[0]), data_of<T>(d[1]), data_of<T>(d[2]), data_of<float>(d[4]),
                                             data_of<T>(d[5]), data_of<float>(delta), data_of<T>(g[0]), Tq, Tk, dd, dv,
                                             scale, causal);
            attn_dkv<T, D><<<gk, TILE, 0, s>>>(data_of<T>(d[0]), data_of<T>(d[1]), data_of<T>(d[2]), data_of<float>(d[4]),
                                              data_of<T>(d[5]), data_of<float>(delta), data_of<T>(g[1]), Tq, Tk, dd, dv,
                                              scale, causal, true);
            attn_dkv<T, D><<<gk, TILE, 0, s>>>(data_of<T>(d[0]), data_of<T>(d[1]), data_of<T>(d[2]), data_of<float>(d[4]),
                                              data_of<T>(d[5]), data_of<float>(delta), data_of<T>(g[2]), Tq, Tk, dd, dv,
                                              scale, causal, false)))
        if (rc == 0) rc = launch_check("attention_bwd");
      } else {
        for (int j = 0; j < 3 && rc == 0; j++) rc = flow_cuda_fill(g[j], 0);
      }
      flow_tensor_decref(delta);
    }
    for (int j = 0; j < 3; j++) {
      if (g[j]) rc = finish(out[j], g[j], rc);
      else if (rc == 0) rc = -1;
    }
  }
  release(d, 7);
  return rc;
}

void flow_cuda_register_attention(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, scaled_dot_product_attention, k_attention);
  FLOW_KERNEL_ADD(FLOW_CUDA, scaled_dot_product_attention_grad, k_attention_grad);
}
