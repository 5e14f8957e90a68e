/* Lua bindings of the elementwise ops, and the arithmetic metamethods (+ - * / ^, unary -). */
#include "../ops/elementwise.h"
#include "bind.h"

/* Either operand may be a Lua number; it takes the other operand's dtype and device. */
static int binary(lua_State *L, const flow_op *op) {
  flow_tensor *ta = flow_lua_test(L, 1), *tb = flow_lua_test(L, 2);
  const flow_tensor *like = ta ? ta : tb;
  if (!like) {
    flow_lua_check(L, flow_lua_test(L, 1) ? 2 : 1, op->name);
  }
  flow_tensor *in[2] = {flow_lua_to_tensor(L, 1, like, op->name), NULL};
  in[1] = flow_lua_to_tensor(L, 2, like, op->name);
  flow_tensor *r = flow_binary(op, in[0], in[1]);
  flow_tensor_decref(in[0]);
  flow_tensor_decref(in[1]);
  return flow_lua_push(L, r);
}

static int l_add(lua_State *L) { return binary(L, &flow_op_add); }
static int l_sub(lua_State *L) { return binary(L, &flow_op_sub); }
static int l_mul(lua_State *L) { return binary(L, &flow_op_mul); }
static int l_div(lua_State *L) { return binary(L, &flow_op_div); }

static int l_cast(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "cast");
  return flow_lua_push(L, flow_cast(t, flow_lua_check_dtype(L, 2)));
}

static int l_add_(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "add_");
  flow_tensor *o = flow_lua_to_tensor(L, 2, t, "add_");
  int rc = flow_add_inplace(t, o);
  flow_tensor_decref(o);
  if (rc != 0) return flow_lua_error(L);
  lua_settop(L, 1);
  return 1;
}

static int l_copy_(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "copy_");
  flow_tensor *o = flow_lua_to_tensor(L, 2, t, "copy_");
  int rc = flow_copy_inplace(t, o);
  flow_tensor_decref(o);
  if (rc != 0) return flow_lua_error(L);
  lua_settop(L, 1);
  return 1;
}

void flow_lua_open_elementwise(lua_State *L) {
  static const luaL_Reg fns[] = {{"add", l_add}, {"sub", l_sub}, {"mul", l_mul}, {"div", l_div},
                                 {"cast", l_cast}, {NULL, NULL}};
  static const luaL_Reg methods[] = {{"add", l_add}, {"sub", l_sub}, {"mul", l_mul}, {"div", l_div},
                                     {"cast", l_cast}, {"add_", l_add_}, {"copy_", l_copy_}, {NULL, NULL}};
  flow_lua_register(L, fns, methods);
  luaL_getmetatable(L, FLOW_TENSOR_MT);
  static const luaL_Reg meta[] = {{"__add", l_add}, {"__sub", l_sub}, {"__mul", l_mul}, {"__div", l_div},
                                  {NULL, NULL}};
  luaL_setfuncs(L, meta, 0);
  lua_pop(L, 1);
}
