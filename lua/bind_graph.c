/* Lua bindings for lazy mode (flow._graph): a traced graph and its compiled plan as one userdata,
 * driven by flow.nn.Graph (lua/flow/graph.lua). */
#include <stdlib.h>
#include <string.h>

#include "../actor/plan.h"
#include "../core/comm.h"
#include "../ops/autograd.h"
#include "../ops/eager_global.h"
#include "bind.h"

#define GRAPH_MT "flow.LazyGraph"

typedef struct lgraph {
  flow_graph *g;
  flow_plan *plan;
  bool tracing;
} lgraph;

static lgraph *check(lua_State *L, const char *fn) {
  lgraph *x = luaL_checkudata(L, 1, GRAPH_MT);
  if (!x->g) luaL_error(L, "%s: the graph was freed", fn);
  return x;
}

static int g_gc(lua_State *L) {
  lgraph *x = luaL_checkudata(L, 1, GRAPH_MT);
  flow_plan_free(x->plan);
  if (x->g) flow_graph_end(x->g);
  flow_graph_free(x->g);
  x->plan = NULL;
  x->g = NULL;
  return 0;
}

static int l_new(lua_State *L) {
  lgraph *x = lua_newuserdatauv(L, sizeof *x, 0);
  memset(x, 0, sizeof *x);
  luaL_setmetatable(L, GRAPH_MT);
  if (!(x->g = flow_graph_new())) return flow_lua_error(L);
  return 1;
}

/* graph:begin([pieces]): start tracing; with pieces = M > 1 the inputs are unpacked into M
 * micro-batches and each run acts M pieces. */
static int g_begin(lua_State *L) {
  lgraph *x = check(L, "graph:begin");
  if (x->plan) return luaL_error(L, "graph:begin: the graph is already compiled");
  lua_Integer pieces = luaL_optinteger(L, 2, 1);
  if (pieces < 1 || pieces > (1 << 20)) return luaL_error(L, "graph:begin: pieces must be in 1 .. 2^20 (got %d)", (int)pieces);
  x->g->pieces = (int)pieces;
  if (flow_graph_begin(x->g) != 0) return flow_lua_error(L);
  x->tracing = true;
  return 0;
}

static int g_finish(lua_State *L) {
  lgraph *x = check(L, "graph:finish");
  flow_graph_end(x->g);
  x->tracing = false;
  return 0;
}

static int g_input(lua_State *L) {
  lgraph *x = check(L, "graph:input");
  return flow_lua_push(L, flow_graph_input(x->g, flow_lua_check(L, 2, "graph:input")));
}

static int g_output(lua_State *L) {
  lgraph *x = check(L, "graph:output");
  if (flow_graph_output(x->g, flow_lua_check(L, 2, "graph:output")) != 0) return flow_lua_error(L);
  return 0;
}

/* graph:acc(t) -> the sum of t over a run's pieces (gradient accumulation) */
static int g_acc(lua_State *L) {
  lgraph *x = check(L, "graph:acc");
  return flow_lua_push(L, flow_graph_acc(x->g, flow_lua_check(L, 2, "graph:acc")));
}

/* graph:phase("forward" | "backward" | "step"): the phase of the nodes traced next */
static int g_phase(lua_State *L) {
  static const char *const names[] = {"forward", "backward", "step", NULL};
  lgraph *x = check(L, "graph:phase");
  x->g->phase = luaL_checkoption(L, 2, NULL, names);
  return 0;
}

static int g_tag(lua_State *L) {
  lgraph *x = check(L, "graph:tag");
  x->g->tag = (int)luaL_checkinteger(L, 2);
  return 0;
}

/* graph:segment_begin() -> mark; graph:segment_end(mark, results...): a checkpointed forward */
static int g_segment_begin(lua_State *L) {
  lgraph *x = check(L, "graph:segment_begin");
  lua_pushinteger(L, flow_graph_segment_begin(x->g));
  return 1;
}

static int g_segment_end(lua_State *L) {
  lgraph *x = check(L, "graph:segment_end");
  int begin = (int)luaL_checkinteger(L, 2), n = lua_gettop(L) - 2, k = 0;
  flow_tensor **outs = lua_newuserdatauv(L, sizeof(flow_tensor *) * (size_t)(n ? n : 1), 0);
  for (int i = 0; i < n; i++) {
    flow_tensor *t = flow_lua_test(L, 3 + i);
    if (t) outs[k++] = t;
  }
  if (flow_graph_segment_end(x->g, begin, outs, k) != 0) return flow_lua_error(L);
  return 0;
}

static int g_compile(lua_State *L) {
  lgraph *x = check(L, "graph:compile");
  if (x->tracing) return luaL_error(L, "graph:compile: the graph is still being traced");
  flow_plan_options o = {.register_num = (int)luaL_optinteger(L, 2, 1), .no_fusion = lua_isboolean(L, 3) && !lua_toboolean(L, 3),
                         .buffer = (int)luaL_optinteger(L, 4, 1)};
  if (o.register_num < 1) return luaL_error(L, "graph:compile: register_num must be at least 1 (got %d)", o.register_num);
  if (!(x->plan = flow_plan_build(x->g, &o))) return flow_lua_error(L);
  return 0;
}

static flow_plan *plan_of(lua_State *L, const char *fn) {
  lgraph *x = check(L, fn);
  if (!x->plan) luaL_error(L, "%s: the graph is not compiled", fn);
  return x->plan;
}

static int g_feed(lua_State *L) {
  flow_plan *p = plan_of(L, "graph:feed");
  flow_plan_set_feed(p, (int)luaL_checkinteger(L, 2), luaL_checknumber(L, 3), luaL_checkinteger(L, 4));
  return 0;
}

/* graph:run({inputs...}) -> {outputs...} */
static int g_run(lua_State *L) {
  lgraph *x = check(L, "graph:run");
  flow_plan *p = plan_of(L, "graph:run");
  luaL_checktype(L, 2, LUA_TTABLE);
  int nin = x->g->ninputs, nout = x->g->noutputs;
  if ((int)luaL_len(L, 2) != nin) return luaL_error(L, "graph:run: expected %d inputs, got %d", nin, (int)luaL_len(L, 2));
  flow_tensor **in = lua_newuserdatauv(L, sizeof(flow_tensor *) * (size_t)(nin + nout + 1), 0);
  for (int i = 0; i < nin; i++) {
    lua_geti(L, 2, i + 1);
    in[i] = flow_lua_check(L, -1, "graph:run");
    lua_pop(L, 1);
  }
  flow_tensor **out = in + nin;
  if (flow_plan_run(p, in, out) != 0) return flow_lua_error(L);
  lua_createtable(L, nout, 0);
  for (int i = 0; i < nout; i++) {
    flow_lua_push(L, out[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int g_dot(lua_State *L) {
  char *s = flow_plan_dot(plan_of(L, "graph:dot"));
  lua_pushstring(L, s ? s : "");
  free(s);
  return 1;
}

static int g_trace(lua_State *L) {
  flow_plan_trace(plan_of(L, "graph:trace"), lua_toboolean(L, 2));
  return 0;
}

static int g_events(lua_State *L) {
  char *s = flow_plan_trace_events(plan_of(L, "graph:events"), flow_comm_rank());
  lua_pushstring(L, s ? s : "");
  free(s);
  return 1;
}

static int g_memory(lua_State *L) {
  flow_plan_memory m;
  flow_plan_memory_of(plan_of(L, "graph:memory"), &m);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, m.arena_bytes); lua_setfield(L, -2, "arena");
  lua_pushinteger(L, m.unpacked_bytes); lua_setfield(L, -2, "unpacked");
  lua_pushinteger(L, m.arena_bound); lua_setfield(L, -2, "bound");
  lua_pushinteger(L, m.dedicated_bytes); lua_setfield(L, -2, "dedicated");
  lua_pushinteger(L, m.captured_bytes); lua_setfield(L, -2, "captured");
  lua_pushinteger(L, m.arena_bytes + m.dedicated_bytes + m.captured_bytes); lua_setfield(L, -2, "planned");
  lua_pushinteger(L, m.measured_peak); lua_setfield(L, -2, "measured_peak");
  return 1;
}

/* graph:stats() -> {nodes, live, boxings, fused, recomputed, repeated, tasks = {compute, collective, copy, ...}} */
static int g_stats(lua_State *L) {
  lgraph *x = check(L, "graph:stats");
  int boxes = 0, live = 0;
  for (int n = 0; n < x->g->nnodes; n++) {
    live += x->g->nodes[n].live;
    boxes += x->g->nodes[n].live && x->g->nodes[n].kind == FLOW_GNODE_BOX;
  }
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, x->g->nnodes); lua_setfield(L, -2, "nodes");
  lua_pushinteger(L, live); lua_setfield(L, -2, "live");
  lua_pushinteger(L, boxes); lua_setfield(L, -2, "boxings");
  if (x->plan) {
    lua_pushinteger(L, flow_plan_fused(x->plan)); lua_setfield(L, -2, "fused");
    lua_pushinteger(L, flow_plan_recomputed(x->plan)); lua_setfield(L, -2, "recomputed");
    lua_pushinteger(L, flow_plan_repeated(x->plan)); lua_setfield(L, -2, "repeated");
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, flow_plan_ntasks(x->plan, FLOW_STREAM_COMPUTE)); lua_setfield(L, -2, "compute");
    lua_pushinteger(L, flow_plan_ntasks(x->plan, FLOW_STREAM_COMM)); lua_setfield(L, -2, "collective");
    lua_pushinteger(L, flow_plan_ntasks(x->plan, FLOW_STREAM_COPY)); lua_setfield(L, -2, "copy");
    lua_pushinteger(L, flow_plan_ntasks(x->plan, FLOW_STREAM_COMPUTE_B)); lua_setfield(L, -2, "compute_backward");
    lua_pushinteger(L, flow_plan_ntasks(x->plan, FLOW_STREAM_COMM_B)); lua_setfield(L, -2, "collective_backward");
    lua_setfield(L, -2, "tasks");
  }
  return 1;
}

/* Bytes held by live storages of the cpu (and the high-water mark), for eager-vs-graph measures. */
static int l_memory(lua_State *L) {
  int64_t use, peak;
  flow_mem_stats_total(&use, &peak);
  if (lua_toboolean(L, 1))
    for (int d = 0; d < FLOW_NDEVTYPES; d++) flow_mem_reset_peak((flow_devtype)d);
  lua_pushinteger(L, use);
  lua_pushinteger(L, peak);
  return 2;
}

/* flow._allgather_strings(s) -> {rank 0's s, rank 1's, ...} over the world (trace merging). */
static int l_allgather_strings(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  flow_comm *c = flow_comm_world();
  int size = c->size;
  int64_t mine = (int64_t)n, *lens = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)size, 0);
  size_t *counts = lua_newuserdatauv(L, sizeof(size_t) * 2 * (size_t)size, 0), *displs = counts + size;
  for (int q = 0; q < size; q++) { counts[q] = 1; displs[q] = (size_t)q; }
  if (c->ops->allgatherv(c, &mine, 1, lens, counts, displs, FLOW_I64) != 0) return flow_lua_error(L);
  size_t total = 0;
  for (int q = 0; q < size; q++) { counts[q] = (size_t)lens[q]; displs[q] = total; total += (size_t)lens[q]; }
  char *all = lua_newuserdatauv(L, total ? total : 1, 0);
  if (c->ops->allgatherv(c, s, n, all, counts, displs, FLOW_U8) != 0) return flow_lua_error(L);
  lua_createtable(L, size, 0);
  for (int q = 0; q < size; q++) {
    lua_pushlstring(L, all + displs[q], counts[q]);
    lua_rawseti(L, -2, q + 1);
  }
  return 1;
}

/* flow._seed_scale(s) -> previous: the implicit backward seed's scale (see autograd.h). */
static int l_seed_scale(lua_State *L) {
  lua_pushnumber(L, flow_autograd_set_seed_scale(luaL_checknumber(L, 1)));
  return 1;
}

/* flow._set_timeout(seconds) -> previous: how long a transfer waits for its peers (FLOW_TIMEOUT). */
static int l_set_timeout(lua_State *L) {
  double prev = flow_comm_timeout();
  flow_comm_set_timeout(luaL_checknumber(L, 1));
  lua_pushnumber(L, prev);
  return 1;
}

/* flow._graph.tracing(): is a graph being traced on this thread (ops record instead of run)? */
static int l_tracing(lua_State *L) {
  lua_pushboolean(L, flow_lazy_tracing());
  return 1;
}

/* flow._defer_backward(on) -> previous; flow._run_deferred_backward() (see autograd.h). */
static int l_defer_backward(lua_State *L) {
  lua_pushboolean(L, flow_autograd_defer(lua_toboolean(L, 1)));
  return 1;
}

static int l_run_deferred_backward(lua_State *L) {
  if (flow_autograd_run_deferred() != 0) return flow_lua_error(L);
  return 0;
}

/* flow._partial_leaf_grads(on) -> previous (see eager_global.h). */
static int l_partial_leaf_grads(lua_State *L) {
  lua_pushboolean(L, flow_global_set_partial_leaf_grads(lua_toboolean(L, 1)));
  return 1;
}

/* flow._split_ways(t, axis) -> how many shards axis is split into over t's mesh (1: not split). */
static int l_split_ways(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "_split_ways");
  lua_Integer axis = luaL_checkinteger(L, 2);
  const flow_global *g = flow_global_of(t);
  int ways = 1;
  for (int m = 0; g && m < g->sbp.n; m++)
    if (g->sbp.v[m].kind == FLOW_SBP_S && g->sbp.v[m].axis == axis) ways *= g->placement->shape[m];
  lua_pushinteger(L, ways);
  return 1;
}

void flow_lua_open_graph(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"begin", g_begin}, {"finish", g_finish}, {"input", g_input}, {"output", g_output}, {"tag", g_tag}, {"acc", g_acc}, {"phase", g_phase},
    {"segment_begin", g_segment_begin}, {"segment_end", g_segment_end}, {"compile", g_compile}, {"feed", g_feed},
    {"run", g_run}, {"dot", g_dot}, {"trace", g_trace}, {"events", g_events}, {"memory", g_memory},
    {"stats", g_stats}, {"free", g_gc}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", g_gc}, {"__close", g_gc}, {NULL, NULL}};
  static const luaL_Reg graph[] = {{"new", l_new}, {"memory", l_memory}, {"tracing", l_tracing}, {NULL, NULL}};
  /* flow._*: the hooks nn.Graph and the specs use */
  static const luaL_Reg hooks[] = {
    {"_allgather_strings", l_allgather_strings}, {"_set_timeout", l_set_timeout}, {"_seed_scale", l_seed_scale},
    {"_defer_backward", l_defer_backward}, {"_run_deferred_backward", l_run_deferred_backward},
    {"_partial_leaf_grads", l_partial_leaf_grads}, {"_split_ways", l_split_ways}, {NULL, NULL}};
  luaL_newmetatable(L, GRAPH_MT);
  luaL_setfuncs(L, meta, 0);
  luaL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, graph);
  lua_setfield(L, -2, "_graph");
  luaL_setfuncs(L, hooks, 0);
}
