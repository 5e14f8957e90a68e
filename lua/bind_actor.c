/* Lua bindings for the actor layer (filled in by the actor work). */
#include "bind.h"

void flow_lua_open_actor(lua_State *L) { (void)L; }
