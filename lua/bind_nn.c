/* Lua bindings of matmul and the neural-network ops. */
#include "../ops/matmul.h"
#include "bind.h"

/* flow.matmul(a, b, {transpose_a =, transpose_b =}) */
static int l_matmul(lua_State *L) {
  flow_tensor *a = flow_lua_check(L, 1, "matmul"), *b = flow_lua_check(L, 2, "matmul");
  return flow_lua_push(L, flow_matmul(a, b, flow_lua_opt_bool(L, 3, "transpose_a", 0),
                                      flow_lua_opt_bool(L, 3, "transpose_b", 0)));
}

void flow_lua_open_nn(lua_State *L) {
  static const luaL_Reg fns[] = {{"matmul", l_matmul}, {NULL, NULL}};
  flow_lua_register(L, fns, fns);
}
