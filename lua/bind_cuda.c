/* Lua bindings: cuda. */
#include "bind.h"

void flow_lua_open_cuda(lua_State *L) { (void)L; }
