// The TypeScript SDK's experimental v2 client (@agentclientprotocol/sdk 2.4.0) in front of
// `acp-bridge stdio --experimental-v2`: run with tsx by tests/interop/test_v2_sdk.py.
//
//   tsx v2_client.mts NODE_MODULES TRAFFIC_FILE PERMISSION_PROMPT -- BRIDGE_ARGV...
//
// Writes every line the bridge sent to TRAFFIC_FILE (checked against the v2 schema by the
// test) and prints one JSON object with what the client saw.
import { spawn } from "node:child_process";
import { appendFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";
import type * as V2 from "@agentclientprotocol/sdk/experimental/v2";

const [modules, traffic, permissionPrompt, dashes, ...argv] = process.argv.slice(2);
if (dashes !== "--" || argv.length === 0) throw new Error("usage: MODULES TRAFFIC PROMPT -- ARGV...");
// (The pinned peers are installed outside this directory: imported from where they are.)
const acp: typeof V2 = await import(
  pathToFileURL(join(modules, "@agentclientprotocol/sdk/dist/v2/stable/acp.js")).href
);
writeFileSync(traffic, "");

const child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const decoder = new TextDecoder();
const tee = new TransformStream<Uint8Array, Uint8Array>({
  transform(chunk, controller) {
    appendFileSync(traffic, decoder.decode(chunk, { stream: true }));
    controller.enqueue(chunk);
  },
});
const input = (Readable.toWeb(child.stdout!) as ReadableStream<Uint8Array>).pipeThrough(tee);
const output = Writable.toWeb(child.stdin!) as WritableStream<Uint8Array>;

const report: Record<string, unknown> = {};
const permissions: unknown[] = [];

// The resume's replay, seen by a handler of every session/update while it runs.
let replaying: ((update: V2.SessionUpdate) => void) | undefined;

const app = acp
  .client({ name: "v2-test" })
  .onRequest("session/request_permission", async ({ params }) => {
    permissions.push({ title: params.title, subject: params.subject?.type });
    const allow = params.options.find((o) => String(o.kind).startsWith("allow")) ?? params.options[0];
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  })
  .onNotification("session/update", ({ params }) => {
    replaying?.(params.update);
  });

await app.connectWith(acp.ndJsonStream(output, input), async (ctx) => {
  const init = await ctx.request("initialize", {
    protocolVersion: 2,
    info: { name: "v2-test", version: "1.0.0" },
  });
  report.protocolVersion = init.protocolVersion;
  const session = await ctx.buildSession("/w").start();
  report.sessionId = session.sessionId;
  const ack = await session.prompt("count 3");
  report.messageId = ack.messageId;
  report.text = await session.readTextUntilIdle();
  await session.prompt(permissionPrompt);
  report.permissionText = await session.readTextUntilIdle();
  report.permissions = permissions;
  const listed = await ctx.request("session/list", {});
  report.listed = listed.sessions.map((s) => s.sessionId);
  session.dispose();

  // A second view of the same session: replayed from the start, as messageId-keyed messages.
  const replayed: Array<{ kind: string; messageId: string; text: string }> = [];
  replaying = (update: V2.SessionUpdate) => {
    if (
      update.sessionUpdate === "user_message" ||
      update.sessionUpdate === "agent_message" ||
      update.sessionUpdate === "agent_thought"
    ) {
      const text = (update.content ?? [])
        .map((c) => (c.type === "text" ? (c as { text: string }).text : ""))
        .join("");
      replayed.push({ kind: update.sessionUpdate, messageId: update.messageId, text });
    }
  };
  report.resume = await ctx.request("session/resume", {
    sessionId: session.sessionId,
    cwd: "/w",
    replayFrom: { type: "start" },
  });
  report.close = await ctx.request("session/close", { sessionId: session.sessionId });
  // (Notification handlers may still run after the response resolved: read them last.)
  report.replayed = replayed;
});
child.stdin!.end();
process.stdout.write(JSON.stringify(report) + "\n");
