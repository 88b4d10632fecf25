-- needs: nothing
-- The backend contract (lua/sbx/backend.lua): every backend sbx ships and
-- the fake one pass the check; a module that breaks it is refused when it
-- loads, by sbx.box and sbx.pool alike, with a message naming every
-- missing or mistyped function, and no box is made.
local tap = require "tap"
local sbx = require "sbx"
local backend = require "sbx.backend"

local fake = require "fake_backend"
package.loaded["sbx.backends.fake"] = fake

for _, name in ipairs { "docker", "local", "kubernetes", "fargate", "replay", "fake" } do
  local ok, err = pcall(backend.load, name)
  tap.ok(ok, "the " .. name .. " backend keeps the contract", not ok and tostring(err) or nil)
end

-- Every contract entry is documented and has a known requirement.
local kinds = { required = true, ["unless bind"] = true, exec = true, agent = true, optional = true }
local well_formed = true
for _, c in ipairs(backend.CONTRACT) do
  if type(c[1]) ~= "string" or not (c[2] == "function" or c[2] == "string") or not kinds[c[3]]
    or type(c[4]) ~= "string" or #c[4] < 20 then
    well_formed = false
  end
end
tap.ok(well_formed, "every entry of CONTRACT has a name, a type, a requirement and a description")

-- A broken backend: the fake with parts taken away or mistyped.
local n = 0
local function broken(edit)
  n = n + 1
  local mod = {}
  for k, v in pairs(fake) do mod[k] = v end
  edit(mod)
  local name = "broken" .. n
  package.loaded["sbx.backends." .. name] = mod
  return name
end

local made = fake.created
local name = broken(function(m) m.destroy = nil end)
tap.checkerr("backend 'broken1' breaks the backend contract %(sbx.backend%): it has no destroy %(destroy%(handle, detached",
  sbx.box, { backend = name })
tap.is(fake.created, made, "no box was made by a backend that breaks the contract")
tap.checkerr("sbx.pool: backend 'broken1' breaks the backend contract", sbx.pool, { size = 1, box = { backend = name } })

name = broken(function(m) m.finish = nil end)
tap.checkerr("it has no finish", sbx.box, { backend = name })
name = broken(function(m) m.start, m.finish = nil, nil end)
tap.checkerr("it has no start.*it has no finish", sbx.box, { backend = name })

name = broken(function(m) m.create, m.reap = nil, nil end)
local ok, err = pcall(sbx.box, { backend = name })
tap.ok(not ok and err:find("it has no create", 1, true) and err:find("it has no reap", 1, true),
  "every problem is named in one message", tostring(err))

name = broken(function(m) m.restart = "yes" end)
tap.checkerr("its restart is a string, not a function", sbx.box, { backend = name })

name = broken(function(m) m.text_argv = true end)
tap.checkerr("its text_argv is a boolean, not a string", sbx.box, { backend = name })

name = broken(function(m) m.agent_attach = function() end end)
tap.checkerr("it has no agent_channel", sbx.box, { backend = name })

name = broken(function(m) m.start, m.finish, m.kill = nil, nil, nil end)
tap.checkerr("it has no way to run a command", sbx.box, { backend = name })

-- kill is the backend's choice: without one, the exec transport's kill
-- runs sbx.job.kill_request through start and finish.
name = broken(function(m) m.kill = nil end)
local nokill = fake.started
local hang = assert(sbx.box { backend = name, policy = { exec = { kill_grace = 0.3 } }, respond = function(_, cmd)
  if cmd and cmd:find("sleep", 1, true) then return { hang = true } end
  return { stdout = "1\n" }
end })
local hr = assert(hang:exec("sleep 100", { timeout = 0.2 }))
tap.ok(hr.timed_out, "a backend without kill: the command times out")
local kill_cmd = table.concat(nokill[#nokill].argv, " ")
tap.like(kill_cmd, "kill %-s", "and the exec transport killed it with the kill request, as another command")
hang:close()

-- Each way to run commands is enough on its own; restart is not needed by
-- a backend that answers at the method level.
name = broken(function(m)
  m.start, m.finish, m.kill = nil, nil, nil
  m.agent_channel = function() return nil, "no agent here", "agent_unavailable" end
end)
tap.ok(pcall(backend.load, name), "agent_channel alone runs commands")
name = broken(function(m)
  m.start, m.finish, m.kill, m.restart = nil, nil, nil, nil
  m.bind = function() end
end)
tap.ok(pcall(backend.load, name), "bind alone runs commands, and needs no restart")
name = broken(function(m) m.restart = nil end)
tap.checkerr("it has no restart", backend.load, name)

-- A module that is not a table, and one that is not there.
package.loaded["sbx.backends.notatable"] = function() end
tap.checkerr("its module is a function, not a table", sbx.box, { backend = "notatable" })
tap.checkerr("unknown backend 'nope'", sbx.box, { backend = "nope" })

-- The fake keeps working after all this (the check is not a one-way latch).
local box = assert(sbx.box { backend = "fake", respond = function() return { stdout = "hi" } end })
tap.is(assert(box:exec("x")).stdout, "hi", "a backend that keeps the contract runs commands")
box:close()

tap.done()
