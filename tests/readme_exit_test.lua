-- needs: docker, local, python3
-- `sbx run` exits when its script ends, closing the boxes the script left
-- open, on every backend and transport. The README's Kubernetes and Fargate
-- snippets are that shape (no <close>, no box:close()): they run here as
-- written, taken from README.md, against the stand-ins, with the
-- configuration a user has in the environment (KUBECONFIG; AWS_* variables),
-- the default transport (the agent) and then the exec transport (a policy
-- file, SBX_POLICY). Each run must end by itself well inside a generous
-- bound (timeout(1) kills a run that hangs: exit 124) and leave nothing in
-- the stand-in. The snippets name python:3.12 images; the test builds one
-- from sbx-debian:12 and this host's python3 (tests/python_image.sh, no
-- registry) and gives it those names only while it runs.
local tap = require "tap"
local H = require "helper"
local K = require "k8s_helper"
local sbx = require "sbx"

local BOUND = 90   -- seconds; a run takes a few
local sbx_bin = H.sbx_bin
if sbx_bin:sub(1, 1) ~= "/" then sbx_bin = os.getenv("PWD") .. "/" .. sbx_bin end
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local readme = assert(K.slurp("README.md"))
-- The first ```lua block after a heading.
local function snippet(heading)
  local at = assert(readme:find("\n## " .. heading .. "\n", 1, true), "README has a ## " .. heading .. " section")
  local code = readme:match("```lua\n(.-)```", at)
  return assert(code, "a lua block under ## " .. heading)
end

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -m 700 -p " .. q(dir)))
local function write(name, text)
  local path = dir .. "/" .. name
  K.write(path, text)
  return path
end
local exec_policy = write("exec.lua", 'return { box = { transport = "exec" } }\n')

-- env: a shell prefix. Returns output, exit code.
local function run(env, script)
  return H.sh(string.format("cd %s && env HOME=%s %s timeout -k 5 %d %s run %s </dev/null",
    q(dir), q(dir), env, BOUND, q(sbx_bin), q(script)))
end

-- The image the snippets name, under each of their names.
local function image_names(code)
  local names = {}
  for name in code:gmatch('image = "([^"]+)"') do names[#names + 1] = name end
  return names
end
-- The snippets run on the stand-ins, whose pods and tasks are containers
-- of Docker's own daemon whatever DOCKER_HOST names (make test-podman
-- points it at Podman): their images go there.
local DOCKER = "env -u DOCKER_HOST docker"
local PY = "sbx-test-python:3"
local _, built = H.sh(DOCKER .. " image inspect " .. PY .. " >/dev/null 2>&1 || env -u DOCKER_HOST tests/python_image.sh " .. PY)
tap.is(built, 0, "a python3 image built from sbx-debian:12 (" .. PY .. ")")
local tagged = {}
local function provide(code)
  for _, name in ipairs(image_names(code)) do
    local _, have = H.sh(DOCKER .. " image inspect " .. q(name) .. " >/dev/null 2>&1")
    if have ~= 0 then
      local _, rc = H.sh(DOCKER .. " tag " .. PY .. " " .. q(name))
      if rc == 0 then tagged[#tagged + 1] = name end
    end
  end
end
local function untag()
  -- `docker rmi` of a tag an image has others of only removes the tag.
  for _, name in ipairs(tagged) do H.sh(DOCKER .. " rmi " .. q(name) .. " >/dev/null") end
  tagged = {}
end

-- The snippets run inside a pcall: the image names are untagged whatever happens.
local ok, failure = pcall(function()

-- Kubernetes -------------------------------------------------------------------------------

do
  local code = snippet("Kubernetes")
  tap.like(code, 'backend = "kubernetes"', "the README's Kubernetes snippet")
  tap.ok(not code:find("<close>", 1, true) and not code:find(":close()", 1, true), "which leaves its box open")
  provide(code)
  local standin = assert(K.standin())
  local script = write("kubernetes.lua", 'local sbx = require "sbx"\n' .. code)
  for _, tr in ipairs { { "agent (the default)", "" }, { "exec", "SBX_POLICY=" .. q(exec_policy) } } do
    local out, rc = run("KUBECONFIG=" .. q(standin.kubeconfig) .. " " .. tr[2], script)
    tap.is(rc, 0, "Kubernetes, " .. tr[1] .. ": sbx run exits by itself when the script ends (124: it hung)\n" .. out)
    tap.like(out, "^42\n", "the snippet printed python's answer")
    local pods = assert(standin:state()).pods
    tap.is(#pods, 0, "and its pod is gone from the stand-in")
  end
  standin:stop()
end

-- Fargate ----------------------------------------------------------------------------------

do
  local code = snippet("Fargate")
  tap.like(code, 'backend = "fargate"', "the README's Fargate snippet")
  tap.ok(not code:find("<close>", 1, true) and not code:find(":close()", 1, true), "which leaves its box open")
  provide(code)
  local st = assert(H.standin())
  local script = write("fargate.lua", 'local sbx = require "sbx"\n' .. code)
  local env = string.format("AWS_ENDPOINT_URL=%s AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s AWS_REGION=us-east-1",
    q(st.url), q(st.credentials.access_key), q(st.credentials.secret_key))
  for _, tr in ipairs { { "agent (the default)", "" }, { "exec", "SBX_POLICY=" .. q(exec_policy) } } do
    local out, rc = run(env .. " " .. tr[2], script)
    tap.is(rc, 0, "Fargate, " .. tr[1] .. ": sbx run exits by itself when the script ends (124: it hung)\n" .. out)
    tap.like(out, "^42\n", "the snippet printed python's answer")
    local live = {}
    for _, t in ipairs(assert(st:state()).tasks) do
      if t.lastStatus ~= "STOPPED" then live[#live + 1] = t.taskArn end
    end
    tap.is(#live, 0, "and its task is stopped in the stand-in")
  end
  st:stop()
end

end)
untag()
if not ok then error(failure, 0) end

-- Docker and local -------------------------------------------------------------------------

do
  for _, backend in ipairs { "docker", "local" } do
    local script = write(backend .. ".lua", string.format([[local sbx = require "sbx"
local box = assert(sbx.box { backend = %q, image = %q })
print(box.id, box:exec("echo hi").stdout, box.handle.dir)
]], backend, H.image))
    -- The local backend has only the agent transport.
    local transports = { { "agent (the default)", "" } }
    if backend == "docker" then transports[2] = { "exec", "SBX_POLICY=" .. q(exec_policy) } end
    for _, tr in ipairs(transports) do
      local out, rc = run(tr[2], script)
      tap.is(rc, 0, backend .. ", " .. tr[1] .. ": sbx run exits by itself with a box left open\n" .. out)
      local id = out:match("^(%S+)\thi\n")
      tap.ok(id, "the box ran the command")
      if backend == "docker" then
        local c = id and H.container(id)
        tap.ok(id and not c, "and its container is gone")
      else
        local box_dir = out:match("\thi\n\t(/%S+)")
        -- [b]: the pattern does not match the shell that runs pgrep.
        local _, alive = H.sh("pgrep -f " .. q("[b]oxes/" .. (id or "none")) .. " >/dev/null")
        tap.ok(id and alive ~= 0, "and no process of it is left")
        tap.ok(box_dir and sbx.core.path_type(box_dir) == nil, "and its directory is gone")
      end
    end
  end
end

H.sh("rm -rf " .. q(dir))
tap.done()
