-- Tool definitions in each provider's wire shape, generated from the
-- policy's tool table (so a user policy changes what every format says).
-- Each function returns the value of the request's `tools` field.
--
-- Strict mode done right: a provider's strict mode wants every property in
-- `required`; an optional parameter then becomes nullable (type [T, "null"])
-- instead of being forced on the model, and a null argument means "absent"
-- to sbx.tools.call.
local json = require("sbx.core").json

local M = {}

local function ordered(t, order)
  return setmetatable(t, { __jsonorder = order, __jsontype = "object" })
end

local copy = require("sbx.util").deep_copy

-- The parameters schema for a definition; strict: all required, optionals nullable.
function M.schema(def, strict, keep_additional)
  local props, required = {}, {}
  local is_required = {}
  for _, name in ipairs(def.schema.required) do is_required[name] = true end
  for _, name in ipairs(def.order) do
    local p = copy(def.schema.properties[name])
    if strict and not is_required[name] then
      p.type = json.array { p.type, "null" }
      if p.enum then
        local e = { table.unpack(p.enum) }
        e[#e + 1] = json.null
        p.enum = json.array(e)
      end
    end
    props[name] = p
    if strict or is_required[name] then required[#required + 1] = name end
  end
  local schema = { type = "object", properties = ordered(props, def.order), required = json.array(required) }
  if keep_additional ~= false then schema.additionalProperties = false end
  return ordered(schema, { "type", "properties", "required", "additionalProperties" })
end

local formats = {}

function formats.openai(defs, opts)
  local strict = opts.strict ~= false
  local out = {}
  for i, d in ipairs(defs) do
    out[i] = ordered({ type = "function", ["function"] = ordered({
      name = d.name, description = d.description, parameters = M.schema(d, strict), strict = strict,
    }, { "name", "description", "parameters", "strict" }) }, { "type", "function" })
  end
  return out
end

formats["openai-responses"] = function(defs, opts)
  local strict = opts.strict ~= false
  local out = {}
  for i, d in ipairs(defs) do
    out[i] = ordered({ type = "function", name = d.name, description = d.description,
      parameters = M.schema(d, strict), strict = strict }, { "type", "name", "description", "parameters", "strict" })
  end
  return out
end

function formats.anthropic(defs, opts)
  local strict = opts.strict == true
  local out = {}
  for i, d in ipairs(defs) do
    local t = { name = d.name, description = d.description, input_schema = M.schema(d, strict) }
    if strict then t.strict = true end
    out[i] = ordered(t, { "name", "description", "input_schema", "strict" })
  end
  return out
end

-- Gemini's Schema (an OpenAPI subset): upper-case type names, no
-- additionalProperties.
local function gemini_schema(s)
  if type(s) ~= "table" then return s end
  local out = {}
  for k, v in pairs(s) do
    if k == "type" and type(v) == "string" then out[k] = v:upper()
    elseif k ~= "additionalProperties" then out[k] = gemini_schema(v) end
  end
  return setmetatable(out, getmetatable(s))
end

function formats.gemini(defs)
  local decls = {}
  for i, d in ipairs(defs) do
    decls[i] = ordered({ name = d.name, description = d.description, parameters = gemini_schema(M.schema(d, false, false)) },
      { "name", "description", "parameters" })
  end
  return { ordered({ functionDeclarations = json.array(decls) }, { "functionDeclarations" }) }
end

function formats.mcp(defs)
  local out = {}
  for i, d in ipairs(defs) do
    out[i] = ordered({ name = d.name, description = d.description, inputSchema = M.schema(d, false) },
      { "name", "description", "inputSchema" })
  end
  return out
end

M.formats = { "openai", "openai-responses", "anthropic", "gemini", "mcp" }

-- export.tools(defs, format, {strict=}) -> list | nil, message
function M.tools(defs, format, opts)
  local f = formats[format]
  if not f then
    return nil, string.format("unknown format '%s' (one of: %s)", tostring(format), table.concat(M.formats, ", "))
  end
  return json.array(f(defs, opts or {}))
end

return M
