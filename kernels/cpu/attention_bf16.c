/* Scaled dot-product attention on AVX512-BF16: under bf16 autocast (float32 tensors) and for
 * bfloat16 tensors, one (batch, head) at a time, each product on our own register-tiled kernel of
 * VDPBF16PS. A head of the benchmark GPT is [128, 32]: oneDNN's GEMMs on such blocks spent as long
 * packing their operands as multiplying (its copy kernels were 40% of attention's GEMM time), and
 * each operand was rounded to bf16 in a pass of its own first. Here a head's q, k, v (and dO) are
 * rounded once, into the layouts the products read, and stay in L1 with the [64, Tk] block of
 * scores, probabilities and dS. The maths is that of attention.c's float32 kernels (same blocks of
 * query rows, same log-sum-exp; q, k, v, dO, P and dS rounded to bf16 for the products, float32
 * accumulation), with an exp good to bf16's precision (exp16) and the roundings of P and dS made in
 * the loops that compute them. A layer of the benchmark GPT (B8 H8 T128 D32, causal), forward and
 * backward, one thread (scripts/bench/attention.lua): 3.19 ms on oneDNN's bf16 GEMMs, 1.93 ms here
 * (float32 on oneDNN: 3.55), in one run.
 *
 * Two things cost more than the arithmetic on this CPU (AMD, AVX-512 on 256-bit units): a masked
 * load that misses the cache (so whole vectors move unmasked, load_n), and a row read back right
 * after narrower or masked stores to it, which cannot forward.
 *
 * A product reads its operands as 32-bit words, each a pair of bf16 along the summed axis (what
 * VDPBF16PS multiplies and adds into one float32 lane):
 *   rows   [R][C2]   a matrix's rows, pairs along its columns (plain bf16 row-major, C even);
 *   tpairs [C2][ldw] the same words transposed: pairs along columns, one row per lane;
 *   rpairs [R2][ldw] pairs along rows: word (r2, c) = (x[2 r2][c], x[2 r2 + 1][c]).
 * B operands are tpairs or rpairs with ldw a multiple of 16 and zeros beyond their columns.
 * Everything here is compiled for AVX-512 with BF16: callers check flow_onednn_bf16_native() first. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "../../core/dtype.h"
#include "../../core/error.h"
#include "cpu.h"
#include "iter.h"
#include "nn.h"
#include "onednn.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

/* Query rows per block (even: blocks start on a pair). */
#define BQ 64
/* Rows ahead that pack_rows fetches. */
#define PREFETCH 16

static int64_t up16(int64_t n) { return (n + 15) & ~(int64_t)15; }
static int64_t half_up(int64_t n) { return (n + 1) / 2; }
static __mmask16 mask_of(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }
/* The n (>= 1) floats from p, up to 16: a masked move only for a part of a vector (masked loads
 * cost far more here than plain ones when they miss the cache, and a masked store forwards to no
 * load after it). */
static inline __m512 load_n(const float *p, int64_t n) {
  return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask_of(n), p);
}
static inline void store_n(float *p, __m512 x, int64_t n) {
  if (n >= 16) _mm512_storeu_ps(p, x);
  else _mm512_mask_storeu_ps(p, mask_of(n), x);
}
/* The same for 16 bf16 and 16 words. */
static inline __m256i load16_n(const uint16_t *p, int64_t n) {
  return n >= 16 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(mask_of(n), p);
}
static inline void store16_n(uint16_t *p, __m256i x, int64_t n) {
  if (n >= 16) _mm256_storeu_si256((__m256i *)p, x);
  else _mm256_mask_storeu_epi16(p, mask_of(n), x);
}
static inline void store32_n(uint32_t *p, __m512i x, int64_t n) {
  if (n >= 16) _mm512_storeu_si512(p, x);
  else _mm512_mask_storeu_epi32(p, mask_of(n), x);
}

/* e^x for 16 x <= 0 (scores less their row's max or log-sum-exp), good to bf16's precision, which P
 * and dS are rounded to before any product: x = k ln2 + r, |r| <= ln2 / 2, e^r by its degree-5
 * Taylor polynomial (relative error < 4e-6, against 2^-9 for the rounding after), 2^k by VSCALEFPS;
 * below e^-104, 0; NaN stays NaN. 10 instructions for 16 elements, where the float32 kernels' exp
 * (1 ulp, softmax.c) takes about 25 for 8: exp had been a sixth of bf16 attention's time. */
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);   /* max(lo, NaN) is NaN */
  __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693147180559945309f), x), one = _mm512_set1_ps(1.0f);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 120), r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, one);
  p = _mm512_fmadd_ps(p, r, one);
  return _mm512_scalef_ps(p, k);
}

/* log x for 16 x >= 1 (sums of e^(s - max)): x = 2^e m, m in [1, 2), log m = 2 atanh t with
 * t = (m - 1) / (m + 1) <= 1/3, its series to t^11 (relative error < 4e-7 on [1, 7e4]). */
static inline __m512 log16(__m512 x) {
  __m512 e = _mm512_getexp_ps(x), m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  __m512 one = _mm512_set1_ps(1.0f), t = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
  __m512 t2 = _mm512_mul_ps(t, t), p = _mm512_set1_ps(1.0f / 11);
  p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.0f / 9));
  p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.0f / 7));
  p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.0f / 5));
  p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.0f / 3));
  p = _mm512_fmadd_ps(p, t2, one);
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693147180559945309f), _mm512_mul_ps(_mm512_add_ps(t, t), p));
}

/* 16 bf16 of x (as VCVTNEPS2BF16 rounds, oneDNN's reorder) */
static inline __m256i bf16_of(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

/* 16 words: x's bf16 in their low halves, y's in their high halves. */
static inline __m512i pair_words(__m256i x, __m256i y) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(x), _mm512_slli_epi32(_mm512_cvtepu16_epi32(y), 16));
}

/* The forward's probabilities, unnormalised: dst[j] = bf16(e^(s[j] - m)) for j < n (m, the row's
 * max), zeros from n to pad; returns the sum of the e^(s[j] - m) (float32, unrounded). */
static float exp_row16(uint16_t *dst, const float *s, int64_t n, float m, int64_t pad) {
  __m512 sh = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), sh));
    _mm256_storeu_si256((__m256i *)(dst + j), bf16_of(e));
    acc = _mm512_add_ps(acc, e);
  }
  if (j < n) {   /* the part of a vector left */
    __m512 e = _mm512_maskz_mov_ps(mask_of(n - j), exp16(_mm512_sub_ps(load_n(s + j, n - j), sh)));
    store16_n(dst + j, bf16_of(e), n - j);
    acc = _mm512_add_ps(acc, e);
  }
  memset(dst + n, 0, (size_t)(pad - n) * 2);
  return _mm512_reduce_add_ps(acc);
}

/* The backward's probabilities of rows x and y (NULL: none, zeros) of n columns, from their log-sum-
 * exps: P = e^(s - lse) for j < lim, 0 from lim to n, written back over the rows, and as pairs
 * (x's, y's) into w[0 .. n). */
static void exp_pair(uint32_t *w, float *x, float *y, int64_t lx, int64_t ly, float sx, float sy, int64_t n) {
  __m512 hx = _mm512_set1_ps(sx), hy = _mm512_set1_ps(sy);
  for (int64_t j = 0; j < n; j += 16) {
    int64_t left = n - j;
    __m512 ex = _mm512_maskz_mov_ps(mask_of(lx - j > 0 ? lx - j : 0), exp16(_mm512_sub_ps(load_n(x + j, left), hx)));
    __m512 ey = y ? _mm512_maskz_mov_ps(mask_of(ly - j > 0 ? ly - j : 0), exp16(_mm512_sub_ps(load_n(y + j, left), hy)))
                  : _mm512_setzero_ps();
    store_n(x + j, ex, left);
    if (y) store_n(y + j, ey, left);
    store32_n(w + j, pair_words(bf16_of(ex), bf16_of(ey)), left);
  }
}

/* dS of rows x and y (NULL: none) of n columns: ds = p (dp - D), into bf16 rows dx and dy (zeros from
 * n to pad) and as pairs (x's, y's) into w[0 .. n). */
static void ds_pair(uint32_t *w, uint16_t *dx, uint16_t *dy, const float *px, const float *py, const float *gx,
                    const float *gy, float Dx, float Dy, int64_t n, int64_t pad) {
  __m512 vx = _mm512_set1_ps(Dx), vy = _mm512_set1_ps(Dy);
  for (int64_t j = 0; j < n; j += 16) {
    int64_t left = n - j;
    __m256i bx = bf16_of(_mm512_mul_ps(load_n(px + j, left), _mm512_sub_ps(load_n(gx + j, left), vx)));
    __m256i by = py ? bf16_of(_mm512_mul_ps(load_n(py + j, left), _mm512_sub_ps(load_n(gy + j, left), vy)))
                    : _mm256_setzero_si256();
    store32_n(w + j, pair_words(bx, by), left);
    store16_n(dx + j, bx, left);
    if (dy) store16_n(dy + j, by, left);
  }
  memset(dx + n, 0, (size_t)(pad - n) * 2);
  if (dy) memset(dy + n, 0, (size_t)(pad - n) * 2);
}

/* ---- the product ------------------------------------------------------------------------------ */

/* One tile of C: MR rows by NV vectors of 16 columns, `last` of them in the last vector:
 * C = alpha sum_k A(m, k) . B[k][n] (+ C when acc), A(m, k) = a[m am + k ak]. */
static inline __attribute__((always_inline)) void tile(const int MR, const int NV, int64_t K2, const uint32_t *a,
                                                       int64_t am, int64_t ak, const uint32_t *b, int64_t ldb,
                                                       float *c, int64_t ldc, float alpha, bool acc,
                                                       int64_t last) {
  __m512 s[12][4];
#pragma GCC unroll 12
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) s[i][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K2; k++) {
    __m512bh bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + k * ldb + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * am + k * ak]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) s[i][v] = _mm512_dpbf16_ps(s[i][v], av, bv[v]);
    }
  }
  __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 12
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      float *p = c + i * ldc + 16 * v;
      int64_t n = v < NV - 1 ? 16 : last;
      __m512 r = _mm512_mul_ps(s[i][v], al);
      if (acc) r = _mm512_add_ps(r, load_n(p, n));
      store_n(p, r, n);
    }
}

/* C [M, N] (leading dimension ldc) = alpha A B (+ C when acc), summing K2 pairs: A(m, k) =
 * a[m am + k ak], B [K2][ldb] words with zeros from column N to the next multiple of 16. Column
 * blocks of 64 outside (a block of B stays in L1), row tiles inside: 6 rows of 4 vectors, 8 of 3, 12
 * of 2 or 1 (24-27 accumulators of the 32 registers). */
static void product(int64_t M, int64_t N, int64_t K2, const uint32_t *a, int64_t am, int64_t ak, const uint32_t *b,
                    int64_t ldb, float *c, int64_t ldc, float alpha, bool acc) {
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    int64_t nn = N - n0 < 64 ? N - n0 : 64;
    int nv = (int)((nn + 15) / 16), mmax = nv == 4 ? 6 : nv == 3 ? 8 : 12;
    int64_t last = nn - 16 * (nv - 1);
    for (int64_t m0 = 0; m0 < M; m0 += mmax) {
      int mr = M - m0 < mmax ? (int)(M - m0) : mmax;
      const uint32_t *ap = a + m0 * am, *bp = b + n0;
      float *cp = c + m0 * ldc + n0;
#define T(R, V)                                                                                  \
  case R * 8 + V:                                                                                \
    tile(R, V, K2, ap, am, ak, bp, ldb, cp, ldc, alpha, acc, last);                              \
    break;
#define T4(R) T(R, 1) T(R, 2) T(R, 3) T(R, 4)
#define T2(R) T(R, 1) T(R, 2)
      switch (mr * 8 + nv) {
        T4(1) T4(2) T4(3) T4(4) T4(5) T4(6)
        T(7, 1) T(7, 2) T(7, 3) T(8, 1) T(8, 2) T(8, 3)
        T2(9) T2(10) T2(11) T2(12)
      }
#undef T
#undef T4
#undef T2
    }
  }
}

/* ---- packing ---------------------------------------------------------------------------------- */

/* One head's [rows, cols] matrix of a tensor: element (r, c) at p + (r sr + c sc) elements. */
typedef struct mat {
  const char *p;
  int64_t sr, sc;
  bool bf16;
} mat;

static mat head_of(const flow_tensor *t, int64_t b, int64_t h) {
  size_t es = flow_dtype_size(t->dtype);
  return (mat){(const char *)flow_tensor_data(t) + (b * t->stride[0] + h * t->stride[1]) * (int64_t)es,
               t->stride[2], t->stride[3], t->dtype == FLOW_BF16};
}

/* Row r of m as float32: m's own row when it is one, else widened into buf. */
static const float *row_f32(const mat *m, int64_t r, int64_t n, float *buf) {
  const char *p = m->p + r * m->sr * (m->bf16 ? 2 : 4);
  if (!m->bf16 && m->sc == 1) return (const float *)p;
  if (m->bf16) flow_cpu_widen_half(buf, p, m->sc * 2, n, FLOW_BF16);
  else
    for (int64_t c = 0; c < n; c++) buf[c] = ((const float *)p)[c * m->sc];
  return buf;
}

/* dst[j] = bf16(x[j]) for j < n, zeros from n to pad. */
static void round_row(uint16_t *dst, const float *x, int64_t n, int64_t pad) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm256_storeu_si256((__m256i *)(dst + j), bf16_of(_mm512_loadu_ps(x + j)));
  if (j < n) store16_n(dst + j, bf16_of(load_n(x + j, n - j)), n - j);
  memset(dst + n, 0, (size_t)(pad - n) * 2);
}

/* rows: m's R rows of C columns in bf16, ld (even) apart, zeros from C to ld. A head's row is
 * short (32 elements in the benchmark GPT): rounded inline, one call per row cost more. */
static void pack_rows(uint16_t *dst, int64_t ld, const mat *m, int64_t R, int64_t C) {
  int64_t es = m->bf16 ? 2 : 4, bytes = C * m->sc * es;
  for (int64_t r = 0; r < R; r++) {
    uint16_t *o = dst + r * ld;
    const char *p = m->p + r * m->sr * es;
    if (r + PREFETCH < R)   /* the rows of a head are far apart (a projection's): no prefetcher follows them */
      for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + PREFETCH * m->sr * es + b, _MM_HINT_T0);
    if (m->bf16 && m->sc == 1) {
      memcpy(o, p, (size_t)C * 2);
      memset(o + C, 0, (size_t)(ld - C) * 2);
    } else if (m->sc == 1) {
      round_row(o, (const float *)p, C, ld);
    } else {
      for (int64_t c = 0; c < C; c++)
        o[c] = m->bf16 ? ((const uint16_t *)p)[c * m->sc] : flow_float_to_bf16(((const float *)p)[c * m->sc]);
      memset(o + C, 0, (size_t)(ld - C) * 2);
    }
  }
}

/* The 16 x 16 words of r transposed in place: 32-bit, then 64-bit interleaves within 128-bit
 * lanes, then two rounds of lane shuffles (after the 64-bit round, lane L of r[4 g + j] holds
 * column 4 L + j of rows 4 g .. 4 g + 3). */
static void transpose16(__m512i r[16]) {
  __m512i a[16], b[16], c[16];
  for (int i = 0; i < 8; i++) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; g++) {
    b[4 * g] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
    b[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
  }
  for (int j = 0; j < 4; j++) {   /* lanes (0, 2) and (1, 3) of row groups 0, 1 and of 2, 3 */
    c[j] = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x88);
    c[4 + j] = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xdd);
    c[8 + j] = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x88);
    c[12 + j] = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; j++) {   /* column j, 8 + j, 4 + j, 12 + j: each lane a row group */
    r[j] = _mm512_shuffle_i32x4(c[j], c[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(c[j], c[8 + j], 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(c[4 + j], c[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(c[4 + j], c[12 + j], 0xdd);
  }
}

/* tpairs [C2][ldw] from rows [R][C2]; zeros from R to ldw (ldw >= R rounded up to 16). Blocks of
 * 16 x 16 words transposed in registers (a word at a time took 2.5 times as long). */
static void pack_tpairs(uint32_t *dst, int64_t ldw, const uint32_t *rows, int64_t R, int64_t C2) {
  for (int64_t r0 = 0; r0 < R; r0 += 16)
    for (int64_t c0 = 0; c0 < C2; c0 += 16) {
      __m512i x[16];
      __mmask16 k = mask_of(C2 - c0);
      for (int i = 0; i < 16; i++) {
        const uint32_t *p = rows + (r0 + i) * C2 + c0;
        x[i] = r0 + i >= R    ? _mm512_setzero_si512()
               : k == 0xffff ? _mm512_loadu_si512(p)
                             : _mm512_maskz_loadu_epi32(k, p);
      }
      transpose16(x);
      for (int64_t c = 0; c < 16 && c0 + c < C2; c++) _mm512_storeu_si512(dst + (c0 + c) * ldw + r0, x[c]);
    }
  for (int64_t c = 0; c < C2; c++) memset(dst + c * ldw + up16(R), 0, (size_t)(ldw - up16(R)) * 4);
}

/* Words (x[j], y[j]) for j < n, zeros from n to pad: from bf16 rows (y NULL: zeros). */
static void pair16(uint32_t *w, const uint16_t *x, const uint16_t *y, int64_t n, int64_t pad) {
  for (int64_t j = 0; j < n; j += 16) {
    store32_n(w + j, pair_words(load16_n(x + j, n - j), y ? load16_n(y + j, n - j) : _mm256_setzero_si256()), n - j);
  }
  memset(w + n, 0, (size_t)(pad - n) * 4);
}

/* rpairs [half_up(R)][ldw] from bf16 rows [R][ld16] of C columns. */
static void pack_rpairs(uint32_t *dst, int64_t ldw, const uint16_t *rows, int64_t ld16, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; r += 2)
    pair16(dst + r / 2 * ldw, rows + r * ld16, r + 1 < R ? rows + (r + 1) * ld16 : NULL, C, ldw);
}

/* n float32 into an output row of dtype bf16 (rounded as casts round) or float32. */
static void put_row(void *dst, bool bf16, const float *src, int64_t n) {
  if (bf16) flow_cpu_narrow_half(dst, 2, src, n, FLOW_BF16);
  else memcpy(dst, src, (size_t)n * 4);
}

/* ---- one call --------------------------------------------------------------------------------- */

typedef struct sizes {
  int64_t B, H, Tq, Tk, D, Dv;
  int64_t D2, Dv2, Tkp, Dp, Dvp;   /* pairs of D and Dv; Tk, D, Dv up to multiples of 16 */
} sizes;

static sizes sizes_of(const flow_tensor *q, const flow_tensor *v) {
  sizes z = {q->shape[0], q->shape[1], q->shape[2], v->shape[2], q->shape[3], v->shape[3]};
  z.D2 = half_up(z.D);
  z.Dv2 = half_up(z.Dv);
  z.Tkp = up16(z.Tk);
  z.Dp = up16(z.D);
  z.Dvp = up16(z.Dv);
  return z;
}

/* Per-thread scratch in 4-byte words, from the tensor allocator (memory already touched); t of them. */
static flow_tensor *scratch(int t, int64_t words, const char *op) {
  int64_t n = t * words;
  flow_tensor *s = flow_tensor_new(FLOW_F32, FLOW_DEVICE_CPU, 1, &n);
  if (!s) flow_error_prefix("%s", op);
  return s;
}

/* A thread's scratch, carved in order: take(c, n) is the next n words (NULL when c only counts). One
 * function per pass lays its buffers out, both to size the scratch and to find them in it. */
typedef struct carve {
  uint32_t *at;
  int64_t words;
} carve;

static void *take(carve *c, int64_t n) {
  void *p = c->at ? c->at + c->words : NULL;
  c->words += n;
  return p;
}

static int threads_for(const sizes *z) {
  int t = flow_cpu_threads(z->B * z->H * z->Tq * (z->Tk + z->D), FLOW_GRAIN_COSTLY);
  t = t < z->B * z->H ? t : (int)(z->B * z->H);
  return t < 1 ? 1 : t;
}

/* Forward of head (b, h), per block of query rows: S = scale Q K^T, P = softmax(S) (keys j <= i when
 * causal), lse = log sum exp S, O = P V. */
typedef struct fwd_scratch {
  uint32_t *qw, *kr, *kd, *vt;   /* q and k rows, k's tpairs, v's rpairs */
  uint16_t *vr, *P;              /* v's rows; a block's probabilities, bf16 rows */
  float *S, *ob, *inv;           /* a block's scores, its output rows (bf16 outputs), 1 / each row's sum */
} fwd_scratch;

/* The forward's buffers in the scratch at w (w NULL: none); returns its words. */
static int64_t forward_scratch(const sizes *z, uint32_t *w, fwd_scratch *s) {
  carve c = {w, 0};
  s->qw = take(&c, z->Tq * z->D2);
  s->kr = take(&c, z->Tk * z->D2);
  s->kd = take(&c, z->D2 * z->Tkp);
  s->vt = take(&c, half_up(z->Tk) * z->Dvp);
  s->vr = take(&c, z->Tk * z->Dv2);
  s->S = take(&c, BQ * z->Tkp);
  s->ob = take(&c, BQ * z->Dv);
  s->P = take(&c, BQ * (z->Tkp / 2));
  s->inv = take(&c, BQ);
  return c.words;
}

static void forward_head(flow_tensor *o, float *lse, const flow_tensor *q, const flow_tensor *k,
                         const flow_tensor *v, const sizes *z, float scale, bool causal, int64_t b, int64_t h,
                         uint32_t *w) {
  int64_t Tq = z->Tq, Tk = z->Tk;
  fwd_scratch sc;
  forward_scratch(z, w, &sc);
  uint32_t *qw = sc.qw, *kr = sc.kr, *kd = sc.kd, *vt = sc.vt;
  uint16_t *vr = sc.vr, *P = sc.P;
  float *S = sc.S, *ob = sc.ob, *inv = sc.inv;
  mat mq = head_of(q, b, h), mk = head_of(k, b, h), mv = head_of(v, b, h);
  pack_rows((uint16_t *)qw, 2 * z->D2, &mq, Tq, z->D);
  pack_rows((uint16_t *)kr, 2 * z->D2, &mk, Tk, z->D);
  pack_tpairs(kd, z->Tkp, kr, Tk, z->D2);
  pack_rows(vr, 2 * z->Dv2, &mv, Tk, z->Dv);
  pack_rpairs(vt, z->Dvp, vr, 2 * z->Dv2, Tk, z->Dv);
  bool bf = o->dtype == FLOW_BF16;
  char *obase = (char *)flow_tensor_data(o) + (b * z->H + h) * Tq * z->Dv * (bf ? 2 : 4);
  float *lrow = lse + (b * z->H + h) * Tq;
  for (int64_t i0 = 0; i0 < Tq; i0 += BQ) {
    int64_t br = Tq - i0 < BQ ? Tq - i0 : BQ, nk = causal ? i0 + br : Tk, nk2 = half_up(nk);
    product(br, nk, z->D2, qw + i0 * z->D2, z->D2, 1, kd, z->Tkp, S, z->Tkp, scale, false);
    /* P unnormalised, rounded as it is made; O's rows divided by their sums after */
    for (int64_t i = 0; i < br; i++) {
      const float *s = S + i * z->Tkp;
      int64_t lim = causal ? i0 + i + 1 : nk;
      lrow[i0 + i] = flow_cpu_row_max_f32(s, lim);
      inv[i] = exp_row16(P + i * 2 * nk2, s, lim, lrow[i0 + i], 2 * nk2);   /* the sum, for now */
    }
    for (int64_t i = 0; i < br; i += 16) {   /* lse = max + log sum; inv = 1 / sum */
      __m512 sum = load_n(inv + i, br - i);
      store_n(lrow + i0 + i, _mm512_add_ps(load_n(lrow + i0 + i, br - i), log16(sum)), br - i);
      store_n(inv + i, _mm512_div_ps(_mm512_set1_ps(1.0f), sum), br - i);
    }
    float *out = bf ? ob : (float *)obase + i0 * z->Dv;
    product(br, z->Dv, nk2, (const uint32_t *)P, nk2, 1, vt, z->Dvp, out, z->Dv, 1, false);
    for (int64_t i = 0; i < br; i++) {
      float *row = out + i * z->Dv;
      __m512 r = _mm512_set1_ps(inv[i]);
      for (int64_t c = 0; c < z->Dv; c += 16) store_n(row + c, _mm512_mul_ps(load_n(row + c, z->Dv - c), r), z->Dv - c);
      if (bf) put_row(obase + (i0 + i) * z->Dv * 2, true, row, z->Dv);
    }
  }
}

int flow_cpu_attention_forward_bf16(flow_tensor *o, flow_tensor *lse, const flow_tensor *q, const flow_tensor *k,
                                    const flow_tensor *v, double scale, bool causal) {
  sizes z = sizes_of(q, v);
  int t = threads_for(&z);
  fwd_scratch none;
  int64_t words = forward_scratch(&z, NULL, &none);
  flow_tensor *st = scratch(t, words, "scaled_dot_product_attention");
  if (!st) return -1;
  uint32_t *base = flow_tensor_data(st);
  float *lp = flow_tensor_data(lse);
#pragma omp parallel for schedule(static) num_threads(t) if (t > 1)
  for (int64_t bh = 0; bh < z.B * z.H; bh++)
    forward_head(o, lp, q, k, v, &z, (float)scale, causal, bh / z.H, bh % z.H, base + omp_get_thread_num() * words);
  flow_tensor_decref(st);
  return 0;
}

/* The backward's operands. */
typedef struct grads {
  flow_tensor *dq, *dk, *dv;
  const flow_tensor *q, *k, *v, *o, *dout;
  const float *lse, *dlse;
} grads;

/* Backward of head (b, h), P recomputed per block from q, k and lse, Di = dO_i . O_i - dlse_i:
 *   dV += P^T dO,  dP = dO V^T,  dS = P (dP - Di),  dQ = scale dS K,  dK += scale dS^T Q. */
typedef struct bwd_scratch {
  uint32_t *qw, *qi, *kr, *kd, *kt, *vr, *vd, *gw, *gi;   /* q, k, v, dO: rows (w, r), tpairs (d), rpairs (i, t) */
  uint32_t *pi, *si, *sw;   /* a block's P and dS as rpairs, dS as bf16 rows */
  float *S, *dP, *dk, *dv;  /* a block's P and dP (then dS); dK and dV summed over the blocks */
  float *qb, *buf, *Dr;     /* dQ's rows (bf16 outputs), two rows of Dv, each row's D */
} bwd_scratch;

/* The backward's buffers in the scratch at w (w NULL: none); returns its words. */
static int64_t backward_scratch(const sizes *z, uint32_t *w, bwd_scratch *s) {
  int64_t Tq2 = half_up(z->Tq), Tk2 = half_up(z->Tk);
  carve c = {w, 0};
  s->qw = take(&c, z->Tq * z->D2);
  s->qi = take(&c, Tq2 * z->Dp);
  s->kr = take(&c, z->Tk * z->D2);
  s->kd = take(&c, z->D2 * z->Tkp);
  s->kt = take(&c, Tk2 * z->Dp);
  s->vr = take(&c, z->Tk * z->Dv2);
  s->vd = take(&c, z->Dv2 * z->Tkp);
  s->gw = take(&c, z->Tq * z->Dv2);
  s->gi = take(&c, Tq2 * z->Dvp);
  s->pi = take(&c, BQ / 2 * z->Tkp);
  s->si = take(&c, BQ / 2 * z->Tkp);
  s->sw = take(&c, BQ * (z->Tkp / 2));
  s->S = take(&c, BQ * z->Tkp);
  s->dP = take(&c, BQ * z->Tkp);
  s->dk = take(&c, z->Tk * z->Dp);
  s->dv = take(&c, z->Tk * z->Dvp);
  s->qb = take(&c, BQ * z->Dp);
  s->buf = take(&c, 2 * z->Dv);
  s->Dr = take(&c, BQ);
  return c.words;
}

static void backward_head(const grads *g, const sizes *z, float scale, bool causal, int64_t b, int64_t h,
                          uint32_t *w) {
  int64_t Tq = z->Tq, Tk = z->Tk, Tkp = z->Tkp, D = z->D, Dv = z->Dv;
  bwd_scratch sc;
  backward_scratch(z, w, &sc);
  uint32_t *qw = sc.qw, *qi = sc.qi, *kr = sc.kr, *kd = sc.kd, *kt = sc.kt, *vr = sc.vr, *vd = sc.vd, *gw = sc.gw;
  uint32_t *gi = sc.gi, *pi = sc.pi, *si = sc.si, *sw = sc.sw;
  float *S = sc.S, *dP = sc.dP, *dk = sc.dk, *dv = sc.dv, *qb = sc.qb, *buf = sc.buf, *Dr = sc.Dr;
  mat mq = head_of(g->q, b, h), mk = head_of(g->k, b, h), mv = head_of(g->v, b, h);
  mat mo = head_of(g->o, b, h), mg = head_of(g->dout, b, h);
  pack_rows((uint16_t *)qw, 2 * z->D2, &mq, Tq, D);
  pack_rpairs(qi, z->Dp, (uint16_t *)qw, 2 * z->D2, Tq, D);
  pack_rows((uint16_t *)kr, 2 * z->D2, &mk, Tk, D);
  pack_tpairs(kd, Tkp, kr, Tk, z->D2);
  pack_rpairs(kt, z->Dp, (uint16_t *)kr, 2 * z->D2, Tk, D);
  pack_rows((uint16_t *)vr, 2 * z->Dv2, &mv, Tk, Dv);
  pack_tpairs(vd, Tkp, vr, Tk, z->Dv2);
  pack_rows((uint16_t *)gw, 2 * z->Dv2, &mg, Tq, Dv);
  pack_rpairs(gi, z->Dvp, (uint16_t *)gw, 2 * z->Dv2, Tq, Dv);
  memset(dk, 0, (size_t)(Tk * z->Dp) * 4);
  memset(dv, 0, (size_t)(Tk * z->Dvp) * 4);
  int64_t hq = (b * z->H + h) * Tq;
  const float *lse = g->lse + hq, *dlse = g->dlse + hq;
  bool bf = g->dq->dtype == FLOW_BF16;
  size_t es = bf ? 2 : 4;
  for (int64_t i0 = 0; i0 < Tq; i0 += BQ) {
    int64_t br = Tq - i0 < BQ ? Tq - i0 : BQ, br2 = half_up(br), nk = causal ? i0 + br : Tk, nk2 = half_up(nk);
    product(br, nk, z->D2, qw + i0 * z->D2, z->D2, 1, kd, Tkp, S, Tkp, scale, false);
    /* rows in pairs: P (and dS) as float32 rows, bf16 rows and pairs along the rows in one pass */
    for (int64_t i = 0; i < br; i += 2) {
      bool two = i + 1 < br;
      int64_t lim = causal ? i0 + i + 1 : nk;
      exp_pair(pi + i / 2 * Tkp, S + i * Tkp, two ? S + (i + 1) * Tkp : NULL, lim, causal ? lim + 1 : nk,
               lse[i0 + i], two ? lse[i0 + i + 1] : 0, nk);
    }
    product(nk, Dv, br2, pi, 1, Tkp, gi + i0 / 2 * z->Dvp, z->Dvp, dv, z->Dvp, 1, true);
    product(br, nk, z->Dv2, gw + i0 * z->Dv2, z->Dv2, 1, vd, Tkp, dP, Tkp, 1, false);
    for (int64_t i = 0; i < br; i++) {   /* D_i = dO_i . O_i - dlse_i */
      const float *gr = row_f32(&mg, i0 + i, Dv, buf), *orow = row_f32(&mo, i0 + i, Dv, buf + Dv);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < Dv; c += 16) acc = _mm512_fmadd_ps(load_n(gr + c, Dv - c), load_n(orow + c, Dv - c), acc);
      Dr[i] = _mm512_reduce_add_ps(acc) - dlse[i0 + i];
    }
    for (int64_t i = 0; i < br; i += 2) {
      bool two = i + 1 < br;
      ds_pair(si + i / 2 * Tkp, (uint16_t *)(sw + i * nk2), two ? (uint16_t *)(sw + (i + 1) * nk2) : NULL, S + i * Tkp,
              two ? S + (i + 1) * Tkp : NULL, dP + i * Tkp, two ? dP + (i + 1) * Tkp : NULL, Dr[i], two ? Dr[i + 1] : 0,
              nk, 2 * nk2);
    }
    float *dqo = bf ? qb : (float *)((char *)flow_tensor_data(g->dq) + (hq + i0) * D * es);
    product(br, D, nk2, sw, nk2, 1, kt, z->Dp, dqo, bf ? z->Dp : D, scale, false);
    if (bf)
      for (int64_t i = 0; i < br; i++)
        put_row((char *)flow_tensor_data(g->dq) + (hq + i0 + i) * D * es, true, qb + i * z->Dp, D);
    product(nk, D, br2, si, 1, Tkp, qi + i0 / 2 * z->Dp, z->Dp, dk, z->Dp, scale, true);
  }
  int64_t hk = (b * z->H + h) * Tk;
  for (int64_t j = 0; j < Tk; j++) {
    put_row((char *)flow_tensor_data(g->dk) + (hk + j) * D * es, bf, dk + j * z->Dp, D);
    put_row((char *)flow_tensor_data(g->dv) + (hk + j) * Dv * es, bf, dv + j * z->Dvp, Dv);
  }
}

int flow_cpu_attention_backward_bf16(flow_tensor *dq, flow_tensor *dk, flow_tensor *dv, const flow_tensor *q,
                                     const flow_tensor *k, const flow_tensor *v, const flow_tensor *o,
                                     const flow_tensor *lse, const flow_tensor *dout, const flow_tensor *dlse,
                                     double scale, bool causal) {
  sizes z = sizes_of(q, v);
  flow_tensor *tl = NULL, *tdl = NULL;
  const float *lp = flow_cpu_dense(lse, &tl), *dlp = lp ? flow_cpu_dense(dlse, &tdl) : NULL;
  int t = threads_for(&z);
  bwd_scratch none;
  int64_t words = backward_scratch(&z, NULL, &none);
  flow_tensor *st = dlp ? scratch(t, words, "scaled_dot_product_attention_grad") : NULL;
  if (st) {
    grads g = {dq, dk, dv, q, k, v, o, dout, lp, dlp};
    uint32_t *base = flow_tensor_data(st);
#pragma omp parallel for schedule(static) num_threads(t) if (t > 1)
    for (int64_t bh = 0; bh < z.B * z.H; bh++)
      backward_head(&g, &z, (float)scale, causal, bh / z.H, bh % z.H, base + omp_get_thread_num() * words);
  }
  flow_tensor_decref(tl);
  flow_tensor_decref(tdl);
  flow_tensor_decref(st);
  return st ? 0 : -1;
}
