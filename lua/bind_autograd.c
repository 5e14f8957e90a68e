/* Lua bindings: grad mode (no_grad, enable_grad, is_grad_enabled, set_grad_enabled) and the
 * registry introspection the gradient check runs on (flow._ops, flow._call). */
#include <string.h>

#include "../ops/autograd.h"
#include "bind.h"

/* ---- grad mode ------------------------------------------------------------------------------ */

/* Run fn(...) (arguments 1..top) with grad mode `on`, restore the previous mode whether fn
 * returns or raises, then return fn's results or re-raise its error. */
static int with_grad_mode(lua_State *L, bool on) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  bool prev = flow_grad_set_enabled(on);
  int rc = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  flow_grad_set_enabled(prev);
  if (rc != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}

static int l_no_grad(lua_State *L) { return with_grad_mode(L, false); }
static int l_enable_grad(lua_State *L) { return with_grad_mode(L, true); }

static int l_is_grad_enabled(lua_State *L) {
  lua_pushboolean(L, flow_grad_enabled());
  return 1;
}

static int l_set_grad_enabled(lua_State *L) {
  luaL_checkany(L, 1);
  lua_pushboolean(L, flow_grad_set_enabled(lua_toboolean(L, 1)));
  return 1;
}

/* ---- registry introspection ----------------------------------------------------------------- */

static const char *kind_name(enum flow_op_kind k) {
  switch (k) {
  case FLOW_OP_VIEW: return "view";
  case FLOW_OP_INPLACE: return "inplace";
  case FLOW_OP_SOURCE: return "source";
  default: return "compute";
  }
}

/* flow._ops() -> { {name=, nin=, nout=, kind=, differentiable=}, ... } in registry order. */
static int l_ops(lua_State *L) {
  lua_newtable(L);
  int i = 0;
  for (const flow_op *op = flow_op_first(); op; op = op->next) {
    lua_createtable(L, 0, 5);
    lua_pushstring(L, op->name);
    lua_setfield(L, -2, "name");
    lua_pushinteger(L, op->nin);
    lua_setfield(L, -2, "nin");
    lua_pushinteger(L, op->nout);
    lua_setfield(L, -2, "nout");
    lua_pushstring(L, kind_name(op->kind));
    lua_setfield(L, -2, "kind");
    lua_pushboolean(L, op->grad != NULL);
    lua_setfield(L, -2, "differentiable");
    lua_rawseti(L, -2, ++i);
  }
  return 1;
}

/* Boolean attrs that set one FLOW_ATTR_* bit. */
static const struct { const char *key; int bit; } flag_keys[] = {
  {"causal", FLOW_ATTR_CAUSAL}, {"transpose_a", FLOW_ATTR_TRANS_A}, {"transpose_b", FLOW_ATTR_TRANS_B},
  {"has_min", FLOW_ATTR_HAS_MIN}, {"has_max", FLOW_ATTR_HAS_MAX},
  {"unbiased", FLOW_ATTR_UNBIASED}, {"reverse", FLOW_ATTR_REVERSE}, {"descending", FLOW_ATTR_DESCENDING},
};

static int64_t check_int(lua_State *L, int idx, const char *key) {
  int ok;
  lua_Integer v = lua_tointegerx(L, idx, &ok);
  if (!ok) luaL_error(L, "_call: attr '%s' must be an integer (got %s)", key, luaL_typename(L, idx));
  return v;
}

static double check_num(lua_State *L, int idx, const char *key) {
  if (lua_type(L, idx) != LUA_TNUMBER)
    luaL_error(L, "_call: attr '%s' must be a number (got %s)", key, luaL_typename(L, idx));
  return lua_tonumber(L, idx);
}

/* The attrs table at idx into a: each key names a flow_attrs field; unknown keys are errors so
 * a misspelt attribute in a test cannot pass silently. */
static void parse_attrs(lua_State *L, int idx, flow_attrs *a) {
  flow_attrs_init(a);
  if (lua_isnoneornil(L, idx)) return;
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) != LUA_TSTRING) luaL_error(L, "_call: attr keys must be strings");
    const char *k = lua_tostring(L, -2);
    int v = lua_gettop(L);
    if (strcmp(k, "axes") == 0) a->naxes = flow_lua_axes(L, v, a->axes, "_call");
    else if (strcmp(k, "shape") == 0) a->nshape = flow_lua_shape(L, v, a->shape, "_call");
    else if (strcmp(k, "axis") == 0) a->axis = check_int(L, v, k);
    else if (strcmp(k, "start") == 0) a->start = check_int(L, v, k);
    else if (strcmp(k, "length") == 0) a->length = check_int(L, v, k);
    else if (strcmp(k, "k") == 0) a->k = check_int(L, v, k);
    else if (strcmp(k, "ignore_index") == 0) a->ignore_index = check_int(L, v, k);
    else if (strcmp(k, "seed") == 0) a->seed = (uint64_t)check_int(L, v, k);
    else if (strcmp(k, "rng_offset") == 0) a->rng_offset = (uint64_t)check_int(L, v, k);
    else if (strcmp(k, "flags") == 0) a->flags |= (int)check_int(L, v, k);
    else if (strcmp(k, "keepdim") == 0) a->keepdim = lua_toboolean(L, v);
    else if (strcmp(k, "scalar") == 0) a->scalar = check_num(L, v, k);
    else if (strcmp(k, "scalar2") == 0) a->scalar2 = check_num(L, v, k);
    else if (strcmp(k, "eps") == 0) a->eps = check_num(L, v, k);
    else if (strcmp(k, "dtype") == 0) a->dtype = flow_lua_check_dtype(L, v);
    else if (strcmp(k, "device") == 0) {
      if (flow_device_parse(luaL_checkstring(L, v), &a->device) != 0) flow_lua_error(L);
    }
    else {
      size_t i = 0, n = sizeof flag_keys / sizeof flag_keys[0];
      while (i < n && strcmp(k, flag_keys[i].key) != 0) i++;
      if (i == n) luaL_error(L, "_call: unknown attr '%s'", k);
      if (lua_toboolean(L, v)) a->flags |= flag_keys[i].bit;
      else a->flags &= ~flag_keys[i].bit;
    }
    lua_pop(L, 1);
  }
}

#define CALL_MAX_IN 64

/* flow._call(name, attrs, t1, t2, ...) -> every output of the op, through flow_op_call (so
 * autograd records it). The tensors stay borrowed from the Lua stack: no reference to leak. */
static int l_call(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const flow_op *op = flow_op_find(name);
  if (!op) return luaL_error(L, "_call: no op named '%s'", name);
  flow_attrs a;
  parse_attrs(L, 2, &a);
  int nin = lua_gettop(L) - 2;
  if (nin < 0) nin = 0;
  if (nin > CALL_MAX_IN) return luaL_error(L, "_call: %s: at most %d inputs (got %d)", name, CALL_MAX_IN, nin);
  flow_tensor *in[CALL_MAX_IN];
  for (int i = 0; i < nin; i++) in[i] = flow_lua_check(L, i + 3, name);
  luaL_checkstack(L, op->nout + 2, "_call");
  return flow_lua_call(L, op, in, nin, &a);
}

void flow_lua_attrs(lua_State *L, int idx, flow_attrs *a) { parse_attrs(L, idx, a); }

void flow_lua_open_autograd(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"no_grad", l_no_grad}, {"enable_grad", l_enable_grad}, {"is_grad_enabled", l_is_grad_enabled},
    {"set_grad_enabled", l_set_grad_enabled}, {"_ops", l_ops}, {"_call", l_call}, {NULL, NULL}};
  flow_lua_register(L, fns, NULL);
}
