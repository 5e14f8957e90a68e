/* Lua bindings: tensor creation (tensor from nested tables, zeros/ones/full). */
#include <string.h>

#include "../ops/elementwise.h"
#include "bind.h"

/* Walk the first element at each depth to find the shape; classify values for dtype inference. */
static int table_shape(lua_State *L, int idx, int64_t *shape) {
  int nd = 0;
  lua_pushvalue(L, idx);
  while (lua_istable(L, -1)) {
    if (nd == FLOW_MAX_DIMS) return luaL_error(L, "tensor: nesting deeper than %d levels", FLOW_MAX_DIMS);
    shape[nd++] = (int64_t)luaL_len(L, -1);
    if (shape[nd - 1] == 0) break;
    lua_geti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
  return nd;
}

typedef struct fill_state {
  char *p;
  flow_dtype dtype;
  size_t es;
  int all_int, all_bool;
} fill_state;

/* Check the nesting against shape and (when p != NULL) write values row-major. */
static void fill(lua_State *L, int idx, const int64_t *shape, int nd, int d, fill_state *st, char *path) {
  if (d == nd) {
    int ty = lua_type(L, idx);
    if (ty == LUA_TBOOLEAN) st->all_int = 0;
    else if (ty == LUA_TNUMBER) { st->all_bool = 0; if (!lua_isinteger(L, idx)) st->all_int = 0; }
    else luaL_error(L, "tensor: element at %s is a %s (expected a number or boolean)", path, luaL_typename(L, idx));
    if (st->p) {
      double v = ty == LUA_TBOOLEAN ? lua_toboolean(L, idx) : lua_tonumber(L, idx);
      if (st->dtype == FLOW_I64 && lua_isinteger(L, idx)) *(int64_t *)st->p = lua_tointeger(L, idx);
      else flow_dtype_store(st->dtype, st->p, v);
      st->p += st->es;
    }
    return;
  }
  if (!lua_istable(L, idx) || (int64_t)luaL_len(L, idx) != shape[d])
    luaL_error(L, "tensor: bad nesting at %s: expected a list of %lld elements (got %s)", path,
               (long long)shape[d], lua_istable(L, idx) ? "a list of another length" : luaL_typename(L, idx));
  size_t plen = strlen(path);
  for (int64_t i = 0; i < shape[d]; i++) {
    lua_geti(L, idx, i + 1);
    snprintf(path + plen, 24, "[%lld]", (long long)i + 1);
    fill(L, lua_gettop(L), shape, nd, d + 1, st, path);
    lua_pop(L, 1);
  }
  path[plen] = 0;
}

static int l_tensor(lua_State *L) {
  if (flow_lua_test(L, 1)) { /* flow.tensor(t): a copy */
    flow_tensor *t = flow_lua_check(L, 1, "tensor");
    flow_tensor *c = flow_contiguous_copy(t);
    flow_dtype dt = flow_lua_opt_dtype(L, 2, t->dtype);
    if (c && dt != c->dtype) { flow_tensor *d = flow_cast(c, dt); flow_tensor_decref(c); c = d; }
    return flow_lua_push(L, c);
  }
  if (lua_type(L, 1) != LUA_TTABLE && lua_type(L, 1) != LUA_TNUMBER && lua_type(L, 1) != LUA_TBOOLEAN)
    return luaL_error(L, "tensor: expected a (nested) list of numbers or a number (got %s)", luaL_typename(L, 1));
  int64_t shape[FLOW_MAX_DIMS];
  int nd = table_shape(L, 1, shape);
  char path[FLOW_MAX_DIMS * 24 + 32] = "data";
  fill_state st = {NULL, FLOW_F32, 0, 1, 1};
  fill(L, 1, shape, nd, 0, &st, path);
  flow_dtype def = flow_shape_numel(nd, shape) == 0 ? FLOW_F32 : st.all_bool ? FLOW_BOOL : st.all_int ? FLOW_I64 : FLOW_F32;
  flow_dtype dt = flow_lua_opt_dtype(L, 2, def);
  flow_device dev = flow_lua_opt_device(L, 2, FLOW_DEVICE_CPU);
  flow_tensor *t = flow_tensor_new(dt, FLOW_DEVICE_CPU, nd, shape);
  if (!t) return flow_lua_error(L);
  st.p = flow_tensor_data(t);
  st.dtype = dt;
  st.es = flow_dtype_size(dt);
  fill(L, 1, shape, nd, 0, &st, path);
  t->requires_grad = flow_lua_opt_bool(L, 2, "requires_grad", 0) && flow_dtype_is_float(dt);
  flow_lua_push(L, t);
  if (dev.type != FLOW_CPU) {
    lua_getfield(L, -1, "to");
    lua_insert(L, -2);
    lua_pushvalue(L, 2);
    lua_call(L, 2, 1);
  }
  return 1;
}

/* zeros/ones/full(shape..., [value], [opts]) */
static int create(lua_State *L, double v, int shape_idx) {
  int64_t shape[FLOW_MAX_DIMS];
  int nd = flow_lua_shape(L, shape_idx, shape, "full");
  int top = lua_gettop(L), opts = lua_istable(L, top) && top > shape_idx ? top : 0;
  if (opts && lua_istable(L, shape_idx) && opts == shape_idx) opts = 0;
  flow_dtype dt = opts ? flow_lua_opt_dtype(L, opts, FLOW_F32) : FLOW_F32;
  flow_device dev = opts ? flow_lua_opt_device(L, opts, FLOW_DEVICE_CPU) : FLOW_DEVICE_CPU;
  if (opts) {
    lua_getfield(L, opts, "placement");
    int global = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (global) {
      lua_getfield(L, LUA_REGISTRYINDEX, "flow.global_create");
      if (lua_isnil(L, -1)) return luaL_error(L, "full: global tensors are not available in this build");
      lua_pushliteral(L, "full");
      lua_createtable(L, nd, 0);
      for (int i = 0; i < nd; i++) { lua_pushinteger(L, shape[i]); lua_rawseti(L, -2, i + 1); }
      lua_pushnumber(L, v);
      lua_pushvalue(L, opts);
      lua_call(L, 4, 1);
      return 1;
    }
  }
  flow_tensor *t = flow_full(nd, shape, v, dt, dev);
  if (t && opts) t->requires_grad = flow_lua_opt_bool(L, opts, "requires_grad", 0) && flow_dtype_is_float(dt);
  return flow_lua_push(L, t);
}

static int l_zeros(lua_State *L) { return create(L, 0, 1); }
static int l_ones(lua_State *L) { return create(L, 1, 1); }

static int l_full(lua_State *L) {
  /* full(shape, value, opts) with shape a table */
  luaL_checktype(L, 1, LUA_TTABLE);
  double v = luaL_checknumber(L, 2);
  lua_remove(L, 2);
  return create(L, v, 1);
}

static int like(lua_State *L, double v) {
  flow_tensor *t = flow_lua_check(L, 1, "zeros_like");
  return flow_lua_push(L, flow_full_like(t, v));
}
static int l_zeros_like(lua_State *L) { return like(L, 0); }
static int l_ones_like(lua_State *L) { return like(L, 1); }
static int l_full_like(lua_State *L) { return like(L, luaL_checknumber(L, 2)); }

void flow_lua_open_create(lua_State *L) {
  static const luaL_Reg fns[] = {{"tensor", l_tensor}, {"zeros", l_zeros}, {"ones", l_ones}, {"full", l_full},
                                 {"zeros_like", l_zeros_like}, {"ones_like", l_ones_like},
                                 {"full_like", l_full_like}, {NULL, NULL}};
  flow_lua_register(L, fns, NULL);
}
