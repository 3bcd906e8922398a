"""
The HTTP/1.1 server behind every listener of the daemon: ``serve``'s port (WebSocket upgrade,
health, status, metrics, the console) and the sub-agent MCP endpoint. ``http.wire`` decides
(who may ask what, the answers, the body's framing); this reads and writes.

A connection goes through :meth:`HttpServer.handle_connection`:

1. a place among the connections still sending their request head (``max_pending``; the
   oldest gives its place to a newcomer once it is ``evict_age`` old: a client trickling its
   head in holds a place for a second, not for ``head_timeout``), and a count of connections
   open (``max_connections``): past either, ``busy`` is answered (at most that many such
   answers at once, and none under TLS: past that the socket is closed unanswered);
2. TLS, when configured, and the request head (h11; at most ``MAX_HEAD_BYTES`` and
   ``MAX_HEADERS``, else 431), both within ``head_timeout`` of the connection's start: a
   silent or trickling socket is closed unanswered then;
3. :meth:`Site.judge <acp_bridge.http.wire.Site.judge>`: a refusal, or the route's handler;
4. the handler, with an :class:`Exchange`: it may read the body (:meth:`Exchange.body`,
   within ``body_timeout``, else 408), take the connection over (:meth:`Exchange.take`: a
   WebSocket), write a body over time (:meth:`Exchange.stream`: server-sent events), or
   return a :class:`~acp_bridge.http.wire.Response`;
5. the response, within ``send_timeout``; then, unless the response and the client both
   keep the connection for another request (back to 2), the linger (:func:`send_and_linger`)
   and the close.

Handlers are plain async functions of an :class:`Exchange`; a peer that goes away mid-way
(the stream broken or closed) ends the connection quietly, whatever the handler was doing.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from typing import TYPE_CHECKING, Final, TypeAlias

import attrs
import h11
import structlog
import trio

from acp_bridge.http.wire import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    BodyError,
    Chunked,
    ChunkedDecoder,
    Length,
    RequestHead,
    Response,
    body_framing,
    has_body,
    head_refusal,
    plain,
    too_large,
)

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable

    from structlog.typing import FilteringBoundLogger as Log

    from acp_bridge.http.wire import Hosts, Site

__all__ = [
    "EventStream",
    "Exchange",
    "Handler",
    "HttpServer",
    "Limits",
    "ServerStatistics",
    "send_and_linger",
]

logger = structlog.get_logger("acp_bridge.http")

#: What one read of a request head takes at most (never past ``MAX_HEAD_BYTES`` in all: h11
#: checks its limit only between reads, so a last read of a bigger chunk would let a head grow
#: past it).
HEAD_CHUNK: Final = 4096
#: What one read of a body (or of what is drained) takes at most.
BODY_CHUNK: Final = 65536
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_BUSY: Final = plain(503, "busy", (("Retry-After", "5"),))

#: A route's handler: its response, or None when it took the connection or streamed its own
#: (or when the peer is gone and nothing is to be answered).
Handler: TypeAlias = "Callable[[Exchange], Awaitable[Response | None]]"


@attrs.frozen
class Limits:
    """
    A listener's bounds (seconds and bytes).

    Attributes:
        head_timeout: TLS and a request head, from the connection's start (or, on a kept
            connection, from the previous response): past it the socket is closed unanswered.
        body_timeout: a request body, from when the handler asks for it: 408 past it.
        send_timeout: writing a response and lingering after it: the socket is dropped past it.
        max_connections: connections open at once (None: no cap); one more is answered busy.
        max_pending: connections still sending their request head (None: no cap).
        evict_age: the age at which the oldest pending connection gives its place away.
        linger_seconds: after a last response, how long the rest of the request is read...
        linger_bytes: ... and how much of it, before the socket is closed.
        busy: the answer past ``max_connections`` or ``max_pending``.
    """

    head_timeout: float = 10.0
    body_timeout: float = 30.0
    send_timeout: float = 10.0
    max_connections: int | None = None
    max_pending: int | None = None
    evict_age: float = 1.0
    linger_seconds: float = 1.0
    linger_bytes: int = 64 * 1024
    busy: Response = _BUSY


@attrs.frozen
class ServerStatistics:
    """
    Attributes:
        connections: connections open (whatever they do: a WebSocket taken over included).
        pending: connections still in TLS or sending a request head.
        refused: responses with an error status (400 and up) since start.
    """

    connections: int
    pending: int
    refused: int


@attrs.define(eq=False)
class _Place:
    """One connection's place among the pending ones, and its head deadline."""

    started: float
    scope: trio.CancelScope
    evicted: bool = False


class _Reader:
    """A connection's input: the bytes read past what was consumed come first."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def head(self) -> RequestHead | Response | None:
        """The next request head; a refusal for a malformed one; None at EOF before one."""
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        received = len(self.buffer)
        if self.buffer:
            parser.receive_data(bytes(self.buffer))
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                return head_refusal(exc.error_status_hint)
            if event is h11.NEED_DATA:
                room = MAX_HEAD_BYTES - received
                if room <= 0:
                    return head_refusal(431)
                data = await self.stream.receive_some(min(HEAD_CHUNK, room))
                if not data:
                    return None
                received += len(data)
                parser.receive_data(bytes(data))
                continue
            if not isinstance(event, h11.Request):
                return None
            if len(event.headers) > MAX_HEADERS:
                return plain(431, "request head too large: too many header fields")
            self.buffer = bytearray(parser.trailing_data[0])
            return RequestHead(
                method=event.method.decode("ascii", "replace"),
                target=event.target.decode("latin-1"),
                http_version=event.http_version.decode("ascii", "replace"),
                headers=tuple(
                    (name.decode("latin-1").lower(), value.decode("latin-1"))
                    for name, value in event.headers
                ),
            )

    async def body(self, framing: Length | Chunked, max_bytes: int) -> bytes | Response:
        """The body (at most ``max_bytes``: 413 past it, read no further); 400 when it is
        malformed or cut short."""
        if isinstance(framing, Length):
            while len(self.buffer) < framing.length:
                want = min(BODY_CHUNK, framing.length - len(self.buffer))
                if not (chunk := await self.stream.receive_some(want)):
                    return plain(400, "request body cut short")
                self.buffer += chunk
            body = bytes(self.buffer[: framing.length])
            del self.buffer[: framing.length]
            return body
        decoder = ChunkedDecoder()
        body_so_far = bytearray()
        data, self.buffer = bytes(self.buffer), bytearray()
        while True:
            try:
                body_so_far += decoder.feed(data)
            except BodyError as exc:
                return plain(400, f"bad request: {exc}")
            if len(body_so_far) > max_bytes:
                return too_large(max_bytes)
            if decoder.done:
                self.buffer = bytearray(decoder.rest)
                return bytes(body_so_far)
            if not (data := bytes(await self.stream.receive_some(BODY_CHUNK))):
                return plain(400, "request body cut short")


class EventStream:
    """
    A response whose body is written over time (server-sent events): each write must be
    taken within ``send_timeout`` seconds, else the stream is dropped (:attr:`stalled`).
    """

    def __init__(self, stream: trio.abc.Stream, send_timeout: float) -> None:
        self._stream = stream
        self._send_timeout = send_timeout
        self.stalled = False

    async def send(self, data: bytes) -> bool:
        """Write ``data``; False once the peer is gone or took nothing in time."""
        if self.stalled:
            return False
        with trio.move_on_after(self._send_timeout):
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
            return True
        self.stalled = True
        return False


@attrs.define(eq=False)
class Exchange:
    """
    One request, as its handler sees it.

    Attributes:
        head: the request head.
        principal: what the route's credential proved (None without one).
        log: the connection's logger.
        detached: the handler took the connection (:meth:`take`) or wrote its own response
            (:meth:`stream`): the server writes nothing more and closes it when it returns.
    """

    _reader: _Reader
    head: RequestHead
    principal: object
    _limits: Limits
    log: Log
    body_read: bool = attrs.field(default=False, init=False)
    detached: bool = attrs.field(default=False, init=False)

    async def body(self, max_bytes: int, *, length_required: bool = False) -> bytes | Response:
        """
        The request body, at most ``max_bytes`` (**413**, before a byte of it is read when its
        ``Content-Length`` says so), ``Content-Length`` or chunked; **400** when malformed or
        cut short, **411** without a length when ``length_required``, **408** when it is not
        all there within ``body_timeout``. A refusal is the handler's to return.
        """
        framing = body_framing(self.head, max_bytes=max_bytes, length_required=length_required)
        if isinstance(framing, Response):
            return framing
        with trio.move_on_after(self._limits.body_timeout):
            if framing != Length(0) and "100-continue" in self.head.tokens("expect"):
                await self._reader.stream.send_all(_CONTINUE)  # (a client that waits for it)
            body = await self._reader.body(framing, max_bytes)
            self.body_read = isinstance(body, bytes)
            return body
        return plain(408, "request body too slow")

    def take(self) -> tuple[trio.abc.Stream, bytes]:
        """The connection, and the bytes already read past the request (a WebSocket client's
        first frames): the handler's from now on; the server closes it when the handler
        returns."""
        self.detached = True
        rest, self._reader.buffer = bytes(self._reader.buffer), bytearray()
        return self._reader.stream, rest

    async def stream(self, response: Response, *, send_timeout: float) -> EventStream | None:
        """Write ``response``'s head (no length: its body ends with the connection) and its
        body so far; return the stream to write the rest on, None when the head could not be
        written."""
        self.detached = True
        events = EventStream(self._reader.stream, send_timeout)
        return events if await events.send(response.render_streamed()) else None

    async def wait_gone(self, max_bytes: int) -> None:
        """Return once the peer closes the connection (or breaks it), or has sent more than
        ``max_bytes`` more bytes (junk, not unboundedly): how a handler notices that nobody
        waits for its answer any more."""
        received = len(self._reader.buffer)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while received <= max_bytes:
                chunk = await self._reader.stream.receive_some(BODY_CHUNK)
                if not chunk:
                    return
                received += len(chunk)


class HttpServer:
    """
    Serves HTTP/1.1 connections for one :class:`~acp_bridge.http.wire.Site`: see the module's
    docstring.

    Args:
        site: the listener's rules and its handlers (replaced as a whole when they change).
        limits: its bounds.
        ssl_context: wrap each connection in TLS with it.
        name: the listener's name in the log.
    """

    def __init__(
        self,
        site: Site[Handler],
        limits: Limits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "http",
    ) -> None:
        self.site = site
        self.limits = limits
        self._ssl = ssl_context
        self._log = logger.bind(listener=name)
        #: pending connections, oldest first
        self._pending: dict[_Place, None] = {}
        self._open = 0
        #: busy answers under way
        self._busy = 0
        self._refused = 0

    def statistics(self) -> ServerStatistics:
        return ServerStatistics(
            connections=self._open, pending=len(self._pending), refused=self._refused
        )

    async def handle_connection(
        self, stream: trio.abc.Stream, *, hosts: Hosts | None = None
    ) -> None:
        """Serve one connection until it ends; always closes ``stream``. ``hosts``: the
        ``Host`` values this connection may name, when not the site's."""
        log = self._log.bind(peer=_peer_of(stream))
        try:
            cap = self.limits.max_connections
            place = self._take_place() if cap is None or self._open < cap else None
            if place is None:
                await self._refuse_busy(stream, log)
                return
            self._open += 1
            try:
                await self._serve(_Reader(stream), place, hosts, log)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("http_connection_lost", error=str(exc))
            finally:
                self._open -= 1
        finally:
            await trio.aclose_forcefully(stream)

    def _take_place(self) -> _Place | None:
        """
        A place among the pending connections (synchronous: taken as it is checked); None
        when all ``max_pending`` are younger than ``evict_age``. Its scope's deadline is the
        head's.
        """
        now = trio.current_time()
        cap = self.limits.max_pending
        if cap is not None and len(self._pending) >= cap:
            oldest = next(iter(self._pending))  # (dicts keep insertion order: oldest first)
            if now - oldest.started < self.limits.evict_age:
                return None
            del self._pending[oldest]
            oldest.evicted = True
            oldest.scope.cancel()
        place = _Place(now, trio.CancelScope(deadline=now + self.limits.head_timeout))
        self._pending[place] = None
        return place

    async def _refuse_busy(self, stream: trio.abc.Stream, log: Log) -> None:
        """``busy`` to a connection past a cap; at most as many such answers at once as the cap
        (each lingers); past that, and under TLS (an answer would cost a TLS handshake first),
        the connection is closed unanswered."""
        cap = self.limits.max_pending or self.limits.max_connections or 0
        if self._ssl is not None or self._busy >= cap:
            log.warning("http_overload", pending=len(self._pending), connections=self._open)
            return
        self._busy += 1
        try:
            await self._finish(stream, self.limits.busy, log)
        finally:
            self._busy -= 1

    async def _serve(
        self, reader: _Reader, place: _Place | None, hosts: Hosts | None, log: Log
    ) -> None:
        handshake = self._ssl is not None
        kept = False  # (a kept connection that goes quiet is a client's pool, not an attack)
        while place is not None:
            got: RequestHead | Response | None = None
            try:
                with place.scope:
                    if handshake:
                        # Not https_compatible: a refusal ends with close_notify, as TLS
                        # clients other than browsers insist on.
                        assert self._ssl is not None
                        tls = trio.SSLStream(reader.stream, self._ssl, server_side=True)
                        await tls.do_handshake()
                        reader.stream, handshake = tls, False
                    got = await reader.head()
            finally:
                self._pending.pop(place, None)
            if place.scope.cancelled_caught:
                event = "http_head_evicted" if place.evicted else "http_head_timeout"
                (log.debug if kept else log.info)(event)
                return
            if got is None:
                log.debug("http_no_request")
                return
            if isinstance(got, Response):
                await self._finish(reader.stream, got, log)
                return
            place = await self._exchange(reader, got, hosts, log)
            kept = True

    async def _exchange(
        self, reader: _Reader, head: RequestHead, hosts: Hosts | None, log: Log
    ) -> _Place | None:
        """One request: judged, handled, answered. The place of the next request on the
        connection, or None: the connection is over."""
        verdict = self.site.judge(head, now=time.time(), hosts=hosts)
        if isinstance(verdict, Response):
            await self._finish(reader.stream, verdict, log, head)
            return None
        exchange = Exchange(reader, head, verdict.principal, self.limits, log)
        response = await verdict.handler(exchange)
        if response is None or exchange.detached:
            return None
        # Another request may follow only when both sides want it and this one was read
        # whole (an unread body would be taken for the next head).
        unread = not exchange.body_read and has_body(head)
        if response.close or not head.keep_alive or unread:
            await self._finish(reader.stream, attrs.evolve(response, close=True), log, head)
            return None
        self._note(response, log, head)
        with trio.move_on_after(self.limits.send_timeout):
            await reader.stream.send_all(response.render())
            return self._take_place()
        return None

    async def _finish(
        self, stream: trio.abc.Stream, response: Response, log: Log, head: RequestHead | None = None
    ) -> None:
        """The last response of a connection, then the linger (within ``send_timeout``)."""
        self._note(response, log, head)
        limits = self.limits
        with trio.move_on_after(limits.send_timeout):
            await send_and_linger(
                stream,
                response.render(),
                seconds=limits.linger_seconds,
                max_bytes=limits.linger_bytes,
            )

    def _note(self, response: Response, log: Log, head: RequestHead | None) -> None:
        method = head.method if head is not None else None
        path = _path_of(head) if head is not None else None
        if response.status >= 400:
            self._refused += 1
            log.info(
                "http_refused", status=response.status, why=response.why, method=method, path=path
            )
        else:
            log.debug("http_answered", status=response.status, method=method, path=path)


async def send_and_linger(
    stream: trio.abc.Stream, data: bytes, *, seconds: float, max_bytes: int
) -> None:
    """
    Write a connection's last response, then linger: a peer that went away is no error.

    Closing a socket with unread input resets the connection, and the reset can destroy the
    response before the peer read it; so our side is ended first, and the rest of the request
    (a large head, a body) is read and dropped for at most ``seconds`` and ``max_bytes``.
    Under TLS the stream ends with a close_notify instead. The caller bounds the write.
    """
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(data)
        if isinstance(stream, trio.SSLStream):
            await stream.aclose()  # close_notify: TLS's own end of data, then the socket
            return
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        with trio.move_on_after(seconds):
            drained = 0
            while drained < max_bytes and (chunk := await stream.receive_some(BODY_CHUNK)):
                drained += len(chunk)


def _path_of(head: RequestHead) -> str:
    """The target's path only: a query may carry a token, and is never logged."""
    return urllib.parse.urlsplit(head.target).path[:200]


def _peer_of(stream: trio.abc.Stream) -> str | None:
    socket_stream = stream
    if isinstance(socket_stream, trio.SSLStream):
        socket_stream = socket_stream.transport_stream
    if isinstance(socket_stream, trio.SocketStream):
        try:
            address = socket_stream.socket.getpeername()
        except OSError:
            return None
        return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
    return None
