// A real MCP client in front of countersign: the official TypeScript SDK
// (`npm install @modelcontextprotocol/sdk`).
//
// It sends the gateway's bearer token with the SDK's public API (the
// transport's `requestInit` headers), lists the tools, reads a balance and
// makes one charge with an idempotency key, then sends the same charge again:
// the second answer is the first one, replayed, and the card is charged once.
//
//   cd examples/clients && npm install
//   COUNTERSIGN_TOKEN=dev-token-agent7 node --experimental-strip-types typescript_client.ts \
//       http://127.0.0.1:7373/mcp/payments [KEY]
//
// (Node 22.6 or newer; from Node 23.6 the flag is not needed. On an older
// Node, run it with tsx instead: `npx tsx typescript_client.ts URL [KEY]`.) Under the
// shipped policies the charge waits for a reviewer (`approval_pending`, with
// the proposal id); approve it with `countersign approve` and run this again
// with the same KEY to see it run once.

import { randomUUID } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

type Content = { type: string; text?: string };
type ToolResult = { content?: Content[]; isError?: boolean; structuredContent?: unknown; _meta?: unknown };

function text(result: ToolResult): string {
  return (result.content ?? []).map((c) => c.text ?? "").join(" ");
}

const url = process.argv[2];
const key = process.argv[3] ?? `example-${randomUUID()}`;
const asJson = process.argv.includes("--json");
const token = process.env.COUNTERSIGN_TOKEN;
if (!url || !token) {
  console.error("usage: COUNTERSIGN_TOKEN=TOKEN node --experimental-strip-types typescript_client.ts URL [KEY] [--json]");
  process.exit(2);
}

// The token goes in a header of every request the SDK sends.
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "countersign-example", version: "1.0.0" });
await client.connect(transport);

const tools = await client.listTools();
const read = (await client.callTool({ name: "get_balance", arguments: { account: "acct_42" } })) as ToolResult;
const charge = { account: "acct_42", amount: 12.5, currency: "EUR" };
// The key travels in _meta, where countersign reads it (and removes it
// before the server sees the call).
const call = { name: "charge_card", arguments: charge, _meta: { "dev.countersign/idempotency-key": key } };
// A write may wait for a reviewer for up to the gateway's approvals.hold:
// say so rather than sit in silence.
console.error("charge_card: sent; if it needs an approval, the gateway holds it until a reviewer decides or its hold ends");
const first = (await client.callTool(call)) as ToolResult;
console.error("charge_card again with the same key: a retry, never a second charge");
const again = (await client.callTool(call)) as ToolResult;
await client.close();

const seen = {
  tools: tools.tools.map((t) => t.name).sort(),
  balance: text(read),
  charge: { is_error: first.isError ?? false, text: text(first), structured: first.structuredContent ?? null },
  again: { is_error: again.isError ?? false, text: text(again), meta: again._meta ?? null },
};
if (asJson) {
  console.log(JSON.stringify(seen));
} else {
  console.log(`tools: ${seen.tools.join(", ")}`);
  console.log(`get_balance: ${seen.balance}`);
  console.log(`charge_card (key ${key}): ${seen.charge.text}`);
  console.log(`the same charge again: ${seen.again.text}`);
}
