/* Lua bindings of the reductions. axes: nil (all), an integer, or a list; keepdim a boolean. */
#include "../ops/elementwise.h"
#include "../ops/reduce.h"
#include "../ops/sort.h"
#include "bind.h"

/* t:sum(axes, keepdim) / flow.sum(t, axes, keepdim); likewise mean */
static int l_sum(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "sum");
  int64_t axes[FLOW_MAX_DIMS];
  int n = flow_lua_axes(L, 2, axes, "sum");
  return flow_lua_push(L, flow_sum(t, n, axes, lua_toboolean(L, 3)));
}

static int l_mean(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "mean");
  int64_t axes[FLOW_MAX_DIMS];
  int n = flow_lua_axes(L, 2, axes, "mean");
  return flow_lua_push(L, flow_mean(t, n, axes, lua_toboolean(L, 3)));
}

/* var(t, axes, keepdim, unbiased = true) */
static int l_var(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "var");
  int64_t axes[FLOW_MAX_DIMS];
  int n = flow_lua_axes(L, 2, axes, "var");
  bool unbiased = lua_isnoneornil(L, 4) ? true : lua_toboolean(L, 4);
  return flow_lua_push(L, flow_var(t, n, axes, lua_toboolean(L, 3), unbiased));
}

/* cumsum(t, axis) / t:cumsum(axis) */
static int l_cumsum(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "cumsum");
  return flow_lua_push(L, flow_cumsum(t, luaL_checkinteger(L, 2), false));
}

/* The optional single axis at idx; false when nil. */
static bool opt_axis(lua_State *L, int idx, const char *fn, int64_t *axis) {
  if (lua_isnoneornil(L, idx)) return false;
  int ok;
  *axis = lua_tointegerx(L, idx, &ok);
  if (!ok) luaL_error(L, "%s: axis must be an integer or nil (got %s)", fn, luaL_typename(L, idx));
  return true;
}

/* max(t) -> the largest element (0-d); max(t, axis, keepdim) -> values, indices (int64);
 * max(a, b) with two tensors is maximum(a, b), as in torch */
static int maxmin(lua_State *L, bool is_max) {
  const char *fn = is_max ? "max" : "min";
  flow_tensor *t = flow_lua_check(L, 1, fn), *other = flow_lua_test(L, 2);
  if (other) return flow_lua_push(L, is_max ? flow_maximum(t, other) : flow_minimum(t, other));
  int64_t axis = 0;
  bool has_axis = opt_axis(L, 2, fn, &axis);
  flow_tensor *v, *i;
  if (flow_maxmin(t, is_max, has_axis, axis, lua_toboolean(L, 3), &v, has_axis ? &i : NULL) != 0)
    return flow_lua_error(L);
  flow_lua_push(L, v);
  if (!has_axis) return 1;
  flow_lua_push(L, i);
  return 2;
}

/* prod(t) over everything; prod(t, axis, keepdim) along one axis */
static int l_prod(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "prod");
  int64_t axis = 0;
  bool has_axis = opt_axis(L, 2, "prod", &axis);
  return flow_lua_push(L, flow_prod(t, has_axis, axis, lua_toboolean(L, 3)));
}

/* A flag at idx given as a boolean (the positional form, as torch's) or as key `key` of an options
 * table holding only `keys`; def when absent. */
static bool flag_or_opts(lua_State *L, int idx, const char *fn, const char *key, const char *const *keys,
                         bool def) {
  if (lua_isnoneornil(L, idx)) return def;
  if (lua_isboolean(L, idx)) return lua_toboolean(L, idx);
  flow_lua_check_opts(L, idx, fn, keys);
  return flow_lua_opt_bool(L, idx, key, def);
}

/* sort(t, axis = -1, descending | {descending, stable}) -> values, indices (int64). Always stable,
 * so stable = false (any order of ties) gets the stable order too. */
static int sort_call(lua_State *L, const char *fn, bool want_values) {
  flow_tensor *t = flow_lua_check(L, 1, fn);
  int64_t axis = -1;
  opt_axis(L, 2, fn, &axis);
  bool desc = flag_or_opts(L, 3, fn, "descending", (const char *const[]){"descending", "stable", NULL}, false);
  flow_tensor *v = NULL, *i;
  if (flow_sort(t, axis, desc, want_values ? &v : NULL, &i) != 0) {
    if (!want_values) flow_error_prefix("%s", fn); /* "argsort: sort: ..." */
    return flow_lua_error(L);
  }
  if (!want_values) return flow_lua_push(L, i);
  flow_lua_push(L, v);
  flow_lua_push(L, i);
  return 2;
}
static int l_sort(lua_State *L) { return sort_call(L, "sort", true); }
static int l_argsort(lua_State *L) { return sort_call(L, "argsort", false); }

/* topk(t, k, axis = -1, largest = true, sorted = true) or topk(t, k, axis, {largest, sorted}) ->
 * values, indices. Results always come sorted (a valid order for sorted = false too). */
static int l_topk(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "topk");
  lua_Integer k = luaL_checkinteger(L, 2);
  int64_t axis = -1;
  opt_axis(L, 3, "topk", &axis);
  bool largest = flag_or_opts(L, 4, "topk", "largest", (const char *const[]){"largest", "sorted", NULL}, true);
  if (!lua_isnoneornil(L, 5) && !lua_isboolean(L, 5))
    return luaL_error(L, "topk: sorted must be a boolean (got %s)", luaL_typename(L, 5));
  flow_tensor *v, *i;
  if (flow_topk(t, k, axis, largest, &v, &i) != 0) return flow_lua_error(L);
  flow_lua_push(L, v);
  flow_lua_push(L, i);
  return 2;
}

/* amax(t, axes, keepdim | {keepdim}) / t:amax(...): the largest value over axes (nil or {}: all),
 * as torch.amax; likewise amin */
static int amaxmin(lua_State *L, bool is_max) {
  const char *fn = is_max ? "amax" : "amin";
  flow_tensor *t = flow_lua_check(L, 1, fn);
  int64_t axes[FLOW_MAX_DIMS];
  int n = flow_lua_axes(L, 2, axes, fn);
  bool keepdim = flag_or_opts(L, 3, fn, "keepdim", (const char *const[]){"keepdim", NULL}, false);
  return flow_lua_push(L, flow_amaxmin(t, is_max, n, axes, keepdim));
}
static int l_amax(lua_State *L) { return amaxmin(L, true); }
static int l_amin(lua_State *L) { return amaxmin(L, false); }

static int l_max(lua_State *L) { return maxmin(L, true); }
static int l_min(lua_State *L) { return maxmin(L, false); }

/* argmax(t, axis, keepdim): without an axis, the flat index */
static int argmaxmin(lua_State *L, bool is_max) {
  const char *fn = is_max ? "argmax" : "argmin";
  flow_tensor *t = flow_lua_check(L, 1, fn);
  int64_t axis = 0;
  bool has_axis = opt_axis(L, 2, fn, &axis);
  return flow_lua_push(L, flow_argmaxmin(t, is_max, has_axis, axis, lua_toboolean(L, 3)));
}

static int l_argmax(lua_State *L) { return argmaxmin(L, true); }
static int l_argmin(lua_State *L) { return argmaxmin(L, false); }

void flow_lua_open_reduce(lua_State *L) {
  static const luaL_Reg fns[] = {{"sum", l_sum}, {"mean", l_mean}, {"var", l_var}, {"max", l_max},
                                 {"min", l_min}, {"argmax", l_argmax}, {"argmin", l_argmin},
                                 {"cumsum", l_cumsum}, {"prod", l_prod}, {"sort", l_sort},
                                 {"argsort", l_argsort}, {"topk", l_topk}, {"amax", l_amax},
                                 {"amin", l_amin}, {NULL, NULL}};
  flow_lua_register(L, fns, fns);
}
