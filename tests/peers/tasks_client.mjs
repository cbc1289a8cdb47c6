// A tasks client nobody here wrote: the MCP v2 TypeScript client
// (@modelcontextprotocol/client) with @modelcontextprotocol/ext-tasks's
// requester (createTaskSessionFromClient), calling one tool with
// `task: { preference: "prefer" }` and letting the library wait for the
// task to end. One JSON line per event on stdout.
//
//   node tasks_client.mjs --url URL --token T --era handshake|modern
//        --tool NAME --arguments JSON [--key K] [--no-wait] [--cancel]
//
// --no-wait: print the task handle and leave (the task outlives its
// client). --cancel: cancel the task through the library once it exists.
// The 2026-07-28 raw dispatch (the host's request coordinator the
// extension asks for) is a plain POST with the era's metadata headers.
// Run with .ci/cache/tasks as the working directory, where .ci/setup-peers
// installs both packages.
import { pathToFileURL } from "node:url";

const modules = `${process.cwd()}/node_modules/@modelcontextprotocol`;
const { Client, StreamableHTTPClientTransport } = await import(
  pathToFileURL(`${modules}/client/dist/index.mjs`)
);
const { createTaskSessionFromClient, resultFromTaskOutcome } = await import(
  pathToFileURL(`${modules}/ext-tasks/dist/client/index.js`)
);

const argv = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : fallback;
};
const flag = (name) => argv.includes(`--${name}`);
const url = opt("url");
const token = opt("token");
const era = opt("era", "handshake");
const tool = opt("tool");
const args = JSON.parse(opt("arguments", "{}"));
const key = opt("key");
const emit = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const VERSION = "2026-07-28";
const clientInfo = { name: "countersign-tasks-peer", version: "1.0.0" };

const client = new Client(clientInfo, {
  capabilities: {},
  versionNegotiation: { mode: era === "modern" ? { pin: VERSION } : "legacy" },
});
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);

let nextId = 1;
async function rawDispatch(request, options = {}) {
  const body = { jsonrpc: "2.0", id: `raw-${nextId++}`, ...request };
  const name =
    body.method === "tools/call" ? body.params?.name : body.params?.taskId;
  const headers = {
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
    Authorization: `Bearer ${token}`,
    "MCP-Protocol-Version": VERSION,
    "Mcp-Method": body.method,
    ...(name === undefined ? {} : { "Mcp-Name": name }),
    ...(options.context?.headers ?? {}),
  };
  const res = await fetch(url, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
    signal: options.signal,
  });
  const text = await res.text();
  let message;
  if ((res.headers.get("content-type") ?? "").includes("text/event-stream")) {
    for (const line of text.split("\n")) {
      if (!line.startsWith("data:")) continue;
      const m = JSON.parse(line.slice(5));
      if (m.id === body.id) message = m;
    }
  } else {
    message = JSON.parse(text);
  }
  if (message === undefined) throw new Error(`no answer to ${body.method}: ${res.status} ${text}`);
  return message.error !== undefined
    ? { kind: "error", error: message.error }
    : { kind: "result", result: message.result };
}

const options =
  era === "modern"
    ? {
        endpointId: url,
        rawDispatch,
        v2RequestFraming: { protocolVersion: VERSION, clientInfo, clientCapabilities: {} },
      }
    : { endpointId: url };
const session = createTaskSessionFromClient(client, options);
try {
  const execution = await session.callTool(tool, args, {
    task: { preference: "prefer" },
    ...(key === undefined ? {} : { metadata: { "dev.countersign/idempotency-key": key } }),
  });
  const taskId = execution.kind === "task" ? execution.handle.taskId : null;
  emit({ event: "started", kind: execution.kind, taskId });
  if (flag("cancel")) {
    await execution.cancel();
    emit({ event: "cancelled", taskId });
  } else if (flag("no-wait")) {
    // Leave the task to the server and go: closing the session (or the
    // execution) would cancel it, as the library does for a task it owns.
    process.exit(0);
  } else {
    const { outcome } = await execution.settle();
    emit({ event: "settled", status: outcome.status, result: outcome.status === "completed" ? resultFromTaskOutcome(outcome) : null });
  }
} catch (e) {
  emit({ event: "error", message: String(e?.message ?? e), code: e?.code ?? null });
} finally {
  await session.close().catch(() => {});
  await client.close().catch(() => {});
}
