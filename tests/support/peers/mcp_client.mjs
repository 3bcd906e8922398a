// The official TypeScript MCP client (@modelcontextprotocol/sdk, pinned in node/package.json)
// against the bridge's MCP server: tests/interop/test_mcp.py runs it and reads one JSON line per step.
//
//   node mcp_client.mjs NODE_MODULES http URL          (token in $ACP_BRIDGE_MCP_TOKEN)
//   node mcp_client.mjs NODE_MODULES stdio COMMAND [ARGS...]
//
// Steps: list the tools, call spawn_agent, call it with bad arguments, then start a call on the
// "slow" agent and abort it when a line arrives on stdin (the test says when the host has it).
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const [modules, mode, ...rest] = process.argv.slice(2);
const require = createRequire(`${modules}/`);
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const token = process.env.ACP_BRIDGE_MCP_TOKEN;

let transport;
if (mode === "http") {
  const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
  transport = new StreamableHTTPClientTransport(new URL(rest[0]), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
} else {
  const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");
  transport = new StdioClientTransport({
    command: rest[0],
    args: rest.slice(1),
    env: { ...process.env },
    stderr: "inherit",
  });
}

const out = (step, value) => process.stdout.write(JSON.stringify({ step, value }) + "\n");
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const client = new Client({ name: "acp-bridge-test", version: "0.0.0" });
await client.connect(transport);
out("version", client.getServerVersion());
out("tools", (await client.listTools()).tools);
out("spawn", await client.callTool({ name: "spawn_agent", arguments: { agent: "demo", prompt: "hi" } }));
out("bad", await client.callTool({ name: "spawn_agent", arguments: { agent: 3, extra: true } }));

const abort = new AbortController();
const slow = client
  .callTool({ name: "spawn_agent", arguments: { agent: "slow", prompt: "x" } }, undefined, {
    signal: abort.signal,
    timeout: 600000,
  })
  .then((r) => ({ answered: r }), (e) => ({ error: String(e) }));
out("slow_started", true);
await lines.next();
abort.abort("the test cancels it");
out("slow", await slow);
out("after", await client.callTool({ name: "list_agents", arguments: {} }));
await client.close();
process.exit(0);
