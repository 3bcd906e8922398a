"""
In-process fakes for bridge tests: scripted agents and a client, over trio memory streams.

A FakeAgent is injected where a real agent process would be spawned (see
``acp_bridge.agents.process.make_in_process_launcher``); a TestClient speaks to
``serve_client_stream``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.testing

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.config.model import AgentConfig, BridgeConfig, Config
from acp_bridge.engine.bridge import Bridge
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.protocol.jsonrpc import dumps, loads

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class AgentCrash(Exception):
    """Raised inside a fake agent to make its "process" die (status 1)."""


class FakeAgent:
    """
    A scripted ACP agent. Prompt text drives it:

    - ``count N``: N agent_message_chunk updates ``"<name>:<sid>:<i>"``, then end_turn;
    - ``permission``: asks permission; reports the outcome in a chunk, then end_turn;
    - ``read PATH`` / ``write PATH TEXT``: calls fs/*, reports the result;
    - ``wait``: waits for session/cancel, then stopReason cancelled;
    - ``hang``: ignores session/cancel; ends the turn (end_turn) once ``release`` is set;
    - ``crash``: the process dies mid-prompt (after one update);
    - ``echo-meta``: replies with the params it received (to check forwarding).
    """

    def __init__(
        self,
        name: str,
        *,
        prefix: str = "s",
        capabilities: dict[str, Any] | None = None,
        read_input: bool = True,
        init_delay: float = 0.0,
        fail_initialize: bool = False,
        early_update: bool = False,
        list_pages: int = 0,
        new_delay: float = 0.0,
        session_id: str | None = None,
        serves: frozenset[str] = frozenset(),
    ) -> None:
        self.name = name
        #: other methods it answers, with ``{"method", "params", "agent"}`` (else -32601)
        self.serves = serves
        self.prefix = prefix
        self.capabilities = (
            capabilities
            if capabilities is not None
            else {
                "loadSession": True,
                "sessionCapabilities": {"list": {}, "close": {}, "resume": {}},
            }
        )
        self.read_input = read_input
        self.init_delay = init_delay
        self.fail_initialize = fail_initialize
        self.early_update = early_update
        self.list_pages = list_pages
        self.new_delay = new_delay
        #: a broken agent: every session/new answers this id (None: s1, s2, ...)
        self.session_id = session_id
        self.received: list[dict[str, Any]] = []
        self.starts = 0
        self.sessions: list[str] = []
        self.cancelled: set[str] = set()
        self._cancel_events: dict[str, trio.Event] = {}
        self._ids = itertools.count(100)
        self._waiting: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._send: trio.abc.SendStream | None = None
        self._lock = trio.Lock()
        self.client_capabilities: dict[str, Any] = {}
        #: when set to an event, session/close is answered only once it is set
        self.close_gate: trio.Event | None = None
        #: its stderr (set by the in-process launcher)
        self.stderr: trio.abc.SendStream | None = None

    async def __call__(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        self.starts += 1
        self._send = send
        self._session_counter = itertools.count(1)
        if not self.read_input:
            await trio.sleep_forever()
        decoder = LineDecoder()
        self.stalled = trio.Event()
        self.release = trio.Event()
        async with trio.open_nursery() as nursery:
            while data := await receive.receive_some(65536):
                if self.stalled.is_set():
                    await trio.sleep_forever()
                for line in decoder.feed(data):
                    assert isinstance(line, bytes)
                    msg = loads(line)
                    self.received.append(msg)
                    if "method" not in msg:
                        waiter = self._waiting.pop(msg["id"], None)
                        if waiter is not None:
                            waiter.send_nowait(msg)
                        continue
                    if "id" not in msg:
                        self._notification(msg)
                        continue
                    nursery.start_soon(self._request_task, msg)
            nursery.cancel_scope.cancel()

    async def write(self, msg: dict[str, Any]) -> None:
        assert self._send is not None
        async with self._lock:
            await self._send.send_all(dumps(msg))

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        req_id = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[req_id] = send
        await self.write({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
        return await receive.receive()

    async def ask(
        self, req_id: int, method: str, params: dict[str, Any]
    ) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        """Send a request under ``req_id`` without waiting: its answer comes on the channel."""
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[req_id] = send
        await self.write({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
        return receive

    async def update(self, sid: str, text: str) -> None:
        await self.write(chunk_update(sid, text))

    def _notification(self, msg: dict[str, Any]) -> None:
        if msg["method"] == "session/cancel":
            sid = msg["params"]["sessionId"]
            self.cancelled.add(sid)
            event = self._cancel_events.get(sid)
            if event is not None:
                event.set()

    async def _request_task(self, msg: dict[str, Any]) -> None:
        try:
            result = await self._handle(msg["method"], msg.get("params") or {})
        except _Error as exc:
            await self.write(
                {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": exc.code, "message": "no"}}
            )
            return
        await self.write({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    async def _handle(self, method: str, params: dict[str, Any]) -> Any:
        if method == "initialize":
            if self.init_delay:
                await trio.sleep(self.init_delay)
            if self.fail_initialize:
                raise AgentCrash("initialize")
            self.client_capabilities = params.get("clientCapabilities") or {}
            return {
                "protocolVersion": 1,
                "agentCapabilities": self.capabilities,
                "authMethods": [],
                "agentInfo": {"name": self.name, "version": "0"},
            }
        if method == "session/new":
            if self.new_delay:
                await trio.sleep(self.new_delay)
            sid = self.session_id or f"{self.prefix}{next(self._session_counter)}"
            self.sessions.append(sid)
            if self.early_update:
                await self.update(sid, f"{self.name}:{sid}:early")
            return {"sessionId": sid, "_meta": {"echo": params.get("_meta")}}
        if method == "session/list":
            return self._list(params)
        if method in ("session/load", "session/resume", "session/close", "session/set_mode"):
            sid = params["sessionId"]
            if sid not in self.sessions:
                raise _Error(-32002)
            if method == "session/load":
                await self.update(sid, f"{self.name}:{sid}:replay")
            if method == "session/close":
                if self.close_gate is not None:
                    await self.close_gate.wait()
                self.sessions.remove(sid)
            return {}
        if method == "session/prompt":
            return await self._prompt(params)
        if method.startswith("_"):
            return {"method": method, "params": params}
        if method in self.serves:
            return {"method": method, "params": params, "agent": self.name}
        raise _Error(-32601)

    def _list(self, params: dict[str, Any]) -> dict[str, Any]:
        if not self.list_pages:
            return {"sessions": [{"sessionId": s, "cwd": "/w"} for s in self.sessions]}
        page = int(params.get("cursor") or 0)
        out: dict[str, Any] = {"sessions": [{"sessionId": f"{self.prefix}p{page}", "cwd": "/w"}]}
        if page + 1 < self.list_pages:
            out["nextCursor"] = str(page + 1)
        return out

    async def _prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = params["sessionId"]
        text = " ".join(b.get("text", "") for b in params["prompt"] if b.get("type") == "text")
        words = text.split()
        command = words[0] if words else ""
        if command == "count":
            for i in range(int(words[1])):
                await self.update(sid, f"{self.name}:{sid}:{i}")
        elif command == "permission":
            answer = await self.call(
                "session/request_permission",
                {
                    "sessionId": sid,
                    "toolCall": {"toolCallId": "t1", "title": "do it", "kind": "edit"},
                    "options": [
                        {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                    ],
                },
            )
            outcome = answer.get("result", {}).get("outcome", {})
            await self.update(sid, f"{self.name}:outcome:{outcome.get('optionId', outcome)}")
            if outcome.get("outcome") == "cancelled":
                return {"stopReason": "cancelled"}
        elif command in ("read", "write"):
            method = "fs/read_text_file" if command == "read" else "fs/write_text_file"
            call: dict[str, Any] = {"sessionId": sid, "path": words[1]}
            if command == "write":
                call["content"] = " ".join(words[2:])
            answer = await self.call(method, call)
            await self.update(sid, f"{self.name}:fs:{answer.get('result', answer.get('error'))}")
        elif command == "wait":
            event = self._cancel_events.setdefault(sid, trio.Event())
            await self.update(sid, f"{self.name}:{sid}:waiting")
            await event.wait()
            return {"stopReason": "cancelled"}
        elif command == "hang":
            await self.update(sid, f"{self.name}:{sid}:hanging")
            await self.release.wait()
        elif command == "noise":
            assert self.stderr is not None
            await self.stderr.send_all(
                b"ERROR: something broke\n[debug] details\njust talking\nWARN low disk\n"
            )
            async with self._lock:
                assert self._send is not None
                await self._send.send_all(b"this is not json (a stray print)\n")
            await self.update(sid, f"{self.name}:{sid}:still-fine")
        elif command == "stderr":
            assert self.stderr is not None
            await self.stderr.send_all(" ".join(words[1:]).encode() + b"\n")
        elif command == "flood":
            assert self.stderr is not None
            await self.stderr.send_all(b"".join(b"line %d\n" % i for i in range(int(words[1]))))
        elif command == "stall":
            self.stalled.set()  # stops reading its stdin from the next chunk on
        elif command == "crash":
            await self.update(sid, f"{self.name}:{sid}:about-to-crash")
            raise AgentCrash(sid)
        return {"stopReason": "end_turn"}


class _Error(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class TestClient:
    """A minimal ACP client over a stream: calls, notifications, and a log of all it got."""

    __test__ = False

    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self.stream = stream
        self.decoder = LineDecoder()
        self.ids = itertools.count(1)
        self.waiting: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.received: list[dict[str, Any]] = []
        self.requests: trio.MemorySendChannel[dict[str, Any]]
        self.requests, self.agent_requests = trio.open_memory_channel[dict[str, Any]](1000)
        self.changed = trio.Event()
        self._send_lock = trio.Lock()
        #: the methods of the requests it sent, by id (what each answer answers)
        self.asked: dict[Any, str] = {}

    async def disconnect(self) -> None:
        """Drop the connection (both directions), as a network failure would."""
        await self.stream.aclose()

    async def read_loop(self) -> None:
        with contextlib.suppress(trio.ClosedResourceError):
            await self._read_loop()

    async def _read_loop(self) -> None:
        while data := await self.stream.receive_some(65536):
            for line in self.decoder.feed(data):
                assert isinstance(line, bytes)
                msg = loads(line)
                self.received.append(msg)
                self.changed.set()
                self.changed = trio.Event()
                if "method" not in msg:
                    waiter = self.waiting.pop(msg.get("id"), None)
                    if waiter is not None:
                        waiter.send_nowait(msg)
                elif "id" in msg:
                    self.requests.send_nowait(msg)

    async def send_raw(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def send(self, msg: dict[str, Any]) -> None:
        if "id" in msg and isinstance(msg.get("method"), str):
            self.asked[msg["id"]] = msg["method"]
        await self.send_raw(dumps(msg))

    async def request(self, method: str, params: Any = None, *, id: Any = None) -> dict[str, Any]:
        """Send a request and wait for its response (the whole response message)."""
        req_id = next(self.ids) if id is None else id
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self.waiting[req_id] = send
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        await self.send(msg)
        return await receive.receive()

    async def call(self, method: str, params: Any = None) -> Any:
        response = await self.request(method, params)
        assert "result" in response, response
        return response["result"]

    async def notify(self, method: str, params: Any) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def initialize(self, *, seq: bool = False, log: str | None = "info", **caps: Any) -> Any:
        """
        Initialize as a client that knows the bridge's extensions: it asks for
        ``_acp_bridge/log`` at ``log`` (``log=None`` and no ``seq``: a stock client).
        """
        params: dict[str, Any] = {"protocolVersion": 1, "clientCapabilities": caps or {}}
        ours: dict[str, Any] = {}
        if seq:
            ours["seq"] = True
        if log is not None:
            ours["log"] = log
        if ours:
            params["_meta"] = {"acp_bridge": ours}
        return await self.call("initialize", params)

    async def new_session(self, agent: str | None = None, **extra: Any) -> str:
        params: dict[str, Any] = {"cwd": "/w", "mcpServers": [], **extra}
        if agent is not None:
            params["_meta"] = {"acp_bridge": {"agent": agent}}
        result = await self.call("session/new", params)
        sid = result["sessionId"]
        assert isinstance(sid, str)
        return sid

    async def prompt(self, sid: str, text: str) -> dict[str, Any]:
        return await self.request(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
        )

    def updates(self, sid: str) -> list[str]:
        """Texts of the agent_message_chunk updates received for a session, in order."""
        return [
            m["params"]["update"]["content"]["text"]
            for m in self.received
            if m.get("method") == "session/update"
            and m["params"]["sessionId"] == sid
            and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        ]

    def seqs(self, sid: str) -> list[int]:
        """The seq stamps of the updates received for a session, in order."""
        return [
            m["params"]["_meta"]["acp_bridge"]["seq"]
            for m in self.received
            if m.get("method") == "session/update" and m["params"]["sessionId"] == sid
        ]

    async def wait_for(self, predicate: Any) -> dict[str, Any]:
        """Wait until a received message satisfies ``predicate``; return it."""
        seen = 0
        while True:
            for msg in self.received[seen:]:
                if predicate(msg):
                    return msg
            seen = len(self.received)
            await self.changed.wait()


def chunk_update(sid: str, text: str) -> dict[str, Any]:
    """An ``agent_message_chunk`` session/update notification."""
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": sid,
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            },
        },
    }


def make_config(
    agents: dict[str, FakeAgent], *, policy: Any = None, subagents: Any = None, **bridge: Any
) -> Config:
    config = Config(
        agents={name: AgentConfig(name=name, command="fake", start_timeout=5) for name in agents},
        bridge=BridgeConfig(**bridge),
    )
    if policy is not None:
        config = attrs.evolve(config, policy=policy)
    if subagents is not None:
        config = attrs.evolve(config, subagents=subagents)
    return config


@contextlib.asynccontextmanager
async def open_bridge(
    agents: dict[str, FakeAgent],
    *,
    initialize: bool = True,
    log: str | None = "info",
    agent_client_capabilities: dict[str, Any] | None = None,
    policy: Any = None,
    audit: Any = None,
    subagents: Any = None,
    **bridge: Any,
) -> AsyncIterator[tuple[TestClient, Bridge]]:
    """A bridge over fake agents with one client attached (initialized unless told not to)."""
    config = make_config(agents, policy=policy, subagents=subagents, **bridge)
    launcher = make_in_process_launcher(dict(agents))
    async with trio.open_nursery() as nursery:
        b: Bridge = await nursery.start(
            Bridge(
                config,
                launcher,
                agent_client_capabilities=agent_client_capabilities,
                audit=audit,
            ).run
        )
        client_side, bridge_side = trio.testing.memory_stream_pair()
        nursery.start_soon(
            functools.partial(serve_client_stream, b, bridge_side, bridge_side, linger=0)
        )
        client = TestClient(client_side)
        nursery.start_soon(client.read_loop)
        if initialize:
            await client.initialize(log=log, fs={"readTextFile": True, "writeTextFile": True})
        yield client, b
        nursery.cancel_scope.cancel()


async def connect(
    bridge: Bridge,
    nursery: trio.Nursery,
    *,
    seq: bool = False,
    log: str | None = "info",
    name: str = "client",
    **caps: Any,
) -> TestClient:
    """Another client connection to a running bridge (initialized; ``caps``: more of its
    ``clientCapabilities``)."""
    client_side, bridge_side = trio.testing.memory_stream_pair()
    nursery.start_soon(
        functools.partial(
            serve_client_stream, bridge, bridge_side, bridge_side, name=name, linger=0
        )
    )
    client = TestClient(client_side)
    nursery.start_soon(client.read_loop)
    await client.initialize(
        seq=seq, log=log, fs={"readTextFile": True, "writeTextFile": True}, **caps
    )
    return client
