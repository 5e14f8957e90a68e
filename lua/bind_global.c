/* Lua bindings: global. */
#include "bind.h"

void flow_lua_open_global(lua_State *L) { (void)L; }
