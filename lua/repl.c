/* The flowlua REPL: expressions print their value, statements run, incomplete input continues on
 * the next line (as lua5.4's REPL does). */
#include "repl.h"

#include <lauxlib.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void flow_repl_init(lua_State *L) {
  lua_pushglobaltable(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_getfield(L, -1, "flow");
  lua_setfield(L, -3, "flow");
  lua_pop(L, 2);
}

void flow_repl_print_error(lua_State *L, const char *prog, const char *msg) {
  (void)L;
  fprintf(stderr, "%s: %s\n", prog, msg);
  fflush(stderr);
}

int flow_repl_finish(lua_State *L, int status) { (void)L; return status; }

static int incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t n;
  const char *msg = lua_tolstring(L, -1, &n);
  return n >= 5 && strcmp(msg + n - 5, "<eof>") == 0;
}

/* Compile line as "return line" first (an expression), else as a statement. */
static int compile(lua_State *L, const char *code) {
  const char *ret = lua_pushfstring(L, "return %s;", code);
  int status = luaL_loadbuffer(L, ret, strlen(ret), "=stdin");
  lua_remove(L, -2);
  if (status == LUA_OK) return status;
  lua_pop(L, 1);
  return luaL_loadbuffer(L, code, strlen(code), "=stdin");
}

static void print_results(lua_State *L, int base) {
  int n = lua_gettop(L) - base;
  if (n <= 0) return;
  lua_getglobal(L, "print");
  lua_insert(L, base + 1);
  if (lua_pcall(L, n, 0, 0) != LUA_OK) {
    fprintf(stderr, "error printing result: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

void flow_repl_run(lua_State *L) {
  int tty = isatty(0);
  char *line;
  luaL_Buffer *unused = NULL;
  (void)unused;
  char *pending = NULL;
  for (;;) {
    const char *prompt = pending ? ">> " : "> ";
    if (tty) line = readline(prompt);
    else {
      static char buf[65536];
      if (!fgets(buf, sizeof buf, stdin)) line = NULL;
      else { buf[strcspn(buf, "\n")] = 0; line = strdup(buf); }
    }
    if (!line) break;
    char *code;
    if (pending) {
      code = malloc(strlen(pending) + strlen(line) + 2);
      sprintf(code, "%s\n%s", pending, line);
      free(pending);
      pending = NULL;
    } else code = strdup(line);
    free(line);
    int base = lua_gettop(L);
    int status = compile(L, code);
    if (incomplete(L, status)) {
      lua_pop(L, 1);
      pending = code;
      continue;
    }
    if (tty && code[0]) add_history(code);
    free(code);
    if (status == LUA_OK) status = flow_main_pcall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) print_results(L, base);
    else {
      flow_repl_print_error(L, "flowlua", lua_tostring(L, -1));
      lua_settop(L, base);
    }
    lua_settop(L, base);
  }
  free(pending);
  if (tty) printf("\n");
}
