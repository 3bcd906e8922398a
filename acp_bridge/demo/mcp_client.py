"""
The demo agent's MCP client: just enough to call the bridge's ``acp-bridge`` server with the
entry a ``session/new`` gave it (docs/subagents.md), over either transport.

Both are newline-delimited JSON-RPC to the client: a stdio entry runs its command (``acp-bridge
mcp ...``, the token in its environment) and talks to its pipes; an http entry runs the same
relay in this process (``faces.mcp_relay.relay``) over a socket pair, which POSTs each message to
the entry's URL with its headers. One request at a time (a turn makes one call at a time).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import TYPE_CHECKING, Any, Final

import orjson
import trio

from acp_bridge.faces.mcp_relay import ANSWER_TIMEOUT, MAX_ANSWER_BYTES, relay
from acp_bridge.protocol.framing import LineDecoder, Oversize

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

__all__ = ["McpClient", "McpError", "connect", "find_entry"]

#: The MCP version asked for (the bridge serves it).
VERSION: Final = "2025-06-18"
#: Seconds the command of a stdio entry gets to end after its stdin closed; then it is killed.
STOP_WAIT: Final = 2.0


class McpError(Exception):
    """The server (or the way to it) failed; the message says how."""


def find_entry(servers: object) -> Mapping[str, Any] | None:
    """The ``acp-bridge`` entry of a session's ``mcpServers``, if it was given one."""
    if not isinstance(servers, list):
        return None
    for server in servers:
        if isinstance(server, dict) and server.get("name") == "acp-bridge":
            return server
    return None


class McpClient:
    """An initialized MCP session over a line stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._decoder = LineDecoder(max_line_bytes=MAX_ANSWER_BYTES)
        self._lines: list[bytes] = []
        self._ids = 0
        self._lock = trio.Lock()

    async def _line(self) -> bytes:
        while not self._lines:
            data = await self._stream.receive_some(65536)
            if not data:
                raise McpError("the MCP server closed the connection")
            for line in self._decoder.feed(data):
                if isinstance(line, Oversize):
                    raise McpError(f"an MCP answer over {MAX_ANSWER_BYTES} bytes")
                self._lines.append(line)
        return self._lines.pop(0)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = dict(params)
        await self._stream.send_all(orjson.dumps(msg) + b"\n")

    async def request(self, method: str, params: Mapping[str, Any]) -> Any:
        """The result of one request (bounded: the bridge's call deadline and a minute)."""
        async with self._lock:
            self._ids += 1
            request_id = self._ids
            msg = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}
            try:
                with trio.fail_after(ANSWER_TIMEOUT):
                    await self._stream.send_all(orjson.dumps(msg) + b"\n")
                    while True:
                        try:
                            answer = orjson.loads(await self._line())
                        except orjson.JSONDecodeError:
                            continue
                        if isinstance(answer, dict) and answer.get("id") == request_id:
                            break
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise McpError(f"the MCP server is gone ({type(exc).__name__})") from None
            except trio.TooSlowError:
                raise McpError(f"no answer to {method} within {ANSWER_TIMEOUT:g} s") from None
        if "error" in answer:
            err = answer["error"]
            text = err.get("message") if isinstance(err, dict) else None
            raise McpError(f"{method}: {text or err}")
        return answer.get("result")

    async def initialize(self) -> None:
        await self.request(
            "initialize",
            {
                "protocolVersion": VERSION,
                "capabilities": {},
                "clientInfo": {"name": "acp-bridge-demo", "version": "1"},
            },
        )
        await self.notify("notifications/initialized")

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A ``tools/call`` result (``isError`` ones too: the caller reads them)."""
        result = await self.request("tools/call", {"name": name, "arguments": dict(arguments)})
        if not isinstance(result, dict):
            raise McpError(f"tools/call {name}: not a result object")
        return result


@contextlib.asynccontextmanager
async def connect(entry: Mapping[str, Any]) -> AsyncIterator[McpClient]:
    """An initialized client for ``entry`` (an ``mcpServers`` entry: http or stdio)."""
    if entry.get("type") == "http":
        try:
            async with _http(entry) as stream:
                client = McpClient(stream)
                await client.initialize()
                yield client
        except BaseExceptionGroup as group:
            # (The relay's task group wraps what the caller raised: an McpError stays one.)
            errors, rest = group.split(McpError)
            if errors is None or rest is not None:
                raise
            first: BaseException = errors
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
    else:
        async with _stdio(entry) as stream:
            client = McpClient(stream)
            await client.initialize()
            yield client


@contextlib.asynccontextmanager
async def _http(entry: Mapping[str, Any]) -> AsyncIterator[trio.abc.Stream]:
    token = None
    for header in entry.get("headers") or []:
        value = header.get("value") if isinstance(header, dict) else None
        if header.get("name", "").lower() == "authorization" and isinstance(value, str):
            token = value.removeprefix("Bearer ").strip()
    url = entry.get("url")
    if not isinstance(url, str) or token is None:
        raise McpError("the http entry has no url or no bearer token")
    ours, theirs = trio.socket.socketpair()
    mine, relayed = trio.SocketStream(ours), trio.SocketStream(theirs)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_relay, url, token, relayed)
        try:
            async with mine:
                yield mine
        finally:
            nursery.cancel_scope.deadline = trio.current_time() + STOP_WAIT


async def _relay(url: str, token: str, stream: trio.SocketStream) -> None:
    async with stream:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await relay(url, token, stream, stream)


@contextlib.asynccontextmanager
async def _stdio(entry: Mapping[str, Any]) -> AsyncIterator[trio.abc.Stream]:
    command = entry.get("command")
    args = entry.get("args") or []
    if not isinstance(command, str) or not all(isinstance(a, str) for a in args):
        raise McpError("the stdio entry has no command")
    env = dict(os.environ)
    for var in entry.get("env") or []:
        if isinstance(var, dict) and isinstance(var.get("name"), str):
            env[var["name"]] = str(var.get("value", ""))
    process = await trio.lowlevel.open_process(
        [command, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert process.stdin is not None
    assert process.stdout is not None
    stream = trio.StapledStream(process.stdin, process.stdout)
    try:
        yield stream
    finally:
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await process.stdin.aclose()
            with trio.move_on_after(STOP_WAIT):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
