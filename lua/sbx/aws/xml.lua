-- sbx.aws.xml: the small XML reader the AWS Query protocol needs (IAM, STS).
--
--   xml.parse(text)   -> root element | nil, message
--     element: { name = "ns:Tag", tag = "Tag" (no prefix), attrs = {name = value},
--                children = {element...}, text = "character data" }
--   xml.value(element) -> the element as plain Lua values (see below)
--   xml.child(element, tag) -> the first child element with that tag, or nil
--   xml.decode(s)     -> s with the XML entities replaced
--
-- Reads elements, attributes, character data, CDATA, comments and processing
-- instructions. A DOCTYPE is refused: AWS never sends one, and its entity
-- definitions are how XML readers get made to expand without bound. Entities:
-- the five predefined ones and numeric references; any other "&name;" is left
-- as written. Malformed input returns nil, message; the reader never raises
-- on what a server sent.
local json = require("sbx.core").json

local M = {}

M.max_depth = 100

local PREDEFINED = { amp = "&", lt = "<", gt = ">", quot = '"', apos = "'" }

local function entity(ref)
  local p = PREDEFINED[ref]
  if p then return p end
  local cp
  if ref:match("^#x%x+$") then
    cp = tonumber(ref:sub(3), 16)
  elseif ref:match("^#%d+$") then
    cp = tonumber(ref:sub(2))
  end
  -- Only code points XML allows: no NUL, no surrogates, nothing past U+10FFFF.
  if cp and cp > 0 and cp <= 0x10FFFF and not (cp >= 0xD800 and cp <= 0xDFFF) then
    return utf8.char(cp)
  end
  return nil -- keeps "&ref;" as it was
end

function M.decode(s)
  if not s:find("&", 1, true) then return s end
  return (s:gsub("&(#?%w+);", entity))
end

local NAME = "[%a_:][%w_:%.%-]*"

local function local_name(name)
  return name:match(":([^:]*)$") or name
end

local function where(s, pos)
  local line = 1
  for _ in s:sub(1, pos - 1):gmatch("\n") do line = line + 1 end
  return "line " .. line
end

function M.parse(s)
  if type(s) ~= "string" then error("xml.parse expects a string", 2) end
  local pos = 1
  if s:sub(1, 3) == "\239\187\191" then pos = 4 end -- a UTF-8 BOM
  local stack, root = {}, nil
  local function fail(msg, at) return nil, "XML: " .. msg .. " at " .. where(s, at or pos) end
  while true do
    local lt = s:find("<", pos, true)
    local text = s:sub(pos, (lt or #s + 1) - 1)
    local top = stack[#stack]
    if top then
      if text ~= "" then top.parts[#top.parts + 1] = M.decode(text) end
    elseif text:find("%S") then
      return fail(root and "text after the root element" or "text before the root element")
    end
    if not lt then break end
    if s:sub(lt, lt + 3) == "<!--" then
      local e = s:find("-->", lt + 4, true)
      if not e then return fail("unterminated comment", lt) end
      pos = e + 3
    elseif s:sub(lt, lt + 8) == "<![CDATA[" then
      local e = s:find("]]>", lt + 9, true)
      if not e then return fail("unterminated CDATA section", lt) end
      if not top then return fail("CDATA outside the root element", lt) end
      top.parts[#top.parts + 1] = s:sub(lt + 9, e - 1)
      pos = e + 3
    elseif s:sub(lt, lt + 1) == "<?" then
      local e = s:find("?>", lt + 2, true)
      if not e then return fail("unterminated processing instruction", lt) end
      pos = e + 2
    elseif s:sub(lt, lt + 1) == "<!" then
      return fail("DOCTYPE and other declarations are not accepted", lt)
    elseif s:sub(lt, lt + 1) == "</" then
      local name, e = s:match("^</(" .. NAME .. ")%s*>()", lt)
      if not name then return fail("malformed end tag", lt) end
      if not top then return fail("end tag </" .. name .. "> without a start tag", lt) end
      if name ~= top.name then
        return fail("end tag </" .. name .. "> does not match <" .. top.name .. ">", lt)
      end
      top.text = table.concat(top.parts)
      top.parts = nil
      stack[#stack] = nil
      pos = e
    else
      local name, p = s:match("^<(" .. NAME .. ")()", lt)
      if not name then return fail("malformed start tag", lt) end
      if root and not top then return fail("a second root element", lt) end
      local el = { name = name, tag = local_name(name), attrs = {}, children = {}, parts = {} }
      while true do
        local aname, _, value, np = s:match("^%s+(" .. NAME .. ")%s*=%s*([\"'])(.-)%2()", p)
        if not aname then break end
        if value:find("<", 1, true) then return fail("'<' in an attribute value", p) end
        el.attrs[aname] = M.decode(value)
        p = np
      end
      local close, np = s:match("^%s*(/?)>()", p)
      if not close then return fail("malformed start tag <" .. name .. ">", lt) end
      if top then top.children[#top.children + 1] = el else root = el end
      if close == "/" then
        el.text, el.parts = "", nil
      else
        if #stack >= M.max_depth then return fail("elements nested deeper than " .. M.max_depth, lt) end
        stack[#stack + 1] = el
      end
      pos = np
    end
  end
  if #stack > 0 then return fail("<" .. stack[#stack].name .. "> is not closed", #s + 1) end
  if not root then return fail("no root element", #s + 1) end
  return root
end

function M.child(el, tag)
  for _, c in ipairs(el.children) do
    if c.tag == tag then return c end
  end
  return nil
end

local function all_tagged(children, tag)
  for _, c in ipairs(children) do
    if c.tag ~= tag then return false end
  end
  return true
end

--[[
xml.value(element) turns a Query-protocol element into plain values, the way
botocore's shapes would read it, but with no model:
  * no child elements and some text -> the text (a string, never a number:
    without the model "1" may be a string member);
  * no child elements and no text -> an empty table (AWS writes empty lists
    and structures as <Tags/> or <RoleLastUsed/>; it omits empty strings);
  * children all <member> -> a list of their values (AWS lists);
  * children all <entry> holding <key> and <value> -> a map (AWS maps);
  * otherwise a structure: a table keyed by each child's tag without its
    namespace prefix; a tag that repeats collects a list.
Lists and structures carry sbx.json's array/object marks, so a decoded
result encodes back to the same JSON shape.
]]
function M.value(el)
  local kids = el.children
  if #kids == 0 then
    if el.text ~= "" then return el.text end
    return json.object {}
  end
  if all_tagged(kids, "member") then
    local list = {}
    for i, c in ipairs(kids) do list[i] = M.value(c) end
    return json.array(list)
  end
  if all_tagged(kids, "entry") then
    local map, ok = {}, true
    for _, c in ipairs(kids) do
      local k, v = M.child(c, "key"), M.child(c, "value")
      if not (k and v and #k.children == 0) then ok = false break end
      map[k.text] = M.value(v)
    end
    if ok then return json.object(map) end
  end
  local out, repeated = {}, {}
  for _, c in ipairs(kids) do
    local v = M.value(c)
    local prev = out[c.tag]
    if prev == nil then
      out[c.tag] = v
    elseif repeated[c.tag] then
      prev[#prev + 1] = v
    else
      out[c.tag] = json.array { prev, v }
      repeated[c.tag] = true
    end
  end
  return json.object(out)
end

return M
