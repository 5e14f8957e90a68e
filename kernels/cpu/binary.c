/* Elementwise binary kernels: one generic loop, instantiated per op and dtype. Float ops run in
 * float32/float64 (and int64/int32 where the op is exact); comparisons write bool. */
#include <math.h>
#include <stdint.h>

#include "../../core/error.h"
#include "cpu.h"
#include "iter.h"

#define OP_ADD(x, y) ((x) + (y))
#define OP_SUB(x, y) ((x) - (y))
#define OP_MUL(x, y) ((x) * (y))
#define OP_DIV(x, y) ((x) / (y))
#define OP_MAX(x, y) ((x) > (y) || (x) != (x) ? (x) : (y))
#define OP_MIN(x, y) ((x) < (y) || (x) != (x) ? (x) : (y))
#define OP_EQ(x, y) ((x) == (y))
#define OP_NE(x, y) ((x) != (y))
#define OP_LT(x, y) ((x) < (y))
#define OP_LE(x, y) ((x) <= (y))
#define OP_GT(x, y) ((x) > (y))
#define OP_GE(x, y) ((x) >= (y))
#define OP_POWF(x, y) powf((x), (y))
#define OP_POWD(x, y) pow((x), (y))
#define OP_POWI(x, y) ipow((x), (y))
#define OP_DIVI(x, y) ((y) == 0 ? 0 : (x) / (y))
/* torch's integer and float remainder (the sign of the divisor), fmod (the sign of the dividend),
 * floor and trunc division; integer divisors are never 0 here (checked first), and -1 is a
 * negation, which x / -1 would trap on for the most negative x. */
#define QUOT_I(x, y) ((y) == -1 ? -(x) : (x) / (y))
#define REM_I(x, y) ((y) == -1 ? 0 : (x) % (y))
#define OP_REMI(x, y) (REM_I(x, y) != 0 && ((REM_I(x, y) < 0) != ((y) < 0)) ? REM_I(x, y) + (y) : REM_I(x, y))
#define OP_FLOORDIVI(x, y) (QUOT_I(x, y) - (REM_I(x, y) != 0 && (((x) < 0) != ((y) < 0))))
#define OP_REMF32(x, y) remainder_f32((x), (y))
#define OP_REMF64(x, y) remainder_f64((x), (y))
#define OP_FLOORDIVF32(x, y) floor_divide_f32((x), (y))
#define OP_FLOORDIVF64(x, y) floor_divide_f64((x), (y))
#define OP_TRUNCDIVF32(x, y) truncf((x) / (y))
#define OP_TRUNCDIVF64(x, y) trunc((x) / (y))

/* remainder: fmod moved into the divisor's sign */
#define DEF_REMF(NAME, T, FMOD)                                            \
  static inline T NAME(T a, T b) {                                         \
    T m = FMOD(a, b);                                                      \
    return m != 0 && ((b < 0) != (m < 0)) ? m + b : m;                     \
  }
DEF_REMF(remainder_f32, float, fmodf)
DEF_REMF(remainder_f64, double, fmod)

/* floor(a / b) as torch computes it (div_floor_floating): from the exact fmod, rounded to the
 * nearest integer when (a - mod) / b is off by rounding; b == 0 gives a / b (inf or nan). */
#define DEF_FLOORDIVF(NAME, T, FMOD, FLOOR)                                \
  static inline T NAME(T a, T b) {                                         \
    if (b == 0) return a / b;                                              \
    T mod = FMOD(a, b), div = (a - mod) / b;                               \
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;                      \
    if (div == 0) return copysign((T)0, a / b);                            \
    T f = FLOOR(div);                                                      \
    return div - f > (T)0.5 ? f + 1 : f;                                   \
  }
DEF_FLOORDIVF(floor_divide_f32, float, fmodf, floorf)
DEF_FLOORDIVF(floor_divide_f64, double, fmod, floor)

static int64_t ipow(int64_t b, int64_t e) {
  int64_t r = 1;
  if (e < 0) return b == 1 ? 1 : (b == -1 ? (e & 1 ? -1 : 1) : 0);
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return r;
}

/* The loop: dense, scalar-on-either-side and strided variants so the common cases vectorise.
 * Dense loops first run over a multiple of 32 elements: -O2's "very cheap" vectoriser only takes
 * loops that need no scalar epilogue. ivdep: the output is fresh or exactly an input (in place). */
#define DEF_LOOP(fname, TI, TO, EXPR)                                                 \
  FLOW_CPU_DISPATCH static void fname(char **p, const int64_t *s, int64_t n, void *ctx) { \
    (void)ctx;                                                                        \
    TO *o = (TO *)p[0];                                                               \
    const TI *x = (const TI *)p[1], *y = (const TI *)p[2];                            \
    int64_t m = n & ~(int64_t)31, i;                                                  \
    if (s[0] == sizeof(TO) && s[1] == sizeof(TI) && s[2] == sizeof(TI)) {             \
      _Pragma("GCC ivdep") for (i = 0; i < m; i++) o[i] = (TO)EXPR(x[i], y[i]);       \
      for (i = m; i < n; i++) o[i] = (TO)EXPR(x[i], y[i]);                            \
    } else if (s[0] == sizeof(TO) && s[1] == sizeof(TI) && s[2] == 0) {               \
      const TI yv = *y;                                                               \
      _Pragma("GCC ivdep") for (i = 0; i < m; i++) o[i] = (TO)EXPR(x[i], yv);         \
      for (i = m; i < n; i++) o[i] = (TO)EXPR(x[i], yv);                              \
    } else if (s[0] == sizeof(TO) && s[1] == 0 && s[2] == sizeof(TI)) {               \
      const TI xv = *x;                                                               \
      _Pragma("GCC ivdep") for (i = 0; i < m; i++) o[i] = (TO)EXPR(xv, y[i]);         \
      for (i = m; i < n; i++) o[i] = (TO)EXPR(xv, y[i]);                              \
    } else {                                                                          \
      char *po = p[0];                                                                \
      const char *px = p[1], *py = p[2];                                              \
      for (i = 0; i < n; i++, po += s[0], px += s[1], py += s[2])                     \
        *(TO *)po = (TO)EXPR(*(const TI *)px, *(const TI *)py);                       \
    }                                                                                 \
  }

#define DEF_ARITH(NAME, EXPRF, EXPRD, EXPRI)                                          \
  DEF_LOOP(NAME##_f32, float, float, EXPRF)                                           \
  DEF_LOOP(NAME##_f64, double, double, EXPRD)                                         \
  DEF_LOOP(NAME##_i64, int64_t, int64_t, EXPRI)                                       \
  DEF_LOOP(NAME##_i32, int32_t, int32_t, EXPRI)                                       \
  DEF_LOOP(NAME##_u8, uint8_t, uint8_t, EXPRI)

#define DEF_CMP(NAME, EXPR)                                                           \
  DEF_LOOP(NAME##_f32, float, uint8_t, EXPR)                                          \
  DEF_LOOP(NAME##_f64, double, uint8_t, EXPR)                                         \
  DEF_LOOP(NAME##_i64, int64_t, uint8_t, EXPR)                                        \
  DEF_LOOP(NAME##_i32, int32_t, uint8_t, EXPR)                                        \
  DEF_LOOP(NAME##_u8, uint8_t, uint8_t, EXPR)

DEF_ARITH(add, OP_ADD, OP_ADD, OP_ADD)
DEF_ARITH(sub, OP_SUB, OP_SUB, OP_SUB)
DEF_ARITH(mul, OP_MUL, OP_MUL, OP_MUL)
DEF_ARITH(div, OP_DIV, OP_DIV, OP_DIVI)
DEF_ARITH(pow, OP_POWF, OP_POWD, OP_POWI)
DEF_ARITH(max, OP_MAX, OP_MAX, OP_MAX)
DEF_ARITH(min, OP_MIN, OP_MIN, OP_MIN)
/* the division family: f32 and f64 differ in their libm calls, uint8 has no signs to mind */
#define DEF_DIVFAM(NAME, EXPRF, EXPRD, EXPRI, EXPRU)                                  \
  DEF_LOOP(NAME##_f32, float, float, EXPRF)                                           \
  DEF_LOOP(NAME##_f64, double, double, EXPRD)                                         \
  DEF_LOOP(NAME##_i64, int64_t, int64_t, EXPRI)                                       \
  DEF_LOOP(NAME##_i32, int32_t, int32_t, EXPRI)                                       \
  DEF_LOOP(NAME##_u8, uint8_t, uint8_t, EXPRU)
#define OP_FMODF32(x, y) fmodf((x), (y))
#define OP_FMODF64(x, y) fmod((x), (y))
#define OP_MODU(x, y) ((x) % (y))
#define OP_QUOTU(x, y) ((x) / (y))
DEF_DIVFAM(rem, OP_REMF32, OP_REMF64, OP_REMI, OP_MODU)
DEF_DIVFAM(fmod, OP_FMODF32, OP_FMODF64, REM_I, OP_MODU)
DEF_DIVFAM(floordiv, OP_FLOORDIVF32, OP_FLOORDIVF64, OP_FLOORDIVI, OP_QUOTU)
DEF_DIVFAM(truncdiv, OP_TRUNCDIVF32, OP_TRUNCDIVF64, QUOT_I, OP_QUOTU)
DEF_CMP(eq, OP_EQ)
DEF_CMP(ne, OP_NE)
DEF_CMP(lt, OP_LT)
DEF_CMP(le, OP_LE)
DEF_CMP(gt, OP_GT)
DEF_CMP(ge, OP_GE)

/* bool + bool is or, as torch: a uint8 add would store 2 */
#define OP_OR(x, y) ((x) | (y))
DEF_LOOP(or_bool, uint8_t, uint8_t, OP_OR)

/* [op][dtype]: f32 f64 i64 i32 u8/bool; NULL where not supported */
#define ROW(NAME) {NAME##_f32, NAME##_f64, NAME##_i64, NAME##_i32, NAME##_u8}
static const flow_iter_fn table[FLOW_NBINARY][5] = {
  ROW(add), ROW(sub), ROW(mul), ROW(div), ROW(pow), ROW(max), ROW(min),
  ROW(rem), ROW(fmod), ROW(floordiv), ROW(truncdiv),
  ROW(eq), ROW(ne), ROW(lt), ROW(le), ROW(gt), ROW(ge),
};

static int dtype_slot(flow_dtype d) {
  switch (d) {
  case FLOW_F32: return 0;
  case FLOW_F64: return 1;
  case FLOW_I64: return 2;
  case FLOW_I32: return 3;
  case FLOW_U8: case FLOW_BOOL: return 4;
  default: return -1;
  }
}

const char *flow_binary_name(flow_binary_code code) {
  static const char *const names[FLOW_NBINARY] = {
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "fmod", "floor_divide", "trunc_divide",
    "eq", "ne", "lt", "le", "gt", "ge"};
  return names[code];
}

/* Does any element of y equal 0? (y any strides, any dtype) */
static void find_zero(char **p, const int64_t *s, int64_t n, void *ctx) {
  const flow_tensor *y = ((const flow_tensor **)ctx)[0];
  bool *found = ((bool **)ctx)[1];
  for (int64_t i = 0; i < n && !*found; i++) *found = flow_dtype_load(y->dtype, p[0] + i * s[0]) == 0;
}

int flow_cpu_binary(flow_binary_code code, flow_tensor *out, const flow_tensor *x, const flow_tensor *y) {
  bool half = flow_dtype_is_half(x->dtype);   /* through the float32 loop (iter.h) */
  int slot = half ? 0 : dtype_slot(x->dtype);
  if (slot < 0)
    return flow_error_set("no CPU kernel for dtype %s (cast to float32 first)", flow_dtype_name(x->dtype));
  if (code >= FLOW_BIN_REM && code <= FLOW_BIN_TRUNCDIV && slot >= 2) { /* integers: as torch, raise */
    bool found = false;
    flow_iter zit;
    flow_iter_init(&zit, (flow_tensor *const[]){(flow_tensor *)y}, 1);
    flow_iter_run(&zit, find_zero, (void *[]){(void *)y, &found});
    if (found) return flow_error_set("%s: ZeroDivisionError (integer division by zero)", flow_binary_name(code));
  }
  /* x^2, the common power, as x*x: powf is a scalar libm call per element */
  if (code == FLOW_BIN_POW && (slot == 0 || slot == 1) && flow_tensor_numel(y) == 1 &&
      flow_dtype_load(y->dtype, flow_tensor_data(y)) == 2.0)
    return flow_cpu_binary(FLOW_BIN_MUL, out, x, x);
  flow_iter it;
  flow_tensor *ops[3] = {out, (flow_tensor *)x, (flow_tensor *)y};
  flow_iter_init(&it, ops, 3);
  /* pow and the division family call libm per element; the rest are a few instructions */
  int64_t grain = code == FLOW_BIN_POW || (code >= FLOW_BIN_REM && code <= FLOW_BIN_TRUNCDIV) ? FLOW_GRAIN_COSTLY
                                                                                            : FLOW_GRAIN_CHEAP;
  flow_iter_fn fn = code == FLOW_BIN_ADD && x->dtype == FLOW_BOOL ? or_bool : table[code][slot];
  flow_iter_half h;
  if (half && flow_iter_half_init(&h, ops, 3, fn, NULL)) flow_iter_run_parallel(&it, flow_iter_half_fn, &h, grain);
  else flow_iter_run_parallel(&it, fn, NULL, grain);
  return 0;
}
