"""
A raw client of ACP over HTTP for the tests: each request on a stream of its own (a loopback
socket, or an in-memory stream served by a face), h11 on our side, server-sent events parsed
by hand; it does only what it is told (no retry, no reconnect), so tests see the wire.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import TYPE_CHECKING, Any

import attrs
import h11
import trio
import trio.testing

if TYPE_CHECKING:
    import ssl
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

    from acp_bridge.faces.ws import WebSocketFace

Headers = "Iterable[tuple[str, str]]"


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@attrs.frozen
class Event:
    id: str | None
    data: str

    @property
    def msg(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.data)
        return value


class Events:
    """An open stream of server-sent events: its head, then events as they come."""

    def __init__(self, stream: trio.abc.Stream, reply: Reply, start: bytes) -> None:
        self.stream = stream
        self.status = reply.status
        self.headers = reply.headers
        #: a refusal's text (:meth:`read_refusal`)
        self.body = b""
        self._buffer = bytearray(start)
        #: where the next event starts in the buffer
        self._pos = 0
        self.comments = 0
        self.ended = False

    def _pop(self) -> Event | None:
        """The next complete event in the buffer (comments counted and dropped); None: none."""
        while (end := self._buffer.find(b"\n\n", self._pos)) >= 0:
            block, self._pos = bytes(self._buffer[self._pos : end]), end + 2
            if self._pos > 65536 and self._pos * 2 > len(self._buffer):
                del self._buffer[: self._pos]
                self._pos = 0
            event_id, data = None, []
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "id":
                    event_id = value
                elif name == "data":
                    data.append(value)
            if data:
                return Event(event_id, "\n".join(data))
            self.comments += 1
        return None

    async def next(self) -> Event | None:
        """The next event (comments counted and skipped); None at the end of the stream."""
        while (event := self._pop()) is None:
            if self.ended:
                return None
            chunk = await _receive(self.stream)
            if not chunk:
                self.ended = True
            self._buffer += chunk
        return event

    async def until(self, predicate: Callable[[dict[str, Any]], bool]) -> list[Event]:
        """Events up to and including the first whose message matches."""
        seen = []
        while True:
            event = await self.next()
            assert event is not None, f"the stream ended; it carried {[e.data for e in seen]}"
            seen.append(event)
            if predicate(event.msg):
                return seen

    async def cut(self, size: int) -> list[Event]:
        """The events complete within the next ``size`` bytes of the stream; then the stream
        is closed, whatever came after them (half an event, say) lost, as a network cut
        loses it."""
        events: list[Event] = []
        while len(self._buffer) - self._pos < size and not self.ended:
            chunk = await _receive(self.stream)
            if not chunk:
                self.ended = True
            self._buffer += chunk
        del self._buffer[self._pos + size :]
        while (event := self._pop()) is not None:
            events.append(event)
        self._buffer.clear()
        self._pos = 0
        await self.close()
        return events

    async def read_refusal(self) -> None:
        """A refusal: its whole body into :attr:`body`, and the stream closed."""
        while chunk := await _receive(self.stream):
            self._buffer += chunk
        self.body = bytes(self._buffer)
        await self.close()

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)


class HttpAcpClient:
    """
    ACP over HTTP as a client speaks it: ``initialize`` POSTed, then POSTs with the
    connection's id (and the session's), streams opened with GET.

    Args:
        connect: opens a stream to the server (a new one per request).
        host: the ``Host`` header.
        token: sent as ``Authorization: Bearer`` (None: no token).
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[trio.abc.Stream]],
        *,
        host: str,
        token: str | None,
        path: str = "/acp",
    ) -> None:
        self._connect = connect
        self.host = host
        self.token = token
        self.path = path
        self.connection_id: str | None = None
        self.ids = itertools.count(1)

    def headers(self, extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
        out = [("Host", self.host), ("Connection", "close")]
        if self.token is not None:
            out.append(("Authorization", f"Bearer {self.token}"))
        return [*out, *extra]

    async def _send(
        self, method: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[trio.abc.Stream, h11.Connection, Reply]:
        stream = await self._connect()
        try:
            return await self._exchange(stream, method, headers, body)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def _exchange(
        self, stream: trio.abc.Stream, method: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[trio.abc.Stream, h11.Connection, Reply]:
        conn = h11.Connection(h11.CLIENT)
        if body or method == "POST":
            headers = [*headers, ("Content-Length", str(len(body)))]
        request = h11.Request(method=method, target=self.path, headers=headers)
        data = conn.send(request) + (conn.send(h11.Data(data=body)) if body else b"")
        data += conn.send(h11.EndOfMessage())
        await stream.send_all(data)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                chunk = await stream.receive_some(65536)
                conn.receive_data(chunk)
                continue
            if isinstance(event, h11.Response):
                head = {k.decode().lower(): v.decode() for k, v in event.headers}
                return stream, conn, Reply(event.status_code, head, b"")
            raise AssertionError(f"unexpected {event!r}")

    async def request(
        self, method: str, extra: Iterable[tuple[str, str]] = (), body: bytes = b""
    ) -> Reply:
        """One request, its whole answer (the stream is closed after)."""
        stream, conn, reply = await self._send(method, self.headers(extra), body)
        chunks = []
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                    continue
                if isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                    continue
                break
        finally:
            await trio.aclose_forcefully(stream)
        return attrs.evolve(reply, body=b"".join(chunks))

    async def post(
        self,
        msg: dict[str, Any] | bytes,
        *,
        session: str | None = None,
        extra: Iterable[tuple[str, str]] = (),
        content_type: str = "application/json",
    ) -> Reply:
        headers = [("Content-Type", content_type)]
        if self.connection_id is not None:
            headers.append(("Acp-Connection-Id", self.connection_id))
        if session is not None:
            headers.append(("Acp-Session-Id", session))
        body = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        return await self.request("POST", [*headers, *extra], body)

    async def initialize(self, **params: Any) -> Reply:
        msg = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}, **params},
        }
        reply = await self.post(msg)
        assert reply.status == 200, reply
        self.connection_id = reply.headers["acp-connection-id"]
        return reply

    def request_msg(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params}

    async def events(
        self,
        *,
        session: str | None = None,
        last_event_id: str | None = None,
        extra: Iterable[tuple[str, str]] = (),
    ) -> Events:
        """Open a stream (the connection's, or a session's); its head read, a refusal's body
        read too."""
        headers = [("Accept", "text/event-stream")]
        if self.connection_id is not None:
            headers.append(("Acp-Connection-Id", self.connection_id))
        if session is not None:
            headers.append(("Acp-Session-Id", session))
        if last_event_id is not None:
            headers.append(("Last-Event-ID", last_event_id))
        stream, conn, reply = await self._send("GET", self.headers([*headers, *extra]), b"")
        # (What h11 read past the head is the body's start.)
        events = Events(stream, reply, bytes(conn.trailing_data[0]))
        if reply.status != 200:
            await events.read_refusal()
        return events

    async def delete(self) -> Reply:
        assert self.connection_id is not None
        return await self.request("DELETE", [("Acp-Connection-Id", self.connection_id)])


async def _receive(stream: trio.abc.Stream) -> bytes:
    try:
        return bytes(await stream.receive_some(65536))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


def tcp(port: int) -> Callable[[], Awaitable[trio.abc.Stream]]:
    """Streams to 127.0.0.1:``port``."""

    async def connect() -> trio.abc.Stream:
        return await trio.open_tcp_stream("127.0.0.1", port)

    return connect


def tls(port: int, context: ssl.SSLContext) -> Callable[[], Awaitable[trio.abc.Stream]]:
    """TLS streams to 127.0.0.1:``port``."""

    async def connect() -> trio.abc.Stream:
        return await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=context)

    return connect


def memory(
    face: WebSocketFace, nursery: trio.Nursery, *, lockstep: bool = False
) -> Callable[[], Awaitable[trio.abc.Stream]]:
    """In-memory streams served by ``face`` (lockstep: a write waits for the read)."""

    async def connect() -> trio.abc.Stream:
        pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
        client_side, server_side = pair()
        nursery.start_soon(face.handle_connection, server_side)
        return client_side

    return connect


@contextlib.asynccontextmanager
async def opened(events: Awaitable[Events]) -> AsyncIterator[Events]:
    stream = await events
    try:
        yield stream
    finally:
        await stream.close()
