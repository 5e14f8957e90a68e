/* Lua bindings for the actor layer: flow._actor_chain, a chain of synthetic actors run on the
 * actor runtime, for the specs (spec/actor_spec.lua) and the benchmark (scripts/bench/actor.lua). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../actor/runtime.h"
#include "../core/error.h"
#include "bind.h"

#define CHAIN_FN "_actor_chain"

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------------
 * The chain: task i produces register i (read by task i+1). Each slot holds the piece number its
 * producer wrote, so a consumer can tell whether it reads what was meant for it: a slot
 * overwritten before it was read (back-pressure broken) or read before written shows up.
 * ------------------------------------------------------------------------------------------- */

typedef struct chain chain;

typedef struct chain_task {
  chain *c;
  int id;
  int64_t work_ns, sleep_ns; /* busy-wait, then sleep, per act */
  /* Written by the task's own stream thread only; read after the run. */
  int64_t acts, next_piece;
  bool in_order, data_ok;
} chain_task;

struct chain {
  int ntasks, register_num;
  int64_t npieces;
  int fail_task;       /* -1: none */
  int64_t fail_piece;
  bool inject;         /* this run fails at (fail_task, fail_piece) */
  int64_t *slot;       /* [ntasks][register_num]: the piece held by each slot */
  unsigned char *saw;  /* [ntasks][npieces]: the act got failed=true (when fail_task >= 0) */
  chain_task *tasks;
};

static int chain_act(void *ctx, int64_t piece, const int *in_slot, const int *out_slot, bool failed) {
  chain_task *t = ctx;
  chain *c = t->c;
  if (piece != t->next_piece) t->in_order = false;
  t->next_piece = piece + 1;
  t->acts++;
  if (c->saw && failed) c->saw[(int64_t)t->id * c->npieces + piece] = 1;
  if (c->inject && t->id == c->fail_task && piece == c->fail_piece)
    return flow_error_set("injected failure at piece %lld", (long long)piece);
  if (failed) return 0; /* a compute task skips its work once the run has failed */
  if (t->id > 0 && c->slot[(int64_t)(t->id - 1) * c->register_num + in_slot[0]] != piece) t->data_ok = false;
  if (t->work_ns)
    for (int64_t t0 = now_ns(); now_ns() - t0 < t->work_ns;) {
    }
  if (t->sleep_ns) nanosleep(&(struct timespec){t->sleep_ns / 1000000000, t->sleep_ns % 1000000000}, NULL);
  if (t->id + 1 < c->ntasks) c->slot[(int64_t)t->id * c->register_num + out_slot[0]] = piece;
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------------------------- */

typedef struct chain_opts {
  lua_Integer tasks, streams, register_num, pieces, runs, fail_task, fail_piece;
  bool roundrobin, trace;
} chain_opts;

static const char *const chain_keys[] = {"tasks", "streams", "layout", "register_num", "pieces",
                                         "work_us", "sleep_us", "fail_at", "trace", "runs", NULL};

/* opts[key] at table idx as an integer in [lo, hi], or def when absent. */
static lua_Integer opt_int(lua_State *L, int idx, const char *key, lua_Integer def, lua_Integer lo, lua_Integer hi) {
  lua_getfield(L, idx, key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return def;
  }
  int ok;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  if (!ok || v < lo || v > hi)
    luaL_error(L, CHAIN_FN ": %s must be an integer in [%I, %I] (got %s)", key, lo, hi, luaL_tolstring(L, -1, NULL));
  lua_pop(L, 1);
  return v;
}

/* Every key of the table at idx must be in keys: a misspelt option is an error, not a default. */
static void check_keys(lua_State *L, int idx, const char *const *keys, const char *what) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    int i = 0;
    while (k && keys[i] && strcmp(keys[i], k)) i++;
    if (!k || !keys[i]) luaL_error(L, CHAIN_FN ": unknown %s '%s'", what, luaL_tolstring(L, -1, NULL));
  }
}

/* work_us (busy-wait) or sleep_us: one number for every task, or a list with one per task. */
static void opt_us(lua_State *L, int idx, bool sleep, chain_task *tasks, int ntasks) {
  const char *key = sleep ? "sleep_us" : "work_us";
  lua_getfield(L, idx, key);
  int w = lua_gettop(L);
  for (int i = 0; i < ntasks; i++) {
    if (lua_istable(L, w)) {
      if (lua_rawlen(L, w) != (size_t)ntasks)
        luaL_error(L, CHAIN_FN ": %s as a list needs one entry per task (%d, got %d)", key, ntasks,
                   (int)lua_rawlen(L, w));
      lua_rawgeti(L, w, i + 1);
    } else {
      lua_pushvalue(L, w);
    }
    if (!lua_isnil(L, -1) && (!lua_isnumber(L, -1) || lua_tonumber(L, -1) < 0))
      luaL_error(L, CHAIN_FN ": %s must be a number >= 0 or a list of them (got %s)", key, luaL_tolstring(L, -1, NULL));
    int64_t ns = (int64_t)(lua_tonumber(L, -1) * 1e3);
    *(sleep ? &tasks[i].sleep_ns : &tasks[i].work_ns) = ns;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

static void parse_opts(lua_State *L, chain_opts *o) {
  luaL_checktype(L, 1, LUA_TTABLE);
  check_keys(L, 1, chain_keys, "option");
  o->tasks = opt_int(L, 1, "tasks", 1, 1, 1 << 20);
  o->streams = opt_int(L, 1, "streams", 1, 1, 256);
  o->register_num = opt_int(L, 1, "register_num", 1, 1, 1 << 16);
  o->pieces = opt_int(L, 1, "pieces", 1, 0, (lua_Integer)1 << 40);
  o->runs = opt_int(L, 1, "runs", 1, 1, 1000);
  lua_getfield(L, 1, "layout");
  const char *layout = lua_isnil(L, -1) ? "blocks" : lua_tostring(L, -1);
  if (!layout || (strcmp(layout, "blocks") && strcmp(layout, "roundrobin")))
    luaL_error(L, CHAIN_FN ": layout must be \"blocks\" or \"roundrobin\" (got %s)", luaL_tolstring(L, -1, NULL));
  o->roundrobin = !strcmp(layout, "roundrobin");
  lua_pop(L, 1);
  lua_getfield(L, 1, "trace");
  o->trace = lua_toboolean(L, -1);
  lua_pop(L, 1);
  o->fail_task = -1;
  o->fail_piece = -1;
  lua_getfield(L, 1, "fail_at");
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1)) luaL_error(L, CHAIN_FN ": fail_at must be a table {task =, piece =}");
    static const char *const keys[] = {"task", "piece", NULL};
    int f = lua_gettop(L);
    check_keys(L, f, keys, "fail_at key");
    o->fail_task = opt_int(L, f, "task", -1, 0, o->tasks - 1);
    o->fail_piece = opt_int(L, f, "piece", -1, 0, o->pieces - 1);
    if (o->fail_task < 0 || o->fail_piece < 0) luaL_error(L, CHAIN_FN ": fail_at needs both task and piece");
  }
  lua_pop(L, 1);
  if (o->trace && o->runs * o->tasks * o->pieces > (lua_Integer)1 << 26)
    luaL_error(L, CHAIN_FN ": too many acts to trace (%I)", o->runs * o->tasks * o->pieces);
}

/* ---------------------------------------------------------------------------------------------
 * flow._actor_chain(opts)
 * ------------------------------------------------------------------------------------------- */

typedef struct chain_run {
  double seconds;
  int64_t acts;
  bool in_order, data_ok, failed;
  char error[512];
} chain_run;

/* The runtime for the chain; NULL + flow error. */
static flow_rt *build(const chain_opts *o, chain *c) {
  flow_rt *rt = flow_rt_new((int)o->streams);
  if (!rt) return NULL;
  for (int i = 0; i < c->ntasks; i++) {
    int per = (int)((o->tasks + o->streams - 1) / o->streams);
    int stream = o->roundrobin ? i % (int)o->streams : i / per;
    char name[32];
    snprintf(name, sizeof name, "chain%d", i);
    if (flow_rt_add_task(rt, stream, name, chain_act, &c->tasks[i]) < 0 ||
        (i > 0 && flow_rt_add_consumer(rt, i - 1, i) < 0) ||
        (i + 1 < c->ntasks && flow_rt_add_register(rt, i, c->register_num) != i)) {
      flow_rt_free(rt);
      return NULL;
    }
  }
  return rt;
}

static void run_once(flow_rt *rt, chain *c, chain_run *r) {
  for (int i = 0; i < c->ntasks; i++) {
    chain_task *t = &c->tasks[i];
    t->acts = t->next_piece = 0;
    t->in_order = t->data_ok = true;
  }
  double t0 = (double)now_ns();
  int rc = flow_rt_run(rt, c->npieces);
  r->seconds = ((double)now_ns() - t0) * 1e-9;
  r->failed = rc != 0;
  if (rc) snprintf(r->error, sizeof r->error, "%s", flow_error_get());
  r->acts = 0;
  r->in_order = r->data_ok = true;
  for (int i = 0; i < c->ntasks; i++) {
    chain_task *t = &c->tasks[i];
    r->acts += t->acts;
    r->in_order = r->in_order && t->in_order && t->acts == c->npieces;
    r->data_ok = r->data_ok && t->data_ok;
  }
}

static void push_run(lua_State *L, const chain_run *r) {
  lua_pushnumber(L, r->seconds);
  lua_setfield(L, -2, "seconds");
  lua_pushinteger(L, r->acts);
  lua_setfield(L, -2, "acts");
  lua_pushboolean(L, r->in_order);
  lua_setfield(L, -2, "in_order");
  lua_pushboolean(L, r->data_ok);
  lua_setfield(L, -2, "data_ok");
  if (r->failed) {
    lua_pushstring(L, r->error);
    lua_setfield(L, -2, "error");
  }
}

static void set_int(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* All memory the run needs is Lua userdata, made before the runtime: nothing C-owned is alive
 * when a Lua error can be raised, except the runtime, which is freed before the tables are built. */
static int l_actor_chain(lua_State *L) {
  chain_opts o;
  parse_opts(L, &o);
  chain c = {.ntasks = (int)o.tasks, .register_num = (int)o.register_num, .npieces = o.pieces,
             .fail_task = (int)o.fail_task, .fail_piece = o.fail_piece};
  c.tasks = lua_newuserdatauv(L, (size_t)o.tasks * sizeof *c.tasks, 0);
  memset(c.tasks, 0, (size_t)o.tasks * sizeof *c.tasks);
  for (int i = 0; i < c.ntasks; i++) c.tasks[i] = (chain_task){.c = &c, .id = i};
  opt_us(L, 1, false, c.tasks, c.ntasks);
  opt_us(L, 1, true, c.tasks, c.ntasks);
  c.slot = lua_newuserdatauv(L, (size_t)(o.tasks * o.register_num) * sizeof *c.slot, 0);
  if (o.fail_task >= 0) {
    c.saw = lua_newuserdatauv(L, (size_t)(o.tasks * o.pieces), 0);
    memset(c.saw, 0, (size_t)(o.tasks * o.pieces));
  }
  chain_run *runs = lua_newuserdatauv(L, (size_t)o.runs * sizeof *runs, 0);
  size_t maxev = o.trace ? (size_t)(o.runs * o.tasks * o.pieces) : 0;
  flow_rt_event *ev = lua_newuserdatauv(L, maxev * sizeof *ev + 1, 0);

  flow_rt *rt = build(&o, &c);
  if (!rt) return flow_lua_error(L);
  flow_rt_trace(rt, o.trace);
  for (int r = 0; r < o.runs; r++) {
    c.inject = r == 0 && o.fail_task >= 0;
    run_once(rt, &c, &runs[r]);
  }
  const flow_rt_event *rev;
  int nev = flow_rt_events(rt, &rev);
  if (nev) memcpy(ev, rev, (size_t)nev * sizeof *ev);
  flow_rt_free(rt);

  lua_createtable(L, 0, 10);
  push_run(L, &runs[0]);
  lua_createtable(L, (int)o.runs, 0);
  for (int r = 0; r < o.runs; r++) {
    lua_createtable(L, 0, 5);
    push_run(L, &runs[r]);
    lua_rawseti(L, -2, r + 1);
  }
  lua_setfield(L, -2, "runs");
  if (o.trace) {
    lua_createtable(L, nev, 0);
    for (int i = 0; i < nev; i++) {
      lua_createtable(L, 0, 5);
      set_int(L, "task", ev[i].task);
      set_int(L, "piece", ev[i].piece);
      set_int(L, "stream", ev[i].stream);
      set_int(L, "t0", ev[i].t0_ns);
      set_int(L, "t1", ev[i].t1_ns);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "events");
  }
  if (c.saw) {
    lua_newtable(L);
    int n = 0;
    for (int i = 0; i < c.ntasks; i++)
      for (int64_t p = 0; p < c.npieces; p++)
        if (c.saw[(int64_t)i * c.npieces + p]) {
          lua_createtable(L, 0, 2);
          set_int(L, "task", i);
          set_int(L, "piece", p);
          lua_rawseti(L, -2, ++n);
        }
    lua_setfield(L, -2, "failed_acts");
  }
  return 1;
}

/* Called by luaopen_flow with the module table on top. */
void flow_lua_open_actor(lua_State *L) {
  static const luaL_Reg fns[] = {{CHAIN_FN, l_actor_chain}, {NULL, NULL}};
  flow_lua_register(L, fns, NULL);
}
