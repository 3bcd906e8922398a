// The thinkwell conductor (npm @thinkwell/conductor) as a stdio ACP proxy chain with no
// proxies: the client on this process's stdin/stdout, the agent a subprocess. The package is
// a library without a command of its own; this is the least a program around it needs (its
// README's `new Conductor({instantiator: fromCommands([agent])})` and `connect(client)`).
//
//     node bench/conductor_stdio.mjs PACKAGE_DIR AGENT_ARGV_JSON
//
// PACKAGE_DIR is the installed package (node_modules/@thinkwell/conductor); AGENT_ARGV_JSON
// the agent's command as a JSON array (no shell). The client's lines are read and written the
// way the package's own StdioConnector does it for the agent's side (readline, one
// JSON.stringify and write per message), so both sides of the conductor cost the same.
import { createInterface } from "node:readline";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [packageDir, agentJson] = process.argv.slice(2);
if (!packageDir || !agentJson) {
  console.error("usage: conductor_stdio.mjs PACKAGE_DIR AGENT_ARGV_JSON");
  process.exit(2);
}
const { Conductor, fromCommands } = await import(
  pathToFileURL(join(packageDir, "dist", "index.js")).href
);
const [command, ...args] = JSON.parse(agentJson);

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
const client = {
  send(message) {
    process.stdout.write(JSON.stringify(message) + "\n");
  },
  messages: {
    async *[Symbol.asyncIterator]() {
      for await (const line of lines) {
        if (line.trim()) yield JSON.parse(line);
      }
    },
  },
  async close() {
    lines.close();
  },
};

const conductor = new Conductor({
  instantiator: fromCommands([{ command, args }]),
  // No MCP-over-ACP servers in the benchmark: no HTTP listener for them either.
  mcpBridgeMode: "disabled",
});
await conductor.connect({ connect: async () => client });
// The client hung up: the conductor has shut its agent down.
process.exit(0);
