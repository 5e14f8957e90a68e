-- LuaRocks: `luarocks make` in this checkout builds with CMake and installs flow.so and the Lua
-- modules into the rock tree (flowlua, the headers and flowlua.pc under its prefix). Needs the
-- build's system libraries: OpenBLAS, MPI (or -DFLOW_MPI=OFF), zlib, readline (scripts/setup.sh).
rockspec_format = "3.0"
package = "flowlua"
version = "scm-1"
source = { url = "git+file://." } -- luarocks make builds the checkout it runs in
description = {
  summary = "Distributed deep learning in C driven by Lua 5.4, after the OneFlow paper",
  detailed = "Tensors on CPU and CUDA, autograd, global tensors with placement and SBP, a lazy graph run by actors.",
}
dependencies = { "lua >= 5.4, < 5.5" }
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    FLOW_LUA_CMOD_DIR = "$(LIBDIR)",
    FLOW_LUA_LMOD_DIR = "$(LUADIR)",
  },
}
