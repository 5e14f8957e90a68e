/* The interactive loop of flowlua (readline, auto-print, multi-line input, Ctrl-C), and the
 * pieces it shares with main.c (the flow global, error printing, a protected call). */
#ifndef FLOW_REPL_H
#define FLOW_REPL_H

#include <lua.h>

void flow_repl_init(lua_State *L);               /* after the flow module is open */
void flow_repl_run(lua_State *L);                /* until EOF */
void flow_repl_print_error(lua_State *L, const char *prog, const char *msg);
int flow_main_pcall(lua_State *L, int nargs, int nres);

#endif
