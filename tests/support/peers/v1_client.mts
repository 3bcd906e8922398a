// The TypeScript SDK's v1 client (@agentclientprotocol/sdk 2.4.0) as a stock client (no
// _meta) in front of `acp-bridge stdio`: run with tsx by tests/interop/test_v1_sdk.py.
//
//   tsx v1_client.mts NODE_MODULES TRAFFIC_PREFIX SCENARIO NOTICES -- BRIDGE_ARGV...
//
// SCENARIO: "timeout" (a permission request nobody answers: the bridge's deadline ends it) or
// "crash" (a permission request waits on one session while the agent crashes on another).
// NOTICES: "notices" to advertise clientCapabilities.session.notices, anything else not to.
// The permission handler never answers: it waits until the SDK aborts it, which it does on
// the bridge's $/cancel_request for that request. Writes what the bridge sent to
// TRAFFIC_PREFIX.in.ndjson and what the client sent to TRAFFIC_PREFIX.out.ndjson (checked by
// the test), and prints one JSON object with what the client saw.
import { spawn } from "node:child_process";
import { appendFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [modules, traffic, scenario, notices, dashes, ...argv] = process.argv.slice(2);
if (dashes !== "--" || argv.length === 0) {
  throw new Error("usage: MODULES TRAFFIC SCENARIO NOTICES -- ARGV...");
}
// (The pinned peers are installed outside this directory: imported from where they are.)
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const acp: any = await import(
  pathToFileURL(join(modules, "@agentclientprotocol/sdk/dist/v1/stable/acp.js")).href
);
const inFile = `${traffic}.in.ndjson`;
const outFile = `${traffic}.out.ndjson`;
writeFileSync(inFile, "");
writeFileSync(outFile, "");

const child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const tee = (file: string) => {
  const decoder = new TextDecoder();
  return new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, controller) {
      appendFileSync(file, decoder.decode(chunk, { stream: true }));
      controller.enqueue(chunk);
    },
  });
};
const input = (Readable.toWeb(child.stdout!) as ReadableStream<Uint8Array>).pipeThrough(tee(inFile));
const toBridge = tee(outFile);
// (Closed by the connection's end, or by the stdin end below: either way the pipe is done.)
const piped = toBridge.readable
  .pipeTo(Writable.toWeb(child.stdin!) as WritableStream<Uint8Array>)
  .catch(() => undefined);

type Report = {
  sessions: string[];
  permissions: Array<{ requestId: unknown; sessionId: string; toolCallId: string }>;
  withdrawn: unknown[];
  notices: Record<string, unknown[]>;
  texts: Record<string, string[]>;
  prompts: unknown[];
};
const report: Report = { sessions: [], permissions: [], withdrawn: [], notices: {}, texts: {}, prompts: [] };
let asked: (() => void) | undefined;
let withdrawnOnce: (() => void) | undefined;
const withdrawn = new Promise<void>((resolve) => {
  withdrawnOnce = resolve;
});

const app = acp
  .client({ name: "v1-test" })
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  .onRequest("session/request_permission", async ({ params, signal, requestId }: any) => {
    report.permissions.push({
      requestId,
      sessionId: params.sessionId,
      toolCallId: params.toolCall.toolCallId,
    });
    asked?.();
    // Nobody answers: the request ends when the bridge withdraws it ($/cancel_request).
    await new Promise<void>((resolve) => {
      if (signal.aborted) resolve();
      signal.addEventListener("abort", () => resolve());
    });
    report.withdrawn.push(requestId);
    withdrawnOnce?.();
    throw signal.reason;
  })
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  .onNotification("session/update", ({ params }: any) => {
    const update = params.update;
    if (update.sessionUpdate === "notice") {
      (report.notices[params.sessionId] ??= []).push(update);
    } else if (update.sessionUpdate === "agent_message_chunk" && update.content.type === "text") {
      (report.texts[params.sessionId] ??= []).push(update.content.text);
    }
  });

// eslint-disable-next-line @typescript-eslint/no-explicit-any
const settled = (p: Promise<any>) =>
  p.then(
    (result) => ({ result }),
    (error) => ({ error: { code: error.code, message: error.message } }),
  );
const prompt = (text: string) => [{ type: "text", text }];

// eslint-disable-next-line @typescript-eslint/no-explicit-any
await app.connectWith(acp.ndJsonStream(toBridge.writable, input), async (ctx: any) => {
  const clientCapabilities: Record<string, unknown> = {};
  if (notices === "notices") clientCapabilities.session = { notices: {} };
  await ctx.request("initialize", {
    protocolVersion: 1,
    clientCapabilities,
    clientInfo: { name: "v1-test", version: "1.0.0" },
  });
  const newSession = async () => {
    const { sessionId } = await ctx.request("session/new", { cwd: process.cwd(), mcpServers: [] });
    report.sessions.push(sessionId);
    return sessionId as string;
  };
  const first = await newSession();
  if (scenario === "timeout") {
    report.prompts.push(await settled(ctx.request("session/prompt", { sessionId: first, prompt: prompt("permission") })));
    return;
  }
  const second = await newSession();
  const shown = new Promise<void>((resolve) => {
    asked = resolve;
  });
  const waiting = settled(ctx.request("session/prompt", { sessionId: first, prompt: prompt("permission") }));
  await shown;
  const crashed = await settled(ctx.request("session/prompt", { sessionId: second, prompt: prompt("crash") }));
  report.prompts.push(await waiting, crashed);
  // (The bridge withdraws it before it answers the prompts: a moment at most, if ever.)
  await Promise.race([withdrawn, new Promise((resolve) => setTimeout(resolve, 5000))]);
});
child.stdin!.end();
await piped;
process.stdout.write(JSON.stringify(report) + "\n");
