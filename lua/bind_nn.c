/* Lua bindings of matmul and the neural-network ops. */
#include <math.h>
#include <string.h>

#include "../ops/matmul.h"
#include "../ops/nn.h"
#include "bind.h"

/* flow.matmul(a, b, {transpose_a =, transpose_b =}) */
static int l_matmul(lua_State *L) {
  flow_tensor *a = flow_lua_check(L, 1, "matmul"), *b = flow_lua_check(L, 2, "matmul");
  flow_lua_check_opts(L, 3, "matmul", (const char *const[]){"transpose_a", "transpose_b", NULL});
  return flow_lua_push(L, flow_matmul(a, b, flow_lua_opt_bool(L, 3, "transpose_a", 0),
                                      flow_lua_opt_bool(L, 3, "transpose_b", 0)));
}

/* flow.linear(x, w, b): x W^T + b in one op */
static int l_linear(lua_State *L) {
  flow_tensor *x = flow_lua_check(L, 1, "linear"), *w = flow_lua_check(L, 2, "linear"), *b = flow_lua_check(L, 3, "linear");
  return flow_lua_push(L, flow_linear(x, w, b));
}

static int64_t opt_axis(lua_State *L, int idx, const char *fn) {
  if (lua_isnoneornil(L, idx)) return -1;
  int ok;
  lua_Integer ax = lua_tointegerx(L, idx, &ok);
  if (!ok) return luaL_error(L, "%s: axis must be an integer (got %s)", fn, luaL_typename(L, idx));
  return ax;
}

/* flow.softmax(t, axis = -1) */
static int l_softmax(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "softmax");
  return flow_lua_push(L, flow_softmax(t, opt_axis(L, 2, "softmax")));
}

/* flow.log_softmax(t, axis = -1) */
static int l_log_softmax(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "log_softmax");
  return flow_lua_push(L, flow_log_softmax(t, opt_axis(L, 2, "log_softmax")));
}

/* flow.layer_norm(x, weight, bias, eps = 1e-5): weight and bias may be nil; eps may also come as
 * {eps = }. */
static int l_layer_norm(lua_State *L) {
  flow_tensor *x = flow_lua_check(L, 1, "layer_norm");
  flow_tensor *w = lua_isnoneornil(L, 2) ? NULL : flow_lua_check(L, 2, "layer_norm");
  flow_tensor *b = lua_isnoneornil(L, 3) ? NULL : flow_lua_check(L, 3, "layer_norm");
  if (lua_istable(L, 4)) flow_lua_check_opts(L, 4, "layer_norm", (const char *const[]){"eps", NULL});
  double eps = lua_istable(L, 4) ? flow_lua_opt_number(L, 4, "eps", 1e-5) : luaL_optnumber(L, 4, 1e-5);
  return flow_lua_push(L, flow_layer_norm(x, w, b, eps));
}

/* flow.cross_entropy(logits, target, {ignore_index = -100, reduction = "mean" | "sum" | "none"}) */
static int l_cross_entropy(lua_State *L) {
  flow_tensor *x = flow_lua_check(L, 1, "cross_entropy"), *t = flow_lua_check(L, 2, "cross_entropy");
  flow_reduction red = FLOW_REDUCTION_MEAN;
  lua_Integer ignore = -100;
  flow_lua_check_opts(L, 3, "cross_entropy", (const char *const[]){"ignore_index", "reduction", NULL});
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "reduction");
    if (!lua_isnil(L, -1)) {
      const char *s = lua_tostring(L, -1);
      if (s && strcmp(s, "sum") == 0) red = FLOW_REDUCTION_SUM;
      else if (s && strcmp(s, "none") == 0) red = FLOW_REDUCTION_NONE;
      else if (!s || strcmp(s, "mean") != 0)
        return luaL_error(L, "cross_entropy: reduction must be \"mean\", \"sum\" or \"none\" (got %s)",
                          s ? s : luaL_typename(L, -1));
    }
    lua_getfield(L, 3, "ignore_index");
    if (!lua_isnil(L, -1)) {
      int ok;
      ignore = lua_tointegerx(L, -1, &ok);
      if (!ok) return luaL_error(L, "cross_entropy: ignore_index must be an integer");
    }
    lua_pop(L, 2);
  } else if (!lua_isnoneornil(L, 3)) {
    return luaL_error(L, "cross_entropy: options must be a table (got %s)", luaL_typename(L, 3));
  }
  return flow_lua_push(L, flow_cross_entropy(x, t, ignore, red));
}

/* flow.scaled_dot_product_attention(q, k, v, {causal = false, scale = 1/sqrt(D)}) */
static int l_attention(lua_State *L) {
  const char *fn = "scaled_dot_product_attention";
  flow_tensor *q = flow_lua_check(L, 1, fn), *k = flow_lua_check(L, 2, fn), *v = flow_lua_check(L, 3, fn);
  flow_lua_check_opts(L, 4, fn, (const char *const[]){"causal", "scale", NULL});
  return flow_lua_push(L, flow_scaled_dot_product_attention(q, k, v, flow_lua_opt_bool(L, 4, "causal", 0),
                                                            flow_lua_opt_number(L, 4, "scale", NAN)));
}

/* flow.adamw_(param, grad, m, v, {lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8,
 * weight_decay = 0.01, step = <required, 1-based>}) -> param */
static int l_adamw_(lua_State *L) {
  flow_tensor *t[4];
  for (int i = 0; i < 4; i++) t[i] = flow_lua_check(L, i + 1, "adamw_");
  if (!lua_istable(L, 5)) return luaL_error(L, "adamw_: expected an options table {lr =, step =, ...} as argument 5");
  flow_lua_check_opts(L, 5, "adamw_", (const char *const[]){"lr", "beta1", "beta2", "eps", "weight_decay", "step", NULL});
  lua_getfield(L, 5, "step");
  int ok;
  lua_Integer step = lua_tointegerx(L, -1, &ok);
  if (!ok) return luaL_error(L, "adamw_: options.step (the 1-based step count) must be an integer");
  lua_pop(L, 1);
  if (flow_adamw_(t[0], t[1], t[2], t[3], flow_lua_opt_number(L, 5, "lr", 1e-3),
                  flow_lua_opt_number(L, 5, "beta1", 0.9), flow_lua_opt_number(L, 5, "beta2", 0.999),
                  flow_lua_opt_number(L, 5, "eps", 1e-8), flow_lua_opt_number(L, 5, "weight_decay", 0.01), step) != 0)
    return flow_lua_error(L);
  lua_settop(L, 1);
  return 1;
}

void flow_lua_open_nn(lua_State *L) {
  static const luaL_Reg fns[] = {{"matmul", l_matmul},
                                 {"linear", l_linear},
                                 {"softmax", l_softmax},
                                 {"log_softmax", l_log_softmax},
                                 {"layer_norm", l_layer_norm},
                                 {"cross_entropy", l_cross_entropy},
                                 {"scaled_dot_product_attention", l_attention},
                                 {"adamw_", l_adamw_},
                                 {NULL, NULL}};
  flow_lua_register(L, fns, fns);
}
