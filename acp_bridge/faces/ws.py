"""
The daemon's network face: ACP over WebSocket (``GET /acp``), ``GET /healthz`` and the
approval console (``/console``, served by ``faces.console.py``), one port.

Every TCP connection is read up to the end of its HTTP request head (h11; at most
:data:`MAX_HEAD_BYTES`, 16 KiB, else **431**; within ``handshake_timeout``, TLS included) and
judged by the pure :func:`~acp_bridge.faces.handshake.judge` before anything else happens (the
order of its checks, Host, path, upgrade, Origin, token and the connection cap, is told in
``faces.handshake.py``); a refusal is a tiny HTTP response written before any session data exists.
The listener that hands connections here is ``faces.serve.py``.

An accepted request is answered with **101** and an ``Acp-Connection-Id`` header, and the
bridge then reads and writes the WebSocket frames itself (``faces.ws_frames.py`` parses them): the
task that handles a client's messages reads the socket (at once when data is there, as the
pipes are read) and hands each message on with no task or channel between. Each WebSocket
connection is one ACP client of the bridge (:meth:`Bridge.open_client`, non-blocking): the
first message must be ``initialize`` (else close 1002), each text message is one JSON-RPC
message, binary messages are ignored. Pings are answered, pongs settle our keepalive pings, a
client's close frame is answered. A frame the parser refuses (invalid UTF-8, unmasked, an
unknown opcode, ...) ends the connection with a close frame, 1007 or 1002, and the TCP
connection is closed at once.

Backpressure:
    Inbound, the bridge reads a connection only when it has handled every message already
    read; it holds at most one message (``max_message_bytes``) and one read (64 KiB) beyond
    the message being handled. A client that sends faster than the bridge takes is slowed
    down by TCP. A message over ``max_message_bytes`` bytes of payload closes the connection
    with 1009 as soon as a frame header announces it (the payload is never buffered).
    Outbound, the bridge queues at most ``bridge.client_queue`` messages for a connection;
    when that queue overflows the bridge closes the link and the connection is closed with
    1008 (a reconnecting client gets its sessions back). A client that does not take a frame
    we send within ``ping_timeout`` seconds is cut off without a close frame: there is no
    way to deliver one to a peer that does not read. The writer frames what is queued
    itself and sends a burst in one write (:func:`~acp_bridge.faces.handshake.text_frames`),
    serialised with the control frames; nothing follows the close frame.

Resource handling:
    At most ``max_connections`` WebSocket connections (then 503) and, apart from them,
    ``max_handshakes`` handshakes under way, each closed at ``handshake_timeout``. A
    connection that finds the handshakes all taken takes the place of the oldest if that one
    is :data:`HANDSHAKE_EVICT_AGE` old (a client trickling in its request head, slowloris,
    holds a place for a second, not for the deadline), else it is answered 503; at most
    ``max_handshakes`` such answers at once (and under TLS, none): past that it is closed
    unanswered.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
import uuid
from typing import TYPE_CHECKING, Final

import attrs
import h11
import structlog
import trio

from acp_bridge.faces import ws_frames as frames
from acp_bridge.faces.console import Console as ConsoleService
from acp_bridge.faces.console import LiveStream
from acp_bridge.faces.handshake import (
    BUSY,
    Console,
    HandshakePolicy,
    Health,
    Refuse,
    Report,
    RequestHead,
    is_initialize,
    judge,
    render_response,
)
from acp_bridge.faces.status import METRICS_CONTENT_TYPE, render_metrics
from acp_bridge.faces.v2 import V2Gate
from acp_bridge.faces.ws_conn import Closed as _Closed
from acp_bridge.faces.ws_conn import Frames as _Frames
from acp_bridge.faces.ws_conn import ReplayStream as _ReplayStream

if TYPE_CHECKING:
    import ssl

    from structlog.typing import FilteringBoundLogger as Log

    from acp_bridge.config.model import WebSocketConfig
    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.engine.links import ClientLink

__all__ = [
    "CLOSE_TIMEOUT",
    "HANDSHAKE_EVICT_AGE",
    "MAX_HEAD_BYTES",
    "WebSocketFace",
    "WebSocketStatistics",
]

logger = structlog.get_logger("acp_bridge.ws")

#: The largest HTTP request head accepted (request line plus headers).
MAX_HEAD_BYTES: Final = 16 * 1024
#: A handshake this old (seconds) gives its place to a new connection when ``max_handshakes``
#: are under way: a client that has not sent its request head by then trickles it in.
HANDSHAKE_EVICT_AGE: Final = 1.0
#: Seconds a closing handshake may take before the TCP connection is simply closed.
CLOSE_TIMEOUT: Final = 2.0
#: After an HTTP error response: how long, and how much, of the rest of the request is read.
LINGER_SECONDS: Final = 1.0
LINGER_BYTES: Final = 64 * 1024
_READ_CHUNK: Final = 4096


@attrs.define
class _Ending:
    """Why a connection ends: the first task to decide wins, and ends the others."""

    scope: trio.CancelScope
    code: int = 1001
    reason: str = "server shutting down"
    decided: bool = False

    def decide(self, code: int, reason: str) -> None:
        if not self.decided:
            self.decided = True
            self.code, self.reason = code, reason
        self.scope.cancel()


class _LinkClosed(Exception):
    pass


@attrs.define
class _Idle:
    """
    A connection's idle timer (``idle_timeout``): one task that sleeps until the reader has
    waited ``timeout`` seconds for a message, rather than a timeout entered and left around
    every read (a cancel scope per message, on a round trip's path).
    """

    timeout: float
    #: when the reader began waiting for the next message; None while it handles one
    since: float | None = None

    async def watch(self, ending: _Ending) -> None:
        """End the connection (1000 "idle") once the reader waited ``timeout`` seconds."""
        while True:
            since, now = self.since, trio.current_time()
            if since is None:  # (handling a message: no timeout; looked at again later)
                await trio.sleep_until(now + self.timeout)
            elif now < since + self.timeout:
                await trio.sleep_until(since + self.timeout)
            else:
                ending.decide(1000, "idle")
                return


@attrs.define(eq=False)
class _Handshake:
    """One connection's place among the handshakes under way (see ``max_handshakes``)."""

    started: float
    #: its deadline is ``handshake_timeout``; cancelled early when the place is taken
    scope: trio.CancelScope
    evicted: bool = False


@attrs.frozen
class WebSocketStatistics:
    """
    Attributes:
        connections: WebSocket connections open.
        handshakes: connections still in their HTTP/TLS handshake.
        accepted: WebSocket connections accepted since start.
        refused: requests answered with an HTTP error since start.
    """

    connections: int
    handshakes: int
    accepted: int
    refused: int


class WebSocketFace:
    """
    Serves TCP connections (or any stream) for one bridge: handshake, then ACP over WebSocket.

    Args:
        bridge: the running bridge whose client each connection becomes.
        settings: the ``[websocket]`` table.
        token: the bearer token.
        port: the listening port (``Host`` must carry it).
        ssl_context: wrap each connection in TLS with it.
    """

    def __init__(
        self,
        bridge: Bridge,
        settings: WebSocketConfig,
        *,
        token: bytes,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._bridge = bridge
        self._settings = settings
        self._ssl = ssl_context
        self.policy = HandshakePolicy.build(
            settings, token=token, port=port, tls=ssl_context is not None
        )
        self._connections: set[str] = set()
        #: handshakes under way, oldest first
        self._pending: dict[_Handshake, None] = {}
        #: 503 answers to connections that found no handshake place, under way
        self._busy = 0
        self._accepted = 0
        self._refused = 0
        #: the approval console on this listener
        self.console = ConsoleService(
            bridge.approvals,
            bridge.hub.audit,
            self.policy,
            tls=ssl_context is not None,
            send_timeout=settings.ping_timeout,
        )

    def statistics(self) -> WebSocketStatistics:
        return WebSocketStatistics(
            connections=len(self._connections),
            handshakes=len(self._pending),
            accepted=self._accepted,
            refused=self._refused,
        )

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """
        Serve one connection until it ends; always closes ``stream``.

        Cancellation: a cancelled connection is closed with 1001 (going away): a frame being
        written is finished first (within ``ping_timeout``), then the closing handshake gets
        :data:`CLOSE_TIMEOUT` seconds.
        """
        log = logger.bind(peer=_peer_of(stream))
        try:
            slot = self._handshake_slot()
            if slot is None:
                await self._refuse_busy(stream, log)
                return
            try:
                await self._handle(stream, log, slot)
            finally:
                self._pending.pop(slot, None)
        finally:
            await trio.aclose_forcefully(stream)

    def _handshake_slot(self) -> _Handshake | None:
        """
        A place among the handshakes under way (synchronous: taken as it is checked); None
        when all ``max_handshakes`` are younger than :data:`HANDSHAKE_EVICT_AGE`.

        A handshake that old is cut off to make room: a client trickling in its request head
        (slowloris) holds a place for a second, not for ``handshake_timeout``.
        """
        now = trio.current_time()
        if len(self._pending) >= self._settings.max_handshakes:
            oldest = next(iter(self._pending))  # (dicts keep insertion order: oldest first)
            if now - oldest.started < HANDSHAKE_EVICT_AGE:
                return None
            del self._pending[oldest]
            oldest.evicted = True
            oldest.scope.cancel()
        slot = _Handshake(now, trio.CancelScope(deadline=now + self._settings.handshake_timeout))
        self._pending[slot] = None
        return slot

    async def _refuse_busy(self, stream: trio.abc.Stream, log: Log) -> None:
        """
        503 to a connection that found every handshake place taken by a young handshake.

        At most ``max_handshakes`` such answers are under way (each lingers up to
        :data:`LINGER_SECONDS`); past that, and under TLS (an answer would cost a TLS
        handshake first), the connection is closed unanswered.
        """
        if self._ssl is not None or self._busy >= self._settings.max_handshakes:
            log.warning("ws_handshake_overload", handshakes=len(self._pending))
            return
        self._busy += 1
        try:
            await self._refuse(stream, BUSY, log)
        finally:
            self._busy -= 1

    async def _handle(self, raw: trio.abc.Stream, log: Log, slot: _Handshake) -> None:
        accepted = None
        try:
            with slot.scope:
                accepted = await self._handshake(raw, log)
            if slot.scope.cancelled_caught:
                log.info("ws_handshake_evicted" if slot.evicted else "ws_handshake_timeout")
        finally:
            self._pending.pop(slot, None)
        if accepted is None:
            return
        if isinstance(accepted, LiveStream):
            await accepted.run()  # a console page's live channel: no handshake place held
            return
        ws, conn_id = accepted
        try:
            await self._serve(ws, conn_id)
        finally:
            self._connections.discard(conn_id)

    async def _handshake(
        self, raw: trio.abc.Stream, log: Log
    ) -> tuple[_Frames, str] | LiveStream | None:
        stream: trio.abc.Stream = raw
        try:
            if self._ssl is not None:
                # Not https_compatible: a refusal ends with close_notify, as TLS clients
                # other than browsers insist on.
                tls = trio.SSLStream(raw, self._ssl, server_side=True)
                await tls.do_handshake()
                stream = tls
            read = await _read_head(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("ws_handshake_broken", error=str(exc))
            return None
        if read is None:
            log.debug("ws_no_request")
            return None
        if isinstance(read, Refuse):
            await self._refuse(stream, read, log)
            return None
        head, received, rest = read
        verdict = judge(head, self.policy, connections=len(self._connections))
        if isinstance(verdict, Refuse):
            await self._refuse(stream, verdict, log, method=head.method, path=_path_of(head))
            return None
        if isinstance(verdict, Health):
            await self._health(stream, log)
            return None
        if isinstance(verdict, Report):
            await self._report(stream, verdict, log)
            return None
        if isinstance(verdict, Console):
            answer = await self.console.respond(stream, head, received)
            if isinstance(answer, Refuse):
                await self._refuse(stream, answer, log, method=head.method, path=_path_of(head))
            elif isinstance(answer, bytes):
                log.debug("console_served", method=head.method, path=_path_of(head))
                await _send_quietly(stream, answer)
            else:
                return answer
            return None
        conn_id = str(uuid.uuid4())
        self._connections.add(conn_id)  # taken now: the cap counts handshakes being accepted
        # (What the client sent after the head, frames already, is read first.)
        replay = _ReplayStream(stream, rest, send_timeout=self._settings.ping_timeout)
        (key,) = head.values("sec-websocket-key")  # (the judge checked there is one)
        try:
            await replay.send_all(frames.accept_response(key, [("Acp-Connection-Id", conn_id)]))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._connections.discard(conn_id)
            log.debug("ws_accept_failed")
            return None
        except BaseException:
            self._connections.discard(conn_id)
            raise
        self._accepted += 1
        return _Frames(replay, self._settings.max_message_bytes), conn_id

    async def _refuse(
        self,
        stream: trio.abc.Stream,
        refusal: Refuse,
        log: Log,
        *,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        self._refused += 1
        log.info("ws_refused", status=refusal.status, why=refusal.why, method=method, path=path)
        body = (refusal.why + "\n").encode()
        response = render_response(
            refusal.status, body, content_type="text/plain; charset=utf-8", headers=refusal.headers
        )
        await _send_quietly(stream, response)

    async def _health(self, stream: trio.abc.Stream, log: Log) -> None:
        ok, data = self._bridge.health()
        log.debug("ws_health", ok=ok)
        body = json.dumps(data, separators=(",", ":")).encode() + b"\n"
        await _send_quietly(
            stream, render_response(200 if ok else 503, body, content_type="application/json")
        )

    async def _report(self, stream: trio.abc.Stream, report: Report, log: Log) -> None:
        status = self._bridge.status()
        log.debug("ws_report", what=report.what)
        if report.what == "metrics":
            body, content_type = render_metrics(status).encode(), METRICS_CONTENT_TYPE
        else:
            body = json.dumps(status, separators=(",", ":")).encode() + b"\n"
            content_type = "application/json"
        await _send_quietly(stream, render_response(200, body, content_type=content_type))

    async def _serve(self, ws: _Frames, conn_id: str) -> None:
        """One ACP client over one WebSocket, until either side ends it."""
        log = logger.bind(connection_id=conn_id)
        log.info("ws_connected", connections=len(self._connections))
        client = self._bridge.open_client(f"ws:{conn_id[:8]}", blocking=False)
        ending = _Ending(trio.CancelScope())
        handle = self._bridge.handle_client_line
        gate = V2Gate(client, handle) if self._bridge.hub.config.bridge.experimental_v2 else None
        idle = _Idle(self._settings.idle_timeout) if self._settings.idle_timeout > 0 else None
        try:
            with ending.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer, ws, client, ending, gate)
                    if self._settings.ping_interval > 0:
                        nursery.start_soon(self._keepalive, ws, ending)
                    if gate is not None:
                        nursery.start_soon(gate.feed)
                    if idle is not None:
                        nursery.start_soon(idle.watch, ending)
                    await self._reader(ws, client, ending, gate, idle)
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await self._bridge.close_client(client, ending.reason)
                if ending.code not in (1005, 1006):  # codes that are never sent
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await ws.close(ending.code, _truncated(ending.reason))
            log.info("ws_closed", code=ending.code, reason=ending.reason)

    async def _reader(
        self,
        ws: _Frames,
        client: ClientLink,
        ending: _Ending,
        gate: V2Gate | None = None,
        idle: _Idle | None = None,
    ) -> None:
        handle = self._bridge.handle_client_line if gate is None else gate.line
        first = True
        while True:
            if idle is not None:
                idle.since = trio.current_time()
            try:
                message = await ws.next_message()
            except _Closed as exc:
                ending.decide(exc.code, exc.reason)
                return
            if idle is not None:
                idle.since = None
            if message is None:
                continue  # the transport RFD: binary messages are ignored
            if first:
                if not is_initialize(message.decode()):
                    ending.decide(1002, "the first message must be initialize")
                    return
                first = False
            await handle(client, message)
            if client.closed:
                ending.decide(1008, client.close_reason or "closed by the bridge")
                return

    async def _writer(
        self, ws: _Frames, client: ClientLink, ending: _Ending, gate: V2Gate | None = None
    ) -> None:
        replay = ws.replay

        async def send(batch: list[bytes]) -> None:
            if client.closed:  # the link overflowed: what is still queued is not sent
                raise _LinkClosed
            if gate is not None and not (batch := gate.outbound(batch)):
                return
            # Many frames in one write: one system call (and one TCP segment, mostly) for a
            # burst, instead of one per message.
            if ws.closed is not None or not await replay.send_messages(batch):
                raise _Closed(*(ws.closed or (1006, "connection lost")))

        try:
            # An answer to an idle client is written by the task that has it (no switch to
            # this one): over plain TCP, and not through the v2 gate (it rewrites batches).
            await client.pump_batches(send, ws.offer if gate is None else None)
        except _LinkClosed:
            pass
        except _Closed as exc:
            ending.decide(exc.code, exc.reason)
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            ending.decide(1006, "client stopped reading" if replay.stalled else "connection lost")
            return
        ending.decide(1008, client.close_reason or "closed by the bridge")

    async def _keepalive(self, ws: _Frames, ending: _Ending) -> None:
        interval, timeout = self._settings.ping_interval, self._settings.ping_timeout
        while True:
            await trio.sleep(interval)
            with trio.move_on_after(timeout) as scope:
                try:
                    await ws.ping()
                except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # the reader sees it too, and says why
            if scope.cancelled_caught:
                ending.decide(1011, f"keepalive: no pong within {timeout:g}s")
                return


def _truncated(reason: str) -> str:
    """A close reason fits in 123 bytes of UTF-8."""
    return reason.encode()[:120].decode("utf-8", "ignore")


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


def _path_of(head: RequestHead) -> str:
    """The target's path only: a query may carry the token, and is never logged."""
    return urllib.parse.urlsplit(head.target).path[:200]


def _request_head(event: h11.Request) -> RequestHead:
    return RequestHead(
        method=event.method.decode("ascii", "replace"),
        target=event.target.decode("latin-1"),
        http_version=event.http_version.decode("ascii", "replace"),
        headers=tuple(
            (name.decode("latin-1").lower(), value.decode("latin-1"))
            for name, value in event.headers
        ),
    )


async def _read_head(
    stream: trio.abc.Stream,
) -> tuple[RequestHead, bytes, bytes] | Refuse | None:
    """
    Read up to the end of an HTTP request head: the head, every byte read (to replay), and
    the bytes read past the head (a WebSocket client's first frames).

    Returns None at EOF before a whole head, a :class:`Refuse` for a malformed one (400) or
    one over :data:`MAX_HEAD_BYTES` (431).
    """
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    received = bytearray()
    while True:
        try:
            event = parser.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            return Refuse(status, "request head too large" if status == 431 else "bad request")
        if event is h11.NEED_DATA:
            # Read no further than the cap: h11 checks its limit only between reads, so a
            # last read of a whole chunk would let a head grow past it.
            room = MAX_HEAD_BYTES - len(received)
            if room <= 0:
                return Refuse(431, "request head too large")
            data = bytes(await stream.receive_some(min(_READ_CHUNK, room)))
            if not data:
                return None
            received += data
            parser.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            return _request_head(event), bytes(received), parser.trailing_data[0]
        return None


async def _send_quietly(stream: trio.abc.Stream, data: bytes) -> None:
    """
    Write a refusal or a health answer, then linger: a peer that went away is no error.

    Closing a socket with unread input resets the connection, and the reset can destroy the
    response before the peer read it; so the rest of the request (a large head, a body) is
    read and dropped first, for at most :data:`LINGER_SECONDS` and :data:`LINGER_BYTES`.
    Under TLS the stream ends with a close_notify instead.
    """
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(data)
        if isinstance(stream, trio.SSLStream):
            await stream.aclose()  # close_notify: TLS's own end of data, then the socket
            return
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        with trio.move_on_after(LINGER_SECONDS):
            drained = 0
            while drained < LINGER_BYTES and (chunk := await stream.receive_some(_READ_CHUNK)):
                drained += len(chunk)
