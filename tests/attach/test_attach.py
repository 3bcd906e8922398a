"""`acp-bridge attach`: the editor's stdio ↔ one WebSocket, repaired across drops.

The shim runs in-process against a test WebSocket server that runs the real bridge core over
fake agents. The server listens on 127.0.0.1 (real sockets), or is reached through memory
streams where the autojump clock drives time (give-up, keepalive). A connector between the
two can hold connection attempts (a gate), refuse them, or freeze a connection.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing
import trio_websocket

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.attach.core import AttachCore, Backoff, Phase
from acp_bridge.config.model import WebSocketConfig
from acp_bridge.engine.bridge import Bridge
from acp_bridge.faces.attach import (
    CLOSE_TIMEOUT,
    attach,
    check_url,
    websocket_connector,
)
from acp_bridge.faces.serve import serve_websocket
from acp_bridge.faces.token import TokenError
from acp_bridge.protocol.jsonrpc import dumps, loads
from tests.support.fakes import FakeAgent, TestClient, connect, make_config

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

TOKEN = "attach-test-token-" + "t" * 32
TIMEOUT = 15
FAST = Backoff(initial=0.01, maximum=0.05)


# -- a WebSocket server around the real bridge core -----------------------------------------


@attrs.define(eq=False)
class ServerConn:
    """One accepted connection, as the server sees it."""

    stream: trio.abc.Stream
    received: list[dict[str, Any]] = attrs.field(factory=list)
    done: trio.Event = attrs.field(factory=trio.Event)
    close_code: int | None = None

    async def drop(self) -> None:
        """Close the socket under the connection: no closing handshake, as a crash would."""
        await self.stream.aclose()


class WsServer:
    """`serve` in miniature: token check, one bridge client per connection."""

    def __init__(self, bridge: Bridge, nursery: trio.Nursery) -> None:
        self.bridge = bridge
        self.nursery = nursery
        self.port = 0
        self.connections: list[ServerConn] = []
        self.changed = trio.Event()
        self._ids = itertools.count(1)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    def kick(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_until(self, predicate) -> None:
        while not predicate():
            await self.changed.wait()

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await self._handle(nursery, stream)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _handle(self, nursery: trio.Nursery, stream: trio.abc.Stream) -> None:
        request = await trio_websocket.wrap_server_stream(nursery, stream)
        headers = {name.lower(): value for name, value in request.headers}
        if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
            await request.reject(401)
            return
        n = next(self._ids)
        ws = await request.accept(extra_headers=[(b"Acp-Connection-Id", f"c{n}".encode())])
        conn = ServerConn(stream)
        self.connections.append(conn)
        self.kick()
        client = self.bridge.open_client(f"ws{n}", blocking=False)
        try:
            async with trio.open_nursery() as inner:
                inner.start_soon(self._pump, client, ws)
                with contextlib.suppress(trio_websocket.ConnectionClosed):
                    while True:
                        text = await ws.get_message()
                        conn.received.append(json.loads(text))
                        await self.bridge.handle_client_line(client, text.encode())
                inner.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.bridge.close_client(client, "connection lost")
            conn.close_code = ws.closed.code if ws.closed is not None else None
            conn.done.set()
            self.kick()

    async def _pump(self, client, ws) -> None:
        async def send_each(batch: list[bytes]) -> None:
            for data in batch:
                await ws.send_message(data[:-1].decode())

        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await client.pump_batches(send_each)


@contextlib.asynccontextmanager
async def open_server(agents: dict[str, FakeAgent], **bridge: Any) -> AsyncIterator[WsServer]:
    config = make_config(agents, **bridge)
    async with trio.open_nursery() as nursery:
        b: Bridge = await nursery.start(Bridge(config, make_in_process_launcher(dict(agents))).run)
        server = WsServer(b, nursery)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        await nursery.start(trio.serve_listeners, server.handle_stream, listeners)
        server.port = listeners[0].socket.getsockname()[1]
        yield server
        nursery.cancel_scope.cancel()


class Freezable(trio.abc.HalfCloseableStream):
    """The shim's end of a memory connection; frozen, nothing more gets through either way."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.frozen = False

    async def send_all(self, data) -> None:
        while self.frozen:
            await trio.sleep_forever()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes=None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        while self.frozen:
            await trio.sleep_forever()
        return data

    async def aclose(self) -> None:
        if not self.frozen:  # a partitioned network does not carry the FIN either
            await self.inner.aclose()


class Connector:
    """The shim's way to the server: can hold attempts (gate), refuse them, or freeze one."""

    def __init__(self, server: WsServer, *, memory: bool = False, token: str = TOKEN) -> None:
        self.server = server
        self.memory = memory
        self.token = token
        self.attempts = 0
        self.times: list[float] = []
        self.gate: trio.Event | None = None
        self.refuse = False
        self.streams: list[Freezable] = []

    def __call__(self):
        return self._open()

    @contextlib.asynccontextmanager
    async def _open(self):
        self.attempts += 1
        self.times.append(trio.current_time())
        self.server.kick()
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse:
            raise OSError(errno.ECONNREFUSED, "Connection refused")
        open_stream = self._memory_stream if self.memory else None
        async with websocket_connector(self.url, self.token, open_stream=open_stream)() as ws:
            yield ws

    @property
    def url(self) -> str:
        return self.server.url if not self.memory else "ws://127.0.0.1:8765/acp"

    async def _memory_stream(self) -> trio.abc.Stream:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        stream = Freezable(client_stream)
        self.streams.append(stream)
        self.server.nursery.start_soon(self.server.handle_stream, server_stream)
        return stream


@attrs.define(eq=False)
class Shim:
    core: AttachCore
    editor: TestClient
    editor_stream: trio.abc.HalfCloseableStream
    done: trio.Event = attrs.field(factory=trio.Event)
    status: int | None = None

    async def end_input(self) -> None:
        await self.editor_stream.send_eof()


async def start_shim(
    nursery: trio.Nursery, connector: Connector, *, agent: str | None = None, **options: Any
) -> Shim:
    """`attach` in-process: the editor is a TestClient on memory streams."""
    editor_side, shim_side = trio.testing.memory_stream_pair()
    shim = Shim(AttachCore(agent=agent), TestClient(editor_side), editor_side)
    options.setdefault("backoff", FAST)
    options.setdefault("jitter", lambda: 0.0)

    async def run() -> None:
        shim.status = await attach(shim_side, shim_side, connector, core=shim.core, **options)
        shim.done.set()

    nursery.start_soon(run)
    nursery.start_soon(shim.editor.read_loop)
    return shim


def wait_params(sid: str) -> dict[str, Any]:
    return {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}


def mentions(text: str):
    return lambda m: text in json.dumps(m)


def errors(client: TestClient) -> list[dict[str, Any]]:
    return [m for m in client.received if "error" in m]


# -- relaying -----------------------------------------------------------------------------------


async def test_relays_a_full_turn_and_closes_cleanly_at_end_of_input():
    """Initialize (seq opted in, editor _meta kept), session, prompt, permission; EOF → exit 0."""
    a = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            shim = await start_shim(nursery, Connector(server))
            editor = shim.editor
            init = await editor.call(
                "initialize",
                {"protocolVersion": 1, "clientCapabilities": {}, "_meta": {"zed": {"x": 1}}},
            )
            assert init["protocolVersion"] == 1
            sent = server.connections[0].received[0]
            assert sent["params"]["_meta"] == {
                "zed": {"x": 1},
                "acp_bridge": {"seq": True, "log": "info"},
            }
            sid = await editor.new_session()
            response = await editor.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "count 3"}]},
                id="p-1",
            )
            assert response == {"jsonrpc": "2.0", "id": "p-1", "result": {"stopReason": "end_turn"}}
            assert editor.updates(sid) == ["a:s1:0", "a:s1:1", "a:s1:2"]
            assert editor.seqs(sid) == sorted(set(editor.seqs(sid)))

            nursery.start_soon(editor.prompt, sid, "permission")
            ask = await editor.agent_requests.receive()
            assert ask["method"] == "session/request_permission"
            await editor.send(
                {
                    "jsonrpc": "2.0",
                    "id": ask["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            )
            await editor.wait_for(mentions("a:outcome:yes"))
            assert errors(editor) == []

            await shim.end_input()
            await shim.done.wait()
            assert shim.status == 0
            await server.connections[0].done.wait()
            assert server.connections[0].close_code == 1000
            assert len(server.connections) == 1
            nursery.cancel_scope.cancel()


async def test_attach_survives_the_server_dropping_the_socket_mid_turn():
    """
    The acceptance case: the socket dies mid-turn while the agent keeps going; the editor's
    stream continues with every update once, in order, then the answer under its own id.
    """
    a = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            connector = Connector(server)
            shim = await start_shim(nursery, connector)
            editor = shim.editor
            await editor.initialize()
            sid = await editor.new_session()
            await editor.prompt(sid, "count 2")
            nursery.start_soon(
                functools.partial(editor.request, "session/prompt", wait_params(sid), id="turn")
            )
            await editor.wait_for(mentions("a:s1:waiting"))
            last_seen = editor.seqs(sid)[-1]

            first = server.connections[0]
            connector.gate = trio.Event()
            await first.drop()
            await first.done.wait()
            assert server.bridge.hub.sessions.get(sid).client is None  # detached, still alive
            await a.update("s1", "while-away-1")
            await a.update("s1", "while-away-2")
            await server.wait_until(lambda: connector.attempts == 2)
            connector.gate.set()

            await editor.wait_for(mentions("while-away-2"))
            await a.update("s1", "live-again")
            await editor.wait_for(mentions("live-again"))
            await editor.notify("session/cancel", {"sessionId": sid})
            answer = await editor.wait_for(lambda m: m.get("id") == "turn")
            assert answer["result"] == {"stopReason": "cancelled"}

            assert editor.updates(sid) == [
                "a:s1:0",
                "a:s1:1",
                "a:s1:waiting",
                "while-away-1",
                "while-away-2",
                "live-again",
            ]
            seqs = editor.seqs(sid)
            assert seqs == sorted(set(seqs))
            assert errors(editor) == []
            # The shim's own initialize answer was not passed on.
            assert len([m for m in editor.received if "agentCapabilities" in str(m)]) == 1

            second = server.connections[1]
            init, load = second.received[:2]
            assert init["method"] == "initialize"
            assert init["params"]["_meta"]["acp_bridge"]["seq"] is True
            assert load["method"] == "session/load"
            assert load["params"]["sessionId"] == sid
            assert load["params"]["_meta"] == {
                "acp_bridge": {"after_seq": last_seen, "journal_replay": True}
            }
            assert isinstance(load["id"], str)
            assert load["id"].startswith("acp-bridge-attach:")
            nursery.cancel_scope.cancel()


async def test_messages_sent_during_the_outage_go_out_after_the_sessions_are_back():
    a = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            connector = Connector(server)
            shim = await start_shim(nursery, connector)
            editor = shim.editor
            await editor.initialize()
            sid = await editor.new_session()
            connector.gate = trio.Event()
            await server.connections[0].drop()
            await server.wait_until(lambda: connector.attempts == 2)
            async with trio.open_nursery() as outage:
                outage.start_soon(editor.prompt, sid, "count 2")
                await trio.testing.wait_all_tasks_blocked()
                outage.start_soon(editor.request, "_acp_bridge/agents", {})
                await trio.testing.wait_all_tasks_blocked()
                assert shim.core.statistics().held_messages == 2
                assert shim.core.phase is Phase.OFFLINE
                connector.gate.set()
            assert editor.updates(sid) == ["a:s1:0", "a:s1:1"]
            assert errors(editor) == []
            methods = [m.get("method") for m in server.connections[1].received]
            assert methods == [
                "initialize",
                "session/load",
                "session/prompt",
                "_acp_bridge/agents",
            ]
            nursery.cancel_scope.cancel()


async def test_a_permission_request_open_across_a_reconnect_keeps_its_id():
    """The bridge shows it again under a new id; the editor sees it once, and its answer lands."""
    a = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            connector = Connector(server)
            shim = await start_shim(nursery, connector)
            editor = shim.editor
            await editor.initialize()
            sid = await editor.new_session()
            nursery.start_soon(
                functools.partial(
                    editor.request,
                    "session/prompt",
                    {"sessionId": sid, "prompt": [{"type": "text", "text": "permission"}]},
                    id="turn",
                )
            )
            ask = await editor.agent_requests.receive()
            connector.gate = trio.Event()
            await server.connections[0].drop()
            await server.connections[0].done.wait()
            # Answered while the bridge is out of reach: held, then sent to whoever asks now.
            await editor.send(
                {
                    "jsonrpc": "2.0",
                    "id": ask["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            )
            connector.gate.set()
            answer = await editor.wait_for(lambda m: m.get("id") == "turn")
            assert answer["result"] == {"stopReason": "end_turn"}
            assert editor.updates(sid) == ["a:outcome:yes"]
            asked = [m for m in editor.received if m.get("method") == "session/request_permission"]
            assert asked == [ask]
            assert errors(editor) == []
            nursery.cancel_scope.cancel()


async def test_an_editor_that_watches_a_session_comes_back_as_a_watcher_after_a_drop():
    """The editor watches (``_meta.acp_bridge.watch``, with ``approve``) a session another
    connection owns; the socket drops: the shim takes the session back as a watcher with the
    same flags, after the last update the editor saw, never as its owner."""
    a = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            owner = await connect(server.bridge, nursery, name="owner")
            sid = await owner.new_session()
            await owner.prompt(sid, "count 2")
            shim = await start_shim(nursery, Connector(server))
            editor = shim.editor
            await editor.initialize()
            ours = {"watch": True, "approve": True}
            result = await editor.call(
                "session/load",
                {"sessionId": sid, "cwd": "/w", "mcpServers": [], "_meta": {"acp_bridge": ours}},
            )
            assert result["_meta"]["acp_bridge"]["watch"] is True
            assert editor.updates(sid) == ["a:s1:0", "a:s1:1"]
            await owner.prompt(sid, "count 1")
            await editor.wait_for(lambda m: len(editor.updates(sid)) == 3)
            last_seen = editor.seqs(sid)[-1]
            first = server.connections[0]
            await first.drop()
            await first.done.wait()
            await owner.prompt(sid, "count 2")  # (while the watcher is away)
            await server.wait_until(lambda: len(server.connections) == 2)
            await editor.wait_for(lambda m: len(editor.updates(sid)) == 5)
            assert editor.updates(sid) == ["a:s1:0", "a:s1:1", "a:s1:0", "a:s1:0", "a:s1:1"]
            load = server.connections[1].received[1]
            assert load["method"] == "session/load"
            assert load["params"]["_meta"]["acp_bridge"] == {
                "after_seq": last_seen,
                "watch": True,
                "approve": True,
            }
            # The owner still owns it; the editor watches, and may not prompt.
            session = server.bridge.hub.sessions.get(sid)
            assert session is not None
            assert session.client is not None
            assert session.client.name == "owner"
            assert len(session.watchers or ()) == 1
            assert (await owner.prompt(sid, "count 1"))["result"]["stopReason"] == "end_turn"
            refused = await editor.prompt(sid, "count 1")
            assert refused["error"]["code"] == -32002
            nursery.cancel_scope.cancel()


async def test_agent_option_selects_the_agent_of_new_sessions_that_name_none():
    a, b = FakeAgent("a"), FakeAgent("b", prefix="t")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": a, "b": b}) as server, trio.open_nursery() as nursery:
            shim = await start_shim(nursery, Connector(server), agent="b")
            editor = shim.editor
            await editor.initialize()
            assert await editor.new_session() == "t1"
            assert await editor.new_session(agent="a") == "s1"
            assert server.bridge.hub.sessions.get("t1").agent == "b"
            assert server.bridge.hub.sessions.get("s1").agent == "a"
            news = [m for m in server.connections[0].received if m["method"] == "session/new"]
            assert [m["params"]["_meta"]["acp_bridge"]["agent"] for m in news] == ["b", "a"]
            nursery.cancel_scope.cancel()


class Relay:
    """A TCP relay in front of a daemon: ``cut()`` breaks the connection through it."""

    def __init__(self) -> None:
        self.target_port = 0
        self.cutting = False
        self.links: list[tuple[trio.SocketStream, trio.SocketStream, trio.CancelScope]] = []

    async def handle(self, downstream: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        try:
            async with trio.open_nursery() as nursery:
                self.links.append((downstream, upstream, nursery.cancel_scope))
                nursery.start_soon(self._pipe, downstream, upstream)
                nursery.start_soon(self._pipe, upstream, downstream)
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(downstream)
                if not self.cutting:  # cut() closes it once the daemon has let go
                    await trio.aclose_forcefully(upstream)

    @staticmethod
    async def _pipe(source: trio.SocketStream, sink: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some(65536):
                await sink.send_all(data)

    async def cut(self) -> None:
        """Drop the latest connection both ways; return once the daemon has let go of it."""
        downstream, upstream, scope = self.links[-1]
        self.cutting = True
        scope.cancel()
        await downstream.aclose()
        await upstream.send_eof()
        with contextlib.suppress(trio.BrokenResourceError):
            while await upstream.receive_some(65536):
                pass  # the daemon closes its end after it has detached the sessions
        await upstream.aclose()
        self.cutting = False


async def test_attach_survives_a_cut_through_the_real_websocket_face():
    """The same acceptance case against `serve`'s own WebSocket face (`serve_websocket`)."""
    a = FakeAgent("a")
    relay = Relay()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            relay_port = listeners[0].socket.getsockname()[1]
            await nursery.start(trio.serve_listeners, relay.handle, listeners)
            settings = WebSocketConfig(
                port=0, token=TOKEN, allowed_hosts=(f"127.0.0.1:{relay_port}",)
            )
            config = attrs.evolve(make_config({"a": a}), websocket=settings)
            bridge = await nursery.start(Bridge(config, make_in_process_launcher({"a": a})).run)
            info = await nursery.start(functools.partial(serve_websocket, bridge, config))
            relay.target_port = info.port
            url = f"ws://127.0.0.1:{relay_port}/acp"
            gate = trio.Event()
            gate.set()

            @contextlib.asynccontextmanager
            async def connect():
                await gate.wait()
                async with websocket_connector(url, TOKEN)() as ws:
                    yield ws

            editor_side, shim_side = trio.testing.memory_stream_pair()
            nursery.start_soon(
                functools.partial(attach, shim_side, shim_side, connect, backoff=FAST)
            )
            editor = TestClient(editor_side)
            nursery.start_soon(editor.read_loop)
            await editor.initialize()
            sid = await editor.new_session()
            nursery.start_soon(
                functools.partial(editor.request, "session/prompt", wait_params(sid), id=7)
            )
            await editor.wait_for(mentions("a:s1:waiting"))
            gate = trio.Event()
            await relay.cut()
            assert bridge.hub.sessions.get(sid).client is None
            await a.update("s1", "while-away")
            gate.set()
            await editor.wait_for(mentions("while-away"))
            await editor.notify("session/cancel", {"sessionId": sid})
            answer = await editor.wait_for(lambda m: m.get("id") == 7)
            assert answer["result"] == {"stopReason": "cancelled"}
            assert editor.updates(sid) == ["a:s1:waiting", "while-away"]
            assert errors(editor) == []
            assert len(relay.links) == 2
            nursery.cancel_scope.cancel()


async def test_end_of_input_while_connecting_exits_at_once():
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server, trio.open_nursery() as nursery:
            connector = Connector(server)
            connector.gate = trio.Event()  # never opens
            shim = await start_shim(nursery, connector)
            await server.wait_until(lambda: connector.attempts == 1)
            await shim.end_input()
            await shim.done.wait()
            assert shim.status == 0
            assert server.connections == []
            nursery.cancel_scope.cancel()


async def test_requests_piped_in_before_end_of_input_are_still_answered():
    """A script writes its requests, closes its end, and reads the answers (within LINGER)."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server, trio.open_nursery() as nursery:
            connector = Connector(server)
            connector.gate = trio.Event()
            shim = await start_shim(nursery, connector)
            editor = shim.editor
            await editor.send(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": 1},
                }
            )
            await editor.send(
                {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/w"}}
            )
            await shim.end_input()
            await server.wait_until(lambda: connector.attempts == 1)
            connector.gate.set()
            await shim.done.wait()
            assert shim.status == 0
            answered = {m["id"]: m for m in editor.received if "id" in m}
            assert answered[2]["result"]["sessionId"] == "s1"
            assert 1 in answered
            await server.connections[0].done.wait()
            assert server.connections[0].close_code == 1000
            nursery.cancel_scope.cancel()


# -- giving up, refusals, keepalive -----------------------------------------------------------


async def test_gives_up_after_reconnect_for_and_answers_every_waiting_request(autojump_clock):
    a = FakeAgent("a")
    with trio.fail_after(600):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            connector = Connector(server, memory=True)
            shim = await start_shim(nursery, connector, reconnect_for=30.0, backoff=Backoff())
            editor = shim.editor
            await editor.initialize()
            sid = await editor.new_session()
            nursery.start_soon(
                functools.partial(editor.request, "session/prompt", wait_params(sid), id="turn")
            )
            await editor.wait_for(mentions("waiting"))
            connector.refuse = True
            dropped_at = trio.current_time()
            await server.connections[0].drop()
            held = await editor.request("_acp_bridge/agents", {})
            assert held["error"]["code"] == -32603
            assert held["error"]["message"].startswith("bridge unreachable")
            await shim.done.wait()
            assert shim.status == 1
            assert 30.0 <= trio.current_time() - dropped_at < 30.01
            turn = next(m for m in editor.received if m.get("id") == "turn")
            assert turn["error"]["code"] == -32603
            assert "Connection refused" in turn["error"]["message"]
            # Bounded exponential backoff: the gaps grow, up to the cap.
            assert connector.times[1] - dropped_at == pytest.approx(0.05)
            gaps = [b - a for a, b in itertools.pairwise(connector.times[1:])]
            assert gaps[:6] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.5])
            assert max(gaps) == pytest.approx(2.5)  # the cap, 5 s, with the jitter at 0
            assert len(connector.times) < 25
            nursery.cancel_scope.cancel()


async def test_a_refused_token_is_final_and_reported_to_the_editor():
    """401: no retry storm; the waiting initialize gets the reason, the exit status is 1."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server, trio.open_nursery() as nursery:
            connector = Connector(server, token="wrong-token")
            connector.gate = trio.Event()
            shim = await start_shim(nursery, connector)
            nursery.start_soon(shim.editor.request, "initialize", {"protocolVersion": 1})
            await trio.testing.wait_all_tasks_blocked()
            assert shim.core.statistics().held_messages == 1
            connector.gate.set()
            await shim.done.wait()
            assert shim.status == 1
            assert connector.attempts == 1
            (refused,) = [m for m in shim.editor.received if "id" in m]
            assert refused["error"]["code"] == -32603
            assert "HTTP 401" in refused["error"]["message"]
            assert "token" in refused["error"]["message"]
            assert server.connections == []
            nursery.cancel_scope.cancel()


async def test_a_connection_that_stops_answering_pings_is_replaced(autojump_clock):
    a = FakeAgent("a")
    with trio.fail_after(600):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            connector = Connector(server, memory=True)
            shim = await start_shim(nursery, connector, ping_interval=5.0, ping_timeout=5.0)
            editor = shim.editor
            await editor.initialize()
            sid = await editor.new_session()
            frozen_at = trio.current_time()
            connector.streams[0].frozen = True
            await server.wait_until(lambda: len(server.connections) == 2)
            # A ping at 5 s, no pong by 10 s; a closing handshake gets CLOSE_TIMEOUT more.
            assert trio.current_time() - frozen_at <= 10.0 + CLOSE_TIMEOUT + 0.05
            response = await editor.prompt(sid, "count 1")
            assert response["result"] == {"stopReason": "end_turn"}
            assert editor.updates(sid) == ["a:s1:0"]
            assert errors(editor) == []
            nursery.cancel_scope.cancel()


# -- answers that come while the editor is away -------------------------------------------


async def test_a_turn_that_ends_while_disconnected_is_answered_after_reattach(autojump_clock):
    """The bridge keeps the answer for the detached session and gives it to the shim's load."""
    a = FakeAgent("a")
    with trio.fail_after(600):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            connector = Connector(server, memory=True)
            shim = await start_shim(nursery, connector)
            editor = shim.editor
            await editor.initialize()
            sid = await editor.new_session()
            nursery.start_soon(
                functools.partial(editor.request, "session/prompt", wait_params(sid), id="turn")
            )
            await editor.wait_for(mentions("waiting"))
            connector.gate = trio.Event()
            await server.connections[0].drop()
            await server.connections[0].done.wait()
            a._cancel_events["s1"].set()  # the turn ends while nobody is attached
            await trio.testing.wait_all_tasks_blocked()
            connector.gate.set()
            answer = await editor.wait_for(lambda m: m.get("id") == "turn")
            assert answer["result"] == {"stopReason": "cancelled"}
            assert errors(editor) == []
            nursery.cancel_scope.cancel()


async def test_a_running_prompt_is_answered_after_a_silent_network_failure(autojump_clock):
    """
    Half-open: the daemon still holds the old connection when the shim comes back, so the
    shim's load takes the session over, and the running prompt moves with it.
    """
    a = FakeAgent("a")
    with trio.fail_after(600):
        async with open_server({"a": a}) as server, trio.open_nursery() as nursery:
            connector = Connector(server, memory=True)
            shim = await start_shim(nursery, connector, ping_interval=5.0, ping_timeout=5.0)
            editor = shim.editor
            await editor.initialize()
            sid = await editor.new_session()
            nursery.start_soon(
                functools.partial(editor.request, "session/prompt", wait_params(sid), id="turn")
            )
            await editor.wait_for(mentions("waiting"))
            connector.streams[0].frozen = True
            await server.wait_until(lambda: len(server.connections) == 2)
            await trio.testing.wait_all_tasks_blocked()
            assert shim.core.phase is Phase.LIVE
            await editor.notify("session/cancel", {"sessionId": sid})
            answer = await editor.wait_for(lambda m: m.get("id") == "turn")
            assert answer["result"] == {"stopReason": "cancelled"}
            assert errors(editor) == []
            nursery.cancel_scope.cancel()


# -- the core, without I/O -------------------------------------------------------------------


def feed(core: AttachCore, msg: dict[str, Any]) -> list[dict[str, Any]]:
    return [loads(line) for line in core.from_editor(dumps(msg)[:-1])]


def drain(core: AttachCore) -> list[dict[str, Any]]:
    out = []
    while (item := core.next_for_bridge()) is not None:
        core.sent(item)
        out.append(json.loads(item.text))
    return out


def bridge_says(core: AttachCore, msg: dict[str, Any]) -> list[dict[str, Any]]:
    return [loads(line) for line in core.from_bridge(dumps(msg)[:-1].decode())]


def test_core_holds_while_offline_and_refuses_past_the_bound():
    """Full while unreachable: requests get -32603 "bridge unreachable", the rest is dropped."""
    core = AttachCore(held_messages=2)
    assert feed(core, {"jsonrpc": "2.0", "id": 1, "method": "session/list"}) == []
    assert feed(core, {"jsonrpc": "2.0", "method": "session/cancel", "params": {}}) == []
    refused = feed(core, {"jsonrpc": "2.0", "id": "x", "method": "session/list"})
    assert refused == [
        {"jsonrpc": "2.0", "id": "x", "error": {"code": -32603, "message": "bridge unreachable"}}
    ]
    assert feed(core, {"jsonrpc": "2.0", "method": "session/cancel", "params": {}}) == []
    assert core.statistics().held_messages == 2
    assert core.statistics().pending_requests == 1
    assert core.next_for_bridge() is None  # nothing goes out before a connection is live


def test_core_reinitializes_and_reloads_with_ids_of_its_own():
    core = AttachCore(agent="b", nonce="n")
    core.connection_opened()
    feed(
        core,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": 1, "_meta": {"acp_bridge": {"other": 1}}},
        },
    )
    feed(core, {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/w"}})
    init, new = drain(core)
    # It asks for the bridge's diagnostics, which it relays (at info: the editor named none).
    assert init["params"]["_meta"] == {"acp_bridge": {"other": 1, "seq": True, "log": "info"}}
    assert new["params"]["_meta"] == {"acp_bridge": {"agent": "b"}}
    bridge_says(core, {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 1}})
    bridge_says(core, {"jsonrpc": "2.0", "id": 2, "result": {"sessionId": "s1"}})
    update = {"sessionId": "s1", "update": {}, "_meta": {"acp_bridge": {"seq": 7}}}
    bridge_says(core, {"jsonrpc": "2.0", "method": "session/update", "params": update})

    core.connection_lost()
    assert core.connection_opened() == []
    (reinit,) = drain(core)
    assert reinit["id"] == "acp-bridge-attach:n:1"
    assert bridge_says(core, {"jsonrpc": "2.0", "id": reinit["id"], "result": {}}) == []
    (load,) = drain(core)
    assert load == {
        "jsonrpc": "2.0",
        "id": "acp-bridge-attach:n:2",
        "method": "session/load",
        "params": {
            "sessionId": "s1",
            "mcpServers": [],
            "cwd": "/w",
            "_meta": {"acp_bridge": {"agent": "b", "after_seq": 7, "journal_replay": True}},
        },
    }
    assert core.phase is Phase.ATTACHING
    trimmed = {"_meta": {"acp_bridge": {"lastSeq": 9, "complete": False}}}
    (warning,) = bridge_says(core, {"jsonrpc": "2.0", "id": load["id"], "result": trimmed})
    assert warning["method"] == "_acp_bridge/log"
    assert warning["params"]["level"] == "warning"
    assert "resync required" in warning["params"]["data"]["message"]
    assert core.phase is Phase.LIVE
    assert core.sessions["s1"].last_seq == 9


def test_core_keeps_the_log_level_the_editor_asked_for():
    core = AttachCore(nonce="n")
    core.connection_opened()
    params = {"protocolVersion": 1, "_meta": {"acp_bridge": {"log": "error"}}}
    feed(core, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
    (init,) = drain(core)
    assert init["params"]["_meta"] == {"acp_bridge": {"log": "error", "seq": True}}


def test_core_answers_requests_lost_with_their_connection():
    """What the bridge will not answer on the new connection gets an error; prompts wait."""
    core = AttachCore(nonce="n")
    core.connection_opened()
    feed(core, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": 1, "result": {}})
    feed(core, {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/w"}})
    drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": 2, "result": {"sessionId": "s1"}})
    feed(
        core, {"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": "s1"}}
    )
    feed(core, {"jsonrpc": "2.0", "id": 4, "method": "session/new", "params": {"cwd": "/w"}})
    drain(core)
    core.connection_lost()
    core.connection_opened()
    (reinit,) = drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": reinit["id"], "result": {}})
    (load,) = drain(core)
    out = bridge_says(core, {"jsonrpc": "2.0", "id": load["id"], "result": {}})
    assert [(m["id"], m["error"]["code"]) for m in out] == [(4, -32603)]
    assert core.statistics().pending_requests == 1  # the prompt: answered on this connection


def test_core_withdraws_a_question_the_bridge_does_not_ask_again():
    """Settled while we were away: after the barrier, the editor is told to drop it."""
    core = AttachCore(nonce="n")
    core.connection_opened()
    feed(core, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": 1, "result": {}})
    ask = {"jsonrpc": "2.0", "id": 5, "method": "fs/read_text_file", "params": {"path": "/a"}}
    (shown,) = bridge_says(core, ask)
    assert shown["id"] == 1  # our id, not the bridge's
    core.connection_lost()
    core.connection_opened()
    (reinit,) = drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": reinit["id"], "result": {}})
    (barrier,) = drain(core)
    assert barrier["method"] == "_acp_bridge/agents"
    withdrawn = bridge_says(core, {"jsonrpc": "2.0", "id": barrier["id"], "result": {}})
    assert withdrawn == [
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}}
    ]
    assert feed(core, {"jsonrpc": "2.0", "id": 1, "result": {"content": "late"}}) == []
    assert drain(core) == []  # the late answer goes nowhere


def test_backoff_doubles_to_its_cap_with_jitter_between_half_and_all():
    backoff = Backoff(initial=0.1, maximum=5.0)
    assert [backoff.delay(n, 0.999999) for n in range(8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0], rel=1e-5
    )
    assert backoff.delay(3, 0.0) == pytest.approx(0.4)
    assert backoff.delay(10_000, 0.5) == pytest.approx(3.75)


# -- the command line ----------------------------------------------------------------------------


def test_only_websocket_urls_are_accepted():
    assert check_url("wss://example.org:443/acp") == "wss://example.org:443/acp"
    with pytest.raises(TokenError, match="not a WebSocket URL"):
        check_url("http://127.0.0.1:8765/acp")
