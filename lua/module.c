/* luaopen_flow: builds the `flow` module from the bind_*.c areas and the embedded pure-Lua
 * library (lua/flow/ files, compiled into the binary so flowlua and flow.so need no search path). */
#include <string.h>

#include "bind.h"

/* Generated at build time from lua/flow/ files (cmake/embed.cmake). */
typedef struct flow_lua_source { const char *name; const char *code; size_t len; } flow_lua_source;
extern const flow_lua_source flow_lua_sources[];

static int load_embedded(lua_State *L) {
  const flow_lua_source *s = lua_touserdata(L, lua_upvalueindex(1));
  char chunk[128];
  snprintf(chunk, sizeof chunk, "@lua/flow/%s.lua", s->name);
  if (luaL_loadbufferx(L, s->code, s->len, chunk, "t") != LUA_OK) return lua_error(L);
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  return 1;
}

/* package.preload["flow.<name>"] for every embedded file except init. */
static void preload(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (const flow_lua_source *s = flow_lua_sources; s->name; s++) {
    if (strcmp(s->name, "init") == 0) continue;
    char name[128];
    snprintf(name, sizeof name, "flow.%s", s->name);
    lua_pushlightuserdata(L, (void *)s);
    lua_pushcclosure(L, load_embedded, 1);
    lua_setfield(L, -2, name);
  }
  lua_pop(L, 1);
}

static void set_dtypes(lua_State *L) {
  static const char *names[][2] = {{"float32", "float32"}, {"float", "float32"}, {"float64", "float64"},
                                   {"double", "float64"}, {"float16", "float16"}, {"half", "float16"},
                                   {"bfloat16", "bfloat16"}, {"int64", "int64"}, {"long", "int64"},
                                   {"int32", "int32"}, {"int", "int32"}, {"uint8", "uint8"}, {"bool", "bool"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    lua_pushstring(L, names[i][1]);
    lua_setfield(L, -2, names[i][0]);
  }
}

int luaopen_flow(lua_State *L) {
  luaL_checkversion(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_getfield(L, -1, "flow");
  if (lua_istable(L, -1)) return 1; /* already open (flowlua preloads it) */
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "flow"); /* package.loaded.flow, so the Lua library can require it */
  lua_remove(L, -2);
  flow_lua_init_tables(L);
  set_dtypes(L);
  lua_pushliteral(L, "0.1.0");
  lua_setfield(L, -2, "__version");
  flow_lua_open_tensor(L);
  flow_lua_open_elementwise(L);
  flow_lua_open_reduce(L);
  flow_lua_open_shape(L);
  flow_lua_open_create(L);
  flow_lua_open_nn(L);
  flow_lua_open_autograd(L);
  flow_lua_open_io(L);
  flow_lua_open_global(L);
  flow_lua_open_cuda(L);
  flow_lua_open_bench(L);
  flow_lua_open_conv(L);
  flow_lua_open_actor(L);
  flow_lua_open_graph(L);
  preload(L);
  /* lua/flow/init.lua finishes the module (pure-Lua parts) */
  for (const flow_lua_source *s = flow_lua_sources; s->name; s++) {
    if (strcmp(s->name, "init") != 0) continue;
    if (luaL_loadbufferx(L, s->code, s->len, "@lua/flow/init.lua", "t") != LUA_OK) return lua_error(L);
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0);
  }
  return 1;
}
