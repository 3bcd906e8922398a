"""
``acp-bridge prompt TEXT``: one prompt through the bridge, for a newcomer with no editor.

A tiny ACP client runs in-process against a real bridge (real agent processes): it
initializes, opens a session in the current directory, sends the prompt, and prints the agent's
reply as it streams. Tool calls, plans and permission requests are shown on stderr; file reads
and writes the agent asks for are served from the real file system.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

import trio

from acp_bridge.faces.stdio import with_bridge
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.protocol.jsonrpc import JsonObject, dumps, loads, notification, request, result

if TYPE_CHECKING:
    from acp_bridge.config.model import Config
    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.observe.redact import Redactor


class _MiniClient:
    def __init__(
        self,
        send: trio.abc.SendStream,
        receive: trio.abc.ReceiveStream,
        *,
        out: TextIO,
        err: TextIO,
        approve: bool,
    ) -> None:
        self._send = send
        self._receive = receive
        self._decoder = LineDecoder()
        self._next_id = 1
        self._waiting: dict[int, trio.MemorySendChannel[JsonObject]] = {}
        self.out = out
        self.err = err
        self.approve = approve

    async def call(self, method: str, params: JsonObject) -> Any:
        req_id = self._next_id
        self._next_id += 1
        send, receive = trio.open_memory_channel[JsonObject](1)
        self._waiting[req_id] = send
        await self._send.send_all(dumps(request(req_id, method, params)))
        response = await receive.receive()
        if "error" in response:
            err = response["error"]
            raise PromptFailed(f"{method}: {err.get('message')} {err.get('data') or ''}".strip())
        return response.get("result")

    async def notify(self, method: str, params: JsonObject) -> None:
        await self._send.send_all(dumps(notification(method, params)))

    async def read_loop(self) -> None:
        while data := await self._receive.receive_some(65536):
            for line in self._decoder.feed(data):
                if isinstance(line, bytes):
                    await self._handle(loads(line))

    async def _handle(self, msg: JsonObject) -> None:
        if "method" not in msg:
            waiter = self._waiting.pop(msg.get("id"), None)  # type: ignore[arg-type]
            if waiter is not None:
                waiter.send_nowait(msg)
            return
        params = msg.get("params") or {}
        if msg["method"] == "session/update":
            self._show_update(params.get("update") or {})
            return
        if msg["method"] == "_acp_bridge/log":
            self._show_log(params)
            return
        if "id" not in msg:
            return
        answer = self._answer(msg["method"], params)
        await self._send.send_all(dumps(result(msg["id"], answer)))

    def _show_update(self, update: JsonObject) -> None:
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = update.get("content") or {}
            if content.get("type") == "text":
                self.out.write(content.get("text", ""))
                self.out.flush()
        elif kind == "tool_call":
            self.err.write(f"\n[tool] {update.get('title')} ({update.get('status', 'pending')})\n")
        elif kind == "tool_call_update" and update.get("status"):
            self.err.write(f"[tool] {update.get('toolCallId')}: {update['status']}\n")
        elif kind == "plan":
            entries = update.get("entries") or []
            self.err.write("[plan] " + "; ".join(str(e.get("content")) for e in entries) + "\n")

    def _show_log(self, params: JsonObject) -> None:
        data = params.get("data") or {}
        source = f"agent {data['agent']}" if data.get("agent") else "bridge"
        self.err.write(f"[{params.get('level')}] {source}: {data.get('message')}\n")

    def _answer(self, method: str, params: JsonObject) -> JsonObject:
        if method == "session/request_permission":
            title = (params.get("toolCall") or {}).get("title", "a tool call")
            wanted = "allow_once" if self.approve else "reject_once"
            for option in params.get("options") or []:
                if option.get("kind") == wanted:
                    verdict = "allowed" if self.approve else "denied (use --yes to allow)"
                    self.err.write(f"[permission] {title}: {verdict}\n")
                    return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}
            return {"outcome": {"outcome": "cancelled"}}
        if method == "fs/read_text_file":
            with open(params["path"], encoding="utf-8") as f:
                return {"content": f.read()}
        if method == "fs/write_text_file":
            with open(params["path"], "w", encoding="utf-8") as f:
                f.write(params["content"])
            return {}
        return {}


class PromptFailed(Exception):
    pass


async def run_prompt(
    config: Config,
    text: str,
    *,
    agent: str | None = None,
    cwd: str | None = None,
    approve: bool = False,
    log_level: str = "warning",
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    redactor: Redactor | None = None,
) -> str:
    """
    Run one prompt turn through a bridge; returns the stop reason. Diagnostics (agent stderr,
    the bridge's warnings) of ``log_level`` and up are shown on ``err``.

    ``redactor`` becomes the bridge's (pass the one logging was configured with).
    """
    import trio.testing  # here, not at import: it brings pytest along, dear at start-up

    client_side, bridge_side = trio.testing.memory_stream_pair()
    session_cwd = os.path.abspath(cwd or os.getcwd())  # noqa: ASYNC240 (no I/O: string work)
    stop_reason = ""

    async def body(bridge: Bridge) -> None:
        nonlocal stop_reason
        client = _MiniClient(client_side, client_side, out=out, err=err, approve=approve)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_client_stream, bridge, bridge_side, bridge_side)
            nursery.start_soon(client.read_loop)
            await client.call(
                "initialize",
                {
                    "protocolVersion": 1,
                    "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}},
                    "clientInfo": {"name": "acp-bridge-prompt"},
                    "_meta": {"acp_bridge": {"log": log_level}},
                },
            )
            params: JsonObject = {"cwd": session_cwd, "mcpServers": []}
            if agent is not None:
                params["_meta"] = {"acp_bridge": {"agent": agent}}
            session = await client.call("session/new", params)
            reply = await client.call(
                "session/prompt",
                {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": text}]},
            )
            stop_reason = str(reply.get("stopReason"))
            out.write("\n")
            out.flush()
            nursery.cancel_scope.cancel()

    await with_bridge(config, body, redactor=redactor)
    return stop_reason
