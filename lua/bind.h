/* Shared helpers for the Lua bindings: tensor userdata, argument parsing, error raising.
 * Every bind_*.c file registers its functions with flow_lua_register. */
#ifndef FLOW_BIND_H
#define FLOW_BIND_H

#include <limits.h>
#include <lauxlib.h>
#include <lua.h>

#include "../ops/op.h"

#define FLOW_TENSOR_MT "flow.Tensor"

/* Tensor userdata: a box holding one reference; NULL after t:free(). */
typedef struct flow_lua_box { flow_tensor *t; } flow_lua_box;

/* Argument idx must be a live tensor, else a Lua error naming `fn`. */
flow_tensor *flow_lua_check(lua_State *L, int idx, const char *fn);
flow_tensor *flow_lua_test(lua_State *L, int idx);   /* NULL if not a live tensor */
flow_lua_box *flow_lua_box_of(lua_State *L, int idx); /* NULL if not a tensor box (freed or not) */
/* The attrs table at idx (flow._call's keys) into a; unknown keys raise. */
void flow_lua_attrs(lua_State *L, int idx, flow_attrs *a);
/* A tensor, or a Lua number/boolean turned into a 0-d tensor like `like` (a new reference). */
flow_tensor *flow_lua_to_tensor(lua_State *L, int idx, const flow_tensor *like, const char *fn);
/* Push t, taking over the caller's reference. t == NULL raises the current flow error. */
int flow_lua_push(lua_State *L, flow_tensor *t);
/* Raise the current flow error as a Lua error (never returns). */
int flow_lua_error(lua_State *L);

/* A shape from a Lua list at idx ({2,3}) or from integers idx..top (2, 3). Returns ndim. */
int flow_lua_shape(lua_State *L, int idx, int64_t *shape, const char *fn);
/* #t for the list at idx, raising "<fn>: ..." unless 0 <= #t <= max (__len may return anything). */
int flow_lua_len(lua_State *L, int idx, lua_Integer max, const char *fn);
/* Axes from an integer or a list (nil: none, all axes). Returns count. */
int flow_lua_axes(lua_State *L, int idx, int64_t *axes, const char *fn);
/* Options table at idx (may be nil/absent): dtype and device. */
flow_dtype flow_lua_opt_dtype(lua_State *L, int idx, flow_dtype def);
flow_device flow_lua_opt_device(lua_State *L, int idx, flow_device def);
/* opts.key as a number / boolean / integer, or def when absent. */
double flow_lua_opt_number(lua_State *L, int idx, const char *key, double def);
int flow_lua_opt_bool(lua_State *L, int idx, const char *key, int def);
/* The options table at idx (nil/absent: nothing to check) may hold only the string keys in keys
 * (NULL-terminated); any other key raises "<fn>: unknown option '<key>' (expected ...)", so a
 * misspelt or unsupported option never passes silently. */
void flow_lua_check_opts(lua_State *L, int idx, const char *fn, const char *const *keys);
/* Parse a dtype from a string at idx. */
flow_dtype flow_lua_check_dtype(lua_State *L, int idx);

/* ---- argument checks that name the op ------------------------------------------------------------
 * lauxlib's checks name the function from the calling instruction, which gives '?' for a call
 * through pcall, a computed field or a local variable. These name the running function by finding
 * it in the module and method tables instead: "chunk: bad argument #2 (number expected, got nil)".
 * The luaL_ names are redirected to them here, so every binding (and any added later) gets them. */
int flow_lua_argerror(lua_State *L, int arg, const char *extramsg);
int flow_lua_typeerror(lua_State *L, int arg, const char *tname);
lua_Integer flow_lua_checkinteger(lua_State *L, int arg);
lua_Integer flow_lua_optinteger(lua_State *L, int arg, lua_Integer def);
lua_Number flow_lua_checknumber(lua_State *L, int arg);
lua_Number flow_lua_optnumber(lua_State *L, int arg, lua_Number def);
const char *flow_lua_checklstring(lua_State *L, int arg, size_t *len);
const char *flow_lua_optlstring(lua_State *L, int arg, const char *def, size_t *len);
void flow_lua_checktype(lua_State *L, int arg, int t);
void flow_lua_checkany(lua_State *L, int arg);
int flow_lua_checkoption(lua_State *L, int arg, const char *def, const char *const lst[]);
void *flow_lua_checkudata(lua_State *L, int arg, const char *tname);
/* The running C function's name ("chunk"), or "?" when it is in neither table. */
const char *flow_lua_fn_name(lua_State *L);

#define luaL_argerror flow_lua_argerror
#define luaL_typeerror flow_lua_typeerror
#define luaL_checkinteger flow_lua_checkinteger
#define luaL_optinteger flow_lua_optinteger
#define luaL_checknumber flow_lua_checknumber
#define luaL_optnumber flow_lua_optnumber
#define luaL_checklstring flow_lua_checklstring
#define luaL_optlstring flow_lua_optlstring
#define luaL_checktype flow_lua_checktype
#define luaL_checkany flow_lua_checkany
#define luaL_checkoption flow_lua_checkoption
#define luaL_checkudata flow_lua_checkudata

/* Call an op from a binding: raises on error; pushes the outputs; returns nout. */
int flow_lua_call(lua_State *L, const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a);

/* Register module functions (into the flow table) and tensor methods (t:name()).
 * Either list may be NULL. Both tables are found in the registry. */
void flow_lua_register(lua_State *L, const luaL_Reg *funcs, const luaL_Reg *methods);

/* The tensor methods table (t:name() lookups, completion); and the registry set-up that
 * luaopen_flow runs first, with the module table on top. */
void flow_lua_push_methods(lua_State *L);
void flow_lua_init_tables(lua_State *L);

/* Lua's GC does not see tensor memory: a full collection once the tensor allocator holds twice
 * its low since the last one (flow_lua_push calls this for every tensor it hands to Lua). */
void flow_lua_account(lua_State *L);

/* Per-area openers, called by luaopen_flow in order. */
void flow_lua_open_tensor(lua_State *L);
void flow_lua_open_elementwise(lua_State *L);
void flow_lua_open_reduce(lua_State *L);
void flow_lua_open_shape(lua_State *L);
void flow_lua_open_create(lua_State *L);
void flow_lua_open_nn(lua_State *L);
void flow_lua_open_autograd(lua_State *L);
void flow_lua_open_io(lua_State *L);
void flow_lua_open_global(lua_State *L);
void flow_lua_open_cuda(lua_State *L);
void flow_lua_open_bench(lua_State *L);
void flow_lua_open_conv(lua_State *L);
void flow_lua_open_actor(lua_State *L);
void flow_lua_open_graph(lua_State *L);

#endif
