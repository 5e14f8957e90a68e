/* Lua bindings: io. */
#include "bind.h"

void flow_lua_open_io(lua_State *L) { (void)L; }
