/* The flowlua REPL: readline editing with history and tab completion, expressions print their
 * values, incomplete chunks continue on a ">>" prompt, Ctrl-C interrupts a running chunk (or
 * clears the line at the prompt). Under mpirun every rank runs what rank 0 reads. */
#include "repl.h"

#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <pthread.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "../core/comm.h"
#include "../ops/eager_global.h"
#include "bind.h"

#define HISTORY_FILE ".flowlua_history"
#define HISTORY_LINES 1000

static lua_State *repl_L;               /* the state Ctrl-C interrupts, and completion reads */
static volatile sig_atomic_t sigint_at_prompt;
static int rank = 0, nranks = 1;        /* the world (core/comm.h): MPI's under mpirun */

void flow_repl_init(lua_State *L) {
  lua_pushglobaltable(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_getfield(L, -1, "flow");
  lua_setfield(L, -3, "flow");
  lua_pop(L, 2);
}

void flow_repl_print_error(lua_State *L, const char *prog, const char *msg) {
  (void)L;
  fflush(stdout);
  fprintf(stderr, "%s: %s\n", prog, msg);
  fflush(stderr);
}

/* ---- Ctrl-C ------------------------------------------------------------------------------- */

/* While Lua runs, SIGINT sets a hook that raises at the next call, return or count step (as
 * lua.c does: a signal handler may not touch the Lua state beyond lua_sethook). The handler then
 * falls back to the default, so a second Ctrl-C kills a run stuck in a long C call. */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted");
}

static pid_t *peers;  /* rank 0: the other ranks on this node, which Ctrl-C reaches through it */
static int npeers;

static void on_sigint_running(int sig) {
  signal(sig, SIG_DFL);
  lua_sethook(repl_L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  flow_comm_set_interrupted(1); /* a wait on peers in C gives up too */
  for (int i = 0; i < npeers; i++) kill(peers[i], SIGINT);
}

static void on_sigint_prompt(int sig) {
  (void)sig;
  sigint_at_prompt = 1;
}

static void set_sigint(void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

/* ---- tab completion ----------------------------------------------------------------------- */

static const char *const keywords[] = {"and", "break", "do", "else", "elseif", "end", "false", "for",
                                       "function", "goto", "if", "in", "local", "nil", "not", "or",
                                       "repeat", "return", "then", "true", "until", "while", NULL};

typedef struct completions {
  char **items;
  int n, cap;
} completions;

static void add_completion(completions *c, const char *prefix, size_t plen, const char *key) {
  for (int i = 0; i < c->n; i++)
    if (strcmp(c->items[i] + plen, key) == 0) return;
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 32;
    char **items = realloc(c->items, (size_t)cap * sizeof *items);
    if (!items) return;
    c->items = items;
    c->cap = cap;
  }
  char *s = malloc(plen + strlen(key) + 1);
  if (!s) return;
  memcpy(s, prefix, plen);
  strcpy(s + plen, key);
  c->items[c->n++] = s;
}

static int is_ident(const char *s) {
  if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z'))) return 0;
  for (; *s; s++)
    if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9'))) return 0;
  return 1;
}

/* Add the string keys of the table at idx starting with `part` (functions only when asked). */
static void table_keys(lua_State *L, int idx, const char *part, int functions_only, completions *c,
                       const char *prefix, size_t plen) {
  size_t n = strlen(part);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) == LUA_TSTRING) {
      const char *k = lua_tostring(L, -2);
      if (strncmp(k, part, n) == 0 && is_ident(k) && (!functions_only || lua_isfunction(L, -1)))
        add_completion(c, prefix, plen, k);
    }
    lua_pop(L, 1);
  }
}

/* Keys reachable from the value at idx: a tensor's methods (and fields after "."); else its own
 * keys (a table), then its metatable's __index chain while that is a table (objects, classes). */
static void value_keys(lua_State *L, int idx, const char *part, int functions_only, completions *c,
                       const char *prefix, size_t plen) {
  static const char *const tensor_fields[] = {"dtype", "device", "requires_grad", "grad", "is_leaf",
                                              "is_global", "ndim", "placement", "sbp", NULL};
  if (luaL_testudata(L, idx, FLOW_TENSOR_MT)) {
    flow_lua_push_methods(L);
    table_keys(L, lua_gettop(L), part, functions_only, c, prefix, plen);
    for (int i = 0; !functions_only && tensor_fields[i]; i++)
      if (strncmp(tensor_fields[i], part, strlen(part)) == 0) add_completion(c, prefix, plen, tensor_fields[i]);
    lua_settop(L, idx);
    return;
  }
  lua_pushvalue(L, idx);
  for (int depth = 0; depth < 8; depth++) {
    if (lua_istable(L, -1)) table_keys(L, lua_gettop(L), part, functions_only, c, prefix, plen);
    if (luaL_getmetafield(L, -1, "__index") == LUA_TNIL) break;
    if (!lua_istable(L, -1)) break;
    lua_remove(L, -2);
  }
  lua_settop(L, idx);
}

/* Protected part of completion: resolve the dotted path, list candidates. Arguments: the word
 * (light userdata), the completions (light userdata). */
static int collect(lua_State *L) {
  const char *word = lua_touserdata(L, 1);
  completions *c = lua_touserdata(L, 2);
  const char *sep = NULL;
  for (const char *p = word; *p; p++)
    if (*p == '.' || *p == ':') sep = p;
  lua_settop(L, 0);
  if (!sep) {
    lua_pushglobaltable(L);
    table_keys(L, 1, word, 0, c, "", 0);
    for (int i = 0; keywords[i]; i++)
      if (strncmp(keywords[i], word, strlen(word)) == 0) add_completion(c, "", 0, keywords[i]);
    return 0;
  }
  lua_pushglobaltable(L);
  const char *seg = word;
  while (seg < sep) {
    const char *end = seg;
    while (end < sep && *end != '.' && *end != ':') end++;
    if (!lua_istable(L, -1) && !lua_isuserdata(L, -1)) return 0;
    lua_pushlstring(L, seg, (size_t)(end - seg));
    lua_gettable(L, -2); /* may run __index (flow.nn loads here): we are protected */
    lua_remove(L, -2);
    seg = end + 1;
  }
  if (lua_isnil(L, -1)) return 0;
  value_keys(L, lua_gettop(L), sep + 1, *sep == ':', c, word, (size_t)(sep + 1 - word));
  return 0;
}

static completions current;
static int current_next;

static char *next_completion(const char *text, int state) {
  (void)text;
  if (state == 0) current_next = 0;
  return current_next < current.n ? strdup(current.items[current_next++]) : NULL;
}

static char **complete(const char *text, int start, int end) {
  (void)start; (void)end;
  rl_attempted_completion_over = 1; /* never fall back to file names */
  for (int i = 0; i < current.n; i++) free(current.items[i]);
  current.n = 0;
  lua_State *L = repl_L;
  int top = lua_gettop(L);
  lua_pushcfunction(L, collect);
  lua_pushlightuserdata(L, (void *)text);
  lua_pushlightuserdata(L, &current);
  lua_pcall(L, 2, 0, 0);
  lua_settop(L, top);
  rl_completion_append_character = '\0';
  return current.n ? rl_completion_matches(text, next_completion) : NULL;
}

/* ---- reading lines ------------------------------------------------------------------------ */

enum { LINE_OK, LINE_EOF, LINE_CANCEL };

static char *cb_line;
static int cb_done;

static void on_line(char *line) {
  cb_line = line;
  cb_done = 1;
  rl_callback_handler_remove();
}

/* readline in callback mode, so that Ctrl-C (which only sets a flag) can clear the line. */
static int read_tty(const char *prompt, char **line) {
  cb_done = 0;
  cb_line = NULL;
  sigint_at_prompt = 0;
  set_sigint(on_sigint_prompt);
  rl_callback_handler_install(prompt, on_line);
  while (!cb_done) {
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(fileno(rl_instream), &fds);
    int r = select(fileno(rl_instream) + 1, &fds, NULL, NULL, NULL);
    if (sigint_at_prompt) {
      rl_free_line_state();
      rl_callback_sigcleanup();
      rl_callback_handler_remove();
      fputs("\n", stdout);
      fflush(stdout);
      return LINE_CANCEL;
    }
    if (r < 0 && errno != EINTR) break;
    if (r > 0) rl_callback_read_char();
  }
  *line = cb_line;
  return cb_line ? LINE_OK : LINE_EOF;
}

static int read_pipe(char **line) {
  size_t cap = 0;
  *line = NULL;
  ssize_t n = getline(line, &cap, stdin);
  if (n < 0) { free(*line); *line = NULL; return LINE_EOF; }
  if (n > 0 && (*line)[n - 1] == '\n') (*line)[n - 1] = 0;
  return LINE_OK;
}

/* Rank 0 reads; in a multi-rank world the line (or EOF / cancel) goes to every rank: a length
 * (-1 EOF, -2 cancel), then the bytes. A failed broadcast ends the session like EOF. */
static int next_line(int tty, const char *prompt, char **line) {
  int kind = LINE_OK;
  *line = NULL;
  if (rank == 0) kind = tty ? read_tty(prompt, line) : read_pipe(line);
  if (nranks == 1) return kind;
  long long len = kind == LINE_EOF ? -1 : kind == LINE_CANCEL ? -2 : rank == 0 ? (long long)strlen(*line) : 0;
  if (flow_comm_broadcast_bytes(flow_comm_world(), line, &len, 0) != 0) {
    fprintf(stderr, "flowlua: [rank %d] %s\n", rank, flow_error_get());
    free(*line);
    *line = NULL;
    return LINE_EOF;
  }
  if (len < 0) return len == -1 ? LINE_EOF : LINE_CANCEL;
  return LINE_OK;
}

/* ---- evaluation --------------------------------------------------------------------------- */

static int incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t n;
  const char *msg = lua_tolstring(L, -1, &n);
  return n >= 5 && strcmp(msg + n - 5, "<eof>") == 0;
}

enum { CHUNK_OK, CHUNK_INCOMPLETE, CHUNK_ERROR };

/* Compile code as "return <code>" (an expression: its values print), else as a statement.
 * Incomplete when either form ran out of input ("1 +" and "for i = 1, 3 do" both wait for
 * more). Leaves the function, or the syntax error of the statement form, on top. */
static int compile(lua_State *L, const char *code) {
  const char *ret = lua_pushfstring(L, "return %s", code);
  int status = luaL_loadbuffer(L, ret, strlen(ret), "=stdin");
  lua_remove(L, -2);
  if (status == LUA_OK) return CHUNK_OK;
  int more = incomplete(L, status);
  lua_pop(L, 1);
  status = luaL_loadbuffer(L, code, strlen(code), "=stdin");
  if (status == LUA_OK) return CHUNK_OK;
  return more || incomplete(L, status) ? CHUNK_INCOMPLETE : CHUNK_ERROR;
}

/* Turn the results above base into one tab-separated string (every rank does this: printing a
 * global tensor gathers its values from its peers, as print does). Leaves the string, or an error
 * message, on top. */
static int results_text(lua_State *L) {
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 1; i <= n; i++) {
    lua_getfield(L, LUA_REGISTRYINDEX, "flow.print_text");
    if (lua_isfunction(L, -1)) {
      lua_pushvalue(L, i);
      lua_call(L, 1, 1);
    } else {
      lua_pop(L, 1);
      luaL_tolstring(L, i, NULL);
    }
    luaL_addvalue(&b);
    if (i < n) luaL_addchar(&b, '\t');
  }
  luaL_pushresult(&b);
  return 1;
}

/* Print errors: alone, as "flowlua: msg"; in a multi-rank world, rank 0 prints every failing
 * rank's message as "[rank r,s] msg" (ranks with the same message share a line). */
static void report(lua_State *L, const char *msg) {
  if (nranks == 1) {
    if (msg) flow_repl_print_error(L, "flowlua", msg);
    return;
  }
  char own[32], *all;
  int skip = snprintf(own, sizeof own, "[rank %d] ", rank); /* the report names the rank */
  if (msg && strncmp(msg, own, (size_t)skip) == 0) msg += skip;
  size_t *lens, *displs = calloc((size_t)nranks, sizeof *displs); /* a message's length counts its NUL */
  if (!displs || flow_comm_allgather_bytes(flow_comm_world(), msg ? msg : "", msg ? strlen(msg) + 1 : 0, &all, &lens) != 0) {
    fprintf(stderr, "flowlua: [rank %d] %s\n", rank, msg ? msg : displs ? flow_error_get() : "out of memory");
    free(displs);
    return;
  }
  for (int r = 1; r < nranks; r++) displs[r] = displs[r - 1] + lens[r - 1];
  if (rank == 0) {
    fflush(stdout);
    for (int r = 0; r < nranks; r++) {
      if (!lens[r]) continue;
      int seen = 0;
      for (int q = 0; q < r && !seen; q++) seen = lens[q] && strcmp(all + displs[q], all + displs[r]) == 0;
      if (seen) continue;
      /* one write per report: mpirun forwards each write, and pieces would interleave with stdout */
      char *line = NULL;
      size_t n = 0;
      FILE *f = open_memstream(&line, &n);
      if (!f) continue;
      fprintf(f, "[rank %d", r);
      for (int q = r + 1; q < nranks; q++)
        if (lens[q] && strcmp(all + displs[q], all + displs[r]) == 0) fprintf(f, ",%d", q);
      fprintf(f, "] %s\n", all + displs[r]);
      fclose(f);
      fwrite(line, 1, n, stderr);
      free(line);
    }
    fflush(stderr);
  }
  free(lens);
  free(displs);
  free(all);
}

/* The end of a line in a multi-rank world: every rank waits here until all have finished the line,
 * so that a line failing on one rank fails at once on the others, instead of after FLOW_TIMEOUT.
 * A rank whose line failed sends its message down the world's failure channel: a rank still at a
 * handshake over the world raises with it ("rank 1 failed: ..."); one whose handshake meets this
 * one's raises that the ranks disagree. Either way the others' lines fail and they come here too.
 * Each rank then repeats the handshake until every rank is at it (a verdict naming a failed rank,
 * or one still at a global op, means another round); the sequence numbers stay in step because a
 * failing rank's `fail` takes the place of the handshake it skipped. Returns an error to report on
 * this rank when the wait itself failed (a rank stopped or stuck: FLOW_TIMEOUT), else NULL. */
enum { LINE_END = -3 };
static const char *line_end(const char *failed) {
  flow_comm *w = flow_comm_world();
  if (nranks == 1 || !w) return NULL;
  if (failed) { /* ranks waiting elsewhere than on the world poll for the notice */
    flow_comm_notify_all(failed);
    w->ops->fail(w, "REPL line", failed);
  }
  bool someone_failed = failed;
  const char *err = NULL;
  for (;;) {
    long long lo, hi;
    flow_comm_forget_failure();
    if (w->ops->handshake(w, "the end of a REPL line", LINE_END, &lo, &hi) != 0) {
      if (flow_comm_failed_rank() >= 0) { someone_failed = true; continue; }
      err = flow_error_get();
      break;
    }
    if (lo == LINE_END && hi == LINE_END) break;
  }
  /* The line is over on every rank, and it failed somewhere, so every rank knows (a failing rank's
   * message reached all): the global ops it ran on some ranks only are void, and the next line
   * starts the agreement check afresh instead of failing on them again. */
  if (someone_failed) {
    flow_global_forget_all();
    if (!err && flow_comm_resync() != 0) err = flow_error_get();
  }
  flow_comm_notices_end();
  return err;
}

/* ---- a line that failed elsewhere ------------------------------------------------------------
 * While a line runs in a multi-rank world, a thread watches for another rank's notice that its line
 * failed (comm.h), every 20 ms, and then makes this rank's line raise at its next Lua step with
 * that rank's message, as Ctrl-C does (a hook; lua_sethook may be called asynchronously). So a
 * failure, or Ctrl-C on rank 0, ends the line on every rank, on any node, also where it computes
 * without waiting on a peer. */
static struct {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t stop;
  bool running, started;
} watcher = {.lock = PTHREAD_MUTEX_INITIALIZER, .stop = PTHREAD_COND_INITIALIZER};

static void notice_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  if (flow_comm_noticed(NULL, "REPL line") != 0) {
    lua_pushstring(L, flow_error_get()); /* "[rank r] ..." names where it failed: no position */
    lua_error(L);
  }
}

static void *watch(void *arg) {
  (void)arg;
  pthread_mutex_lock(&watcher.lock);
  while (watcher.running) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20000000;
    if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
    pthread_cond_timedwait(&watcher.stop, &watcher.lock, &until);
    if (!watcher.running) break;
    pthread_mutex_unlock(&watcher.lock);
    bool seen = flow_comm_noticed(NULL, "REPL line") != 0;
    pthread_mutex_lock(&watcher.lock);
    if (seen && watcher.running) {
      lua_sethook(repl_L, notice_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
      break;
    }
  }
  pthread_mutex_unlock(&watcher.lock);
  return NULL;
}

static void watch_start(void) {
  watcher.running = true;
  watcher.started = pthread_create(&watcher.thread, NULL, watch, NULL) == 0;
}

static void watch_stop(void) {
  if (!watcher.started) return;
  pthread_mutex_lock(&watcher.lock);
  watcher.running = false;
  pthread_cond_signal(&watcher.stop);
  pthread_mutex_unlock(&watcher.lock);
  pthread_join(watcher.thread, NULL);
  watcher.started = false;
}

/* Run the compiled chunk on top; print its values (rank 0) or the error (see report). */
static void run_chunk(lua_State *L) {
  static unsigned long long line_no; /* the same on every rank: lines are broadcast */
  int base = lua_gettop(L) - 1;
  if (nranks > 1) {
    flow_comm_notices_begin(++line_no);
    watch_start();
  }
  flow_comm_set_interrupted(0);
  set_sigint(on_sigint_running);
  int status = flow_main_pcall(L, 0, LUA_MULTRET);
  watch_stop();
  flow_comm_set_interrupted(0); /* the end of the line's handshakes must not give up */
  lua_sethook(L, NULL, 0, 0); /* the watcher's, if it came as the line ended */
  if (status == LUA_OK && lua_gettop(L) > base) {
    lua_pushcfunction(L, results_text);
    lua_insert(L, base + 1);
    status = lua_pcall(L, lua_gettop(L) - base - 1, 1, 0);
    if (status == LUA_OK && rank == 0) {
      fputs(lua_tostring(L, -1), stdout);
      fputs("\n", stdout);
    }
  }
  /* other ranks ignore a Ctrl-C that rank 0 passes on after they finished the line */
  set_sigint(rank == 0 ? SIG_DFL : SIG_IGN);
  lua_sethook(L, NULL, 0, 0);
  fflush(stdout);
  const char *msg = status == LUA_OK ? NULL : lua_tostring(L, -1) ? lua_tostring(L, -1) : "(error object is not a string)";
  const char *waited = line_end(msg);
  report(L, msg ? msg : waited);
  lua_settop(L, base);
}

/* "flowlua 0.1.0 (Lua 5.4.6) | build: CPU, MPI | world: 4 ranks | Ctrl-D exits", read from the
 * flow module so it says what this process loaded. */
static void banner(lua_State *L) {
  lua_getglobal(L, "flow");
  lua_getfield(L, -1, "__version");
  lua_getfield(L, -2, "_has_mpi");
  lua_getfield(L, -3, "cuda");
  lua_getfield(L, -1, "built");
  printf("flowlua %s (%s) | build: %s, %s | world: %d rank%s | Ctrl-D exits\n",
         lua_isstring(L, -4) ? lua_tostring(L, -4) : "?", LUA_RELEASE, lua_toboolean(L, -1) ? "CUDA" : "CPU",
         lua_toboolean(L, -3) ? "MPI" : "no MPI", nranks, nranks == 1 ? "" : "s");
  fflush(stdout);
  lua_pop(L, 5);
}

static void history_start(char *path, size_t n) {
  const char *home = getenv("HOME");
  path[0] = 0;
  if (!home) return;
  snprintf(path, n, "%s/%s", home, HISTORY_FILE);
  using_history();
  if (read_history(path) != 0) write_history(path); /* create it, so append_history works */
  history_truncate_file(path, HISTORY_LINES);
}

/* ---- the terminal under mpirun ------------------------------------------------------------- */

/* Whether file descriptor fd of process pid is the terminal `tty` (Linux's /proc; else no). */
static int proc_fd_is(pid_t pid, int fd, const struct stat *tty) {
  char path[64];
  struct stat st;
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
  return stat(path, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == tty->st_rdev;
}

static pid_t terminal_owner = -1; /* the foreground group to give the terminal back to */

/* Under mpirun, rank 0's stdin and stdout are pipes through mpirun. When mpirun itself reads and
 * writes a terminal (a person typing, not `... | mpirun`), rank 0 takes that terminal over: its
 * stdin and stdout become the terminal, for readline's editing, completion and history, and its
 * process group becomes the foreground one, so that mpirun stops forwarding keystrokes (Open MPI
 * reads stdin only in the foreground) and Ctrl-C reaches rank 0 alone, which interrupts the line
 * instead of mpirun ending the job. Returns whether it did. */
static int take_terminal(void) {
  pid_t launcher = getppid();
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/0", (int)launcher);
  int fd = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat tty;
  /* tcgetpgrp succeeds only on our controlling terminal: the one mpirun was started from */
  if (!isatty(fd) || tcgetpgrp(fd) < 0 || fstat(fd, &tty) != 0 || !proc_fd_is(launcher, 1, &tty)) {
    close(fd);
    return 0;
  }
  /* a background group changing the foreground gets SIGTTOU, which would stop it */
  void (*ttou)(int) = signal(SIGTTOU, SIG_IGN);
  terminal_owner = tcgetpgrp(fd);
  int ok = terminal_owner >= 0 && tcsetpgrp(fd, getpgrp()) == 0;
  signal(SIGTTOU, ttou);
  if (ok) {
    fflush(stdout);
    dup2(fd, 0);
    dup2(fd, 1);
    if (proc_fd_is(launcher, 2, &tty)) dup2(fd, 2);
  }
  close(fd);
  return ok;
}

/* Rank 0 learns the process ids of the ranks on its own node (same host name), to pass Ctrl-C
 * on to them at once. Ranks on other nodes learn of it from rank 0's notice that its line failed
 * ("interrupted"), which their watcher turns into the same interrupt (see watch). */
static void find_peers(void) {
  /* FLOW_REPL_FORWARD_SIGINT=0: reach them through the notices alone, as ranks on other nodes (for
   * testing that path on one machine) */
  const char *fwd = getenv("FLOW_REPL_FORWARD_SIGINT");
  bool forward = !(fwd && strcmp(fwd, "0") == 0);
  const flow_comm_proc *all = flow_comm_procs();
  if (all && rank == 0 && (peers = calloc((size_t)nranks, sizeof *peers)))
    for (int r = 1; r < nranks; r++)
      if (forward && all[r].host == all[0].host) peers[npeers++] = (pid_t)all[r].pid;
}

/* The foreground back to mpirun's group, so the shell gets its terminal back when mpirun ends. */
static void give_terminal_back(void) {
  if (terminal_owner < 0) return;
  void (*ttou)(int) = signal(SIGTTOU, SIG_IGN);
  tcsetpgrp(0, terminal_owner);
  signal(SIGTTOU, ttou);
  terminal_owner = -1;
}

void flow_repl_run(lua_State *L) {
  if (flow_comm_world()) {
    rank = flow_comm_rank();
    nranks = flow_comm_size();
  }
  repl_L = L;
  /* a wait on a peer gives up sooner than in a script: the user is there, waiting */
  if (!getenv("FLOW_TIMEOUT")) flow_comm_set_timeout(30);
  if (nranks > 1) {
    if (rank == 0 && !isatty(0)) take_terminal();
    if (rank != 0) set_sigint(SIG_IGN);
    find_peers();
  }
  int tty = rank == 0 && isatty(0);
  char history[4096] = "";
  if (tty) {
    rl_readline_name = "flowlua";
    rl_catch_signals = 0; /* SIGINT is ours: see read_tty */
    rl_attempted_completion_function = complete;
    rl_completer_word_break_characters = " \t\n\"\\'`@$><=;|&{}()[],+-*/%^~#";
    history_start(history, sizeof history);
    banner(L);
  }
  char *pending = NULL; /* an incomplete chunk waiting for more lines */
  for (;;) {
    char *line;
    int kind = next_line(tty, pending ? ">> " : "> ", &line);
    if (kind == LINE_EOF) {
      if (pending) { /* input ended inside a chunk: say what was missing */
        compile(L, pending);
        report(L, lua_tostring(L, -1));
        lua_pop(L, 1);
      }
      break;
    }
    if (kind == LINE_CANCEL) { free(pending); pending = NULL; continue; }
    char *code = line;
    if (pending) {
      size_t a = strlen(pending), b = strlen(line);
      code = malloc(a + b + 2);
      if (!code) abort();
      memcpy(code, pending, a);
      code[a] = '\n';
      memcpy(code + a + 1, line, b + 1);
      free(pending);
      free(line);
      pending = NULL;
    }
    int status = compile(L, code);
    if (status == CHUNK_INCOMPLETE) {
      lua_pop(L, 1);
      pending = code;
      continue;
    }
    if (tty && code[0]) {
      add_history(code);
      if (history[0]) append_history(1, history);
    }
    free(code);
    if (status == CHUNK_OK) run_chunk(L);
    else {
      report(L, lua_tostring(L, -1));
      lua_pop(L, 1);
    }
  }
  free(pending);
  for (int i = 0; i < current.n; i++) free(current.items[i]);
  free(current.items);
  current = (completions){0};
  if (tty) fputs("\n", stdout);
  fflush(stdout);
  give_terminal_back();
  free(peers);
  peers = NULL;
  npeers = 0;
}
