// needs: docker, node
// The MCP server driven by the official MCP client SDK: initialize, list
// tools, run commands, background processes, errors, progress, a cancelled
// call whose process is really killed, and a shutdown that removes the box.
// TAP output.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import http from "node:http";

const sbx = process.env.SBX_BIN;
const image = process.env.SBX_TEST_IMAGE || "sbx-debian:12";
let n = 0, failed = 0;
function ok(cond, name, diag) {
  n++;
  if (!cond) failed++;
  console.log(`${cond ? "" : "not "}ok ${n} - ${name}`);
  if (!cond && diag !== undefined) console.log(`#   ${String(diag).replace(/\n/g, "\n#   ")}`);
}
const text = (r) => r.content.map((c) => c.text).join("");
function docker(path) {
  return new Promise((resolve, reject) => {
    // The daemon sbx uses: DOCKER_HOST (unix://) or the default socket.
    const host = process.env.DOCKER_HOST || "";
    const socketPath = host.startsWith("unix://") ? host.slice(7) : "/var/run/docker.sock";
    const req = http.request({ socketPath, path, method: "GET" }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode, body }));
    });
    req.on("error", reject);
    req.end();
  });
}
async function sbxBoxes(pid) {
  const filters = encodeURIComponent(JSON.stringify({ label: [`sbx.owner.pid=${pid}`] }));
  const r = await docker(`/containers/json?all=true&filters=${filters}`);
  return JSON.parse(r.body);
}

const transport = new StdioClientTransport({ command: sbx, args: ["mcp", "--image", image], stderr: "inherit", env: { ...process.env } });
const client = new Client({ name: "sbx-test", version: "1.0.0" });
await client.connect(transport);
const server = client.getServerVersion();
ok(server?.name === "sbx", "initialize: server info", JSON.stringify(server));
ok(client.getServerCapabilities()?.tools !== undefined, "initialize: tools capability");

const { tools } = await client.listTools();
ok(tools.map((t) => t.name).join(",") === "bash,list_processes,process_output,kill_process", "tools/list names", tools.map((t) => t.name));
ok(tools[0].inputSchema.required.includes("command"), "bash input schema requires command");

let r = await client.callTool({ name: "bash", arguments: { command: "echo hello from mcp; exit 3" } });
ok(text(r) === "[Exit code: 3]\nhello from mcp\n", "bash runs in the box", text(r));
ok(r.isError === false, "a failing command is still a successful tool call");

r = await client.callTool({ name: "bash", arguments: { command: 42 } });
ok(r.isError === true && /must be string/.test(text(r)), "bad arguments come back as a tool error", text(r));
r = await client.callTool({ name: "nope", arguments: {} });
ok(r.isError === true && /no tool named 'nope'/.test(text(r)), "an unknown tool is a tool error", text(r));

r = await client.callTool({ name: "bash", arguments: { command: "for i in 1 2 3; do echo bg$i; sleep 0.1; done", run_in_background: true } });
ok(/Started background process 'p1'/.test(text(r)), "background start", text(r));
await new Promise((res) => setTimeout(res, 800));
r = await client.callTool({ name: "list_processes", arguments: {} });
ok(/p1\s+exited 0/.test(text(r)), "list_processes", text(r));
r = await client.callTool({ name: "process_output", arguments: { name: "p1" } });
ok(/^bg1\nbg2\nbg3\n/.test(text(r)), "process_output", text(r));
r = await client.callTool({ name: "bash", arguments: { command: "sleep 300", run_in_background: true, name: "srv" } });
r = await client.callTool({ name: "kill_process", arguments: { name: "srv" } });
ok(/stopped \(killed\)/.test(text(r)), "kill_process", text(r));

// Progress notifications for a long command.
const progress = [];
r = await client.callTool({ name: "bash", arguments: { command: "for i in 1 2 3; do echo step$i; sleep 0.3; done" } }, undefined,
  { onprogress: (p) => progress.push(p) });
ok(progress.length >= 2, `progress notifications arrive (${progress.length})`);
ok(progress.some((p) => /step3/.test(p.message || "")), "progress carries the last output line", JSON.stringify(progress));

// A quiet command still sends progress (policy.mcp.progress_interval).
const quiet = [];
r = await client.callTool({ name: "bash", arguments: { command: "sleep 6; echo done" } }, undefined,
  { onprogress: (p) => quiet.push(p) });
ok(text(r) === "done\n", "a quiet long command completes", text(r));
ok(quiet.length >= 1 && /running for \d+s/.test(quiet[0].message || ""), `a quiet command reports progress (${quiet.length})`, JSON.stringify(quiet));

// Cancellation: the request is aborted, and its process is killed in the box.
const ac = new AbortController();
const pending = client.callTool({ name: "bash", arguments: { command: "sleep 777; echo never" } }, undefined, { signal: ac.signal });
await new Promise((res) => setTimeout(res, 1000));
ac.abort("test cancels");
let rejected = false;
try { await pending; } catch { rejected = true; }
ok(rejected, "the cancelled call rejects on the client");
await new Promise((res) => setTimeout(res, 1500));
r = await client.callTool({ name: "bash", arguments: { command: "ps -eo args | grep '^sleep 777' | grep -vc grep || true" } });
ok(text(r).trim() === "0", "the cancelled command's process is gone from the box", text(r));

const pid = transport.pid;
const before = await sbxBoxes(pid);
ok(before.length === 1, "one box for the session", before.length);
await client.close();
let after = before;
for (let i = 0; i < 50 && after.length; i++) {
  await new Promise((res) => setTimeout(res, 100));
  after = await sbxBoxes(pid);
}
ok(after.length === 0, "closing the session removes the box", after.length);
console.log(`1..${n}`);
process.exit(failed ? 1 : 0);
