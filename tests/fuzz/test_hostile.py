"""
Slow and hostile WebSocket clients, and the short soak.

- A client that stops reading while its agent streams 100,000 updates: the bridge's memory
  stays within a stated bound, another session's round trips keep their latency, and the
  slow client is cut off by the documented rule (outbound queue full: link closed; the stuck
  socket dropped at ``ping_timeout``) while its session detaches and can be resumed.
- Abuse: frames over ``max_message_bytes`` (announced or fragmented: 1009), ping floods
  (read or not), connection floods up to ``max_connections`` (503) and silent sockets that
  hold handshake places (503 past them; dropped at ``handshake_timeout``); the daemon serves
  on after each.
- ``python -m bench.soak --seconds 20``: the soak in CI size, its report checked.

Everything listens on 127.0.0.1. The handshake's auth and Origin matrices live in
``test_ws.py``. Figures are printed with ``-s``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
import wsproto
import wsproto.events as ev

from acp_bridge.agents.process import make_subprocess_launcher
from acp_bridge.config.model import AgentConfig, BridgeConfig, Config, WebSocketConfig
from acp_bridge.engine.bridge import Bridge
from acp_bridge.engine.relay import READ_ROUND_LINES
from acp_bridge.faces.serve import serve_websocket
from acp_bridge.protocol.jsonrpc import dumps
from acp_bridge.runtime import heap
from acp_bridge.runtime.pipes import READ_BUFFER_BYTES as READ_CHUNK
from bench.soak import held_memory, minute_floors
from tests.e2e.test_stdio import rss_kib
from tests.faces.test_ws import (
    AUTH,
    AUTH_HEADERS,
    TOKEN,
    Server,
    get_request,
    http_exchange,
    open_peer,
    upgrade_request,
)
from tests.support.fakes import FakeAgent, chunk_update, open_bridge

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from acp_bridge.engine.links import ClientLink
    from acp_bridge.faces.serve import ListenInfo


ROOT = Path(__file__).resolve().parents[2]
FAULT_AGENT = str(Path(__file__).resolve().parents[1] / "support" / "peers" / "fault_agent.py")
NEW = {"cwd": "/w", "mcpServers": []}
FLOOD = 100_000
#: the bridge's memory may grow this much while a client that reads nothing is flooded:
#: its outbound queue (client_queue messages, ~230 bytes each here), the session's replay
#: history (history_limit / history_bytes) and the WebSocket's buffers, with slack for the
#: allocator; kernel socket buffers are not the process's memory
SLOW_CLIENT_RSS_BOUND_KIB = 32 * 1024
#: another session's round trip (on another agent) stays under this, p99, during the flood
OTHER_SESSION_P99_BOUND = 0.05


@contextlib.asynccontextmanager
async def open_daemon(*, bridge: dict[str, Any] | None = None, **ws: Any) -> AsyncIterator[Server]:
    """A bridge with two real fault agents, ``f`` and ``g``, served over WebSocket on
    127.0.0.1."""
    limits = {"stop_grace": 0.5, **(bridge or {})}
    config = Config(
        agents={
            name: AgentConfig(
                name=name, command=sys.executable, args=[FAULT_AGENT], start_timeout=10
            )
            for name in ("f", "g")
        },
        bridge=BridgeConfig(**limits),
        websocket=WebSocketConfig(port=0, token=TOKEN, **ws),
    )
    launcher = make_subprocess_launcher(stop_grace=config.bridge.stop_grace)
    async with trio.open_nursery() as nursery:
        b: Bridge = await nursery.start(Bridge(config, launcher).run)
        info: ListenInfo = await nursery.start(functools.partial(serve_websocket, b, config))
        yield Server(b, info)
        nursery.cancel_scope.cancel()


class RawPeer:
    """A WebSocket client over a TCP socket that reads only when told to (wsproto)."""

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream = stream
        self.port = port
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.events: collections.deque[ev.Event] = collections.deque()
        self.ids = iter(range(1, 1 << 30))

    @classmethod
    async def connect(cls, port: int, *, receive_buffer: int | None = None) -> RawPeer:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        await sock.connect(("127.0.0.1", port))
        return cls(trio.SocketStream(sock), port)

    async def write(self, event: ev.Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next_event(self) -> ev.Event | None:
        while not self.events:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.ws.receive_data(data)
            self.events.extend(self.ws.events())
        return self.events.popleft()

    async def handshake(self) -> None:
        await self.write(
            ev.Request(host=f"127.0.0.1:{self.port}", target="/acp", extra_headers=AUTH_HEADERS)
        )
        assert isinstance(await self.next_event(), ev.AcceptConnection)

    async def send(self, method: str, params: Any) -> int:
        req_id = next(self.ids)
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}
        await self.write(ev.TextMessage(data=json.dumps(msg)))
        return req_id

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        req_id = await self.send(method, params)
        while True:
            event = await self.next_event()
            assert isinstance(event, ev.TextMessage), event
            reply = json.loads(event.data)
            if reply.get("id") == req_id and "method" not in reply:
                return reply

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)

    async def __aenter__(self) -> RawPeer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def new_link(bridge: Bridge, before: set[ClientLink]) -> ClientLink:
    (link,) = bridge.hub.clients - before
    return link


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- a client that stops reading -----------------------------------------------------------------


async def test_a_client_that_stops_reading_while_100k_updates_stream():
    """The slow client's link closes when its queue is full, its socket is dropped at
    ping_timeout, memory stays bounded, another session (another agent, another connection)
    keeps its round trip, and the slow client's session (with its prompt's answer) is taken
    back after."""
    limits = {"history_limit": 2000}
    with trio.fail_after(60):
        # ping_timeout (the cut-off of a write that never completes) is set above OVERFLOW_WAIT
        # (1 s), so the queue-full rule is the one that ends the link: the writer sends whole
        # bursts, fills the socket's buffer at once and then waits on it, which would make the
        # two timers race if they were equal.
        async with open_daemon(bridge=limits, ping_interval=0, ping_timeout=3) as daemon:
            bridge = daemon.bridge
            config = bridge.hub.config.bridge
            rss_before = rss_kib(os.getpid())
            async with await RawPeer.connect(daemon.port, receive_buffer=4096) as slow:
                before = set(bridge.hub.clients)
                await slow.handshake()
                await slow.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                link = new_link(bridge, before)
                sid = (await slow.call("session/new", NEW))["result"]["sessionId"]
                session = bridge.hub.sessions.get(sid)
                assert session is not None
                async with open_peer(daemon.port) as other:
                    on_g = {**NEW, "_meta": {"acp_bridge": {"agent": "g"}}}
                    mine = (await other.request("session/new", on_g))["result"]["sessionId"]
                    prompt_id = await slow.send(
                        "session/prompt",
                        {"sessionId": sid, "prompt": [{"type": "text", "text": f"flood {FLOOD}"}]},
                    )
                    # From here the slow client reads nothing. Round trips on the other session
                    # until every update of the flood went through the bridge.
                    latencies: list[float] = []
                    own: list[float] = []  # the bridge's own answer: _acp_bridge/agents
                    peak = rss_before
                    deepest = 0
                    history = session.history
                    assert history is not None
                    flood_started = time.perf_counter()
                    cut_after: float | None = None
                    while history.last_seq < FLOOD + 1:  # (+1: the user's prompt)
                        started = time.perf_counter()
                        reply = await other.request(
                            "session/set_mode", {"sessionId": mine, "modeId": "a"}
                        )
                        latencies.append(time.perf_counter() - started)
                        assert reply["result"] == {}
                        started = time.perf_counter()
                        await other.request("_acp_bridge/agents", {})
                        own.append(time.perf_counter() - started)
                        peak = max(peak, rss_kib(os.getpid()))
                        deepest = max(deepest, link.queue_depth())
                        if cut_after is None and link.closed:
                            cut_after = time.perf_counter() - flood_started
                        assert len(history) <= config.history_limit
                    assert link.closed
                    assert link.close_reason is not None
                    assert "queue full" in link.close_reason
                    # The stuck socket is dropped at ping_timeout: the session is detached.
                    with trio.fail_after(8):
                        while session.client is not None:
                            await other.request(
                                "session/set_mode", {"sessionId": mine, "modeId": "a"}
                            )
                    assert link not in bridge.hub.clients
            # Another connection takes the session back: the prompt's answer, then a load
            # that says what was trimmed.
            async with open_peer(daemon.port) as back:
                reply = await back.request("session/resume", {**NEW, "sessionId": sid})
                assert prompt_id in reply["result"]["_meta"]["acp_bridge"]["pending"]
                answer = await back.next()
                while answer.get("id") != prompt_id:
                    answer = await back.next()
                assert answer["result"]["stopReason"] == "end_turn"
                assert answer["result"]["_meta"]["sent"] == FLOOD
                reply = await back.request("session/load", {**NEW, "sessionId": sid})
                ours = reply["result"]["_meta"]["acp_bridge"]
                assert ours["complete"] is False
                assert ours["lastSeq"] == FLOOD + 1
                replayed = [m for m in back.received if m.get("method") == "session/update"]
                assert len(replayed) == config.history_limit
    growth = peak - rss_before
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    print(
        f"\nslow client, {FLOOD:,} updates: its link closed {cut_after or 0:.2f} s into the "
        f"flood; RSS +{growth} KiB (bound "
        f"{SLOW_CLIENT_RSS_BOUND_KIB} KiB), queue depth max {deepest}/{config.client_queue}; "
        f"another session's set_mode x{len(latencies)}: p50 {p50 * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; _acp_bridge/agents "
        f"p99 {percentile(own, 0.99) * 1000:.1f} ms"
    )
    assert deepest <= config.client_queue
    assert growth < SLOW_CLIENT_RSS_BOUND_KIB
    assert p99 < OTHER_SESSION_P99_BOUND


def _updates_chunk(sid: str, lines: int) -> bytes:
    """``lines`` session updates in one chunk (one read for the bridge)."""
    chunk = b"".join(dumps(chunk_update(sid, f"{i}")) for i in range(lines))
    assert len(chunk) < READ_CHUNK
    return chunk


async def _relayed_between_rounds(agents: int, lines: int) -> list[int]:
    """
    Each of ``agents`` agents writes one read of ``lines`` updates to a detached session
    (relaying them needs no await at all) at once; a task that runs once per scheduler round
    notes how many were relayed. Returns the lines handled between two of its notes.
    """
    fakes = {f"a{i}": FakeAgent(f"a{i}") for i in range(agents)}
    seen = [0]
    with trio.fail_after(10):
        async with open_bridge(fakes) as (client, bridge), trio.open_nursery() as nursery:
            chunks = []
            for name, agent in fakes.items():
                sid = await client.new_session(agent=name)
                agent_sid = bridge.hub.sessions.get(sid).agent_id  # (what the agent calls it)
                chunks.append((agent, _updates_chunk(agent_sid, lines)))
            await client.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            base = bridge.hub.counters["from_agent"]

            async def observe() -> None:
                while seen[-1] < agents * lines:
                    await trio.lowlevel.checkpoint()
                    seen.append(bridge.hub.counters["from_agent"] - base)

            nursery.start_soon(observe)  # (noting from before the first write)
            for agent, chunk in chunks:
                # (All written in one scheduler round: the readers all start in the next.)
                assert agent._send is not None
                nursery.start_soon(agent._send.send_all, chunk)
    return [b - a for a, b in itertools.pairwise(seen) if b > a]


async def test_one_big_read_from_an_agent_lets_other_tasks_run_between_its_lines():
    """A read of hundreds of lines is handled a turn at a time, other tasks running in between
    (without it, one read was one uninterrupted step: the other session's p99 above went from
    ~8 ms to ~50 ms). (A step of the observer can fall either side of a turn: two turns can
    pair up between two of its notes.)"""
    steps = await _relayed_between_rounds(1, 320)
    assert len(steps) >= 2, steps
    assert max(steps) <= 2 * READ_ROUND_LINES, steps


async def test_busy_agent_readers_share_one_budget_of_lines_per_round():
    """Four agents flooding at once get a quarter of ``READ_ROUND_LINES`` per turn each, so a
    round of the scheduler (what each hop of any other round trip waits for) holds about the
    same work as with one: with a fixed turn per reader it would hold four times as much."""
    steps = await _relayed_between_rounds(4, 320)
    # The first round is larger (the readers start one by one, each seeing fewer busy:
    # 128 + 64 + 42 + 32 lines), and a note can fall either side of a round, so between two
    # notes: at most the first round and one more. A fixed turn: 4 x 128 lines per round.
    first = sum(READ_ROUND_LINES // k for k in range(1, 5))
    assert max(steps) <= first + READ_ROUND_LINES, steps
    assert len(steps) >= 4, steps


# -- WebSocket abuse -------------------------------------------------------------------------------


def text_frame_head(length: int, *, fin: bool = True) -> bytes:
    """A masked text frame's head announcing ``length`` payload bytes (mask key 0: the
    payload goes as is)."""
    first = (0x80 if fin else 0x00) | 0x1
    if length < 126:
        head = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, length)
    return head + b"\0\0\0\0"


async def close_code(peer: RawPeer) -> int | None:
    """Read until the server's close frame (its code) or EOF (None)."""
    while True:
        event = await peer.next_event()
        if event is None:
            return None
        if isinstance(event, ev.CloseConnection):
            return event.code


async def serves(port: int) -> None:
    """A new connection gets a session: the daemon is fine."""
    async with open_peer(port) as peer:
        assert "sessionId" in (await peer.request("session/new", NEW))["result"]


async def test_oversize_messages_close_1009_whether_announced_or_fragmented():
    """A frame announcing 1 TiB, and a message fragmented into many small frames, are cut at
    max_message_bytes with 1009, having cost at most that much memory; others go on."""
    cap = 64 * 1024
    with trio.fail_after(30):
        async with open_daemon(max_message_bytes=cap) as daemon:
            rss_before = rss_kib(os.getpid())
            # One frame that says it carries 1 TiB.
            async with await RawPeer.connect(daemon.port) as peer:
                await peer.handshake()
                await peer.call("initialize", {"protocolVersion": 1})
                with contextlib.suppress(trio.BrokenResourceError):
                    await peer.stream.send_all(text_frame_head(1 << 40) + b"a" * (2 * cap))
                assert await close_code(peer) == 1009
            # Many small fragments of one message.
            async with await RawPeer.connect(daemon.port) as peer:
                await peer.handshake()
                await peer.call("initialize", {"protocolVersion": 1})
                with contextlib.suppress(trio.BrokenResourceError):
                    for _ in range(2 * cap // 1024):
                        await peer.write(ev.TextMessage(data="a" * 1024, message_finished=False))
                assert await close_code(peer) == 1009
            await serves(daemon.port)
            growth = rss_kib(os.getpid()) - rss_before
    print(f"\noversize messages: closed 1009 at {cap} bytes; RSS +{growth} KiB")
    assert growth < 8 * 1024


PINGS = 5_000


async def test_a_ping_flood_is_answered_without_stopping_the_connection():
    """5,000 pings while a request is under way: every one gets its pong, the request its
    answer, and memory stays flat."""
    payload = b"p" * 125
    with trio.fail_after(30):
        async with open_daemon(ping_interval=0) as daemon:
            rss_before = rss_kib(os.getpid())
            async with await RawPeer.connect(daemon.port) as peer:
                await peer.handshake()
                await peer.call("initialize", {"protocolVersion": 1})
                pongs = 0
                answered = trio.Event()

                async def read() -> None:
                    nonlocal pongs
                    while (event := await peer.next_event()) is not None:
                        if isinstance(event, ev.Pong):
                            pongs += 1
                        elif isinstance(event, ev.TextMessage) and '"sessionId"' in event.data:
                            answered.set()
                        if pongs == PINGS and answered.is_set():
                            return

                burst = peer.ws.send(ev.Ping(payload=payload)) * 1000
                started = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    for i in range(PINGS // 1000):
                        await peer.stream.send_all(burst)
                        if i == PINGS // 2000:
                            await peer.send("session/new", NEW)
                took = time.perf_counter() - started
                growth = rss_kib(os.getpid()) - rss_before
            await serves(daemon.port)
    print(f"\nping flood: {PINGS:,} pongs and the answer in {took:.2f} s, RSS +{growth} KiB")
    assert growth < 8 * 1024


async def test_a_ping_flood_that_reads_no_pong_is_dropped_at_ping_timeout():
    """Pings sent by a client that reads nothing: its pongs fill the socket, the server stops
    reading it (TCP pushes back), and drops it ping_timeout later; another connection is
    served throughout and memory stays flat."""
    frame = b"\x89\x80\0\0\0\0"  # a masked ping without payload
    blob = frame * ((64 << 20) // len(frame))  # far more than the socket buffers hold
    timeout = 1.0
    with trio.fail_after(30):
        async with open_daemon(ping_interval=0, ping_timeout=timeout) as daemon:
            bridge = daemon.bridge
            rss_before = rss_kib(os.getpid())
            async with await RawPeer.connect(daemon.port, receive_buffer=4096) as flooder:
                before = set(bridge.hub.clients)
                await flooder.handshake()
                await flooder.call("initialize", {"protocolVersion": 1})
                link = new_link(bridge, before)
                async with open_peer(daemon.port) as other:
                    sid = (await other.request("session/new", NEW))["result"]["sessionId"]
                    started = time.perf_counter()
                    with pytest.raises(trio.BrokenResourceError):
                        await flooder.stream.send_all(blob)  # until the server gives up on it
                    dropped = time.perf_counter() - started
                    await link.closed_event.wait()
                    reply = await other.request(
                        "session/set_mode", {"sessionId": sid, "modeId": "a"}
                    )
                    assert reply["result"] == {}
            growth = rss_kib(os.getpid()) - rss_before
            await serves(daemon.port)
    print(f"\nping flood without reading: dropped after {dropped:.2f} s, RSS +{growth} KiB")
    assert dropped >= timeout
    assert growth < 8 * 1024


async def test_connection_floods_are_capped_and_the_daemon_serves_after():
    """max_connections WebSocket connections, then 503 for more; silent sockets fill the
    handshake places (a connection beyond, while they are young, gets 503 too) until
    handshake_timeout drops them; after each flood a new connection is served."""
    cap = 16
    with trio.fail_after(30):
        async with open_daemon(
            max_connections=cap, max_handshakes=cap, handshake_timeout=0.5
        ) as daemon:
            port = daemon.port
            async with contextlib.AsyncExitStack() as stack:
                for _ in range(cap):
                    await stack.enter_async_context(open_peer(port))
                links = set(daemon.bridge.hub.clients)
                assert len(links) == cap
                for _ in range(5):
                    response = await http_exchange(port, upgrade_request(port, extra=[AUTH]))
                    assert response.status == 503
                health = await http_exchange(port, get_request(port, "/healthz"))
                assert health.status == 200
            for link in links:
                await link.closed_event.wait()
            await serves(port)
            # Sockets that connect and say nothing hold the handshake slots ...
            silent = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(cap)]
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            busy = await http_exchange(port, upgrade_request(port, extra=[AUTH]))
            assert busy.status == 503
            # ... until handshake_timeout drops them.
            for stream in silent:
                async with stream:
                    assert await stream.receive_some(1024) == b""
            await serves(port)


# -- the soak, CI size -------------------------------------------------------------------------


async def test_a_short_soak_holds_every_check(tmp_path):
    """``python -m bench.soak --seconds 20``: a real daemon, 10 agents, 100 sessions, random
    traffic and reconnects; its report says FDs flat, nothing waiting long or forever, no
    update lost or repeated, no traceback in the daemon's log."""
    out = tmp_path / "soak.json"
    argv = [sys.executable, "-m", "bench.soak", "--seconds", "20", "--json", str(out)]
    with trio.fail_after(90):
        done = await trio.run_process(
            argv, cwd=ROOT, capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace")[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert report["failures"] == []
    assert report["agents"] == 10
    assert report["sessions"] == 100
    assert report["daemon_alive"] is True
    assert report["fd_growth"] <= 5
    assert report["unanswered"] == 0
    assert report["seq_repeats"] == 0
    check = report["replay_check"]
    # (a churned session may be between its close and its successor when the traffic stops)
    assert check["sessions_checked"] == check["sessions_open"] >= 90
    assert check["missing"] == check["unexpected"] == check["errors"] == 0
    assert report["log"]["tracebacks"] == 0
    assert report["max_pending_age_s"] < 30
    counts = report["counts"]
    assert counts["updates"] > 1000
    assert counts["reconnects"] >= 5
    assert counts["loads"] >= counts["reconnects"]
    assert len(report["samples"]) >= 5
    # what the daemon holds, from its /status, with each sample
    held = report["held_after_warmup"]
    assert held["historyEntries"]["max"] > 0
    assert held["pythonBlocks"]["min"] > 0
    assert ("heapInUseKiB" in held) == (heap.malloc_trim() is not None)
    print("\n" + done.stdout.decode())


def test_the_soak_reports_the_lowest_rss_of_each_whole_minute():
    values = [5, 3, 4, 9, 9, 9, 2, 8, 8, 8, 8, 8, 7]  # a sample every 10 s from t = 600
    points = [(600.0 + 10 * i, float(v)) for i, v in enumerate(values)]
    # The third minute has one sample so far: not a whole minute, left out.
    assert minute_floors(points, 600.0) == [(610.0, 3.0), (660.0, 2.0)]
    assert minute_floors([], 600.0) == []


def test_the_soak_reports_what_the_daemon_holds_with_slopes():
    samples = [
        {"t": 600.0, "rss_kib": 1, "heapInUseKiB": 100, "historyEntries": 10},
        {"t": 660.0, "rss_kib": 1, "heapInUseKiB": 160, "historyEntries": 30},
        {"t": 720.0, "rss_kib": 1, "heapInUseKiB": 220},  # (a sample /status did not answer)
    ]
    held = held_memory(samples)
    assert held["heapInUseKiB"] == {
        "first": 100,
        "last": 220,
        "min": 100,
        "max": 220,
        "slope_per_min": 60.0,
    }
    assert held["historyEntries"]["slope_per_min"] == 20.0
    assert "pythonBlocks" not in held
