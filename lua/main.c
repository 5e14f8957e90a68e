/* flowlua: a Lua 5.4 interpreter with the flow module built in, a drop-in for lua5.4:
 *   flowlua [options] [script [args]]
 * Options as lua5.4's (-e stat, -i, -l mod, -l g=mod, -v, -E, -W, --, -), LUA_INIT_5_4/LUA_INIT,
 * and the `flow` global; --ranks n runs n ranks without mpirun (core/comm_launch.c). Unlike
 * lua5.4, stdin that is not a terminal runs through the REPL (values print; rank 0's stdin feeds
 * every rank under mpirun and --ranks); `flowlua -` runs it as a script. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/comm.h"
#include "../core/error.h"
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

static const char *progname = "flowlua";

static int panic(lua_State *L) {
  fprintf(stderr, "%s: unprotected error: %s\n", progname, lua_tostring(L, -1));
  return 0;
}

/* ---- warnings (lua_setwarnf): as lauxlib's, which a state made by lua_newstate lacks --------- */

/* Off until "@on"; a message may come in pieces (tocont), written as one "Lua warning: " line. */
typedef struct warn_state { int on, midline; } warn_state;

static void warnf(void *ud, const char *msg, int tocont) {
  warn_state *w = ud;
  if (!w->midline && !tocont && msg[0] == '@') { /* a control message */
    if (strcmp(msg, "@on") == 0) w->on = 1;
    else if (strcmp(msg, "@off") == 0) w->on = 0;
    return;
  }
  if (!w->on) return;
  if (!w->midline) fputs("Lua warning: ", stderr);
  fputs(msg, stderr);
  if (!tocont) fputs("\n", stderr);
  fflush(stderr);
  w->midline = tocont;
}

/* ---- running chunks --------------------------------------------------------------------------- */

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

/* Print the error on top (if status says there is one) and pop it; returns status. With several
 * ranks only the failing one prints, so the message says which it is. */
static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    int top = lua_gettop(L);
    const char *msg = lua_tostring(L, -1);
    if (!msg) msg = "(error object is not a string)";
    if (flow_comm_size() > 1 && strncmp(msg, "[rank ", 6) != 0) msg = lua_pushfstring(L, "[rank %d] %s", flow_comm_rank(), msg);
    flow_repl_print_error(L, progname, msg);
    lua_settop(L, top - 1);
  }
  return status;
}

static int dochunk(lua_State *L, int status) {
  if (status == LUA_OK) status = flow_main_pcall(L, 0, 0);
  return report(L, status);
}

static int dostring(lua_State *L, const char *s, const char *name) {
  return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

/* -l g=mod: g = require "mod"; -l mod: mod = require "mod" (as lua5.4.4). */
static int dolibrary(lua_State *L, char *globname) {
  char *modname = strchr(globname, '=');
  if (modname) *modname++ = '\0';
  else modname = globname;
  lua_getglobal(L, "require");
  lua_pushstring(L, modname);
  int status = flow_main_pcall(L, 1, 1);
  if (status == LUA_OK) lua_setglobal(L, globname);
  return report(L, status);
}

static void create_arg_table(lua_State *L, char **argv, int argc, int script) {
  if (script == argc) script = 0; /* no script: every argument gets an index <= 0 */
  lua_createtable(L, argc - (script + 1), script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

/* The script at argv[0] ("-" is stdin unless it came after "--"), with arg[1..] as its ... */
static int handle_script(lua_State *L, char **argv) {
  const char *fname = argv[0];
  if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0) fname = NULL;
  int status = luaL_loadfile(L, fname);
  if (status == LUA_OK) {
    lua_getglobal(L, "arg");
    int n = (int)luaL_len(L, -1);
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
    lua_remove(L, -n - 1);
    status = flow_main_pcall(L, n, 0);
  }
  return report(L, status);
}

/* LUA_INIT_5_4, else LUA_INIT: "@file" runs the file, anything else is a chunk (named after the
 * variable, as lua5.4 does). */
static int handle_luainit(lua_State *L) {
  const char *name = "=LUA_INIT_" LUA_VERSION_MAJOR "_" LUA_VERSION_MINOR, *init = getenv(name + 1);
  if (!init) {
    name = "=LUA_INIT";
    init = getenv(name + 1);
  }
  if (!init) return LUA_OK;
  if (init[0] == '@') return dochunk(L, luaL_loadfile(L, init + 1));
  return dostring(L, init, name);
}

/* ---- options ---------------------------------------------------------------------------------- */

enum { HAS_ERROR = 1, HAS_I = 2, HAS_V = 4, HAS_E = 8, HAS_NOENV = 16 };

/* Checks the options before any runs (as lua5.4): returns the HAS_ flags; *first is the script's
 * index (argc when none), or the bad option's index with HAS_ERROR. */
static int collect_args(char **argv, int argc, int *first) {
  int args = 0, i;
  for (i = 1; i < argc; i++) {
    *first = i;
    const char *a = argv[i];
    if (a[0] != '-') return args;
    switch (a[1]) {
    case '-':
      if (a[2]) return HAS_ERROR;
      *first = i + 1;
      return args;
    case '\0': return args; /* "-": the script is stdin */
    case 'E':
      if (a[2]) return HAS_ERROR;
      args |= HAS_NOENV;
      break;
    case 'W':
      if (a[2]) return HAS_ERROR;
      break;
    case 'i':
      args |= HAS_I; /* -i implies -v */
      /* fall through */
    case 'v':
      if (a[2]) return HAS_ERROR;
      args |= HAS_V;
      break;
    case 'e':
      args |= HAS_E;
      /* fall through */
    case 'l': /* both need an argument, attached or next */
      if (!a[2] && (++i >= argc || argv[i][0] == '-')) return HAS_ERROR;
      break;
    default: return HAS_ERROR;
    }
  }
  *first = i;
  return args;
}

/* --ranks n (or --ranks=n) among the options before the script: taken out of argv; 0 when absent,
 * -1 (after a message) when n is not a number of ranks. */
static int take_ranks(int *argc, char **argv) {
  int n = 0;
  for (int i = 1; i < *argc; i++) {
    const char *a = argv[i], *v = NULL;
    if (a[0] != '-' || !a[1] || strcmp(a, "--") == 0) break; /* the script, "-" or "--": options end */
    int take = 0;
    if (strcmp(a, "--ranks") == 0) { v = i + 1 < *argc ? argv[i + 1] : ""; take = 2; }
    else if (strncmp(a, "--ranks=", 8) == 0) { v = a + 8; take = 1; }
    else if ((a[1] == 'e' || a[1] == 'l') && !a[2]) { i++; continue; }
    if (!take) continue;
    char *end;
    long k = strtol(v, &end, 10);
    if (!*v || *end || k < 1 || k > 1024) {
      /* its own usage: lua5.4's stays as it is, for a drop-in */
      fprintf(stderr, "%s: --ranks needs a number of ranks from 1 to 1024, not '%s'\n"
              "usage: %s --ranks n [options] [script [args]]\n"
              "  runs n ranks, as 'mpirun -np n %s ...' would, without mpirun (rank 0 reads stdin)\n",
              progname, v, progname, progname);
      return -1;
    }
    n = (int)k;
    memmove(argv + i, argv + i + take, (size_t)(*argc - i - take + 1) * sizeof *argv);
    *argc -= take;
    i--;
  }
  return n;
}

static void print_usage(const char *bad) {
  if (bad[1] == 'e' || bad[1] == 'l') fprintf(stderr, "%s: '%s' needs argument\n", progname, bad);
  else fprintf(stderr, "%s: unrecognized option '%s'\n", progname, bad);
  fprintf(stderr,
          "usage: %s [options] [script [args]]\n"
          "Available options are:\n"
          "  -e stat   execute string 'stat'\n"
          "  -i        enter interactive mode after executing 'script'\n"
          "  -l mod    require library 'mod' into global 'mod'\n"
          "  -l g=mod  require library 'mod' into global 'g'\n"
          "  -v        show version information\n"
          "  -E        ignore environment variables\n"
          "  -W        turn warnings on\n"
          "  --        stop handling options\n"
          "  -         stop handling options and execute stdin\n",
          progname);
}

static void print_version(lua_State *L) {
  lua_getglobal(L, "flow");
  lua_getfield(L, -1, "__version");
  printf("flowlua %s (%s)\n", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?", LUA_RELEASE);
  fflush(stdout);
  lua_pop(L, 2);
}

/* -e and -l in order, and -W where it stands; 0 once one fails. */
static int run_args(lua_State *L, char **argv, int n) {
  for (int i = 1; i < n; i++) {
    int option = argv[i][1];
    if (option == 'e' || option == 'l') {
      char *extra = argv[i] + 2;
      if (!*extra) extra = argv[++i];
      int status = option == 'e' ? dostring(L, extra, "=(command line)") : dolibrary(L, extra);
      if (status != LUA_OK) return 0;
    } else if (option == 'W') {
      lua_warning(L, "@on", 0);
    }
  }
  return 1;
}

/* Everything runs here, under lua_pcall, so that even an error opening flow is reported. */
static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  int script = argc, args = collect_args(argv, argc, &script);
  int optlim = script > 0 ? script : argc;
  if (args == HAS_ERROR) {
    print_usage(argv[script]);
    return 0;
  }
  if (args & HAS_NOENV) { /* libraries ignore LUA_PATH and friends */
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
  }
  luaL_openlibs(L);
  luaL_requiref(L, "flow", luaopen_flow, 1);
  lua_pop(L, 1);
  flow_repl_init(L);
  if (args & HAS_V) print_version(L);
  create_arg_table(L, argv, argc, script);
  if (!(args & HAS_NOENV) && handle_luainit(L) != LUA_OK) return 0;
  if (!run_args(L, argv, optlim)) return 0;
  if (script < argc && handle_script(L, argv + script) != LUA_OK) return 0;
  if ((args & HAS_I) || (script == argc && !(args & (HAS_E | HAS_V)))) flow_repl_run(L);
  lua_pushboolean(L, 1);
  return 1;
}

/* ---- OpenMP's wait policy ------------------------------------------------------------------- */

/* libgomp's idle threads spin about 300000 times (~3 ms) before they sleep, after every parallel
 * region. Where the cores are shared with other work, a spinning thread holds a core that the
 * master, or another process, needs. flowlua's default, where the user set neither
 * OMP_WAIT_POLICY nor GOMP_SPINCOUNT, is a short spin of 1000 (~10 us; the spin libgomp itself uses
 * under OMP_WAIT_POLICY=active once threads outnumber cores): it catches the next region when regions follow each other closely,
 * and otherwise sleeps at once. GPT step at 2 threads on a 2-core machine whose cores other
 * tenants kept busy (scripts/bench/threads.sh, four runs of 3-5 rounds), median ms and least
 * process CPU ms per step: spin 1000 199-366 and 165-173; passive (no spin) 238-312 and 149-188;
 * spin 10000 365-419 and 202-270; libgomp's default 796-1529 and 465-608, far slower than 1 thread
 * (147-166 ms CPU under every setting). Spin 1000 and passive are within that machine's noise.
 * libgomp reads both variables once, in its constructor, before main. Setting one from the
 * executable's .preinit_array does not work with glibc: environ is still NULL there, and libc's
 * own initialisation, which runs next, points environ back at the kernel's array, dropping the
 * setenv. So flowlua defines getenv (exported, like every symbol of flowlua: libraries bind to it
 * ahead of libc's): a plain lookup in environ, as glibc's, that answers GOMP_SPINCOUNT with the
 * default where neither variable is set. Nothing is added to the environment, so other programs
 * flowlua starts keep libgomp's own default (a flowlua child applies this one again). The flow.so
 * module cannot do this: the host process's libgomp is up before it loads. */
#define FLOW_OMP_SPINCOUNT "1000"

extern char **environ; /* POSIX's, declared by unistd.h only under _GNU_SOURCE */

static char *env_lookup(const char *name) {
  size_t n = strlen(name);
  for (char **e = environ; e && *e; e++)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  return NULL;
}

__attribute__((visibility("default"))) char *getenv(const char *name) {
  char *v = env_lookup(name);
  if (!v && strcmp(name, "GOMP_SPINCOUNT") == 0 && !env_lookup("OMP_WAIT_POLICY")) return (char *)FLOW_OMP_SPINCOUNT;
  return v;
}

int main(int argc, char **argv) {
  if (argv[0] && argv[0][0]) progname = argv[0];
  int ranks = take_ranks(&argc, argv);
  if (ranks < 0) return EXIT_FAILURE;
  if (ranks > 0 && flow_comm_launch_local(ranks, progname) != 0) { /* returns in each rank */
    fprintf(stderr, "%s: %s\n", progname, flow_error_get());
    return EXIT_FAILURE;
  }
  static small_pool pool;
  static warn_state warn;
  lua_State *L = lua_newstate(lua_alloc, &pool);
  if (!L) {
    fprintf(stderr, "%s: cannot create Lua state\n", progname);
    return EXIT_FAILURE;
  }
  lua_atpanic(L, panic);
  lua_setwarnf(L, warnf, &warn);
  /* Eager code makes many short-lived tensors: generational GC frees them in minor collections
   * (4x less overhead per small op than incremental mode). flowlua's own choice, as lua5.4's;
   * the module leaves a host interpreter's GC mode alone. */
  lua_gc(L, LUA_GCGEN, 0, 0);
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  int status = lua_pcall(L, 2, 1, 0);
  int ok = lua_toboolean(L, -1);
  report(L, status);
  /* An uncaught error on one rank ends the whole job now: closing the state would finalize MPI,
   * which waits for peers that may be blocked in a collective this rank never joins. */
  if (!ok || status != LUA_OK) flow_comm_abort(EXIT_FAILURE);
  lua_close(L);
  pool_free(&pool);
  return ok && status == LUA_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
