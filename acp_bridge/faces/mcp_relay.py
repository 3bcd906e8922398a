"""
``acp-bridge mcp``: the bridge's MCP server for an agent that takes only stdio MCP servers.

The agent runs it (the bridge's ``mcpServers`` entry says how, with the session's token in
``$ACP_BRIDGE_MCP_TOKEN``); it relays each JSON-RPC line of stdin to the bridge's loopback
Streamable HTTP endpoint as one POST, and each answer back as one line of stdout. The MCP
session (``Mcp-Session-Id``) and protocol version of the endpoint are kept here; the agent's
MCP client sees a plain stdio server.

Bounds: at most :data:`MAX_IN_FLIGHT` messages in flight (stdin is not read further until one
ends); a line over :data:`MAX_LINE_BYTES` is answered with an error; an answer over
:data:`MAX_ANSWER_BYTES` too; a POST that gets no answer in :data:`ANSWER_TIMEOUT` (the
bridge's own call deadline comes first) is answered with an error. When stdin ends the
calls still running are dropped (the bridge cancels them when their connections close) and
the MCP session is ended with a DELETE.
"""

from __future__ import annotations

import contextlib
import os
import sys
import urllib.parse
from typing import TYPE_CHECKING, Any, Final

import h11
import orjson
import structlog
import trio

from acp_bridge.faces.token import TokenError, check_token, is_loopback
from acp_bridge.mcp.core import PROTOCOL_VERSIONS
from acp_bridge.mcp.server import DEFAULT_CALL_TIMEOUT, TOKEN_ENV
from acp_bridge.protocol.framing import LineDecoder, Oversize

if TYPE_CHECKING:
    import argparse

__all__ = ["check_mcp_url", "main_mcp", "relay"]

logger = structlog.get_logger("acp_bridge.mcp_relay")

MAX_IN_FLIGHT: Final = 64
MAX_LINE_BYTES: Final = 4 * 1024 * 1024
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024
#: Past the bridge's own call deadline: the bridge answers first unless it is wedged.
ANSWER_TIMEOUT: Final = DEFAULT_CALL_TIMEOUT + 60.0
CONNECT_TIMEOUT: Final = 10.0
EXIT_USAGE: Final = 2


class _NoAnswer(Exception):
    """The endpoint did not answer usably; the message says why."""


def check_mcp_url(url: str) -> tuple[str, int, str]:
    """``(host, port, path)`` of an ``http://`` URL on a loopback address, else ValueError
    (the token must not leave the machine in clear text)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"{url!r}: expected http://127.0.0.1:PORT/PATH")
    if not is_loopback(parts.hostname):
        raise ValueError(f"{url!r}: not a loopback address")
    return parts.hostname, parts.port, parts.path or "/"


class _Relay:
    def __init__(self, url: str, token: str, out: trio.MemorySendChannel[bytes]) -> None:
        self.host, self.port, self.path = check_mcp_url(url)
        self.token = token
        self.out = out
        self.session_id: str | None = None
        self.version: str | None = None

    def _headers(self, *, initialize: bool) -> list[tuple[str, str]]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        headers = [
            ("Host", f"{host}:{self.port}"),
            ("Authorization", f"Bearer {self.token}"),
            ("Accept", "application/json, text/event-stream"),
        ]
        if not initialize and self.session_id is not None:
            headers.append(("Mcp-Session-Id", self.session_id))
        if not initialize and self.version is not None:
            headers.append(("MCP-Protocol-Version", self.version))
        return headers

    async def forward(self, message: dict[str, Any], raw: bytes) -> None:
        """POST one message; write the answer of a request to stdout."""
        initialize = message.get("method") == "initialize"
        is_request = "method" in message and "id" in message
        request_id = message.get("id")
        headers = [*self._headers(initialize=initialize), ("Content-Type", "application/json")]
        try:
            with trio.fail_after(ANSWER_TIMEOUT):
                status, answer_headers, body = await self._http("POST", raw, headers)
        except (OSError, trio.TooSlowError, h11.ProtocolError, _NoAnswer) as exc:
            why = str(exc) or type(exc).__name__
            logger.warning("mcp_relay_failed", error=why)
            if is_request:
                await self._error(request_id, f"the bridge's MCP endpoint did not answer: {why}")
            return
        if initialize and status == 200:
            self.session_id = answer_headers.get("mcp-session-id")
            version = _field(body, "result", "protocolVersion")
            self.version = version if version in PROTOCOL_VERSIONS else None
        if status >= 400:
            logger.warning("mcp_relay_refused", status=status, method=message.get("method"))
        if status == 202 or not is_request:
            return  # a cancelled request, or a notification: no answer on stdout
        if answer_headers.get("content-type", "").startswith("application/json"):
            try:
                answer = orjson.loads(body)
            except orjson.JSONDecodeError:
                answer = None
            if isinstance(answer, dict) and answer.get("jsonrpc") == "2.0":
                if answer.get("id") is None:
                    answer["id"] = request_id  # refused before the bridge read the id
                await self.out.send(orjson.dumps(answer))
                return
        text = body[:200].decode("utf-8", "replace").strip()
        if status == 401:
            text = "the token is not (or no longer) valid: the session has ended"
        await self._error(request_id, f"the bridge answered HTTP {status}: {text}")

    async def _error(self, request_id: object, message: str) -> None:
        await self.out.send(
            orjson.dumps(
                {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": message}}
            )
        )

    async def end(self) -> None:
        """End the MCP session (best effort, briefly)."""
        if self.session_id is None:
            return
        with trio.move_on_after(2.0):
            with contextlib.suppress(OSError, h11.ProtocolError, _NoAnswer):
                await self._http("DELETE", b"", self._headers(initialize=False))

    async def _http(
        self, method: str, body: bytes, headers: list[tuple[str, str]]
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a new connection: status, headers (lower-case names), body."""
        with trio.fail_after(CONNECT_TIMEOUT):
            stream = await trio.open_tcp_stream(self.host, self.port)
        async with stream:
            conn = h11.Connection(h11.CLIENT)
            request = h11.Request(
                method=method,
                target=self.path,
                headers=[*headers, ("Content-Length", str(len(body)))],
            )
            data = conn.send(request) or b""
            if body:
                data += conn.send(h11.Data(data=body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
            await stream.send_all(data)
            status = 0
            answer_headers: dict[str, str] = {}
            answer = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    chunk = await stream.receive_some(65536)
                    conn.receive_data(bytes(chunk))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    answer_headers = {
                        n.decode("latin-1").lower(): v.decode("latin-1") for n, v in event.headers
                    }
                elif isinstance(event, h11.Data):
                    answer += event.data
                    if len(answer) > MAX_ANSWER_BYTES:
                        raise _NoAnswer(f"answer over {MAX_ANSWER_BYTES} bytes")
                elif isinstance(event, h11.EndOfMessage):
                    return status, answer_headers, bytes(answer)
                elif isinstance(event, h11.ConnectionClosed):
                    raise _NoAnswer("connection closed without an answer")


def _field(body: bytes, *path: str) -> object:
    try:
        value: object = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


async def relay(
    url: str, token: str, stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream
) -> int:
    """Relay until ``stdin`` ends; the exit status."""
    send, receive = trio.open_memory_channel[bytes](MAX_IN_FLIGHT)
    state = _Relay(url, token, send)
    slots = trio.Semaphore(MAX_IN_FLIGHT)

    async def write_out(done: trio.CancelScope) -> None:
        try:
            async for line in receive:
                await stdout.send_all(line + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            done.cancel()  # the agent closed our stdout: it is gone, and so are we

    async def one(message: dict[str, Any], raw: bytes) -> None:
        try:
            await state.forward(message, raw)
        finally:
            slots.release()

    async with trio.open_nursery() as outer:
        outer.start_soon(write_out, outer.cancel_scope)
        async with trio.open_nursery() as calls:
            decoder = LineDecoder(max_line_bytes=MAX_LINE_BYTES)
            while chunk := await stdin.receive_some(65536):
                for line in decoder.feed(chunk):
                    if isinstance(line, Oversize):
                        await state._error(None, f"message over {MAX_LINE_BYTES} bytes")
                        continue
                    try:
                        message = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        message = None
                    if not isinstance(message, dict):
                        await state._error(None, "parse error: not a JSON-RPC message")
                        continue
                    await slots.acquire()
                    if message.get("method") == "initialize":
                        await one(message, line)  # later messages need its session id
                    else:
                        calls.start_soon(one, message, line)
            calls.cancel_scope.cancel()  # stdin ended: nobody reads the answers any more
        await state.end()
        await send.aclose()
    return 0


def main_mcp(args: argparse.Namespace) -> int:
    """The ``mcp`` subcommand, from parsed arguments (see ``cli.main.build_parser``)."""
    from acp_bridge.faces.stdio import claim_stdout
    from acp_bridge.observe.log import configure_logging

    protocol_fd = claim_stdout()  # stdout is the MCP stream, from the first byte
    configure_logging(level=args.log_level, fmt=args.log_format, file=args.log_file)
    variable = args.token_env or TOKEN_ENV
    try:
        url = args.url
        check_mcp_url(url)
        token = check_token(
            os.environ.get(variable, "").strip(), f"environment variable {variable}"
        )
    except (ValueError, TokenError) as exc:
        print(f"acp-bridge mcp: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def main() -> int:
        stdin = trio.lowlevel.FdStream(os.dup(0))
        stdout = trio.lowlevel.FdStream(protocol_fd)
        async with stdin, stdout:
            return await relay(url, token, stdin, stdout)

    return trio.run(main)
