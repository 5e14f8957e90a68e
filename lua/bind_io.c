/* Lua bindings: io. flow.save/flow.load (safetensors checkpoints), flow.read_file (a whole
 * file as a Lua string, gunzipped when compressed) and flow.open_tokens (token files for
 * lua/flow/data.lua: llm.c shards read straight into int64 tensors). */
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "../core/io.h"
#include "../ops/elementwise.h"
#include "bind.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A number as metadata text that reads back as the same Lua number: integers in decimal,
 * floats with 17 significant digits and always a '.' or exponent so they stay floats. */
static const char *number_text(lua_State *L, int idx) {
  if (lua_isinteger(L, idx)) return lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, idx));
  char s[64];
  snprintf(s, sizeof s, "%.17g", lua_tonumber(L, idx));
  if (!strpbrk(s, ".eEn")) strcat(s, ".0"); /* "n": nan and inf stay as printed */
  return lua_pushstring(L, s);
}

/* A string argument or key that C reads up to its first zero byte: one holding a zero byte would
 * name some other file or entry, so it is refused. */
static const char *check_cstring(lua_State *L, int idx, const char *fn, const char *what) {
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  if (s && strlen(s) != n) luaL_error(L, "%s: %s contains a zero byte", fn, what);
  return s;
}

/* The host-side contiguous copy that goes into the file (a new reference). */
static flow_tensor *file_tensor(lua_State *L, flow_tensor *t) {
  if (t->device.type != FLOW_CPU) {
    lua_getfield(L, LUA_REGISTRYINDEX, "flow.to_host"); /* set by the CUDA binding */
    if (lua_isnil(L, -1)) { lua_pop(L, 1); flow_error_set("save: tensor is on a device this build cannot read"); return NULL; }
    flow_tensor_incref(t);
    flow_lua_push(L, t);
    lua_call(L, 1, 1);
    t = flow_lua_check(L, -1, "save");
    flow_tensor_incref(t);
    lua_pop(L, 1);
  } else {
    flow_tensor_incref(t);
  }
  if (flow_tensor_is_contiguous(t)) return t;
  flow_tensor *c = flow_contiguous_copy(t);
  flow_tensor_decref(t);
  return c;
}

/* flow.save(tbl, path): tensors under string keys become safetensors entries; numbers and
 * strings go into "__metadata__" (numbers listed as such: core/io.h). Keys are written sorted, so
 * equal tables give equal files. */
static int l_save(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstring(L, 2);
  const char *path = check_cstring(L, 2, "save", "the path");
  int n = 0, nmeta = 0;
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      return luaL_error(L, "save: table keys must be strings (got a %s key)", luaL_typename(L, -2));
    const char *k = check_cstring(L, -2, "save", "a key");
    if (lua_type(L, -1) == LUA_TSTRING) check_cstring(L, -1, "save", "a metadata string");
    if (flow_lua_test(L, -1)) n++;
    else if (lua_type(L, -1) == LUA_TNUMBER || lua_type(L, -1) == LUA_TSTRING) nmeta++;
    else if (lua_isuserdata(L, -1) && luaL_testudata(L, -1, FLOW_TENSOR_MT))
      return luaL_error(L, "save: '%s' is a freed tensor", k);
    else return luaL_error(L, "save: '%s' is a %s (expected a tensor, number or string)", k, luaL_typename(L, -1));
    if (strcmp(k, "__metadata__") == 0) return luaL_error(L, "save: the key '__metadata__' is reserved");
    lua_pop(L, 1);
  }
  /* Scratch arrays live in userdata, so a Lua error below cannot leak them. */
  char **names = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
  char **mkeys = lua_newuserdatauv(L, sizeof(char *) * (size_t)(nmeta + 1), 0);
  char **mvals = lua_newuserdatauv(L, sizeof(char *) * (size_t)(nmeta + 1), 0);
  unsigned char *mnum = lua_newuserdatauv(L, (size_t)nmeta + 1, 0);
  int i = 0, m = 0;
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    int top = lua_gettop(L);
    if (flow_lua_test(L, -1)) {
      names[i++] = (char *)lua_tostring(L, -2);
      lua_pop(L, 1);
      continue;
    }
    mkeys[m] = (char *)lua_tostring(L, -2);
    mnum[m] = lua_type(L, -1) == LUA_TNUMBER;
    mvals[m] = (char *)(mnum[m] ? number_text(L, top) : lua_tostring(L, -1));
    m++;
    /* keep a pushed number text alive (it stays on the stack, below the iteration key) */
    if (lua_gettop(L) > top) lua_insert(L, top - 1);
    lua_pop(L, 1);
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int a = 1; a < nmeta; a++) /* insertion sort of the (key, value) pairs: metadata is small */
    for (int b = a; b > 0 && strcmp(mkeys[b - 1], mkeys[b]) > 0; b--) {
      char *tk = mkeys[b], *tv = mvals[b];
      unsigned char tn = mnum[b];
      mkeys[b] = mkeys[b - 1]; mvals[b] = mvals[b - 1]; mnum[b] = mnum[b - 1];
      mkeys[b - 1] = tk; mvals[b - 1] = tv; mnum[b - 1] = tn;
    }
  flow_tensor **ts = lua_newuserdatauv(L, sizeof(flow_tensor *) * (size_t)(n + 1), 0);
  int rc = 0;
  for (i = 0; i < n; i++) {
    lua_getfield(L, 1, names[i]);
    ts[i] = file_tensor(L, flow_lua_test(L, -1));
    lua_pop(L, 1);
    if (!ts[i]) { rc = -1; break; }
  }
  if (rc == 0) {
    flow_io_file f = {n, names, ts, nmeta, mkeys, mvals, mnum};
    rc = flow_io_save(path, &f);
  }
  for (int k = 0; k < i; k++) flow_tensor_decref(ts[k]);
  if (rc != 0) return flow_lua_error(L);
  return 0;
}

/* flow.load(path) -> table: tensors by name, plus the metadata entries: strings as they were
 * ("1.10" stays "1.10"), and the entries flow.save wrote from numbers as those numbers again. */
static int l_load(lua_State *L) {
  luaL_checkstring(L, 1);
  const char *path = check_cstring(L, 1, "load", "the path");
  flow_io_file f;
  if (flow_io_load(path, &f) != 0) return flow_lua_error(L);
  if (!lua_checkstack(L, 8)) { flow_io_file_free(&f); return luaL_error(L, "load: Lua stack overflow"); }
  lua_createtable(L, 0, f.n + f.nmeta);
  for (int i = 0; i < f.nmeta; i++) {
    if (!f.meta_number || !f.meta_number[i]) {
      lua_pushstring(L, f.meta_values[i]);
    } else if (lua_stringtonumber(L, f.meta_values[i]) == 0) {
      lua_pushfstring(L, "load: '%s': metadata '%s' is listed as a number but holds '%s'", path, f.meta_keys[i],
                      f.meta_values[i]);
      flow_io_file_free(&f);
      return lua_error(L);
    }
    lua_setfield(L, -2, f.meta_keys[i]);
  }
  for (int i = 0; i < f.n; i++) {
    flow_lua_push(L, f.tensors[i]);
    f.tensors[i] = NULL; /* the userdata owns it now */
    lua_setfield(L, -2, f.names[i]);
  }
  flow_io_file_free(&f);
  return 1;
}

/* flow.read_file(path [, max]): the file's bytes (unpacked when gzipped), or its first max bytes */
static int l_read_file(lua_State *L) {
  luaL_checkstring(L, 1);
  const char *path = check_cstring(L, 1, "read_file", "the path");
  lua_Integer max = luaL_optinteger(L, 2, -1);
  if (!lua_isnoneornil(L, 2) && max < 0)
    return luaL_error(L, "read_file: max must be a non-negative number of bytes (got %I)", max);
  char *data;
  size_t len;
  if (flow_io_read_file(path, max < 0 ? SIZE_MAX : (size_t)max, &data, &len) != 0) return flow_lua_error(L);
  lua_pushlstring(L, data, len);
  free(data);
  return 1;
}

/* ---------------------------------------------------------------- token files */

#define TOKENS_MT "flow.Tokens"

static flow_io_tokens *check_tokens(lua_State *L, const char *fn) {
  flow_io_tokens *t = luaL_checkudata(L, 1, TOKENS_MT);
  if (!t->width) luaL_error(L, "%s: the token file is closed", fn);
  return t;
}

/* flow.open_tokens(path) -> a token file (core/io.h: an llm.c shard, mapped, or a text file's
 * bytes), with f:len(), f:width() (bytes a token: 1, 2 or 4), f:read() and f:close(). */
static int l_open_tokens(lua_State *L) {
  luaL_checkstring(L, 1);
  const char *path = check_cstring(L, 1, "open_tokens", "the path");
  flow_io_tokens *t = lua_newuserdatauv(L, sizeof *t, 0);
  memset(t, 0, sizeof *t);
  luaL_setmetatable(L, TOKENS_MT);
  if (flow_io_tokens_open(path, t) != 0) {
    const char *m = flow_error_get();
    lua_pushfstring(L, "open_tokens: %s", strncmp(m, "data: ", 6) == 0 ? m + 6 : m);
    return lua_error(L);
  }
  return 1;
}

static int tok_len(lua_State *L) {
  lua_pushinteger(L, check_tokens(L, "len")->count);
  return 1;
}

static int tok_width(lua_State *L) {
  lua_pushinteger(L, check_tokens(L, "width")->width);
  return 1;
}

/* f:read(start, n, out, offset = 0): tokens [start, start + n) (0-based) into the elements
 * [offset, offset + n) of out, a contiguous int64 CPU tensor. */
static int tok_read(lua_State *L) {
  flow_io_tokens *t = check_tokens(L, "read");
  lua_Integer start = luaL_checkinteger(L, 2), n = luaL_checkinteger(L, 3);
  flow_tensor *out = flow_lua_check(L, 4, "read");
  lua_Integer offset = luaL_optinteger(L, 5, 0);
  if (out->dtype != FLOW_I64 || out->device.type != FLOW_CPU || !flow_tensor_is_contiguous(out))
    return luaL_error(L, "read: out must be a contiguous int64 CPU tensor (got %s)", flow_dtype_name(out->dtype));
  if (n < 0 || start < 0 || start > t->count - n)
    return luaL_error(L, "read: tokens [%I, %I) are outside the file's [0, %I)", (LUAI_UACINT)start,
                      (LUAI_UACINT)(start + n), (LUAI_UACINT)t->count);
  if (offset < 0 || offset > flow_tensor_numel(out) - n)
    return luaL_error(L, "read: elements [%I, %I) are outside out's %I", (LUAI_UACINT)offset, (LUAI_UACINT)(offset + n),
                      (LUAI_UACINT)flow_tensor_numel(out));
  flow_io_tokens_read(t, start, n, (int64_t *)flow_tensor_data(out) + offset);
  return 0;
}

static int tok_close(lua_State *L) {
  flow_io_tokens_close(luaL_checkudata(L, 1, TOKENS_MT));
  return 0;
}

void flow_lua_open_io(lua_State *L) {
  static const luaL_Reg funcs[] = {{"save", l_save}, {"load", l_load}, {"read_file", l_read_file},
                                   {"open_tokens", l_open_tokens}, {NULL, NULL}};
  static const luaL_Reg methods[] = {{"len", tok_len}, {"width", tok_width}, {"read", tok_read},
                                     {"close", tok_close}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", tok_close}, {"__close", tok_close}, {"__len", tok_len}, {NULL, NULL}};
  luaL_newmetatable(L, TOKENS_MT);
  luaL_setfuncs(L, meta, 0);
  luaL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  flow_lua_register(L, funcs, NULL);
}
