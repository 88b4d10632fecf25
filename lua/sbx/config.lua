--[[
sbx.config: the live policy, in a module below everything that reads it.
Modules read config.policy instead of requiring the sbx facade, so the
require graph stays acyclic (tests/require_graph_test.lua). It requires
only sbx.core, sbx.util, the defaults (sbx.policy) and their checker
(sbx.policy_check), none of which requires it back.

  config.policy          -- the live policy (sbx.policy is this table)
  config.generation      -- bumped by every change (sbx.policy_generation)
  config.load(p [, base]) -- sbx.load_policy
  config.use(p)          -- sbx.use_policy
]]
local core = require "sbx.core"
local util = require "sbx.util"
local defaults = require "sbx.policy"
local check = require "sbx.policy_check"

local M = {}

M.policy = util.deep_copy(defaults)

-- Policy changes bump this, so what was derived from the policy (a box's
-- merged view) is derived again.
M.generation = 0

-- When sbx.drain began (nil before): background chores give up
-- destroy_timeout seconds after it.
M.draining_since = nil

-- load(p [, base]) -> overlay: a table, a bundled name ("lm-deluge") or a
-- file whose chunk returns a table. A file's chunk gets a copy of base (the
-- live policy by default) and may edit it and return nothing, which makes
-- that copy the overlay. The overlay is validated: a mistake raises an
-- error naming the field and what it needs.
function M.load(p, base)
  local overlay = p
  local what = type(p) == "string" and string.format("policy '%s': ", p) or ""
  if type(p) == "string" then
    local ok, mod = pcall(require, "sbx.policies." .. p)
    if ok then
      overlay = util.deep_copy(mod)
    else
      local chunk, err = loadfile(p, "t")
      if not chunk then
        error(string.format("policy '%s' is neither a bundled policy nor a readable file: %s", p, err), 0)
      end
      local work = util.deep_copy(base or M.policy)
      local cok, ret = pcall(chunk, work)
      if not cok then error(string.format("policy '%s' failed to load: %s", p, tostring(ret)), 0) end
      overlay = ret == nil and work or ret
    end
  elseif type(p) == "table" then
    overlay = util.deep_copy(p)
  end
  if type(overlay) ~= "table" then
    error(string.format("%sa policy must be a table (got %s)", what, type(overlay)), 0)
  end
  local ok, msg = check.policy(overlay)
  if not ok then error(what .. msg, 0) end
  return overlay
end

-- use(file_or_name_or_table) -> the live policy, with the overlay merged
-- in. Every box reads the live policy at each call, so the change reaches
-- the next call of every existing box.
function M.use(p)
  local overlay = M.load(p)
  local merged = util.merge(util.deep_copy(M.policy), overlay)
  local ok, msg = check.policy(merged)
  if not ok then error(msg, 0) end
  util.merge(M.policy, overlay)
  M.generation = M.generation + 1
  core.scheduler(M.policy.scheduler)
  return M.policy
end

core.scheduler(M.policy.scheduler)

return M
