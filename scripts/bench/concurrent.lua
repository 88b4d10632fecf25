-- BOXES boxes x EXECS sequential execs each, all boxes at once (one
-- sbx.spawn task per box), ROUNDS times. Boxes are made before timing.
-- usage: sbx run concurrent.lua BOXES EXECS ROUNDS
local sbx = require "sbx"
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local nboxes = tonumber(arg[1]) or 16
local nexecs = tonumber(arg[2]) or 20
local rounds = tonumber(arg[3]) or 1

local t0 = sbx.now()
local makers = {}
for i = 1, nboxes do makers[i] = sbx.spawn(C.box) end
local boxes = sbx.gather(makers)
C.emit("conc_setup_s", sbx.now() - t0)

local rss = {}
for round = 1, rounds do
  local failures = 0
  local t = sbx.now()
  local tasks = {}
  for i, b in ipairs(boxes) do
    tasks[i] = sbx.spawn(function()
      local bad = 0
      for _ = 1, nexecs do
        local r, err, code = b:exec({ "true" })
        if not r or r.exit_code ~= 0 then
          bad = bad + 1
          C.note("exec failed: %s %s %s", tostring(err), tostring(code), r and tostring(r.exit_code) or "")
        end
      end
      return bad
    end)
  end
  for _, bad in ipairs(sbx.gather(tasks)) do failures = failures + bad end
  local elapsed = sbx.now() - t
  C.emit("conc_rate", nboxes * nexecs / elapsed)
  C.emit("conc_failures", failures)
  C.full_gc()
  rss[round] = C.status_kb("VmRSS")
  C.emit("conc_rss_kb", rss[round])
end
-- Growth of the resident set from the first round to the last: should be ~0.
C.emit("conc_rss_growth_kb", rss[#rss] - rss[1])

t0 = sbx.now()
local closers = {}
for i, b in ipairs(boxes) do closers[i] = sbx.spawn(function() return b:close() end) end
sbx.gather(closers)
C.emit("conc_teardown_s", sbx.now() - t0)
