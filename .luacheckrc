-- luacheck (Debian's lua-check) over lua/, tests/ and scripts/: the Lua
-- side's lint, run by tests/style_test.lua. It is there for defects (a
-- global set by mistake, an undefined name, a value never used, a shadowed
-- local); layout is not its business:
std = "lua54"
max_line_length = false      -- long messages and tables read better whole
unused_args = false          -- callbacks keep the signature they are called with
ignore = {
  "4..",                     -- nested scopes reuse short names (ok, err, pol) on purpose
  "542",                     -- an empty branch that says, in a comment, why nothing happens
  "581",                     -- 'not (x > y)' is how NaN is refused, on purpose
}
-- Tests and benchmarks reuse `local r, err, code` from one step to the next
-- and keep values for the reader: only the defects that change what runs
-- (globals, undefined names) count there.
files["tests/"] = { ignore = { "211", "221", "231", "311" } }
files["scripts/"] = { ignore = { "211", "221", "231", "311" } }
-- sbx run gives a script the module as the global sbx.
files["lua/examples/"] = { read_globals = { "sbx" } }
-- The command line replaces io.write and os.exit while a script runs (its
-- stdout guard, cleanup before exit).
files["lua/sbx/cli.lua"] = { globals = { "io", "os" } }
