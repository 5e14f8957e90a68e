/* Shared binding helpers (see bind.h). */
#include "bind.h"

#include <string.h>

#include "../ops/elementwise.h"

static char methods_key, module_key, mt_key;


/* ---- argument checks that name the op (bind.h) ---------------------------------------------------- */

/* The string key of the table at t whose value is the value at v, pushed; 0 if none. */
static int key_of(lua_State *L, int t, int v) {
  lua_pushnil(L);
  while (lua_next(L, t)) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_rawequal(L, -1, v)) {
      lua_pop(L, 1);
      return 1;
    }
    lua_pop(L, 1);
  }
  return 0;
}

const char *flow_lua_fn_name(lua_State *L) {
  lua_Debug ar;
  if (!lua_getstack(L, 0, &ar)) return "?";
  luaL_checkstack(L, 4, NULL);
  lua_getinfo(L, "nf", &ar);
  int f = lua_gettop(L);
  const void *keys[] = {&methods_key, &module_key};
  for (int i = 0; i < 2; i++) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, keys[i]);
    if (lua_istable(L, -1) && key_of(L, lua_gettop(L), f)) {
      const char *name = lua_tostring(L, -1);
      lua_remove(L, -2); /* the table; the name stays on the stack, under the function */
      return name;
    }
    lua_pop(L, 1);
  }
  return ar.name ? ar.name : "?";
}

int flow_lua_argerror(lua_State *L, int arg, const char *extramsg) {
  lua_Debug ar;
  if (lua_getstack(L, 0, &ar)) {
    lua_getinfo(L, "n", &ar);
    if (ar.namewhat && strcmp(ar.namewhat, "method") == 0 && --arg == 0)
      return luaL_error(L, "%s: bad self (%s)", flow_lua_fn_name(L), extramsg);
  }
  return luaL_error(L, "%s: bad argument #%d (%s)", flow_lua_fn_name(L), arg, extramsg);
}

int flow_lua_typeerror(lua_State *L, int arg, const char *tname) {
  const char *got;
  if (luaL_getmetafield(L, arg, "__name") == LUA_TSTRING) got = lua_tostring(L, -1);
  else if (lua_type(L, arg) == LUA_TLIGHTUSERDATA) got = "light userdata";
  else got = luaL_typename(L, arg);
  return flow_lua_argerror(L, arg, lua_pushfstring(L, "%s expected, got %s", tname, got));
}

lua_Integer flow_lua_checkinteger(lua_State *L, int arg) {
  int ok;
  lua_Integer v = lua_tointegerx(L, arg, &ok);
  if (!ok) {
    if (lua_isnumber(L, arg)) flow_lua_argerror(L, arg, "number has no integer representation");
    else flow_lua_typeerror(L, arg, "number");
  }
  return v;
}

lua_Integer flow_lua_optinteger(lua_State *L, int arg, lua_Integer def) {
  return lua_isnoneornil(L, arg) ? def : flow_lua_checkinteger(L, arg);
}

lua_Number flow_lua_checknumber(lua_State *L, int arg) {
  int ok;
  lua_Number v = lua_tonumberx(L, arg, &ok);
  if (!ok) flow_lua_typeerror(L, arg, "number");
  return v;
}

lua_Number flow_lua_optnumber(lua_State *L, int arg, lua_Number def) {
  return lua_isnoneornil(L, arg) ? def : flow_lua_checknumber(L, arg);
}

const char *flow_lua_checklstring(lua_State *L, int arg, size_t *len) {
  const char *s = lua_tolstring(L, arg, len);
  if (!s) flow_lua_typeerror(L, arg, "string");
  return s;
}

const char *flow_lua_optlstring(lua_State *L, int arg, const char *def, size_t *len) {
  if (!lua_isnoneornil(L, arg)) return flow_lua_checklstring(L, arg, len);
  if (len) *len = def ? strlen(def) : 0;
  return def;
}

void flow_lua_checktype(lua_State *L, int arg, int t) {
  if (lua_type(L, arg) != t) flow_lua_typeerror(L, arg, lua_typename(L, t));
}

void flow_lua_checkany(lua_State *L, int arg) {
  if (lua_type(L, arg) == LUA_TNONE) flow_lua_argerror(L, arg, "value expected");
}

int flow_lua_checkoption(lua_State *L, int arg, const char *def, const char *const lst[]) {
  const char *name = def ? flow_lua_optlstring(L, arg, def, NULL) : flow_lua_checklstring(L, arg, NULL);
  for (int i = 0; lst[i]; i++)
    if (strcmp(lst[i], name) == 0) return i;
  return flow_lua_argerror(L, arg, lua_pushfstring(L, "invalid option '%s'", name));
}

void *flow_lua_checkudata(lua_State *L, int arg, const char *tname) {
  void *p = luaL_testudata(L, arg, tname);
  if (!p) flow_lua_typeerror(L, arg, tname);
  return p;
}

/* luaL_testudata, but comparing with the metatable kept under a pointer key: no string lookup
 * on the hot path of every op. */
static flow_lua_box *test_box(lua_State *L, int idx) {
  flow_lua_box *b = lua_touserdata(L, idx);
  if (!b || !lua_getmetatable(L, idx)) return NULL;
  int same = lua_topointer(L, -1) == *(const void **)lua_getextraspace(L);
  lua_pop(L, 1);
  return same ? b : NULL;
}

flow_lua_box *flow_lua_box_of(lua_State *L, int idx) { return test_box(L, idx); }

flow_tensor *flow_lua_test(lua_State *L, int idx) {
  flow_lua_box *b = test_box(L, idx);
  return b ? b->t : NULL;
}

flow_tensor *flow_lua_check(lua_State *L, int idx, const char *fn) {
  flow_lua_box *b = test_box(L, idx);
  if (!b) {
    luaL_error(L, "%s: argument %d must be a tensor (got %s)", fn, idx, luaL_typename(L, idx));
    return NULL;
  }
  if (!b->t) luaL_error(L, "%s: argument %d is a freed tensor", fn, idx);
  return b->t;
}

int flow_lua_error(lua_State *L) {
  lua_pushstring(L, flow_error_get());
  return lua_error(L);
}

flow_tensor *flow_lua_to_tensor(lua_State *L, int idx, const flow_tensor *like, const char *fn) {
  int ty = lua_type(L, idx);
  if (ty == LUA_TNUMBER || ty == LUA_TBOOLEAN) {
    double v = ty == LUA_TBOOLEAN ? lua_toboolean(L, idx) : lua_tonumber(L, idx);
    flow_dtype dt = like ? like->dtype : (lua_isinteger(L, idx) ? FLOW_I64 : FLOW_F32);
    if (like && flow_dtype_is_int(dt) && ty == LUA_TNUMBER && !lua_isinteger(L, idx) && v != (double)(int64_t)v)
      dt = FLOW_F32; /* 1.5 with an int tensor: let the op report the dtype mismatch */
    flow_tensor *t = flow_scalar_tensor(v, dt, like ? like->device : FLOW_DEVICE_CPU);
    if (!t) flow_lua_error(L);
    return t;
  }
  flow_tensor *t = flow_lua_check(L, idx, fn);
  flow_tensor_incref(t);
  return t;
}

/* Lua's GC sees only the small userdata box of a tensor, never its memory, and the generational
 * collector left large dead tensors unfinalised (a loop of 16 MB adds kept allocating). So watch
 * the bytes the tensor allocator holds (every device, whoever allocated them: an op's output, a
 * gradient that backward made, a tensor autograd saved) each time a tensor reaches Lua, and run a
 * full collection once they have grown from their lowest since the last one by that low again (at
 * least GC_FLOOR, at most GC_CEIL). Dead tensors then return to the caching allocator within about
 * one live set of allocation, and a loop's peak stays near twice its live set; the low follows
 * frees (a collectgarbage() of the script's, refcounts), so a smaller loop after a large one
 * collects as often as it needs. Counting only the tensors pushed with storage of their own missed
 * outputs that autograd also holds and the gradients backward makes in C:
 * `a = x:detach():requires_grad_(true); sigmoid(a):backward(g)` on 4 MB grew by 8 MB an iteration.
 * A collector stopped by collectgarbage("stop") stays stopped; each thread (a rank of
 * `flowlua --ranks`) keeps its own low. */
#define GC_FLOOR ((size_t)8 << 20)
#define GC_CEIL ((size_t)1 << 30)
static _Thread_local size_t gc_low = SIZE_MAX;

static size_t tensor_bytes(void) {
  int64_t in_use, peak;
  flow_mem_stats_total(&in_use, &peak);
  return in_use > 0 ? (size_t)in_use : 0;
}

void flow_lua_account(lua_State *L) {
  size_t now = tensor_bytes();
  if (now < gc_low) gc_low = now;
  size_t budget = gc_low < GC_FLOOR ? GC_FLOOR : gc_low > GC_CEIL ? GC_CEIL : gc_low;
  if (now - gc_low < budget || !lua_gc(L, LUA_GCISRUNNING)) return;
  lua_gc(L, LUA_GCCOLLECT);
  gc_low = tensor_bytes();
}

int flow_lua_push(lua_State *L, flow_tensor *t) {
  if (!t) return flow_lua_error(L);
  flow_lua_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->t = t;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &mt_key);
  lua_setmetatable(L, -2);
  flow_lua_account(L);
  return 1;
}

int flow_lua_len(lua_State *L, int idx, lua_Integer max, const char *fn) {
  lua_Integer n = luaL_len(L, idx);
  if (n < 0 || n > max)
    return luaL_error(L, "%s: a list of %I elements (expected 0..%I)", fn, (LUAI_UACINT)n, (LUAI_UACINT)max);
  return (int)n;
}

int flow_lua_shape(lua_State *L, int idx, int64_t *shape, const char *fn) {
  int n = 0;
  if (lua_istable(L, idx)) {
    n = flow_lua_len(L, idx, FLOW_MAX_DIMS, fn);
    for (int i = 0; i < n; i++) {
      lua_geti(L, idx, i + 1);
      int ok;
      lua_Integer v = lua_tointegerx(L, -1, &ok);
      if (!ok) return luaL_error(L, "%s: shape entry %d must be an integer (got %s)", fn, i + 1, luaL_typename(L, -1));
      shape[i] = v;
      lua_pop(L, 1);
    }
    return n;
  }
  int top = lua_gettop(L);
  for (int i = idx; i <= top && lua_type(L, i) == LUA_TNUMBER; i++) {
    if (n == FLOW_MAX_DIMS) return luaL_error(L, "%s: at most %d dimensions", fn, FLOW_MAX_DIMS);
    int ok;
    shape[n++] = lua_tointegerx(L, i, &ok);
    if (!ok) return luaL_error(L, "%s: size %d must be an integer", fn, n);
  }
  return n;
}

int flow_lua_axes(lua_State *L, int idx, int64_t *axes, const char *fn) {
  if (lua_isnoneornil(L, idx)) return 0;
  if (lua_type(L, idx) == LUA_TNUMBER) {
    int ok;
    axes[0] = lua_tointegerx(L, idx, &ok);
    if (!ok) return luaL_error(L, "%s: axis must be an integer", fn);
    return 1;
  }
  if (!lua_istable(L, idx)) return luaL_error(L, "%s: axes must be an integer or a list (got %s)", fn, luaL_typename(L, idx));
  return flow_lua_shape(L, idx, axes, fn);
}

flow_dtype flow_lua_check_dtype(lua_State *L, int idx) {
  const char *s = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
  flow_dtype d;
  if (!s) luaL_error(L, "%s: a dtype is a string such as \"float32\" (got %s)", flow_lua_fn_name(L), luaL_typename(L, idx));
  if (flow_dtype_parse(s, &d) != 0)
    luaL_error(L, "%s: unknown dtype '%s' (expected float32, float64, float16, bfloat16, int64, int32, uint8 or bool)",
               flow_lua_fn_name(L), s);
  return d;
}

flow_dtype flow_lua_opt_dtype(lua_State *L, int idx, flow_dtype def) {
  if (!lua_istable(L, idx)) return def;
  lua_getfield(L, idx, "dtype");
  flow_dtype d = lua_isnil(L, -1) ? def : flow_lua_check_dtype(L, -1);
  lua_pop(L, 1);
  return d;
}

flow_device flow_lua_opt_device(lua_State *L, int idx, flow_device def) {
  if (!lua_istable(L, idx)) return def;
  lua_getfield(L, idx, "device");
  flow_device d = def;
  if (!lua_isnil(L, -1) && flow_device_parse(luaL_checkstring(L, -1), &d) != 0)
    luaL_error(L, "%s: %s", flow_lua_fn_name(L), flow_error_get());
  lua_pop(L, 1);
  return d;
}

double flow_lua_opt_number(lua_State *L, int idx, const char *key, double def) {
  if (!lua_istable(L, idx)) return def;
  lua_getfield(L, idx, key);
  double v = lua_isnil(L, -1) ? def : luaL_checknumber(L, -1);
  lua_pop(L, 1);
  return v;
}

int flow_lua_opt_bool(lua_State *L, int idx, const char *key, int def) {
  if (!lua_istable(L, idx)) return def;
  lua_getfield(L, idx, key);
  int v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

void flow_lua_check_opts(lua_State *L, int idx, const char *fn, const char *const *keys) {
  if (lua_isnoneornil(L, idx)) return;
  if (!lua_istable(L, idx)) luaL_error(L, "%s: options must be a table (got %s)", fn, luaL_typename(L, idx));
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    int i = 0;
    while (k && keys[i] && strcmp(k, keys[i]) != 0) i++;
    if (!k || !keys[i]) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (int j = 0; keys[j]; j++) {
        if (j) luaL_addstring(&b, ", ");
        luaL_addstring(&b, keys[j]);
      }
      luaL_pushresult(&b);
      luaL_error(L, "%s: unknown option '%s' (expected %s)", fn, k ? k : luaL_tolstring(L, -2, NULL),
                 keys[0] ? lua_tostring(L, -1) : "no options");
    }
  }
}

/* flow._check_opts(fn, opts, {keys...}): the same check for options read in Lua. */
static int l_check_opts(lua_State *L) {
  const char *fn = luaL_checkstring(L, 1);
  luaL_checktype(L, 3, LUA_TTABLE);
  const char *keys[64];
  int n = (int)luaL_len(L, 3);
  if (n > 63) return luaL_error(L, "_check_opts: at most 63 keys");
  for (int i = 0; i < n; i++) {
    lua_geti(L, 3, i + 1);
    keys[i] = luaL_checkstring(L, -1); /* the strings stay alive in the keys table */
    lua_pop(L, 1);
  }
  keys[n] = NULL;
  flow_lua_check_opts(L, 2, fn, keys);
  return 0;
}

int flow_lua_call(lua_State *L, const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a) {
  flow_tensor *out[8];
  if (flow_op_call(op, in, nin, a, out) != 0) return flow_lua_error(L);
  for (int j = 0; j < op->nout; j++) flow_lua_push(L, out[j]);
  return op->nout;
}

void flow_lua_register(lua_State *L, const luaL_Reg *funcs, const luaL_Reg *methods) {
  if (funcs) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &module_key);
    luaL_setfuncs(L, funcs, 0);
    lua_pop(L, 1);
  }
  if (methods) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &methods_key);
    luaL_setfuncs(L, methods, 0);
    lua_pop(L, 1);
  }
}

/* Called first by luaopen_flow with the module table on top: sets up the registry slots. */
void flow_lua_init_tables(lua_State *L) {
  lua_pushcfunction(L, l_check_opts);
  lua_setfield(L, -2, "_check_opts");
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &module_key);
  lua_newtable(L); /* methods */
  luaL_newmetatable(L, FLOW_TENSOR_MT);
  /* the metatable's address, in the state's extra space (shared by its coroutines), makes the
   * tensor type check two API calls */
  *(const void **)lua_getextraspace(L) = lua_topointer(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &mt_key);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &methods_key);
}

/* The methods table (for __index). */
void flow_lua_push_methods(lua_State *L) { lua_rawgetp(L, LUA_REGISTRYINDEX, &methods_key); }
