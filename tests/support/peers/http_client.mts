// The TypeScript SDK's Streamable HTTP client (@agentclientprotocol/sdk 2.4.0,
// createHttpStream) against `acp-bridge serve` in front of the demo agent: run with tsx by
// tests/interop/test_http_sdk.py.
//
//   tsx http_client.mts NODE_MODULES URL TOKEN CWD
//
// One connection: initialize, session/new, a streamed prompt, a permission answered, a
// cancel; then a second connection loads the session, sees its history and prompts again.
// Prints one JSON object with what the client saw.
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import type * as V1 from "@agentclientprotocol/sdk";
import type * as Http from "@agentclientprotocol/sdk/experimental/http-client";

const [modules, url, token, cwd] = process.argv.slice(2);
if (!cwd) throw new Error("usage: MODULES URL TOKEN CWD");
// (The pinned peers are installed outside this directory: imported from where they are.)
const sdk = join(modules, "@agentclientprotocol/sdk/dist");
const acp: typeof V1 = await import(pathToFileURL(join(sdk, "v1/stable/acp.js")).href);
const http: typeof Http = await import(pathToFileURL(join(sdk, "transports/http-stream.js")).href);

type Seen = { texts: string[]; kinds: string[]; permissions: string[]; written: string[] };

function textOf(update: V1.SessionUpdate): string | undefined {
  if (update.sessionUpdate !== "agent_message_chunk" && update.sessionUpdate !== "user_message_chunk")
    return undefined;
  return update.content.type === "text" ? update.content.text : undefined;
}

/** A client app that records updates and answers permissions (allow once) and writes. */
function clientApp(seen: Seen, onUpdate: () => void) {
  return acp
    .client({ name: "http-test" })
    .onRequest("session/request_permission", async ({ params }) => {
      seen.permissions.push(params.toolCall.title ?? "");
      const allow = params.options.find((o) => o.kind === "allow_once") ?? params.options[0];
      return { outcome: { outcome: "selected", optionId: allow.optionId } };
    })
    .onRequest("fs/write_text_file", async ({ params }) => {
      seen.written.push(`${params.path}=${params.content}`);
      return {};
    })
    .onNotification("session/update", async ({ params }) => {
      seen.kinds.push(params.update.sessionUpdate);
      const text = textOf(params.update);
      if (text !== undefined) seen.texts.push(text);
      onUpdate();
    });
}

function connect(seen: Seen, onUpdate: () => void = () => {}) {
  const stream = http.createHttpStream(url, { headers: { Authorization: `Bearer ${token}` } });
  return clientApp(seen, onUpdate).connect(stream);
}

async function until(check: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const report: Record<string, unknown> = {};
const capabilities = { fs: { readTextFile: true, writeTextFile: true }, terminal: false };

// -- the first connection -----------------------------------------------------------------
const first: Seen = { texts: [], kinds: [], permissions: [], written: [] };
let cancelAt: (() => void) | undefined;
const one = connect(first, () => cancelAt?.());
const init = await one.agent.request("initialize", {
  protocolVersion: acp.PROTOCOL_VERSION,
  clientCapabilities: capabilities,
});
report.loadSession = init.agentCapabilities?.loadSession ?? false;
const created = await one.agent.request("session/new", { cwd, mcpServers: [] });
const sessionId = created.sessionId;
report.sessionId = sessionId;
const counted = await one.agent.request("session/prompt", {
  sessionId,
  prompt: [{ type: "text", text: "count 5" }],
});
report.countStop = counted.stopReason;
report.countTexts = [...first.texts];
const wrote = await one.agent.request("session/prompt", {
  sessionId,
  prompt: [{ type: "text", text: "write notes.txt hi" }],
});
report.writeStop = wrote.stopReason;
report.permissions = [...first.permissions];
report.written = [...first.written];
// A slow turn, cancelled after its first chunk.
const before = first.texts.length;
let cancelling: Promise<void> | undefined;
cancelAt = () => {
  if (cancelling === undefined && first.texts.length > before) {
    cancelling = one.agent.notify("session/cancel", { sessionId });
  }
};
const slow = await one.agent.request("session/prompt", {
  sessionId,
  prompt: [{ type: "text", text: "slow" }],
});
await cancelling;
report.cancelStop = slow.stopReason;
report.slowChunks = first.texts.length - before;
report.firstTexts = [...first.texts];
one.close();
await one.closed;

// -- a second connection loads the session --------------------------------------------------
const second: Seen = { texts: [], kinds: [], permissions: [], written: [] };
const two = connect(second);
const again = await two.agent.request("initialize", {
  protocolVersion: acp.PROTOCOL_VERSION,
  clientCapabilities: capabilities,
});
report.loadSessionAgain = again.agentCapabilities?.loadSession ?? false;
await two.agent.request("session/load", { sessionId, cwd, mcpServers: [] });
// The history came before the load's answer; its last chunk is the cancelled turn's.
await until(() => second.texts.length >= first.texts.length, "the replayed history");
report.history = [...second.texts];
report.historyKinds = [...new Set(second.kinds)];
const more = await two.agent.request("session/prompt", {
  sessionId,
  prompt: [{ type: "text", text: "count 3" }],
});
report.againStop = more.stopReason;
report.againTexts = second.texts.slice(report.history.length as number);
two.close();
await two.closed;
console.log(JSON.stringify(report));
