/* Lua bindings for the graph layer (filled in by the graph work). */
#include "bind.h"

void flow_lua_open_graph(lua_State *L) { (void)L; }
