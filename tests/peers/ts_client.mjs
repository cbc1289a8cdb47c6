// One client of the interop matrix: the official TypeScript MCP SDK (a
// client no one here wrote), through the gateway over Streamable HTTP.
//
//   node ts_client.mjs URL TOKEN PLAN
//
// SDK_DIR (environment) is the folder of the installed
// @modelcontextprotocol/sdk package. PLAN is JSON, as for matrix_client.py:
//   {"list": bool, "calls": [{"tool": NAME, "arguments": {...}, "key": KEY?}, ...]}
// The SDK checks every result's structuredContent against the tool's
// outputSchema (after listing tools, which it does itself when it must), and
// throws when it does not conform: the Rust test sees that as a failure.
// Prints one JSON object: the negotiated version, the listed names (or null)
// and each call's result.

import { pathToFileURL } from "node:url";
import { join } from "node:path";

const sdk = process.env.SDK_DIR;
const [url, token, planText] = process.argv.slice(2);
if (!sdk || !url || !token || !planText) {
  console.error("usage: SDK_DIR=... node ts_client.mjs URL TOKEN PLAN");
  process.exit(2);
}
const load = (p) => import(pathToFileURL(join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const plan = JSON.parse(planText);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "countersign-matrix", version: "1.0.0" });
await client.connect(transport);
let listed = null;
if (plan.list) {
  const tools = await client.listTools();
  listed = tools.tools.map((t) => t.name).sort();
}
const results = [];
for (const call of plan.calls) {
  const request = { name: call.tool, arguments: call.arguments ?? {} };
  if (call.key) request._meta = { "dev.countersign/idempotency-key": call.key };
  results.push(await client.callTool(request));
}
const version = transport.protocolVersion ?? null;
await client.close();
console.log(JSON.stringify({ protocol_version: version, listed, results }));
