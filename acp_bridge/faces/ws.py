"""
The daemon's network face: ACP over WebSocket (``GET /acp``) and over HTTP (``POST``, ``GET``
of server-sent events and ``DELETE`` on ``/acp``, served by ``faces.http_acp``),
``GET /healthz``, ``GET /status``, ``GET /metrics`` and the approval console (``/console``,
served by ``faces.console.py``), one port.

Every TCP connection goes through ``http.server``: TLS and the request head within
``handshake_timeout`` (at most 16 KiB, else **431**), at most ``max_handshakes`` of them under
way (a connection that finds them all taken takes the place of the oldest if that one is
:data:`HANDSHAKE_EVICT_AGE` old: a client trickling in its request head, slowloris, holds a
place for a second, not for the deadline; else it is answered 503, at most ``max_handshakes``
such answers at once, and under TLS none: past that it is closed unanswered). The request is
then judged by the listener's rules (``faces.listener_core``: ``Host``, path, method, the
upgrade's form, ``Origin``, token) before anything else happens; a refusal is a tiny HTTP
response written before any session data exists. The listener that hands connections here is
``faces.serve.py``.

An accepted upgrade is answered with **101** and an ``Acp-Connection-Id`` header (unless
``max_connections`` ACP connections, WebSocket and HTTP together, are open: 503), and the
bridge then reads and writes the WebSocket frames itself (``faces.ws_frames.py`` parses them):
the task that handles a client's messages reads the socket (at once when data is there, as the
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
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Final

import attrs
import structlog
import trio

from acp_bridge.faces import ws_frames as frames
from acp_bridge.faces.console import Console
from acp_bridge.faces.handshake import TOO_MANY, is_initialize
from acp_bridge.faces.http_acp import HttpAcp, HttpAcpStatistics
from acp_bridge.faces.listener_core import BUSY, ConnectionSlots, ListenerPolicy, listener_site
from acp_bridge.faces.status import METRICS_CONTENT_TYPE, render_metrics
from acp_bridge.faces.v2 import V2Gate
from acp_bridge.faces.ws_conn import Closed as _Closed
from acp_bridge.faces.ws_conn import Frames as _Frames
from acp_bridge.faces.ws_conn import ReplayStream as _ReplayStream
from acp_bridge.http.server import HttpServer, Limits
from acp_bridge.http.wire import Response

if TYPE_CHECKING:
    import ssl

    from acp_bridge.config.model import WebSocketConfig
    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.engine.links import ClientLink
    from acp_bridge.http.server import Exchange

__all__ = [
    "CLOSE_TIMEOUT",
    "HANDSHAKE_EVICT_AGE",
    "WebSocketFace",
    "WebSocketStatistics",
]

logger = structlog.get_logger("acp_bridge.ws")

#: A handshake this old (seconds) gives its place to a new connection when ``max_handshakes``
#: are under way: a client that has not sent its request head by then trickles it in.
HANDSHAKE_EVICT_AGE: Final = 1.0
#: Seconds a closing handshake may take before the TCP connection is simply closed.
CLOSE_TIMEOUT: Final = 2.0


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


@attrs.frozen
class WebSocketStatistics:
    """
    Attributes:
        connections: WebSocket connections open.
        handshakes: connections still in their HTTP/TLS handshake.
        accepted: WebSocket connections accepted since start.
        refused: requests answered with an HTTP error since start.
        http: the ACP connections over HTTP.
    """

    connections: int
    handshakes: int
    accepted: int
    refused: int
    http: HttpAcpStatistics


class WebSocketFace:
    """
    Serves TCP connections (or any stream) for one bridge: the listener's endpoints, and ACP
    over WebSocket.

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
        tls = ssl_context is not None
        self.policy = ListenerPolicy.build(settings, token=token, port=port, tls=tls)
        self._connections: set[str] = set()
        self._accepted = 0
        #: ACP connections open, WebSocket and HTTP together
        self._slots = ConnectionSlots(settings.max_connections)
        #: ACP over HTTP on the same path
        self.http_acp = HttpAcp(
            bridge,
            settings,
            self._slots,
            cookie=HttpAcp.affinity_cookie(port, settings.path, tls=tls),
        )
        #: the approval console on this listener
        self.console = Console(
            bridge,
            self.policy,
            tls=tls,
            send_timeout=settings.ping_timeout,
        )
        handlers = {
            "acp": self._acp_get,
            "acp.post": self.http_acp.post,
            "acp.delete": self.http_acp.delete,
            "health": self._health,
            "status": self._status,
            "metrics": self._metrics,
            **self.console.handlers(),
        }
        # Every step before the upgrade is bounded by handshake_timeout: the head, a console
        # answer's body, a response and its linger.
        timeout = settings.handshake_timeout
        limits = Limits(
            head_timeout=timeout,
            body_timeout=timeout,
            send_timeout=timeout,
            max_pending=settings.max_handshakes,
            evict_age=HANDSHAKE_EVICT_AGE,
            busy=BUSY,
        )
        site = listener_site(self.policy, self.console.keys, handlers)
        self.http = HttpServer(site, limits, ssl_context=ssl_context, name="ws")

    def statistics(self) -> WebSocketStatistics:
        http = self.http.statistics()
        return WebSocketStatistics(
            connections=len(self._connections),
            handshakes=http.pending,
            accepted=self._accepted,
            refused=http.refused,
            http=self.http_acp.statistics(),
        )

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """
        Serve one connection until it ends; always closes ``stream``.

        Cancellation: a cancelled WebSocket connection is closed with 1001 (going away): a
        frame being written is finished first (within ``ping_timeout``), then the closing
        handshake gets :data:`CLOSE_TIMEOUT` seconds.
        """
        await self.http.handle_connection(stream)

    # ------------------------------------------------------------------ the plain endpoints

    async def _health(self, exchange: Exchange) -> Response:
        ok, data = self._bridge.health()
        body = json.dumps(data, separators=(",", ":")).encode() + b"\n"
        return Response(200 if ok else 503, body, content_type="application/json")

    async def _status(self, exchange: Exchange) -> Response:
        body = json.dumps(self._bridge.status(), separators=(",", ":")).encode() + b"\n"
        return Response(200, body, content_type="application/json")

    async def _metrics(self, exchange: Exchange) -> Response:
        body = render_metrics(self._bridge.status()).encode()
        return Response(200, body, content_type=METRICS_CONTENT_TYPE)

    # ------------------------------------------------------------------ WebSocket

    async def _acp_get(self, exchange: Exchange) -> Response | None:
        """A GET of the ACP path: a WebSocket upgrade, or a stream of server-sent events (the
        listener checked which, and its form)."""
        if exchange.head.values("upgrade"):
            return await self._upgrade(exchange)
        return await self.http_acp.events(exchange)

    async def _upgrade(self, exchange: Exchange) -> Response | None:
        """Accept the upgrade (the listener checked it), then serve the connection."""
        if not self._slots.take():  # taken now: the cap counts handshakes being accepted
            return TOO_MANY
        conn_id = str(uuid.uuid4())
        self._connections.add(conn_id)
        try:
            # (What the client sent after the head, frames already, is read first.)
            stream, rest = exchange.take()
            replay = _ReplayStream(stream, rest, send_timeout=self._settings.ping_timeout)
            (key,) = exchange.head.values("sec-websocket-key")  # (checked: there is one)
            try:
                await replay.send_all(frames.accept_response(key, [("Acp-Connection-Id", conn_id)]))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                exchange.log.debug("ws_accept_failed")
                return None
            self._accepted += 1
            await self._serve(_Frames(replay, self._settings.max_message_bytes), conn_id)
        finally:
            self._connections.discard(conn_id)
            self._slots.give()
        return None

    async def _serve(self, ws: _Frames, conn_id: str) -> None:
        """One ACP client over one WebSocket, until either side ends it."""
        log = logger.bind(connection_id=conn_id)
        log.info("ws_connected", connections=len(self._connections))
        client = self._bridge.open_client(f"ws:{conn_id[:8]}", blocking=False, transport="ws")
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
