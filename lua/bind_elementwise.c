/* Lua bindings of the elementwise ops, casts, in-place updates, and the arithmetic metamethods
 * (+ - * / ^ and unary -). */
#include <math.h>

#include "../ops/elementwise.h"
#include "bind.h"

#undef l_floor /* luaconf.h's, unused here: the name is the binding of floor */

/* Argument idx must be a tensor or a Lua number/boolean (checked before anything is allocated,
 * so a bad argument raises without leaking). */
static void check_operand(lua_State *L, int idx, const char *fn) {
  int ty = lua_type(L, idx);
  if (ty != LUA_TNUMBER && ty != LUA_TBOOLEAN) flow_lua_check(L, idx, fn);
}

/* The operand at idx: the tensor (a new reference), or a Lua number made a 0-d tensor of dtype on
 * like's device. */
static flow_tensor *operand(lua_State *L, int idx, const flow_tensor *like, flow_dtype dtype) {
  flow_tensor *t = flow_lua_test(L, idx);
  if (t) { flow_tensor_incref(t); return t; }
  double v = lua_isboolean(L, idx) ? lua_toboolean(L, idx) : lua_tonumber(L, idx);
  if (!(t = flow_scalar_tensor(v, dtype, like->device))) flow_lua_error(L);
  return t;
}

/* What promotion sees of the operand at idx: its dtype, rank and whether it is a Lua number. */
static void operand_type(lua_State *L, int idx, flow_dtype *dt, int *nd, bool *num) {
  const flow_tensor *t = flow_lua_test(L, idx);
  *num = !t;
  *nd = t ? flow_tensor_lndim(t) : 0;
  *dt = t ? t->dtype : lua_isboolean(L, idx) ? FLOW_BOOL : lua_isinteger(L, idx) ? FLOW_I64 : FLOW_F64;
}

/* The dtype op computes in for the operands 1 and 2 (tensors or Lua numbers). */
static flow_dtype promoted(lua_State *L, const flow_op *op) {
  flow_dtype dt[2];
  int nd[2];
  bool num[2];
  for (int i = 0; i < 2; i++) operand_type(L, i + 1, &dt[i], &nd[i], &num[i]);
  return flow_binary_dtype(op, dt, nd, num);
}

/* Either operand may be a Lua number: a "wrapped number" in torch's promotion (an integer counts
 * as int64, a float as float32, a boolean as bool, and each only by its category). */
static int binary(lua_State *L, const flow_op *op) {
  flow_tensor *ta = flow_lua_test(L, 1), *tb = flow_lua_test(L, 2);
  flow_lua_check_opts(L, 3, op->name, (const char *const[]){NULL});
  if (ta && tb) return flow_lua_push(L, flow_binary(op, ta, tb)); /* the hot path: two tensors */
  check_operand(L, 1, op->name);
  check_operand(L, 2, op->name);
  const flow_tensor *like = ta ? ta : tb;
  if (!like) flow_lua_check(L, 1, op->name);
  flow_dtype d = promoted(L, op);
  flow_tensor *a = operand(L, 1, like, d);
  flow_tensor *b = operand(L, 2, like, d);
  flow_tensor *r = flow_binary(op, a, b);
  flow_tensor_decref(a);
  flow_tensor_decref(b);
  return flow_lua_push(L, r);
}

#define BINARY(NAME) static int l_##NAME(lua_State *L) { return binary(L, &flow_op_##NAME); }
BINARY(add)
BINARY(sub)
BINARY(mul)

BINARY(remainder)
BINARY(fmod)
BINARY(floor_divide)

/* div(a, b, {rounding_mode = nil | "trunc" | "floor"}): true division, or its quotient rounded
 * toward zero (trunc_divide) or down (floor_divide) in the operands' promoted dtype; an integer
 * division by zero raises, as torch's ZeroDivisionError. */
static int l_div(lua_State *L) {
  flow_lua_check_opts(L, 3, "div", (const char *const[]){"rounding_mode", NULL});
  const flow_op *op = &flow_op_div;
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "rounding_mode");
    static const char *const modes[] = {"trunc", "floor", NULL};
    if (!lua_isnil(L, -1)) op = luaL_checkoption(L, -1, NULL, modes) == 0 ? &flow_op_trunc_divide : &flow_op_floor_divide;
    lua_settop(L, 2);
  }
  return binary(L, op);
}
BINARY(pow)
BINARY(maximum)
BINARY(minimum)
BINARY(eq)
BINARY(ne)
BINARY(lt)
BINARY(le)
BINARY(gt)
BINARY(ge)

#define UNARY(NAME)                                                        \
  static int l_##NAME(lua_State *L) {                                      \
    return flow_lua_push(L, flow_##NAME(flow_lua_check(L, 1, #NAME)));     \
  }
UNARY(neg)
UNARY(abs)
UNARY(exp)
UNARY(log)
UNARY(sqrt)
UNARY(rsqrt)
UNARY(tanh)
UNARY(sigmoid)
UNARY(relu)
UNARY(silu)
UNARY(sin)
UNARY(cos)
UNARY(erf)
UNARY(log1p)
UNARY(expm1)
UNARY(sign)
UNARY(floor)
UNARY(ceil)
UNARY(round)
UNARY(trunc)

/* gelu(t, {approximate = "none" | "tanh"}): "none" (torch's default) is x Phi(x) through erf */
static int l_gelu(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "gelu");
  flow_lua_check_opts(L, 2, "gelu", (const char *const[]){"approximate", NULL});
  if (lua_istable(L, 2)) lua_getfield(L, 2, "approximate");
  else lua_pushnil(L);
  static const char *const modes[] = {"none", "tanh", NULL};
  int tanh_form = lua_isnil(L, -1) ? 0 : luaL_checkoption(L, -1, NULL, modes);
  return flow_lua_push(L, tanh_form ? flow_gelu_tanh(t) : flow_gelu(t));
}

/* softplus(t, {beta = 1, threshold = 20}): torch's defaults only */
static int l_softplus(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "softplus");
  flow_lua_check_opts(L, 2, "softplus", (const char *const[]){"beta", "threshold", NULL});
  if (flow_lua_opt_number(L, 2, "beta", 1) != 1 || flow_lua_opt_number(L, 2, "threshold", 20) != 20)
    return luaL_error(L, "softplus: only beta = 1 and threshold = 20 (torch's defaults) are supported");
  return flow_lua_push(L, flow_softplus(t));
}

/* __unm receives the operand twice */
static int l_unm(lua_State *L) { return flow_lua_push(L, flow_neg(flow_lua_check(L, 1, "neg"))); }

/* An optional number bound at idx: nil/none means absent. */
static bool opt_bound(lua_State *L, int idx, const char *what, double *v) {
  if (lua_isnoneornil(L, idx)) return false;
  if (lua_type(L, idx) != LUA_TNUMBER)
    luaL_error(L, "clamp: %s must be a number or nil (got %s)", what, luaL_typename(L, idx));
  *v = lua_tonumber(L, idx);
  return true;
}

/* clamp(t, min, max): either bound may be nil */
static int l_clamp(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "clamp");
  double lo = -INFINITY, hi = INFINITY;
  bool has_lo = opt_bound(L, 2, "min", &lo), has_hi = opt_bound(L, 3, "max", &hi);
  return flow_lua_push(L, flow_clamp(t, has_lo, lo, has_hi, hi));
}

/* clamp_min(t, min) = clamp(t, min); clamp_max(t, max) = clamp(t, nil, max) */
static int clamp_one(lua_State *L, const char *fn, bool is_min) {
  flow_tensor *t = flow_lua_check(L, 1, fn);
  if (lua_type(L, 2) != LUA_TNUMBER)
    return luaL_error(L, "%s: %s must be a number (got %s)", fn, is_min ? "min" : "max", luaL_typename(L, 2));
  double v = lua_tonumber(L, 2);
  flow_tensor *r = flow_clamp(t, is_min, v, !is_min, v);
  if (!r) flow_error_prefix("%s", fn); /* "clamp_max: clamp: ..." */
  return flow_lua_push(L, r);
}
static int l_clamp_min(lua_State *L) { return clamp_one(L, "clamp_min", true); }
static int l_clamp_max(lua_State *L) { return clamp_one(L, "clamp_max", false); }

/* where(cond, a, b): a or b may be a Lua number; the dtype is torch's result type of the two */
static int l_where(lua_State *L) {
  flow_tensor *cond = flow_lua_check(L, 1, "where");
  check_operand(L, 2, "where");
  check_operand(L, 3, "where");
  const flow_tensor *like = flow_lua_test(L, 2);
  if (!like) like = flow_lua_test(L, 3);
  if (!like) like = cond;
  flow_dtype dt[2];
  int nd[2];
  bool num[2];
  for (int i = 0; i < 2; i++) operand_type(L, i + 2, &dt[i], &nd[i], &num[i]);
  flow_dtype d = flow_result_type(2, dt, nd, num);
  flow_tensor *a = operand(L, 2, like, d);
  flow_tensor *b = operand(L, 3, like, d);
  flow_tensor *r = flow_where(cond, a, b);
  flow_tensor_decref(a);
  flow_tensor_decref(b);
  return flow_lua_push(L, r);
}

static int l_masked_fill(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "masked_fill");
  flow_tensor *mask = flow_lua_check(L, 2, "masked_fill");
  int ty = lua_type(L, 3);
  if (ty != LUA_TNUMBER && ty != LUA_TBOOLEAN)
    return luaL_error(L, "masked_fill: argument 3 (value) must be a number (got %s)", luaL_typename(L, 3));
  double v = ty == LUA_TBOOLEAN ? lua_toboolean(L, 3) : lua_tonumber(L, 3);
  return flow_lua_push(L, flow_masked_fill(t, mask, v));
}

/* ---- casts ---------------------------------------------------------------------------------- */

static int l_cast(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "cast");
  return flow_lua_push(L, flow_cast(t, flow_lua_check_dtype(L, 2)));
}

#define CAST(NAME, DTYPE)                                                    \
  static int l_##NAME(lua_State *L) {                                        \
    return flow_lua_push(L, flow_cast(flow_lua_check(L, 1, #NAME), DTYPE));  \
  }
CAST(float, FLOW_F32)
CAST(double, FLOW_F64)
CAST(half, FLOW_F16)
CAST(bfloat16, FLOW_BF16)
CAST(long, FLOW_I64)
CAST(int, FLOW_I32)
CAST(bool, FLOW_BOOL)

/* ---- in place: return the tensor itself ----------------------------------------------------- */

static int inplace_binary(lua_State *L, const char *fn, int (*f)(flow_tensor *, flow_tensor *)) {
  flow_tensor *t = flow_lua_check(L, 1, fn);
  check_operand(L, 2, fn);
  flow_tensor *o = flow_lua_to_tensor(L, 2, t, fn);
  int rc = f(t, o);
  flow_tensor_decref(o);
  if (rc != 0) return flow_lua_error(L);
  lua_settop(L, 1);
  return 1;
}

static int l_add_(lua_State *L) { return inplace_binary(L, "add_", flow_add_inplace); }
static int l_mul_(lua_State *L) { return inplace_binary(L, "mul_", flow_mul_inplace); }
static int l_copy_(lua_State *L) { return inplace_binary(L, "copy_", flow_copy_inplace); }

static int fill(lua_State *L, flow_tensor *t, double v) {
  if (flow_fill_inplace(t, v) != 0) return flow_lua_error(L);
  lua_settop(L, 1);
  return 1;
}

static int l_fill_(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "fill_");
  int ty = lua_type(L, 2);
  if (ty != LUA_TNUMBER && ty != LUA_TBOOLEAN)
    return luaL_error(L, "fill_: argument 2 (value) must be a number (got %s)", luaL_typename(L, 2));
  return fill(L, t, ty == LUA_TBOOLEAN ? lua_toboolean(L, 2) : lua_tonumber(L, 2));
}

static int l_zero_(lua_State *L) { return fill(L, flow_lua_check(L, 1, "zero_"), 0); }

void flow_lua_open_elementwise(lua_State *L) {
#define BOTH(NAME) {#NAME, l_##NAME}
#define MATH_OPS                                                                                 \
  BOTH(add), BOTH(sub), BOTH(mul), BOTH(div), BOTH(pow), BOTH(maximum), BOTH(minimum), BOTH(eq),  \
  BOTH(ne), BOTH(lt), BOTH(le), BOTH(gt), BOTH(ge), BOTH(neg), BOTH(abs), BOTH(exp), BOTH(log),   \
  BOTH(sqrt), BOTH(rsqrt), BOTH(tanh), BOTH(sigmoid), BOTH(relu), BOTH(gelu), BOTH(clamp),        \
  BOTH(clamp_min), BOTH(clamp_max),        \
  BOTH(silu), BOTH(sin), BOTH(cos), BOTH(erf), BOTH(log1p), BOTH(expm1), BOTH(softplus),          \
  BOTH(sign), BOTH(floor), BOTH(ceil), BOTH(round), BOTH(trunc), BOTH(remainder), BOTH(fmod),     \
  BOTH(floor_divide), BOTH(masked_fill), BOTH(cast)
  /* where is no method: t:where(...) would read differently here (t the condition) and in torch */
  static const luaL_Reg fns[] = {MATH_OPS, BOTH(where), {NULL, NULL}};
  static const luaL_Reg methods[] = {
    MATH_OPS, BOTH(float), BOTH(double), BOTH(half), BOTH(bfloat16), BOTH(long), BOTH(int), BOTH(bool),
    BOTH(add_), BOTH(mul_), BOTH(copy_), BOTH(fill_), BOTH(zero_), {NULL, NULL}};
#undef MATH_OPS
#undef BOTH
  flow_lua_register(L, fns, methods);
  luaL_getmetatable(L, FLOW_TENSOR_MT);
  static const luaL_Reg meta[] = {{"__add", l_add}, {"__sub", l_sub}, {"__mul", l_mul}, {"__div", l_div},
                                  {"__pow", l_pow}, {"__unm", l_unm}, {"__mod", l_remainder},
                                  {"__idiv", l_floor_divide}, {NULL, NULL}};
  luaL_setfuncs(L, meta, 0);
  lua_pop(L, 1);
}
