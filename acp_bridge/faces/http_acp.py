"""
ACP over Streamable HTTP on ``serve``'s ACP path, beside the WebSocket upgrade: the handlers
of ``POST``, ``GET`` (server-sent events) and ``DELETE`` on the shared HTTP layer
(``http.server``), and each HTTP connection's life. ``faces.http_acp_core`` decides what is
asked and where each message goes; this waits and writes.

An HTTP connection is one ACP client of the bridge (:meth:`Bridge.open_client`, as a
WebSocket connection is), opened by a POSTed ``initialize`` and living until ``DELETE``, its
client stops reading, nothing reads it for ``http_stream_timeout`` seconds, nothing is
POSTed for ``idle_timeout`` seconds, or the daemon stops; then its sessions detach, as a
WebSocket connection's do. It is no TCP connection: each POST and each stream is a request
of its own (HTTP/1.1; a stream holds its TCP connection).

Tasks: one per connection (in the bridge's nursery) takes the bridge's messages for it
(:meth:`ClientLink.pump_batches`) and puts each on its stream; each stream's GET handler
writes its events, and a keepalive comment every ``ping_interval`` seconds when it has none.
POSTs of one connection reach the bridge one at a time, in the order they came.

Backpressure: the connection takes the bridge's messages while what waits for its streams
is under ``http_buffer_bytes``; past that it stops, the link's queue fills, and the link
closes after its overflow wait: the connection ends ("client is not reading"), its sessions
detach. A stream that takes nothing for ``ping_timeout`` seconds loses its reader (its
events are kept for a resumption).
"""

from __future__ import annotations

import secrets
import uuid
from typing import TYPE_CHECKING, Final

import attrs
import structlog
import trio

from acp_bridge.faces.handshake import TOO_MANY
from acp_bridge.faces.http_acp_core import (
    CONNECTION_HEADER,
    KEEPALIVE,
    Captured,
    Connection,
    Limits,
    Owner,
    Posted,
    Table,
    judge_delete,
    judge_get,
    judge_post,
    session_refusal,
)
from acp_bridge.http.wire import Response, plain
from acp_bridge.protocol.jsonrpc import JsonRpcError, loads
from acp_bridge.sessions import transitions

if TYPE_CHECKING:
    from acp_bridge.config.model import WebSocketConfig
    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.engine.links import ClientLink
    from acp_bridge.faces.http_acp_core import StreamKey
    from acp_bridge.faces.listener_core import ConnectionSlots
    from acp_bridge.http.server import EventStream, Exchange

__all__ = ["HttpAcp", "HttpAcpStatistics"]

logger = structlog.get_logger("acp_bridge.http_acp")

#: Bytes of events one write of a stream takes at most.
WRITE_BATCH: Final = 64 * 1024
#: Seconds the end of a connection (its sessions detached) may take.
CLOSE_TIMEOUT: Final = 2.0
_ACCEPTED: Final = Response(202, close=False)
_STREAM_HEAD: Final = Response(
    200, content_type="text/event-stream", headers=(("X-Accel-Buffering", "no"),)
)
_STOPPING: Final = plain(503, "unavailable: the daemon is stopping")


@attrs.frozen
class HttpAcpStatistics:
    """
    Attributes:
        connections: HTTP connections open.
        streams: streams with a reader now.
        accepted: HTTP connections opened since start.
    """

    connections: int
    streams: int
    accepted: int


@attrs.define(eq=False)
class _Live:
    """One HTTP connection: its decisions (``core``), its link, and what its tasks wait on."""

    core: Connection
    client: ClientLink
    #: its task's scope: cancelled to end the connection
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: POSTs reach the bridge one at a time, in order
    lock: trio.StrictFIFOLock = attrs.field(factory=trio.StrictFIFOLock)
    #: each stream's reader waits here for events
    lots: dict[StreamKey, trio.lowlevel.ParkingLot] = attrs.field(factory=dict)
    #: the task putting messages on the streams waits here for room
    room: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    #: the initialize answer came, or the connection ended first
    answered: trio.Event = attrs.field(factory=trio.Event)
    answer: bytes | None = None
    reason: str = "connection ended"
    ending: bool = False
    #: when the client last POSTed (the idle deadline is looked at again when it falls)
    active: float = 0.0
    #: set once it ended and its sessions are detached
    closed: trio.Event = attrs.field(factory=trio.Event)

    def lot(self, key: StreamKey) -> trio.lowlevel.ParkingLot:
        lot = self.lots.get(key)
        if lot is None:
            lot = self.lots[key] = trio.lowlevel.ParkingLot()
        return lot

    def wake(self) -> None:
        """Every reader and the router look again (an event came, or some were handed out)."""
        for lot in self.lots.values():
            lot.unpark_all()
        self.room.unpark_all()

    def end(self, reason: str) -> None:
        if not self.ending:
            self.ending = True
            self.reason = reason
        self.scope.cancel()


class HttpAcp:
    """
    The HTTP half of the ACP path.

    Args:
        bridge: the running bridge whose client each connection becomes.
        settings: the ``[websocket]`` table (the listener's).
        slots: the ACP connections open, shared with the WebSocket half.
        cookie: the affinity cookie set on every new connection (``name=value``).
    """

    def __init__(
        self, bridge: Bridge, settings: WebSocketConfig, slots: ConnectionSlots, *, cookie: str
    ) -> None:
        self._bridge = bridge
        self._settings = settings
        self._slots = slots
        self._cookie = cookie
        self._limits = Limits(
            max_streams=settings.http_max_streams,
            buffer_bytes=settings.http_buffer_bytes,
            retention_bytes=settings.http_retention_bytes,
        )
        self._table: Table[_Live] = Table()
        self._by_client: dict[ClientLink, _Live] = {}
        self._accepted = 0

    def statistics(self) -> HttpAcpStatistics:
        return HttpAcpStatistics(
            connections=len(self._table),
            streams=sum(live.core.readers for live in self._table.live.values()),
            accepted=self._accepted,
        )

    @staticmethod
    def affinity_cookie(port: int, path: str, *, tls: bool) -> str:
        """The ``Set-Cookie`` value naming this daemon's run, for a balancer's sticky routing."""
        secure = "; Secure" if tls else ""
        return (
            f"acp_bridge_{port}={secrets.token_urlsafe(12)}; Path={path}; HttpOnly; "
            f"SameSite=Strict{secure}"
        )

    # ------------------------------------------------------------------ POST

    async def post(self, exchange: Exchange) -> Response:
        """One client message: ``initialize`` opens a connection (200), the rest 202."""
        body = await exchange.body(self._bridge.hub.config.bridge.max_line_bytes)
        if isinstance(body, Response):
            return body
        posted = judge_post(exchange.head, body)
        if isinstance(posted, Response):
            return posted
        if posted.connection_id is None:
            return await self._open(exchange, posted)
        live = self._table.find(posted.connection_id)
        if isinstance(live, Response):
            return live
        owner = self._owner(posted.session, live) if posted.session is not None else Owner.THIS
        refusal = session_refusal(posted, owner)
        if refusal is not None:
            return refusal
        async with live.lock:
            if live.ending:
                return plain(410, f"gone: this connection ended ({live.reason[:120]})")
            live.core.note_request(posted)
            live.active = trio.current_time()
            await self._bridge.handle_client_line(live.client, posted.line)
        return _ACCEPTED

    async def _open(self, exchange: Exchange, posted: Posted) -> Response:
        """``initialize``: a new connection, answered with the bridge's answer."""
        if not self._slots.take():
            return TOO_MANY
        connection_id = str(uuid.uuid4())
        client = self._bridge.open_client(
            f"http:{connection_id[:8]}", blocking=False, transport="http"
        )
        live = _Live(Connection(connection_id, self._limits, initialize=posted.msg["id"]), client)
        self._table.add(connection_id, live)
        self._by_client[client] = live
        try:
            self._bridge.hub.spawn(self._serve, live)
        except JsonRpcError:
            self._table.end(connection_id, "the daemon is stopping")
            self._by_client.pop(client, None)
            self._slots.give()
            self._bridge.hub.clients.discard(client)
            return _STOPPING
        async with live.lock:
            await self._bridge.handle_client_line(client, posted.line)
        await live.answered.wait()
        if live.answer is None:
            return plain(503, f"unavailable: the connection ended ({live.reason[:120]})")
        answer = live.answer.rstrip(b"\n")
        if "error" in loads(answer):
            # A connection whose initialize failed is of no use: it ends, the error is told.
            live.end("initialize failed")
            return Response(500, answer, content_type="application/json")
        # Every update an HTTP client gets carries its number: its stream's event ids.
        client.want_seq = True
        self._accepted += 1
        self._unread(live)
        live.active = trio.current_time()
        self._idle_after(live, self._settings.idle_timeout)
        exchange.log.info("http_acp_connected", connection_id=connection_id)
        return Response(
            200,
            answer,
            headers=((CONNECTION_HEADER, connection_id), ("Set-Cookie", self._cookie)),
            content_type="application/json",
            close=False,
        )

    # ------------------------------------------------------------------ DELETE

    async def delete(self, exchange: Exchange) -> Response:
        """End a connection (202 once its sessions are detached)."""
        connection_id = judge_delete(exchange.head)
        if isinstance(connection_id, Response):
            return connection_id
        live = self._table.find(connection_id)
        if isinstance(live, Response):
            return live
        live.end("closed by the client (DELETE)")
        with trio.move_on_after(2 * CLOSE_TIMEOUT):
            await live.closed.wait()
        return _ACCEPTED

    # ------------------------------------------------------------------ GET: a stream

    async def events(self, exchange: Exchange) -> Response | None:
        """A stream of server-sent events: the connection's, or one session's."""
        ask = judge_get(exchange.head)
        if isinstance(ask, Response):
            return ask
        live = self._table.find(ask.connection_id)
        if isinstance(live, Response):
            return live
        key = ask.session
        generation = live.core.attach(key, ask.after)
        if isinstance(generation, Response):
            if key is None and generation.status == 410:
                live.end("its stream could not be resumed")
            return generation
        self._bridge.hub.deadlines.cancel(("http-unread", live.core.id))
        try:
            events = await exchange.stream(_STREAM_HEAD, send_timeout=self._settings.ping_timeout)
            if events is not None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_until_gone, exchange, nursery.cancel_scope)
                    await self._write(live, key, generation, events)
                    nursery.cancel_scope.cancel()
        finally:
            live.core.release(key, generation)
            live.wake()
            if not live.core.readers and not live.ending:
                self._unread(live)
        return None

    async def _write(
        self, live: _Live, key: StreamKey, generation: int, events: EventStream
    ) -> None:
        """Write the stream's events as they come, until its reader is replaced or gone."""
        lot = live.lot(key)
        interval = self._settings.ping_interval or float("inf")
        core = live.core
        while not live.ending:
            batch = core.take(key, generation, WRITE_BATCH)
            if batch is None:
                return  # a newer reader took the stream
            if batch:
                live.wake()  # (room for the router; another stream may wait on these)
                if not await events.send(b"".join(batch)):
                    return
                continue
            with trio.move_on_after(interval) as quiet:
                await lot.park()
            if quiet.cancelled_caught and not await events.send(KEEPALIVE):
                return

    # ------------------------------------------------------------------ a connection's life

    async def _serve(self, live: _Live) -> None:
        """The connection's task: the bridge's messages onto its streams, until it ends."""
        client = live.client
        try:
            with live.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_link_closed, live)
                    await client.pump_batches(lambda batch: self._route(live, batch))
                    nursery.cancel_scope.cancel()
                live.end(client.close_reason or "closed by the bridge")
        finally:
            core = live.core
            live.ending = True
            self._table.end(core.id, live.reason)
            live.answered.set()
            live.wake()
            deadlines = self._bridge.hub.deadlines
            deadlines.cancel(("http-unread", core.id))
            deadlines.cancel(("http-idle", core.id))
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await self._bridge.close_client(client, live.reason)
            self._by_client.pop(client, None)
            self._slots.give()
            live.closed.set()
            logger.info("http_acp_closed", connection_id=core.id, reason=live.reason)

    async def _route(self, live: _Live, batch: list[bytes]) -> None:
        core = live.core
        route = core.route
        woken: set[StreamKey] = set()
        for line in batch:
            where = route(line)
            if isinstance(where, Captured):
                live.answer = where.line
                live.answered.set()
            else:
                woken.add(where)
        for key in woken:
            lot = live.lots.get(key)
            if lot is not None:
                lot.unpark_all()
        while core.full and not live.ending:
            await live.room.park()

    def _unread(self, live: _Live) -> None:
        """Nothing reads the connection now: it ends unless a stream opens in time."""
        self._bridge.hub.deadlines.schedule(
            ("http-unread", live.core.id),
            trio.current_time() + self._settings.http_stream_timeout,
            lambda: _ended(live, f"no stream open for {self._settings.http_stream_timeout:g}s"),
        )

    def _idle_after(self, live: _Live, delay: float) -> None:
        """Look at the connection's idleness in ``delay`` seconds (``idle_timeout``: 0, never):
        one deadline per connection, moved when it falls, not at every POST."""
        if self._settings.idle_timeout > 0:
            self._bridge.hub.deadlines.schedule(
                ("http-idle", live.core.id),
                trio.current_time() + delay,
                lambda: self._idle(live),
            )

    async def _idle(self, live: _Live) -> None:
        left = live.active + self._settings.idle_timeout - trio.current_time()
        if left > 0:
            self._idle_after(live, left)
        else:
            live.end("idle")

    def _owner(self, session_id: str, live: _Live) -> Owner:
        """Who holds a session, seen from ``live`` (an HTTP connection nobody reads: nobody)."""
        session = self._bridge.hub.sessions.get(session_id)
        owner = session.client if session is not None else None
        if owner is not None and not owner.closed and owner is live.client:
            return Owner.THIS
        if (
            session is not None
            and session.watchers is not None
            and transitions.watcher_of(session, live.client) is not None
        ):
            return Owner.WATCHING  # (the bridge refuses what only the owner may do)
        if owner is None or owner.closed:
            return Owner.NOBODY
        other = self._by_client.get(owner)
        if other is not None and not other.core.readers:
            return Owner.NOBODY
        return Owner.OTHER


async def _ended(live: _Live, reason: str) -> None:
    live.end(reason)


async def _link_closed(live: _Live) -> None:
    """The bridge closed the link (its client was not reading): the connection ends."""
    await live.client.closed_event.wait()
    live.end(live.client.close_reason or "closed by the bridge")


async def _until_gone(exchange: Exchange, scope: trio.CancelScope) -> None:
    """The reader closed its end (or sent junk): its stream is over."""
    await exchange.wait_gone(4096)
    scope.cancel()
