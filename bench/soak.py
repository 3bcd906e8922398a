"""
The soak: a real ``acp-bridge serve`` under random traffic for a while, watched for leaks.

    python -m bench.soak --minutes N [--json PATH]     (or ./scripts/soak --minutes N)
    python -m bench.soak --seconds 20                  (the CI size)

A daemon (subprocess; a temporary ``XDG_STATE_HOME``, its store and journal in it; port 0)
runs 10 demo agents (``acp-bridge demo-agent``, each its own session prefix). Several
WebSocket clients (5) hold 100 sessions between them, spread over the agents, and each
session does random things, one at a time, with a random pause after each: prompts
(``count N`` streams, echoes, ``write FILE`` with a permission request answered allow or
reject after a moment, or left for a ``session/cancel``), cancels during a stream,
``session/set_mode``, and now and then closes itself for a new one. Every client drops its
connection at random (the socket closed, no goodbye), reconnects and takes each session back
with ``session/load`` after the last update number it saw (``_meta.acp_bridge.after_seq``).

Every ``--sample-every`` seconds (10) it samples the daemon's RSS and open file descriptors
(``/proc``), ``GET /status``, and the oldest request its clients are still waiting on. At the
end it lets the traffic settle, loads every session in full on a fresh connection and checks
that the updates each client saw are exactly the ones the bridge recorded (no loss, no
repeat), and reports:

- RSS slope (KiB/min, least squares over the samples after the warm-up), start and end;
- what the daemon holds, from its ``/status`` (``memory``): glibc's heap in use and kept free,
  Python's allocated blocks, the replay histories — each with its slope: a creeping RSS with
  these flat is the allocators keeping freed memory, not a leak;
- file descriptors at the start (all clients connected) and at the end (same state);
- the oldest pending request seen, and requests never answered;
- update numbers out of order or repeated, and differences from the final replay;
- error lines in the daemon's log; counts of everything done.

Exit status: 0 when every check holds, 1 when one does not (FDs grew by more than
``--fd-slack``, a request waited longer than ``--max-pending-age`` or was never answered,
updates were lost or repeated, the daemon logged a traceback or died, and — for runs of at
least ``--judge-rss-after`` minutes — the RSS slope is over ``--max-rss-slope``), 2 when it
could not run. Answers the bridge had sent to a connection as it dropped are lost with it
(counted as ``in_flight_at_drop``, not a failure: the client is told which answers it still
gets, ``_meta.acp_bridge.pending`` of its load; the rest went down with the socket).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
import trio_websocket

if TYPE_CHECKING:
    from collections.abc import Callable

TOKEN = "soak-token-not-a-secret"
MODES = ("ask", "code")


# --- the daemon ----------------------------------------------------------------------------


def _toml(value: str) -> str:
    return json.dumps(value)


def config_text(agents: int, chunk_delay: float, *, history_limit: int) -> str:
    parts = [
        f'[bridge]\nhistory_limit = {history_limit}\ndetach_grace = 120.0\ndefault_agent = "a0"\n'
    ]
    for i in range(agents):
        args = ["-m", "acp_bridge", "demo-agent", "--chunk-delay", str(chunk_delay)]
        args += ["--session-prefix", f"a{i}-", "--name", f"a{i}"]
        parts.append(
            f"[agents.a{i}]\ncommand = {_toml(sys.executable)}\n"
            f"args = [{', '.join(_toml(a) for a in args)}]\n"
        )
    parts.append(f'[websocket]\nhost = "127.0.0.1"\nport = 0\ntoken = {_toml(TOKEN)}\n')
    return "\n".join(parts)


def rss_parts(pid: int) -> dict[str, int]:
    """VmRSS and its parts (KiB): RssAnon is the heap; RssFile and RssShmem are mapped files
    (SQLite's WAL index is shared memory), which say whether a creep is malloc's or a map's."""
    parts: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                parts[key] = int(value.split()[0])
    if "VmRSS" not in parts:
        raise RuntimeError("no VmRSS")
    return parts


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def get_status(port: int) -> dict[str, Any] | None:
    """``GET /status`` with the token; None if it did not answer properly."""
    request = (
        f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    ).encode()
    with trio.move_on_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200 "):
            return None
        status: dict[str, Any] = json.loads(body)
        return status
    return None


# --- the clients ---------------------------------------------------------------------------


@dataclass
class Pending:
    method: str
    session: str | None
    sent_at: float
    done: trio.Event = field(default_factory=trio.Event)
    response: dict[str, Any] | None = None
    #: the connection was gone when it was to be sent
    unsent: bool = False


class Dropped(Exception):
    """The connection a request went out on dropped, and the bridge does not owe its answer."""


@dataclass
class Totals:
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    seq_repeats: int = 0


class SoakClient:
    """One WebSocket client of the daemon with its share of the sessions."""

    def __init__(
        self,
        index: int,
        port: int,
        agents: list[str],
        rng: random.Random,
        totals: Totals,
        args: argparse.Namespace,
    ) -> None:
        self.index = index
        self.port = port
        self.agents = agents
        self.rng = rng
        self.totals = totals
        self.args = args
        self.ids = iter(range(1, 1 << 62))
        self.pending: dict[int, Pending] = {}
        self.ws: trio_websocket.WebSocketConnection | None = None
        self.stream: trio.SocketStream | None = None
        self.ready = trio.Event()
        self.sessions: list[str] = []
        #: per session: every update number seen, and the last one
        self.seen: dict[str, set[int]] = collections.defaultdict(set)
        self.last_seq: dict[str, int] = collections.defaultdict(int)
        #: called with every session/update (the replay check listens here)
        self.on_update: Callable[[dict[str, Any]], None] | None = None
        self._connection_ended = trio.Event()
        self._connected_at = 0.0
        self._nursery: trio.Nursery | None = None
        #: set when this client's traffic is over (its connection stays open)
        self.quiet = trio.Event()
        #: set when the traffic starts; it ends at ``until`` (monotonic seconds)
        self.go = trio.Event()
        self.until = 0.0

    # -- the connection

    async def _connection(self, *, task_status: trio.TaskStatus[None]) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        async with stream, trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                f"127.0.0.1:{self.port}",
                "/acp",
                extra_headers=[(b"Authorization", f"Bearer {TOKEN}".encode())],
            )
            self.ws, self.stream = ws, stream
            self._connection_ended = trio.Event()
            task_status.started()
            try:
                while True:
                    self._dispatch(json.loads(await ws.get_message()), nursery)
            except trio_websocket.ConnectionClosed:
                pass
            finally:
                self._connection_ended.set()
                nursery.cancel_scope.cancel()

    def _dispatch(self, msg: dict[str, Any], nursery: trio.Nursery) -> None:
        method = msg.get("method")
        if method is None:
            entry = self.pending.get(msg.get("id"))  # type: ignore[arg-type]
            if entry is not None and not entry.done.is_set():
                entry.response = msg
                entry.done.set()
            return
        if "id" in msg:
            nursery.start_soon(self._agent_request, msg)
            return
        params = msg.get("params") or {}
        if method == "session/update":
            sid = params.get("sessionId")
            seq = ((params.get("_meta") or {}).get("acp_bridge") or {}).get("seq")
            if isinstance(sid, str) and isinstance(seq, int):
                if seq in self.seen[sid] or seq <= self.last_seq[sid]:
                    self.totals.seq_repeats += 1
                self.seen[sid].add(seq)
                self.last_seq[sid] = max(self.last_seq[sid], seq)
            self.totals.counts["updates"] += 1
            if self.on_update is not None:
                self.on_update(msg)
        elif method == "_acp_bridge/permission_resolved":
            self.totals.counts["permissions_resolved_by_bridge"] += 1
        elif method == "_acp_bridge/log":
            text = str((params.get("data") or {}).get("message", ""))
            if "resync required" in text:
                self.totals.counts["resyncs"] += 1

    async def _agent_request(self, msg: dict[str, Any]) -> None:
        """A permission request: allowed or rejected after a moment, or cancelled."""
        ws = self.ws
        if ws is None:
            return
        if msg["method"] != "session/request_permission":
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no"}}
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                await ws.send_message(json.dumps(reply))
            return
        await trio.sleep(self.rng.uniform(0, 0.3))
        sid = msg["params"]["sessionId"]
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            if self.rng.random() < 0.2:
                self.totals.counts["permissions_cancelled"] += 1
                await self._notify(ws, "session/cancel", {"sessionId": sid})
                return
            option = self.rng.choice(["allow-once", "reject-once"])
            outcome = {"outcome": {"outcome": "selected", "optionId": option}}
            self.totals.counts["permissions_answered"] += 1
            await ws.send_message(
                json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": outcome})
            )

    async def _notify(
        self, ws: trio_websocket.WebSocketConnection, method: str, params: dict[str, Any]
    ) -> None:
        await ws.send_message(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}))

    async def request(
        self, method: str, params: dict[str, Any], *, wait_ready: bool = True
    ) -> dict[str, Any]:
        """Send a request and wait for its answer. Raises Dropped (see the class)."""
        if wait_ready:
            await self.ready.wait()
        ws = self.ws
        assert ws is not None
        req_id = next(self.ids)
        entry = Pending(method, params.get("sessionId"), time.monotonic())
        self.pending[req_id] = entry
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}
        try:
            try:
                await ws.send_message(json.dumps(msg))
            except trio_websocket.ConnectionClosed:
                entry.unsent = True
            await entry.done.wait()
        finally:
            del self.pending[req_id]
        if entry.response is None:
            raise Dropped(method)
        return entry.response

    async def connect(self) -> None:
        """Connect and initialize (opting in to update numbers); then take the sessions back."""
        assert self._nursery is not None
        await self._nursery.start(self._connection)
        init = {
            "protocolVersion": 1,
            "clientCapabilities": {},
            "_meta": {"acp_bridge": {"seq": True}},
        }
        reply = await self.request("initialize", init, wait_ready=False)
        assert "result" in reply, reply
        owed: set[int] = set()
        for sid in list(self.sessions):
            params = {
                "sessionId": sid,
                "cwd": self.args.work,
                "mcpServers": [],
                "_meta": {"acp_bridge": {"after_seq": self.last_seq[sid]}},
            }
            reply = await self.request("session/load", params, wait_ready=False)
            if "error" in reply:
                self.totals.errors[f"load: {reply['error'].get('message', '')[:60]}"] += 1
                continue
            self.totals.counts["loads"] += 1
            owed.update(reply["result"]["_meta"]["acp_bridge"]["pending"])
        # Requests of the old connection the bridge will not answer here: they or their
        # answers were in flight when it dropped (or it was gone before they were sent).
        for req_id, entry in list(self.pending.items()):
            if (
                req_id not in owed
                and entry.method not in ("initialize", "session/load")
                and not entry.done.is_set()
                and entry.sent_at < self._connected_at
            ):
                self.totals.counts["unsent_at_drop" if entry.unsent else "in_flight_at_drop"] += 1
                entry.done.set()
        self.ready.set()

    async def drop(self) -> None:
        """The network fails: the socket closes, nothing said."""
        self.ready = trio.Event()
        if self.stream is not None:
            await trio.aclose_forcefully(self.stream)
        await self._connection_ended.wait()
        self.totals.counts["reconnects"] += 1

    # -- the traffic

    async def new_session(self, agent: str) -> str:
        params = {
            "cwd": self.args.work,
            "mcpServers": [],
            "_meta": {"acp_bridge": {"agent": agent}},
        }
        reply = await self.request("session/new", params)
        sid: str = reply["result"]["sessionId"]
        self.sessions.append(sid)
        return sid

    async def session_worker(self, sid: str, agent: str, until: float) -> None:
        rng = self.rng
        while time.monotonic() < until:
            try:
                if sid in self.sessions:
                    sid = await self._one_action(sid, agent)
                else:  # closed, and its successor's session/new was lost in a drop
                    sid = await self.new_session(agent)
            except Dropped:
                self.totals.counts["dropped_requests"] += 1
            await trio.sleep(rng.uniform(0, 2 * self.args.think))

    async def _one_action(self, sid: str, agent: str) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.03:
            # Close this session, open another on the same agent.
            self.sessions.remove(sid)  # (closed or not, if the answer is lost in a drop)
            reply = await self.request("session/close", {"sessionId": sid})
            self._count_reply("close", reply)
            return await self.new_session(agent)
        if roll < 0.13:
            reply = await self.request(
                "session/set_mode", {"sessionId": sid, "modeId": rng.choice(MODES)}
            )
            self._count_reply("set_mode", reply)
            return sid
        if roll < 0.33:
            text = f"write soak-{self.index}-{rng.randrange(1000)}.txt some text"
        elif roll < 0.45:
            text = "hello, soak"
        else:
            text = f"count {rng.randint(1, 60)}"
        params = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
        answer: dict[str, Any] | None = None
        async with trio.open_nursery() as nursery:
            if text.startswith("count") and rng.random() < 0.2:
                nursery.start_soon(self._cancel_later, sid, rng.uniform(0, 0.2))
            with contextlib.suppress(Dropped):
                answer = await self.request("session/prompt", params)
            nursery.cancel_scope.cancel()
        if answer is None:
            raise Dropped("session/prompt")
        self._count_reply("prompt", answer)
        return sid

    async def _cancel_later(self, sid: str, delay: float) -> None:
        await trio.sleep(delay)
        ws = self.ws
        if ws is not None and self.ready.is_set():
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                await self._notify(ws, "session/cancel", {"sessionId": sid})
                self.totals.counts["cancels"] += 1

    def _count_reply(self, what: str, reply: dict[str, Any]) -> None:
        if "error" in reply:
            self.totals.errors[f"{what}: {str(reply['error'].get('message', ''))[:70]}"] += 1
            return
        result = reply.get("result") or {}
        stop = result.get("stopReason") if isinstance(result, dict) else None
        self.totals.counts[f"{what}_{stop}" if stop else what] += 1

    async def run(self, sessions: int, *, task_status: trio.TaskStatus[None]) -> None:
        """Connect, open this client's sessions, report started; at ``go``, traffic and drops
        until ``until``."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._connected_at = time.monotonic()
            await self.connect()
            placed = []
            for n in range(sessions):
                agent = self.agents[
                    (self.index + n * len(self.agents) // sessions) % len(self.agents)
                ]
                placed.append((await self.new_session(agent), agent))
            task_status.started()
            await self.go.wait()
            until = self.until
            async with trio.open_nursery() as traffic:
                for sid, agent in placed:
                    traffic.start_soon(self.session_worker, sid, agent, until)
                traffic.start_soon(self._dropper, until)
            self.quiet.set()
            await trio.sleep_forever()  # the connection stays until the soak is over

    async def _dropper(self, until: float) -> None:
        while True:
            wait = self.rng.uniform(*self.args.reconnect_every)
            if time.monotonic() + wait >= until:
                return
            await trio.sleep(wait)
            await self.drop()
            self._connected_at = time.monotonic()
            await self.connect()

    def oldest_pending(self, now: float) -> float:
        ages = [now - p.sent_at for p in self.pending.values() if not p.done.is_set()]
        return max(ages, default=0.0)


# --- the run --------------------------------------------------------------------------------


def minute_floors(points: list[tuple[float, float]], start: float) -> list[tuple[float, float]]:
    """
    The lowest sample of each whole minute from ``start`` (informational: bursts swing RSS
    by megabytes for seconds at a time, a leak raises the floor).
    """
    minutes: dict[int, list[tuple[float, float]]] = {}
    for t, value in points:
        minutes.setdefault(int((t - start) // 60), []).append((t, value))
    last = max(minutes, default=-1)
    return [
        min(group, key=lambda p: p[1])
        for minute, group in sorted(minutes.items())
        if minute < last or group[-1][0] - start >= 60 * (minute + 1) - 1
    ]


#: what the daemon's /status says of its memory (``memory``), kept with each sample
MEMORY_KEYS = ("heapInUseKiB", "heapFreeKiB", "pythonBlocks", "historyKiB", "historyEntries")


def held_memory(samples: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """
    For each of :data:`MEMORY_KEYS`: first, last, least, most and slope per minute over the
    samples. Informational: an RSS that creeps while what the daemon holds (its heap in use,
    Python's blocks, the histories) stays flat is the allocators keeping freed memory, not a
    leak.
    """
    held: dict[str, dict[str, float | None]] = {}
    for key in MEMORY_KEYS:
        points = [(s["t"], s[key]) for s in samples if key in s]
        if points:
            values = [v for _, v in points]
            slope = slope_per_minute(points)
            held[key] = {
                "first": values[0],
                "last": values[-1],
                "min": min(values),
                "max": max(values),
                "slope_per_min": None if slope is None else round(slope, 2),
            }
    return held


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60


async def verify_replays(
    port: int, clients: list[SoakClient], work: str, last: int
) -> dict[str, int]:
    """
    Load every open session on a fresh connection, its last ``last`` update numbers
    (``after_seq``): the updates its client saw there must be exactly those the bridge
    recorded (no loss, no repeat).
    """
    checker = SoakClient(99, port, [], random.Random(0), Totals(), argparse.Namespace(work=work))
    result = {
        "sessions_open": sum(len(c.sessions) for c in clients),
        "sessions_checked": 0,
        "updates_compared": 0,
        "missing": 0,
        "unexpected": 0,
        "trimmed": 0,
        "errors": 0,
    }
    async with trio.open_nursery() as nursery:
        checker._nursery = nursery
        checker._connected_at = time.monotonic()
        await checker.connect()
        for client in clients:
            for sid in client.sessions:
                after = max(0, client.last_seq[sid] - last)
                updates: list[dict[str, Any]] = []
                checker.on_update = updates.append
                params = {
                    "sessionId": sid,
                    "cwd": work,
                    "mcpServers": [],
                    "_meta": {"acp_bridge": {"after_seq": after}},
                }
                reply = await checker.request("session/load", params)
                if "error" in reply:
                    result["errors"] += 1
                    continue
                ours = reply["result"]["_meta"]["acp_bridge"]
                recorded = {
                    u["params"]["_meta"]["acp_bridge"]["seq"]
                    for u in updates
                    if u["params"]["sessionId"] == sid
                }
                # (a catch-up replays what the live stream carried: the client's own prompts
                # are not in it; when older updates were trimmed, compare what is left)
                start = after + 1 if ours["complete"] else min(recorded, default=after + 1)
                seen = {s for s in client.seen[sid] if s >= start}
                result["sessions_checked"] += 1
                result["updates_compared"] += len(recorded)
                result["missing"] += len(recorded - seen)
                result["unexpected"] += len(seen - recorded)
                result["trimmed"] += not ours["complete"]
        nursery.cancel_scope.cancel()
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="how long (default 10)")
    length.add_argument("--seconds", type=float, help="how long, in seconds (CI)")
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--think", type=float, default=1.0, help="mean pause between actions")
    parser.add_argument("--chunk-delay", type=float, default=0.005, help="demo agents' delay")
    parser.add_argument("--history-limit", type=int, default=500, help="[bridge] history_limit")
    parser.add_argument("--sample-every", type=float, help="seconds between samples (10)")
    parser.add_argument("--warmup", type=float, help="seconds left out of the RSS slope")
    parser.add_argument("--max-pending-age", type=float, default=30.0)
    parser.add_argument("--fd-slack", type=int, default=5)
    parser.add_argument("--max-rss-slope", type=float, default=17.0, help="KiB/min (~1 MiB/h)")
    parser.add_argument("--judge-rss-after", type=float, default=20.0, help="minutes")
    parser.add_argument(
        "--check-last", type=int, default=200, help="update numbers per session checked at the end"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("soak-results.json"))
    args = parser.parse_args(argv)
    args.duration = args.seconds if args.seconds is not None else 60 * (args.minutes or 10)
    short = args.duration < 120
    if args.sample_every is None:
        args.sample_every = 2.0 if short else 10.0
    if args.warmup is None:
        args.warmup = min(600.0, args.duration / 3)
    args.reconnect_every = (3.0, 8.0) if short else (15.0, 45.0)
    return args


async def soak(
    args: argparse.Namespace, daemon: subprocess.Popen[bytes], port: int
) -> dict[str, Any]:
    rng = random.Random(args.seed)
    totals = Totals()
    agents = [f"a{i}" for i in range(args.agents)]
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    clients = [
        SoakClient(i, port, agents, random.Random(rng.random()), totals, args)
        for i in range(args.clients)
    ]
    share = [
        args.sessions // args.clients + (i < args.sessions % args.clients)
        for i in range(args.clients)
    ]

    async def sample() -> dict[str, Any]:
        now = time.monotonic()
        status = await get_status(port)
        parts = rss_parts(daemon.pid)
        point = {
            "t": round(now - started, 2),
            "rss_kib": parts["VmRSS"],
            "rss_anon_kib": parts.get("RssAnon", 0),
            "rss_file_kib": parts.get("RssFile", 0),
            "rss_shmem_kib": parts.get("RssShmem", 0),
            "fds": fd_count(daemon.pid),
            "oldest_pending_s": round(max(c.oldest_pending(now) for c in clients), 3),
        }
        if status is not None:
            point["daemon_pending"] = sum(a["pendingRequests"] for a in status["agents"])
            point["connections"] = len(status["connections"])
            point["sessions"] = len(status["sessions"])
            memory = status.get("memory") or {}
            point.update({key: memory[key] for key in MEMORY_KEYS if key in memory})
        samples.append(point)
        return point

    async def sampler() -> None:
        while time.monotonic() < until:
            await trio.sleep(args.sample_every)
            point = await sample()
            print(
                f"  t={point['t']:7.1f}s rss={point['rss_kib']} KiB "
                f"(anon {point['rss_anon_kib']}, file {point['rss_file_kib']}, "
                f"shmem {point['rss_shmem_kib']}) fds={point['fds']} "
                f"oldest pending={point['oldest_pending_s']:.2f}s "
                f"updates={totals.counts['updates']}",
                file=sys.stderr,
                flush=True,
            )

    async with trio.open_nursery() as nursery:
        for client, n in zip(clients, share, strict=True):
            await nursery.start(client.run, n)
        first = await sample()  # every client connected, every session open
        until = time.monotonic() + args.duration
        for client in clients:
            client.until = until
            client.go.set()
        nursery.start_soon(sampler)
        for client in clients:
            await client.quiet.wait()
        # Traffic stopped: everything waiting is answered (or the bound says it never was).
        with trio.move_on_after(args.max_pending_age):
            for client in clients:
                for entry in list(client.pending.values()):
                    await entry.done.wait()
        unanswered = sum(1 for c in clients for p in c.pending.values() if not p.done.is_set())
        last = await sample()  # the state of the first sample: every client connected
        replay = await verify_replays(port, clients, args.work, args.check_last)
        nursery.cancel_scope.cancel()
    max_age = max((s["oldest_pending_s"] for s in samples), default=0.0)
    judged = [(s["t"], s["rss_kib"]) for s in samples if s["t"] >= args.warmup]
    slope = slope_per_minute(judged)
    floors = minute_floors(judged, args.warmup)
    held = held_memory([s for s in samples if s["t"] >= args.warmup])
    return {
        "duration_s": round(time.monotonic() - started, 1),
        "agents": args.agents,
        "sessions": args.sessions,
        "clients": args.clients,
        "settings": {
            "think_s": args.think,
            "chunk_delay_s": args.chunk_delay,
            "history_limit": args.history_limit,
            "sample_every_s": args.sample_every,
            "warmup_s": args.warmup,
            "seed": args.seed,
        },
        "counts": dict(totals.counts),
        "error_answers": dict(totals.errors.most_common(20)),
        "samples": samples,
        "rss_start_kib": first["rss_kib"],
        "rss_end_kib": last["rss_kib"],
        "rss_slope_kib_per_min": None if slope is None else round(slope, 2),
        "rss_minute_floors_kib": [r for _, r in floors],
        "held_after_warmup": held,
        "fds_start": first["fds"],
        "fds_end": last["fds"],
        "fd_growth": last["fds"] - first["fds"],
        "max_pending_age_s": max_age,
        "unanswered": unanswered,
        "seq_repeats": totals.seq_repeats,
        "replay_check": replay,
    }


def log_problems(path: Path) -> dict[str, int]:
    counts = {"error_lines": 0, "tracebacks": 0}
    if not path.exists():
        return counts
    for line in path.read_text(errors="replace").splitlines():
        if re.search(r'"level": ?"(error|critical)"|\[error|\[critical', line):
            counts["error_lines"] += 1
        if "Traceback" in line or '"exception"' in line:
            counts["tracebacks"] += 1
    return counts


def verdict(report: dict[str, Any], args: argparse.Namespace) -> list[str]:
    failures = []
    if not report.get("daemon_alive", False):
        failures.append("the daemon died")
    if report["fd_growth"] > args.fd_slack:
        failures.append(f"file descriptors grew by {report['fd_growth']} (> {args.fd_slack})")
    if report["max_pending_age_s"] > args.max_pending_age:
        failures.append(
            f"a request waited {report['max_pending_age_s']:.1f} s (> {args.max_pending_age:g} s)"
        )
    if report["unanswered"]:
        failures.append(f"{report['unanswered']} requests never answered")
    if report["seq_repeats"]:
        failures.append(f"{report['seq_repeats']} updates repeated or out of order")
    check = report["replay_check"]
    if check["errors"]:
        failures.append(f"{check['errors']} open sessions could not be loaded at the end")
    if check["missing"] or check["unexpected"]:
        failures.append(
            f"replay differs from what clients saw: {check['missing']} missing, "
            f"{check['unexpected']} not recorded"
        )
    if report["log"]["tracebacks"]:
        failures.append(f"{report['log']['tracebacks']} tracebacks in the daemon's log")
    slope = report["rss_slope_kib_per_min"]
    long_enough = report["duration_s"] >= 60 * args.judge_rss_after
    if long_enough and slope is not None and slope > args.max_rss_slope:
        failures.append(f"RSS grows {slope:.1f} KiB/min (> {args.max_rss_slope:g})")
    return failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="acp-bridge-soak-"))
    work = tmp / "work"
    work.mkdir()
    args.work = str(work)
    config = tmp / "soak.toml"
    config.write_text(config_text(args.agents, args.chunk_delay, history_limit=args.history_limit))
    log = tmp / "daemon.log"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state")}
    argv_daemon = [sys.executable, "-m", "acp_bridge", "serve", "--config", str(config)]
    argv_daemon += ["--log-file", str(log), "--log-format", "json"]
    print(
        f"soak: {args.duration:g} s, {args.agents} agents, {args.sessions} sessions over "
        f"{args.clients} clients (work in {tmp})",
        file=sys.stderr,
    )
    stderr = tmp / "daemon.stderr"
    with stderr.open("wb") as sink:
        daemon = subprocess.Popen(
            argv_daemon, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink, env=env
        )
    try:
        deadline = time.monotonic() + 60
        while (
            m := re.search(rb"listening on ws://127\.0\.0\.1:(\d+)/acp", stderr.read_bytes())
        ) is None:
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(stderr.read_text(errors="replace"), file=sys.stderr)
                print("soak: the daemon did not start", file=sys.stderr)
                return 2
            time.sleep(0.05)
        port = int(m.group(1))
        report = trio.run(soak, args, daemon, port)
        report["daemon_alive"] = daemon.poll() is None
        report["log"] = log_problems(log)
        report["log"]["stderr_tracebacks"] = stderr.read_text(errors="replace").count("Traceback")
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    failures = verdict(report, args)
    report["ok"] = not failures
    report["failures"] = failures
    report["daemon_exit_status"] = daemon.returncode
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    if report["ok"]:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"soak: kept {tmp} (config, daemon log)", file=sys.stderr)
    return 0 if report["ok"] else 1


def print_report(report: dict[str, Any]) -> None:
    slope = report["rss_slope_kib_per_min"]
    counts = report["counts"]
    lines = [
        f"soak: {report['duration_s']} s, {report['agents']} agents, {report['sessions']} "
        f"sessions, {report['clients']} clients",
        f"  traffic: {counts.get('updates', 0)} updates, "
        f"{sum(v for k, v in counts.items() if k.startswith('prompt'))} prompts, "
        f"{counts.get('cancels', 0)} cancels, {counts.get('permissions_answered', 0)} "
        f"permissions answered, {counts.get('reconnects', 0)} reconnects, "
        f"{counts.get('loads', 0)} loads",
        f"  RSS: {report['rss_start_kib']} -> {report['rss_end_kib']} KiB, slope "
        + ("n/a" if slope is None else f"{slope:+.1f} KiB/min")
        + " (after warm-up); lowest of each minute after it: "
        + (", ".join(str(r) for r in report["rss_minute_floors_kib"]) or "n/a")
        + " KiB",
        "  held by the daemon (after warm-up; first -> last [least..most], slope per minute): "
        + (
            "; ".join(
                f"{key} {v['first']} -> {v['last']} [{v['min']}..{v['max']}], "
                + ("n/a" if v["slope_per_min"] is None else f"{v['slope_per_min']:+.1f}")
                for key, v in report["held_after_warmup"].items()
            )
            or "n/a"
        ),
        f"  FDs: {report['fds_start']} -> {report['fds_end']}",
        f"  oldest pending request: {report['max_pending_age_s']:.2f} s; never answered: "
        f"{report['unanswered']}; lost with a dropped connection: "
        f"{counts.get('in_flight_at_drop', 0)} in flight, {counts.get('unsent_at_drop', 0)} "
        "sent after it",
        f"  updates repeated/out of order: {report['seq_repeats']}; replay check: "
        f"{report['replay_check']}",
        f"  daemon log: {report['log']}",
        "  verdict: " + ("OK" if report["ok"] else "FAILED: " + "; ".join(report["failures"])),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
