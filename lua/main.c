/* flowlua: a Lua 5.4 interpreter with the flow module built in.
 *   flowlua [options] [script [args...]]
 *   -e CHUNK  run CHUNK     -i  REPL after the script     -v  print the version
 * With no script the REPL opens (see repl.c). `flow` is a global. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repl.h"

int luaopen_flow(lua_State *L);

/* Lua's allocator for flowlua: blocks up to 256 bytes (tensor boxes, closures, small tables) are
 * recycled through free lists by size class, which halves the allocation cost of a small eager op
 * compared with glibc malloc. Lua always passes a block's size back, so no header is needed. */
#define SMALL_MAX 256
#define SMALL_KEEP 65536

typedef struct small_block { struct small_block *next; } small_block;
typedef struct small_pool { small_block *head[SMALL_MAX / 16]; int count[SMALL_MAX / 16]; } small_pool;

static void *lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  small_pool *pool = ud;
  if (!ptr) osize = 0; /* osize then holds the type of a new object */
  if (nsize == 0) {
    if (osize && osize <= SMALL_MAX) {
      int c = (int)((osize - 1) / 16);
      if (pool->count[c] < SMALL_KEEP) {
        small_block *b = ptr;
        b->next = pool->head[c];
        pool->head[c] = b;
        pool->count[c]++;
        return NULL;
      }
    }
    free(ptr);
    return NULL;
  }
  if (nsize <= SMALL_MAX) {
    int c = (int)((nsize - 1) / 16);
    if (osize && osize <= SMALL_MAX && (osize - 1) / 16 == (size_t)c) return ptr;
    void *p = pool->head[c];
    if (p) {
      pool->head[c] = pool->head[c]->next;
      pool->count[c]--;
    } else if (!(p = malloc((size_t)(c + 1) * 16))) return NULL;
    if (ptr) {
      memcpy(p, ptr, osize < nsize ? osize : nsize);
      lua_alloc(ud, ptr, osize, 0);
    }
    return p;
  }
  if (osize && osize <= SMALL_MAX) { /* growing out of the small classes */
    void *p = malloc(nsize);
    if (!p) return NULL;
    memcpy(p, ptr, osize);
    lua_alloc(ud, ptr, osize, 0);
    return p;
  }
  return realloc(ptr, nsize);
}

static void pool_free(small_pool *pool) {
  for (int c = 0; c < SMALL_MAX / 16; c++)
    while (pool->head[c]) {
      small_block *b = pool->head[c];
      pool->head[c] = b->next;
      free(b);
    }
}

static int panic(lua_State *L) {
  fprintf(stderr, "flowlua: unprotected error: %s\n", lua_tostring(L, -1));
  return 0;
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Run the function on top of the stack with nargs arguments under a traceback handler. */
int flow_main_pcall(lua_State *L, int nargs, int nres) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, nres, base);
  lua_remove(L, base);
  return rc;
}

void flow_main_report(lua_State *L, const char *prog) {
  const char *msg = lua_tostring(L, -1);
  flow_repl_print_error(L, prog, msg ? msg : "(error object is not a string)");
  lua_pop(L, 1);
}

static void create_arg_table(lua_State *L, char **argv, int argc, int script) {
  lua_createtable(L, argc - script, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int run_script(lua_State *L, const char *path, int nargs_from, int argc, char **argv) {
  if (luaL_loadfile(L, strcmp(path, "-") == 0 ? NULL : path) != LUA_OK) return 1;
  int n = 0;
  for (int i = nargs_from; i < argc; i++, n++) lua_pushstring(L, argv[i]);
  return flow_main_pcall(L, n, 0) != LUA_OK;
}

static void print_version(lua_State *L) {
  lua_getglobal(L, "flow");
  lua_getfield(L, -1, "__version");
  printf("flowlua %s (%s)\n", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?", LUA_RELEASE);
  fflush(stdout);
  lua_pop(L, 2);
}

static void usage(const char *prog) {
  fprintf(stderr, "usage: %s [-e chunk] [-i] [-v] [script [args]]\n", prog);
}

int main(int argc, char **argv) {
  const char *prog = argv[0];
  static small_pool pool;
  lua_State *L = lua_newstate(lua_alloc, &pool);
  if (L) lua_atpanic(L, panic);
  if (!L) { fprintf(stderr, "%s: cannot create Lua state\n", prog); return 1; }
  /* Eager code makes many short-lived tensors: generational GC frees them in minor collections
   * (4x less overhead per small op than incremental mode). flowlua's own choice, as lua5.4's;
   * the module leaves a host interpreter's GC mode alone. */
  lua_gc(L, LUA_GCGEN, 0, 0);
  luaL_openlibs(L);
  luaL_requiref(L, "flow", luaopen_flow, 1);
  lua_pop(L, 1);
  flow_repl_init(L);

  int script = 0, interactive = 0, ran_chunk = 0, status = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || strcmp(a, "-") == 0) { script = i; break; }
    if (strcmp(a, "--") == 0) { if (i + 1 < argc) script = i + 1; break; }
    if (strcmp(a, "-i") == 0) interactive = 1;
    else if (strcmp(a, "-v") == 0) { print_version(L); ran_chunk = 1; }
    else if (strcmp(a, "-e") == 0 || strncmp(a, "-e", 2) == 0) {
      const char *chunk = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
      if (!chunk) { usage(prog); lua_close(L); pool_free(&pool); return 1; }
      create_arg_table(L, argv, argc, 0);
      if (luaL_loadbuffer(L, chunk, strlen(chunk), "=(command line)") != LUA_OK ||
          flow_main_pcall(L, 0, 0) != LUA_OK) {
        flow_main_report(L, prog);
        status = 1;
        break;
      }
      ran_chunk = 1;
    } else { usage(prog); lua_close(L); pool_free(&pool); return 1; }
  }
  if (status == 0 && script) {
    create_arg_table(L, argv, argc, script);
    if (run_script(L, argv[script], script + 1, argc, argv)) { flow_main_report(L, prog); status = 1; }
  }
  if (status == 0 && (interactive || (!script && !ran_chunk))) flow_repl_run(L);
  status = flow_repl_finish(L, status);
  lua_close(L);
  pool_free(&pool);
  return status;
}
