/* Lua bindings: global. Ranks (rank, world_size, barrier, print_all, rank-0 print), placements,
 * SBP values, to_global/to_local, explain, global creation and the registry hooks the tensor
 * bindings call for a global tensor's shape, fields and printing. The world is made when the
 * module opens (MPI only under a launcher or when asked: core/comm.c) and finalised when the Lua
 * state closes. */
#ifdef FLOW_HAVE_MPI
#include <mpi.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/comm.h"
#include "../core/nccl.h"
#include "../ops/autograd.h"
#include "../ops/create.h"
#include "../ops/elementwise.h"
#include "../ops/eager_global.h"
#include "../sbp/signature.h"
#include "bind.h"

#define PLACEMENT_MT "flow.Placement"
#define SBP_MT "flow.SBP"

/* ---- ranks --------------------------------------------------------------------------------------- */

/* init_mpi(): start MPI now (a singleton when no launcher made a world); idempotent. Returns the
 * world size. */
static int l_init_mpi(lua_State *L) {
  if (flow_comm_init_mpi() != 0) return flow_lua_error(L);
  lua_pushinteger(L, flow_comm_size());
  return 1;
}

/* mpi_running(): whether the world runs on MPI (false for a plain run: a world of one). */
static int l_mpi_running(lua_State *L) {
  lua_pushboolean(L, flow_comm_uses_mpi());
  return 1;
}

/* _program(): the path of the running program (/proc/self/exe), for jobs it starts of itself. */
static int l_program(lua_State *L) {
  char path[4096];
  ssize_t k = readlink("/proc/self/exe", path, sizeof path - 1);
  if (k <= 0) return luaL_error(L, "_program: cannot read /proc/self/exe");
  lua_pushlstring(L, path, (size_t)k);
  return 1;
}

static int l_rank(lua_State *L) { lua_pushinteger(L, flow_comm_rank()); return 1; }
static int l_world_size(lua_State *L) { lua_pushinteger(L, flow_comm_size()); return 1; }

static int l_barrier(lua_State *L) {
  flow_comm *w = flow_comm_world();
  if (w && w->ops->barrier(w) != 0) return flow_lua_error(L);
  return 0;
}

/* print_all(...): every rank's line, "[rank r] ...", printed by rank 0 in rank order (collective:
 * every rank calls it). */
static int l_print_all(lua_State *L) {
  int n = lua_gettop(L), me = flow_comm_rank(), size = flow_comm_size();
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "[rank %d]", me);
  luaL_addvalue(&b);
  for (int i = 1; i <= n; i++) {
    luaL_addchar(&b, i == 1 ? ' ' : '\t');
    luaL_tolstring(L, i, NULL);
    luaL_addvalue(&b);
  }
  luaL_addchar(&b, '\n');
  luaL_pushresult(&b);
  size_t len, *lens;
  const char *line = lua_tolstring(L, -1, &len);
  char *all;
  flow_comm *w = flow_comm_world();
  if (w->ops->barrier(w) != 0) return flow_lua_error(L); /* every rank is here (else an error, not a hang) */
  if (flow_comm_allgather_bytes(w, line, len, &all, &lens) != 0) return flow_lua_error(L);
  if (me == 0) { /* the lines are back to back in rank order */
    size_t total = 0;
    for (int r = 0; r < size; r++) total += lens[r];
    fwrite(all, 1, total, stdout);
    fflush(stdout);
  }
  free(all);
  free(lens);
  return 0;
}

static int r_print_text(lua_State *L);
static int r_tostring_gathered(lua_State *L);

/* print on rank 0 only (installed when the world has more than one rank). Every rank calls it, as
 * every rank runs the script: the global tensors among the arguments become their gathered text
 * (r_print_text: collectives), then rank 0 prints. */
static int l_print_rank0(lua_State *L) {
  for (int i = 1, n = lua_gettop(L); i <= n; i++) {
    flow_tensor *t = flow_lua_test(L, i);
    if (!t || !t->global) continue;
    lua_pushcfunction(L, r_print_text);
    lua_pushvalue(L, i);
    lua_call(L, 1, 1);
    lua_replace(L, i);
  }
  if (flow_comm_rank() != 0) return 0;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 0);
  return 0;
}

/* ---- placements and SBP values -------------------------------------------------------------------- */

static void push_placement(lua_State *L, const flow_placement *p) {
  const flow_placement **u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = p;
  luaL_setmetatable(L, PLACEMENT_MT);
}

static const flow_placement *check_placement(lua_State *L, int idx, const char *fn) {
  const flow_placement **u = luaL_testudata(L, idx, PLACEMENT_MT);
  if (!u) luaL_error(L, "%s: expected a placement (flow.placement(...)), got %s", fn, luaL_typename(L, idx));
  return *u;
}

/* Walk a nested list of ranks: the mesh shape from the nesting, the ranks row-major. */
static void mesh_walk(lua_State *L, int idx, int depth, int *ndim, int *shape, int *ranks, int *n, int cap) {
  if (lua_type(L, idx) == LUA_TNUMBER) {
    if (depth != *ndim) luaL_error(L, "placement: ragged rank list (every row of the mesh needs the same depth)");
    if (*n == cap) luaL_error(L, "placement: too many ranks");
    ranks[(*n)++] = (int)luaL_checkinteger(L, idx);
    return;
  }
  if (!lua_istable(L, idx)) luaL_error(L, "placement: ranks must be integers or lists of them (got %s)", luaL_typename(L, idx));
  int len = flow_lua_len(L, idx, INT_MAX, "placement");
  if (len == 0) luaL_error(L, "placement: empty rank list");
  if (depth == *ndim) {
    if (*ndim == FLOW_MAX_MESH) luaL_error(L, "placement: at most %d mesh axes", FLOW_MAX_MESH);
    shape[(*ndim)++] = len;
  } else if (depth > *ndim || shape[depth] != len) {
    luaL_error(L, "placement: ragged rank list (rows of the mesh must have the same length)");
  }
  for (int i = 1; i <= len; i++) {
    lua_geti(L, idx, i);
    mesh_walk(L, lua_gettop(L), depth + 1, ndim, shape, ranks, n, cap);
    lua_pop(L, 1);
  }
}

/* placement(devtype, ranks): ranks {0, 1} (1-D mesh) or {{0, 1}, {2, 3}} (2-D); nil = every rank. */
static int l_placement(lua_State *L) {
  const char *type = luaL_checkstring(L, 1);
  flow_devtype dt;
  if (strcmp(type, "cpu") == 0) dt = FLOW_CPU;
  else if (strcmp(type, "cuda") == 0) dt = FLOW_CUDA;
  else return luaL_error(L, "placement: device type must be \"cpu\" or \"cuda\" (got \"%s\")", type);
  int shape[FLOW_MAX_MESH], ndim = 0, n = 0, cap = 4096;
  lua_settop(L, 2);
  int *ranks = lua_newuserdatauv(L, (size_t)cap * sizeof(int), 0); /* freed by the GC, even on error */
  if (lua_isnoneornil(L, 2)) {
    ndim = 1;
    n = shape[0] = flow_comm_size();
    for (int i = 0; i < n; i++) ranks[i] = i;
  } else if (lua_type(L, 2) == LUA_TNUMBER) {
    ndim = 1;
    shape[0] = n = 1;
    ranks[0] = (int)luaL_checkinteger(L, 2);
  } else {
    mesh_walk(L, 2, 0, &ndim, shape, ranks, &n, cap);
    if (ndim == 0) return luaL_error(L, "placement: empty rank list");
  }
  const flow_placement *p = flow_placement_get(dt, ndim, shape, ranks);
  if (!p) return flow_lua_error(L);
  push_placement(L, p);
  return 1;
}

static int placement_index(lua_State *L) {
  const flow_placement *p = check_placement(L, 1, "placement");
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "type") == 0) { lua_pushstring(L, p->devtype == FLOW_CPU ? "cpu" : "cuda"); return 1; }
  if (strcmp(k, "shape") == 0) {
    lua_createtable(L, p->ndim, 0);
    for (int d = 0; d < p->ndim; d++) { lua_pushinteger(L, p->shape[d]); lua_rawseti(L, -2, d + 1); }
    return 1;
  }
  if (strcmp(k, "ranks") == 0) { /* flat, row-major */
    lua_createtable(L, p->nranks, 0);
    for (int i = 0; i < p->nranks; i++) { lua_pushinteger(L, p->ranks[i]); lua_rawseti(L, -2, i + 1); }
    return 1;
  }
  return 0;
}

static int placement_tostring(lua_State *L) {
  char s[512];
  lua_pushstring(L, flow_placement_str(check_placement(L, 1, "placement"), s, sizeof s));
  return 1;
}

static int placement_eq(lua_State *L) {
  const flow_placement **a = luaL_testudata(L, 1, PLACEMENT_MT), **b = luaL_testudata(L, 2, PLACEMENT_MT);
  lua_pushboolean(L, a && b && *a == *b);
  return 1;
}

static void push_sbp(lua_State *L, flow_sbp s) {
  flow_sbp *u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = s;
  luaL_setmetatable(L, SBP_MT);
}

static int l_split(lua_State *L) {
  lua_Integer a = luaL_checkinteger(L, 1);
  if (a < 0 || a >= FLOW_MAX_DIMS) return luaL_error(L, "sbp.split: axis must be in [0, %d) (got %d)", FLOW_MAX_DIMS, (int)a);
  push_sbp(L, flow_sbp_split((int)a));
  return 1;
}

static int sbp_tostring(lua_State *L) {
  char s[16];
  lua_pushstring(L, flow_sbp_str(*(flow_sbp *)luaL_checkudata(L, 1, SBP_MT), s, sizeof s));
  return 1;
}

static int sbp_eq(lua_State *L) {
  flow_sbp *a = luaL_testudata(L, 1, SBP_MT), *b = luaL_testudata(L, 2, SBP_MT);
  lua_pushboolean(L, a && b && flow_sbp_eq(*a, *b));
  return 1;
}

static int sbp_index(lua_State *L) {
  flow_sbp *s = luaL_checkudata(L, 1, SBP_MT);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "kind") == 0) { lua_pushstring(L, s->kind == FLOW_SBP_S ? "split" : s->kind == FLOW_SBP_B ? "broadcast" : "partial_sum"); return 1; }
  if (strcmp(k, "axis") == 0 && s->kind == FLOW_SBP_S) { lua_pushinteger(L, s->axis); return 1; }
  return 0;
}

/* One SBP value, or a list of them (one per mesh axis). */
static void check_nd_sbp(lua_State *L, int idx, const char *fn, flow_nd_sbp *out) {
  flow_sbp *one = luaL_testudata(L, idx, SBP_MT);
  if (one) { out->n = 1; out->v[0] = *one; return; }
  if (!lua_istable(L, idx))
    luaL_error(L, "%s: sbp must be an SBP value (flow.sbp.split(k), .broadcast, .partial_sum) or a list of them (got %s)",
               fn, luaL_typename(L, idx));
  lua_Integer n = luaL_len(L, idx);
  if (n < 1 || n > FLOW_MAX_MESH) luaL_error(L, "%s: an SBP list has 1 to %d values (got %I)", fn, FLOW_MAX_MESH, (LUAI_UACINT)n);
  out->n = n;
  for (int i = 0; i < n; i++) {
    lua_geti(L, idx, i + 1);
    flow_sbp *s = luaL_testudata(L, -1, SBP_MT);
    if (!s) luaL_error(L, "%s: sbp entry %d is not an SBP value (got %s)", fn, i + 1, luaL_typename(L, -1));
    out->v[i] = *s;
    lua_pop(L, 1);
  }
}

static void push_nd_sbp(lua_State *L, const flow_nd_sbp *s) {
  if (s->n == 1) { push_sbp(L, s->v[0]); return; }
  lua_createtable(L, s->n, 0);
  for (int i = 0; i < s->n; i++) { push_sbp(L, s->v[i]); lua_rawseti(L, -2, i + 1); }
}

/* ---- global tensors -------------------------------------------------------------------------------- */

/* flow._pack_blocks(on): boxing's all-to-all packs strided blocks as it does over NCCL (specs);
 * returns the previous setting. */
static int l_pack_blocks(lua_State *L) {
  bool prev = flow_boxing_pack_blocks;
  flow_boxing_pack_blocks = lua_toboolean(L, 1);
  lua_pushboolean(L, prev);
  return 1;
}

/* flow._signatures(name, attrs, t1, t2, ...) -> the 1-D candidate signatures sbp/signature.c gives
 * the op for these (whole, local) inputs on a mesh axis of world_size ranks: a list of
 * {in = {sbp...}, out = {sbp...}}, all-broadcast first, and whether a rule knows the op. */
static int l_signatures(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const flow_op *op = flow_op_find(name);
  if (!op) return luaL_error(L, "_signatures: no op named '%s'", name);
  flow_attrs a;
  flow_lua_attrs(L, 2, &a);
  int nin = lua_gettop(L) - 2;
  if (nin < 0) nin = 0;
  if (nin > FLOW_SIG_MAX_IO || op->nout > FLOW_SIG_MAX_IO)
    return luaL_error(L, "_signatures: %s: at most %d inputs and outputs", name, FLOW_SIG_MAX_IO);
  flow_tensor *in[FLOW_SIG_MAX_IO];
  for (int i = 0; i < nin; i++) {
    in[i] = flow_lua_check(L, i + 3, name);
    if (in[i]->global) return luaL_error(L, "_signatures: %s: input %d must be a local (whole) tensor", name, i + 1);
  }
  flow_meta im[FLOW_SIG_MAX_IO], meta[FLOW_SIG_MAX_IO];
  for (int i = 0; i < nin; i++) flow_meta_from(&im[i], in[i]);
  if (op->infer(op, im, nin, &a, meta) != 0) return flow_lua_push(L, NULL);
  flow_sig_query q;
  memset(&q, 0, sizeof q);
  q.nin = nin;
  q.nout = op->nout;
  q.attrs = &a;
  q.p = flow_comm_size();
  for (int i = 0; i < nin; i++) {
    q.in_ndim[i] = in[i]->ndim;
    memcpy(q.in_shape[i], in[i]->shape, sizeof q.in_shape[i]);
  }
  for (int j = 0; j < op->nout; j++) {
    q.out_ndim[j] = meta[j].ndim;
    memcpy(q.out_shape[j], meta[j].shape, sizeof q.out_shape[j]);
  }
  flow_sig_list *list = malloc(sizeof *list);
  if (!list) return luaL_error(L, "_signatures: out of memory");
  bool ruled = flow_sbp_candidates(op->sbp, &q, list);
  lua_createtable(L, list->n, 0);
  for (int c = 0; c < list->n; c++) {
    lua_createtable(L, 0, 2);
    lua_createtable(L, nin, 0);
    for (int i = 0; i < nin; i++) { push_sbp(L, list->v[c].in[i]); lua_rawseti(L, -2, i + 1); }
    lua_setfield(L, -2, "in");
    lua_createtable(L, op->nout, 0);
    for (int j = 0; j < op->nout; j++) { push_sbp(L, list->v[c].out[j]); lua_rawseti(L, -2, j + 1); }
    lua_setfield(L, -2, "out");
    lua_rawseti(L, -2, c + 1);
  }
  free(list);
  lua_pushboolean(L, ruled);
  return 2;
}

/* t:to_global(placement, sbp): placement may be nil for a global t (keep its placement). */
static int t_to_global(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "to_global");
  const flow_placement *p;
  if (lua_isnil(L, 2) && t->global) p = flow_global_of(t)->placement;
  else p = check_placement(L, 2, "to_global");
  flow_nd_sbp s;
  check_nd_sbp(L, 3, "to_global", &s);
  return flow_lua_push(L, flow_to_global(t, p, &s));
}

static int t_to_local(lua_State *L) { return flow_lua_push(L, flow_to_local(flow_lua_check(L, 1, "to_local"))); }

/* explain(t, placement, sbp): the boxing that would run. explain(fn, ...): run fn and return its
 * trace of global ops (signature, boxing, bytes) followed by fn's results. */
static int l_explain(lua_State *L) {
  if (lua_isfunction(L, 1)) {
    flow_global_trace_begin();
    int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    char *s = flow_global_trace_end();
    if (st != LUA_OK) { free(s); return lua_error(L); }
    lua_pushstring(L, s);
    free(s);
    lua_insert(L, 1);
    return lua_gettop(L);
  }
  flow_tensor *t = flow_lua_check(L, 1, "explain");
  const flow_placement *p = lua_isnil(L, 2) && t->global ? flow_global_of(t)->placement : check_placement(L, 2, "explain");
  flow_nd_sbp s;
  check_nd_sbp(L, 3, "explain", &s);
  char *text = flow_global_explain_boxing(t, p, &s);
  if (!text) return flow_lua_error(L);
  lua_pushstring(L, text);
  free(text);
  return 1;
}

static int l_set_check(lua_State *L) {
  bool prev = flow_global_check_enabled();
  flow_global_set_check(lua_toboolean(L, 1));
  lua_pushboolean(L, prev);
  return 1;
}

/* registry["flow.global_shape"](t) */
static int r_global_shape(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "shape");
  const flow_global *g = flow_global_of(t);
  int nd = g ? g->ndim : t->ndim;
  const int64_t *shape = g ? g->shape : t->shape;
  lua_createtable(L, nd, 0);
  for (int i = 0; i < nd; i++) { lua_pushinteger(L, shape[i]); lua_rawseti(L, -2, i + 1); }
  return 1;
}

/* registry["flow.global_field"](t, key): t.placement, t.sbp (nil for local tensors) */
static int r_global_field(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "index");
  const char *k = luaL_checkstring(L, 2);
  const flow_global *g = flow_global_of(t);
  if (!g) return 0;
  if (strcmp(k, "placement") == 0) { push_placement(L, g->placement); return 1; }
  if (strcmp(k, "sbp") == 0) { push_nd_sbp(L, &g->sbp); return 1; }
  return 0;
}

/* t boxed to broadcast on its placement: the logical value, as a local tensor on this rank (new
 * reference). A collective over the placement's ranks (ranks agree first); NULL + error on a rank
 * outside it. */
static flow_tensor *gather(flow_tensor *t) {
  const flow_global *g = flow_global_of(t);
  if (flow_global_settle(g->placement) != 0) return NULL;
  flow_nd_sbp b;
  b.n = g->placement->ndim;
  for (int m = 0; m < b.n; m++) b.v[m] = flow_sbp_broadcast();
  flow_tensor *whole = flow_to_global(t, g->placement, &b);
  flow_tensor *mine = whole ? flow_tensor_view_of(whole, whole->ndim, whole->shape, whole->stride, whole->offset) : NULL;
  flow_tensor_decref(whole);
  if (mine && g->placement->me < 0) {
    flow_tensor_decref(mine);
    flow_error_set("[rank %d] reading a global tensor: this rank is not in its placement", flow_comm_rank());
    return NULL;
  }
  return mine;
}

/* Each rank's block of the logical tensor, one "\n  rank r: [a:b, c:d]" line each (64 at most). */
static void add_blocks(luaL_Buffer *b, const flow_global *g) {
  lua_State *L = b->L;
  const flow_placement *p = g->placement;
  bool partial = false;
  for (int m = 0; m < g->sbp.n; m++) partial |= g->sbp.v[m].kind == FLOW_SBP_P;
  for (int i = 0; i < p->nranks && i < 64; i++) {
    int coord[FLOW_MAX_MESH];
    int64_t start[FLOW_MAX_DIMS], size[FLOW_MAX_DIMS];
    flow_placement_coord(p, i, coord);
    flow_global_box(p, &g->sbp, g->ndim, g->shape, coord, -1, start, size);
    lua_pushfstring(L, "\n  rank %d: [", p->ranks[i]);
    luaL_addvalue(b);
    for (int d = 0; d < g->ndim; d++) {
      lua_pushfstring(L, "%s%I:%I", d ? ", " : "", (lua_Integer)start[d], (lua_Integer)(start[d] + size[d]));
      luaL_addvalue(b);
    }
    luaL_addstring(b, partial ? "] (partial)" : "]");
  }
}

/* registry["flow.tostring_global"](t), tostring of a global tensor: logical shape, dtype,
 * placement, SBP, each rank's block, and this rank's shard. It never communicates (a rank may call
 * it alone: an error message, print_all), except in a world of one, where gathering the values
 * needs no peer and it shows what print shows. */
static int r_tostring_global(lua_State *L) {
  flow_tensor *t = flow_lua_check(L, 1, "tostring");
  const flow_global *g = flow_global_of(t);
  if (!g) { luaL_tolstring(L, 1, NULL); return 1; }
  if (flow_comm_size() == 1) return r_tostring_gathered(L);
  char shape[128], place[512], sbp[96];
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "tensor(shape=%s, dtype=%s, placement=%s, sbp=%s)", flow_shape_str(g->ndim, g->shape, shape, sizeof shape),
                  flow_dtype_name(t->dtype), flow_placement_str(g->placement, place, sizeof place),
                  flow_nd_sbp_str(&g->sbp, sbp, sizeof sbp));
  luaL_addvalue(&b);
  add_blocks(&b, g);
  flow_tensor *local = flow_tensor_view_of(t, t->ndim, t->shape, t->stride, t->offset);
  if (!local) return flow_lua_error(L);
  lua_pushfstring(L, "\n  local shard on rank %d: ", flow_comm_rank());
  luaL_addvalue(&b);
  flow_lua_push(L, local);
  luaL_tolstring(L, -1, NULL);
  lua_remove(L, -2);
  luaL_addvalue(&b);
  luaL_pushresult(&b);
  return 1;
}

/* tostring_gathered(t), what print and the REPL show for a global tensor: its logical values
 * (elided as a local tensor's), placement and SBP, then each rank's block. The values are gathered
 * over the placement's ranks, so every one of them must call it, as every rank calls print; a rank
 * outside the placement gets tostring(t). Any other value becomes tostring(v). */
static int r_tostring_gathered(lua_State *L) {
  flow_tensor *t = flow_lua_test(L, 1);
  const flow_global *g = t ? flow_global_of(t) : NULL;
  if (!g) { luaL_tolstring(L, 1, NULL); return 1; }
  if (g->placement->me < 0) return r_tostring_global(L);
  bool grad = flow_grad_set_enabled(false);
  flow_tensor *whole = gather(t);
  flow_grad_set_enabled(grad);
  if (!whole) return flow_lua_error(L);
  char place[512], sbp[96];
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_getfield(L, LUA_REGISTRYINDEX, "flow.tostring");
  flow_lua_push(L, whole);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, flow_placement_str(g->placement, place, sizeof place));
  lua_setfield(L, -2, "placement");
  lua_pushstring(L, flow_nd_sbp_str(&g->sbp, sbp, sizeof sbp));
  lua_setfield(L, -2, "sbp");
  lua_pushstring(L, flow_autograd_op_name(t));
  lua_setfield(L, -2, "grad_fn");
  lua_pushboolean(L, t->requires_grad);
  lua_setfield(L, -2, "requires_grad");
  lua_call(L, 2, 1);
  luaL_addvalue(&b);
  add_blocks(&b, g);
  luaL_pushresult(&b);
  return 1;
}

/* registry["flow.print_text"](v), what rank 0 prints for v, computed on every rank (every rank
 * calls print, and the REPL runs each line on every rank): a global tensor's gathered text, which
 * its placement's first rank sends to rank 0 when rank 0 is outside the placement; tostring(v)
 * otherwise. */
static int r_print_text(lua_State *L) {
  lua_settop(L, 1);
  lua_pushcfunction(L, r_tostring_gathered);
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  flow_tensor *t = flow_lua_test(L, 1);
  const flow_placement *p = t && t->global ? flow_global_of(t)->placement : NULL;
  if (!p || p->ranks[0] == 0 || (flow_comm_rank() != 0 && flow_comm_rank() != p->ranks[0])) return 1;
  flow_comm *w = flow_comm_world();
  const int tag = 0x7072; /* "pr" */
  int64_t len = 0;
  if (flow_comm_rank() != 0) {
    size_t n;
    const char *text = lua_tolstring(L, -1, &n);
    len = (int64_t)n;
    if (w->ops->send(w, &len, 1, FLOW_I64, 0, tag) != 0 || w->ops->send(w, text, n, FLOW_U8, 0, tag) != 0)
      return flow_lua_error(L);
    return 1;
  }
  if (w->ops->recv(w, &len, 1, FLOW_I64, p->ranks[0], tag) != 0) return flow_lua_error(L);
  char *text = lua_newuserdatauv(L, (size_t)len, 0); /* freed by the GC even if the receive fails */
  if (w->ops->recv(w, text, (size_t)len, FLOW_U8, p->ranks[0], tag) != 0) return flow_lua_error(L);
  lua_pushlstring(L, text, (size_t)len);
  return 1;
}

/* flow._layout(placement, sbp, shape) -> one {rank =, coord = {...}, start = {...}, size = {...},
 * partial = bool} per rank of the placement: the block of the logical tensor each rank holds (0-based
 * starts). What flow.visualize draws. */
static int l_layout(lua_State *L) {
  const flow_placement *p = check_placement(L, 1, "_layout");
  flow_nd_sbp s;
  check_nd_sbp(L, 2, "_layout", &s);
  int64_t shape[FLOW_MAX_DIMS];
  int nd = flow_lua_shape(L, 3, shape, "_layout");
  if (flow_global_check("_layout", p, &s, nd) != 0) return flow_lua_error(L);
  bool partial = false;
  for (int m = 0; m < s.n; m++) partial |= s.v[m].kind == FLOW_SBP_P;
  lua_createtable(L, p->nranks, 0);
  for (int i = 0; i < p->nranks; i++) {
    int coord[FLOW_MAX_MESH];
    int64_t start[FLOW_MAX_DIMS], size[FLOW_MAX_DIMS];
    flow_placement_coord(p, i, coord);
    flow_global_box(p, &s, nd, shape, coord, -1, start, size);
    lua_createtable(L, 0, 5);
    lua_pushinteger(L, p->ranks[i]);
    lua_setfield(L, -2, "rank");
    lua_createtable(L, p->ndim, 0);
    for (int m = 0; m < p->ndim; m++) { lua_pushinteger(L, coord[m]); lua_rawseti(L, -2, m + 1); }
    lua_setfield(L, -2, "coord");
    lua_createtable(L, nd, 0);
    for (int d = 0; d < nd; d++) { lua_pushinteger(L, start[d]); lua_rawseti(L, -2, d + 1); }
    lua_setfield(L, -2, "start");
    lua_createtable(L, nd, 0);
    for (int d = 0; d < nd; d++) { lua_pushinteger(L, size[d]); lua_rawseti(L, -2, d + 1); }
    lua_setfield(L, -2, "size");
    lua_pushboolean(L, partial);
    lua_setfield(L, -2, "partial");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* registry["flow.global_create"](opname, shape, value, opts): see lua/bind_create.c. Each rank
 * makes its own shard; along partial_sum axes coordinate 0 holds the values, the rest zeros. */
static int r_global_create(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  int64_t shape[FLOW_MAX_DIMS];
  int nd = flow_lua_shape(L, 2, shape, name);
  int opts = 4;
  lua_getfield(L, opts, "placement");
  const flow_placement *p = check_placement(L, -1, name);
  lua_pop(L, 1);
  flow_nd_sbp s;
  lua_getfield(L, opts, "sbp");
  if (lua_isnil(L, -1)) return luaL_error(L, "%s: a placement needs an sbp too", name);
  check_nd_sbp(L, -1, name, &s);
  lua_pop(L, 1);
  if (flow_global_check(name, p, &s, nd) != 0) return flow_lua_error(L);
  flow_attrs at;
  flow_attrs_init(&at);
  at.nshape = nd;
  memcpy(at.shape, shape, sizeof shape);
  at.dtype = flow_lua_opt_dtype(L, opts, FLOW_F32);
  flow_device def = FLOW_DEVICE_CPU;
  if (p->devtype == FLOW_CUDA) { /* this rank's GPU */
    int gpu = flow_nccl_device();
    if (gpu < 0) return flow_lua_error(L);
    def = (flow_device){FLOW_CUDA, gpu};
  }
  at.device = flow_lua_opt_device(L, opts, def);
  if (lua_istable(L, 3)) {
    at.scalar = flow_lua_opt_number(L, 3, strcmp(name, "linspace") == 0 || strcmp(name, "arange") == 0 ? "start" : "_", 0);
    at.scalar2 = flow_lua_opt_number(L, 3, strcmp(name, "linspace") == 0 ? "stop" : "step", 0);
    at.seed = (uint64_t)flow_lua_opt_number(L, 3, "seed", 0);
    at.rng_offset = (uint64_t)flow_lua_opt_number(L, 3, "offset", 0);
    if (strcmp(name, "randint") == 0) {
      at.naxes = 2;
      at.axes[0] = (int64_t)flow_lua_opt_number(L, 3, "low", 0);
      at.axes[1] = (int64_t)flow_lua_opt_number(L, 3, "high", 0);
    }
  } else if (lua_type(L, 3) == LUA_TNUMBER) {
    at.scalar = lua_tonumber(L, 3);
  }
  int64_t start[FLOW_MAX_DIMS] = {0}, box[FLOW_MAX_DIMS];
  if (p->me >= 0) flow_global_box(p, &s, nd, shape, p->coord, -1, start, box);
  else flow_global_local_shape(p, &s, nd, shape, box); /* not in the placement: an empty shard */
  bool holds = p->me >= 0;
  for (int m = 0; m < s.n; m++) holds &= s.v[m].kind != FLOW_SBP_P || p->coord[m] == 0;
  flow_tensor *t;
  if (!holds || strcmp(name, "full") == 0) {
    t = flow_full(nd, box, holds ? at.scalar : 0, at.dtype, at.device);
  } else {
    const flow_op *op = flow_op_find(name);
    if (!op) return luaL_error(L, "%s: no such creation op", name);
    t = flow_create_shard(op, &at, start, box);
  }
  if (!t) return flow_lua_error(L);
  flow_global *g = flow_global_new(p, &s, nd, shape);
  if (!g) { flow_tensor_decref(t); return flow_lua_error(L); }
  flow_global_attach(t, g);
  t->requires_grad = flow_lua_opt_bool(L, opts, "requires_grad", 0) && flow_dtype_is_float(at.dtype);
  return flow_lua_push(L, t);
}

#ifdef FLOW_HAVE_MPI
/* flow._mpi(name, send, recv): the raw MPI collective on two float32 tensors' memory over the
 * world (the reference the boxing benchmark measures against). */
static int l_raw_mpi(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  flow_tensor *s = flow_lua_check(L, 2, "_mpi"), *r = flow_lua_check(L, 3, "_mpi");
  if (!flow_comm_uses_mpi()) return luaL_error(L, "_mpi: MPI is not running (launch with mpirun, or call flow.init_mpi())");
  if (s->dtype != FLOW_F32 || r->dtype != FLOW_F32 || !flow_tensor_is_contiguous(s) || !flow_tensor_is_contiguous(r))
    return luaL_error(L, "_mpi: contiguous float32 tensors only");
  int n = (int)flow_tensor_numel(s), p = flow_comm_size(), rc;
  void *sp = flow_tensor_data(s), *rp = flow_tensor_data(r);
  if (strcmp(name, "allreduce") == 0) rc = MPI_Allreduce(sp, rp, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (strcmp(name, "allgather") == 0) rc = MPI_Allgather(sp, n, MPI_FLOAT, rp, n, MPI_FLOAT, MPI_COMM_WORLD);
  else if (strcmp(name, "reduce_scatter") == 0) rc = MPI_Reduce_scatter_block(sp, rp, n / p, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (strcmp(name, "alltoall") == 0) rc = MPI_Alltoall(sp, n / p, MPI_FLOAT, rp, n / p, MPI_FLOAT, MPI_COMM_WORLD);
  else if (strcmp(name, "alltoall_s0s1") == 0) {
    /* what raw MPI must do for S(0) -> S(1) of a [rows, cols] tensor: send column block q of the
     * [r, c] row shard to rank q (a strided vector), receive row block q of the [r p, c / p] result */
    if (s->ndim != 2 || s->shape[1] % p) return luaL_error(L, "_mpi: alltoall_s0s1 needs a 2-D shard with cols %% p == 0");
    int r = (int)s->shape[0], c = (int)s->shape[1], cp = c / p;
    MPI_Datatype vec, blk;
    MPI_Type_vector(r, cp, c, MPI_FLOAT, &vec);
    MPI_Type_commit(&vec);
    MPI_Type_contiguous(r * cp, MPI_FLOAT, &blk);
    MPI_Type_commit(&blk);
    int *ints = malloc(4 * (size_t)p * sizeof *ints);
    MPI_Datatype *types = malloc(2 * (size_t)p * sizeof *types);
    if (!ints || !types) { free(ints); free(types); return luaL_error(L, "_mpi: out of memory"); }
    for (int q = 0; q < p; q++) {
      ints[q] = ints[p + q] = 1;
      ints[2 * p + q] = q * cp * 4;
      ints[3 * p + q] = q * r * cp * 4;
      types[q] = vec;
      types[p + q] = blk;
    }
    rc = MPI_Alltoallw(sp, ints, ints + 2 * p, types, rp, ints + p, ints + 3 * p, types + p, MPI_COMM_WORLD);
    free(ints);
    free(types);
    MPI_Type_free(&vec);
    MPI_Type_free(&blk);
  } else return luaL_error(L, "_mpi: unknown collective '%s'", name);
  if (rc != MPI_SUCCESS) return luaL_error(L, "_mpi: %s failed", name);
  return 0;
}
#else
static int l_raw_mpi(lua_State *L) { return luaL_error(L, "_mpi: this build has no MPI (FLOW_MPI=OFF)"); }
#endif

/* zeros_like/ones_like/full_like of a global tensor: a global tensor on the same placement with
 * the same SBP (a nonzero fill of a partial tensor is broadcast), so optimizer state lives where
 * its parameter does. Local tensors go to the local version (upvalue 1). */
static int l_like(lua_State *L) {
  flow_tensor *t = flow_lua_test(L, 1);
  if (!t || !t->global) {
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
  }
  int kind = (int)lua_tointeger(L, lua_upvalueindex(2));
  double v = kind == 2 ? luaL_checknumber(L, 2) : kind;
  const flow_global *g = flow_global_of(t);
  flow_nd_sbp sbp = g->sbp;
  for (int m = 0; m < sbp.n && v != 0; m++)
    if (sbp.v[m].kind == FLOW_SBP_P) sbp.v[m] = flow_sbp_broadcast();
  lua_pushcfunction(L, r_global_create);
  lua_pushliteral(L, "full");
  r_global_shape(L); /* the logical shape of argument 1 */
  lua_pushnumber(L, v);
  lua_createtable(L, 0, 4);
  push_placement(L, g->placement);
  lua_setfield(L, -2, "placement");
  push_nd_sbp(L, &sbp);
  lua_setfield(L, -2, "sbp");
  lua_pushstring(L, flow_dtype_name(t->dtype));
  lua_setfield(L, -2, "dtype");
  char dev[32];
  flow_device_name(t->device, dev, sizeof dev);
  lua_pushstring(L, dev);
  lua_setfield(L, -2, "device");
  lua_call(L, 4, 1);
  return 1;
}

/* t:item() and t:totable() of a global tensor read the logical value: the tensor is boxed to
 * broadcast first (a collective: every rank of the placement calls it, as in any SPMD script).
 * Local tensors go to the local method (upvalue 1). */
static int l_read_global(lua_State *L) {
  flow_tensor *t = flow_lua_test(L, 1);
  if (t && t->global) {
    flow_tensor *mine = gather(t);
    if (!mine) return flow_lua_error(L);
    flow_lua_push(L, mine);
    lua_replace(L, 1);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* ---- opening and closing ---------------------------------------------------------------------------- */

static int finalize(lua_State *L) {
  (void)L;
  flow_nccl_finalize(); /* NCCL communicators hold MPI ones */
  flow_comm_finalize();
  return 0;
}

static char sentinel_key;

void flow_lua_open_global(lua_State *L) {
  if (flow_comm_init() != 0) luaL_error(L, "%s", flow_error_get());
  flow_global_install();
  lua_rawgetp(L, LUA_REGISTRYINDEX, &sentinel_key);
  if (lua_isnil(L, -1)) { /* finalise MPI when this state closes */
    lua_newuserdatauv(L, 1, 0);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, finalize);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &sentinel_key);
  }
  lua_pop(L, 1);

  luaL_newmetatable(L, PLACEMENT_MT);
  lua_pushcfunction(L, placement_index); lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, placement_tostring); lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, placement_eq); lua_setfield(L, -2, "__eq");
  lua_pop(L, 1);
  luaL_newmetatable(L, SBP_MT);
  lua_pushcfunction(L, sbp_index); lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, sbp_tostring); lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, sbp_eq); lua_setfield(L, -2, "__eq");
  lua_pop(L, 1);

  static const luaL_Reg fns[] = {{"init_mpi", l_init_mpi}, {"mpi_running", l_mpi_running},
                                 {"rank", l_rank}, {"world_size", l_world_size}, {"barrier", l_barrier},
                                 {"print_all", l_print_all}, {"placement", l_placement}, {"explain", l_explain}, {"_layout", l_layout},
                                 {"set_check_consistency", l_set_check}, {"_mpi", l_raw_mpi},
                                 {"_signatures", l_signatures}, {"_pack_blocks", l_pack_blocks},
                                 {"_program", l_program}, {NULL, NULL}};
  static const luaL_Reg methods[] = {{"to_global", t_to_global}, {"to_local", t_to_local}, {NULL, NULL}};
  flow_lua_register(L, fns, methods);
#ifdef FLOW_HAVE_MPI
  lua_pushboolean(L, 1);
#else
  lua_pushboolean(L, 0);
#endif
  lua_setfield(L, -2, "_has_mpi"); /* false: a build without MPI, a world of one */

  static const char *likes[] = {"zeros_like", "ones_like", "full_like"};
  for (int k = 0; k < 3; k++) {
    lua_getfield(L, -1, likes[k]);
    if (lua_isnil(L, -1)) { lua_pop(L, 1); continue; }
    lua_pushinteger(L, k);
    lua_pushcclosure(L, l_like, 2);
    lua_setfield(L, -2, likes[k]);
  }

  flow_lua_push_methods(L);
  static const char *reads[] = {"item", "totable"};
  for (int k = 0; k < 2; k++) {
    lua_getfield(L, -1, reads[k]);
    if (lua_isnil(L, -1)) { lua_pop(L, 1); continue; }
    lua_pushcclosure(L, l_read_global, 1);
    lua_setfield(L, -2, reads[k]);
  }
  lua_pop(L, 1);

  lua_createtable(L, 0, 3); /* flow.sbp */
  lua_pushcfunction(L, l_split); lua_setfield(L, -2, "split");
  push_sbp(L, flow_sbp_broadcast()); lua_setfield(L, -2, "broadcast");
  push_sbp(L, flow_sbp_partial()); lua_setfield(L, -2, "partial_sum");
  lua_setfield(L, -2, "sbp");

  static const struct { const char *key; lua_CFunction fn; } hooks[] = {
      {"flow.global_shape", r_global_shape}, {"flow.global_field", r_global_field},
      {"flow.tostring_global", r_tostring_global}, {"flow.print_text", r_print_text},
      {"flow.global_create", r_global_create}};
  for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
    lua_pushcfunction(L, hooks[i].fn);
    lua_setfield(L, LUA_REGISTRYINDEX, hooks[i].key);
  }

  if (flow_comm_size() > 1) { /* print speaks for rank 0 only; print_all for everyone */
    lua_getglobal(L, "print");
    lua_pushcclosure(L, l_print_rank0, 1);
    lua_setglobal(L, "print");
  }
}
