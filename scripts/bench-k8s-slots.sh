#!/usr/bin/env bash
# Kubernetes boxes on a full node (issue 16's number): the stand-in with
# resource accounting, its one node sized for SLOTS boxes (allocatable cpu
# = SLOTS x 250m, the request of a cpus = 1 box at request_fraction 0.25),
# and BOXES boxes (create, one command, close) from WORKERS coroutines. A
# box that finds the node full waits (Pending, "Insufficient cpu") within
# start_timeout. Prints failures, how many boxes waited, the most running
# at once, and the wall time.
#
# Usage: scripts/bench-k8s-slots.sh [BOXES] [SLOTS] [WORKERS]   (defaults 100 10 16)
# Env: BENCH_IMAGE (default sbx-busybox:latest), SBX (default build/sbx)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
SBX=${SBX:-build/sbx}
[ -x "$SBX" ] || make >/dev/null
boxes=${1:-100} slots=${2:-10} workers=${3:-16}
dir=$(mktemp -d)
scripts/k8s-standin --port 0 --dir "$dir/certs" --kubeconfig "$dir/kubeconfig" \
  --node-cpu "$((slots * 250))m" >"$dir/out" 2>"$dir/log" & standin=$!
trap 'kill -TERM $standin 2>/dev/null; wait $standin 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do grep -q '^https' "$dir/out" && break; sleep 0.1; done
cat > "$dir/bench.lua" <<'LUA'
local sbx = require "sbx"
local kubeconfig, boxes, workers = arg[1], tonumber(arg[2]), tonumber(arg[3])
local image = os.getenv("BENCH_IMAGE") or "sbx-busybox:latest"
local waited, failed, running, most, next_i = {}, {}, 0, 0, 0
sbx.use_policy { kubernetes = { kubeconfig = kubeconfig, start_timeout = 600,
  on_wait = function(name) waited[name] = true end } }
local t0 = sbx.now()
local tasks = {}
for w = 1, workers do
  tasks[w] = sbx.spawn(function()
    while next_i < boxes do
      next_i = next_i + 1
      local b, err, code = sbx.box { backend = "kubernetes", image = image, transport = "exec", cpus = 1 }
      if not b then failed[#failed + 1] = tostring(code) .. ": " .. tostring(err)
      else
        running = running + 1
        most = math.max(most, running)
        local r = b:exec("true")
        if not r or r.exit_code ~= 0 then failed[#failed + 1] = "exec failed" end
        running = running - 1
        b:close()
      end
    end
  end)
end
sbx.gather(tasks)
local nw = 0
for _ in pairs(waited) do nw = nw + 1 end
print(string.format("boxes %d, workers %d: %d failed, %d waited for a slot, at most %d running at once, %.1f s wall",
  boxes, workers, #failed, nw, most, sbx.now() - t0))
if failed[1] then print("first failure: " .. failed[1]) end
LUA
echo "stand-in at $(head -1 "$dir/out"), node cpu $((slots * 250))m ($slots boxes of cpus = 1)" >&2
"$SBX" run "$dir/bench.lua" "$dir/kubeconfig" "$boxes" "$workers"
echo "scheduler said Unschedulable $(curl -sk "$(head -1 "$dir/out")/_standin/state" | python3 -c 'import json,sys; print(json.load(sys.stdin)["unschedulable_seen"])') times" >&2
