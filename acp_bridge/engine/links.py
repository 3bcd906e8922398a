"""
The links: one client connection (:class:`ClientLink`) and one configured agent across the
lives of its process (:class:`AgentLink`), with their bounded outbound queues.

The two live in one module because each holds the other's type (a client's requests out at
agents, an agent's requests out at clients) until one id map replaces those tables.
"""

from __future__ import annotations

import collections
import enum
import itertools
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import attrs
import structlog
import trio

from acp_bridge.agents.process import StderrRing
from acp_bridge.config import remote
from acp_bridge.protocol.diagnostics import LEVEL_RANK, LogBudget
from acp_bridge.protocol.notices import NOTICE_BURST, NOTICE_RATE
from acp_bridge.runtime import pipes
from acp_bridge.sessions.table import Forwarded, PendingTable

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from acp_bridge.agents.backoff import Restarts
    from acp_bridge.config.model import AgentConfig
    from acp_bridge.observe.redact import Redactor
    from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError, JsonRpcId

logger = structlog.get_logger("acp_bridge.bridge")

#: how long a non-blocking client's full queue may stay full before it is disconnected (the
#: agent's reader waits meanwhile: a fast agent is throttled to the client's pace, a client
#: that stopped reading is let go)
OVERFLOW_WAIT: Final = 1.0
#: how long a non-blocking client may take nothing while it is sent a bulk answer (a replay)
REPLY_SEND_TIMEOUT: Final = 30.0
#: bytes joined into one write by a writer task
WRITE_BATCH_BYTES: Final = 64 * 1024

#: answers a client link writes ahead of its queue at most (see :meth:`ClientLink.send_answer`);
#: past that, answers queue like any message
LANE_MAX: Final = 256


#: A wire tracer: called with (link, direction, bytes) for every message crossing the bridge;
#: link is "client:<name>" or "agent:<name>", direction "in" (to the bridge) or "out".
#: It must not block (see _trace.py: a bounded queue, drops counted).
Tracer: TypeAlias = "Callable[[str, str, bytes], None]"


class AgentState(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    #: exited or failed to start; a later session/new restarts it (with backoff)
    DEAD = "dead"
    STOPPING = "stopping"


class Waiter:
    """A request the bridge itself sent to an agent; the reader hands it the response."""

    __slots__ = ("_event", "response")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.response: JsonObject | None = None

    def set(self, response: JsonObject) -> None:
        self.response = response
        self._event.set()

    async def wait(self) -> JsonObject:
        await self._event.wait()
        assert self.response is not None
        return self.response


class AgentGone(Exception):
    pass


class ClientLink:
    """
    One ACP client connection, whatever its transport.

    The transport feeds lines in with :meth:`Bridge.handle_client_line` and runs
    :meth:`pump` to write what the bridge queued for the client.
    """

    def __init__(
        self,
        *,
        name: str,
        queue_size: int,
        blocking: bool,
        tracer: Tracer | None = None,
        counters: collections.Counter[str] | None = None,
        ids: Iterator[int] | None = None,
        request_ids: Iterator[int] | None = None,
        transport: str = "stdio",
    ) -> None:
        # ids: the bridge's counter of links (by default this link is number 1)
        self.id = next(ids if ids is not None else itertools.count(1))
        self.name = name
        self.blocking = blocking
        #: what carries it: "stdio", "ws" or "http" (for status)
        self.transport = transport
        self._tracer = tracer
        self._link = f"client:{name}"
        self._counters: collections.Counter[str] = (
            counters if counters is not None else collections.Counter()
        )
        #: the outbound queue, bounded by ``queue_size`` messages (not a memory channel: a
        #: put is one append, and the writer takes everything queued at once)
        self._queue: collections.deque[bytes] = collections.deque()
        self._limit = queue_size
        #: messages queued: an entry of the queue may hold a run of several (:meth:`put_run`)
        self._queued = 0
        #: how many more messages than entries the queue holds (0: every entry is one)
        self._extra = 0
        #: the last batch :meth:`_take` took held a run (:meth:`pump_batches` splits it)
        self._took_runs = False
        #: answers written before the queue (:meth:`send_answer`), at most ``LANE_MAX``
        self._lane: collections.deque[bytes] = collections.deque()
        #: messages ever queued and ever taken from the queue: message number n (from 0) is
        #: still queued while n >= _taken
        self._put_count = 0
        self._taken = 0
        #: per session, the number of its last queued message
        self._last_of: dict[object, int] = {}
        #: the number of the last queued message of no known session
        self._barrier = -1
        #: no more output will be queued (finished, or closed): the writer ends once empty
        self._finished = False
        self._writer_lot = trio.lowlevel.ParkingLot()  # the writer waits here for output
        #: senders waiting for room, in order, with their bytes and session (the writer
        #: queues them)
        self._senders: collections.OrderedDict[trio.lowlevel.Task, tuple[bytes, object]] = (
            collections.OrderedDict()
        )
        #: the pipe the writer writes to (stdio), when it is one: see :meth:`_put`
        self._fd: int | None = None
        #: a message transport's write at once (:meth:`pump_batches`' ``offer``): see :meth:`_put`
        self._offer: Callable[[bytes], int | None] | None = None
        #: ``_offer`` left the rest of a message to the writer: woken, it sends an empty batch
        self._flush = False
        #: requests the bridge sent to this client (forwarded agent requests)
        #: ids of requests the bridge sends to clients, from ``request_ids``: the bridge's
        #: counter makes them unique across its connections, so an answer meant for a
        #: request of a dead connection can never settle a new one
        self.pending: PendingTable[Forwarded] = PendingTable(request_ids)
        #: this client's requests still out at an agent: client id → (agent, id on agent link)
        self.inflight: dict[JsonRpcId, tuple[AgentLink, int]] = {}
        self.capabilities: JsonObject = {}
        self.initialized = False
        #: opted in to ``_meta.acp_bridge.seq`` on every relayed session/update
        self.want_seq = False
        #: the least severe ``_acp_bridge/log`` it wants: None (the default) sends it none,
        #: since stock clients report every unknown notification as an error; set by
        #: ``initialize`` ``_meta.acp_bridge.log`` or ``_acp_bridge/set_log_level``
        self.log_level: str | None = None
        #: it knows the bridge's extensions (any ``_meta.acp_bridge`` on its ``initialize``,
        #: or an ``_acp_bridge/set_log_level``): only then is it sent other ``_acp_bridge/*``
        #: notifications (``permission_resolved``)
        self.extensions = False
        #: the bridge's own ``notice`` updates to it, bounded (``protocol.notices``)
        self.notice_budget = LogBudget(rate=NOTICE_RATE, burst=NOTICE_BURST)
        self.closed = False
        self.close_reason: str | None = None
        #: set when the link closes (overflow, or the connection ended)
        self.closed_event = trio.Event()
        self._idle: trio.Event | None = None
        self.log = logger.bind(client=name)

    def wants_log(self, level: str) -> bool:
        """Whether it asked for ``_acp_bridge/log`` notifications of this level."""
        wanted = self.log_level
        return wanted is not None and LEVEL_RANK.get(level, 1) >= LEVEL_RANK[wanted]

    def done(self, origin_id: JsonRpcId) -> None:
        """A request of this client's was answered."""
        self.inflight.pop(origin_id, None)
        if self._idle is not None and not self.inflight:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Wait until no request of this client's is out at an agent."""
        while self.inflight:
            self._idle = trio.Event()
            await self._idle.wait()
        self._idle = None

    def finish(self) -> None:
        """No more output will be queued: the writer ends once the queue is written."""
        self._finished = True
        self._writer_lot.unpark_all()

    def _put(
        self,
        data: bytes,
        *,
        direct: bool = True,
        session: object = None,
        lane: bool = False,
        count: int = 1,
    ) -> None:
        """
        Write or queue ``data`` (of ``session``, None: of no known session; ``count``
        messages, whole lines); ``lane``: in the answer lane (:meth:`send_answer` decided it
        may go there).
        """
        self._counters["to_client"] += count
        if self._tracer is not None:
            self._tracer(self._link, "out", data)
        if self._writer_lot:
            # The writer is idle, so nothing is queued or being written: a pipe gets the
            # bytes at once (one scheduler round less per hop); what it does not take now
            # is queued for the writer as usual. Not for a stream of updates (``direct``
            # False): queued, they leave in one write per burst instead of one per update.
            # A message transport frames and offers the message; the rest of a frame the
            # socket did not take is the transport's, and the writer is woken to send it.
            if direct and self._fd is not None:
                sent = pipes.write_now(self._fd, data)
                if sent == len(data):
                    return
                data = data[sent:]
            elif direct and self._offer is not None:
                left = self._offer(data)
                if left is not None:
                    if left:
                        self._flush = True
                        self._writer_lot.unpark()
                    return
            self._writer_lot.unpark()
        if lane:
            self._lane.append(data)
            return
        n = self._put_count
        self._put_count = n + 1
        if session is None:
            self._barrier = n
        else:
            self._last_of[session] = n
        self._queued += count
        self._extra += count - 1
        self._queue.append(data)

    def has_room(self, count: int = 1) -> bool:
        """Whether ``count`` more messages fit in the queue now (the link may be closed)."""
        return self._queued + count <= self._limit

    def room(self) -> int:
        """How many more messages fit in the queue now (none while senders wait for room)."""
        return 0 if self._senders else self._limit - self._queued

    async def send(self, data: bytes, session: object = None) -> None:
        """
        Queue bytes for the client (see the module's backpressure notes); ``session``: the
        session they belong to, if any (:meth:`send_answer` keeps each session's order).

        The hot path: when the queue has room this does not yield to the scheduler at all,
        so a reader relays a whole chunk of an agent's output in one go and the writer finds
        it all queued (one write for many messages). When the queue is full, a blocking link
        (stdio) waits for room; a non-blocking one (WebSocket) waits at most
        ``OVERFLOW_WAIT`` seconds — a writer that frees no room for that long belongs to a
        client that is not reading, which is then disconnected.
        """
        if self.closed:
            return
        if self._queued < self._limit:
            self._put(data, session=session)
            return
        await self._send_when_room(data, session, None if self.blocking else OVERFLOW_WAIT)

    async def send_answer(self, data: bytes, session: object) -> None:
        """
        Send an answer to one of the client's requests about ``session``: ahead of the queue
        (in the *answer lane*, which the writer empties first) when nothing of that session
        and nothing of no known session is queued or waiting for room, else queued like any
        message. So a round trip on a quiet session does not wait behind other sessions'
        floods, and each session's messages still reach the client in the order they were
        sent (its earlier messages are all written, or ahead in the lane). The lane holds at
        most ``LANE_MAX`` messages (answers to the client's own requests: few at a time).
        """
        if self.closed:
            return
        taken = self._taken
        if (
            len(self._lane) < LANE_MAX
            and self._barrier < taken
            and self._last_of.get(session, -1) < taken
            and not any(s is None or s is session for _, s in self._senders.values())
        ):
            self._put(data, lane=True)
            return
        await self.send(data, session)

    async def send_wait(self, data: bytes) -> None:
        """
        Queue bytes, waiting for room: for bulk answers to this client's own request (a load
        replay), which may be far larger than the queue. A non-blocking client that takes
        nothing for ``REPLY_SEND_TIMEOUT`` seconds is disconnected; a blocking one is waited for.
        """
        await self._send_when_room(data, None, None if self.blocking else REPLY_SEND_TIMEOUT)

    async def _send_when_room(self, data: bytes, session: object, wait: float | None) -> None:
        """
        Queue ``data`` once there is room, first come first served: a waiting sender parks
        with its bytes and the writer moves them into the queue as it frees room, in the
        order they came (so while the queue is full, any sender waits behind the others:
        a probe's answer is never overtaken forever by flooding readers).
        """
        if self.closed:
            return
        if self._queued < self._limit:  # (never while others wait: they fill it)
            self._put(data, session=session)
            return
        timeout = wait if wait is not None else float("inf")
        with trio.move_on_after(timeout) as waiting:
            task = trio.lowlevel.current_task()
            self._senders[task] = (data, session)

            def abort(_: object) -> trio.lowlevel.Abort:
                del self._senders[task]
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        if waiting.cancelled_caught and not self.closed:
            self.close(f"client is not reading: outbound queue full for {timeout:g}s")

    def send_nowait(self, data: bytes) -> bool:
        if self.closed:
            return False
        if self._queued >= self._limit:
            self.close("client is not reading: outbound queue full")
            return False
        self._put(data)
        return True

    def put_update(self, data: bytes, session: object) -> None:
        """Queue a relayed update when :meth:`has_room` said so: never waits, never writes."""
        if not self.closed:
            self._put(data, direct=False, session=session)

    def put_run(self, data: bytes, count: int, session: object) -> None:
        """
        Queue ``count`` relayed updates of ``session`` (consecutive whole lines, ``data``)
        as one entry, when :meth:`has_room` said they fit: never waits, never writes. The
        queue's bound counts them one by one.
        """
        if not self.closed:
            self._put(data, direct=False, session=session, count=count)

    def queue_depth(self) -> int:
        return self._queued + len(self._lane)

    def offer(self, data: bytes) -> bool:
        """Queue a droppable message (diagnostics): never waits, never closes the link."""
        if self.closed or self._queued >= self._limit:
            return False
        self._put(data)
        return True

    def close(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self.log.info("client_closed", reason=reason)
            self.finish()
            for task in self._senders:  # (what they would have sent is dropped)
                trio.lowlevel.reschedule(task)
            self._senders.clear()
            self.closed_event.set()

    async def _take(self, max_bytes: int) -> list[bytes]:
        """
        Wait for output and take what is queued, up to ``max_bytes`` (at least one message);
        [] once the link is finished and its queue written. Senders waiting for room are let in.
        """
        queue = self._queue
        lane = self._lane
        self._took_runs = False
        while not queue and not lane:
            if self._finished or self._flush:
                return []
            await self._writer_lot.park()
        if not lane and len(queue) == 1:
            batch = [queue.popleft()]
            self._taken += 1
            self._took_runs = self._extra > 0
            self._queued = self._extra = 0
        else:
            batch = []
            size = 0
            while lane and size < max_bytes:
                data = lane.popleft()
                batch.append(data)
                size += len(data)
            taken = len(batch)
            while queue and size < max_bytes:
                data = queue.popleft()
                batch.append(data)
                size += len(data)
            taken = len(batch) - taken
            self._taken += taken
            self._took_runs = self._extra > 0
            if not queue:
                self._queued = self._extra = 0
            elif not self._extra:
                self._queued -= taken
            else:
                # (runs among them: each message ends with the one newline of its line)
                out = sum(entry.count(b"\n") for entry in batch[len(batch) - taken :])
                self._queued -= out
                self._extra -= out - taken
        if not queue:
            self._last_of.clear()  # (nothing of any session is queued)
        elif len(self._last_of) > 2 * self._limit:
            # (only sessions with something queued matter: at most the queue's size of them)
            taken = self._taken
            self._last_of = {k: n for k, n in self._last_of.items() if n >= taken}
        senders = self._senders
        while senders and self._queued < self._limit:
            task, (data, session) = senders.popitem(last=False)
            self._put(data, direct=False, session=session)
            trio.lowlevel.reschedule(task)
        return batch

    async def pump(self, stream: trio.abc.SendStream) -> None:
        """Write queued messages to ``stream`` until the link finishes (batched writes)."""
        self._fd = pipes.pipe_fd(stream)
        try:
            while batch := await self._take(WRITE_BATCH_BYTES):
                await pipes.send_all(stream, batch[0] if len(batch) == 1 else b"".join(batch))
        finally:
            self._fd = None

    async def pump_batches(
        self,
        send: Callable[[list[bytes]], Awaitable[object]],
        offer: Callable[[bytes], int | None] | None = None,
    ) -> None:
        """
        Hand what is queued to ``send``, a list of messages at a time (up to
        ``WRITE_BATCH_BYTES``), until the link finishes: for message transports that can
        write several messages at once. Each message keeps its trailing newline (a run
        :meth:`put_run` queued is handed over as its messages).

        ``offer``: the transport's write at once, for a message put while this writer is
        idle (see :meth:`_put`); it returns None when it took nothing (the message is then
        queued), else how many bytes of it it left unwritten: then ``send`` is soon called
        with an empty batch, and must write those first (as it must before any batch).
        """
        self._offer = offer
        try:
            while True:
                batch = await self._take(WRITE_BATCH_BYTES)
                self._flush = False
                if not batch and self._finished:
                    break
                if self._took_runs:
                    batch = [line + b"\n" for e in batch for line in e.split(b"\n")[:-1]]
                await send(batch)
        finally:
            self._offer = None


async def pump_channel(
    receive: trio.MemoryReceiveChannel[bytes], stream: trio.abc.SendStream
) -> None:
    async for data in receive:
        if len(data) < WRITE_BATCH_BYTES:
            batch = [data]
            size = len(data)
            while size < WRITE_BATCH_BYTES:
                try:
                    more = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                batch.append(more)
                size += len(more)
            if len(batch) > 1:
                data = b"".join(batch)
        await pipes.send_all(stream, data)


@attrs.define(eq=False)
class AgentLink:
    """One configured agent, across the lives (restarts) of its process."""

    config: AgentConfig
    queue_size: int
    state: AgentState = AgentState.STOPPED
    #: set when the current start attempt settled (ready or failed)
    settled: trio.Event = attrs.field(factory=trio.Event)
    start_error: JsonRpcError | None = None
    pending: PendingTable[Forwarded | Waiter] = attrs.field(factory=PendingTable)
    #: requests this agent sent to a client still unanswered: agent's id → (client, client id)
    inflight: dict[JsonRpcId, tuple[ClientLink, int]] = attrs.field(factory=dict)
    capabilities: JsonObject = attrs.field(factory=dict)
    auth_methods: list[Any] = attrs.field(factory=list)
    agent_info: JsonObject | None = None
    stderr: StderrRing = attrs.field(factory=StderrRing)
    pid: int | None = None
    exit_status: int | None = None
    starts: int = 0
    #: URL elicitations in progress: elicitationId → the client that was shown it
    elicitations: dict[str, ClientLink] = attrs.field(factory=dict)
    new_in_flight: int = 0
    #: its requests answered at once for ``max_agent_requests`` (for status)
    requests_refused: int = 0
    early_updates: list[tuple[str, bytes]] = attrs.field(factory=list)
    _send: trio.MemorySendChannel[bytes] | None = None
    #: the agent's stdin, when it is a pipe (see :meth:`send_nowait`)
    _fd: int | None = None
    exited: trio.Event = attrs.field(factory=trio.Event)
    stop_scope: trio.CancelScope | None = None
    tracer: Tracer | None = None
    counters: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: its diagnostic lines' rate budget, across its lives
    log_budget: LogBudget = attrs.field(factory=LogBudget)
    #: why the bridge killed this life of the agent (:meth:`fail`), None: it was not
    failure: str | None = None
    #: kills the running process at once (from its transport)
    kill: Callable[[], None] | None = None
    #: its deaths, and when it may start again
    restarts: Restarts = attrs.field(kw_only=True)
    #: the bridge's secrets, hidden in what it reports of the agent's stderr
    redactor: Redactor = attrs.field(kw_only=True)
    #: its logger, bound once to its name (every event about it carries ``agent``)
    log: Any = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.log = logger.bind(agent=self.config.name)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def running(self) -> bool:
        """A process of it is up (its input is open): between its start and its exit."""
        return self._send is not None

    def send_nowait(self, data: bytes) -> bool:
        """
        Queue a request or a notification for the agent; False if it is not running or its
        queue (``agent_queue`` messages) is full.
        """
        send = self._send
        if send is None:
            return False
        queued = send.statistics()
        if queued.current_buffer_used >= self.queue_size:
            return False
        self.counters["to_agent"] += 1
        if self.tracer is not None:
            self.tracer(f"agent:{self.config.name}", "out", data)
        data = self._write_if_idle(data, queued)
        if not data:
            return True
        try:
            send.send_nowait(data)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    def _write_if_idle(self, data: bytes, queued: trio.MemoryChannelStatistics) -> bytes:
        """
        When the writer waits for output (nothing queued or being written), the agent's
        stdin pipe gets the bytes at once (one scheduler round less); what remains is queued
        by the caller as usual (b"": all written).
        """
        if self._fd is None or queued.current_buffer_used or not queued.tasks_waiting_receive:
            return data
        return data[pipes.write_now(self._fd, data) :]

    def answer(self, data: bytes) -> bool:
        """
        Queue the answer to one of the agent's own requests (a client's answer, the bridge's
        decision or error). An answer is never refused for a full queue: answers have a
        reserve of another ``agent_queue`` messages. When even that is full, the agent has
        not read its input for that long: it is stopped as stalled (:meth:`fail`) — killed,
        so no answer it waits for is silently missing, and every request waiting on it is
        answered with the reason. False: not queued (not running, or stalled).
        """
        send = self._send
        if send is None:
            return False
        self.counters["to_agent"] += 1
        if self.tracer is not None:
            self.tracer(f"agent:{self.config.name}", "out", data)
        data = self._write_if_idle(data, send.statistics())
        if not data:
            return True
        try:
            send.send_nowait(data)
        except trio.WouldBlock:
            self.fail(
                f"it stopped reading its input ({send.statistics().current_buffer_used} "
                "messages waiting for it, answers to its own requests among them)"
            )
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    def fail(self, reason: str) -> None:
        """
        The agent broke the protocol or stalled: kill its process at once (SIGKILL to the
        group). Its exit then takes the usual path (every request waiting on it answered,
        its sessions ended, a restart at the next ``session/new``), with ``reason`` in the
        errors.
        """
        if self._send is None:
            return
        if self.failure is None:
            self.failure = reason
            logger.error("agent_failed", agent=self.name, reason=reason)
        if self.kill is not None:
            self.kill()

    def queue_depth(self) -> int:
        return self._send.statistics().current_buffer_used if self._send is not None else 0

    def failure_data(self) -> JsonObject:
        tail = [self.redactor.redact(line) for line in self.stderr.tail()]
        data: JsonObject = {"agent": self.name, "stderrTail": tail}
        if self.exit_status is not None:
            data["exitStatus"] = self.exit_status
        if self.failure is not None:
            data["stoppedBecause"] = self.failure
        return data

    def describe(self) -> JsonObject:
        info: JsonObject = {
            "name": self.name,
            "state": self.state.value,
            "runsOn": remote.location(self.config),
            "pid": self.pid,
            "starts": self.starts,
            "agentCapabilities": self.capabilities,
            "authMethods": self.auth_methods,
        }
        if self.agent_info is not None:
            info["agentInfo"] = self.agent_info
        if self.start_error is not None:
            info["error"] = self.start_error.to_error()
        return info


__all__ = ["AgentGone", "AgentLink", "AgentState", "ClientLink", "Tracer", "Waiter", "pump_channel"]
