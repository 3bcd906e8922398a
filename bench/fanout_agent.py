"""
A minimal ACP v1 parent agent for the fan-out benchmark: stdlib only, synchronous.

It advertises ``mcpCapabilities.http`` and keeps the ``acp-bridge`` MCP server its
``session/new`` was given. A prompt ``fanout N AGENT TEXT`` calls ``spawn_agent`` N times on
AGENT with TEXT (``wait: false``: the children stream at once), then ``wait_agents`` until
none is running, and ends its turn (any other prompt ends it at once). The bridge's MCP
endpoint is plain JSON over HTTP POST (``http.client``); the agent itself streams nothing.
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.parse
from typing import Any

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(_dumps(msg) + "\n")
    sys.stdout.flush()


class Mcp:
    """One MCP session with the bridge's endpoint (each request on its own connection)."""

    def __init__(self, entry: dict[str, Any]) -> None:
        url = urllib.parse.urlsplit(entry["url"])
        self.host, self.port, self.path = url.hostname or "127.0.0.1", url.port or 80, url.path
        self.headers = {h["name"]: h["value"] for h in entry.get("headers", [])}
        self.headers["Content-Type"] = "application/json"
        self.headers["Accept"] = "application/json, text/event-stream"
        self.ids = 0
        result = self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
        self.headers["MCP-Protocol-Version"] = result["protocolVersion"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=3700)
        try:
            conn.request("POST", self.path, _dumps(body), self.headers)
            answer = conn.getresponse()
            return answer.status, dict(answer.getheaders()), answer.read()
        finally:
            conn.close()

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.ids += 1
        status, headers, body = self.post(
            {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        )
        if status != 200:
            raise RuntimeError(f"{method}: HTTP {status}: {body[:200]!r}")
        session = headers.get("mcp-session-id") or headers.get("Mcp-Session-Id")
        if session:
            self.headers["Mcp-Session-Id"] = session
        answer = json.loads(body)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.call("tools/call", {"name": name, "arguments": arguments})
        if result.get("isError"):
            raise RuntimeError(f"{name}: {result['content'][0]['text']}")
        structured: dict[str, Any] = result["structuredContent"]
        return structured


def fanout(mcp: Mcp, n: int, agent: str, text: str) -> str:
    """Spawn ``n`` children at once; wait until none runs. The stop reason of the turn."""
    for _ in range(n):
        mcp.tool("spawn_agent", {"agent": agent, "prompt": text, "wait": False})
    while True:
        statuses = mcp.tool("wait_agents", {})["children"]
        if all(s["state"] != "running" for s in statuses):
            return "end_turn"


def main() -> int:
    servers: dict[str, dict[str, Any]] = {}
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, req_id = msg.get("method"), msg.get("id")
        params = msg.get("params") or {}
        if method == "initialize":
            caps = {"loadSession": False, "mcpCapabilities": {"http": True}}
            _send({"jsonrpc": "2.0", "id": req_id, "result": {"protocolVersion": 1,
                   "agentCapabilities": caps, "authMethods": []}})  # fmt: skip
        elif method == "session/new":
            sid = f"parent-{len(servers) + 1}"
            entries = [s for s in params.get("mcpServers", []) if s.get("name") == "acp-bridge"]
            servers[sid] = entries[0] if entries else {}
            _send({"jsonrpc": "2.0", "id": req_id, "result": {"sessionId": sid}})
        elif method == "session/prompt":
            words = " ".join(b.get("text", "") for b in params.get("prompt", [])).split(" ", 3)
            stop = "end_turn"
            try:
                if len(words) == 4 and words[0] == "fanout":
                    stop = fanout(Mcp(servers[params["sessionId"]]), int(words[1]), *words[2:])
            except (RuntimeError, OSError, KeyError, ValueError) as exc:
                error = {"code": -32603, "message": f"fan-out failed: {exc}"}
                _send({"jsonrpc": "2.0", "id": req_id, "error": error})
                continue
            _send({"jsonrpc": "2.0", "id": req_id, "result": {"stopReason": stop}})
        elif req_id is not None and method is not None:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            _send({"jsonrpc": "2.0", "id": req_id, "error": error})
    return 0


if __name__ == "__main__":
    sys.exit(main())
