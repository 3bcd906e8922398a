// An ACP client on the TypeScript SDK's client app (@agentclientprotocol/sdk 2.4.0, v1
// unstable) serving an MCP server over ACP with the SDK's McpOverAcpProvider, in front of
// `acp-bridge stdio`: run with tsx by tests/interop/test_mcp_acp.py.
//
//   tsx mcp_acp_client.mts NODE_MODULES TRAFFIC_FILE SCENARIO -- BRIDGE_ARGV...
//
// Writes every line the bridge sent it to TRAFFIC_FILE, what it sent to TRAFFIC_FILE.sent (checked against the v1 unstable schema
// by the test) and prints one JSON object with what it saw. Its server, "tools", has one tool,
// `echo {text}`: each call waits until BARRIER calls are in flight at once, sends one progress
// notification naming its text, then answers "echo:<text>". Scenarios:
//
//   relay       sessions on agents a and b (both given "tools"), prompted at once to call echo
//               with the same inner requestId
//   http        a session on agent h (HTTP MCP only) given "tools", prompted to call echo, as
//               a client of MCP 2026-07-28 and as one of the initialize handshake
//   subagents   a session on agent a, prompted to list and call the bridge's own server
import { spawn } from "node:child_process";
import { appendFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [modules, traffic, scenario, dashes, ...argv] = process.argv.slice(2);
if (dashes !== "--" || argv.length === 0) throw new Error("usage: MODULES TRAFFIC SCENARIO -- ARGV...");
const acp: any = await import(
  pathToFileURL(join(modules, "@agentclientprotocol/sdk/dist/v1/unstable/acp.js")).href
);
writeFileSync(traffic, "");
writeFileSync(`${traffic}.sent`, "");

const child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const decoder = new TextDecoder();
const tee = new TransformStream<Uint8Array, Uint8Array>({
  transform(chunk, controller) {
    appendFileSync(traffic, decoder.decode(chunk, { stream: true }));
    controller.enqueue(chunk);
  },
});
const input = (Readable.toWeb(child.stdout!) as ReadableStream<Uint8Array>).pipeThrough(tee);
const sent = new TransformStream<Uint8Array, Uint8Array>({
  transform(chunk, controller) {
    appendFileSync(`${traffic}.sent`, decoder.decode(chunk, { stream: true }));
    controller.enqueue(chunk);
  },
});
void sent.readable.pipeTo(Writable.toWeb(child.stdin!) as WritableStream<Uint8Array>);
const output = sent.writable;

const want = scenario === "relay" ? 2 : 1;
let active = 0;
let release: () => void = () => {};
const barrier = new Promise<void>((resolve) => (release = resolve));
const served: unknown[] = [];

const complete = { resultType: "complete" };
async function handler(op: any): Promise<unknown> {
  if (op.method === "server/discover") {
    return {
      result: {
        ...complete,
        supportedVersions: ["2026-07-28"],
        capabilities: { tools: {} },
        cacheScope: "private",
        ttlMs: 0,
      },
    };
  }
  if (op.method === "tools/list") {
    const text = { type: "string", "x-mcp-header": "Echo-Text" };
    const tool = { name: "echo", inputSchema: { type: "object", properties: { text } } };
    return { result: { ...complete, tools: [tool], cacheScope: "private", ttlMs: 0 } };
  }
  if (op.method === "tools/call" && op.params?.name === "echo") {
    const text = String(op.params.arguments?.text);
    served.push({ serverId: op.serverId, requestId: op.requestId, text });
    active += 1;
    if (active >= want) release();
    await barrier;
    const token = op.params?._meta?.progressToken ?? op.requestId;
    await op.notify("notifications/progress", {
      progressToken: token,
      progress: 1,
      total: 1,
      message: `working on ${text}`,
    });
    return { result: { ...complete, content: [{ type: "text", text: `echo:${text}` }] } };
  }
  throw new acp.McpProtocolError(-32601, `Method not found: ${op.method}`);
}

const provider = new acp.McpOverAcpProvider();
const app = acp.client({ name: "mcp-acp-test" }).onRequest(
  acp.methods.client.mcp.message,
  provider.handleRequest,
);

async function ask(session: any, text: string): Promise<any> {
  const done = session.prompt(text);
  const said = await session.readText();
  await done;
  return JSON.parse(said);
}

const report: Record<string, unknown> = {};
await app.connectWith(acp.ndJsonStream(output, input), async (ctx: any) => {
  const init = await ctx.request("initialize", { protocolVersion: 1, clientCapabilities: {} });
  report.mcpCapabilities = init.agentCapabilities?.mcpCapabilities;
  const tools = provider.registerServer(ctx, { name: "tools", handler });
  report.serverId = tools.serverId;
  const open = (agent: string, servers: unknown[]) =>
    ctx
      .buildSession({ cwd: "/w", mcpServers: servers, _meta: { acp_bridge: { agent } } })
      .start();
  if (scenario === "relay") {
    const [a, b] = [await open("a", [tools.declaration]), await open("b", [tools.declaration])];
    report.servers = { a: await ask(a, "servers"), b: await ask(b, "servers") };
    const call = (text: string) => `call tools echo '{"text":"${text}"}' fixed-1`;
    const [ra, rb] = await Promise.all([ask(a, call("A")), ask(b, call("B"))]);
    report.calls = { a: ra, b: rb };
  } else if (scenario === "http") {
    const h = await open("h", [tools.declaration]);
    report.call = await ask(h, `call tools echo '{"text":"H"}'`);
    report.legacy = await ask(h, `call-legacy tools echo '{"text":"L"}'`);
  } else if (scenario === "subagents") {
    const a = await open("a", []);
    report.servers = await ask(a, "servers");
    report.listed = await ask(a, "list acp-bridge");
    report.agents = await ask(a, `call acp-bridge list_agents '{}'`);
    report.spawned = await ask(
      a,
      `call acp-bridge spawn_agent '{"agent":"helper","prompt":"hello"}'`,
    );
  }
  report.served = served;
});
await output.close().catch(() => {});
process.stdout.write(JSON.stringify(report) + "\n");
