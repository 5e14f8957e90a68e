/* Lua bindings of the shape, view and index ops. */
#include "../ops/elementwise.h"
#include "../ops/index.h"
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

static int l_transpose(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "transpose");
  return flow_lua_push(L, flow_transpose(t, luaL_checkinteger(L, 2), luaL_checkinteger(L, 3)));
}

static int l_permute(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "permute");
  int64_t dims[FLOW_MAX_DIMS];
  int n = flow_lua_shape(L, 2, dims, "permute");
  return flow_lua_push(L, flow_permute(t, n, dims));
}

static int l_narrow(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "narrow");
  return flow_lua_push(L, flow_narrow(t, luaL_checkinteger(L, 2), luaL_checkinteger(L, 3), luaL_checkinteger(L, 4)));
}

static int l_select(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "select");
  return flow_lua_push(L, flow_select(t, luaL_checkinteger(L, 2), luaL_checkinteger(L, 3)));
}

static int l_squeeze(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "squeeze");
  int64_t axes[FLOW_MAX_DIMS];
  int n = flow_lua_axes(L, 2, axes, "squeeze");
  return flow_lua_push(L, flow_squeeze(t, n, axes));
}

static int l_unsqueeze(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "unsqueeze");
  return flow_lua_push(L, flow_unsqueeze(t, luaL_checkinteger(L, 2)));
}

static int l_flatten(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "flatten");
  return flow_lua_push(L, flow_flatten(t, luaL_optinteger(L, 2, 0), luaL_optinteger(L, 3, -1)));
}

static int l_contiguous(lua_State *L) {
  return flow_lua_push(L, flow_contiguous(flow_lua_check(L, 1, "contiguous")));
}

/* The tensors of the Lua list at idx, in a userdata array left on the stack (freed by the GC,
 * so a Lua error on a bad element leaks nothing). Borrowed references. */
static flow_tensor **check_list(lua_State *L, int idx, const char *fn, int *n) {
  luaL_argexpected(L, lua_istable(L, idx), idx, "list of tensors");
  *n = flow_lua_len(L, idx, INT_MAX / (int)sizeof(flow_tensor *), fn);
  flow_tensor **ts = lua_newuserdatauv(L, (size_t)(*n ? *n : 1) * sizeof *ts, 0);
  for (int i = 0; i < *n; i++) {
    lua_geti(L, idx, i + 1);
    ts[i] = flow_lua_test(L, -1);
    if (!ts[i]) luaL_error(L, "%s: element %d of the list must be a tensor (got %s)", fn, i + 1, luaL_typename(L, -1));
    lua_pop(L, 1);
  }
  return ts;
}

static int l_cat(lua_State *L) {
  int64_t axis = luaL_optinteger(L, 2, 0);
  int n;
  flow_tensor **ts = check_list(L, 1, "cat", &n);
  return flow_lua_push(L, flow_cat(n, ts, axis));
}

static int l_stack(lua_State *L) {
  int64_t axis = luaL_optinteger(L, 2, 0);
  int n;
  flow_tensor **ts = check_list(L, 1, "stack", &n);
  return flow_lua_push(L, flow_stack(n, ts, axis));
}

/* A list of narrow views of t along axis with the given sizes (a Lua list on the stack at idx,
 * or every `each` elements when sizes_idx is 0). */
static int push_pieces(lua_State *L, flow_tensor *t, int64_t axis, int sizes_idx, int64_t each, const char *fn) {
  int64_t ax;
  if (flow_axis_norm(fn, axis, flow_tensor_lndim(t), &ax) != 0 || flow_tensor_lndim(t) == 0) {
    if (flow_tensor_lndim(t) == 0) flow_error_set("%s: cannot split a 0-d tensor", fn);
    return flow_lua_error(L);
  }
  int64_t size = flow_tensor_lshape(t)[ax], at = 0;
  int n = sizes_idx ? flow_lua_len(L, sizes_idx, INT_MAX, fn) : 0;
  if (sizes_idx) {
    int64_t total = 0;
    for (int i = 1; i <= n; i++) {
      lua_geti(L, sizes_idx, i);
      int ok;
      int64_t s = lua_tointegerx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok || s < 0) return luaL_error(L, "%s: size %d must be a non-negative integer", fn, i);
      total += s;
    }
    if (total != size)
      return luaL_error(L, "%s: sizes sum to %I but axis %I has size %I", fn, (lua_Integer)total, (lua_Integer)ax,
                        (lua_Integer)size);
  } else if (each <= 0) {
    return luaL_error(L, "%s: the piece size must be positive (got %I)", fn, (lua_Integer)each);
  }
  lua_newtable(L);
  for (int i = 1; sizes_idx ? i <= n : (at < size || i == 1); i++) {
    int64_t len = each;
    if (sizes_idx) {
      lua_geti(L, sizes_idx, i);
      len = lua_tointeger(L, -1);
      lua_pop(L, 1);
    } else if (len > size - at) {
      len = size - at;
    }
    flow_lua_push(L, flow_narrow(t, ax, at, len));
    lua_rawseti(L, -2, i);
    at += len;
  }
  return 1;
}

/* split(t, size|sizes, axis=0) */
static int l_split(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "split");
  int64_t axis = luaL_optinteger(L, 3, 0);
  if (lua_istable(L, 2)) return push_pieces(L, t, axis, 2, 0, "split");
  return push_pieces(L, t, axis, 0, luaL_checkinteger(L, 2), "split");
}

/* chunk(t, n, axis=0): pieces of ceil(size / n) elements (the last may be smaller, and there may
 * be fewer than n), as torch.chunk. */
static int l_chunk(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "chunk");
  int64_t n = luaL_checkinteger(L, 2), axis = luaL_optinteger(L, 3, 0), ax;
  if (n <= 0) return luaL_error(L, "chunk: the number of chunks must be positive (got %I)", (lua_Integer)n);
  if (flow_tensor_lndim(t) == 0) return luaL_error(L, "chunk: cannot split a 0-d tensor");
  if (flow_axis_norm("chunk", axis, flow_tensor_lndim(t), &ax) != 0) return flow_lua_error(L);
  int64_t size = flow_tensor_lshape(t)[ax], each = (size + n - 1) / n;
  if (size > 0) return push_pieces(L, t, ax, 0, each, "chunk");
  lua_createtable(L, (int)n, 0); /* an empty axis gives n empty pieces, as torch */
  for (int64_t i = 1; i <= n; i++) {
    flow_lua_push(L, flow_narrow(t, ax, 0, 0));
    lua_rawseti(L, -2, i);
  }
  return 1;
}

static int l_tril(lua_State *L) {
  return flow_lua_push(L, flow_tri(flow_lua_check(L, 1, "tril"), luaL_optinteger(L, 2, 0), false));
}

static int l_triu(lua_State *L) {
  return flow_lua_push(L, flow_tri(flow_lua_check(L, 1, "triu"), luaL_optinteger(L, 2, 0), true));
}

static int l_embedding(lua_State *L) {
  flow_tensor *ids = flow_lua_check(L, 1, "embedding");
  return flow_lua_push(L, flow_embedding(ids, flow_lua_check(L, 2, "embedding")));
}

static int l_index_select(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "index_select");
  int64_t axis = luaL_checkinteger(L, 2);
  return flow_lua_push(L, flow_index_select(t, axis, flow_lua_check(L, 3, "index_select")));
}

static int l_gather(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "gather");
  int64_t axis = luaL_checkinteger(L, 2);
  return flow_lua_push(L, flow_gather(t, axis, flow_lua_check(L, 3, "gather")));
}

/* flip(t, axes) / t:flip(axes): axes an integer or a list */
static int l_flip(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "flip");
  if (lua_isnoneornil(L, 2)) return luaL_error(L, "flip: expected the axes to flip (an integer or a list)");
  int64_t axes[FLOW_MAX_DIMS];
  int n = flow_lua_axes(L, 2, axes, "flip");
  return flow_lua_push(L, flow_flip(t, n, axes));
}

static int l_scatter_add(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "scatter_add");
  int64_t axis = luaL_checkinteger(L, 2);
  flow_tensor *idx = flow_lua_check(L, 3, "scatter_add");
  return flow_lua_push(L, flow_scatter_add(t, axis, idx, flow_lua_check(L, 4, "scatter_add")));
}

void flow_lua_open_shape(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"reshape", l_reshape}, {"view", l_view}, {"expand", l_expand}, {"transpose", l_transpose},
      {"permute", l_permute}, {"narrow", l_narrow}, {"select", l_select}, {"squeeze", l_squeeze},
      {"unsqueeze", l_unsqueeze}, {"flatten", l_flatten}, {"split", l_split}, {"chunk", l_chunk},
      {"tril", l_tril}, {"triu", l_triu}, {"embedding", l_embedding}, {"index_select", l_index_select},
      {"gather", l_gather}, {"scatter_add", l_scatter_add}, {"flip", l_flip},
      {NULL, NULL}};
  /* cat and stack take a list, so they are module functions only; t:contiguous() is in bind_tensor.c */
  static const luaL_Reg extra[] = {{"cat", l_cat}, {"stack", l_stack}, {"contiguous", l_contiguous}, {NULL, NULL}};
  flow_lua_register(L, methods, methods);
  flow_lua_register(L, extra, NULL);
}
