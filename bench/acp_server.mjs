// The TypeScript SDK's own Streamable HTTP server (npm @agentclientprotocol/sdk: AcpServer
// from experimental/server, createNodeHttpHandler from experimental/node) in front of an
// agent process: the anchor the bridge's HTTP face is measured against.
//
//     node bench/acp_server.mjs PACKAGE_DIR AGENT_ARGV_JSON
//
// PACKAGE_DIR is the installed package (node_modules/@agentclientprotocol/sdk);
// AGENT_ARGV_JSON the agent's command as a JSON array (no shell). Each ACP connection gets its
// agent process, its messages relayed as NDJSON with the SDK's own ndJsonStream (a connector
// is all AcpServer needs of an agent). Listens on a free loopback port and says where on
// stderr: "acp-server listening on http://127.0.0.1:PORT/acp".
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [packageDir, agentJson] = process.argv.slice(2);
if (!packageDir || !agentJson) {
  console.error("usage: acp_server.mjs PACKAGE_DIR AGENT_ARGV_JSON");
  process.exit(2);
}
const load = (path) => import(pathToFileURL(join(packageDir, "dist", path)).href);
const { AcpServer } = await load("transports/server.js");
const { createNodeHttpHandler } = await load("transports/node-adapter.js");
const { ndJsonStream } = await load("v1/stable/acp.js");
const [command, ...args] = JSON.parse(agentJson);
const children = new Set();

const relay = {
  connect(stream) {
    const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
    children.add(child);
    const agent = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
    const closed = Promise.allSettled([
      stream.readable.pipeTo(agent.writable),
      agent.readable.pipeTo(stream.writable),
    ]).then(() => {
      children.delete(child);
      child.kill();
    });
    return { closed };
  },
};

const server = new AcpServer({ agent: relay });
const http = createServer(createNodeHttpHandler(server));
http.listen(0, "127.0.0.1", () => {
  const { port } = http.address();
  console.error(`acp-server listening on http://127.0.0.1:${port}/acp`);
});
const stop = () => {
  for (const child of children) child.kill();
  http.close();
  void server.close().finally(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000).unref();
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
