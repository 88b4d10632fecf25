-- The YAML that kubeconfig files are written in: block mappings and
-- sequences (a sequence may sit at its key's indentation, as kubectl writes
-- them), plain, single- and double-quoted scalars, flow sequences and
-- mappings, comments, a leading "---". A document that is JSON (JSON is
-- YAML) goes to the JSON decoder. Anchors, aliases, tags and block
-- scalars are refused with the line they are on: kubectl, gcloud and the
-- AWS CLI write none of them into a kubeconfig.
--
-- decode(text) -> value | nil, message. Scalars are strings except true,
-- false (booleans) and null, ~ or nothing (nil: the key is absent).
local M = {}

local json = require("sbx.core").json

local function fail(lineno, msg) error({ yaml = true, msg = string.format("line %d: %s", lineno, msg) }, 0) end

-- The text of a line without a trailing comment (a # after a space, or at
-- the start, outside quotes).
local function strip_comment(s)
  local quote
  local i = 1
  while i <= #s do
    local c = s:sub(i, i)
    if quote then
      if c == "\\" and quote == '"' then
        i = i + 1                                   -- the escaped byte cannot end the string
      elseif c == quote then
        if quote == "'" and s:sub(i + 1, i + 1) == "'" then i = i + 1 else quote = nil end
      end
    elseif c == '"' or c == "'" then
      if i == 1 or s:sub(i - 1, i - 1):match("[%s%[{,:]") then quote = c end
    elseif c == "#" and (i == 1 or s:sub(i - 1, i - 1):match("%s")) then
      return (s:sub(1, i - 1):gsub("%s+$", ""))
    end
    i = i + 1
  end
  return (s:gsub("%s+$", ""))
end

local ESC = { n = "\n", t = "\t", r = "\r", ["0"] = "\0", ["\\"] = "\\", ['"'] = '"', ["/"] = "/", b = "\b",
  f = "\f", e = "\27", [" "] = " " }

-- A quoted scalar at position i of s: value, position after it.
local function quoted(s, i, lineno)
  local q = s:sub(i, i)
  local out, j = {}, i + 1
  while j <= #s do
    local c = s:sub(j, j)
    if c == q then
      if q == "'" and s:sub(j + 1, j + 1) == "'" then
        out[#out + 1] = "'"
        j = j + 2
      else
        return table.concat(out), j + 1
      end
    elseif c == "\\" and q == '"' then
      local e = s:sub(j + 1, j + 1)
      if e == "x" or e == "u" or e == "U" then
        local n = e == "x" and 2 or e == "u" and 4 or 8
        local hex = s:sub(j + 2, j + 1 + n)
        if not hex:match("^%x+$") or #hex ~= n then fail(lineno, "a bad \\" .. e .. " escape") end
        out[#out + 1] = utf8.char(tonumber(hex, 16))
        j = j + 2 + n
      elseif ESC[e] then
        out[#out + 1] = ESC[e]
        j = j + 2
      else
        fail(lineno, "an unknown escape \\" .. e)
      end
    else
      out[#out + 1] = c
      j = j + 1
    end
  end
  fail(lineno, "a quoted string that does not end on its line")
end

local function plain(v, lineno)
  if v == "" or v == "~" or v == "null" or v == "Null" or v == "NULL" then return nil end
  if v == "true" or v == "True" or v == "TRUE" then return true end
  if v == "false" or v == "False" or v == "FALSE" then return false end
  local c = v:sub(1, 1)
  if c == "&" or c == "*" or c == "!" then fail(lineno, "anchors, aliases and tags are not supported") end
  if c == "|" or c == ">" then fail(lineno, "block scalars (| and >) are not supported") end
  if c == "@" or c == "`" then fail(lineno, "a plain scalar cannot start with " .. c) end
  return v
end

-- Flow collections and scalars inside them: value, position after it.
local flow
local function flow_scalar(s, i, lineno)
  local c = s:sub(i, i)
  if c == '"' or c == "'" then return quoted(s, i, lineno) end
  local j = i
  while j <= #s and not s:sub(j, j):match("[,%]}]") and not (s:sub(j, j) == ":" and s:sub(j + 1, j + 1):match("[%s,%]}]")) do
    j = j + 1
  end
  return plain((s:sub(i, j - 1):gsub("^%s+", ""):gsub("%s+$", "")), lineno), j
end

local function skip(s, i)
  while s:sub(i, i):match("%s") do i = i + 1 end
  return i
end

function flow(s, i, lineno)
  i = skip(s, i)
  local c = s:sub(i, i)
  if c == "[" then
    local out = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "]" then return json.array(out), i + 1 end
    while true do
      local v
      v, i = flow(s, i, lineno)
      out[#out + 1] = v
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "]" then return out, i + 1 end
      if d ~= "," then fail(lineno, "a flow sequence needs , or ]") end
      i = skip(s, i + 1)
      if s:sub(i, i) == "]" then return out, i + 1 end
    end
  elseif c == "{" then
    local out = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "}" then return out, i + 1 end
    while true do
      local k, v
      k, i = flow_scalar(s, i, lineno)
      i = skip(s, i)
      if s:sub(i, i) ~= ":" then fail(lineno, "a flow mapping needs key: value") end
      v, i = flow(s, i + 1, lineno)
      if k ~= nil then out[tostring(k)] = v end
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "}" then return out, i + 1 end
      if d ~= "," then fail(lineno, "a flow mapping needs , or }") end
      i = skip(s, i + 1)
    end
  end
  return flow_scalar(s, i, lineno)
end

-- A value written after "key: " or "- " on one line.
local function inline(v, lineno)
  local c = v:sub(1, 1)
  if c == "[" or c == "{" then
    local out, j = flow(v, 1, lineno)
    if skip(v, j) <= #v then fail(lineno, "text after a flow collection") end
    return out
  end
  if c == '"' or c == "'" then
    local out, j = quoted(v, 1, lineno)
    if skip(v, j) <= #v then fail(lineno, "text after a quoted string") end
    return out
  end
  return plain(v, lineno)
end

-- "key: rest" -> key, rest; nil when the text is no mapping entry.
local function split_key(t, lineno)
  local c = t:sub(1, 1)
  if c == '"' or c == "'" then
    local k, j = quoted(t, 1, lineno)
    local rest = t:sub(j)
    if rest == ":" then return k, "" end
    if rest:match("^:%s") then return k, (rest:gsub("^:%s+", "")) end
    return nil
  end
  if c == "[" or c == "{" then return nil end
  local i = 1
  while true do
    local j = t:find(":", i, true)
    if not j then return nil end
    local after = t:sub(j + 1, j + 1)
    if after == "" or after:match("%s") then
      return (t:sub(1, j - 1):gsub("%s+$", "")), (t:sub(j + 1):gsub("^%s+", ""))
    end
    i = j + 1
  end
end

local function is_item(t) return t == "-" or t:sub(1, 2) == "- " end

local parse_node

local function parse_map(lines, i, ind)
  local m = {}
  while lines[i] and lines[i].indent == ind and not is_item(lines[i].text) do
    local l = lines[i]
    local key, rest = split_key(l.text, l.n)
    if not key then fail(l.n, "expected key: value") end
    if m[key] ~= nil then fail(l.n, "the key " .. key .. " appears twice") end
    local v
    if rest == "" then
      local nxt = lines[i + 1]
      if nxt and (nxt.indent > ind or (nxt.indent == ind and is_item(nxt.text))) then
        v, i = parse_node(lines, i + 1, nxt.indent)
      else
        i = i + 1
      end
    else
      v = inline(rest, l.n)
      i = i + 1
    end
    m[key] = v
  end
  if lines[i] and lines[i].indent > ind then fail(lines[i].n, "unexpected indentation") end
  return m, i
end

local function parse_seq(lines, i, ind)
  local out = json.array {}
  while lines[i] and lines[i].indent == ind and is_item(lines[i].text) do
    local l = lines[i]
    local rest = l.text:sub(2):gsub("^%s+", "")
    local v
    if rest == "" then
      local nxt = lines[i + 1]
      if nxt and nxt.indent > ind then v, i = parse_node(lines, i + 1, nxt.indent) else i = i + 1 end
    elseif is_item(rest) or split_key(rest, l.n) then
      -- The item's content starts on the dash's line, at its own column.
      local col = ind + #l.text - #rest
      lines[i] = { indent = col, text = rest, n = l.n }
      v, i = parse_node(lines, i, col)
    else
      v = inline(rest, l.n)
      i = i + 1
    end
    out[#out + 1] = v
  end
  return out, i
end

function parse_node(lines, i, ind)
  local l = lines[i]
  if is_item(l.text) then return parse_seq(lines, i, ind) end
  if split_key(l.text, l.n) then return parse_map(lines, i, ind) end
  return inline(l.text, l.n), i + 1
end

-- decode(text) -> value | nil, message
function M.decode(text)
  if type(text) ~= "string" then error("yaml.decode expects a string", 2) end
  local body = text:gsub("^\239\187\191", "")
  if body:match("^%s*{") then
    local v, err = json.decode(body)
    if v == nil then return nil, "not valid JSON: " .. tostring(err) end
    return v
  end
  local lines, n, started = {}, 0, false
  for raw in (body .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    raw = raw:gsub("\r$", "")
    if raw:find("\t", 1, true) and raw:match("^%s*"):find("\t", 1, true) then
      return nil, string.format("line %d: tabs cannot indent YAML", n)
    end
    local ok, t = pcall(strip_comment, raw)
    if not ok then return nil, tostring(t) end
    if t:match("^%-%-%-") then
      if started then return nil, string.format("line %d: only one YAML document is read", n) end
      t = t:sub(4):gsub("^%s+", "")
    elseif t == "..." then
      break
    elseif t:match("^%%") then
      t = ""
    end
    if t:match("%S") then
      started = true
      local indent = #t:match("^ *")
      lines[#lines + 1] = { indent = indent, text = t:sub(indent + 1), n = n }
    end
  end
  if #lines == 0 then return nil end
  local ok, v, i = pcall(parse_node, lines, 1, lines[1].indent)
  if not ok then
    if type(v) == "table" and v.yaml then return nil, v.msg end
    error(v, 0)
  end
  if lines[i] then return nil, string.format("line %d: unexpected content after the document", lines[i].n) end
  return v
end

return M
