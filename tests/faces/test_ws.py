"""The WebSocket face: handshake security, framing rules, keepalive, health, and SDK interop.

Handshake tests speak raw HTTP over a real loopback socket, so they see the exact status
line and that nothing else came. Timed tests (keepalive, idle, a client that stops reading)
serve one connection over in-memory streams with the autojump clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib.util
import itertools
import json
import re
from typing import TYPE_CHECKING, Any

import acp
import attrs
import pytest
import trio
import trio.testing
import trio_websocket
import wsproto
import wsproto.events as ev
from acp.schema import ClientCapabilities, FileSystemCapabilities

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.config.model import ConfigError, WebSocketConfig, load_config
from acp_bridge.engine.bridge import Bridge
from acp_bridge.faces.handshake import text_frames
from acp_bridge.faces.serve import ListenInfo, serve_websocket
from acp_bridge.faces.ws import HANDSHAKE_EVICT_AGE, WebSocketFace, _ReplayStream
from acp_bridge.http.wire import MAX_HEAD_BYTES
from acp_bridge.protocol.jsonrpc import JsonRpcError
from tests.support.fakes import FakeAgent, make_config
from tests.support.peers.sdk_client import RecordingClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from acp_bridge.observe.trace import WireTrace

TOKEN = "test-token-" + "k" * 32
AUTH = f"Authorization: Bearer {TOKEN}"
AUTH_HEADERS = [(b"Authorization", f"Bearer {TOKEN}".encode())]
#: a token of the same shape, as another daemon would have generated
OTHER_TOKEN = "test-token-" + "q" * 32
MEMORY_PORT = 8765  # the port a face serving memory streams believes it listens on
TIMEOUT = 15


def ws_config(agents: dict[str, FakeAgent], *, bridge: dict[str, Any] | None = None, **ws: Any):
    settings = {"port": 0, "token": TOKEN, **ws}
    return attrs.evolve(
        make_config(agents, **(bridge or {})), websocket=WebSocketConfig(**settings)
    )


@attrs.define
class Server:
    bridge: Bridge
    info: ListenInfo

    @property
    def port(self) -> int:
        return self.info.port


@contextlib.asynccontextmanager
async def open_server(
    agents: dict[str, FakeAgent],
    *,
    bridge: dict[str, Any] | None = None,
    tracer: WireTrace | None = None,
    **ws: Any,
) -> AsyncIterator[Server]:
    """A bridge over in-process fake agents, served on 127.0.0.1 at a free port."""
    config = ws_config(agents, bridge=bridge, **ws)
    launcher = make_in_process_launcher(dict(agents))
    async with trio.open_nursery() as nursery:
        b: Bridge = await nursery.start(Bridge(config, launcher, tracer=tracer).run)
        info: ListenInfo = await nursery.start(functools.partial(serve_websocket, b, config))
        yield Server(b, info)
        nursery.cancel_scope.cancel()


@attrs.frozen
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def upgrade_request(port: int, *, target: str = "/acp", host: str | None = None, extra=()) -> bytes:
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {host if host is not None else f'127.0.0.1:{port}'}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def http_exchange(port: int, request: bytes) -> HttpResponse:
    """Send raw bytes; read the response head, then (unless 101) everything up to EOF."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            assert chunk, f"connection closed before a response head: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, status, _ = status_line.split(" ", 2)
        assert version == "HTTP/1.1"
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if int(status) != 101:
            while chunk := await stream.receive_some(65536):
                body += chunk
        return HttpResponse(int(status), headers, body)


def get_request(port: int, target: str, *, method: str = "GET", host: str | None = None) -> bytes:
    host = host if host is not None else f"127.0.0.1:{port}"
    return f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


class WsPeer:
    """A JSON-RPC client over a trio-websocket connection, one task, no background reader."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.received: list[dict[str, Any]] = []

    async def send(self, msg: Any) -> None:
        await self.ws.send_message(json.dumps(msg))

    async def next(self) -> dict[str, Any]:
        msg = json.loads(await self.ws.get_message())
        self.received.append(msg)
        return msg

    async def request(self, method: str, params: Any = None) -> dict[str, Any]:
        req_id = next(self.ids)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        await self.send(msg)
        while True:
            reply = await self.next()
            if reply.get("id") == req_id and "method" not in reply:
                return reply

    async def initialize(self) -> dict[str, Any]:
        reply = await self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert "result" in reply, reply
        return reply["result"]


@contextlib.asynccontextmanager
async def open_peer(
    port: int, *, initialize: bool = True, token: str = TOKEN
) -> AsyncIterator[WsPeer]:
    """A trio-websocket client; its socket is closed here even when the server closed first."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    auth = [(b"Authorization", f"Bearer {token}".encode())]
    async with stream, trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(
            nursery, stream, f"127.0.0.1:{port}", "/acp", extra_headers=auth
        )
        peer = WsPeer(ws)
        if initialize:
            await peer.initialize()
        yield peer
        await ws.aclose()
        nursery.cancel_scope.cancel()


NEW_SESSION = {"cwd": "/w", "mcpServers": []}


# -- the official SDK's client over WebSocket -------------------------------------------------


class WsprotoTransport:
    """
    An ``acp`` Transport over asyncio streams and wsproto, for when ``websockets`` (the
    SDK's own WebSocket dependency, its ``http`` extra) is not installed. Same contract as
    ``acp.ws.create_websocket_stream``: text frames are JSON-RPC messages, binary ignored.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self._events: collections.deque[ev.Event] = collections.deque()
        self._parts: list[str] = []
        self.connection_id: str | None = None

    @classmethod
    async def connect(cls, url: str, headers: dict[str, str]) -> WsprotoTransport:
        m = re.fullmatch(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert m is not None
        host, port, target = m.group(1), int(m.group(2)), m.group(3)
        reader, writer = await asyncio.open_connection(host, port)
        self = cls(reader, writer)
        extra = [(k.encode(), v.encode()) for k, v in headers.items()]
        await self._write(ev.Request(host=f"{host}:{port}", target=target, extra_headers=extra))
        event = await self._next_event()
        if not isinstance(event, ev.AcceptConnection):
            await self._close_socket()
            raise ConnectionError(f"WebSocket handshake refused: {event!r}")
        self.connection_id = dict(event.extra_headers).get(b"acp-connection-id", b"").decode()
        return self

    async def _write(self, event: ev.Event) -> None:
        self._writer.write(self._ws.send(event))
        await self._writer.drain()

    async def _next_event(self) -> ev.Event | None:
        while not self._events:
            data = await self._reader.read(65536)
            if not data:
                return None
            self._ws.receive_data(data)
            self._events.extend(self._ws.events())
        return self._events.popleft()

    async def send(self, message: dict[str, Any]) -> None:
        await self._write(ev.TextMessage(data=json.dumps(message)))

    async def receive(self) -> dict[str, Any] | None:
        while True:
            event = await self._next_event()
            if event is None:
                return None
            if isinstance(event, ev.Ping):
                await self._write(event.response())
            elif isinstance(event, ev.CloseConnection):
                with contextlib.suppress(Exception):
                    await self._write(event.response())
                return None
            elif isinstance(event, ev.TextMessage):
                self._parts.append(event.data)
                if event.message_finished:
                    text, self._parts = "".join(self._parts), []
                    return json.loads(text)

    async def _close_socket(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()

    async def close(self) -> None:
        if self._ws.state is wsproto.connection.ConnectionState.OPEN:
            with contextlib.suppress(ConnectionError):
                await self._write(ev.CloseConnection(code=1000))
        await self._close_socket()


SDK_TRANSPORTS = [
    pytest.param(
        "websockets",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("websockets") is None,
            reason="acp.ws needs `websockets` (the SDK's `http` extra), not installed",
        ),
    ),
    "wsproto",
]


async def sdk_transport(kind: str, url: str) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if kind == "websockets":
        import acp.ws

        return await acp.ws.create_websocket_stream(url, headers=headers)
    return await WsprotoTransport.connect(url, headers)


async def run_asyncio(scenario: Any) -> None:
    """Run an asyncio scenario in a worker thread, bounded on both sides."""

    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT):
            await scenario()

    with trio.fail_after(TIMEOUT + 5):
        await trio.to_thread.run_sync(lambda: asyncio.run(bounded()))


@contextlib.asynccontextmanager
async def sdk_connection(kind: str, url: str, client: RecordingClient) -> AsyncIterator[Any]:
    transport = await sdk_transport(kind, url)
    conn = acp.connect_to_agent(client, transport)
    try:
        init = await conn.initialize(
            protocol_version=acp.PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(
                fs=FileSystemCapabilities(read_text_file=True, write_text_file=True)
            ),
        )
        assert init.protocol_version == acp.PROTOCOL_VERSION
        yield conn
    finally:
        await conn.close()


@pytest.mark.parametrize("kind", SDK_TRANSPORTS)
async def test_sdk_client_runs_a_prompt_turn_with_a_permission_request(kind, tmp_path):
    """The official SDK client, over WebSocket: initialize, session/new, prompt, permission."""
    agent = FakeAgent("a")
    async with open_server({"a": agent}) as server:

        async def scenario() -> None:
            client = RecordingClient(tmp_path, policy="allow_once")
            async with sdk_connection(kind, server.info.url, client) as conn:
                session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
                sid = session.session_id
                response = await conn.prompt(session_id=sid, prompt=[acp.text_block("permission")])
                assert response.stop_reason == "end_turn"
                assert [p.session_id for p in client.permissions] == [sid]
                assert client.texts(sid) == ["a:outcome:yes"]
                response = await conn.prompt(session_id=sid, prompt=[acp.text_block("count 5")])
                assert response.stop_reason == "end_turn"
                assert client.texts(sid)[1:] == [f"a:{sid}:{i}" for i in range(5)]

        await run_asyncio(scenario)
    answers = [m for m in agent.received if "result" in m and "outcome" in m["result"]]
    assert answers[0]["result"]["outcome"] == {"outcome": "selected", "optionId": "yes"}


@pytest.mark.parametrize("kind", SDK_TRANSPORTS)
async def test_two_sdk_clients_on_two_agents_get_only_their_own_updates(kind, tmp_path):
    """Two SDK connections at once, each on its own agent: no update crosses over."""
    async with open_server({"a": FakeAgent("a"), "b": FakeAgent("b")}) as server:

        async def one(name: str) -> tuple[RecordingClient, str]:
            client = RecordingClient(tmp_path)
            async with sdk_connection(kind, server.info.url, client) as conn:
                meta = {"acp_bridge": {"agent": name}}
                session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[], **meta)
                sid = session.session_id
                response = await conn.prompt(session_id=sid, prompt=[acp.text_block("count 50")])
                assert response.stop_reason == "end_turn"
                return client, sid

        async def scenario() -> None:
            (client_a, sid_a), (client_b, sid_b) = await asyncio.gather(one("a"), one("b"))
            assert sid_a != sid_b
            assert list(client_a.updates) == [sid_a]
            assert list(client_b.updates) == [sid_b]
            # Both agents minted "s1" (their texts say so); the client sees two distinct ids.
            assert client_a.texts(sid_a) == [f"a:s1:{i}" for i in range(50)]
            assert client_b.texts(sid_b) == [f"b:s1:{i}" for i in range(50)]

        await run_asyncio(scenario)


# -- the handshake: auth, Origin, Host -------------------------------------------------------

AUTH_CASES = [
    pytest.param("/acp", [], 401, id="no-token"),
    pytest.param("/acp", [f"Authorization: Bearer {'x' * len(TOKEN)}"], 401, id="wrong"),
    pytest.param("/acp", [f"Authorization: Bearer {TOKEN[:-1]}"], 401, id="truncated"),
    pytest.param("/acp", [f"Authorization: Bearer {TOKEN}x"], 401, id="extended"),
    pytest.param("/acp", ["Authorization: Bearer "], 401, id="empty"),
    pytest.param("/acp", [f"Authorization: Basic {TOKEN}"], 401, id="basic-scheme"),
    pytest.param("/acp", [AUTH, AUTH], 401, id="two-authorization-headers"),
    pytest.param("/acp?token=nope", [], 401, id="query-wrong"),
    pytest.param(f"/acp?token={TOKEN[:-1]}", [], 401, id="query-truncated"),
    pytest.param(f"/acp?token={TOKEN}x", [], 401, id="query-extended"),
    pytest.param(f"/acp?token={TOKEN}", ["Authorization: Bearer nope"], 401, id="header-wins"),
    pytest.param("/acp", [f"Authorization: Bearer {OTHER_TOKEN}"], 401, id="another-daemons"),
    pytest.param("/acp", [f"Authorization: Bearer {TOKEN.upper()}"], 401, id="other-case"),
    pytest.param("/acp", [f"Authorization: {TOKEN}"], 401, id="no-scheme"),
    pytest.param("/acp", [f"Authorization: Bearer {TOKEN} x"], 401, id="trailing-words"),
    pytest.param("/acp", [f"X-Acp-Token: {TOKEN}"], 401, id="other-header"),
    pytest.param("/acp", [f"Sec-WebSocket-Protocol: bearer, {TOKEN}"], 401, id="subprotocol"),
    pytest.param("/acp", [f"Cookie: token={TOKEN}"], 401, id="cookie"),
    pytest.param("/acp?token=", [], 401, id="query-empty"),
    pytest.param(f"/acp?token={TOKEN}&token={TOKEN}", [], 401, id="query-twice"),
    pytest.param(f"/acp?tok={TOKEN}", [], 401, id="query-other-name"),
    pytest.param("/acp", [AUTH], 101, id="header"),
    pytest.param("/acp", [f"Authorization: bearer {TOKEN}"], 101, id="header-lowercase-scheme"),
    pytest.param("/acp", [f"Authorization: Bearer   {TOKEN}"], 101, id="header-spaces"),
    pytest.param(f"/acp?token={TOKEN}", [], 101, id="query"),
    pytest.param(
        "/acp?token=" + "".join(f"%{b:02X}" for b in TOKEN.encode()),
        [],
        101,
        id="query-percent-encoded",
    ),
]


@pytest.mark.parametrize(("target", "extra", "status"), AUTH_CASES)
async def test_auth_matrix(target, extra, status):
    """Only the exact token passes; a refusal is a 401 with nothing else on the wire."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server:
            response = await http_exchange(
                server.port, upgrade_request(server.port, target=target, extra=extra)
            )
            assert response.status == status
            if status == 401:
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert response.headers["connection"] == "close"
                assert response.body.startswith(b"unauthorized")
                assert not server.bridge.hub.clients
            else:
                assert response.body == b""  # nothing before the client's initialize
                assert re.fullmatch(r"[0-9a-f-]{36}", response.headers["acp-connection-id"])
            assert agent.received == []


ORIGIN_HOST_CASES = [
    pytest.param(None, ["Origin: https://evil.example"], 403, id="foreign-origin"),
    pytest.param(None, ["Origin: null"], 403, id="null-origin"),
    pytest.param(
        None,
        ["Origin: http://localhost:3000", "Origin: http://localhost:3000"],
        403,
        id="two-origins",
    ),
    pytest.param("evil.example:{port}", [], 403, id="rebinding-name"),
    pytest.param("127.0.0.1.evil.example:{port}", [], 403, id="rebinding-lookalike"),
    pytest.param("localhost.evil.example:{port}", [], 403, id="rebinding-subdomain"),
    pytest.param("127.0.0.1:{other}", [], 403, id="port-mismatch"),
    pytest.param("localhost", [], 403, id="no-port-means-80"),
    pytest.param("10.0.0.1:{port}", [], 403, id="foreign-ip-on-loopback-bind"),
    pytest.param("", [], 403, id="empty-host"),
    pytest.param("localhost:{port}", [], 101, id="localhost"),
    pytest.param("LOCALHOST:{port}", [], 101, id="localhost-any-case"),
    pytest.param("[::1]:{port}", [], 101, id="ipv6-loopback"),
    pytest.param(None, ["Origin: https://localhost:3000"], 403, id="origin-other-scheme"),
    pytest.param(None, ["Origin: http://localhost:3001"], 403, id="origin-other-port"),
    pytest.param(None, ["Origin: http://localhost"], 403, id="origin-default-port"),
    pytest.param(None, ["Origin: http://localhost:3000.evil.example"], 403, id="origin-suffix"),
    pytest.param(None, ["Origin: http://localhost:3000@evil.example"], 403, id="origin-userinfo"),
    pytest.param(None, ["Origin: http://evil.example/localhost:3000"], 403, id="origin-path"),
    pytest.param(None, ["Origin: file://"], 403, id="origin-file"),
    pytest.param(None, ["Origin: "], 403, id="origin-empty"),
    pytest.param(None, ["Origin: not a url"], 403, id="origin-malformed"),
    pytest.param("localhost.:{port}", [], 403, id="host-trailing-dot"),
    pytest.param("127.0.0.2:{port}", [], 403, id="host-other-loopback-address"),
    pytest.param("127.1:{port}", [], 403, id="host-short-ipv4"),
    pytest.param("2130706433:{port}", [], 403, id="host-decimal-ipv4"),
    pytest.param("[::ffff:127.0.0.1]:{port}", [], 403, id="host-ipv4-mapped"),
    pytest.param("[::1]", [], 403, id="host-ipv6-no-port"),
    pytest.param("bridge.internal:{other}", [], 403, id="allowed-host-other-port"),
    pytest.param("proxy.example", [], 403, id="allowed-host-default-port"),
    pytest.param("user@localhost:{port}", [], 403, id="host-userinfo"),
    pytest.param("127.0.0.1:{port}", [], 101, id="ipv4-loopback"),
    pytest.param(None, ["Origin: http://localhost:3000"], 101, id="allowed-origin"),
    pytest.param(None, ["Origin: HTTP://LOCALHOST:3000"], 101, id="allowed-origin-any-case"),
    pytest.param("bridge.internal:{port}", [], 101, id="allowed-host-name"),
    pytest.param("proxy.example:443", [], 101, id="allowed-host-with-port"),
]


@pytest.mark.parametrize(("host", "extra", "status"), ORIGIN_HOST_CASES)
async def test_origin_and_host_matrix(host, extra, status):
    """Browsers and rebinding tricks are refused with 403 even when they hold the token."""
    agent = FakeAgent("a")
    settings = {
        "allowed_origins": ("http://localhost:3000",),
        "allowed_hosts": ("bridge.internal", "proxy.example:443"),
    }
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}, **settings) as server:
            port = server.port
            if host is not None:
                host = host.format(port=port, other=port + 1 if port < 65535 else port - 1)
            request = upgrade_request(port, host=host, extra=[AUTH, *extra])
            response = await http_exchange(port, request)
            assert response.status == status
            if status == 403:
                assert response.body.startswith(b"forbidden")
                assert not server.bridge.hub.clients
            else:
                assert response.body == b""
            assert agent.received == []


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(lambda p: get_request(p, "/nope"), 404, id="unknown-path"),
        pytest.param(lambda p: get_request(p, "/acp", method="PUT"), 405, id="put-acp"),
        pytest.param(lambda p: get_request(p, "/acp"), 406, id="acp-neither-upgrade-nor-events"),
        pytest.param(
            lambda p: get_request(p, "/healthz", method="DELETE"), 405, id="delete-health"
        ),
        pytest.param(
            lambda p: get_request(p, "/healthz", host="evil.example"), 403, id="health-rebinding"
        ),
        pytest.param(lambda p: b"GET /acp HTTP/1.1\r\n\r\n", 400, id="no-host"),
        pytest.param(lambda p: b"\x16\x03\x01 not http\r\n\r\n", 400, id="garbage"),
        pytest.param(lambda p: get_request(p, "/" + "a" * 40000), 431, id="head-too-large"),
        pytest.param(
            lambda p: upgrade_request(p, extra=[AUTH]).replace(b"Version: 13", b"Version: 8"),
            426,
            id="old-websocket-version",
        ),
    ],
)
async def test_other_requests_get_small_http_errors(request_bytes, status):
    """Anything but health or an upgrade gets a tiny HTTP error and no bridge client."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server:
            response = await http_exchange(server.port, request_bytes(server.port))
            assert response.status == status
            assert response.headers["connection"] == "close"
            assert len(response.body) < 100
            assert not server.bridge.hub.clients


# -- health ------------------------------------------------------------------------------------


async def test_healthz_is_200_with_agent_states_when_the_default_agent_is_ready():
    """Health reflects the default agent: 503 before it started, 200 once ready."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a"), "b": FakeAgent("b")}) as server:
            before = await http_exchange(server.port, get_request(server.port, "/healthz"))
            assert before.status == 503
            assert json.loads(before.body)["agents"]["a"]["state"] == "stopped"
            await server.bridge.supervisor.ensure_ready(server.bridge.hub.agents["a"])
            response = await http_exchange(server.port, get_request(server.port, "/healthz"))
            assert response.status == 200
            assert response.headers["content-type"] == "application/json"
            body = json.loads(response.body)
            assert body["ok"] is True
            assert body["defaultAgent"] == "a"
            assert body["agents"]["a"]["state"] == "ready"
            assert body["agents"]["b"]["state"] == "stopped"


async def test_healthz_is_503_when_the_default_agent_failed():
    """A default agent that failed to start makes /healthz answer 503 with its state."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a", fail_initialize=True)}) as server:
            with pytest.raises(JsonRpcError):
                await server.bridge.supervisor.ensure_ready(server.bridge.hub.agents["a"])
            response = await http_exchange(server.port, get_request(server.port, "/healthz"))
            assert response.status == 503
            body = json.loads(response.body)
            assert body["ok"] is False
            assert body["agents"]["a"]["state"] == "dead"


# -- connections -------------------------------------------------------------------------------


async def test_accepted_connection_carries_an_acp_connection_id_and_serves_a_session():
    """101 carries an Acp-Connection-Id; the connection then serves a prompt turn."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server, open_peer(server.port) as peer:
            headers = dict(peer.ws.handshake_headers)
            assert re.fullmatch(rb"[0-9a-f-]{36}", headers[b"acp-connection-id"])
            sid = (await peer.request("session/new", NEW_SESSION))["result"]["sessionId"]
            reply = await peer.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "count 3"}]},
            )
            assert reply["result"]["stopReason"] == "end_turn"
            texts = [
                m["params"]["update"]["content"]["text"]
                for m in peer.received
                if m.get("method") == "session/update"
            ]
            assert texts == [f"a:{sid}:{i}" for i in range(3)]


async def test_connection_cap_answers_503():
    """One connection past max_connections is refused with 503; /healthz still answers."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": FakeAgent("a")}, max_connections=1) as server,
            open_peer(server.port),
        ):
            response = await http_exchange(server.port, upgrade_request(server.port, extra=[AUTH]))
            assert response.status == 503
            assert len(server.bridge.hub.clients) == 1
            health = await http_exchange(server.port, get_request(server.port, "/healthz"))
            assert health.status == 200  # health is not a connection


async def test_first_message_must_be_initialize_else_close_1002():
    """A first message other than initialize closes with 1002 before reaching any agent."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}) as server,
            open_peer(server.port, initialize=False) as peer,
        ):
            await peer.send(
                {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": NEW_SESSION}
            )
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await peer.next()
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1002
            assert closed.value.reason.reason == "the first message must be initialize"
    assert agent.received == []


async def test_not_even_json_first_closes_1002():
    """A first message that is not JSON closes with 1002 too."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": FakeAgent("a")}) as server,
            open_peer(server.port, initialize=False) as peer,
        ):
            await peer.ws.send_message("{not json")
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await peer.next()
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1002


async def test_oversize_message_closes_1009_and_other_connections_keep_working():
    """A message over the cap closes that connection with 1009; the daemon serves others."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": FakeAgent("a")}, max_message_bytes=1024) as server,
            open_peer(server.port) as other,
            open_peer(server.port) as peer,
        ):
            await peer.ws.send_message(
                json.dumps({"jsonrpc": "2.0", "method": "x", "params": "y" * 2000})
            )
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await peer.next()
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1009
            reply = await other.request("session/new", NEW_SESSION)
            assert "sessionId" in reply["result"]
            async with open_peer(server.port) as again:
                assert "sessionId" in (await again.request("session/new", NEW_SESSION))["result"]


async def test_binary_frames_are_ignored():
    """Binary frames are dropped, before initialize and after: no answer, no error."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": FakeAgent("a")}) as server,
            open_peer(server.port, initialize=False) as peer,
        ):
            await peer.ws.send_message(b"\x00binary before initialize")
            await peer.initialize()
            await peer.ws.send_message(b'{"jsonrpc":"2.0","id":99,"method":"session/new"}')
            reply = await peer.request("session/new", NEW_SESSION)
            assert "sessionId" in reply["result"]
            assert all(m.get("id") != 99 for m in peer.received)


async def test_batches_are_refused_and_the_connection_stays():
    """A JSON-RPC batch gets -32600 and the connection goes on."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server, open_peer(server.port) as peer:
            await peer.send(
                [{"jsonrpc": "2.0", "id": 5, "method": "session/new", "params": NEW_SESSION}]
            )
            error = await peer.next()
            assert error["error"]["code"] == -32600
            assert "sessionId" in (await peer.request("session/new", NEW_SESSION))["result"]


#: Frames wsproto refuses, as a raw client sends them, and the close code each must get.
BAD_FRAMES = [
    # a masked text frame (mask key 0: the payload as is) that is not UTF-8
    pytest.param(bytes((0x81, 0x82, 0, 0, 0, 0)) + b"\xff\xfe", 1007, id="invalid-utf8"),
    pytest.param(bytes((0x81, 0x02)) + b"{}", 1002, id="unmasked"),
    pytest.param(bytes((0x83, 0x80, 0, 0, 0, 0)), 1002, id="reserved-opcode"),
]


@pytest.mark.parametrize(("frame", "code"), BAD_FRAMES)
async def test_protocol_errors_end_with_a_close_frame(frame, code):
    """Invalid UTF-8, an unmasked frame, an unknown opcode: the server sends a close frame
    (1007, 1002) before it closes the TCP connection, and the client's link ends."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server:
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            async with stream:
                client = RawClient(stream)
                request = ev.Request(
                    host=f"127.0.0.1:{server.port}", target="/acp", extra_headers=AUTH_HEADERS
                )
                await client.write(request)
                assert isinstance(await client.next_event(), ev.AcceptConnection)
                await client.call(1, "initialize", {"protocolVersion": 1})
                await stream.send_all(frame)
                close = await client.next_event()
                assert isinstance(close, ev.CloseConnection), close
                assert close.code == code
                assert close.reason.startswith("protocol error: ")
                assert await client.next_event() is None
            await trio.testing.wait_all_tasks_blocked()
            assert not server.bridge.hub.clients


# -- time: keepalive, idle, a client that stops reading (memory streams, autojump clock) ------


@contextlib.asynccontextmanager
async def open_face(
    agents: dict[str, FakeAgent], *, bridge: dict[str, Any] | None = None, **ws: Any
) -> AsyncIterator[tuple[WebSocketFace, Bridge, trio.Nursery]]:
    config = ws_config(agents, bridge=bridge, port=MEMORY_PORT, **ws)
    async with trio.open_nursery() as nursery:
        b: Bridge = await nursery.start(Bridge(config, make_in_process_launcher(dict(agents))).run)
        face = WebSocketFace(b, config.websocket, token=TOKEN.encode(), port=MEMORY_PORT)
        yield face, b, nursery
        nursery.cancel_scope.cancel()


class RawClient:
    """A wsproto client over a stream that does only what it is told (no automatic pongs)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.events: collections.deque[ev.Event] = collections.deque()
        self.eof = False

    async def write(self, event: ev.Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next_event(self) -> ev.Event | None:
        while not self.events:
            data = await self.stream.receive_some(65536)
            if not data:
                self.eof = True
                return None
            self.ws.receive_data(data)
            self.events.extend(self.ws.events())
        return self.events.popleft()

    async def handshake(self) -> None:
        await self.write(
            ev.Request(host=f"127.0.0.1:{MEMORY_PORT}", target="/acp", extra_headers=AUTH_HEADERS)
        )
        assert isinstance(await self.next_event(), ev.AcceptConnection)

    async def call(self, req_id: int, method: str, params: Any) -> dict[str, Any]:
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}
        await self.write(ev.TextMessage(data=json.dumps(msg)))
        while True:
            event = await self.next_event()
            assert isinstance(event, ev.TextMessage), event
            reply = json.loads(event.data)
            if reply.get("id") == req_id:
                return reply


async def test_keepalive_closes_1011_when_no_pong_comes(autojump_clock):
    """No pong within ping_timeout of a ping: close 1011, at exactly that virtual time."""
    async with open_face({"a": FakeAgent("a")}, ping_interval=20, ping_timeout=5) as (
        face,
        _,
        nursery,
    ):
        client_side, server_side = trio.testing.memory_stream_pair()
        nursery.start_soon(face.handle_connection, server_side)
        client = RawClient(client_side)
        await client.handshake()
        await client.call(1, "initialize", {"protocolVersion": 1})
        start = trio.current_time()
        ping = await client.next_event()
        assert isinstance(ping, ev.Ping)
        assert trio.current_time() == start + 20
        close = await client.next_event()
        assert isinstance(close, ev.CloseConnection)
        assert close.code == 1011
        assert trio.current_time() == start + 25
        await client.write(close.response())
        assert await client.next_event() is None
        await trio.testing.wait_all_tasks_blocked()
        assert face.statistics().connections == 0


async def test_pongs_keep_a_connection_alive_until_the_idle_timeout(autojump_clock):
    """Pongs are not messages: a silent client is closed with 1000 'idle' on time."""
    settings = {"ping_interval": 20, "ping_timeout": 5, "idle_timeout": 100}
    async with open_face({"a": FakeAgent("a")}, **settings) as (face, bridge, nursery):
        client_side, server_side = trio.testing.memory_stream_pair()
        nursery.start_soon(face.handle_connection, server_side)
        ws = await trio_websocket.wrap_client_stream(
            nursery, client_side, f"127.0.0.1:{MEMORY_PORT}", "/acp", extra_headers=AUTH_HEADERS
        )
        peer = WsPeer(ws)
        await peer.initialize()
        start = trio.current_time()
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await peer.next()  # nothing to read: the client answers pings, sends nothing
        assert trio.current_time() == start + 100
        assert closed.value.reason is not None
        assert (closed.value.reason.code, closed.value.reason.reason) == (1000, "idle")
        assert not bridge.hub.clients


async def test_a_client_that_stops_reading_is_cut_off_and_its_link_closed(autojump_clock):
    """Overflow that lasts closes the bridge's link (after OVERFLOW_WAIT: 1 s); the stuck
    socket is dropped at ping_timeout."""
    agent = FakeAgent("a")
    settings = {"ping_interval": 0, "ping_timeout": 7}
    async with open_face({"a": agent}, bridge={"client_queue": 8}, **settings) as (
        face,
        bridge,
        nursery,
    ):
        client_side, server_side = trio.testing.lockstep_stream_pair()
        done = trio.Event()

        async def serve() -> None:
            await face.handle_connection(server_side)
            done.set()

        nursery.start_soon(serve)
        client = RawClient(client_side)
        await client.handshake()
        await client.call(1, "initialize", {"protocolVersion": 1})
        (link,) = bridge.hub.clients
        sid = (await client.call(2, "session/new", NEW_SESSION))["result"]["sessionId"]
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "count 100"}]}
        await client.write(
            ev.TextMessage(
                data=json.dumps(
                    {"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt}
                )
            )
        )
        start = trio.current_time()
        await done.wait()  # the client reads nothing meanwhile
        assert trio.current_time() == start + 7
        assert link.closed
        assert link.close_reason is not None
        assert "queue full" in link.close_reason
        assert not bridge.hub.clients
        while await client.next_event() is not None:
            pass  # whatever was already in flight, then EOF, and no close frame could come
        assert client.eof


# -- handshake places, the connection cap, the head cap (memory streams, autojump clock) ---

#: Half a request head, as a slowloris client sends it and then holds the connection.
HALF_HEAD = f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{MEMORY_PORT}\r\n".encode()


async def read_http(stream: trio.abc.Stream) -> HttpResponse | None:
    """The HTTP response on ``stream``: its head, then (unless 101) its body up to EOF. None
    when the connection ends before any byte of a response."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            assert not data, f"connection closed inside a response head: {data!r}"
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    status = int(status_line.split(" ")[1])
    if status != 101:
        while chunk := await stream.receive_some(65536):
            body += chunk
    return HttpResponse(status, headers, body)


def open_stream(face: WebSocketFace, nursery: trio.Nursery) -> trio.abc.Stream:
    """A new connection to ``face``, over memory streams."""
    client_side, server_side = trio.testing.memory_stream_pair()
    nursery.start_soon(face.handle_connection, server_side)
    return client_side


async def open_ws_peer(face: WebSocketFace, nursery: trio.Nursery) -> WsPeer:
    """An authenticated client, initialized."""
    ws = await trio_websocket.wrap_client_stream(
        nursery,
        open_stream(face, nursery),
        f"127.0.0.1:{MEMORY_PORT}",
        "/acp",
        extra_headers=AUTH_HEADERS,
    )
    peer = WsPeer(ws)
    await peer.initialize()
    return peer


async def test_half_heads_do_not_hold_the_connection_cap_and_are_closed_at_the_deadline(
    autojump_clock,
):
    """max_connections sockets that send half a request head and hold it (slowloris) shut
    no authenticated client out: handshakes are not connections. At the connection cap a new
    client gets a 503 response; the half heads are closed at handshake_timeout."""
    cap, deadline = 8, 10.0
    settings = {"max_connections": cap, "handshake_timeout": deadline, "ping_interval": 0}
    with trio.fail_after(TIMEOUT):
        async with open_face({"a": FakeAgent("a")}, **settings) as (face, bridge, nursery):
            start = trio.current_time()
            slow = [open_stream(face, nursery) for _ in range(cap)]
            for stream in slow:
                await stream.send_all(HALF_HEAD)
            await trio.testing.wait_all_tasks_blocked()
            assert face.statistics().handshakes == cap
            peers = [await open_ws_peer(face, nursery) for _ in range(cap)]
            assert len(bridge.hub.clients) == cap
            assert trio.current_time() == start  # no one waited for a handshake place
            late = open_stream(face, nursery)
            await late.send_all(upgrade_request(MEMORY_PORT, extra=[AUTH]))
            refused = await read_http(late)
            assert refused is not None
            assert refused.status == 503
            assert refused.headers["retry-after"] == "5"
            for stream in slow:
                assert await stream.receive_some(1024) == b""  # closed unanswered ...
            assert trio.current_time() == start + deadline  # ... at the deadline
            assert face.statistics().handshakes == 0
            assert (await peers[0].request("session/new", NEW_SESSION))["result"]["sessionId"]


async def test_a_full_handshake_table_gives_the_oldest_place_away_or_answers_503(
    autojump_clock,
):
    """With max_handshakes under way, a new connection is answered 503 while they are all
    younger than HANDSHAKE_EVICT_AGE; once the oldest is that old, a new connection takes its
    place (the oldest is closed) and is served."""
    settings = {"max_handshakes": 2, "handshake_timeout": 10.0, "ping_interval": 0}
    with trio.fail_after(TIMEOUT):
        async with open_face({"a": FakeAgent("a")}, **settings) as (face, bridge, nursery):
            start = trio.current_time()
            first = open_stream(face, nursery)
            await first.send_all(HALF_HEAD)
            await trio.sleep(HANDSHAKE_EVICT_AGE / 2)
            second = open_stream(face, nursery)
            await second.send_all(HALF_HEAD)
            await trio.testing.wait_all_tasks_blocked()
            busy = open_stream(face, nursery)
            await busy.send_all(upgrade_request(MEMORY_PORT, extra=[AUTH]))
            refused = await read_http(busy)
            assert refused is not None
            assert refused.status == 503
            await trio.sleep_until(start + HANDSHAKE_EVICT_AGE)
            peer = await open_ws_peer(
                face, nursery
            )  # takes the first one's place, not the second's
            assert await first.receive_some(1024) == b""
            assert trio.current_time() == start + HANDSHAKE_EVICT_AGE
            assert face.statistics().handshakes == 1  # the second one, still waiting
            assert len(bridge.hub.clients) == 1
            assert (await peer.request("session/new", NEW_SESSION))["result"]["sessionId"]


def head_of_size(size: int) -> bytes:
    """A valid, authenticated upgrade request whose head is exactly ``size`` bytes."""
    bare = upgrade_request(MEMORY_PORT, extra=[AUTH, "X-Pad: "])
    return upgrade_request(MEMORY_PORT, extra=[AUTH, "X-Pad: " + "p" * (size - len(bare))])


@pytest.mark.parametrize(("size", "status"), [(MAX_HEAD_BYTES, 101), (MAX_HEAD_BYTES + 1, 431)])
async def test_the_request_head_cap_is_exactly_max_head_bytes(size, status, autojump_clock):
    """A head of MAX_HEAD_BYTES is served; one byte more is refused with 431 (arriving at
    once, in whole reads, it was not: h11 checks its limit only between reads)."""
    with trio.fail_after(TIMEOUT):
        async with open_face({"a": FakeAgent("a")}) as (face, _, nursery):
            request = head_of_size(size)
            assert len(request) == size
            stream = open_stream(face, nursery)
            await stream.send_all(request)
            response = await read_http(stream)
            assert response is not None
            assert response.status == status


async def test_cancelled_server_closes_connections_with_1001():
    """Shutting the server down closes open connections with 1001 (going away)."""
    with trio.fail_after(TIMEOUT):
        async with open_face({"a": FakeAgent("a")}) as (face, _, nursery):
            client_side, server_side = trio.testing.memory_stream_pair()
            scope = trio.CancelScope()

            async def serve() -> None:
                with scope:
                    await face.handle_connection(server_side)

            nursery.start_soon(serve)
            client = RawClient(client_side)
            await client.handshake()
            await client.call(1, "initialize", {"protocolVersion": 1})
            scope.cancel()
            close = await client.next_event()
            assert isinstance(close, ev.CloseConnection)
            assert close.code == 1001
            await client.write(close.response())
            assert await client.next_event() is None


# -- start-up: TLS files, allowed hosts, `serve` (bind policy: test_handshake.py) ---------------


def test_tls_files_come_in_pairs_and_resolve_against_the_config(tmp_path):
    """tls_cert needs tls_key; both resolve against the config file's directory."""
    base = '[agents.a]\ncommand = "x"\n[websocket]\n'
    (tmp_path / "one.toml").write_text(base + 'tls_cert = "c.pem"\n')
    with pytest.raises(ConfigError, match="set both tls_cert and tls_key"):
        load_config(tmp_path / "one.toml")
    (tmp_path / "two.toml").write_text(base + 'tls_cert = "c.pem"\ntls_key = "k.pem"\n')
    ws = load_config(tmp_path / "two.toml").websocket
    assert (ws.tls_cert, ws.tls_key) == (str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))


def test_allowed_hosts_entries_are_checked(tmp_path):
    """A malformed allowed_hosts entry stops start-up instead of being silently unusable."""
    path = tmp_path / "c.toml"
    path.write_text('[agents.a]\ncommand = "x"\n[websocket]\nallowed_hosts = ["ok:443", "a b"]\n')
    with pytest.raises(ConfigError, match=r"websocket.allowed_hosts\[1\]: expected NAME"):
        load_config(path)


# -- end to end ---------------------------------------------------------------------------------


# -- the writer's own framing -------------------------------------------------------------


async def test_no_data_frame_follows_the_close_frame():
    """Once trio-websocket wrote its close frame, the writer's bursts are refused unwritten;
    before it, they go out whole and in order with the control frames."""
    sent, received = trio.testing.memory_stream_pair()
    replay = _ReplayStream(sent, b"", send_timeout=5)
    assert await replay.send_messages([b'{"a":1}\n', b'{"b":2}\n'])
    await replay.send_all(b"\x8a\x00")  # a pong
    await replay.send_all(b"\x88\x02\x03\xe8")  # close, 1000
    assert replay.close_sent
    assert not await replay.send_messages([b'{"c":3}\n'])
    await sent.aclose()
    data = b""
    while chunk := await received.receive_some():
        data += chunk
    assert data == text_frames([b'{"a":1}\n', b'{"b":2}\n']) + b"\x8a\x00\x88\x02\x03\xe8"
