-- needs: nothing
-- sbx.report, the HTML page of an eval run: counts, the durations
-- histogram, a row per task; every text a task controls is escaped (a
-- task's output is a stranger's bytes), and writing it fails cleanly.
local tap = require "tap"
local report = require "sbx.report"
local json = require("sbx.core").json

local results = {
  { id = "t1", status = "passed", duration = 0.5, phases = { run = { exit_code = 0 }, check = { exit_code = 0 } } },
  { id = "<img src=x onerror=alert(1)>", status = "failed", duration = 1.5,
    phases = { setup = { { exit_code = 0 } }, run = { exit_code = 1, output = "</pre><script>alert('x')</script>" },
      check = { timed_out = true } } },
  { id = "t3", status = "error", reason = "box: \"image\" & <gone>", error = json.null },
}
local page = report.html(results, { title = "run <1>" })
tap.like(page, "^<!DOCTYPE html>", "a whole page")
tap.like(page, "3 task%(s%): 1 passed, 1 failed, 1 error", "the counts")
tap.like(page, "<svg[^>]*aria%-label=\"task durations\"", "the durations histogram")
tap.ok(not page:find("<script", 1, true) and not page:find("<img", 1, true), "no markup from a task gets through")
tap.ok(page:find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;", 1, true), "a task's output is shown escaped")
tap.ok(page:find("&lt;img src=x onerror=alert(1)&gt;", 1, true), "and its id")
tap.ok(page:find("box: &quot;image&quot; &amp; &lt;gone&gt;", 1, true), "and an error's reason")
tap.ok(page:find("<title>run &lt;1&gt;</title>", 1, true), "the title escaped")
tap.like(page, "<td>timeout</td>", "a timed-out check reads timeout")
tap.like(report.html({}), "no tasks", "an empty run still makes a page")
local harness = require "sbx.harness"
tap.is(harness.report_html, report.html, "sbx.harness.report_html is the same function")

local path = os.tmpname()
tap.is(report.write(path, results), true, "write: true")
local f = assert(io.open(path, "rb"))
tap.is(f:read("a"), report.html(results), "write: the page on disk")
f:close()
os.remove(path)
local ok, err = report.write("/nonexistent-dir/x.html", results)
tap.ok(ok == nil and type(err) == "string" and err:find("nonexistent", 1, true), "an unwritable path: nil, message", err)
tap.done()
