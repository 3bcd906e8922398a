"""An ACP agent that speaks HTTP MCP only, its MCP client the official Python ``mcp`` SDK.

Run it as a script (tests/interop/test_mcp_acp.py runs it behind ``acp-bridge stdio``)::

    python tests/support/peers/mcp_http_agent.py NAME TRAFFIC_FILE

It advertises ``mcpCapabilities.http`` (and not ``acp``), writes every line it reads (what the
bridge sent it) to TRAFFIC_FILE (what it sends to TRAFFIC_FILE.sent), and remembers each
session's ``mcpServers``. A prompt is one command; its answer is one ``agent_message_chunk``
holding JSON:

- ``servers``                          the session's ``mcpServers`` as it received them
- ``call SERVER TOOL ARGS_JSON``       ``tools/call`` on that HTTP server (the SDK picks the
                                       MCP revision by probing ``server/discover``):
                                       ``{"text", "isError", "progress": [messages], "version"}``
- ``call-legacy SERVER TOOL ARGS_JSON`` the same through the ``initialize`` handshake (the
                                       revisions before 2026-07-28)
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from typing import Any


class HttpAgent:
    def __init__(self, name: str, traffic: str) -> None:
        self.name = name
        self.traffic = traffic
        self.servers: dict[str, list[dict[str, Any]]] = {}
        self.sessions = 0
        self.out = sys.stdout.buffer
        self.lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message).encode() + b"\n"
        async with self.lock:
            _append(f"{self.traffic}.sent", line)
            self.out.write(line)
            self.out.flush()

    async def handle(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params") or {}
        if "id" not in message or method is None:
            return  # (answers and notifications: this agent asks and expects nothing)
        if method == "initialize":
            result: Any = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": False, "mcpCapabilities": {"http": True}},
                "authMethods": [],
                "agentInfo": {"name": self.name, "version": "1.0.0"},
            }
        elif method == "session/new":
            self.sessions += 1
            sid = f"{self.name}-{self.sessions}"
            self.servers[sid] = params.get("mcpServers") or []
            result = {"sessionId": sid}
        elif method == "session/prompt":
            sid = params["sessionId"]
            text = " ".join(b["text"] for b in params["prompt"] if b.get("type") == "text")
            report = await self.run(sid, shlex.split(text))
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": json.dumps(report)},
            }
            await self.send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": sid, "update": update},
                }
            )
            result = {"stopReason": "end_turn"}
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            await self.send({"jsonrpc": "2.0", "id": message["id"], "error": error})
            return
        await self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})

    async def run(self, sid: str, words: list[str]) -> Any:
        if words[0] == "servers":
            return self.servers[sid]
        command, server, tool, args = words
        [entry] = [s for s in self.servers[sid] if s.get("name") == server]
        mode = "legacy" if command == "call-legacy" else "auto"
        return await call_tool(entry, tool, json.loads(args), mode)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        tasks = set()
        while line := await reader.readline():
            _append(self.traffic, line)
            task = asyncio.create_task(self.handle(json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


def _append(path: str, line: bytes) -> None:
    with open(path, "ab") as f:
        f.write(line)


async def call_tool(entry: dict[str, Any], tool: str, arguments: dict[str, Any], mode: str) -> Any:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {h["name"]: h["value"] for h in entry.get("headers", [])}
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(entry["url"], http_client=http), mode=mode) as client,
    ):
        result = await client.call_tool(tool, arguments, progress_callback=on_progress)
        version = client.protocol_version
    return {
        "text": "".join(getattr(c, "text", "") for c in result.content),
        "isError": bool(result.is_error),
        "progress": progress,
        "version": version,
    }


def main() -> None:
    name, traffic = sys.argv[1:3]
    open(traffic, "wb").close()
    open(f"{traffic}.sent", "wb").close()
    asyncio.run(HttpAgent(name, traffic).serve())


if __name__ == "__main__":
    main()
