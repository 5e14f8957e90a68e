/* Lua bindings of the shape and view ops. */
#include "../ops/shape.h"
#include "bind.h"

static int l_reshape(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "reshape");
  int64_t shape[FLOW_MAX_DIMS];
  int n = flow_lua_shape(L, 2, shape, "reshape");
  return flow_lua_push(L, flow_reshape(t, n, shape));
}

static int l_view(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "view");
  flow_attrs a;
  flow_attrs_init(&a);
  a.nshape = flow_lua_shape(L, 2, a.shape, "view");
  return flow_lua_call(L, &flow_op_view, &t, 1, &a);
}

static int l_expand(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "expand");
  int64_t shape[FLOW_MAX_DIMS];
  int n = flow_lua_shape(L, 2, shape, "expand");
  return flow_lua_push(L, flow_expand(t, n, shape));
}

void flow_lua_open_shape(lua_State *L) {
  static const luaL_Reg fns[] = {{"reshape", l_reshape}, {"view", l_view}, {"expand", l_expand}, {NULL, NULL}};
  flow_lua_register(L, fns, fns);
}
