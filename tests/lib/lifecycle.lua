-- The lifecycle half of the backend conformance suite (the command half is
-- tests/lib/conformance.lua): the same checks of the backend contract
-- (lua/sbx/backend.lua) on every backend. A runner file gives a way to make
-- a box and what the backend can show:
--   require("lifecycle").run(tap, "docker", function(opts) return sbx.box(opts) end, {
--     backend = "docker",          -- what box.backend must say
--     limits = true,               -- false: the backend declares none (box.limits = false)
--     refuse = { network = "x" },  -- options it cannot enforce (refused, nothing made), optional
--     exists = function(box) end,  -- does the box still exist on its server? optional
--     count = function() end,      -- how many boxes exist now, optional (for refusals)
--   })
-- make(opts) adds the runner's own options (image, backend, ...) to opts.
-- It makes three boxes: keep it cheap.
local sbx = require "sbx"
local M = {}

local KINDS = require("sbx.limits").KINDS
local OPTIONS = require("sbx.limits").OPTIONS

-- Waits up to seconds for f() to be true, on the loop.
local function eventually(f, seconds)
  local deadline = sbx.now() + seconds
  while sbx.now() < deadline do
    if f() then return true end
    sbx.sleep(0.05)
  end
  return f() and true or false
end

function M.run(tap, label, make, caps)
  local function t(name) return label .. " lifecycle: " .. name end

  -- Options are checked before anything is made.
  local before = caps.count and caps.count()
  local ok, err = pcall(make, { no_such_option = 1 })
  tap.ok(not ok and tostring(err):find("unknown box option 'no_such_option'", 1, true),
    t("an unknown option raises, naming it"), tostring(err))
  ok, err = pcall(make, { memory = {} })
  tap.ok(not ok and tostring(err):find("memory", 1, true), t("an option of the wrong type raises, naming it"),
    tostring(err))
  for name, value in pairs(caps.refuse or {}) do
    local b, msg, code = make { [name] = value }
    tap.ok(b == nil and code == "unsupported" and tostring(msg):find(name, 1, true),
      t("an option it cannot enforce is refused: " .. name), tostring(msg) .. " " .. tostring(code))
    if b then b:close() end
  end
  if caps.count then tap.is(caps.count(), before, t("nothing was made by a refused box")) end

  -- A box, its identity and its limits.
  local box, msg, code = make {}
  tap.ok(box, t("a box is made"), tostring(msg) .. " " .. tostring(code))
  if not box then return end
  tap.ok(type(box.id) == "string" and #box.id > 0, t("box.id names it"))
  tap.is(box.backend, caps.backend, t("box.backend says " .. caps.backend))
  tap.like(tostring(box), caps.backend, t("tostring names the backend"))
  if caps.limits == false then
    tap.is(box.limits, false, t("box.limits is false: the backend declares nothing"))
  else
    local bad = {}
    for _, name in ipairs(OPTIONS) do
      local e = type(box.limits) == "table" and box.limits[name]
      if type(e) ~= "table" or not (e.enforced == false or KINDS[e.enforced]) then bad[#bad + 1] = name end
    end
    tap.is(table.concat(bad, ","), "", t("box.limits says how every isolation option is enforced"))
  end
  if caps.exists then tap.ok(caps.exists(box), t("the box exists on its server")) end

  -- close: idempotent, the box gone, its methods refused.
  local closed, cerr = box:close()
  tap.ok(closed, t("close succeeds"), tostring(cerr))
  tap.is(box:close(), true, t("close again is true and does nothing"))
  tap.checkerr("closed box", function() return box:exec("true") end)
  if caps.exists then tap.ok(not caps.exists(box), t("a closed box is gone from its server")) end

  -- A box dropped without close is removed by the collector, without
  -- blocking it.
  -- (made and dropped in a function of its own: no register of this one
  -- keeps it)
  local function make_and_drop()
    local b = make {}
    return b and { id = b.id, handle = b.handle }
  end
  local probe = make_and_drop()
  tap.ok(probe, t("a second box is made"))
  if probe then
    local t0 = sbx.now()
    collectgarbage()
    collectgarbage()
    tap.ok(sbx.now() - t0 < 1, t("the collector does not wait for the server"))
    if caps.exists then
      tap.ok(eventually(function() return not caps.exists(probe) end, 30), t("a dropped box is removed"))
    end
  end

  -- The reaper answers with the contract's report (dry run: nothing goes).
  local report, rerr = sbx.reap { backend = caps.backend, dry_run = true }
  tap.ok(type(report) == "table" and type(report.removed) == "table" and math.type(report.kept) == "integer",
    t("reap reports { removed = list, kept = n }"), tostring(rerr))

  -- A box its server lost (removed behind sbx's back) still closes, once.
  if caps.remove_behind then
    local b = make {}
    tap.ok(b, t("a third box is made"))
    if b then
      caps.remove_behind(b)
      local t0 = sbx.now()
      local okc, e = pcall(b.close, b)
      tap.ok(okc, t("closing a box its server already removed does not raise"), tostring(e))
      tap.ok(sbx.now() - t0 < 30, t("and returns within the destroy timeout"))
      tap.is(b:close(), true, t("and close again is true"))
    end
  end
end

return M
