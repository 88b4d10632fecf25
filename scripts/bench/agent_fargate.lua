-- exec `true` on a Fargate box over the AWS stand-in, agent beside exec
-- transport (the stand-in is started here; its "cloud" is this machine's
-- dockerd, so these are sbx's own costs, not AWS's).
--   sbx run scripts/bench/agent_fargate.lua [N]
package.path = "tests/lib/?.lua;" .. package.path
local sbx = require "sbx"
local H = require "helper"
local n = tonumber(arg[1]) or 100
local standin = assert(H.standin())
sbx.use_policy { fargate = {
  endpoint_url = standin.url, region = "us-east-1", credentials = standin.credentials,
  subnets = { "subnet-bench" }, poll_interval = 0.1,
} }
local function median(l) table.sort(l) return l[math.max(1, math.ceil(#l / 2))] end
print("| measure | median | note |")
print("|---|---|---|")
for _, tr in ipairs { "agent", "exec" } do
  local t0 = sbx.now()
  local box = assert(sbx.box { backend = "fargate", image = os.getenv("BENCH_IMAGE") or "sbx-busybox:latest", transport = tr })
  local created = sbx.now() - t0
  assert(box:exec("true").exit_code == 0)   -- the first
  local times = {}
  for i = 1, (tr == "agent" and n or math.min(n, 30)) do
    local s = sbx.now()
    assert(box:exec("true").exit_code == 0)
    times[i] = sbx.now() - s
  end
  print(string.format("| Fargate over the stand-in: exec `true` after the first, %s | %.1f ms | n=%d; create %.2f s |",
    tr, median(times) * 1000, #times, created))
  box:close()
end
standin:stop()
