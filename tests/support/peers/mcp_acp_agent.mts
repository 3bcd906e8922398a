// An ACP agent on the TypeScript SDK's agent app (@agentclientprotocol/sdk 2.4.0, v1 unstable)
// that calls MCP servers over ACP with the SDK's McpOverAcpCaller: run with tsx behind
// acp-bridge by tests/interop/test_mcp_acp.py.
//
//   tsx mcp_acp_agent.mts NODE_MODULES NAME TRAFFIC_FILE
//
// It advertises mcpCapabilities.acp, writes every line it reads (what the bridge sent it) to
// TRAFFIC_FILE (and what it sends to TRAFFIC_FILE.sent), and remembers each session's `acp` servers. A prompt is one command; its
// answer is one agent_message_chunk holding JSON:
//
//   call SERVER TOOL ARGS_JSON [REQUEST_ID]   tools/call (with that inner requestId, if given):
//                                             {"outcome", "notes": [notifications received]}
//   list SERVER                               server/discover then tools/list: {"discover","tools"}
//   servers                                   the session's mcpServers as it received them
import { appendFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [modules, name, traffic] = process.argv.slice(2);
if (!traffic) throw new Error("usage: NODE_MODULES NAME TRAFFIC_FILE");
// (The pinned peers are installed outside this directory: imported from where they are.)
const acp: any = await import(
  pathToFileURL(join(modules, "@agentclientprotocol/sdk/dist/v1/unstable/acp.js")).href
);
writeFileSync(traffic, "");
writeFileSync(`${traffic}.sent`, "");

const decoder = new TextDecoder();
const tee = new TransformStream<Uint8Array, Uint8Array>({
  transform(chunk, controller) {
    appendFileSync(traffic, decoder.decode(chunk, { stream: true }));
    controller.enqueue(chunk);
  },
});
const input = (Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>).pipeThrough(tee);
const sent = new TransformStream<Uint8Array, Uint8Array>({
  transform(chunk, controller) {
    appendFileSync(`${traffic}.sent`, decoder.decode(chunk, { stream: true }));
    controller.enqueue(chunk);
  },
});
void sent.readable.pipeTo(Writable.toWeb(process.stdout) as WritableStream<Uint8Array>);
const output = sent.writable;

const mcp = new acp.McpOverAcpCaller({ clientInfo: { name: `agent-${name}`, version: "1.0.0" } });
const servers = new Map<string, any[]>();
let sessions = 0;

function serverId(sessionId: string, serverName: string): string {
  const found = (servers.get(sessionId) ?? []).find(
    (s) => s.type === "acp" && s.name === serverName,
  );
  if (!found) throw new Error(`no acp server ${serverName} in session ${sessionId}`);
  return found.serverId;
}

async function run(client: any, sessionId: string, words: string[]): Promise<unknown> {
  const [command, ...rest] = words;
  if (command === "servers") return servers.get(sessionId) ?? [];
  if (command === "list") {
    const id = serverId(sessionId, rest[0]);
    const discover = await mcp.request(client, id, "server/discover", {});
    const tools = await mcp.request(client, id, "tools/list", {});
    return { discover, tools };
  }
  if (command === "call") {
    const [server, tool, args, requestId] = rest;
    const notes: unknown[] = [];
    try {
      const outcome = await mcp.request(
        client,
        serverId(sessionId, server),
        "tools/call",
        { name: tool, arguments: JSON.parse(args) },
        { onNotification: (n: unknown) => notes.push(n), ...(requestId ? { requestId } : {}) },
      );
      return { outcome, notes };
    } catch (error: any) {
      return { failure: { code: error?.code, message: String(error?.message) }, notes };
    }
  }
  throw new Error(`unknown command ${command}`);
}

const app = acp
  .agent({ name: `agent-${name}` })
  .onRequest("initialize", async () => ({
    protocolVersion: 1,
    agentCapabilities: { loadSession: false, mcpCapabilities: { acp: true } },
    authMethods: [],
    agentInfo: { name: `agent-${name}`, version: "1.0.0" },
  }))
  .onRequest("session/new", async ({ params }: any) => {
    sessions += 1;
    const sessionId = `${name}-${sessions}`;
    servers.set(sessionId, params.mcpServers ?? []);
    return { sessionId };
  })
  .onRequest("session/prompt", async ({ params, client }: any) => {
    const text = params.prompt
      .filter((b: any) => b.type === "text")
      .map((b: any) => b.text)
      .join(" ");
    const words = text.match(/(?:[^\s']+|'[^']*')+/g).map((w: string) => w.replace(/^'|'$/g, ""));
    const report = await run(client, params.sessionId, words);
    await client.notify("session/update", {
      sessionId: params.sessionId,
      update: {
        sessionUpdate: "agent_message_chunk",
        content: { type: "text", text: JSON.stringify(report) },
      },
    });
    return { stopReason: "end_turn" };
  })
  .onNotification(acp.methods.agent.mcp.message, mcp.handleNotification);

const connection = app.connect(acp.ndJsonStream(output, input));
await connection.closed;
