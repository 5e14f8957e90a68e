/* Elementwise unary kernels and their fused gradients: one generic loop, instantiated per op and
 * dtype, cut among threads for large tensors (iter.h). float32 exp/log/tanh/sigmoid/gelu use
 * branch-free polynomial forms that the compiler vectorises; float64 goes through libm. */

/* -O2's vectoriser refuses to if-convert selects next to floating-point ops that "may trap"; these
 * kernels never read the floating-point exception flags, so let it. */
#pragma GCC optimize("no-trapping-math")

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "cpu.h"
#include "iter.h"

/* The per-element helpers must inline into the loops for those to vectorise. */
#define ELEMENT static inline __attribute__((always_inline))

/* clamp's bounds in each dtype: the context every loop receives. */
typedef struct bounds {
  float lo_f, hi_f;
  double lo_d, hi_d;
  int64_t lo_i, hi_i;
} bounds;

/* ---- float32 exp, the building block of tanh, sigmoid and gelu ------------------------------- */

static inline float bits_to_float(uint32_t u) { union { uint32_t u; float f; } v = {.u = u}; return v.f; }
static inline uint32_t float_to_bits(float f) { union { uint32_t u; float f; } v = {.f = f}; return v.u; }

/* exp(x) = 2^k * e^r with k = round(x / ln 2), |r| <= ln2 / 2 and e^r from the Cephes degree-6
 * polynomial (relative error ~1e-7): e^r, and k, which comes from the float's mantissa after
 * adding 1.5 * 2^23. The callers build 2^k. */
ELEMENT float exp_poly_f32(float x, int32_t *k) {
  float z = x * 1.44269504088896341f + 12582912.0f;
  *k = (int32_t)(float_to_bits(z) - 0x4B400000u);
  float n = z - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

/* exp on the whole float range: x clamped, 2^k built as two halves so k = 128 does not overflow,
 * and 0, inf and NaN selected. */
ELEMENT float exp_f32(float x) {
  float xc = x > -87.33654f ? x : -87.33654f;
  xc = xc < 88.72283f ? xc : 88.72283f;
  int32_t k;
  float p = exp_poly_f32(xc, &k);
  int32_t h = k / 2;
  float y = p * bits_to_float((uint32_t)(h + 127) << 23) * bits_to_float((uint32_t)(k - h + 127) << 23);
  y = x < -87.33654f ? 0.0f : y;
  y = x > 88.72283f ? INFINITY : y;
  return x == x ? y : x;
}

/* log(x) = e ln2 + log(1 + f) with x = 2^e (1 + f), 1 + f in [sqrt(1/2), sqrt(2)), and log(1 + f)
 * from the Cephes degree-9 polynomial (< 1 ulp). Subnormals are scaled by 2^25 first. */
ELEMENT float log_f32(float x) {
  bool sub = x < 1.17549435e-38f;
  uint32_t u = float_to_bits(sub ? x * 33554432.0f : x);
  int32_t e = (int32_t)((u >> 23) & 0xff) - 126 - (sub ? 25 : 0);
  float m = bits_to_float((u & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
  bool small = m < 0.70710678118654752f;
  e = small ? e - 1 : e;
  float f = small ? m + m - 1.0f : m - 1.0f, z = f * f;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  float fe = (float)e;
  float r = f + (y * f * z - 2.12194440e-4f * fe - 0.5f * z) + 0.693359375f * fe;
  r = x == 0 ? -INFINITY : r;
  r = x < 0 ? NAN : r;
  r = x == INFINITY ? INFINITY : r;
  return x == x ? r : x;
}

/* tanh: the Cephes odd polynomial below 0.625, else 1 - 2 / (e^2|x| + 1) with x's sign. */
ELEMENT float tanh_f32(float x) {
  float a = x < 0 ? -x : x, s = x * x;
  float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                  1.33314422036e-1f) * s - 3.33332819422e-1f) * s * x + x;
  float big = 1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f);
  big = x < 0 ? -big : big;
  return a < 0.625f ? small : big;
}

/* GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 * Since 0.5 (1 + tanh u) = sigmoid(2u), gelu(x) = x / (1 + e^-2u). */
#define GELU_C 0.7978845608028654
#define GELU_A 0.044715

/* e^z for the logistic function 1 / (1 + e^z): Cephes' steps as exp_f32, with the exponent k
 * clamped to a normal float's [-126, 127] in place of exp_f32's clamp of z and its selects of 0,
 * inf and NaN. Equal to exp_f32 for |z| <= 87; beyond, positive and finite but not e^z (callers
 * select their limits there), and NaN for z = +-inf. GELU with it ran 1.65x faster than with
 * exp_f32, whose selects GCC turned into a second, masked division per vector. */
ELEMENT float exp_logistic_f32(float z) {
  int32_t k;
  float p = exp_poly_f32(z, &k);
  k = k < -126 ? -126 : k;
  k = k > 127 ? 127 : k;
  return p * bits_to_float((uint32_t)(k + 127) << 23);
}

/* Beyond |2u| = 87 gelu is x * 0 (-0, and NaN at -inf) below and x above, as torch's
 * 0.5 x (1 + tanh u). */
ELEMENT float gelu_tanh_f32(float x) {
  float z = -2.0f * (float)GELU_C * (x + (float)GELU_A * x * x * x);
  float y = x / (1.0f + exp_logistic_f32(z));
  y = z < -87.0f ? x : y;
  return z > 87.0f ? x * 0.0f : y;
}

ELEMENT double gelu_tanh_f64(double x) {
  double u = GELU_C * (x + GELU_A * x * x * x);
  return 0.5 * x * (1.0 + tanh(u));
}

/* d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u) */
#define GELU_GRAD(T, TANH)                                                                       \
  ELEMENT T gelu_tanh_grad_##T(T x) {                                                                \
    T x2 = x * x, t = TANH((T)GELU_C * (x + (T)GELU_A * x2 * x));                                \
    return (T)0.5 * (1 + t) + (T)0.5 * x * (1 - t * t) * (T)GELU_C * (1 + 3 * (T)GELU_A * x2);   \
  }
/* float32, the same derivative through s = sigmoid(2u) = 0.5 (1 + t), so 0.5 (1 - t^2) = 2 s (1 - s):
 * one exp and one division, where tanh_f32 evaluates a polynomial as well (1.5x faster);
 * 1 - s = e s with e = exp(-2u). */
ELEMENT float gelu_tanh_grad_float(float x) {
  float x2 = x * x, z = -2.0f * (float)GELU_C * (x + (float)GELU_A * x2 * x), e = exp_logistic_f32(z);
  float s = 1.0f / (1.0f + e), s1 = e * s; /* 1 - s without cancellation */
  float d = s + 2.0f * x * s * s1 * (float)GELU_C * (1.0f + 3.0f * (float)GELU_A * x2);
  /* below 2u = -87 (s = 0): 0, and NaN at -inf (0 * inf in torch's form); above 2u = 87 the
   * formula gives 1, and NaN at inf */
  return z > 87.0f ? x - x : d;
}
GELU_GRAD(double, tanh)

/* silu = x sigmoid(x) = x / (1 + e^-x), and its derivative s (1 + x (1 - s)), s = sigmoid(x), on the
 * same exp as gelu's tanh form (libm's expf, a call per element, ran 8x slower than that gelu).
 * Below x = -88.37 (torch's e^-x overflows at -88.72) both are x * 0: -0, and NaN at -inf. */
ELEMENT float silu_f32(float x) {
  float y = x / (1.0f + exp_logistic_f32(-x));
  y = x > 87.0f ? x : y;
  return x < -88.37f ? x * 0.0f : y;
}

ELEMENT float silu_grad_f32(float x) {
  float e = exp_logistic_f32(-x), s = 1.0f / (1.0f + e);
  float d = s * (1.0f + x * (e * s)); /* 1 - s = e s without cancellation */
  return x < -88.37f ? x * 0.0f : d;   /* above x = 87 the formula gives 1, and NaN at inf */
}

/* GELU, exact (torch's default): x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)) the normal CDF;
 * d/dx = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). */
#define INV_SQRT2PI 0.3989422804014327

/* float32 Phi without libm's erff, a call per element that no loop vectorises. With z = x / sqrt 2:
 *   |z| < 1:  Phi = 0.5 + 0.5 z P(z^2),  P a degree-7 fit of erf(z) / z;
 *   |z| >= 1: erfc(|z|) = e^-z^2 R(t), t = 1 / (1 + |z| / 2),  R a degree-12 fit of erfc(z) e^(z^2)
 *             on 1 <= z <= 10 (clamped there: erfc(10) = 2e-45), and Phi = erfc / 2 below 0,
 *             1 - erfc / 2 above, so the left tail keeps its relative accuracy (1 + erf cancels).
 * Both fits: least squares in long double on 2000 Chebyshev nodes, relative. Measured on every
 * float in [-10, 10] against double (spec/gelu_spec.lua): the erf behind it within 1.5e-7
 * (libm's erff: 5e-8), Phi within 1.2e-7 relative for x > -1.4, 7e-6 in the far left tail
 * (from the rounding of z^2). */
/* erf(z) / z for |z| < 1, from s = z^2 (P above) */
ELEMENT float erf_small_f32(float s) {
  float p = -9.689741128e-06f;
  p = p * s + 1.127473796e-04f;
  p = p * s - 8.485438920e-04f;
  p = p * s + 5.221138696e-03f;
  p = p * s - 2.686547552e-02f;
  p = p * s + 1.128378344e-01f;
  p = p * s - 3.761263855e-01f;
  p = p * s + 1.128379167e+00f;
  return p;
}

/* erfc(a) for a >= 1 (R above; a clamped to 10) */
ELEMENT float erfc_big_f32(float a) {
  float ac = a < 10.0f ? a : 10.0f, t = 1.0f / (1.0f + 0.5f * ac);
  float r = 2.007251381e-02f;
  r = r * t - 2.464657083e-02f;
  r = r * t - 1.642608101e-01f;
  r = r * t + 5.167127669e-01f;
  r = r * t - 5.792430222e-01f;
  r = r * t + 2.677344962e-01f;
  r = r * t - 1.400963910e-01f;
  r = r * t + 1.236251653e-01f;
  r = r * t + 1.680286025e-01f;
  r = r * t + 2.480251612e-01f;
  r = r * t + 2.819814503e-01f;
  r = r * t + 2.821011913e-01f;
  r = r * t - 1.624615864e-07f;
  return exp_f32(-ac * ac) * r;
}

ELEMENT float normal_cdf_f32(float x) {
  float z = x * (float)M_SQRT1_2, a = z < 0 ? -z : z;
  float erfc_a = erfc_big_f32(a);
  float tail = z < 0 ? 0.5f * erfc_a : 1.0f - 0.5f * erfc_a;
  return a < 1.0f ? 0.5f + 0.5f * z * erf_small_f32(z * z) : tail;
}

/* erf itself from the same two fits (libm's erff is a call per element, 15 ns here): z P(z^2)
 * below 1, 1 - erfc(|z|) with z's sign above; NaN stays NaN. */
ELEMENT float erf_f32(float z) {
  float a = z < 0 ? -z : z, big = 1.0f - erfc_big_f32(a);
  float y = a < 1.0f ? z * erf_small_f32(z * z) : (z < 0 ? -big : big);
  return z != z ? z : y;
}

ELEMENT float gelu_f32(float x) { return x * normal_cdf_f32(x); }
ELEMENT double gelu_f64(double x) { return 0.5 * x * (1 + erf(x * M_SQRT1_2)); }
ELEMENT float gelu_grad_f32(float x) {
  return normal_cdf_f32(x) + x * exp_f32(-0.5f * x * x) * (float)INV_SQRT2PI;
}
ELEMENT double gelu_grad_f64(double x) {
  return 0.5 * (1 + erf(x * M_SQRT1_2)) + x * exp(-0.5 * x * x) * INV_SQRT2PI;
}

/* float32 log1p and expm1 on the vectorised exp and log (libm's log1pf and expf are a call per
 * element: 13-17 ns here), by Kahan's corrections for the rounding of u = 1 + x and u = e^x:
 *   log1p(x) = log(u) x / (u - 1)  (x where u rounds to 1),
 *   expm1(x) = (u - 1) x / log(u)  (x where u rounds to 1, -1 where u - 1 does),
 * a few ulps from the exact values; inf passes as inf. */
ELEMENT float log1p_f32(float x) {
  float u = 1.0f + x, y = u == 1.0f ? x : log_f32(u) * (x / (u - 1.0f));
  return x == INFINITY ? x : y;
}

ELEMENT float expm1_f32(float x) {
  float u = exp_f32(x), um = u - 1.0f;
  float y = u == 1.0f ? x : um == -1.0f ? -1.0f : um * (x / log_f32(u));
  return u == INFINITY ? u : y;
}

/* float32 sin and cos by Cephes' sinf and cosf: |x| reduced by multiples of pi/4 in three parts
 * (exact below |x| = 8192), then sin's or cos's polynomial on [-pi/4, pi/4] by octant; within
 * 2e-7 of the exact values. Larger |x|, inf and NaN are left to libm by the loops (DEF_TRIG). */
#define TRIG_FAR 8192.0f
ELEMENT float trig_octant_f32(float x, float *sn, float *cs) {
  float a = x < 0 ? -x : x;
  a = a <= TRIG_FAR ? a : 0.0f; /* redone by libm */
  int32_t j = (int32_t)(a * 1.27323954473516f);
  j += j & 1;
  float y = (float)j;
  float z = ((a - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f, zz = z * z;
  *sn = ((-1.9515295891e-4f * zz + 8.3321608736e-3f) * zz - 1.6666654611e-1f) * zz * z + z;
  *cs = ((2.443315711809948e-5f * zz - 1.388731625493765e-3f) * zz + 4.166664568298827e-2f) * zz * zz - 0.5f * zz + 1.0f;
  return (float)(j & 7); /* 0, 2, 4 or 6 */
}

/* Octants 2 and 6 take the other polynomial; 4 and 6 flip sin's sign, 2 and 4 cos's (selects on
 * single comparisons: GCC left a loop with || or != of comparisons unvectorised). */
ELEMENT float sin_f32(float x) {
  float sn, cs, o = trig_octant_f32(x, &sn, &cs), q = o >= 4.0f ? o - 4.0f : o;
  float r = q == 2.0f ? cs : sn;
  r = o >= 4.0f ? -r : r;
  return float_to_bits(x) >> 31 ? -r : r; /* x's sign, -0 included */
}

ELEMENT float cos_f32(float x) {
  float sn, cs, o = trig_octant_f32(x, &sn, &cs), q = o >= 4.0f ? o - 4.0f : o;
  float r = q == 2.0f ? -sn : cs;
  return o >= 4.0f ? -r : r;
}

/* softplus = log(1 + e^x), x itself above the threshold 20 (torch's defaults, beta = 1);
 * d/dx = sigmoid(x) (1 above the threshold). */
ELEMENT double softplus_double(double x) { return x > 20 ? x : log1p(exp(x)); }
ELEMENT float softplus_float(float x) { return x > 20 ? x : log1p_f32(exp_f32(x)); }

/* its derivative sigmoid(x) on gelu's exp (SIGMOIDF's exp_f32 ran it 2.3x slower: the division
 * after exp_f32's selects again): 1 above the threshold, 0 below x = -87 */
ELEMENT float softplus_grad_f32(float x) {
  float s = 1.0f / (1.0f + exp_logistic_f32(-x));
  s = x < -87.0f ? 0.0f : s;
  return x > 20 ? 1.0f : s;
}

/* ---- the loops ---------------------------------------------------------------------------- */

/* Dense loops run over a multiple of 32 elements first: -O2's "very cheap" vectoriser only takes
 * loops it needs no scalar epilogue for. ivdep: out is a fresh buffer or exactly the input. */
#define DEF_UNARY(fname, T, F)                                                                   \
  FLOW_CPU_DISPATCH static void fname(char **p, const int64_t *s, int64_t n, void *ctx) {        \
    const bounds *b = ctx;                                                                       \
    (void)b;                                                                                     \
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {                                                \
      T *o = (T *)p[0];                                                                          \
      const T *x = (const T *)p[1];                                                              \
      int64_t m = n & ~(int64_t)31;                                                              \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < m; i++) o[i] = F(x[i]);                      \
      for (int64_t i = m; i < n; i++) o[i] = F(x[i]);                                            \
    } else {                                                                                     \
      char *o = p[0];                                                                            \
      const char *x = p[1];                                                                      \
      for (int64_t i = 0; i < n; i++, o += s[0], x += s[1]) *(T *)o = F(*(const T *)x);         \
    }                                                                                            \
  }

/* gin = F(s, g); g may also be one value broadcast (the gradient of a sum) */
#define DEF_BACKWARD(fname, T, F)                                                                \
  FLOW_CPU_DISPATCH static void fname(char **p, const int64_t *st, int64_t n, void *ctx) {       \
    const bounds *b = ctx;                                                                       \
    (void)b;                                                                                     \
    if (st[0] == sizeof(T) && st[1] == sizeof(T) && (st[2] == sizeof(T) || st[2] == 0)) {        \
      T *o = (T *)p[0];                                                                          \
      const T *s = (const T *)p[1], *g = (const T *)p[2];                                        \
      int64_t m = n & ~(int64_t)31;                                                              \
      if (st[2] == 0) {                                                                          \
        const T gv = *g;                                                                         \
        _Pragma("GCC ivdep") for (int64_t i = 0; i < m; i++) o[i] = F(s[i], gv);                 \
        for (int64_t i = m; i < n; i++) o[i] = F(s[i], gv);                                      \
        return;                                                                                  \
      }                                                                                          \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < m; i++) o[i] = F(s[i], g[i]);                 \
      for (int64_t i = m; i < n; i++) o[i] = F(s[i], g[i]);                                      \
    } else {                                                                                     \
      char *o = p[0];                                                                            \
      const char *s = p[1], *g = p[2];                                                           \
      for (int64_t i = 0; i < n; i++, o += st[0], s += st[1], g += st[2])                        \
        *(T *)o = F(*(const T *)s, *(const T *)g);                                               \
    }                                                                                            \
  }

/* ---- forward, per dtype ------------------------------------------------------------------- */

#define NEG(v) (-(v))
#define ABS(v) ((v) < 0 ? -(v) : (v))
/* NaN passes (as in torch): only v < 0 maps to 0 */
#define RELU(v) ((v) < 0 ? 0 : (v))
#define RSQRTF(v) (1.0f / sqrtf(v))
#define RSQRTD(v) (1.0 / sqrt(v))
#define SIGMOIDF(v) (1.0f / (1.0f + exp_f32(-(v))))
#define SIGMOIDD(v) (1.0 / (1.0 + exp(-(v))))
/* min(max(v, lo), hi) as torch: NaN passes unchanged, and lo > hi gives hi everywhere */
#define CLAMP(v, lo, hi) ((v) < (lo) ? ((lo) > (hi) ? (hi) : (lo)) : ((v) > (hi) ? (hi) : (v)))
#define CLAMPF(v) CLAMP(v, b->lo_f, b->hi_f)
#define CLAMPD(v) CLAMP(v, b->lo_d, b->hi_d)
#define CLAMPI(v) CLAMP(v, b->lo_i, b->hi_i)
/* silu = x sigmoid(x) (float32: silu_f32) */
#define SILUD(v) ((v) / (1.0 + exp(-(v))))
/* sign: -1, 0 or 1; NaN gives 0, as torch */
#define SIGN(v) ((v) > 0 ? 1 : ((v) < 0 ? -1 : 0))
/* floor, ceil, round (half to even, as torch) and trunc leave integers as they are */
#define IDENT(v) (v)

DEF_UNARY(neg_f32, float, NEG)
DEF_UNARY(neg_f64, double, NEG)
DEF_UNARY(neg_i64, int64_t, NEG)
DEF_UNARY(neg_i32, int32_t, NEG)
DEF_UNARY(abs_f32, float, fabsf)
DEF_UNARY(abs_f64, double, fabs)
DEF_UNARY(abs_i64, int64_t, ABS)
DEF_UNARY(abs_i32, int32_t, ABS)
DEF_UNARY(exp_f32v, float, exp_f32)
DEF_UNARY(exp_f64, double, exp)
DEF_UNARY(log_f32v, float, log_f32)
DEF_UNARY(log_f64, double, log)
DEF_UNARY(sqrt_f32, float, sqrtf)
DEF_UNARY(sqrt_f64, double, sqrt)
DEF_UNARY(rsqrt_f32, float, RSQRTF)
DEF_UNARY(rsqrt_f64, double, RSQRTD)
DEF_UNARY(tanh_f32v, float, tanh_f32)
DEF_UNARY(tanh_f64, double, tanh)
DEF_UNARY(sigmoid_f32, float, SIGMOIDF)
DEF_UNARY(sigmoid_f64, double, SIGMOIDD)
DEF_UNARY(relu_f32, float, RELU)
DEF_UNARY(relu_f64, double, RELU)
DEF_UNARY(relu_i64, int64_t, RELU)
DEF_UNARY(relu_i32, int32_t, RELU)
DEF_UNARY(gelu_f32v, float, gelu_f32)
DEF_UNARY(gelu_f64v, double, gelu_f64)
DEF_UNARY(gelu_tanh_f32v, float, gelu_tanh_f32)
DEF_UNARY(gelu_tanh_f64v, double, gelu_tanh_f64)
DEF_UNARY(silu_f32v, float, silu_f32)
DEF_UNARY(silu_f64, double, SILUD)
DEF_UNARY(sin_f64, double, sin)
DEF_UNARY(cos_f64, double, cos)
DEF_UNARY(erf_f32v, float, erf_f32)
DEF_UNARY(erf_f64, double, erf)
DEF_UNARY(log1p_f32v, float, log1p_f32)
DEF_UNARY(log1p_f64, double, log1p)
DEF_UNARY(expm1_f32v, float, expm1_f32)
DEF_UNARY(expm1_f64, double, expm1)
DEF_UNARY(softplus_f32, float, softplus_float)
DEF_UNARY(softplus_f64, double, softplus_double)
DEF_UNARY(sign_f32, float, SIGN)
DEF_UNARY(sign_f64, double, SIGN)
DEF_UNARY(sign_i64, int64_t, SIGN)
DEF_UNARY(sign_i32, int32_t, SIGN)
DEF_UNARY(floor_f32, float, floorf)
DEF_UNARY(floor_f64, double, floor)
DEF_UNARY(ceil_f32, float, ceilf)
DEF_UNARY(ceil_f64, double, ceil)
DEF_UNARY(round_f32, float, rintf)
DEF_UNARY(round_f64, double, rint)
DEF_UNARY(trunc_f32, float, truncf)
DEF_UNARY(trunc_f64, double, trunc)
DEF_UNARY(ident_i64, int64_t, IDENT)
DEF_UNARY(ident_i32, int32_t, IDENT)
DEF_UNARY(clamp_f32, float, CLAMPF)
DEF_UNARY(clamp_f64, double, CLAMPD)
DEF_UNARY(clamp_i64, int64_t, CLAMPI)
DEF_UNARY(clamp_i32, int32_t, CLAMPI)

/* float32 sin and cos, forward (gradient: g cos x and -g sin x): the polynomials on the whole
 * dense run, then libm on the elements beyond TRIG_FAR or not finite, if the run had any. */
#define DEF_TRIG(fname, F, LIBM, SIGN)                                                           \
  FLOW_CPU_DISPATCH static void fname(char **p, const int64_t *st, int64_t n, void *ctx) {       \
    (void)ctx;                                                                                   \
    if (st[0] == 4 && st[1] == 4) {                                                              \
      float *o = (float *)p[0];                                                                  \
      const float *x = (const float *)p[1];                                                      \
      int64_t m = n & ~(int64_t)31;                                                              \
      int far = 0;                                                                               \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < m; i++) {                                     \
        o[i] = SIGN F(x[i]);                                                                     \
        far |= !(fabsf(x[i]) <= TRIG_FAR);                                                       \
      }                                                                                          \
      for (int64_t i = m; i < n; i++) {                                                          \
        o[i] = SIGN F(x[i]);                                                                     \
        far |= !(fabsf(x[i]) <= TRIG_FAR);                                                       \
      }                                                                                          \
      if (far)                                                                                   \
        for (int64_t i = 0; i < n; i++)                                                          \
          if (!(fabsf(x[i]) <= TRIG_FAR)) o[i] = SIGN LIBM(x[i]);                                \
    } else {                                                                                     \
      char *o = p[0];                                                                            \
      const char *x = p[1];                                                                      \
      for (int64_t i = 0; i < n; i++, o += st[0], x += st[1]) {                                  \
        float v = *(const float *)x;                                                             \
        *(float *)o = SIGN(fabsf(v) <= TRIG_FAR ? F(v) : LIBM(v));                               \
      }                                                                                          \
    }                                                                                            \
  }
DEF_TRIG(sin_f32v, sin_f32, sinf, +)
DEF_TRIG(cos_f32v, cos_f32, cosf, +)

/* gin = g * (SIGN F(s)) for the gradients, g dense or one value */
#define DEF_TRIG_BACKWARD(fname, F, LIBM, SIGN)                                                  \
  FLOW_CPU_DISPATCH static void fname(char **p, const int64_t *st, int64_t n, void *ctx) {       \
    (void)ctx;                                                                                   \
    if (st[0] == 4 && st[1] == 4 && (st[2] == 4 || st[2] == 0)) {                                \
      float *o = (float *)p[0];                                                                  \
      const float *x = (const float *)p[1], *g = (const float *)p[2];                            \
      int64_t m = n & ~(int64_t)31, gs = st[2] / 4;                                              \
      int far = 0;                                                                               \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < m; i++) {                                     \
        o[i] = g[i * gs] * (SIGN F(x[i]));                                                       \
        far |= !(fabsf(x[i]) <= TRIG_FAR);                                                       \
      }                                                                                          \
      for (int64_t i = m; i < n; i++) {                                                          \
        o[i] = g[i * gs] * (SIGN F(x[i]));                                                       \
        far |= !(fabsf(x[i]) <= TRIG_FAR);                                                       \
      }                                                                                          \
      if (far)                                                                                   \
        for (int64_t i = 0; i < n; i++)                                                          \
          if (!(fabsf(x[i]) <= TRIG_FAR)) o[i] = g[i * gs] * (SIGN LIBM(x[i]));                  \
    } else {                                                                                     \
      char *o = p[0];                                                                            \
      const char *x = p[1], *g = p[2];                                                           \
      for (int64_t i = 0; i < n; i++, o += st[0], x += st[1], g += st[2]) {                      \
        float v = *(const float *)x;                                                             \
        *(float *)o = *(const float *)g * (SIGN(fabsf(v) <= TRIG_FAR ? F(v) : LIBM(v)));         \
      }                                                                                          \
    }                                                                                            \
  }
DEF_TRIG_BACKWARD(sin_bf32, cos_f32, cosf, +)
DEF_TRIG_BACKWARD(cos_bf32, sin_f32, sinf, -)

/* [code][f32 f64 i64 i32]; NULL: not defined for that dtype */
static const flow_iter_fn forward[FLOW_NUNARY][4] = {
  [FLOW_UN_NEG] = {neg_f32, neg_f64, neg_i64, neg_i32},
  [FLOW_UN_ABS] = {abs_f32, abs_f64, abs_i64, abs_i32},
  [FLOW_UN_EXP] = {exp_f32v, exp_f64},
  [FLOW_UN_LOG] = {log_f32v, log_f64},
  [FLOW_UN_SQRT] = {sqrt_f32, sqrt_f64},
  [FLOW_UN_RSQRT] = {rsqrt_f32, rsqrt_f64},
  [FLOW_UN_TANH] = {tanh_f32v, tanh_f64},
  [FLOW_UN_SIGMOID] = {sigmoid_f32, sigmoid_f64},
  [FLOW_UN_RELU] = {relu_f32, relu_f64, relu_i64, relu_i32},
  [FLOW_UN_GELU] = {gelu_f32v, gelu_f64v},
  [FLOW_UN_GELU_TANH] = {gelu_tanh_f32v, gelu_tanh_f64v},
  [FLOW_UN_CLAMP] = {clamp_f32, clamp_f64, clamp_i64, clamp_i32},
  [FLOW_UN_SILU] = {silu_f32v, silu_f64},
  [FLOW_UN_SIN] = {sin_f32v, sin_f64},
  [FLOW_UN_COS] = {cos_f32v, cos_f64},
  [FLOW_UN_ERF] = {erf_f32v, erf_f64},
  [FLOW_UN_LOG1P] = {log1p_f32v, log1p_f64},
  [FLOW_UN_EXPM1] = {expm1_f32v, expm1_f64},
  [FLOW_UN_SOFTPLUS] = {softplus_f32, softplus_f64},
  [FLOW_UN_SIGN] = {sign_f32, sign_f64, sign_i64, sign_i32},
  [FLOW_UN_FLOOR] = {floor_f32, floor_f64, ident_i64, ident_i32},
  [FLOW_UN_CEIL] = {ceil_f32, ceil_f64, ident_i64, ident_i32},
  [FLOW_UN_ROUND] = {round_f32, round_f64, ident_i64, ident_i32},
  [FLOW_UN_TRUNC] = {trunc_f32, trunc_f64, ident_i64, ident_i32},
};

/* ---- backward: gin = f'(.) * g ------------------------------------------------------------ */

#define G_ABS(x, g) ((x) > 0 ? (g) : ((x) < 0 ? -(g) : 0))      /* sign(x) g; 0 at the kink */
#define G_EXP(y, g) ((y) * (g))
#define G_LOG(x, g) ((g) / (x))
#define G_SQRT(y, g) ((g) * 0.5f / (y))
#define G_RSQRT(y, g) ((g) * -0.5f * (y) * (y) * (y))            /* d x^-1/2 = -x^-3/2 / 2 */
#define G_TANH(y, g) ((g) * (1 - (y) * (y)))
#define G_SIGMOID(y, g) ((g) * (y) * (1 - (y)))
#define G_RELU(y, g) ((y) <= 0 ? 0 : (g))                         /* NaN passes g, as torch */
#define G_GELUF(x, g) ((g) * gelu_grad_f32(x))
#define G_GELUD(x, g) ((g) * gelu_grad_f64(x))
#define G_GELU_TANHF(x, g) ((g) * gelu_tanh_grad_float(x))
#define G_GELU_TANHD(x, g) ((g) * gelu_tanh_grad_double(x))
#define G_SILUF(x, g) ((g) * silu_grad_f32(x))
#define G_SILUD(x, g) ((g) * (1.0 + (x) * (1.0 - 1.0 / (1.0 + exp(-(x))))) / (1.0 + exp(-(x))))
#define G_SIND(x, g) ((g) * cos(x))
#define G_COSD(x, g) (-(g) * sin(x))
#define G_ERFF(x, g) ((g) * (float)M_2_SQRTPI * exp_f32(-(x) * (x)))   /* d erf = 2/sqrt(pi) e^-x^2 */
#define G_ERFD(x, g) ((g) * M_2_SQRTPI * exp(-(x) * (x)))
#define G_LOG1P(x, g) ((g) / (1 + (x)))
#define G_EXPM1(y, g) ((g) * ((y) + 1))
#define G_SOFTPLUSF(x, g) ((g) * softplus_grad_f32(x))
#define G_SOFTPLUSD(x, g) ((x) > 20 ? (g) : (g) / (1.0 + exp(-(x))))
/* the gradient passes where lo <= x <= hi */
#define G_CLAMPF(x, g) ((x) >= b->lo_f && (x) <= b->hi_f ? (g) : 0)
#define G_CLAMPD(x, g) ((x) >= b->lo_d && (x) <= b->hi_d ? (g) : 0)

#define DEF_BACKWARD2(NAME, F) DEF_BACKWARD(NAME##_bf32, float, F) DEF_BACKWARD(NAME##_bf64, double, F)
DEF_BACKWARD2(abs, G_ABS)
DEF_BACKWARD2(exp, G_EXP)
DEF_BACKWARD2(log, G_LOG)
DEF_BACKWARD2(sqrt, G_SQRT)
DEF_BACKWARD2(rsqrt, G_RSQRT)
DEF_BACKWARD2(tanh, G_TANH)
DEF_BACKWARD2(sigmoid, G_SIGMOID)
DEF_BACKWARD2(relu, G_RELU)
DEF_BACKWARD(gelu_bf32, float, G_GELUF)
DEF_BACKWARD(gelu_bf64, double, G_GELUD)
DEF_BACKWARD(gelu_tanh_bf32, float, G_GELU_TANHF)
DEF_BACKWARD(gelu_tanh_bf64, double, G_GELU_TANHD)
DEF_BACKWARD(silu_bf32, float, G_SILUF)
DEF_BACKWARD(silu_bf64, double, G_SILUD)
DEF_BACKWARD(sin_bf64, double, G_SIND)
DEF_BACKWARD(cos_bf64, double, G_COSD)
DEF_BACKWARD(erf_bf32, float, G_ERFF)
DEF_BACKWARD(erf_bf64, double, G_ERFD)
DEF_BACKWARD2(log1p, G_LOG1P)
DEF_BACKWARD2(expm1, G_EXPM1)
DEF_BACKWARD(softplus_bf32, float, G_SOFTPLUSF)
DEF_BACKWARD(softplus_bf64, double, G_SOFTPLUSD)
DEF_BACKWARD(clamp_bf32, float, G_CLAMPF)
DEF_BACKWARD(clamp_bf64, double, G_CLAMPD)

/* [code][f32 f64]; neg's gradient is a neg */
#define BROW(NAME) {NAME##_bf32, NAME##_bf64}
static const flow_iter_fn backward[FLOW_NUNARY][2] = {
  [FLOW_UN_ABS] = BROW(abs), [FLOW_UN_EXP] = BROW(exp), [FLOW_UN_LOG] = BROW(log),
  [FLOW_UN_SQRT] = BROW(sqrt), [FLOW_UN_RSQRT] = BROW(rsqrt), [FLOW_UN_TANH] = BROW(tanh),
  [FLOW_UN_SIGMOID] = BROW(sigmoid), [FLOW_UN_RELU] = BROW(relu), [FLOW_UN_GELU] = BROW(gelu),
  [FLOW_UN_CLAMP] = BROW(clamp), [FLOW_UN_GELU_TANH] = BROW(gelu_tanh), [FLOW_UN_SILU] = BROW(silu),
  [FLOW_UN_SIN] = BROW(sin), [FLOW_UN_COS] = BROW(cos), [FLOW_UN_ERF] = BROW(erf),
  [FLOW_UN_LOG1P] = BROW(log1p), [FLOW_UN_EXPM1] = BROW(expm1), [FLOW_UN_SOFTPLUS] = BROW(softplus),
};

/* ---- entry points ------------------------------------------------------------------------- */

static int dtype_slot(flow_dtype d) {
  switch (d) {
  case FLOW_F32: return 0;
  case FLOW_F64: return 1;
  case FLOW_I64: return 2;
  case FLOW_I32: return 3;
  default: return -1;
  }
}

/* Elements per thread worth waking one for (iter.h): a few ns each for libm and polynomial
 * functions, under a nanosecond for a sign, a select or a rounding. */
static int64_t grain(flow_unary_code code) {
  switch (code) {
  case FLOW_UN_NEG: case FLOW_UN_ABS: case FLOW_UN_RELU: case FLOW_UN_CLAMP: case FLOW_UN_SIGN:
  case FLOW_UN_FLOOR: case FLOW_UN_CEIL: case FLOW_UN_ROUND: case FLOW_UN_TRUNC:
    return FLOW_GRAIN_CHEAP;
  default:
    return FLOW_GRAIN_COSTLY;
  }
}

/* Integer bounds: the ceiling of lo and floor of hi, saturated to int64. */
static int64_t to_i64(double v) {
  if (v >= 9.2e18) return INT64_MAX;
  if (v <= -9.2e18) return INT64_MIN;
  return (int64_t)v;
}

static void make_bounds(bounds *b, double lo, double hi) {
  b->lo_d = lo;
  b->hi_d = hi;
  b->lo_f = (float)lo;
  b->hi_f = (float)hi;
  b->lo_i = to_i64(ceil(lo));
  b->hi_i = to_i64(floor(hi));
}

/* fn over ops, float16/bfloat16 through its float32 loop (iter.h) */
static void run(flow_iter_fn fn, flow_tensor *const *ops, int nops, bounds *b, flow_unary_code code) {
  flow_iter it;
  flow_iter_half h;
  flow_iter_init(&it, ops, nops);
  if (flow_iter_half_init(&h, ops, nops, fn, b)) flow_iter_run_parallel(&it, flow_iter_half_fn, &h, grain(code));
  else flow_iter_run_parallel(&it, fn, b, grain(code));
}

int flow_cpu_unary(flow_unary_code code, flow_tensor *out, const flow_tensor *x, double lo, double hi) {
  int slot = flow_dtype_is_half(x->dtype) ? 0 : dtype_slot(x->dtype);
  flow_iter_fn fn = slot >= 0 ? forward[code][slot] : NULL;
  if (!fn) return flow_error_set("no CPU kernel for dtype %s", flow_dtype_name(x->dtype));
  bounds b;
  make_bounds(&b, lo, hi);
  run(fn, (flow_tensor *[]){out, (flow_tensor *)x}, 2, &b, code);
  return 0;
}

int flow_cpu_unary_backward(flow_unary_code code, flow_tensor *gin, const flow_tensor *s,
                            const flow_tensor *g, double lo, double hi) {
  int slot = flow_dtype_is_half(g->dtype) ? 0 : dtype_slot(g->dtype);
  flow_iter_fn fn = slot == 0 || slot == 1 ? backward[code][slot] : NULL;
  if (!fn) return flow_error_set("no CPU gradient kernel for dtype %s", flow_dtype_name(g->dtype));
  bounds b;
  make_bounds(&b, lo, hi);
  run(fn, (flow_tensor *[]){gin, (flow_tensor *)s, (flow_tensor *)g}, 3, &b, code);
  return 0;
}
