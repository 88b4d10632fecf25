-- Validation of policies and box options. A policy (or a box's options) is
-- checked when it is loaded, so a mistake is an error that names the field
-- and what it needs, not a confusing failure deep inside a later call.
--
-- The rules come from the defaults in sbx.policy: a knob's default says its
-- type (a number is a number >= 0, a function a function, a table of named
-- fields a record whose other keys are unknown). RULES below adds only what
-- a default cannot say: ranges, choices, nil defaults, open maps (env,
-- labels, the tool table) and lists. An unknown key is an error that
-- suggests the nearest known name.
local M = {}

local function rule(types, extra)
  local r = extra or {}
  r.types = types
  return r
end
local function num(extra) return rule({ "number" }, extra) end
local function int(extra) local r = rule({ "integer" }, extra) return r end
local function str(extra) return rule({ "string" }, extra) end
local function maybe(r) r.nullable = true return r end
local function map(value, key) return rule({ "table" }, { map = value, key = key }) end
local function list(elem) return rule({ "table" }, { list = elem }) end
local ANY = rule({ "any" })
local SCALAR = rule({ "string", "number", "boolean" })
local BOOL = rule({ "boolean" })
local FN = rule({ "function" })
local POS = num { gt = 0 }
local SIZE = int { ge = 0 }
local PART = rule({ "table" }, { fields = { head = SIZE, tail = SIZE } })
local TEXT = rule({ "string", "function" })   -- a text, or a function of the policy giving it
-- Environment variables: NAME = value, as a shell exports them; a value
-- reaches the box as a C string, so it may not hold a NUL byte.
local function env_name(k)
  if type(k) ~= "string" or not k:match("^[A-Za-z_][A-Za-z0-9_]*$") then
    return string.format("%s is not a valid environment variable name (letters, digits and '_', not starting with a digit)",
      type(k) == "string" and string.format("%q", k) or tostring(k))
  end
end
local ENV = map(rule({ "string", "number", "boolean" }, { check = function(v)
  if type(v) == "string" and v:find("\0", 1, true) then return "must not contain a NUL byte" end
end }), env_name)

-- A tool parameter: { "name", { json schema }, required = bool }.
local PARAM = rule({ "table" }, { check = function(v)
  if type(v[1]) ~= "string" or type(v[2]) ~= "table" then
    return "must be { \"name\", { type = ..., description = ... }, required = true|nil }"
  end
  if v.required ~= nil and type(v.required) ~= "boolean" then return "required must be a boolean" end
  local d = v[2].description
  if d ~= nil and type(d) ~= "string" and type(d) ~= "function" then
    return "a parameter's description must be a string or a function of the policy"
  end
end })

local TOOL = rule({ "table", "false" }, { fields = {
  name = maybe(str()), description = TEXT, parameters = list(PARAM), run = maybe(FN),
} })

-- Rules by dotted path ("a.b.c"). A record's fields are derived from the
-- defaults; these win where both exist.
local RULES = {
  ["box.backend"] = str(),
  ["docker.auto_timeout"] = POS,
  ["box.image"] = str { nonempty = true },
  ["box.workdir"] = maybe(str()),
  ["box.memory"] = rule({ "number", "false" }, { gt = 0 }),
  ["box.cpus"] = rule({ "number", "false" }, { gt = 0 }),
  ["box.pids"] = rule({ "integer", "false" }, { gt = 0 }),
  ["box.disk"] = rule({ "integer", "false" }, { gt = 0 }),
  ["box.network"] = str(),
  ["box.env"] = ENV,
  ["box.labels"] = map(SCALAR),
  ["box.tmpfs"] = map(str()),
  ["box.cap_drop"] = list(str()),
  ["box.cap_add"] = list(str()),
  ["box.ulimits"] = maybe(map(int { ge = 0 })),
  ["box.podman_ulimits"] = map(int { ge = 0 }),
  ["box.lifetime"] = POS,
  ["box.pull"] = str { enum = { "missing", "always", "never" } },
  ["progress.mode"] = str { enum = { "auto", "always", "never" } },
  ["progress.after"] = num { ge = 0 },
  ["progress.interval"] = num { ge = 0 },
  ["progress.plain_interval"] = num { ge = 0 },
  ["progress.format"] = FN,
  ["harness.error_lines"] = int { ge = 0 },
  ["harness.error_chars"] = int { gt = 0 },
  ["box.transport"] = str { enum = { "auto", "agent", "exec" } },
  ["agent.start_timeout"] = POS,
  ["agent.window"] = int { gt = 4095 },
  ["agent.channel_buffer"] = int { gt = 0 },
  ["agent.stdin_chunk"] = int { gt = 0 },
  ["agent.ping_interval"] = POS,
  ["agent.ping_timeout"] = POS,
  ["agent.reattach_grace"] = int { ge = 0, le = 86400 },
  ["agent.reattach_timeout"] = num { ge = 0 },
  ["agent.attach_timeout"] = POS,
  ["agent.clear_timeout"] = POS,
  ["agent.private_output"] = BOOL,
  ["agent.ack_bytes"] = int { ge = 4096, le = 512 * 1024 },
  ["box.docker_host"] = maybe(str()),
  ["exec.timeout"] = POS,
  ["exec.max_timeout"] = POS,
  ["exec.shell"] = rule({ "string", "table" }, { enum_if_string = { "auto", "bash", "sh" }, list = str() }),
  ["exec.env"] = ENV,
  ["exec.capture"] = rule({ "table" }, { fields = { stdout = PART, stderr = PART, output = PART } }),
  ["exec.chunk_limit"] = int { gt = 0 },
  ["exec.max_arg_bytes"] = int { gt = 0 },
  ["exec.on_unkillable"] = str { enum = { "restart", "leave" } },
  ["background.log"] = PART,
  ["background.max_name_length"] = int { gt = 0 },
  ["background.read_max"] = int { gt = 0 },
  ["background.retain_bytes"] = SIZE,
  ["files.max_read"] = SIZE,
  ["files.max_write"] = SIZE,
  ["mcp.progress_interval"] = POS,
  ["mcp.max_line"] = int { gt = 0 },
  ["http.max_body"] = int { gt = 0 },
  ["http.max_buffer"] = int { gt = 0 },
  ["http.retry_codes"] = map(BOOL),
  ["http.retry_statuses"] = map(BOOL, "integer"),
  ["trace.path"] = maybe(str()),
  ["trace.redact"] = list(str()),
  ["trace.secrets"] = list(str()),
  ["hooks.before_exec"] = maybe(FN),
  ["hooks.after_exec"] = maybe(FN),
  ["budget.commands"] = maybe(int { ge = 0 }),
  ["budget.seconds"] = maybe(num { ge = 0 }),
  ["budget.output_bytes"] = maybe(int { ge = 0 }),
  ["budget_poll"] = POS,
  ["output.head_chars"] = SIZE,
  ["output.tail_chars"] = SIZE,
  ["tools"] = map(TOOL),
  ["tool_order"] = list(str()),
  ["user"] = map(ANY),
  ["docker.api_timeout"] = POS,
  ["docker.ping_timeout"] = POS,
  ["docker.pull_timeout"] = POS,
  ["docker.kill_timeout"] = POS,
  ["docker.create_grace"] = num { ge = 0 },
  ["docker.disk_poll"] = POS,
  ["docker.disk_poll_load"] = num { gt = 0 },
  ["docker.agent_bind"] = BOOL,
  ["docker.agent_dir"] = maybe(str { check = function(v)
    if v:sub(1, 1) ~= "/" then return "must be an absolute path" end
  end }),
  ["images.dir"] = maybe(str { nonempty = true }),
  ["images.archives"] = list(str { nonempty = true }),
  ["images.max_bytes"] = int { gt = 0 },
  ["images.max_layer_bytes"] = int { gt = 0 },
  ["images.max_image_bytes"] = int { gt = 0 },
  ["images.max_layer_entries"] = int { gt = 0 },
  ["images.max_manifest_bytes"] = int { gt = 0 },
  ["images.device_nodes"] = str { enum = { "refuse", "skip" } },
  ["images.platform"] = maybe(str { check = function(v)
    if type(v) == "string" and not v:match("^[%w_]+/[%w_]+$") and not v:match("^[%w_]+/[%w_]+/[%w_]+$") then
      return "must be os/arch or os/arch/variant, such as linux/arm64/v8"
    end
  end }),
  ["images.insecure_registries"] = list(str { nonempty = true }),
  ["images.hub.aliases"] = list(str { nonempty = true }),
  ["images.docker_config"] = maybe(str()),
  ["images.timeout"] = POS,
  ["images.connect_timeout"] = POS,
  ["images.stall_timeout"] = POS,
  ["images.blob_timeout"] = POS,
  ["images.max_attempts"] = int { gt = 0 },
  ["images.retry_statuses"] = map(BOOL, "integer"),
  ["images.retry_transport"] = map(BOOL),
  ["images.parallel"] = int { gt = 0 },
  ["images.lock_timeout"] = POS,
  ["harness.concurrency"] = int { gt = 0 },
  ["pool.size"] = int { ge = 0 },
  ["pool.create_concurrency"] = int { gt = 0 },
  ["pool.backoff"] = rule({ "table" }, { fields = { base = POS, max = POS } }),
  ["pool.max_age"] = maybe(num { gt = 0 }),
  ["pool.lifetime_margin"] = num { gt = 0, check = function(v)
    if v >= 1 then return "must be below 1 (a part of the lifetime)" end
  end },
  ["harness.task_box_options"] = list(str()),
  ["harness.task_host_access"] = list(str { enum = { "image:host", "image:rootfs", "image:path", "network:host",
    "docker_host", "host_config", "layers" } }),
  ["harness.load_timeout"] = POS,
  ["hooks.timeout"] = POS,
  ["scheduler.slice"] = rule({ "number", "false" }, { gt = 0 }),
  ["grade.check_box"] = rule({ "string" }, { check = function(v)
    if v ~= "fresh" and v ~= "same" then return 'must be "fresh" or "same"' end
  end }),
  ["grade.max_output_bytes"] = int { gt = 0 },
  ["grade.max_output_entries"] = int { gt = 0 },
  ["grade.max_output_path"] = int { gt = 0, check = function(v)
    if v > 65536 then return "must be at most 65536" end
  end },
  ["grade.transfer_timeout"] = POS,
  ["local.busybox"] = maybe(str()),
  ["fargate.region"] = maybe(str()),
  ["fargate.profile"] = maybe(str()),
  ["fargate.credentials"] = maybe(rule({ "table" }, { fields = {
    access_key = str(), secret_key = str(), session_token = maybe(str()) } })),
  ["fargate.endpoint_url"] = maybe(str()),
  ["fargate.subnets"] = maybe(list(str())),
  ["fargate.security_groups"] = maybe(list(str())),
  ["fargate.task_role_arn"] = maybe(str()),
  ["fargate.execution_role_arn"] = maybe(str()),
  ["fargate.task_cpu"] = rule({ "string", "integer" }),
  ["fargate.task_memory"] = rule({ "string", "integer" }),
  ["fargate.start_timeout"] = POS,
  ["fargate.command_start_timeout"] = POS,
  ["fargate.ready_poll"] = POS,
  ["fargate.ssm.keepalive_interval"] = maybe(num { gt = 0 }),
  ["kubernetes.kubeconfig"] = maybe(rule({ "string", "table" }, { list = str() })),
  ["kubernetes.context"] = maybe(str()),
  ["kubernetes.namespace"] = maybe(str { nonempty = true }),
  ["kubernetes.in_cluster"] = rule({ "boolean", "string" }, { enum_if_string = { "auto" } }),
  ["kubernetes.service_account_dir"] = str { nonempty = true },
  ["kubernetes.container"] = str { nonempty = true },
  ["kubernetes.start_timeout"] = POS,
  ["kubernetes.watch_timeout"] = int { gt = 0 },
  ["kubernetes.request_timeout"] = POS,
  ["kubernetes.connect_timeout"] = POS,
  ["kubernetes.retries"] = int { ge = 0 },
  ["kubernetes.token_reread"] = num { ge = 0 },
  ["kubernetes.exec_plugin_timeout"] = POS,
  ["kubernetes.exec_protocols"] = list(str { enum = { "v5.channel.k8s.io", "v4.channel.k8s.io" } }),
  ["kubernetes.exec_connect_timeout"] = POS,
  ["kubernetes.exec_max_message"] = int { gt = 0 },
  ["kubernetes.exec_max_send"] = int { gt = 1 },
  ["kubernetes.wait_unschedulable"] = list(str { nonempty = true }),
  ["kubernetes.on_wait"] = maybe(rule({ "function" })),
  ["kubernetes.request_fraction"] = num { gt = 0, le = 1 },
  ["kubernetes.network_check"] = rule({ "string", "false" }, { enum_if_string = { "note", "refuse" } }),
  ["kubernetes.network_check_timeout"] = POS,
  ["kubernetes.gone_check_timeout"] = POS,
  ["kubernetes.gone_grace"] = num { ge = 0 },
  ["kubernetes.gone_poll"] = POS,
  ["kubernetes.exec_max_url"] = int { gt = 500 },
  ["kubernetes.stdin_chunk"] = int { gt = 0 },
  ["kubernetes.kill_timeout"] = POS,
  ["kubernetes.requests"] = maybe(map(SCALAR)),
  ["kubernetes.runtime_class"] = maybe(str { nonempty = true }),
  ["kubernetes.node_selector"] = maybe(map(str())),
  ["kubernetes.tolerations"] = maybe(list(map(ANY))),
  ["kubernetes.image_pull_secrets"] = maybe(list(str())),
  ["kubernetes.service_account"] = maybe(str { nonempty = true }),
  ["kubernetes.run_as_user"] = maybe(int { ge = 0 }),
  ["kubernetes.image_pull_policy"] = maybe(str { enum = { "Always", "IfNotPresent", "Never" } }),
  ["kubernetes.annotations"] = map(SCALAR),
  ["aws.throttling_codes"] = map(BOOL),
  ["aws.transient_codes"] = map(BOOL),
  ["aws.retry_statuses"] = map(BOOL, "integer"),
  ["aws.retry_transport"] = map(BOOL),
  ["aws.max_attempts"] = int { gt = 0 },
  ["local.state_dir"] = maybe(str()),
  ["local.ids"] = int { gt = 0 },
  ["local.cgroup_root"] = maybe(str()),
  ["local.capabilities"] = list(str()),
  ["local.seccomp"] = rule({ "table", "false" }, { fields = {
    deny = list(str()), enosys = list(str()), deny_namespaces = BOOL } }),
  ["local.host_masks"] = list(str { check = function(v)
    if v:sub(1, 1) ~= "/" then return "must be an absolute path" end
  end }),
  ["local.destroy_wait"] = POS,
  ["local.stale_after"] = POS,
  ["local.spares"] = int { ge = 0 },
  ["local.proc"] = str { enum = { "auto", "mount", "copy" } },
  ["local.auto"] = BOOL,
  ["local.layer"] = str { enum = { "auto", "tmpfs", "disk" } },
  ["local.disk_dir"] = maybe(str { check = function(v)
    if v:sub(1, 1) ~= "/" then return "must be an absolute path" end
  end }),
  ["local.disk_poll"] = POS,
  ["local.disk_poll_load"] = num { gt = 0, le = 1 },
  ["local.proc_files"] = list(str { check = function(v)
    if not v:match("^[%w_.-]+$") or v == "." or v == ".." then return "must be a file name in /proc" end
  end }),
  ["local.messages.proc_masked"] = str(),
  ["local.messages.userns_blocked"] = str(),
}
M.RULES = RULES

-- Box options that are not box defaults: what only sbx.box{} takes.
local BOX_ONLY = {
  policy = rule({ "string", "table" }),
  shell = RULES["exec.shell"],
  name = str(),
}

-- Descriptions ----------------------------------------------------------------

local function type_of(v)
  local t = type(v)
  if t == "number" then return math.type(v) == "integer" and "integer" or "float" end
  if v == false then return "false" end
  return t
end

local function show(v)
  local t = type(v)
  if t == "string" then
    return #v > 40 and string.format("the string %q...", v:sub(1, 40)) or string.format("the string %q", v)
  end
  if t == "number" or t == "boolean" then return tostring(v) end
  if t == "table" then return "a table" end
  return "a " .. t
end

local TYPE_WORDS = {
  number = "a number", integer = "an integer", string = "a string", table = "a table",
  ["function"] = "a function", boolean = "true or false", ["false"] = "false", any = "anything",
}

local function wants(r)
  local words = {}
  for _, t in ipairs(r.types) do
    local w = TYPE_WORDS[t] or t
    if (t == "number" or t == "integer") then
      if r.gt then w = w .. " > " .. r.gt elseif r.ge and r.ge ~= 0 then w = w .. " >= " .. r.ge
      elseif r.ge == 0 then w = w .. " >= 0" end
      if r.le then w = w .. " <= " .. r.le end
    end
    if t == "table" and r.list then w = "a list" end
    if t == "table" and r.map then w = "a table of name = value" end
    words[#words + 1] = w
  end
  if r.enum then
    local q = {}
    for _, e in ipairs(r.enum) do q[#q + 1] = string.format("%q", e) end
    return "one of " .. table.concat(q, ", ")
  end
  if r.nullable then words[#words + 1] = "nil" end
  return table.concat(words, " or ")
end

-- Levenshtein distance, for "did you mean".
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- The known name nearest to key, if it is near enough to be a typo.
function M.nearest(key, names)
  local best, bd
  for _, n in ipairs(names) do
    local d = distance(key:lower(), n:lower())
    if not bd or d < bd or (d == bd and n < best) then best, bd = n, d end
  end
  if best and bd <= math.max(1, math.min(3, #key // 3)) then return best end
  return nil
end

-- Rules ---------------------------------------------------------------------------

local function is_list(t)
  return type(t) == "table" and (#t > 0 or next(t) == nil)
end

-- The rule for a value at path whose default is dflt (either may be nil).
local function rule_for(path, dflt)
  local r = RULES[path]
  if r then return r end
  local t = type(dflt)
  if t == "number" then return num { ge = 0 } end
  if t == "string" then return str() end
  if t == "boolean" then return BOOL end
  if t == "function" then return FN end
  if t == "table" then
    if is_list(dflt) and #dflt > 0 then return list(rule_for(path .. ".*", dflt[1])) end
    return rule({ "table" }, { derived = dflt })
  end
  return nil
end

-- Known field names of a record at path (defaults plus rules).
local function fields_of(path, r)
  local names, seen = {}, {}
  local function add(n) if not seen[n] then seen[n] = true; names[#names + 1] = n end end
  if r.fields then for k in pairs(r.fields) do add(k) end end
  if r.derived then for k in pairs(r.derived) do if type(k) == "string" then add(k) end end end
  local prefix = path == "" and "" or path .. "."
  for p in pairs(RULES) do
    if p:sub(1, #prefix) == prefix then
      local rest = p:sub(#prefix + 1)
      if rest ~= "" and not rest:find(".", 1, true) then add(rest) end
    end
  end
  table.sort(names)
  return names
end

local function join(path, k)
  if path == "" then return tostring(k) end
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return path .. "." .. k end
  return string.format("%s[%s]", path, type(k) == "string" and string.format("%q", k) or tostring(k))
end

-- check(v, r, path, label) -> nil | message. label names what is checked
-- ("policy field", "box option").
local function check(v, r, path, label, dflt)
  local t = type_of(v)
  local ok = false
  for _, want in ipairs(r.types) do
    if want == "any" or want == t or (want == "number" and (t == "integer" or t == "float"))
      or (want == "boolean" and (t == "false" or t == "boolean"))
      or (want == "integer" and t == "float" and v == math.floor(v) and v == v) then
      ok = true
    end
  end
  if v == nil and r.nullable then ok = true end
  if not ok then return string.format("%s %s must be %s, not %s", label, path, wants(r), show(v)) end
  if type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      return string.format("%s %s must be a finite number, not %s", label, path, tostring(v))
    end
    if r.gt and not (v > r.gt) then return string.format("%s %s must be > %s, not %s", label, path, r.gt, tostring(v)) end
    if r.ge and not (v >= r.ge) then return string.format("%s %s must be >= %s, not %s", label, path, r.ge, tostring(v)) end
    if r.le and not (v <= r.le) then return string.format("%s %s must be <= %s, not %s", label, path, r.le, tostring(v)) end
  end
  if type(v) == "string" then
    local enum = r.enum or r.enum_if_string
    if enum then
      local found = false
      for _, e in ipairs(enum) do if e == v then found = true end end
      if not found then
        local q = {}
        for _, e in ipairs(enum) do q[#q + 1] = string.format("%q", e) end
        return string.format("%s %s must be one of %s, not %s", label, path, table.concat(q, ", "), show(v))
      end
    end
    if r.nonempty and v == "" then return string.format("%s %s must not be empty", label, path) end
  end
  if r.check then
    local msg = r.check(v)
    if msg then return string.format("%s %s: %s", label, path, msg) end
  end
  if type(v) ~= "table" then return nil end
  if r.list then
    for k in pairs(v) do
      if math.type(k) ~= "integer" or k < 1 or k > #v then
        return string.format("%s %s must be a list, not a table with the key %s", label, path, show(k))
      end
    end
    for i, x in ipairs(v) do
      local msg = check(x, r.list, string.format("%s[%d]", path, i), label)
      if msg then return msg end
    end
  elseif r.map then
    for k, x in pairs(v) do
      if r.key == "integer" and math.type(k) ~= "integer" then
        return string.format("%s %s has the key %s; its keys must be integers", label, path, show(k))
      end
      local kmsg = type(r.key) == "function" and r.key(k)
      if kmsg then return string.format("%s %s: %s", label, path, kmsg) end
      local msg = check(x, r.map, join(path, k), label)
      if msg then return msg end
    end
  elseif r.fields or r.derived then
    local names = fields_of(path, r)
    local known = {}
    for _, n in ipairs(names) do known[n] = true end
    for k, x in pairs(v) do
      if not known[k] then
        local near = type(k) == "string" and M.nearest(k, names)
        return string.format("unknown %s %s%s", label, join(path, k),
          near and string.format(" (did you mean %s?)", join(path, near)) or
          string.format(" (known: %s)", table.concat(names, ", ")))
      end
      local sub = (r.fields and r.fields[k]) or rule_for(join(path, k), r.derived and r.derived[k])
      if sub then
        local msg = check(x, sub, join(path, k), label, r.derived and r.derived[k])
        if msg then return msg end
      end
    end
  end
  return nil
end

local ROOT_DEFAULTS

local function root_rule()
  ROOT_DEFAULTS = ROOT_DEFAULTS or require "sbx.policy"
  return rule({ "table" }, { derived = ROOT_DEFAULTS })
end

-- policy_check.policy(p) -> true | nil, message: a policy (whole or an
-- overlay: only the keys it has are checked).
function M.policy(p)
  if type(p) ~= "table" then return nil, "a policy must be a table, not " .. show(p) end
  local msg = check(p, root_rule(), "", "policy field")
  if msg then return nil, msg end
  return true
end

-- The rules of every box option a backend takes: policy.box's, the
-- box-only ones, and the backend's own (backend.options: name -> rule, or a
-- function returning them).
local function box_rules(backend)
  local defaults = require("sbx.policy").box
  local r = { derived = {}, fields = {} }
  for k, v in pairs(defaults) do r.derived[k] = v end
  for k, v in pairs(BOX_ONLY) do r.fields[k] = v end
  for p, v in pairs(RULES) do
    local k = p:match("^box%.([%w_]+)$")
    if k then r.fields[k] = v end
  end
  local extra = backend and backend.options
  if type(extra) == "function" then extra = extra(M) end
  for k, v in pairs(extra or {}) do r.fields[k] = v end
  r.types = { "table" }
  return r
end

-- policy_check.box_options(opts, backend) -> true | nil, message
function M.box_options(opts, backend)
  local r = box_rules(backend)
  -- box_rules' record has no path prefix: look fields up without RULES.
  local names = {}
  for k in pairs(r.derived) do names[#names + 1] = k end
  for k in pairs(r.fields) do names[#names + 1] = k end
  table.sort(names)
  for k, v in pairs(opts) do
    local sub = r.fields[k] or rule_for("box." .. tostring(k), r.derived[k])
    if not sub or (r.derived[k] == nil and not r.fields[k]) then
      local near = type(k) == "string" and M.nearest(k, names)
      return nil, string.format("unknown box option '%s'%s", tostring(k),
        near and string.format(" (did you mean '%s'?)", near) or "")
    end
    local msg = check(v, sub, tostring(k), "box option")
    if msg then return nil, msg end
  end
  return true
end

-- Rules a backend may use for its options.
M.rule, M.num, M.int, M.str, M.maybe, M.map, M.list = rule, num, int, str, maybe, map, list
M.ANY, M.BOOL, M.FN, M.POS, M.SCALAR = ANY, BOOL, FN, POS, SCALAR

-- The rules under a policy section, for a backend whose box options are the
-- section's knobs (Fargate: policy.fargate).
function M.section_rules(section)
  local defaults = require("sbx.policy")[section] or {}
  local out = {}
  for k, v in pairs(defaults) do out[k] = rule_for(section .. "." .. k, v) end
  for p, v in pairs(RULES) do
    local k = p:match("^" .. section .. "%.([%w_]+)$")
    if k then out[k] = v end
  end
  return out
end

-- Printing ------------------------------------------------------------------------

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta == "number" end
    return a < b
  end)
  return keys
end

-- Names that Lua source must write as ["name"] (policy["local"]).
local KEYWORDS = {}
for w in ("and break do else elseif end false for function goto if in local nil not or repeat return then true until while"):gmatch("%a+") do
  KEYWORDS[w] = true
end

-- policy_check.show(p) -> Lua source of a policy (functions as comments
-- naming where they are defined), for `sbx policy show`.
function M.show(p)
  local out = {}
  local function emit(v, indent)
    local t = type(v)
    if t == "string" then out[#out + 1] = string.format("%q", v):gsub("\\\n", "\\n")
    elseif t == "number" or t == "boolean" or t == "nil" then out[#out + 1] = tostring(v)
    elseif t == "function" then
      local info = debug.getinfo(v, "S")
      out[#out + 1] = string.format("nil --[[ function at %s:%d ]]", info.short_src, info.linedefined)
    elseif t == "table" then
      if next(v) == nil then out[#out + 1] = "{}" return end
      out[#out + 1] = "{\n"
      local pad = string.rep("  ", indent + 1)
      local n = #v
      for i = 1, n do
        out[#out + 1] = pad
        emit(v[i], indent + 1)
        out[#out + 1] = ",\n"
      end
      for _, k in ipairs(sorted_keys(v)) do
        if not (math.type(k) == "integer" and k >= 1 and k <= n) then
          out[#out + 1] = pad
          if type(k) == "string" and k:match("^[%a_][%w_]*$") and not KEYWORDS[k] then out[#out + 1] = k
          else out[#out + 1] = "[" .. (type(k) == "string" and string.format("%q", k) or tostring(k)) .. "]" end
          out[#out + 1] = " = "
          emit(v[k], indent + 1)
          out[#out + 1] = ",\n"
        end
      end
      out[#out + 1] = string.rep("  ", indent) .. "}"
    else
      out[#out + 1] = "nil --[[ " .. t .. " ]]"
    end
  end
  emit(p, 0)
  return "return " .. table.concat(out) .. "\n"
end

return M
