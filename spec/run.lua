-- Runs busted under flowlua: `flowlua spec/run.lua [busted options] [spec files or dirs]`.
-- Debian's busted keeps its Lua files under /usr/share/lua/5.1; they run unchanged on 5.4.
package.path = table.concat({
  "./?.lua", "./spec/?.lua",
  "/usr/share/lua/5.4/?.lua", "/usr/share/lua/5.4/?/init.lua",
  "/usr/share/lua/5.1/?.lua", "/usr/share/lua/5.1/?/init.lua",
  package.path }, ";")
package.cpath = "/usr/lib/x86_64-linux-gnu/lua/5.4/?.so;" .. package.cpath
local args = { [0] = "busted", "-o", "spec/support/summary.lua" }
for i = 1, #arg do args[#args + 1] = arg[i] end
arg = args
require "busted.runner" ({ standalone = false })
