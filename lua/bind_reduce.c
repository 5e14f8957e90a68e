/* Lua bindings of the reductions. */
#include "../ops/reduce.h"
#include "bind.h"

/* t:sum(axes, keepdim) / flow.sum(t, axes, keepdim) */
static int l_sum(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "sum");
  int64_t axes[FLOW_MAX_DIMS];
  int n = flow_lua_axes(L, 2, axes, "sum");
  return flow_lua_push(L, flow_sum(t, n, axes, lua_toboolean(L, 3)));
}

void flow_lua_open_reduce(lua_State *L) {
  static const luaL_Reg fns[] = {{"sum", l_sum}, {NULL, NULL}};
  flow_lua_register(L, fns, fns);
}
