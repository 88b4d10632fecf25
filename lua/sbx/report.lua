-- sbx.report: the HTML page of an eval run (sbx eval --report): counts, a
-- histogram of task durations (inline SVG) and a row per task with its
-- phases and output, every text escaped. Self-contained (no scripts, no
-- external resources). A leaf: results in, a page out.
local core = require "sbx.core"

local M = {}

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;" }))
end
M.escape_html = esc

local function histogram_svg(durations)
  local W, H, pad = 600, 200, 30
  local parts = { string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="task durations">', W, H + pad, W, H + pad) }
  if #durations == 0 then
    parts[#parts + 1] = '<text x="10" y="20">no tasks</text></svg>'
    return table.concat(parts)
  end
  local lo, hi = math.huge, -math.huge
  for _, d in ipairs(durations) do lo = math.min(lo, d); hi = math.max(hi, d) end
  local nbins = math.max(1, math.min(20, #durations))
  local width = (hi - lo) / nbins
  if width <= 0 then width = 1; nbins = 1 end
  local bins = {}
  for i = 1, nbins do bins[i] = 0 end
  for _, d in ipairs(durations) do
    local i = math.min(nbins, math.floor((d - lo) / width) + 1)
    bins[i] = bins[i] + 1
  end
  local maxc = 0
  for _, c in ipairs(bins) do maxc = math.max(maxc, c) end
  local bw = (W - 2 * pad) / nbins
  for i, c in ipairs(bins) do
    local h = maxc > 0 and (H - 20) * c / maxc or 0
    parts[#parts + 1] = string.format('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4a7"><title>%.2fs-%.2fs: %d</title></rect>',
      pad + (i - 1) * bw + 1, H - h, math.max(bw - 2, 1), h, lo + (i - 1) * width, lo + i * width, c)
  end
  parts[#parts + 1] = string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>', pad, H, W - pad, H)
  parts[#parts + 1] = string.format('<text x="%d" y="%d" font-size="12">%.2fs</text>', pad, H + 16, lo)
  parts[#parts + 1] = string.format('<text x="%d" y="%d" font-size="12" text-anchor="end">%.2fs</text>', W - pad, H + 16, lo + nbins * width)
  parts[#parts + 1] = string.format('<text x="%d" y="12" font-size="12">max %d task(s) per bin</text>', pad, maxc)
  parts[#parts + 1] = "</svg>"
  return table.concat(parts)
end

local function phase_code(p)
  if type(p) ~= "table" then return "" end
  if p.timed_out then return "timeout" end
  if p.exit_code ~= nil then return tostring(p.exit_code) end
  if p.value ~= nil then return tostring(p.value) end
  return ""
end

-- report.html(results, { title = }) -> a self-contained HTML page.
function M.html(results, opts)
  opts = opts or {}
  local json = core.json
  local h = {}
  local function add(s) h[#h + 1] = s end
  local counts = { passed = 0, failed = 0, error = 0 }
  local durations = {}
  for _, r in ipairs(results) do
    counts[r.status] = (counts[r.status] or 0) + 1
    if type(r.duration) == "number" then durations[#durations + 1] = r.duration end
  end
  add("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" .. esc(opts.title or "sbx eval") .. "</title>\n")
  add([[<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
.passed{background:#dfd}.failed{background:#fdd}.error{background:#fe9}pre{max-height:20em;overflow:auto;margin:0;white-space:pre-wrap}</style></head><body>
]])
  add("<h1>" .. esc(opts.title or "sbx eval") .. "</h1>\n")
  add(string.format("<p>%d task(s): %d passed, %d failed, %d error</p>\n", #results, counts.passed, counts.failed, counts.error))
  add("<h2>Task durations</h2>\n" .. histogram_svg(durations) .. "\n")
  add("<h2>Tasks</h2>\n<table><tr><th>id</th><th>status</th><th>duration</th><th>setup</th><th>run</th><th>check</th><th>details</th></tr>\n")
  for _, r in ipairs(results) do
    local ph = type(r.phases) == "table" and r.phases or {}
    local setup = {}
    if type(ph.setup) == "table" then
      for _, p in ipairs(ph.setup) do setup[#setup + 1] = phase_code(p) end
    end
    local detail = {}
    if r.reason and r.reason ~= json.null then detail[#detail + 1] = esc(r.reason) end
    if r.error and r.error ~= json.null then detail[#detail + 1] = "<pre>" .. esc(r.error) .. "</pre>" end
    for _, name in ipairs { "run", "check" } do
      local p = ph[name]
      if type(p) == "table" and type(p.output) == "string" and p.output ~= "" then
        detail[#detail + 1] = "<details><summary>" .. name .. " output</summary><pre>" .. esc(p.output) .. "</pre></details>"
      end
    end
    add(string.format("<tr class=\"%s\"><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
      esc(r.status), esc(r.id), esc(r.status), type(r.duration) == "number" and string.format("%.2fs", r.duration) or "",
      esc(table.concat(setup, " ")), esc(phase_code(ph.run)), esc(phase_code(ph.check)), table.concat(detail, "\n")))
  end
  add("</table>\n</body></html>\n")
  return table.concat(h)
end

-- report.write(path, results, opts) -> true | nil, message
function M.write(path, results, opts)
  local f, err = io.open(path, "wb")
  if not f then return nil, err end
  f:write(M.html(results, opts))
  f:close()
  return true
end

return M
