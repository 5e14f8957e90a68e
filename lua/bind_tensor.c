/* The tensor userdata: lifetime (__gc, __close, free), fields, and reading values out. */
#include <string.h>

#include "../ops/autograd.h"
#include "../ops/elementwise.h"
#include "bind.h"

static flow_lua_box *box(lua_State *L) {
  flow_lua_box *b = flow_lua_box_of(L, 1);
  if (!b) luaL_typeerror(L, 1, "tensor");
  return b;
}

/* __gc runs only on tensor boxes: no type check needed. */
static int t_gc(lua_State *L) {
  flow_lua_box *b = lua_touserdata(L, 1);
  flow_tensor_decref(b->t);
  b->t = NULL;
  return 0;
}

static int t_free(lua_State *L) {
  flow_lua_box *b = box(L);
  flow_tensor_decref(b->t);
  b->t = NULL;
  return 0;
}

/* A tensor on the host with the same values (new reference): t itself when already there. */
static flow_tensor *host_copy(lua_State *L, flow_tensor *t) {
  if (t->lazy)
    luaL_error(L, "this tensor is lazy: it is a value inside nn.Graph's build, which is traced once and has no data "
                  "yet, so data-dependent control flow (such as `if loss:item() > x`) cannot be part of a graph; "
                  "return the tensor from build and read it after the call");
  if (t->device.type == FLOW_CPU) { flow_tensor_incref(t); return t; }
  lua_getfield(L, LUA_REGISTRYINDEX, "flow.to_host"); /* set by the CUDA binding */
  if (lua_isnil(L, -1)) luaL_error(L, "tensor is on a device this build cannot read");
  flow_tensor_incref(t);
  flow_lua_push(L, t);
  lua_call(L, 1, 1);
  flow_tensor *h = flow_lua_check(L, -1, "to_host");
  flow_tensor_incref(h);
  lua_pop(L, 1);
  return h;
}

static void push_value(lua_State *L, flow_dtype d, const char *p) {
  if (d == FLOW_BOOL) lua_pushboolean(L, *p != 0);
  else if (d == FLOW_I64) lua_pushinteger(L, *(const int64_t *)p);
  else if (d == FLOW_I32) lua_pushinteger(L, *(const int32_t *)p);
  else if (d == FLOW_U8) lua_pushinteger(L, *(const uint8_t *)p);
  else lua_pushnumber(L, flow_dtype_load(d, p));
}

static int t_item(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "item");
  if (flow_tensor_numel(t) != 1) {
    char s[128];
    return luaL_error(L, "item: the tensor has %I elements (shape %s); item needs exactly one",
                      (LUAI_UACINT)flow_tensor_numel(t), flow_shape_str(t->ndim, t->shape, s, sizeof s));
  }
  flow_tensor *h = host_copy(L, t);
  push_value(L, h->dtype, flow_tensor_data(h));
  flow_tensor_decref(h);
  return 1;
}

static void build_table(lua_State *L, const flow_tensor *t, int d, const char *p) {
  size_t es = flow_dtype_size(t->dtype);
  lua_createtable(L, (int)t->shape[d], 0);
  for (int64_t i = 0; i < t->shape[d]; i++) {
    const char *q = p + i * t->stride[d] * (int64_t)es;
    if (d == t->ndim - 1) push_value(L, t->dtype, q);
    else build_table(L, t, d + 1, q);
    lua_rawseti(L, -2, i + 1);
  }
}

static int t_totable(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "totable");
  flow_tensor *h = host_copy(L, t);
  luaL_checkstack(L, h->ndim + 4, "totable");
  if (h->ndim == 0) push_value(L, h->dtype, flow_tensor_data(h));
  else build_table(L, h, 0, flow_tensor_data(h));
  flow_tensor_decref(h);
  return 1;
}

static int push_list(lua_State *L, int n, const int64_t *v) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* Logical shape: the global layer stores it in the table returned by flow._global_shape. */
static int t_shape(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "shape");
  if (t->global) {
    lua_getfield(L, LUA_REGISTRYINDEX, "flow.global_shape");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    return 1;
  }
  return push_list(L, t->ndim, t->shape);
}

/* t.shape: the shape as a list that is also callable, so t.shape[1], #t.shape and t:shape() (a
 * fresh plain list, as before) all work; it prints as {2, 3}. */
#define SHAPE_MT "flow.Shape"

static int shape_call(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = luaL_len(L, 1);
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, 1, i);
    lua_rawseti(L, -2, i);
  }
  return 1;
}

static int shape_tostring(lua_State *L) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '{');
  for (lua_Integer i = 1, n = luaL_len(L, 1); i <= n; i++) {
    lua_geti(L, 1, i);
    if (i > 1) luaL_addstring(&b, ", ");
    luaL_addvalue(&b);
  }
  luaL_addchar(&b, '}');
  luaL_pushresult(&b);
  return 1;
}

static int push_shape_field(lua_State *L) {
  lua_settop(L, 1);
  t_shape(L);
  if (luaL_newmetatable(L, SHAPE_MT)) {
    lua_pushcfunction(L, shape_call);
    lua_setfield(L, -2, "__call");
    lua_pushcfunction(L, shape_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_setmetatable(L, -2);
  return 1;
}

static int t_size(lua_State *L) {
  flow_lua_check(L, 1, "size");
  if (lua_isnoneornil(L, 2)) return t_shape(L);
  lua_settop(L, 2);
  t_shape(L);
  int64_t ax;
  lua_Integer n = luaL_len(L, -1);
  if (flow_axis_norm("size", luaL_checkinteger(L, 2), (int)n, &ax) != 0) return flow_lua_error(L);
  lua_geti(L, -1, ax + 1);
  return 1;
}

static int t_stride(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "stride");
  return push_list(L, t->ndim, t->stride);
}

static int t_dim(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "dim");
  if (t->global) { t_shape(L); lua_pushinteger(L, luaL_len(L, -1)); return 1; }
  lua_pushinteger(L, t->ndim);
  return 1;
}

static int t_numel(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "numel");
  if (t->global) {
    t_shape(L);
    lua_Integer n = 1, k = luaL_len(L, -1);
    for (lua_Integer i = 1; i <= k; i++) { lua_geti(L, -1, i); n *= lua_tointeger(L, -1); lua_pop(L, 1); }
    lua_pushinteger(L, n);
    return 1;
  }
  lua_pushinteger(L, flow_tensor_numel(t));
  return 1;
}

static int t_is_contiguous(lua_State *L) {
  lua_pushboolean(L, flow_tensor_is_contiguous(flow_lua_check(L, 1, "is_contiguous")));
  return 1;
}

static int t_storage_offset(lua_State *L) {
  lua_pushinteger(L, flow_lua_check(L, 1, "storage_offset")->offset);
  return 1;
}

static int t_data_ptr(lua_State *L) {
  lua_pushlightuserdata(L, flow_tensor_data(flow_lua_check(L, 1, "data_ptr")));
  return 1;
}

static int t_contiguous(lua_State *L) {
  return flow_lua_push(L, flow_contiguous(flow_lua_check(L, 1, "contiguous")));
}

static int t_clone(lua_State *L) {
  return flow_lua_push(L, flow_contiguous_copy(flow_lua_check(L, 1, "clone")));
}

static int t_detach(lua_State *L) {
  return flow_lua_push(L, flow_tensor_alias(flow_lua_check(L, 1, "detach")));
}

static int t_requires_grad_(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "requires_grad_");
  int on = lua_isnoneornil(L, 2) ? 1 : lua_toboolean(L, 2);
  if (t->grad_fn && !on) return luaL_error(L, "requires_grad_: only leaf tensors can stop requiring grad (use detach)");
  if (on && !flow_dtype_is_float(t->dtype))
    return luaL_error(L, "requires_grad_: only floating-point tensors can require grad (got %s)", flow_dtype_name(t->dtype));
  t->requires_grad = on;
  lua_settop(L, 1);
  return 1;
}

static int t_backward(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "backward");
  flow_tensor *g = lua_isnoneornil(L, 2) ? NULL : flow_lua_check(L, 2, "backward");
  int retain = lua_istable(L, 3) ? flow_lua_opt_bool(L, 3, "retain_graph", 0) : lua_toboolean(L, 3);
  if (flow_backward(t, g, retain) != 0) return flow_lua_error(L);
  return 0;
}

static int t_index(lua_State *L) {
  flow_lua_box *b = box(L);
  const char *k = lua_tostring(L, 2);
  if (k && b->t) {
    flow_tensor *t = b->t;
    if (strcmp(k, "dtype") == 0) { lua_pushstring(L, flow_dtype_name(t->dtype)); return 1; }
    if (strcmp(k, "device") == 0) {
      char buf[32];
      flow_device_name(t->device, buf, sizeof buf);
      lua_pushstring(L, buf);
      return 1;
    }
    if (strcmp(k, "requires_grad") == 0) { lua_pushboolean(L, t->requires_grad); return 1; }
    if (strcmp(k, "is_leaf") == 0) { lua_pushboolean(L, t->grad_fn == NULL); return 1; }
    if (strcmp(k, "grad") == 0) {
      if (!t->grad) { lua_pushnil(L); return 1; }
      flow_tensor_incref(t->grad);
      return flow_lua_push(L, t->grad);
    }
    if (strcmp(k, "is_global") == 0) { lua_pushboolean(L, t->global != NULL); return 1; }
    if (strcmp(k, "ndim") == 0) { lua_settop(L, 1); return t_dim(L); }
    if (strcmp(k, "shape") == 0) return push_shape_field(L);
  }
  flow_lua_push_methods(L);
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  if (lua_isnil(L, -1) && k && (strcmp(k, "placement") == 0 || strcmp(k, "sbp") == 0)) {
    lua_getfield(L, LUA_REGISTRYINDEX, "flow.global_field");
    if (!lua_isnil(L, -1)) {
      lua_pushvalue(L, 1);
      lua_pushvalue(L, 2);
      lua_call(L, 2, 1);
    }
  }
  return 1;
}

static int t_newindex(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "__newindex");
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "requires_grad") == 0) {
    lua_settop(L, 3);
    lua_remove(L, 2);
    return t_requires_grad_(L);
  }
  if (strcmp(k, "grad") == 0) {
    flow_tensor *g = lua_isnil(L, 3) ? NULL : flow_lua_check(L, 3, "grad");
    if (g && !flow_shape_eq(flow_tensor_lndim(g), flow_tensor_lshape(g), flow_tensor_lndim(t), flow_tensor_lshape(t))) {
      char a[128], b[128];
      return luaL_error(L, "grad: a gradient of shape %s for a tensor of shape %s",
                        flow_shape_str(flow_tensor_lndim(g), flow_tensor_lshape(g), a, sizeof a),
                        flow_shape_str(flow_tensor_lndim(t), flow_tensor_lshape(t), b, sizeof b));
    }
    if (g) flow_tensor_incref(g);
    flow_tensor_decref(t->grad);
    t->grad = g;
    return 0;
  }
  return luaL_error(L, "tensor field '%s' cannot be set (settable: requires_grad, grad)", k);
}

static int t_tostring(lua_State *L) {
  flow_lua_box *b = box(L);
  if (!b->t) { lua_pushstring(L, "tensor(freed)"); return 1; }
  char s[128];
  if (b->t->lazy) {
    lua_pushfstring(L, "tensor(lazy, shape=%s, dtype=%s)", flow_shape_str(b->t->ndim, b->t->shape, s, sizeof s),
                    flow_dtype_name(b->t->dtype));
    return 1;
  }
  lua_getfield(L, LUA_REGISTRYINDEX, "flow.tostring");
  if (!lua_isnil(L, -1)) {
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    return 1;
  }
  lua_pushfstring(L, "tensor(shape=%s, dtype=%s)", flow_shape_str(b->t->ndim, b->t->shape, s, sizeof s),
                  flow_dtype_name(b->t->dtype));
  return 1;
}

static int t_len(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "#");
  if (t->ndim == 0) return luaL_error(L, "#: a 0-d tensor has no length");
  lua_pushinteger(L, t->shape[0]);
  return 1;
}

static int f_is_tensor(lua_State *L) {
  lua_pushboolean(L, luaL_testudata(L, 1, FLOW_TENSOR_MT) != NULL);
  return 1;
}

/* flow.is_lazy(t): t is a value of a graph being traced (no data yet). */
static int f_is_lazy(lua_State *L) {
  flow_tensor *t = flow_lua_test(L, 1);
  lua_pushboolean(L, t && t->lazy);
  return 1;
}

void flow_lua_open_tensor(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"free", t_free}, {"item", t_item}, {"totable", t_totable}, {"shape", t_shape}, {"size", t_size},
    {"stride", t_stride}, {"dim", t_dim}, {"numel", t_numel}, {"is_contiguous", t_is_contiguous},
    {"storage_offset", t_storage_offset}, {"data_ptr", t_data_ptr}, {"contiguous", t_contiguous},
    {"clone", t_clone}, {"detach", t_detach}, {"requires_grad_", t_requires_grad_}, {"backward", t_backward},
    {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"is_tensor", f_is_tensor}, {"is_lazy", f_is_lazy}, {NULL, NULL}};
  flow_lua_register(L, funcs, methods);
  luaL_getmetatable(L, FLOW_TENSOR_MT);
  static const luaL_Reg meta[] = {{"__gc", t_gc}, {"__close", t_free}, {"__index", t_index},
                                  {"__newindex", t_newindex}, {"__tostring", t_tostring},
                                  {"__len", t_len}, {NULL, NULL}};
  luaL_setfuncs(L, meta, 0);
  lua_pushstring(L, "flow.Tensor");
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
}
