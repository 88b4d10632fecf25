-- Tools for a language model: definitions come from policy.tools (so a user
-- policy changes names, texts and schemas), handlers run them against a box,
-- and sbx.tools.call validates a model's arguments before anything runs. A
-- model's mistake becomes a message it can act on, never an exception.
local M = {}
local sbx, json

function M.init(s)
  sbx, json = s, s.json
end

-- JSON schema (the subset tool schemas use) ------------------------------------

local function type_of(v)
  local t = type(v)
  if t == "number" then return math.type(v) == "integer" and "integer" or "number" end
  if t == "table" then
    local mt = getmetatable(v)
    if mt and mt.__jsontype then return mt.__jsontype end
    return (#v > 0 or next(v) == nil) and "array" or "object"
  end
  if v == json.null then return "null" end
  return t
end

local function type_ok(want, got, v)
  if want == got then return true end
  if want == "number" and got == "integer" then return true end
  if want == "integer" and got == "number" and v == math.floor(v) then return true end
  if want == "object" and got == "array" and next(v) == nil then return true end
  if want == "array" and got == "object" and next(v) == nil then return true end
  return false
end

local function describe(v)
  local t = type_of(v)
  if t == "string" then
    return #v > 40 and string.format("a string (%q...)", v:sub(1, 40)) or string.format("the string %q", v)
  end
  if t == "integer" or t == "number" or t == "boolean" then return string.format("%s %s", t, tostring(v)) end
  return t == "null" and "null" or ("an " .. t)
end

-- validate(value, schema, path) -> true | nil, message
function M.validate(v, schema, path)
  path = path or "arguments"
  local want = schema.type
  if want then
    local got = type_of(v)
    local wants = type(want) == "table" and want or { want }
    local ok = false
    for _, w in ipairs(wants) do if type_ok(w, got, v) then ok = true end end
    if not ok then
      return nil, string.format("%s must be %s, not %s", path, table.concat(wants, " or "), describe(v))
    end
  end
  if schema.enum then
    local ok = false
    for _, e in ipairs(schema.enum) do if e == v then ok = true end end
    if not ok then
      local opts = {}
      for _, e in ipairs(schema.enum) do opts[#opts + 1] = string.format("%q", tostring(e)) end
      return nil, string.format("%s must be one of %s, not %s", path, table.concat(opts, ", "), describe(v))
    end
  end
  -- Every string a tool takes ends up as a C string (an argv, a name): a
  -- NUL byte would cut it short, so it is refused, not changed.
  if type(v) == "string" and v:find("\0", 1, true) then
    return nil, string.format("%s must not contain NUL bytes (\\u0000)", path)
  end
  if type(v) == "number" then
    if schema.minimum and v < schema.minimum then
      return nil, string.format("%s must be at least %s, not %s", path, schema.minimum, v)
    end
    if schema.maximum and v > schema.maximum then
      return nil, string.format("%s must be at most %s, not %s", path, schema.maximum, v)
    end
  end
  if type(v) == "table" and schema.properties then
    for _, name in ipairs(schema.required or {}) do
      if v[name] == nil or v[name] == json.null then
        return nil, string.format("%s is missing the required field '%s'", path, name)
      end
    end
    for k, val in pairs(v) do
      local sub = schema.properties[k]
      if sub then
        if val ~= json.null then
          local ok, err = M.validate(val, sub, path .. "." .. k)
          if not ok then return nil, err end
        end
      elseif schema.additionalProperties == false then
        local names = {}
        for n in pairs(schema.properties) do names[#names + 1] = n end
        table.sort(names)
        return nil, string.format("%s has an unknown field '%s' (allowed: %s)", path, tostring(k), table.concat(names, ", "))
      end
    end
  end
  return true
end

-- Definitions -------------------------------------------------------------------

-- A text of the policy: a string, or a function of the policy giving one.
local function text_of(v, pol)
  if type(v) == "function" then return v(pol) end
  return v
end

-- A tool definition from policy: { name, description, schema, order, run }.
local function build(name, def, pol)
  local props, order, required = {}, {}, {}
  for _, p in ipairs(def.parameters or {}) do
    local pname = p[1]
    local pschema = {}
    for k, v in pairs(p[2]) do pschema[k] = v end
    pschema.description = text_of(pschema.description, pol)
    setmetatable(pschema, getmetatable(p[2]) or { __jsonorder = { "type", "description" } })
    props[pname] = pschema
    order[#order + 1] = pname
    if p.required then required[#required + 1] = pname end
  end
  local schema = setmetatable({
    type = "object",
    properties = setmetatable(props, { __jsonorder = order, __jsontype = "object" }),
    required = json.array(required),
    additionalProperties = false,
  }, { __jsonorder = { "type", "properties", "required", "additionalProperties" } })
  return { name = def.name or name, description = text_of(def.description, pol), schema = schema, order = order, run = def.run }
end

-- The default handlers: run(box, args, ctx, pol) -> text [, is_error]. A
-- policy replaces one with tools.NAME.run.
local handlers = {}

local function opt(v)
  if v == json.null or v == "" then return nil end
  return v
end
M.opt = opt

function handlers.bash(box, a, ctx, pol)
  if opt(a.run_in_background) then
    local name, err = box:spawn(a.command, { name = opt(a.name), source = "tool" })
    if not name then return pol.format_tool_error(err, pol), true end
    local p = box.procs[name]
    return pol.format_started({ name = name, command = p.command }, pol)
  end
  local r, err
  -- policy.exec.stateful: one session per box keeps cd, variables and
  -- functions between calls (sbx.session_shell).
  if pol.exec.stateful and box.session then
    if not box.tool_session or box.tool_session.closed then box.tool_session = box:session() end
    r, err = box.tool_session:exec(a.command, { timeout = opt(a.timeout), on_output = ctx and ctx.on_output })
  else
    r, err = box:exec(a.command, { timeout = opt(a.timeout), on_output = ctx and ctx.on_output, source = "tool" })
  end
  if not r then return pol.format_tool_error(err, pol), true end
  return pol.format_result(r, pol)
end

function handlers.list_processes(box, a, _, pol)
  return pol.format_processes(box:processes(), opt(a.name), pol)
end

function handlers.process_output(box, a, _, pol)
  local o, err = box:output(a.name, { offset = opt(a.offset), max_bytes = opt(a.max_bytes) })
  if not o then return pol.format_tool_error(err, pol), true end
  return pol.format_process_output(o, pol)
end

function handlers.kill_process(box, a, _, pol)
  local p, err = box:kill(a.name, opt(a.signal))
  if not p then return pol.format_tool_error(err, pol), true end
  return pol.format_killed(p, pol)
end
M.handlers = handlers

-- sbx.tools.definitions([pol]) -> list of tool definitions from a policy
-- (the live one by default), descriptions rendered with its values.
function M.definitions(pol)
  pol = pol or sbx.policy
  local list = {}
  for _, name in ipairs(pol.tool_order) do
    local def = pol.tools[name]
    if def then list[#list + 1] = build(name, def, pol) end
  end
  return list
end

-- The tools of one box: definitions from the box's policy whose run is
-- bound to it. Each call reads the box's policy as it is then.
function M.for_box(box)
  local list = M.definitions(box:policy())
  for _, t in ipairs(list) do
    local run = t.run or handlers[t.name]
    if not run then error("tool '" .. t.name .. "' has no handler (set tools." .. t.name .. ".run in the policy)") end
    t.run = function(args, ctx) return run(box, args, ctx, box:policy()) end
  end
  list.box = box
  return list
end

-- sbx.tools.export(format, {strict=}) -> the policy's tools in a provider's shape
function M.export(format, opts, defs)
  return require("sbx.export").tools(defs or M.definitions(), format, opts)
end

-- sbx.tools.call(tools, name, args [, ctx]) -> text for the model, is_error.
-- args may be a JSON string or a table. Nothing raises for a model's
-- mistake. ctx is handed to the handler (ctx.on_output streams output).
function M.call(tools, name, args, ctx)
  local pol = tools.box and tools.box:policy() or sbx.policy
  local tool
  for _, t in ipairs(tools) do if t.name == name then tool = t end end
  if not tool then
    local names = {}
    for _, t in ipairs(tools) do names[#names + 1] = t.name end
    return pol.format_tool_error(string.format("there is no tool named '%s'; available tools: %s", tostring(name), table.concat(names, ", ")), pol), true
  end
  if args == nil or args == "" then args = {} end
  if type(args) == "string" then
    local decoded, err = json.decode(args)
    if decoded == nil then
      return pol.format_tool_error(string.format("the arguments for %s are not valid JSON (%s); send a JSON object such as {\"command\": \"ls\"}", name, err), pol), true
    end
    args = decoded
  end
  if type(args) ~= "table" or type_of(args) == "array" and next(args) ~= nil then
    return pol.format_tool_error(string.format("the arguments for %s must be a JSON object, not %s", name, describe(args)), pol), true
  end
  local ok, err = M.validate(args, tool.schema, "arguments")
  if not ok then return pol.format_tool_error(string.format("invalid arguments for %s: %s", name, err), pol), true end
  local res = table.pack(pcall(tool.run, args, ctx))
  if not res[1] then
    -- A cancelled or interrupted call is the caller's business, not the model's.
    local msg = tostring(res[2])
    local kind = require("sbx.core").is_cancel(msg)
    if kind == "cancelled" or kind == "interrupted" then error(res[2], 0) end
    -- A box method refusing what a handler passed on (a policy's own tool
    -- without a schema minimum): the model reads the reason, not where in
    -- sbx's Lua it was found.
    return pol.format_tool_error((msg:gsub("^[^\n:]*%.lua:%d+: ", "")), pol), true
  end
  return tostring(res[2]), res[3] == true
end

return M
