-- `cmake --install` into a temporary prefix gives a working library: stock lua5.4 requires flow
-- from there, the installed flowlua runs, and the headers and flowlua.pc serve a C extension op.
local shell = require "support.shell"
local sh_quote, has, run = shell.quote, shell.has, shell.run
local bin = os.getenv("FLOW_BIN")

-- the build folder is where FLOW_BIN lives (scripts/test.sh exports it)
local build = bin and bin:match("^(.*)/[^/]+$")
local cache = build and io.open(build .. "/CMakeCache.txt")
local cache_text = cache and cache:read("a")
if cache then cache:close() end

describe("cmake --install", function()
  if not (cache_text and has("cmake") and has("lua5.4")) then
    it("needs the build folder, cmake and lua5.4", function()
      pending("FLOW_BIN is not set to a cmake build's flowlua, or cmake or lua5.4 is missing")
    end)
    return
  end
  local prefix = shell.tmpdir()
  setup(function()
    local out, err, code = run("cmake --install " .. sh_quote(build) .. " --prefix " .. sh_quote(prefix))
    assert(code == 0, "cmake --install failed: " .. out .. err)
  end)
  teardown(function() os.execute("rm -rf " .. sh_quote(prefix)) end)
  -- Only the prefix on the search paths (no ;; default, no ./?.so): flow must come from there.
  local env = ("LUA_INIT= LUA_CPATH=%s LUA_PATH=%s "):format(sh_quote(prefix .. "/lib/lua/5.4/?.so"),
    sh_quote(prefix .. "/share/lua/5.4/?.lua"))

  it("puts flowlua, flow.so, the Lua modules, the headers and flowlua.pc under the prefix", function()
    for _, f in ipairs({ "bin/flowlua", "lib/lua/5.4/flow.so", "share/lua/5.4/flow/nn.lua",
                         "share/lua/5.4/flow/gpt.lua", "include/flowlua/ops/op.h",
                         "include/flowlua/core/tensor.h", "include/flowlua/lua/bind.h" }) do
      assert.is_true(os.execute("test -f " .. sh_quote(prefix .. "/" .. f)) == true, f)
    end
    -- init.lua is flow.so's own body: on the path it would shadow flow.so
    assert.is_nil(io.open(prefix .. "/share/lua/5.4/flow/init.lua"))
    local o, e, c = run(sh_quote(prefix .. "/bin/flowlua") .. " -e 'print(flow.ones({2, 3}):sum():item())'")
    assert.equal(0, c, e)
    assert.equal("6.0\n", o)
  end)

  it("lets stock lua5.4 require flow from the prefix through LUA_CPATH and LUA_PATH", function()
    if cache_text:match("FLOW_SANITIZE:BOOL=ON") then
      return pending("an AddressSanitizer flow.so cannot load into an uninstrumented lua5.4")
    end
    local o, e, c = run(env .. "lua5.4 -e " .. sh_quote([[
local flow = require "flow"
local nn = require "flow.nn"
local m = nn.Linear(3, 2)
print(package.searchpath("flow", package.cpath), flow.world_size(), flow.matmul(flow.ones({1, 2}), flow.ones({2, 4})):sum():item())
print(package.searchpath("flow.nn", package.path), flow.nn == nn, #m:parameters())]]))
    assert.equal(0, c, e)
    assert.equal(("%s/lib/lua/5.4/flow.so\t1\t8.0\n%s/share/lua/5.4/flow/nn.lua\ttrue\t2\n"):format(prefix, prefix), o)
  end)

  it("installs the CUDA plugin next to flow.so, where flowlua and lua5.4 find it", function()
    if not cache_text:match("FLOW_CUDA:BOOL=ON") then return pending("this build has no CUDA support") end
    if cache_text:match("FLOW_SANITIZE:BOOL=ON") then
      return pending("an AddressSanitizer flow.so cannot load into an uninstrumented lua5.4")
    end
    -- the plugin's path as mapped after first use, and the GPU state (no GPU is fine: the plugin loaded)
    local probe = "flow = flow or require 'flow' local avail = flow.cuda.is_available() "
      .. "for l in io.lines('/proc/self/maps') do local p = l:match('(/%S*flow_cuda%.so)$') "
      .. "if p then print(p, avail or flow.cuda.unavailable_reason()) break end end"
    local plugin = prefix .. "/lib/lua/5.4/flow_cuda.so"
    local want = "^" .. plugin:gsub("%p", "%%%0") .. "\t(.*)\n$"
    for _, cmd in ipairs({ sh_quote(prefix .. "/bin/flowlua") .. " -e " .. sh_quote(probe),
                           env .. "lua5.4 -e " .. sh_quote(probe) }) do
      local o, e, c = run(cmd)
      assert.equal(0, c, e)
      local state = o:match(want)
      assert.truthy(state, o)
      assert.is_true(state == "true" or state:find("^no GPU found") ~= nil, state)
    end
  end)

  it("installs a pkg-config file whose flags compile a C extension op", function()
    if not has("pkg-config") or not has("cc") then return pending("pkg-config or cc is missing") end
    local pc = "PKG_CONFIG_PATH=" .. sh_quote(prefix .. "/" .. (cache_text:match("CMAKE_INSTALL_LIBDIR:PATH=([^\n]*)") or "lib") .. "/pkgconfig") .. " "
    local o, e, c = run(pc .. "pkg-config --modversion flowlua && " .. pc .. "pkg-config --variable=cmoddir flowlua")
    assert.equal(0, c, e)
    local version, cmoddir = o:match("^(%S+)\n(%S+)\n$")
    assert.equal(require("flow").__version, version)
    assert.is_true(os.execute("test -f " .. sh_quote(cmoddir .. "/flow.so")) == true, cmoddir)
    local src = prefix .. "/ext.c"
    local f = assert(io.open(src, "w"))
    f:write([[
#include <flowlua/ops/op.h>
#include <flowlua/lua/bind.h>
/* an op's inference: the output has the input's metadata */
static int same_infer(const flow_op *op, const flow_meta *in, int nin, const flow_attrs *a, flow_meta *out) {
  (void)op; (void)nin; (void)a;
  out[0] = in[0];
  return 0;
}
int luaopen_ext(lua_State *L) { lua_pushlightuserdata(L, (void *)same_infer); return 1; }
]])
    f:close()
    o, e, c = run(pc .. "cc -fsyntax-only -Wall -Werror $(" .. pc .. "pkg-config --cflags flowlua) " .. sh_quote(src))
    assert.equal(0, c, o .. e)
  end)
end)
