/* Lua bindings: tensor creation (tensor from nested tables, zeros/ones/full, arange, linspace,
 * eye), the random generator (rand, randn, randint, manual_seed, dropout), flow.now, and the
 * hook that turns tensors into text (lua/flow/print.lua). */
#include <string.h>
#include <time.h>

#include "../ops/autograd.h"
#include "../ops/create.h"
#include "../ops/elementwise.h"
#include "bind.h"

/* Walk the first element at each depth to find the shape; classify values for dtype inference. */
static int table_shape(lua_State *L, int idx, int64_t *shape) {
  int nd = 0;
  lua_pushvalue(L, idx);
  while (lua_istable(L, -1)) {
    if (nd == FLOW_MAX_DIMS) return luaL_error(L, "tensor: nesting deeper than %d levels", FLOW_MAX_DIMS);
    shape[nd++] = flow_lua_len(L, -1, INT_MAX, "tensor");
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
    luaL_error(L, "tensor: bad nesting at %s: expected a list of %I elements (got %s)", path,
               (LUAI_UACINT)shape[d], lua_istable(L, idx) ? "a list of another length" : luaL_typename(L, idx));
  size_t plen = strlen(path);
  for (int64_t i = 0; i < shape[d]; i++) {
    lua_geti(L, idx, i + 1);
    snprintf(path + plen, 24, "[%lld]", (long long)i + 1);
    fill(L, lua_gettop(L), shape, nd, d + 1, st, path);
    lua_pop(L, 1);
  }
  path[plen] = 0;
}

/* What creation functions accept in their options table. */
static const char *const create_keys[] = {"dtype", "device", "requires_grad", "placement", "sbp", NULL};

static int l_tensor(lua_State *L) {
  if (lua_istable(L, 2)) flow_lua_check_opts(L, 2, "tensor", create_keys);
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

/* Global creation: opts has a placement, so the global layer makes the tensor. It is called as
 *   registry["flow.global_create"](opname, shape, value, opts)
 * with shape the logical shape (a list) and value what the op needs besides it:
 *   "full"      the fill value (a number; zeros and ones are full with 0 and 1)
 *   "arange"    {start =, step =, dtype =}         "linspace"  {start =, stop =, dtype =}
 *   "eye"       {dtype =}                          "rand", "randn"  {seed =, offset =, dtype =}
 *   "randint"   {low =, high =, seed =, offset =, dtype =}
 * where dtype is the resolved dtype name (opts.dtype or the op's default). For random ops (seed,
 * offset) were reserved here for the whole logical tensor, identically on every rank. Each rank
 * then makes its shard with flow_create_shard (ops/create.h) or, from Lua,
 *   flow._create_shard(opname, shape, value, box_start, box_shape, opts)
 * which fills it with exactly its slice of the logical tensor. */
static int global_create(lua_State *L, const char *op, int nd, const int64_t *shape, int value, int opts,
                         flow_dtype dtype) {
  if (lua_istable(L, value)) {
    lua_pushstring(L, flow_dtype_name(dtype));
    lua_setfield(L, value, "dtype");
  }
  lua_getfield(L, LUA_REGISTRYINDEX, "flow.global_create");
  if (lua_isnil(L, -1)) return luaL_error(L, "%s: global tensors are not available in this build", op);
  lua_pushstring(L, op);
  lua_createtable(L, nd, 0);
  for (int i = 0; i < nd; i++) { lua_pushinteger(L, shape[i]); lua_rawseti(L, -2, i + 1); }
  lua_pushvalue(L, value);
  lua_pushvalue(L, opts);
  lua_call(L, 4, 1);
  return 1;
}

static int has_placement(lua_State *L, int opts) {
  if (!opts) return 0;
  lua_getfield(L, opts, "placement");
  int global = !lua_isnil(L, -1);
  lua_pop(L, 1);
  return global;
}

/* opts.dtype / opts.device, where opts is a stack index or 0 (no options table). */
static flow_dtype opt_dtype(lua_State *L, int opts, flow_dtype def) {
  return opts ? flow_lua_opt_dtype(L, opts, def) : def;
}

static flow_device opt_device(lua_State *L, int opts) {
  return opts ? flow_lua_opt_device(L, opts, FLOW_DEVICE_CPU) : FLOW_DEVICE_CPU;
}

/* Push t with opts.requires_grad applied (float tensors only). */
static int push_created(lua_State *L, flow_tensor *t, int opts) {
  if (t && opts) t->requires_grad = flow_lua_opt_bool(L, opts, "requires_grad", 0) && flow_dtype_is_float(t->dtype);
  return flow_lua_push(L, t);
}

/* A shape given as a list or as integers from shape_idx, then an optional opts table. Returns
 * the opts index (0 if none). */
static int shape_and_opts(lua_State *L, int shape_idx, int64_t *shape, int *nd, const char *fn) {
  int ty = lua_type(L, shape_idx);
  if (ty != LUA_TTABLE && ty != LUA_TNUMBER && ty != LUA_TNONE)
    return luaL_error(L, "%s: the shape must be a list or integers (got %s)", fn, luaL_typename(L, shape_idx));
  *nd = flow_lua_shape(L, shape_idx, shape, fn);
  int top = lua_gettop(L), opts = lua_istable(L, top) && top > shape_idx ? top : 0;
  if (opts && lua_istable(L, shape_idx) && opts == shape_idx) opts = 0;
  if (opts) flow_lua_check_opts(L, opts, fn, create_keys);
  if (!opts && top > shape_idx && !lua_istable(L, shape_idx) && !lua_isnil(L, top) && lua_type(L, top) != LUA_TNUMBER)
    return luaL_error(L, "%s: options must be a table (got %s)", fn, luaL_typename(L, top));
  return opts;
}

/* Push a tensor made by the full op for the Lua function fn: zeros, ones and the *_like forms
 * are full underneath, so an error names fn in place of full. */
static int push_full(lua_State *L, flow_tensor *t, int opts, const char *fn) {
  if (!t) {
    const char *msg = flow_error_get();
    return luaL_error(L, "%s: %s", fn, strncmp(msg, "full: ", 6) == 0 ? msg + 6 : msg);
  }
  return push_created(L, t, opts);
}

/* zeros/ones/full(shape..., [value], [opts]) */
static int create(lua_State *L, double v, int shape_idx, const char *fn) {
  int64_t shape[FLOW_MAX_DIMS];
  int nd, opts = shape_and_opts(L, shape_idx, shape, &nd, fn);
  flow_dtype dt = opt_dtype(L, opts, FLOW_F32);
  flow_device dev = opt_device(L, opts);
  if (has_placement(L, opts)) {
    lua_pushnumber(L, v);
    return global_create(L, "full", nd, shape, lua_gettop(L), opts, dt);
  }
  return push_full(L, flow_full(nd, shape, v, dt, dev), opts, fn);
}

static int l_zeros(lua_State *L) { return create(L, 0, 1, "zeros"); }
static int l_ones(lua_State *L) { return create(L, 1, 1, "ones"); }

static int l_full(lua_State *L) {
  /* full(shape, value, opts) with shape a table */
  luaL_checktype(L, 1, LUA_TTABLE);
  double v = luaL_checknumber(L, 2);
  lua_remove(L, 2);
  return create(L, v, 1, "full");
}

/* ---- arange, linspace, eye ---------------------------------------------------------------- */

/* arange(stop) / arange(start, stop, [step]) with an optional opts table last. int64 when every
 * bound is an integer, else float32; opts.dtype overrides. */
static int l_arange(lua_State *L) {
  int n = 0, all_int = 1;
  double v[3];
  while (n < 3 && lua_type(L, n + 1) == LUA_TNUMBER) {
    all_int &= lua_isinteger(L, n + 1);
    v[n] = lua_tonumber(L, n + 1);
    n++;
  }
  if (n == 0) return luaL_error(L, "arange: expected arange(stop) or arange(start, stop, [step]) (got %s)", luaL_typename(L, 1));
  int opts = lua_istable(L, n + 1) ? n + 1 : 0;
  if (!opts && !lua_isnoneornil(L, n + 1))
    return luaL_error(L, "arange: argument %d must be a number or an options table (got %s)", n + 1, luaL_typename(L, n + 1));
  double start = n == 1 ? 0 : v[0], stop = n == 1 ? v[0] : v[1], step = n == 3 ? v[2] : 1;
  if (opts) flow_lua_check_opts(L, opts, "arange", create_keys);
  flow_dtype dt = opt_dtype(L, opts, all_int ? FLOW_I64 : FLOW_F32);
  flow_device dev = opt_device(L, opts);
  if (has_placement(L, opts)) {
    int64_t len;
    if (flow_arange_length(start, stop, step, &len) != 0) return flow_lua_error(L);
    lua_createtable(L, 0, 2);
    lua_pushnumber(L, start); lua_setfield(L, -2, "start");
    lua_pushnumber(L, step); lua_setfield(L, -2, "step");
    return global_create(L, "arange", 1, &len, lua_gettop(L), opts, dt);
  }
  return push_created(L, flow_arange(start, stop, step, dt, dev), opts);
}

static int l_linspace(lua_State *L) {
  double a = luaL_checknumber(L, 1), b = luaL_checknumber(L, 2);
  lua_Integer n = luaL_checkinteger(L, 3);
  int opts = lua_istable(L, 4) ? 4 : 0;
  if (opts) flow_lua_check_opts(L, opts, "linspace", create_keys);
  flow_dtype dt = opt_dtype(L, opts, FLOW_F32);
  flow_device dev = opt_device(L, opts);
  if (has_placement(L, opts)) {
    if (n < 0) return luaL_error(L, "linspace: the number of points must be >= 0 (got %I)", n);
    int64_t len = n;
    lua_createtable(L, 0, 2);
    lua_pushnumber(L, a); lua_setfield(L, -2, "start");
    lua_pushnumber(L, b); lua_setfield(L, -2, "stop");
    return global_create(L, "linspace", 1, &len, lua_gettop(L), opts, dt);
  }
  return push_created(L, flow_linspace(a, b, n, dt, dev), opts);
}

/* eye(n, [m], [opts]): n x m (m defaults to n) with ones on the diagonal. */
static int l_eye(lua_State *L) {
  int isint;
  lua_Integer n = lua_tointegerx(L, 1, &isint);
  if (!isint) return luaL_error(L, "eye: n must be an integer (got %s)", luaL_typename(L, 1));
  /* eye(n), eye(n, m), eye(n, opts), eye(n, m, opts) and eye(n, nil, opts) */
  int has_m = lua_type(L, 2) == LUA_TNUMBER;
  if (!has_m && !lua_isnoneornil(L, 2) && !lua_istable(L, 2))
    return luaL_error(L, "eye: m must be an integer (got %s)", luaL_typename(L, 2));
  int ok = 1;
  lua_Integer m = has_m ? lua_tointegerx(L, 2, &ok) : n;
  if (!ok) return luaL_error(L, "eye: m must be an integer (got %s)", lua_tostring(L, 2));
  int opts = lua_istable(L, 2) ? 2 : lua_istable(L, 3) ? 3 : 0;
  if (opts) flow_lua_check_opts(L, opts, "eye", create_keys);
  flow_dtype dt = opt_dtype(L, opts, FLOW_F32);
  flow_device dev = opt_device(L, opts);
  if (has_placement(L, opts)) {
    int64_t shape[2] = {n, m};
    lua_newtable(L);
    return global_create(L, "eye", 2, shape, lua_gettop(L), opts, dt);
  }
  return push_created(L, flow_eye(n, m, dt, dev), opts);
}

/* ---- random ------------------------------------------------------------------------------- */

/* Reserve the generator range for a global tensor and push {seed =, offset =}. */
static void push_reserved(lua_State *L, int nd, const int64_t *shape) {
  int64_t n = flow_shape_numel(nd, shape);
  flow_rng_state s = flow_rng_reserve(n > 0 ? (uint64_t)n : 0);
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)s.seed); lua_setfield(L, -2, "seed");
  lua_pushinteger(L, (lua_Integer)s.offset); lua_setfield(L, -2, "offset");
}

/* rand/randn(shape..., [opts]) */
static int random_float(lua_State *L, const char *fn,
                        flow_tensor *(*make)(int, const int64_t *, flow_dtype, flow_device)) {
  int64_t shape[FLOW_MAX_DIMS];
  int nd, opts = shape_and_opts(L, 1, shape, &nd, fn);
  flow_dtype dt = opt_dtype(L, opts, FLOW_F32);
  flow_device dev = opt_device(L, opts);
  if (has_placement(L, opts)) {
    push_reserved(L, nd, shape);
    return global_create(L, fn, nd, shape, lua_gettop(L), opts, dt);
  }
  return push_created(L, make(nd, shape, dt, dev), opts);
}

static int l_rand(lua_State *L) { return random_float(L, "rand", flow_rand); }
static int l_randn(lua_State *L) { return random_float(L, "randn", flow_randn); }

/* randint(low, high, shape, [opts]): int64 uniform in [low, high). */
static int l_randint(lua_State *L) {
  lua_Integer low = luaL_checkinteger(L, 1), high = luaL_checkinteger(L, 2);
  if (!lua_istable(L, 3)) return luaL_error(L, "randint: argument 3 must be a shape list (got %s)", luaL_typename(L, 3));
  int64_t shape[FLOW_MAX_DIMS];
  int nd = flow_lua_shape(L, 3, shape, "randint");
  int opts = lua_istable(L, 4) ? 4 : 0;
  if (opts) flow_lua_check_opts(L, opts, "randint", create_keys);
  flow_dtype dt = opt_dtype(L, opts, FLOW_I64);
  flow_device dev = opt_device(L, opts);
  if (high <= low) return luaL_error(L, "randint: high (%I) must be greater than low (%I)", high, low);
  if (has_placement(L, opts)) {
    push_reserved(L, nd, shape);
    lua_pushinteger(L, low); lua_setfield(L, -2, "low");
    lua_pushinteger(L, high); lua_setfield(L, -2, "high");
    return global_create(L, "randint", nd, shape, lua_gettop(L), opts, dt);
  }
  return flow_lua_push(L, flow_randint(low, high, nd, shape, dt, dev));
}

static lua_Number value_number(lua_State *L, int value, const char *key, const char *op) {
  lua_getfield(L, value, key);
  if (lua_type(L, -1) != LUA_TNUMBER) luaL_error(L, "_create_shard: %s needs value.%s (a number)", op, key);
  lua_Number v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static lua_Integer value_integer(lua_State *L, int value, const char *key, const char *op) {
  lua_getfield(L, value, key);
  int ok;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  if (!ok) luaL_error(L, "_create_shard: %s needs value.%s (an integer)", op, key);
  lua_pop(L, 1);
  return v;
}

/* flow._create_shard(opname, shape, value, box_start, box_shape, [opts]): the box of the logical
 * tensor that opname with this shape and value (see global_create) makes; dtype from value.dtype,
 * else opts.dtype; device from opts. For the global layer, and for specs of the box fill. */
static int l_create_shard(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  static const char *const ops[] = {"full", "arange", "linspace", "eye", "rand", "randn", "randint", NULL};
  int which = luaL_checkoption(L, 1, NULL, ops);
  int64_t shape[FLOW_MAX_DIMS], start[FLOW_MAX_DIMS], box[FLOW_MAX_DIMS];
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TTABLE);
  int nd = flow_lua_shape(L, 2, shape, "_create_shard");
  if (flow_lua_shape(L, 4, start, "_create_shard") != nd || flow_lua_shape(L, 5, box, "_create_shard") != nd)
    return luaL_error(L, "_create_shard: shape, box_start and box_shape must have the same length");
  int opts = lua_istable(L, 6) ? 6 : 0;
  flow_attrs at;
  flow_attrs_init(&at);
  at.nshape = nd;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)nd);
  at.device = opt_device(L, opts);
  at.dtype = opt_dtype(L, opts, which == 6 ? FLOW_I64 : FLOW_F32);
  if (which == 0) at.scalar = luaL_checknumber(L, 3);
  else {
    luaL_checktype(L, 3, LUA_TTABLE);
    at.dtype = flow_lua_opt_dtype(L, 3, at.dtype);
  }
  if (which == 1) { at.scalar = value_number(L, 3, "start", name); at.scalar2 = value_number(L, 3, "step", name); }
  if (which == 2) { at.scalar = value_number(L, 3, "start", name); at.scalar2 = value_number(L, 3, "stop", name); }
  if (which >= 4) {
    at.seed = (uint64_t)value_integer(L, 3, "seed", name);
    at.rng_offset = (uint64_t)value_integer(L, 3, "offset", name);
  }
  if (which == 6) {
    at.axes[0] = value_integer(L, 3, "low", name);
    at.axes[1] = value_integer(L, 3, "high", name);
    at.naxes = 2;
  }
  const flow_op *const op_of[] = {&flow_op_full, &flow_op_arange, &flow_op_linspace, &flow_op_eye,
                                  &flow_op_rand, &flow_op_randn, &flow_op_randint};
  return flow_lua_push(L, flow_create_shard(op_of[which], &at, start, box));
}

static int l_manual_seed(lua_State *L) {
  flow_rng_manual_seed((uint64_t)luaL_checkinteger(L, 1));
  return 0;
}

/* {seed =, offset =}: saved in checkpoints so a resumed run draws the same numbers. */
static int l_get_rng_state(lua_State *L) {
  flow_rng_state s = flow_rng_get_state();
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, (lua_Integer)s.seed); lua_setfield(L, -2, "seed");
  lua_pushinteger(L, (lua_Integer)s.offset); lua_setfield(L, -2, "offset");
  return 1;
}

static int l_set_rng_state(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  flow_rng_state s;
  lua_getfield(L, 1, "seed");
  lua_getfield(L, 1, "offset");
  int ok1, ok2;
  s.seed = (uint64_t)lua_tointegerx(L, -2, &ok1);
  s.offset = (uint64_t)lua_tointegerx(L, -1, &ok2);
  if (!ok1 || !ok2) return luaL_error(L, "set_rng_state: expected {seed = integer, offset = integer}");
  flow_rng_set_state(s);
  return 0;
}

/* dropout(t, p = 0.5, training = true). A global tensor reserves its logical numel so every
 * rank's generator stays in step. */
static int l_dropout(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "dropout");
  double p = luaL_optnumber(L, 2, 0.5);
  int training = lua_isnoneornil(L, 3) ? 1 : lua_toboolean(L, 3);
  if (!(p >= 0 && p <= 1)) return luaL_error(L, "dropout: p must be in [0, 1] (got %f)", p);
  if (!training || p == 0) { lua_settop(L, 1); return 1; }
  uint64_t n = (uint64_t)flow_tensor_numel(t);
  if (t->global) {
    lua_getfield(L, 1, "numel");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    n = (uint64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  return flow_lua_push(L, flow_dropout_at(t, p, flow_rng_reserve(n)));
}

/* Monotonic wall-clock seconds (for timing; the zero point is arbitrary). */
static int l_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

static int like(lua_State *L, double v, const char *fn) {
  flow_tensor *t = flow_lua_check(L, 1, fn);
  return push_full(L, flow_full_like(t, v), 0, fn);
}
static int l_zeros_like(lua_State *L) { return like(L, 0, "zeros_like"); }
static int l_ones_like(lua_State *L) { return like(L, 1, "ones_like"); }
static int l_full_like(lua_State *L) {
  if (lua_type(L, 2) != LUA_TNUMBER)
    return luaL_error(L, "full_like: the fill value must be a number (got %s)", luaL_typename(L, 2));
  return like(L, lua_tonumber(L, 2), "full_like");
}

/* ---- printing ----------------------------------------------------------------------------- */

static void push_element(lua_State *L, flow_dtype d, const char *p) {
  if (d == FLOW_BOOL) lua_pushboolean(L, *p != 0);
  else if (d == FLOW_I64) lua_pushinteger(L, *(const int64_t *)p);
  else if (flow_dtype_is_int(d)) lua_pushinteger(L, (lua_Integer)flow_dtype_load(d, p));
  else lua_pushnumber(L, flow_dtype_load(d, p));
}

/* Nested lists of t's values from axis d on; with edge > 0, an axis longer than 2 * edge keeps
 * its first and last edge entries with the string "..." between. */
static void push_summary(lua_State *L, const flow_tensor *t, int d, const char *p, int64_t edge) {
  size_t es = flow_dtype_size(t->dtype);
  int64_t n = t->shape[d];
  int cut = edge > 0 && n > 2 * edge;
  lua_createtable(L, cut ? (int)(2 * edge + 1) : (int)n, 0);
  int k = 1;
  for (int64_t i = 0; i < n; i++) {
    if (cut && i == edge) {
      lua_pushliteral(L, "...");
      lua_rawseti(L, -2, k++);
      i = n - edge;
    }
    const char *q = p + i * t->stride[d] * (int64_t)es;
    if (d == t->ndim - 1) push_element(L, t->dtype, q);
    else push_summary(L, t, d + 1, q, edge);
    lua_rawseti(L, -2, k++);
  }
}

/* summarize(t, edgeitems, threshold): the values print.lua shows (elided above threshold). */
static int l_summarize(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "tostring");
  lua_Integer edge = luaL_checkinteger(L, 2), threshold = luaL_checkinteger(L, 3);
  int pushed = 0;
  if (t->device.type != FLOW_CPU) {
    lua_getfield(L, LUA_REGISTRYINDEX, "flow.to_host"); /* set by the CUDA binding */
    if (lua_isnil(L, -1)) return luaL_error(L, "tostring: the tensor is on a device this build cannot read");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    t = flow_lua_check(L, -1, "tostring");
    pushed = 1;
  }
  luaL_checkstack(L, 2 * t->ndim + 8, "tostring");
  if (t->ndim == 0) push_element(L, t->dtype, flow_tensor_data(t));
  else push_summary(L, t, 0, flow_tensor_data(t), flow_tensor_numel(t) > threshold ? edge : 0);
  if (pushed) lua_remove(L, -2);
  return 1;
}

/* registry["flow.tostring"](t [, global]): global tensors go to the global layer's printer when it
 * set one. That printer passes `global` with a local copy of a global tensor's values: a table of
 * {placement =, sbp =, grad_fn = (or nil), requires_grad =} (lua/flow/print.lua shows them). */
static int l_tostring(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "tostring");
  lua_settop(L, 2);
  bool gathered = lua_istable(L, 2);
  if (t->global && !gathered) {
    lua_getfield(L, LUA_REGISTRYINDEX, "flow.tostring_global");
    if (!lua_isnil(L, -1)) {
      lua_pushvalue(L, 1);
      lua_call(L, 1, 1);
      return 1;
    }
    lua_pop(L, 1);
  }
  lua_getglobal(L, "require");
  lua_pushliteral(L, "flow.print");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "format");
  lua_pushvalue(L, 1);
  lua_pushcfunction(L, l_summarize);
  if (gathered) lua_getfield(L, 2, "grad_fn");
  else lua_pushstring(L, flow_autograd_op_name(t)); /* nil for a leaf */
  lua_pushvalue(L, 2);                             /* the global description, or nil */
  lua_call(L, 4, 1);
  return 1;
}

/* set_printoptions{precision =, threshold =, edgeitems =, sci_mode =, profile =} (lua/flow/print.lua) */
static int l_set_printoptions(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "flow.print");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "set_options");
  lua_pushvalue(L, 1);
  lua_call(L, 1, 0);
  return 0;
}

void flow_lua_open_create(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"tensor", l_tensor}, {"zeros", l_zeros}, {"ones", l_ones}, {"full", l_full},
    {"zeros_like", l_zeros_like}, {"ones_like", l_ones_like}, {"full_like", l_full_like},
    {"arange", l_arange}, {"linspace", l_linspace}, {"eye", l_eye}, {"rand", l_rand}, {"randn", l_randn},
    {"randint", l_randint}, {"manual_seed", l_manual_seed}, {"get_rng_state", l_get_rng_state},
    {"set_rng_state", l_set_rng_state}, {"dropout", l_dropout}, {"now", l_now},
    {"set_printoptions", l_set_printoptions}, {"_create_shard", l_create_shard}, {NULL, NULL}};
  static const luaL_Reg methods[] = {{"dropout", l_dropout}, {NULL, NULL}};
  flow_lua_register(L, fns, methods);
  lua_pushcfunction(L, l_tostring);
  lua_setfield(L, LUA_REGISTRYINDEX, "flow.tostring");
}
