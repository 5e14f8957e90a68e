/* Lua bindings of conv2d, max_pool2d, avg_pool2d and batch_norm (ops/conv.c). */
#include "../ops/conv.h"
#include "bind.h"

/* opts[key]: an integer (both axes) or a pair {h, w}; def when absent. */
static void opt_pair(lua_State *L, int opts, const char *key, int64_t def, int64_t out[2], const char *fn) {
  out[0] = out[1] = def;
  if (!lua_istable(L, opts)) return;
  lua_getfield(L, opts, key);
  int v = lua_gettop(L);
  if (lua_isinteger(L, v)) {
    out[0] = out[1] = lua_tointeger(L, v);
  } else if (lua_istable(L, v)) {
    int64_t s[FLOW_MAX_DIMS];
    if (flow_lua_shape(L, v, s, fn) != 2) luaL_error(L, "%s: %s must be an integer or a pair {h, w}", fn, key);
    out[0] = s[0];
    out[1] = s[1];
  } else if (!lua_isnil(L, v)) {
    luaL_error(L, "%s: %s must be an integer or a pair {h, w} (got %s)", fn, key, luaL_typename(L, v));
  }
  lua_pop(L, 1);
}

static int64_t opt_int(lua_State *L, int opts, const char *key, int64_t def, const char *fn) {
  if (!lua_istable(L, opts)) return def;
  lua_getfield(L, opts, key);
  int64_t r = def;
  if (lua_isinteger(L, -1)) r = lua_tointeger(L, -1);
  else if (!lua_isnil(L, -1)) luaL_error(L, "%s: %s must be an integer (got %s)", fn, key, luaL_typename(L, -1));
  lua_pop(L, 1);
  return r;
}

/* flow.conv2d(x, w, bias?, {stride = 1, padding = 0, dilation = 1, groups = 1}) */
static int l_conv2d(lua_State *L) {
  flow_tensor *x = flow_lua_check(L, 1, "conv2d"), *w = flow_lua_check(L, 2, "conv2d");
  flow_tensor *b = lua_isnoneornil(L, 3) ? NULL : flow_lua_check(L, 3, "conv2d");
  int64_t stride[2], padding[2], dilation[2];
  flow_lua_check_opts(L, 4, "conv2d", (const char *const[]){"stride", "padding", "dilation", "groups", NULL});
  opt_pair(L, 4, "stride", 1, stride, "conv2d");
  opt_pair(L, 4, "padding", 0, padding, "conv2d");
  opt_pair(L, 4, "dilation", 1, dilation, "conv2d");
  int64_t groups = opt_int(L, 4, "groups", 1, "conv2d");
  return flow_lua_push(L, flow_conv2d(x, w, b, stride, padding, dilation, groups));
}

/* flow.max_pool2d(x, {kernel =, stride = kernel, padding = 0}) (kernel may also be argument 2) */
static int pool(lua_State *L, const char *fn, bool max) {
  flow_tensor *x = flow_lua_check(L, 1, fn);
  int64_t kernel[2], stride[2], padding[2];
  int opts = 2;
  if (lua_isinteger(L, 2) || (lua_istable(L, 2) && lua_rawlen(L, 2) > 0)) {
    lua_newtable(L);
    lua_pushvalue(L, 2);
    lua_setfield(L, -2, "kernel");
    opt_pair(L, lua_gettop(L), "kernel", 0, kernel, fn);
    lua_pop(L, 1);
    opts = 3;
  } else {
    opt_pair(L, 2, "kernel", 0, kernel, fn);
  }
  flow_lua_check_opts(L, opts, fn, opts == 2 ? (const char *const[]){"kernel", "stride", "padding", NULL}
                                            : (const char *const[]){"stride", "padding", NULL});
  if (kernel[0] == 0) return luaL_error(L, "%s: kernel size is required", fn);
  opt_pair(L, opts, "stride", 0, stride, fn);
  if (stride[0] == 0 && stride[1] == 0) { stride[0] = kernel[0]; stride[1] = kernel[1]; }
  opt_pair(L, opts, "padding", 0, padding, fn);
  return flow_lua_push(L, max ? flow_max_pool2d(x, kernel, stride, padding) : flow_avg_pool2d(x, kernel, stride, padding));
}
static int l_max_pool2d(lua_State *L) { return pool(L, "max_pool2d", true); }
static int l_avg_pool2d(lua_State *L) { return pool(L, "avg_pool2d", false); }

/* flow.batch_norm(x, weight, bias, running_mean, running_var, {training = false, momentum = 0.1, eps = 1e-5}) */
static int l_batch_norm(lua_State *L) {
  flow_tensor *t[5];
  for (int i = 0; i < 5; i++) t[i] = flow_lua_check(L, i + 1, "batch_norm");
  flow_lua_check_opts(L, 6, "batch_norm", (const char *const[]){"training", "momentum", "eps", NULL});
  bool training = flow_lua_opt_bool(L, 6, "training", 0);
  double momentum = flow_lua_opt_number(L, 6, "momentum", 0.1), eps = flow_lua_opt_number(L, 6, "eps", 1e-5);
  return flow_lua_push(L, flow_batch_norm(t[0], t[1], t[2], t[3], t[4], training, momentum, eps));
}

void flow_lua_open_conv(lua_State *L) {
  static const luaL_Reg fns[] = {{"conv2d", l_conv2d},
                                 {"max_pool2d", l_max_pool2d},
                                 {"avg_pool2d", l_avg_pool2d},
                                 {"batch_norm", l_batch_norm},
                                 {NULL, NULL}};
  flow_lua_register(L, fns, fns);
}
