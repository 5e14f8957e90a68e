/* Lua bindings: autograd. */
#include "bind.h"

void flow_lua_open_autograd(lua_State *L) { (void)L; }
