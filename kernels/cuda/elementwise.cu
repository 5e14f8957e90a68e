/* Elementwise CUDA kernels: one strided/broadcast kernel family for binary ops (arithmetic and
 * comparisons), unary ops and their gradients, where/masked_fill, copy/cast and fill. Float types
 * compute in float (double for float64); integer types in int64. Codes are the CPU kernels' codes. */
#include "common.h"

extern "C" {
#include "../cpu/cpu.h"
}

/* ---- geometry (host) ---------------------------------------------------------------------------- */

void geo_init(Geo *g, const flow_tensor *const *ops, int nops) {
  const flow_tensor *o = ops[0];
  int n = 0;
  for (int d = 0; d < o->ndim; d++) {
    if (o->shape[d] == 1) continue;
    g->shape[n] = o->shape[d];
    for (int k = 0; k < nops; k++) {
      const flow_tensor *t = ops[k];
      int td = d - (o->ndim - t->ndim); /* inputs align to the output's trailing axes */
      g->stride[k][n] = td < 0 || t->shape[td] == 1 ? 0 : t->stride[td];
    }
    n++;
  }
  /* merge axis d into d-1 when every operand steps through both as one */
  int m = 0;
  for (int d = 0; d < n; d++) {
    bool merge = m > 0;
    for (int k = 0; k < nops && merge; k++) merge = g->stride[k][m - 1] == g->stride[k][d] * g->shape[d];
    if (merge) {
      g->shape[m - 1] *= g->shape[d];
      for (int k = 0; k < nops; k++) g->stride[k][m - 1] = g->stride[k][d];
    } else {
      g->shape[m] = g->shape[d];
      for (int k = 0; k < nops; k++) g->stride[k][m] = g->stride[k][d];
      m++;
    }
  }
  if (m == 0) { /* a single element */
    g->shape[0] = 1;
    for (int k = 0; k < nops; k++) g->stride[k][0] = 0;
    m = 1;
  }
  g->ndim = m;
  g->small = flow_tensor_numel(o) < ((int64_t)1 << 31);
}

/* ---- the dense fast path -------------------------------------------------------------------------
 * When every operand covers the same elements densely (the geometry collapsed to one axis of stride
 * 1: no broadcasting, no strides) and starts 16-byte aligned, each thread moves 16 bytes per
 * operand per step: one vector load or store instead of 16 / sizeof(T) scalar ones (8 bf16 values,
 * 4 floats). Activations, gradients and optimizer math are almost always this case. */

template <typename T> struct Vec16 {
  static const int N = 16 / sizeof(T);
  struct alignas(16) type { T v[N]; };
};

static bool dense_aligned(const Geo &g, const flow_tensor *const *ops, int nops) {
  if (g.ndim != 1) return false;
  for (int k = 0; k < nops; k++)
    if (g.stride[k][0] != 1 || ((uintptr_t)flow_tensor_data(ops[k]) & 15) != 0) return false;
  return true;
}

/* o[i] = f(a[i], b[i]) over n dense elements (b = a for one input): vectors, then the tail. */
template <typename T, typename F>
__global__ void dense_kernel(int64_t n, T *o, const T *a, const T *b, F f) {
  typedef typename Vec16<T>::type V;
  const int N = Vec16<T>::N;
  int64_t nv = n / N;
  CUDA_LOOP(i, nv) {
    V x = ((const V *)a)[i], y = ((const V *)b)[i], r;
#pragma unroll
    for (int j = 0; j < N; j++) r.v[j] = f(x.v[j], y.v[j]);
    ((V *)o)[i] = r;
  }
  CUDA_LOOP(i, n - nv * N) {
    int64_t k = nv * N + i;
    o[k] = f(a[k], b[k]);
  }
}

template <typename T, typename F> static void launch_dense(int64_t n, T *o, const T *a, const T *b, F f, cudaStream_t s) {
  int64_t work = n / Vec16<T>::N > 0 ? n / Vec16<T>::N : n;
  dense_kernel<T, F><<<grid_for(work, 256), 256, 0, s>>>(n, o, a, b, f);
}

/* ---- binary ------------------------------------------------------------------------------------- */

template <typename C> __device__ __forceinline__ C ipow_or_pow(C x, C y) { return pow(x, y); }
template <> __device__ __forceinline__ float ipow_or_pow<float>(float x, float y) { return powf(x, y); }
template <> __device__ __forceinline__ int64_t ipow_or_pow<int64_t>(int64_t b, int64_t e) {
  if (e < 0) return b == 1 ? 1 : (b == -1 ? (e & 1 ? -1 : 1) : 0);
  int64_t r = 1;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return r;
}
template <typename C> __device__ __forceinline__ C divide(C x, C y) { return x / y; }
template <> __device__ __forceinline__ int64_t divide<int64_t>(int64_t x, int64_t y) { return y == 0 ? 0 : x / y; }

/* The division family as torch computes it (the CPU kernels' rules, kernels/cpu/binary.c):
 * remainder takes the divisor's sign, fmod the dividend's; floor division from the exact fmod. An
 * integer divisor of 0 never gets here (binary_kernel records it), and -1 is a negation. */
template <typename C> __device__ __forceinline__ C rem_of(C x, C y) {
  C m = fmod(x, y);
  return m != 0 && ((y < 0) != (m < 0)) ? m + y : m;
}
template <> __device__ __forceinline__ int64_t rem_of<int64_t>(int64_t x, int64_t y) {
  int64_t m = y == -1 ? 0 : x % y;
  return m != 0 && ((y < 0) != (m < 0)) ? m + y : m;
}
template <typename C> __device__ __forceinline__ C fmod_of(C x, C y) { return fmod(x, y); }
template <> __device__ __forceinline__ int64_t fmod_of<int64_t>(int64_t x, int64_t y) { return y == -1 ? 0 : x % y; }
template <typename C> __device__ __forceinline__ C floordiv_of(C x, C y) {
  if (y == 0) return x / y;
  C mod = fmod(x, y), div = (x - mod) / y;
  if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1;
  if (div == 0) return copysign((C)0, x / y);
  C f = floor(div);
  return div - f > (C)0.5 ? f + 1 : f;
}
template <> __device__ __forceinline__ int64_t floordiv_of<int64_t>(int64_t x, int64_t y) {
  if (y == -1) return -x;
  return x / y - (x % y != 0 && ((x < 0) != (y < 0)));
}
template <typename C> __device__ __forceinline__ C truncdiv_of(C x, C y) { return trunc(x / y); }
template <> __device__ __forceinline__ int64_t truncdiv_of<int64_t>(int64_t x, int64_t y) { return y == -1 ? -x : x / y; }

template <typename C> __device__ __forceinline__ C binop(int code, C x, C y) {
  switch (code) {
  case FLOW_BIN_ADD: return x + y;
  case FLOW_BIN_SUB: return x - y;
  case FLOW_BIN_MUL: return x * y;
  case FLOW_BIN_DIV: return divide<C>(x, y);
  case FLOW_BIN_POW: return ipow_or_pow<C>(x, y);
  case FLOW_BIN_MAX: return x > y || x != x ? x : y;  /* NaN wins, as on the CPU */
  case FLOW_BIN_MIN: return x < y || x != x ? x : y;
  case FLOW_BIN_REM: return rem_of<C>(x, y);
  case FLOW_BIN_FMOD: return fmod_of<C>(x, y);
  case FLOW_BIN_FLOORDIV: return floordiv_of<C>(x, y);
  case FLOW_BIN_TRUNCDIV: return truncdiv_of<C>(x, y);
  case FLOW_BIN_EQ: return x == y;
  case FLOW_BIN_NE: return x != y;
  case FLOW_BIN_LT: return x < y;
  case FLOW_BIN_LE: return x <= y;
  case FLOW_BIN_GT: return x > y;
  default: return x >= y;
  }
}

/* zero_div: an integer op of the division family, whose zero divisors are recorded (as an index
 * error: the host raises torch's ZeroDivisionError at the next synchronisation) and give 0. */
template <typename T, typename O>
__global__ void binary_kernel(Geo g, int64_t n, int code, O *o, const T *x, const T *y, BadIndex *zero_div) {
  typedef typename Acc<T>::type C;
  CUDA_LOOP(i, n) {
    int64_t off[3];
    geo_offsets<3>(g, i, off);
    C yv = load<C, T>(y + off[2]);
    if (zero_div && yv == 0) {
      index_ok(zero_div, BAD_ZERO_DIV, 0, 0, code);
      store<O, C>(o + off[0], 0);
      continue;
    }
    C r = binop<C>(code, load<C, T>(x + off[1]), yv);
    if (code >= FLOW_BIN_EQ) o[off[0]] = r != 0;
    else store<O, C>(o + off[0], r);
  }
}

template <typename T> struct BinaryF {
  int code;
  __device__ T operator()(T x, T y) const {
    typedef typename Acc<T>::type C;
    T r;
    store<T, C>(&r, binop<C>(code, load<C, T>(&x), load<C, T>(&y)));
    return r;
  }
};

/* out = x OP y with broadcasting; comparisons write bool. */
static int cuda_binary(flow_binary_code code, flow_tensor *out, const flow_tensor *x, const flow_tensor *y) {
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  const flow_tensor *ops[3] = {out, x, y};
  Geo g;
  geo_init(&g, ops, 3);
  cudaStream_t s = stream_of(out);
  BadIndex *zero_div = NULL;
  if (code >= FLOW_BIN_REM && code <= FLOW_BIN_TRUNCDIV && !flow_dtype_is_float(x->dtype) &&
      !(zero_div = bad_index_record(out)))
    return -1;
  bool cmp = code >= FLOW_BIN_EQ, dense = !cmp && !zero_div && dense_aligned(g, ops, 3);
  FLOW_CUDA_DISPATCH_ALL(x->dtype, "binary",
    if (dense) launch_dense<T>(n, data_of<T>(out), data_of<T>(x), data_of<T>(y), BinaryF<T>{code}, s);
    else if (cmp) binary_kernel<T, bool><<<grid_for(n, 256), 256, 0, s>>>(g, n, code, data_of<bool>(out), data_of<T>(x), data_of<T>(y), NULL);
    else binary_kernel<T, T><<<grid_for(n, 256), 256, 0, s>>>(g, n, code, data_of<T>(out), data_of<T>(x), data_of<T>(y), zero_div))
  return launch_check("binary_kernel");
}

/* ---- unary and its gradient --------------------------------------------------------------------- */

/* double literals: (C) rounds them to float for float types and keeps float64 exact */
#define GELU_C 0.7978845608028654
#define GELU_A 0.044715

template <typename C> __device__ __forceinline__ C unop(int code, C v, C lo, C hi) {
  switch (code) {
  case FLOW_UN_NEG: return -v;
  case FLOW_UN_ABS: return v < 0 ? -v : v;
  case FLOW_UN_RELU: return v < 0 ? 0 : v; /* NaN passes */
  case FLOW_UN_CLAMP: return v < lo ? (lo > hi ? hi : lo) : (v > hi ? hi : v); /* lo > hi: hi */
  case FLOW_UN_EXP: return exp(v);
  case FLOW_UN_LOG: return log(v);
  case FLOW_UN_SQRT: return sqrt(v);
  case FLOW_UN_RSQRT: return 1 / sqrt(v);
  case FLOW_UN_TANH: return tanh(v);
  case FLOW_UN_SIGMOID: return 1 / (1 + exp(-v));
  case FLOW_UN_GELU: return (C)0.5 * v * (1 + erf(v * (C)M_SQRT1_2)); /* x Phi(x) */
  case FLOW_UN_SILU: return v / (1 + exp(-v));
  case FLOW_UN_SIN: return sin(v);
  case FLOW_UN_COS: return cos(v);
  case FLOW_UN_ERF: return erf(v);
  case FLOW_UN_LOG1P: return log1p(v);
  case FLOW_UN_EXPM1: return expm1(v);
  case FLOW_UN_SOFTPLUS: return v > 20 ? v : log1p(exp(v)); /* beta 1, threshold 20 */
  case FLOW_UN_SIGN: return v > 0 ? (C)1 : (v < 0 ? (C)-1 : (C)0); /* NaN: 0 */
  case FLOW_UN_FLOOR: return floor(v);
  case FLOW_UN_CEIL: return ceil(v);
  case FLOW_UN_ROUND: return rint(v); /* half to even */
  case FLOW_UN_TRUNC: return trunc(v);
  default: return (C)0.5 * v * (1 + tanh((C)GELU_C * (v + (C)GELU_A * v * v * v))); /* GELU, tanh form */
  }
}
template <> __device__ __forceinline__ int64_t unop<int64_t>(int code, int64_t v, int64_t lo, int64_t hi) {
  switch (code) {
  case FLOW_UN_NEG: return -v;
  case FLOW_UN_ABS: return v < 0 ? -v : v;
  case FLOW_UN_RELU: return v < 0 ? 0 : v; /* NaN passes */
  case FLOW_UN_SIGN: return v > 0 ? 1 : (v < 0 ? -1 : 0);
  case FLOW_UN_FLOOR: case FLOW_UN_CEIL: case FLOW_UN_ROUND: case FLOW_UN_TRUNC: return v;
  default: return v < lo ? (lo > hi ? hi : lo) : (v > hi ? hi : v);
  }
}

/* gin = f'(.) g, s being the output y (exp sqrt rsqrt tanh sigmoid relu) or the input x (abs log
 * gelu clamp), as in the CPU kernel. */
template <typename C> __device__ __forceinline__ C unop_grad(int code, C s, C g, C lo, C hi) {
  switch (code) {
  case FLOW_UN_NEG: return -g;
  case FLOW_UN_ABS: return s > 0 ? g : (s < 0 ? -g : 0);
  case FLOW_UN_EXP: return s * g;
  case FLOW_UN_LOG: return g / s;
  case FLOW_UN_SQRT: return g * (C)0.5 / s;
  case FLOW_UN_RSQRT: return g * (C)-0.5 * s * s * s;
  case FLOW_UN_TANH: return g * (1 - s * s);
  case FLOW_UN_SIGMOID: return g * s * (1 - s);
  case FLOW_UN_RELU: return s <= 0 ? 0 : g;
  case FLOW_UN_CLAMP: return s >= lo && s <= hi ? g : 0;
  case FLOW_UN_GELU: return g * ((C)0.5 * (1 + erf(s * (C)M_SQRT1_2)) + s * exp((C)-0.5 * s * s) * (C)0.3989422804014327);
  case FLOW_UN_SILU: { C sg = 1 / (1 + exp(-s)); return g * sg * (1 + s * (1 - sg)); }
  case FLOW_UN_SIN: return g * cos(s);
  case FLOW_UN_COS: return -g * sin(s);
  case FLOW_UN_ERF: return g * (C)M_2_SQRTPI * exp(-s * s);
  case FLOW_UN_LOG1P: return g / (1 + s);
  case FLOW_UN_EXPM1: return g * (s + 1);
  case FLOW_UN_SOFTPLUS: return s > 20 ? g : g / (1 + exp(-s));
  default: {
    C x2 = s * s, t = tanh((C)GELU_C * (s + (C)GELU_A * x2 * s));
    return g * ((C)0.5 * (1 + t) + (C)0.5 * s * (1 - t * t) * (C)GELU_C * (1 + 3 * (C)GELU_A * x2));
  }
  }
}

template <typename T> struct UnaryF {
  int code;
  double lo, hi;
  __device__ T operator()(T x, T) const {
    typedef typename Acc<T>::type C;
    T r;
    store<T, C>(&r, unop<C>(code, load<C, T>(&x), (C)lo, (C)hi));
    return r;
  }
};

template <typename T> struct UnaryGradF {
  int code;
  double lo, hi;
  __device__ T operator()(T s, T g) const {
    typedef typename Acc<T>::type C;
    T r;
    store<T, C>(&r, unop_grad<C>(code, load<C, T>(&s), load<C, T>(&g), (C)lo, (C)hi));
    return r;
  }
};

template <typename T>
__global__ void unary_kernel(Geo g, int64_t n, int code, T *o, const T *x, double lo, double hi) {
  typedef typename Acc<T>::type C;
  CUDA_LOOP(i, n) {
    int64_t off[2];
    geo_offsets<2>(g, i, off);
    store<T, C>(o + off[0], unop<C>(code, load<C, T>(x + off[1]), (C)lo, (C)hi));
  }
}

template <typename T>
__global__ void unary_grad_kernel(Geo g, int64_t n, int code, T *gin, const T *s, const T *gout, double lo, double hi) {
  typedef typename Acc<T>::type C;
  CUDA_LOOP(i, n) {
    int64_t off[3];
    geo_offsets<3>(g, i, off);
    store<T, C>(gin + off[0], unop_grad<C>(code, load<C, T>(s + off[1]), load<C, T>(gout + off[2]), (C)lo, (C)hi));
  }
}

/* Integer clamp bounds: ceil(lo), floor(hi), saturated. */
static double int_bound(double v, bool up) {
  v = up ? ceil(v) : floor(v);
  return v > 9.2e18 ? 9.2e18 : (v < -9.2e18 ? -9.2e18 : v);
}

static int cuda_unary(flow_unary_code code, flow_tensor *out, const flow_tensor *x, double lo, double hi) {
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  const flow_tensor *ops[2] = {out, x};
  Geo g;
  geo_init(&g, ops, 2);
  cudaStream_t s = stream_of(out);
  bool int_ok = code == FLOW_UN_NEG || code == FLOW_UN_ABS || code == FLOW_UN_RELU || code == FLOW_UN_CLAMP ||
                code == FLOW_UN_SIGN || code == FLOW_UN_FLOOR || code == FLOW_UN_CEIL || code == FLOW_UN_ROUND ||
                code == FLOW_UN_TRUNC;
  if (flow_dtype_is_int(x->dtype)) {
    if (!int_ok || x->dtype == FLOW_BOOL)
      return flow_error_set("dtype %s is not supported by this op on cuda (use a float dtype)", flow_dtype_name(x->dtype));
    lo = int_bound(lo, true);
    hi = int_bound(hi, false);
  }
  bool dense = dense_aligned(g, ops, 2);
  FLOW_CUDA_DISPATCH_ALL(x->dtype, "unary",
    if (dense) launch_dense<T>(n, data_of<T>(out), data_of<T>(x), data_of<T>(x), UnaryF<T>{code, lo, hi}, s);
    else unary_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, n, code, data_of<T>(out), data_of<T>(x), lo, hi))
  return launch_check("unary_kernel");
}

static int cuda_unary_backward(flow_unary_code code, flow_tensor *gin, const flow_tensor *sv, const flow_tensor *gout,
                               double lo, double hi) {
  int64_t n = flow_tensor_numel(gin);
  if (n == 0) return 0;
  const flow_tensor *ops[3] = {gin, sv, gout};
  Geo g;
  geo_init(&g, ops, 3);
  cudaStream_t s = stream_of(gin);
  bool dense = dense_aligned(g, ops, 3);
  FLOW_CUDA_DISPATCH_FLOAT(gout->dtype, "unary gradient",
    if (dense) launch_dense<T>(n, data_of<T>(gin), data_of<T>(sv), data_of<T>(gout), UnaryGradF<T>{code, lo, hi}, s);
    else unary_grad_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, n, code, data_of<T>(gin), data_of<T>(sv),
                                                              data_of<T>(gout), lo, hi))
  return launch_check("unary_grad_kernel");
}

/* ---- where / masked_fill ------------------------------------------------------------------------ */

template <typename T>
__global__ void where_kernel(Geo g, int64_t n, T *o, const bool *c, const T *a, const T *b) {
  CUDA_LOOP(i, n) {
    int64_t off[4];
    geo_offsets<4>(g, i, off);
    o[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <typename T>
__global__ void masked_fill_kernel(Geo g, int64_t n, T *o, const T *x, const bool *m, T v) {
  CUDA_LOOP(i, n) {
    int64_t off[3];
    geo_offsets<3>(g, i, off);
    o[off[0]] = m[off[2]] ? v : x[off[1]];
  }
}

template <typename T> static T host_value(double v) { return (T)v; }
template <> bf16 host_value<bf16>(double v) { return __float2bfloat16((float)v); }
template <> f16 host_value<f16>(double v) { return __float2half((float)v); }

static int cuda_where(flow_tensor *out, const flow_tensor *cond, const flow_tensor *a, const flow_tensor *b) {
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  const flow_tensor *ops[4] = {out, cond, a, b};
  Geo g;
  geo_init(&g, ops, 4);
  cudaStream_t s = stream_of(out);
  FLOW_CUDA_DISPATCH_ALL(out->dtype, "where",
    where_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<T>(out), data_of<bool>(cond), data_of<T>(a), data_of<T>(b)))
  return launch_check("where_kernel");
}

static int cuda_masked_fill(flow_tensor *out, const flow_tensor *x, const flow_tensor *mask, double v) {
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  const flow_tensor *ops[3] = {out, x, mask};
  Geo g;
  geo_init(&g, ops, 3);
  cudaStream_t s = stream_of(out);
  FLOW_CUDA_DISPATCH_ALL(out->dtype, "masked_fill",
    masked_fill_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<T>(out), data_of<T>(x), data_of<bool>(mask), host_value<T>(v)))
  return launch_check("masked_fill_kernel");
}

/* ---- copy / cast / fill ------------------------------------------------------------------------- */

/* Any dtype pair: the source converts through double when either side is 64-bit or integer, so
 * int64 and float64 stay exact; float-to-float casts stay in float. */
template <typename TO, typename TI>
__global__ void copy_kernel(Geo g, int64_t n, TO *o, const TI *x) {
  CUDA_LOOP(i, n) {
    int64_t off[2];
    geo_offsets<2>(g, i, off);
    o[off[0]] = x[off[1]];
  }
}
template <typename TO, typename TI> struct Convert {
  __device__ static TO go(TI v) { return (TO)v; }
};
template <typename TI> struct Convert<bf16, TI> { __device__ static bf16 go(TI v) { return __float2bfloat16((float)v); } };
template <typename TI> struct Convert<f16, TI> { __device__ static f16 go(TI v) { return __float2half((float)v); } };
template <typename TO> struct Convert<TO, bf16> { __device__ static TO go(bf16 v) { return (TO)__bfloat162float(v); } };
template <typename TO> struct Convert<TO, f16> { __device__ static TO go(f16 v) { return (TO)__half2float(v); } };
template <> struct Convert<bf16, bf16> { __device__ static bf16 go(bf16 v) { return v; } };
template <> struct Convert<f16, f16> { __device__ static f16 go(f16 v) { return v; } };
template <> struct Convert<bf16, f16> { __device__ static bf16 go(f16 v) { return __float2bfloat16(__half2float(v)); } };
template <> struct Convert<f16, bf16> { __device__ static f16 go(bf16 v) { return __float2half(__bfloat162float(v)); } };
template <typename TI> struct Convert<bool, TI> { __device__ static bool go(TI v) { return (float)v != 0.f; } };
template <> struct Convert<bool, bf16> { __device__ static bool go(bf16 v) { return __bfloat162float(v) != 0.f; } };
template <> struct Convert<bool, f16> { __device__ static bool go(f16 v) { return __half2float(v) != 0.f; } };
template <> struct Convert<bool, int64_t> { __device__ static bool go(int64_t v) { return v != 0; } };
template <> struct Convert<bool, double> { __device__ static bool go(double v) { return v != 0; } };

template <typename TO, typename TI>
__global__ void cast_kernel(Geo g, int64_t n, TO *o, const TI *x) {
  CUDA_LOOP(i, n) {
    int64_t off[2];
    geo_offsets<2>(g, i, off);
    o[off[0]] = Convert<TO, TI>::go(x[off[1]]);
  }
}

/* out = x: any strides, any dtypes. */
int flow_cuda_copy(flow_tensor *out, const flow_tensor *x) {
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  cudaStream_t s = stream_of(out);
  if (out->dtype == x->dtype && flow_tensor_is_contiguous(out) && flow_tensor_is_contiguous(x) &&
      flow_shape_eq(out->ndim, out->shape, x->ndim, x->shape))
    return flow_cuda_check(cudaMemcpyAsync(flow_tensor_data(out), flow_tensor_data(x), flow_tensor_nbytes(out),
                                           cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  const flow_tensor *ops[2] = {out, x};
  Geo g;
  geo_init(&g, ops, 2);
  unsigned grid = grid_for(n, 256);
  if (out->dtype == x->dtype) {
    switch (flow_dtype_size(x->dtype)) {
    case 1: copy_kernel<uint8_t, uint8_t><<<grid, 256, 0, s>>>(g, n, data_of<uint8_t>(out), data_of<uint8_t>(x)); break;
    case 2: copy_kernel<uint16_t, uint16_t><<<grid, 256, 0, s>>>(g, n, data_of<uint16_t>(out), data_of<uint16_t>(x)); break;
    case 4: copy_kernel<uint32_t, uint32_t><<<grid, 256, 0, s>>>(g, n, data_of<uint32_t>(out), data_of<uint32_t>(x)); break;
    default: copy_kernel<uint64_t, uint64_t><<<grid, 256, 0, s>>>(g, n, data_of<uint64_t>(out), data_of<uint64_t>(x)); break;
    }
    return launch_check("copy_kernel");
  }
#define CAST_FROM(TO)                                                                                    \
  switch (x->dtype) {                                                                                    \
  case FLOW_F32: cast_kernel<TO, float><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<float>(x)); break;   \
  case FLOW_F64: cast_kernel<TO, double><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<double>(x)); break; \
  case FLOW_F16: cast_kernel<TO, f16><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<f16>(x)); break;       \
  case FLOW_BF16: cast_kernel<TO, bf16><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<bf16>(x)); break;    \
  case FLOW_I64: cast_kernel<TO, int64_t><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<int64_t>(x)); break; \
  case FLOW_I32: cast_kernel<TO, int32_t><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<int32_t>(x)); break; \
  case FLOW_U8: cast_kernel<TO, uint8_t><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<uint8_t>(x)); break; \
  default: cast_kernel<TO, bool><<<grid, 256, 0, s>>>(g, n, data_of<TO>(out), data_of<bool>(x)); break;          \
  }
  switch (out->dtype) {
  case FLOW_F32: CAST_FROM(float) break;
  case FLOW_F64: CAST_FROM(double) break;
  case FLOW_F16: CAST_FROM(f16) break;
  case FLOW_BF16: CAST_FROM(bf16) break;
  case FLOW_I64: CAST_FROM(int64_t) break;
  case FLOW_I32: CAST_FROM(int32_t) break;
  case FLOW_U8: CAST_FROM(uint8_t) break;
  default: CAST_FROM(bool) break;
  }
#undef CAST_FROM
  return launch_check("cast_kernel");
}

template <typename T>
__global__ void fill_kernel(Geo g, int64_t n, T *o, T v) {
  CUDA_LOOP(i, n) {
    int64_t off[1];
    geo_offsets<1>(g, i, off);
    o[off[0]] = v;
  }
}

int flow_cuda_fill(flow_tensor *out, double v) {
  int64_t n = flow_tensor_numel(out);
  if (n == 0) return 0;
  cudaStream_t s = stream_of(out);
  if (v == 0 && flow_tensor_is_contiguous(out))
    return flow_cuda_check(cudaMemsetAsync(flow_tensor_data(out), 0, flow_tensor_nbytes(out), s), "cudaMemsetAsync");
  const flow_tensor *ops[1] = {out};
  Geo g;
  geo_init(&g, ops, 1);
  FLOW_CUDA_DISPATCH_ALL(out->dtype, "fill",
    fill_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<T>(out), host_value<T>(v)))
  return launch_check("fill_kernel");
}

flow_tensor *cuda_dense(flow_tensor *t) {
  if (flow_tensor_is_contiguous(t)) { flow_tensor_incref(t); return t; }
  flow_tensor *c = flow_tensor_new(t->dtype, t->device, t->ndim, t->shape);
  if (c && flow_cuda_copy(c, t) != 0) { flow_tensor_decref(c); return NULL; }
  return c;
}

flow_tensor *cuda_cast(flow_tensor *t, flow_dtype dtype) {
  flow_tensor *c = flow_tensor_new(dtype, t->device, t->ndim, t->shape);
  if (c && flow_cuda_copy(c, t) != 0) { flow_tensor_decref(c); return NULL; }
  return c;
}

/* ---- the ops ------------------------------------------------------------------------------------ */

#define BINARY(NAME, CODE)                                                                        \
  static FLOW_KERNEL(k_##NAME) { return cuda_binary(CODE, out[0], in[0], in[1]); }
BINARY(add, FLOW_BIN_ADD)
BINARY(sub, FLOW_BIN_SUB)
BINARY(mul, FLOW_BIN_MUL)
BINARY(div, FLOW_BIN_DIV)
BINARY(pow, FLOW_BIN_POW)
BINARY(maximum, FLOW_BIN_MAX)
BINARY(minimum, FLOW_BIN_MIN)
BINARY(remainder, FLOW_BIN_REM)
BINARY(fmod, FLOW_BIN_FMOD)
BINARY(floor_divide, FLOW_BIN_FLOORDIV)
BINARY(trunc_divide, FLOW_BIN_TRUNCDIV)
BINARY(eq, FLOW_BIN_EQ)
BINARY(ne, FLOW_BIN_NE)
BINARY(lt, FLOW_BIN_LT)
BINARY(le, FLOW_BIN_LE)
BINARY(gt, FLOW_BIN_GT)
BINARY(ge, FLOW_BIN_GE)

/* In place: out[0] is in[0]. */
static FLOW_KERNEL(k_add_) { return cuda_binary(FLOW_BIN_ADD, out[0], in[0], in[1]); }
static FLOW_KERNEL(k_mul_) { return cuda_binary(FLOW_BIN_MUL, out[0], in[0], in[1]); }
static FLOW_KERNEL(k_copy_) { return flow_cuda_copy(out[0], in[1]); }
static FLOW_KERNEL(k_copy) { return flow_cuda_copy(out[0], in[0]); }
static FLOW_KERNEL(k_full) { return flow_cuda_fill(out[0], a->scalar); }
static FLOW_KERNEL(k_fill_) { return flow_cuda_fill(out[0], a->scalar); }

/* clamp's bounds: FLOW_ATTR_HAS_MIN/MAX with scalar/scalar2, as the CPU op reads them. */
static double lo_of(const flow_attrs *a) { return a->flags & FLOW_ATTR_HAS_MIN ? a->scalar : -INFINITY; }
static double hi_of(const flow_attrs *a) { return a->flags & FLOW_ATTR_HAS_MAX ? a->scalar2 : INFINITY; }

#define UNARY(NAME, CODE)                                                                         \
  static FLOW_KERNEL(k_##NAME) { return cuda_unary(CODE, out[0], in[0], lo_of(a), hi_of(a)); }
/* NAME and its gradient op NAME_grad, which takes (s, g): see unop_grad */
#define UNARY_AND_GRAD(NAME, CODE)                                                                \
  UNARY(NAME, CODE)                                                                               \
  static FLOW_KERNEL(k_##NAME##_grad) { return cuda_unary_backward(CODE, out[0], in[0], in[1], lo_of(a), hi_of(a)); }
UNARY(neg, FLOW_UN_NEG)
UNARY_AND_GRAD(abs, FLOW_UN_ABS)
UNARY_AND_GRAD(exp, FLOW_UN_EXP)
UNARY_AND_GRAD(log, FLOW_UN_LOG)
UNARY_AND_GRAD(sqrt, FLOW_UN_SQRT)
UNARY_AND_GRAD(rsqrt, FLOW_UN_RSQRT)
UNARY_AND_GRAD(tanh, FLOW_UN_TANH)
UNARY_AND_GRAD(sigmoid, FLOW_UN_SIGMOID)
UNARY_AND_GRAD(relu, FLOW_UN_RELU)
UNARY_AND_GRAD(gelu, FLOW_UN_GELU)
UNARY_AND_GRAD(gelu_tanh, FLOW_UN_GELU_TANH)
UNARY_AND_GRAD(clamp, FLOW_UN_CLAMP)
UNARY_AND_GRAD(silu, FLOW_UN_SILU)
UNARY_AND_GRAD(sin, FLOW_UN_SIN)
UNARY_AND_GRAD(cos, FLOW_UN_COS)
UNARY_AND_GRAD(erf, FLOW_UN_ERF)
UNARY_AND_GRAD(log1p, FLOW_UN_LOG1P)
UNARY_AND_GRAD(expm1, FLOW_UN_EXPM1)
UNARY_AND_GRAD(softplus, FLOW_UN_SOFTPLUS)
UNARY(sign, FLOW_UN_SIGN)
UNARY(floor, FLOW_UN_FLOOR)
UNARY(ceil, FLOW_UN_CEIL)
UNARY(round, FLOW_UN_ROUND)
UNARY(trunc, FLOW_UN_TRUNC)

static FLOW_KERNEL(k_where) { return cuda_where(out[0], in[0], in[1], in[2]); }
static FLOW_KERNEL(k_masked_fill) { return cuda_masked_fill(out[0], in[0], in[1], a->scalar); }

void flow_cuda_register_elementwise(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, add, k_add);
  FLOW_KERNEL_ADD(FLOW_CUDA, sub, k_sub);
  FLOW_KERNEL_ADD(FLOW_CUDA, mul, k_mul);
  FLOW_KERNEL_ADD(FLOW_CUDA, div, k_div);
  FLOW_KERNEL_ADD(FLOW_CUDA, pow, k_pow);
  FLOW_KERNEL_ADD(FLOW_CUDA, maximum, k_maximum);
  FLOW_KERNEL_ADD(FLOW_CUDA, minimum, k_minimum);
  FLOW_KERNEL_ADD(FLOW_CUDA, remainder, k_remainder);
  FLOW_KERNEL_ADD(FLOW_CUDA, fmod, k_fmod);
  FLOW_KERNEL_ADD(FLOW_CUDA, floor_divide, k_floor_divide);
  FLOW_KERNEL_ADD(FLOW_CUDA, trunc_divide, k_trunc_divide);
  FLOW_KERNEL_ADD(FLOW_CUDA, eq, k_eq);
  FLOW_KERNEL_ADD(FLOW_CUDA, ne, k_ne);
  FLOW_KERNEL_ADD(FLOW_CUDA, lt, k_lt);
  FLOW_KERNEL_ADD(FLOW_CUDA, le, k_le);
  FLOW_KERNEL_ADD(FLOW_CUDA, gt, k_gt);
  FLOW_KERNEL_ADD(FLOW_CUDA, ge, k_ge);
  FLOW_KERNEL_ADD(FLOW_CUDA, add_, k_add_);
  FLOW_KERNEL_ADD(FLOW_CUDA, mul_, k_mul_);
  FLOW_KERNEL_ADD(FLOW_CUDA, copy_, k_copy_);
  FLOW_KERNEL_ADD(FLOW_CUDA, contiguous, k_copy);
  FLOW_KERNEL_ADD(FLOW_CUDA, cast, k_copy);
  FLOW_KERNEL_ADD(FLOW_CUDA, full, k_full);
  FLOW_KERNEL_ADD(FLOW_CUDA, fill_, k_fill_);
  FLOW_KERNEL_ADD(FLOW_CUDA, zero_, k_fill_);
  FLOW_KERNEL_ADD(FLOW_CUDA, neg, k_neg);
  FLOW_KERNEL_ADD(FLOW_CUDA, abs, k_abs);
  FLOW_KERNEL_ADD(FLOW_CUDA, exp, k_exp);
  FLOW_KERNEL_ADD(FLOW_CUDA, log, k_log);
  FLOW_KERNEL_ADD(FLOW_CUDA, sqrt, k_sqrt);
  FLOW_KERNEL_ADD(FLOW_CUDA, rsqrt, k_rsqrt);
  FLOW_KERNEL_ADD(FLOW_CUDA, tanh, k_tanh);
  FLOW_KERNEL_ADD(FLOW_CUDA, sigmoid, k_sigmoid);
  FLOW_KERNEL_ADD(FLOW_CUDA, relu, k_relu);
  FLOW_KERNEL_ADD(FLOW_CUDA, gelu, k_gelu);
  FLOW_KERNEL_ADD(FLOW_CUDA, clamp, k_clamp);
  FLOW_KERNEL_ADD(FLOW_CUDA, where, k_where);
  FLOW_KERNEL_ADD(FLOW_CUDA, masked_fill, k_masked_fill);
  FLOW_KERNEL_ADD(FLOW_CUDA, abs_grad, k_abs_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, exp_grad, k_exp_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, log_grad, k_log_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, sqrt_grad, k_sqrt_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, rsqrt_grad, k_rsqrt_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, tanh_grad, k_tanh_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, sigmoid_grad, k_sigmoid_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, relu_grad, k_relu_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, gelu_grad, k_gelu_grad);
  FLOW_KERNEL_ADD(FLOW_CUDA, clamp_grad, k_clamp_grad);
#define ADD_UNARY(NAME) FLOW_KERNEL_ADD(FLOW_CUDA, NAME, k_##NAME)
#define ADD_BOTH(NAME) ADD_UNARY(NAME); FLOW_KERNEL_ADD(FLOW_CUDA, NAME##_grad, k_##NAME##_grad)
  ADD_BOTH(gelu_tanh); ADD_BOTH(silu); ADD_BOTH(sin); ADD_BOTH(cos); ADD_BOTH(erf); ADD_BOTH(log1p);
  ADD_BOTH(expm1); ADD_BOTH(softplus);
  ADD_UNARY(sign); ADD_UNARY(floor); ADD_UNARY(ceil); ADD_UNARY(round); ADD_UNARY(trunc);
#undef ADD_BOTH
#undef ADD_UNARY
}
