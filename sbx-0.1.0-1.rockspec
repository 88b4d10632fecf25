-- luarocks --lua-version 5.4 make sbx-0.1.0-1.rockspec, in a clone of the
-- repository: builds sbx.so with the project's Makefile (offline; the
-- libraries come from pkg-config, as for make) and installs it so that
-- require "sbx" works in a stock lua5.4. The version is SBX_VERSION in
-- src/sbx.h (tests/rockspec_test.sh checks that they agree).
rockspec_format = "3.0"
package = "sbx"
version = "0.1.0-1"
source = {
  -- luarocks make builds from the current directory and never fetches this.
  url = "git+file://.",
}
description = {
  summary = "Embeddable, Lua-scriptable sandbox runner (Docker, AWS Fargate)",
  detailed = [[
sbx runs untrusted commands in isolated boxes (Docker containers, AWS Fargate
tasks) for evaluation harnesses and LLM agent loops: streaming, bounded
output, process-tree kills, background processes and files, all driven from
Lua coroutines on one event loop, with policy written in Lua.]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "make",
  build_target = "module",
  build_variables = {
    LUA = "$(LUA)",                 -- runs scripts/embed.lua at build time
    ROCK_CFLAGS = "$(CFLAGS)",      -- luarocks' configured flags, after ours
  },
  install_target = "install-module",
  install_variables = {
    LUA_CMOD = "$(LIBDIR)",
  },
}
