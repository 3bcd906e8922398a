"""
Shared pieces of the fuzz and ordering tests (issue 8): the oracles, a robust fuzz agent, raw
clients (stream and WebSocket), stages and rigs that wire them to a bridge, the generators
that build programs from bytes, the budgets of CI and long runs, and the atheris entry.

The tests are plain functions that run trio themselves: hypothesis drives them in CI,
``scripts/fuzz --minutes N`` drives the same tests longer, and ``scripts/fuzz --atheris`` feeds
their case builders raw bytes.

The oracles are written from JSON-RPC 2.0 and the bridge's documented rules, not from its code:

- a line a peer sends that is a JSON object with a ``method`` key and an ``id`` that is an
  integer or a string is *request-shaped*: it gets exactly one response with that id;
- anything else gets no response with an id, except that a client line that is not a
  message at all (not JSON, over the size cap, a batch, an invalid envelope without a usable id)
  gets one error with ``id: null``;
- every line the bridge writes, to a client or to an agent, is a well-formed JSON-RPC message.
"""

from __future__ import annotations

import collections
import contextlib
import decimal
import functools
import io
import itertools
import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Final

import attrs
import hypothesis
import hypothesis.errors
import trio
import trio.testing
import wsproto
import wsproto.events
import wsproto.utilities

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.config.model import AgentConfig, BridgeConfig, Config, WebSocketConfig
from acp_bridge.engine.audit import AuditLog
from acp_bridge.engine.bridge import Bridge
from acp_bridge.engine.journal import Journal
from acp_bridge.engine.links import AgentState
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.faces.ws import WebSocketFace
from acp_bridge.observe.log import configure_logging
from acp_bridge.observe.redact import Redactor
from acp_bridge.observe.trace import open_wire_trace
from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.protocol.jsonrpc import MAX_DEPTH
from acp_bridge.sessions.table import SessionState
from acp_bridge.store.db import open_store

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

#: the bridge's line cap in the rig: small, so lines over it are cheap to make
CAP: Final = 1024
#: wall-clock bound of one example (a hang is a failure, never a stuck CI job)
EXAMPLE_TIMEOUT: Final = 20.0

# -- budgets: CI figures, and the long form (scripts/fuzz) ------------------------------------

#: set by ``scripts/fuzz --minutes N``: run every fuzz test for its share of N minutes
MINUTES_ENV: Final = "ACP_BRIDGE_FUZZ_MINUTES"
#: the long-running tests and their share of the minutes (weights)
LONG_SHARES: Final = {
    "framing": 1,
    "codec": 1,
    "client_stream": 3,
    "agent_stream": 3,
    "websocket": 2,
    "ordering": 3,
}


def long_minutes() -> float | None:
    """The minutes of a long run, or None in CI."""
    raw = os.environ.get(MINUTES_ENV)
    if not raw:
        return None
    minutes = float(raw)
    return minutes if minutes > 0 else None


#: where a long run appends one line per test (what ran, how long): ``scripts/fuzz`` shows it
REPORT_ENV: Final = "ACP_BRIDGE_FUZZ_REPORT"
#: examples run, per test (counted by the tests themselves)
EXAMPLES: collections.Counter[str] = collections.Counter()
#: when the running test's share of a long run ends (monotonic clock)
_share_ends = math.inf


def out_of_time() -> bool:
    """The test's share of a long run is used: its remaining examples do nothing."""
    return time.monotonic() > _share_ends


def run_for_share(name: str, test: Callable[[], None]) -> None:
    """
    Run a hypothesis test once (CI), or, in a long run, again and again until the test's share
    of the minutes is used: each call draws fresh random examples (the example database still
    replays known failures first).
    """
    global _share_ends
    minutes = long_minutes()
    start = time.monotonic()
    before = EXAMPLES[name]
    rounds = 0
    share = 0.0 if minutes is None else minutes * 60 * LONG_SHARES[name] / sum(LONG_SHARES.values())
    _share_ends = start + share if minutes is not None else math.inf
    try:
        while rounds == 0 or (minutes is not None and not out_of_time()):
            test()
            rounds += 1
    finally:
        _share_ends = math.inf
    report = os.environ.get(REPORT_ENV)
    if report:
        elapsed = time.monotonic() - start
        with open(report, "a", encoding="utf-8") as out:
            out.write(
                f"{name:14} {EXAMPLES[name] - before:>9} examples  {elapsed:7.1f} s  "
                f"{rounds} round(s)\n"
            )


# -- oracles ------------------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


#: what the bridge accepts: JSON (no NaN/Infinity), numbers in double range, bounded depth
_ACCEPTED = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
#: what a strict JSON reader on the other side accepts (the grammar: any number, no NaN)
_GRAMMAR = json.JSONDecoder(parse_constant=_no_constant, parse_float=decimal.Decimal)


def depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0, ``[]`` is 1)."""
    best = 0
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if type(node) is dict:
            node = list(node.values())
        elif type(node) is not list:
            continue
        best = max(best, level)
        stack.extend((child, level + 1) for child in node)
    return best


def accepted(line: bytes) -> tuple[bool, Any]:
    """Whether the bridge must take ``line`` as a JSON text, and the value."""
    try:
        value = _ACCEPTED.decode(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False, None
    if depth(value) > MAX_DEPTH:
        return False, None
    return True, value


def valid_id(value: Any) -> bool:
    return type(value) is int or type(value) is str


def id_key(value: Any) -> tuple[str, Any]:
    """A hashable key that keeps 1, "1" and True apart."""
    return (type(value).__name__, value if valid_id(value) else repr(value))


@attrs.frozen
class Expect:
    """What a line sent to the bridge must bring back."""

    #: the id its one response carries (None: no response with an id)
    answer: Any = None
    #: a client line that must get one error with id null
    null_error: bool = False


def expect(line: bytes, *, cap: int | None, client: bool) -> Expect:
    """The oracle: what one line (one WebSocket message) sent by a client or agent brings back."""
    if cap is not None and len(line) > cap:
        return Expect(null_error=client)
    ok, msg = accepted(line)
    if not ok or type(msg) is not dict:
        return Expect(null_error=client)
    msg_id = msg.get("id")
    if "method" in msg:
        if "id" in msg and valid_id(msg_id):
            return Expect(answer=msg_id)
        if "id" in msg:
            return Expect(null_error=client)
        if _good_notification(msg):
            return Expect()
        return Expect(null_error=client)
    response = (
        msg.get("jsonrpc") == "2.0"
        and "id" in msg
        and (valid_id(msg_id) or msg_id is None)
        and (("result" in msg) != ("error" in msg))
    )
    if response:
        return Expect()
    if valid_id(msg_id):
        return Expect(answer=msg_id)
    return Expect(null_error=client)


def _good_notification(msg: dict[str, Any]) -> bool:
    params = msg.get("params")
    return (
        msg.get("jsonrpc") == "2.0"
        and type(msg.get("method")) is str
        and (params is None or type(params) in (dict, list))
    )


def split_lines(blob: bytes) -> list[bytes]:
    """The lines a stream carries, as the bridge's framing documents them."""
    return [line for line in blob.split(b"\n")[:-1] if line and line != b"\r"]


def check_out(line: bytes) -> str | None:
    """Why a line the bridge wrote is not one well-formed JSON-RPC message (None: it is)."""
    try:
        msg = _GRAMMAR.decode(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"not JSON ({type(exc).__name__}): {line[:200]!r}"
    if type(msg) is not dict or msg.get("jsonrpc") != "2.0":
        return f"not a JSON-RPC 2.0 object: {line[:200]!r}"
    if "method" in msg:
        params = msg.get("params")
        if type(msg["method"]) is not str or not (params is None or type(params) in (dict, list)):
            return f"bad request/notification: {line[:200]!r}"
        if "id" in msg and not valid_id(msg["id"]):
            return f"request with a bad id: {line[:200]!r}"
        return None
    if "id" not in msg or not (valid_id(msg["id"]) or msg["id"] is None):
        return f"response without a usable id: {line[:200]!r}"
    if ("result" in msg) == ("error" in msg):
        return f"response needs exactly one of result/error: {line[:200]!r}"
    if "error" in msg:
        err = msg["error"]
        if type(err) is not dict or type(err.get("code")) is not int:
            return f"error without an integer code: {line[:200]!r}"
        if type(err.get("message")) is not str:
            return f"error without a message: {line[:200]!r}"
    return None


#: what crossed the wire in the current example (shown for a failing one, see :func:`noted`)
TRANSCRIPT: list[str] = []
TRANSCRIPT_MAX: Final = 400


def record(who: str, data: bytes) -> None:
    if len(TRANSCRIPT) < TRANSCRIPT_MAX:
        TRANSCRIPT.append(f"{who} {data[:300]!r}")


def noted(name: str, run: Callable[[], None]) -> None:
    """Run an example; if it fails, attach what crossed the wire (hypothesis prints it)."""
    if out_of_time():
        return
    EXAMPLES[name] += 1
    TRANSCRIPT.clear()
    try:
        run()
    except BaseException:
        try:
            hypothesis.note("\n".join(TRANSCRIPT))
        except hypothesis.errors.InvalidArgument:  # not under hypothesis (atheris)
            print("\n".join(TRANSCRIPT), file=sys.stderr)
        raise


# -- the fuzz agent -----------------------------------------------------------------------------


class AgentCrash(Exception):
    """Raised inside a fuzz agent: its "process" dies."""


@attrs.define(eq=False)
class Life:
    """One run of a fuzz agent's "process": what it sent and what it got back."""

    send: trio.abc.SendStream
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    ids: Iterable[int] = attrs.field(factory=lambda: itertools.count(100))
    sessions: list[str] = attrs.field(factory=list)
    waits: dict[Any, trio.Event] = attrs.field(factory=dict)
    waiting: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = attrs.field(factory=dict)
    #: request-shaped lines it wrote: id key → how many
    asked: collections.Counter[tuple[str, Any]] = attrs.field(factory=collections.Counter)
    #: responses it got: id key → how many
    answered: collections.Counter[tuple[str, Any]] = attrs.field(factory=collections.Counter)
    #: the ids of the requests the bridge sent it, latest last
    bridge_ids: list[Any] = attrs.field(factory=list)
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    ended: bool = False


class FuzzAgent:
    """
    An in-process ACP agent that survives anything and records everything.

    It answers the usual methods whatever their params look like. Prompt texts drive it:
    ``count N`` (N chunks ``<name>:<sid>:<i>``), ``permission`` (asks, waits, reports the
    outcome), ``wait`` (until session/cancel, session/close, ``$/cancel_request`` or
    :meth:`release`), ``crash`` (the process dies). Every line it receives is checked with
    :func:`check_out`; what is wrong goes to :attr:`violations` (an in-process agent's
    exception would only look like a crash).
    """

    def __init__(self, name: str, *, capabilities: dict[str, Any] | None = None) -> None:
        self.name = name
        self.capabilities = (
            capabilities
            if capabilities is not None
            else {
                "loadSession": True,
                "sessionCapabilities": {"list": {}, "resume": {}},
                "auth": {"logout": {}},
            }
        )
        self.lives: list[Life] = []
        self.violations: list[str] = []
        self.counter = itertools.count(1)

    @property
    def life(self) -> Life:
        return self.lives[-1]

    async def __call__(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        life = Life(send)
        self.lives.append(life)
        decoder = LineDecoder(max_line_bytes=1 << 30)
        try:
            async with trio.open_nursery() as nursery:
                while data := await receive.receive_some(65536):
                    for line in decoder.feed(data):
                        assert isinstance(line, bytes)
                        self._line(life, line, nursery)
                nursery.cancel_scope.cancel()
        finally:
            life.ended = True

    def _line(self, life: Life, line: bytes, nursery: trio.Nursery) -> None:
        record(f"{self.name}<", line)
        problem = check_out(line)
        if problem is not None:
            self.violations.append(f"to agent {self.name}: {problem}")
            return
        msg = json.loads(line)
        life.messages.append(msg)
        if "method" not in msg:
            life.answered[id_key(msg["id"])] += 1
            waiter = life.waiting.pop(msg["id"], None)
            if waiter is not None:
                waiter.send_nowait(msg)
            return
        params = msg.get("params") if type(msg.get("params")) is dict else {}
        if "id" not in msg or msg["method"] in ("session/cancel", "$/cancel_request"):
            # (It takes a notification method for what it is, id or not, as an agent that
            # dispatches on the method may: a request-shaped one the bridge forwarded would
            # never be answered, and the client's oracle would see it missing.)
            if msg["method"] in ("session/cancel",):
                self._release(life, params.get("sessionId"))
            elif msg["method"] == "$/cancel_request":
                self._release(life, ("request", id_key(params.get("requestId"))))
            return
        life.bridge_ids.append(msg["id"])
        nursery.start_soon(self._request, life, msg, params)

    def _release(self, life: Life, key: Any) -> None:
        event = life.waits.pop(key, None) if isinstance(key, str | tuple) else None
        if event is not None:
            event.set()

    def release(self) -> None:
        """End every waiting prompt (as if cancelled): the rig's way to reach quiet."""
        for life in self.lives:
            for event in life.waits.values():
                event.set()
            life.waits.clear()

    async def write(self, data: bytes, life: Life | None = None) -> None:
        """Write raw bytes on the agent's stdout (whole, under its lock)."""
        life = life if life is not None else self.life
        if life.ended:
            return
        record(f"{self.name}>", data)
        async with life.lock:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await life.send.send_all(data)

    async def send(self, msg: dict[str, Any], life: Life) -> None:
        await self.write(json.dumps(msg).encode() + b"\n", life)

    async def _request(self, life: Life, msg: dict[str, Any], params: dict[str, Any]) -> None:
        try:
            result = await self._handle(life, msg, params)
        except _Refuse as exc:
            reply = {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {"code": exc.code, "message": "no"},
            }
        else:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        await self.send(reply, life)

    async def _handle(self, life: Life, msg: dict[str, Any], params: dict[str, Any]) -> Any:
        method = msg["method"]
        sid = params.get("sessionId")
        if method == "initialize":
            return {
                "protocolVersion": 1,
                "agentCapabilities": self.capabilities,
                "authMethods": [{"id": "m1", "name": "M"}],
                "agentInfo": {"name": self.name, "version": "0"},
            }
        if method == "session/new":
            new = f"s{next(self.counter)}"
            life.sessions.append(new)
            return {"sessionId": new, "modes": {"currentModeId": "m", "availableModes": []}}
        if method in ("session/load", "session/resume", "session/close", "session/set_mode"):
            if sid not in life.sessions:
                raise _Refuse(-32002)
            if method == "session/load":
                await self._update(life, sid, f"{self.name}:{sid}:replay")
            if method == "session/close":
                life.sessions.remove(sid)
                self._release(life, sid)
            return {}
        if method == "session/list":
            return {"sessions": [{"sessionId": s, "cwd": "/w"} for s in life.sessions]}
        if method == "session/prompt":
            return await self._prompt(life, msg, sid, params.get("prompt"))
        if method in ("authenticate", "logout", "session/set_config_option"):
            return {}
        if method.startswith("_"):
            return {"echo": method}
        raise _Refuse(-32601)

    async def _update(self, life: Life, sid: Any, text: str) -> None:
        update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
        await self.send(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": sid, "update": update},
            },
            life,
        )

    async def _prompt(self, life: Life, msg: dict[str, Any], sid: Any, prompt: Any) -> Any:
        blocks = prompt if isinstance(prompt, list) else []
        text = " ".join(
            b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
        words = text.split()
        command = words[0] if words else ""
        if command == "count" and len(words) > 1 and words[1].isdigit():
            for i in range(min(int(words[1]), 50)):
                await self._update(life, sid, f"{self.name}:{sid}:{i}")
        elif command == "permission":
            req_id = next(life.ids)
            answer_to, answers = trio.open_memory_channel[dict[str, Any]](1)
            life.waiting[req_id] = answer_to
            await self.send(
                {
                    "jsonrpc": "2.0",
                    "id": req_id,
                    "method": "session/request_permission",
                    "params": {
                        "sessionId": sid,
                        "toolCall": {"toolCallId": f"t{req_id}", "title": "do it", "kind": "edit"},
                        "options": [
                            {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                            {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                        ],
                    },
                },
                life,
            )
            life.asked[id_key(req_id)] += 1
            answer = await answers.receive()
            result = answer.get("result")
            outcome = result.get("outcome") if isinstance(result, dict) else None
            await self._update(life, sid, f"{self.name}:outcome:{json.dumps(outcome)}")
        elif command == "wait":
            event = trio.Event()
            life.waits[sid if isinstance(sid, str) else ("sid", repr(sid))] = event
            life.waits[("request", id_key(msg["id"]))] = event
            await self._update(life, sid, f"{self.name}:{sid}:waiting")
            await event.wait()
            return {"stopReason": "cancelled"}
        elif command == "crash":
            await self._update(life, sid, f"{self.name}:{sid}:about-to-crash")
            raise AgentCrash(sid)
        return {"stopReason": "end_turn"}


class _Refuse(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


# -- the raw client -------------------------------------------------------------------------------


class RawClient:
    """
    A client that writes whatever bytes it is given and checks every line it reads.

    Requests from the bridge (the agents' permission and fs calls) are answered by
    ``policies`` in turn: ``ok``, ``error``, ``ignore``, ``twice``, ``garbage``. Answers are
    queued and written only at a line boundary of the program (:meth:`flush`), so they never
    split a line the program is sending in pieces.
    """

    def __init__(self, stream: trio.abc.HalfCloseableStream, policies: list[str]) -> None:
        self.stream = stream
        self.decoder = LineDecoder(max_line_bytes=1 << 30)
        self.lock = trio.Lock()
        self.messages: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.responses: collections.Counter[tuple[str, Any]] = collections.Counter()
        self.null_errors = 0
        self.asked: list[dict[str, Any]] = []
        #: requests from the bridge nobody answered (and it did not withdraw): id key → request
        self.unanswered: dict[tuple[str, Any], dict[str, Any]] = {}
        self.policies = itertools.cycle(policies or ["ok"])
        self.outbox: list[bytes] = []
        self.closed = False

    def reset(self, policies: list[str]) -> None:
        """A new example on this connection: fresh counts, its own answering policies."""
        self.responses.clear()
        self.null_errors = 0
        self.policies = itertools.cycle(policies or ["ok"])

    def answer_all(self) -> None:
        """Answer what is still unanswered (the end of an example: nothing left waiting)."""
        for request in self.unanswered.values():
            self.outbox.extend(answers(request, "ok"))
        self.unanswered.clear()

    async def read_loop(self) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await self.stream.receive_some(65536):
                for line in self.decoder.feed(data):
                    assert isinstance(line, bytes)
                    self.take(line)

    def take(self, line: bytes) -> None:
        record("C<", line)
        problem = check_out(line)
        if problem is not None:
            self.violations.append(f"to client: {problem}")
            return
        msg = json.loads(line)
        self.messages.append(msg)
        if "method" not in msg:
            if msg["id"] is None:
                self.null_errors += 1
                if "error" not in msg:
                    self.violations.append(f"a result with id null: {line[:200]!r}")
            else:
                self.responses[id_key(msg["id"])] += 1
        elif "id" in msg:
            self.asked.append(msg)
            policy = next(self.policies)
            if policy == "ignore":
                self.unanswered[id_key(msg["id"])] = msg
            self.outbox.extend(answers(msg, policy))
        elif msg["method"] in ("$/cancel_request", "_acp_bridge/permission_resolved"):
            params = msg.get("params")
            if isinstance(params, dict):
                request = self.unanswered.pop(id_key(params.get("requestId")), None)
                if request is not None and msg["method"] == "$/cancel_request":
                    # A withdrawn request still gets one answer (ACP: the receiver MUST
                    # respond, -32800 at the least): the agent that asked may be waiting.
                    error = {"code": -32800, "message": "cancelled"}
                    reply = {"jsonrpc": "2.0", "id": request["id"], "error": error}
                    self.outbox.append(json.dumps(reply).encode() + b"\n")

    async def write(self, data: bytes) -> None:
        if self.closed:
            return
        record("C>", data)
        async with self.lock:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.closed = True

    async def flush(self) -> bool:
        """Write the queued answers; True if there were any."""
        if not self.outbox:
            return False
        out, self.outbox = self.outbox, []
        await self.write(b"".join(out))
        return True

    async def close(self) -> None:
        self.closed = True
        async with self.lock:
            await self.stream.aclose()


def answers(request: dict[str, Any], policy: str) -> list[bytes]:
    """What a client answers to a request from the bridge, by policy."""
    req_id = request["id"]
    params = request.get("params") if isinstance(request.get("params"), dict) else {}
    if request["method"] == "session/request_permission":
        options = params.get("options") if isinstance(params.get("options"), list) else []
        first = next((o.get("optionId") for o in options if isinstance(o, dict)), None)
        result: Any = (
            {"outcome": {"outcome": "selected", "optionId": first}}
            if first is not None
            else {"outcome": {"outcome": "cancelled"}}
        )
    elif request["method"] == "fs/read_text_file":
        result = {"content": "hello"}
    else:
        result = {}
    ok = json.dumps({"jsonrpc": "2.0", "id": req_id, "result": result}).encode() + b"\n"
    if policy == "ok":
        return [ok]
    if policy == "error":
        error = {"code": -32000, "message": "no"}
        return [json.dumps({"jsonrpc": "2.0", "id": req_id, "error": error}).encode() + b"\n"]
    if policy == "twice":
        return [ok, ok]
    if policy == "garbage":
        return [
            json.dumps({"jsonrpc": "2.0", "id": req_id, "result": [1, {"outcome": 3}]}).encode()
            + b"\n"
        ]
    return []  # ignore


# -- stages and rigs --------------------------------------------------------------------------
#
# A *stage* is a bridge over fuzz agents (with the SQLite store, journal and audit trail, and
# a wire trace, when its key says so), running in its own nursery; whatever one of its tasks
# raises is kept as the stage's failure. A *rig* is one client connection to a stage.
#
# Starting agents and connecting cost more than most programs, so a run keeps stages across
# hypothesis examples (:class:`Host`: hypothesis runs in a worker thread, the trio loop keeps
# a stage per key), and a connection across ``RECONNECT`` examples: each example initializes
# again, reopens the sessions the last one broke, and ends with every wait ended, a liveness
# prompt and nothing pending; every ``RECONNECT``-th one also disconnects and checks what the
# bridge answered for the client. A stage is replaced after ``RECYCLE`` examples or when it
# failed; after any failure every later example gets a fresh stage and runs whole (connect to
# disconnect), so the example hypothesis shrinks and reports runs alone.

#: examples a kept stage serves before it is replaced
RECYCLE: Final = 250


@attrs.frozen
class StageKey:
    """What a stage is made of."""

    names: tuple[str, ...] = ("a", "b")
    store: bool = False
    traced: bool = False
    cap: int = CAP
    websocket: bool = False


@attrs.define(eq=False)
class Stage:
    key: StageKey
    bridge: Bridge
    agents: dict[str, FuzzAgent]
    nursery: trio.Nursery
    face: WebSocketFace | None = None
    #: what one of its tasks raised (the bridge crashed)
    failure: BaseException | None = None
    ended: trio.Event = attrs.field(factory=trio.Event)
    uses: int = 0
    #: the connection examples share (see :meth:`open_rig`)
    rig: Rig | None = None
    #: serves one example only (a fresh stage): every example ends with a disconnect
    single: bool = False

    async def open_rig(self, policies: list[str]) -> Rig:
        """The connection for an example: the one examples share, or a new one."""
        if self.rig is None:
            self.rig = await connect(self, policies)
        else:
            await self.rig.begin(policies)
        return self.rig

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def close(self) -> None:
        rig, self.rig = self.rig, None
        if rig is not None and self.failure is None:
            with trio.move_on_after(EXAMPLE_TIMEOUT):
                await rig.disconnect()  # a WebSocket left open would wait for its close
        self.nursery.cancel_scope.cancel()
        await self.ended.wait()

    def assert_idle(self, *, connected: bool = False) -> None:
        """Nothing left pending anywhere (once the example's waits were ended)."""
        bridge = self.bridge
        assert connected or not bridge.hub.clients, bridge.hub.clients
        for agent in bridge.hub.agents.values():
            assert not agent.inflight, (agent.name, agent.inflight)
            assert not len(agent.pending), (agent.name, agent.pending.find(lambda e: True))


#: capabilities of the fuzz agents: "a" has everything, "b" nothing optional (the bridge
#: serves load, resume and close for it from its own history)
CAPABILITIES: Final = {
    "a": {
        "loadSession": True,
        "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
        "auth": {"logout": {}},
    },
    "b": {},
}


async def keep_stage(key: StageKey, *, task_status: trio.TaskStatus[Stage]) -> None:
    """Run a stage until it is closed; what its tasks raise becomes its failure."""
    db = open_store(":memory:") if key.store else None
    redactor = Redactor()
    stage: Stage | None = None
    try:
        async with (
            open_wire_trace(io.BytesIO() if key.traced else None, redactor=redactor) as tracer,
            trio.open_nursery() as nursery,
        ):
            agents = {n: FuzzAgent(n, capabilities=CAPABILITIES.get(n)) for n in key.names}
            bridge: Bridge = await nursery.start(
                Bridge(
                    rig_config(agents, max_line_bytes=key.cap),
                    make_in_process_launcher(dict(agents)),
                    audit=AuditLog(db) if db is not None else None,
                    journal=Journal(db) if db is not None else None,
                    tracer=tracer,
                    redactor=redactor,
                ).run
            )
            face = None
            if key.websocket:
                face = WebSocketFace(bridge, ws_settings(), token=WS_TOKEN.encode(), port=WS_PORT)
            stage = Stage(key, bridge, agents, nursery, face)
            task_status.started(stage)
    except Exception as exc:
        if stage is None:
            raise
        stage.failure = exc
    finally:
        if stage is not None:
            stage.ended.set()
        if db is not None:
            db.close()


class Host:
    """Stages kept across the examples of a hypothesis run (see above)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.stages: dict[StageKey, Stage] = {}
        self.failed = False
        self.examples = 0

    async def stage(self, key: StageKey) -> Stage:
        stage = self.stages.get(key)
        if stage is None or self.failed or stage.failure is not None or stage.uses >= RECYCLE:
            if stage is not None:
                await stage.close()
                stage.check()  # a failure while it stopped belongs to the last examples
            stage = await self.nursery.start(keep_stage, key)
            self.stages[key] = stage
        stage.uses += 1
        self.examples += 1
        return stage

    async def close(self) -> None:
        for stage in self.stages.values():
            await stage.close()
            stage.check()


def hosted(test: Callable[[Host | None], None]) -> None:
    """Run ``test(host)`` in a worker thread while a trio loop keeps its stages."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            host = Host(nursery)
            try:
                # Its own limiter: the bridge's threads are waited for by the default one.
                await trio.to_thread.run_sync(test, host, limiter=trio.CapacityLimiter(1))
                await host.close()
            finally:
                nursery.cancel_scope.cancel()

    trio.run(main)


def run_example(host: Host | None, key: StageKey, body: Callable[[Stage], Awaitable[None]]) -> None:
    """
    Run one example on the stage of ``key``: the host's (from its worker thread), or a fresh
    one in a trio loop of its own. A stage failure wins over what the body raised after it.
    """
    if host is None:
        trio.run(_fresh_example, key, body)
    else:
        trio.from_thread.run(_hosted_example, host, key, body)


async def _fresh_example(key: StageKey, body: Callable[[Stage], Awaitable[None]]) -> None:
    async with trio.open_nursery() as nursery:
        stage: Stage = await nursery.start(keep_stage, key)
        stage.single = True
        try:
            await _guarded(stage, body)
        finally:
            await stage.close()
    stage.check()


async def _hosted_example(
    host: Host, key: StageKey, body: Callable[[Stage], Awaitable[None]]
) -> None:
    stage = await host.stage(key)
    stage.single = host.failed  # replays (shrinking) run whole, like a fresh example
    try:
        await _guarded(stage, body)
    except BaseException:
        host.failed = True
        raise


async def _guarded(stage: Stage, body: Callable[[Stage], Awaitable[None]]) -> None:
    try:
        with trio.fail_after(EXAMPLE_TIMEOUT):
            await body(stage)
    except BaseException:
        stage.check()
        raise
    stage.check()


@attrs.define(eq=False)
class Rig:
    """One client connection to a stage."""

    stage: Stage
    client: RawClient
    #: the session the rig opened on each agent: agent name → bridge session id
    sids: dict[str, str] = attrs.field(factory=dict)
    #: the session of the liveness prompt (the programs never name it)
    canary: str | None = None
    #: examples it served
    examples: int = 0
    #: makes ids unique across the examples of the connection
    serial: int = attrs.field(factory=lambda: next(SERIALS))

    async def begin(self, policies: list[str]) -> None:
        """Another example on this connection: initialize again (the last program may have
        changed its capabilities), reopen the sessions it ended."""
        self.serial = next(SERIALS)
        self.client.reset(policies)
        await open_sessions(self)

    async def end(self) -> None:
        """After an example's checks: every ``RECONNECT`` examples (and after every example
        of a single-use stage) the connection goes, and the detach path is checked too."""
        self.examples += 1
        if self.stage.single or self.examples >= RECONNECT:
            await self.disconnect()
            self.check_agents()
            self.stage.assert_idle()
            self.stage.rig = None

    def check_agents(self) -> None:
        """Every request an agent made got one answer (at most one, if its process ended)."""
        for agent in self.agents.values():
            for life in agent.lives:
                for key, count in life.asked.items():
                    got = life.answered[key]
                    assert got <= count, (agent.name, key, got, count)
                    assert life.ended or got == count, (agent.name, key, got, count)
                unexpected = set(life.answered) - set(life.asked)
                assert not unexpected, (agent.name, unexpected)

    @property
    def bridge(self) -> Bridge:
        return self.stage.bridge

    @property
    def agents(self) -> dict[str, FuzzAgent]:
        return self.stage.agents

    async def settle(self) -> None:
        """Until nothing moves: every task blocked, no thread busy, no answer left to write."""
        for _ in range(1000):
            await trio.testing.wait_all_tasks_blocked()
            if await threads_done():
                continue
            if not await self.client.flush():
                return
        raise AssertionError("the rig never settled")

    async def quiesce(self) -> None:
        """End what waits on purpose (cancel its sessions, release waiting prompts)."""
        await self.settle()
        for session in self.bridge.hub.sessions:
            if session.client is not None:
                cancel = {
                    "jsonrpc": "2.0",
                    "method": "session/cancel",
                    "params": {"sessionId": session.bridge_id},
                }
                await self.client.write(_line(cancel))
        await self.settle()
        for agent in self.agents.values():
            agent.release()
        await self.settle()
        self.client.answer_all()
        await self.settle()

    async def disconnect(self) -> None:
        """Drop the connection; what the agents asked of it is answered by the bridge."""
        await self.client.close()
        await self.settle()

    def refs(self) -> dict[str, Callable[[], Any]]:
        """Client-side tokens: the rig's sessions, the bridge's latest requests."""
        asked = self.client.asked
        refs: dict[str, Callable[[], Any]] = {
            "ASKED": lambda: asked[-1]["id"] if asked else 1,
            "ASKED2": lambda: asked[-2]["id"] if len(asked) > 1 else 2,
        }
        for name in self.agents:
            refs[name] = functools.partial(self.sids.get, name, "s0")
        return refs

    def agent_refs(self, name: str) -> dict[str, Callable[[], Any]]:
        """Tokens of an agent's lines: its sessions, the bridge's latest requests to it."""
        agent = self.agents[name]

        def own() -> Any:
            session = self.bridge.hub.sessions.get(self.sids.get(name, ""))
            return session.agent_id if session is not None else "s0"

        def latest() -> Any:
            return agent.life.sessions[-1] if agent.lives and agent.life.sessions else "s0"

        def bridge(index: int) -> Any:
            ids = agent.life.bridge_ids if agent.lives else []
            return ids[index] if len(ids) >= -index else 1

        return {
            "own": own,
            "own2": latest,
            "BRIDGE": functools.partial(bridge, -1),
            "BRIDGE2": functools.partial(bridge, -2),
        }

    def violations(self) -> list[str]:
        out = list(self.client.violations)
        for agent in self.agents.values():
            out += agent.violations
        return out


async def threads_done() -> bool:
    """
    Wait for the worker threads the bridge runs (``trio.to_thread``: store, digests, trace):
    a task waiting on one counts as blocked for ``wait_all_tasks_blocked``. True if any ran.
    """
    limiter = trio.to_thread.current_default_thread_limiter()
    if not limiter.borrowed_tokens:
        return False
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        await limiter.acquire_on_behalf_of(holder)
    for holder in holders:
        limiter.release_on_behalf_of(holder)
    return True


def rig_config(names: Iterable[str], **bridge: Any) -> Config:
    limits: dict[str, Any] = {
        "max_line_bytes": CAP,
        "restart_backoff_initial": 0.0,
        "crash_loop_limit": 1_000_000,
        "detach_grace": 0.0,
        "stop_grace": 0.0,
        **bridge,
    }
    return Config(
        agents={name: AgentConfig(name=name, command="fuzz", start_timeout=10) for name in names},
        bridge=BridgeConfig(**limits),
    )


async def connect(stage: Stage, policies: list[str] | None = None) -> Rig:
    """A new connection to the stage (stdio-like, or WebSocket), initialized, with a session
    open on each agent (``rig.sids``) and a canary session."""
    client_side, bridge_side = trio.testing.memory_stream_pair()
    client: RawClient
    if stage.face is None:
        stage.nursery.start_soon(
            functools.partial(serve_client_stream, stage.bridge, bridge_side, bridge_side, linger=0)
        )
        client = RawClient(client_side, policies or ["ok"])
        stage.nursery.start_soon(client.read_loop)
    else:
        stage.nursery.start_soon(stage.face.handle_connection, bridge_side)
        client = WsClient(client_side, policies or ["ok"])
        stage.nursery.start_soon(client.read_loop)
        await client.handshake()
    rig = Rig(stage, client)
    await open_sessions(rig)
    return rig


#: serial numbers of examples on a connection (their ids never repeat)
SERIALS: Final = itertools.count(1)
#: examples a connection serves before it is closed (and the detach path checked)
RECONNECT: Final = 10


async def open_sessions(rig: Rig) -> None:
    """Initialize; open (again) the sessions the programs use and the canary, where needed."""
    client = rig.client
    caps = {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True}
    init = {"protocolVersion": 1, "clientCapabilities": caps}
    tag = f"{rig.serial}"
    await client.write(
        _line({"jsonrpc": "2.0", "id": f"init-{tag}", "method": "initialize", "params": init})
    )
    wanted = {name: name for name in rig.agents if not alive(rig, rig.sids.get(name))}
    if not alive(rig, rig.canary):
        wanted["canary"] = "a"
    for role, agent in wanted.items():
        params = {"cwd": "/w", "mcpServers": [], "_meta": {"acp_bridge": {"agent": agent}}}
        await client.write(
            _line(
                {
                    "jsonrpc": "2.0",
                    "id": f"new-{tag}-{role}",
                    "method": "session/new",
                    "params": params,
                }
            )
        )
    await rig.settle()
    replies = {
        m["id"]: m for m in client.messages if "method" not in m and isinstance(m["id"], str)
    }
    assert "result" in replies.get(f"init-{tag}", {}), client.messages[-5:]
    for role in wanted:
        sid = replies[f"new-{tag}-{role}"]["result"]["sessionId"]
        if role == "canary":
            rig.canary = sid
        else:
            rig.sids[role] = sid
    client.responses.clear()


def alive(rig: Rig, sid: str | None) -> bool:
    """A session this connection owns and its agent runs."""
    session = rig.bridge.hub.sessions.get(sid) if sid is not None else None
    if session is None or session.state is not SessionState.ACTIVE:
        return False
    agent = rig.bridge.hub.agents[session.agent]
    return (
        session.client is not None and not session.client.closed and agent.state is AgentState.READY
    )


def _line(msg: Any) -> bytes:
    return json.dumps(msg).encode() + b"\n"


async def still_serves(rig: Rig) -> None:
    """Liveness: a prompt on the canary session (a new one if the last died) runs to its end."""
    if not alive(rig, rig.canary):
        await open_sessions(rig)
    client = rig.client
    seen = len(client.messages)
    prompt = {"sessionId": rig.canary, "prompt": [{"type": "text", "text": "count 3"}]}
    live = f"live-{rig.serial}"
    await client.write(
        _line({"jsonrpc": "2.0", "id": live, "method": "session/prompt", "params": prompt})
    )
    await rig.settle()
    replies = {m["id"]: m for m in client.messages[seen:] if "method" not in m}
    answer = replies.get(live, {}).get("result")
    assert answer == {"stopReason": "end_turn"}, client.messages[seen:]
    texts = [
        m["params"]["update"]["content"]["text"]
        for m in client.messages[seen:]
        if m.get("method") == "session/update" and m["params"]["sessionId"] == rig.canary
    ]
    assert [t.rsplit(":", 1)[1] for t in texts] == ["0", "1", "2"], texts


async def finish(rig: Rig) -> None:
    """The end of every example: liveness, every agent request answered, nothing pending."""
    await still_serves(rig)
    rig.check_agents()
    rig.stage.assert_idle(connected=True)
    assert not rig.violations(), rig.violations()
    await rig.end()
    assert not rig.violations(), rig.violations()


# -- generators: programs built from bytes ------------------------------------------------------
#
# A program is built from a byte string by :class:`Source`: hypothesis draws the bytes
# (``st.binary().map(...)``: one draw per example, so an example costs a few microseconds to
# make, and shrinking still works: past the end every choice is 0, and option 0 is always the
# plainest), and atheris can feed the very same builders (``scripts/fuzz --atheris``).


class Source:
    """Choices read from bytes; past the end every choice is the first option."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def below(self, n: int) -> int:
        """A number in [0, n) (n at most 65536)."""
        if n <= 1:
            return 0
        value = 0
        for _ in range(1 if n <= 256 else 2):
            value = value << 8 | (self._data[self._pos] if self._pos < len(self._data) else 0)
            self._pos += 1
        return value % n

    def pick(self, options: tuple[Any, ...] | list[Any]) -> Any:
        return options[self.below(len(options))]

    def rare(self, one_in: int) -> bool:
        """True once in ``one_in`` (False when the bytes run out)."""
        return self.below(one_in) == one_in - 1

    def blob(self, max_size: int) -> bytes:
        size = self.below(max_size + 1)
        out = self._data[self._pos : self._pos + size]
        self._pos += size
        return out


#: raw number tokens json.dumps cannot make: put in place of a "@@N<i>@@" string
NUMBER_TOKENS: Final = (
    b"1e400",
    b"-1e400",
    b"1E+999",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e-400",
    b"-0",
    b"1" + b"0" * 400,
    b"9" * 5000,
    b"0.1e1",
    b"18446744073709551616",
)
#: nesting depths around the interesting limits (the bridge's, and Python's recursion limit)
DEPTHS: Final = (
    MAX_DEPTH - 3,
    MAX_DEPTH - 2,
    MAX_DEPTH,
    MAX_DEPTH + 1,
    400,
    960,
    980,
    985,
    990,
    1000,
    5000,
)
STRINGS: Final = (
    "",
    "s1",
    "s2",
    "s1~b",
    "a",
    "b",
    "/w",
    "/w/x.txt",
    "/etc/passwd",
    "/w/../etc/passwd",
    "relative.txt",
    "\x00",
    "\ud800",
    "a\udfff",
    "\ud83d\ude00",
    "é",
    "line\nbreak",
    '"',
    "\\",
    "_meta",
    "null",
)
KEYS: Final = (
    "sessionId",
    "id",
    "method",
    "params",
    "result",
    "error",
    "jsonrpc",
    "_meta",
    "acp_bridge",
    "text",
    "type",
    "outcome",
    "optionId",
    "toolCall",
    "path",
    "prompt",
    "update",
    "sessionUpdate",
    "code",
    "message",
    "requestId",
    "level",
    "elicitationId",
    "",
    "\ud800",
)
INTS: Final = (0, 1, -1, 2**31, 2**53 + 1, 2**63, -(2**63) - 1, 2**64, 10**400, -(10**400))
FLOATS: Final = (0.5, -0.0, 1e308, -1e308, 5e-324, 1.5, 1e16)
TOKENS: Final = tuple(f"@@N{i}@@" for i in range(len(NUMBER_TOKENS))) + tuple(
    f"@@D{d}@@" for d in DEPTHS
)


def json_value(src: Source, budget: int = 6) -> Any:
    """Any JSON value (with raw-number and deep-nesting tokens, see :func:`render`)."""
    kind = src.below(10 if budget > 0 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return src.pick((True, False))
    if kind == 2:
        return src.below(65536) - 32768
    if kind == 3:
        return src.pick(INTS)
    if kind == 4:
        return src.pick(FLOATS)
    if kind == 5:
        return src.pick(STRINGS)
    if kind == 6:
        return src.blob(8).decode("utf-8", "replace")
    if kind == 7:
        return src.pick(TOKENS)
    if kind == 8:
        return [json_value(src, budget - 2) for _ in range(src.below(4))]
    return {src.pick(KEYS): json_value(src, budget - 2) for _ in range(src.below(4))}


def maybe(src: Source, value: Any) -> Any:
    """The value, or (one time in five) any JSON value instead."""
    return json_value(src) if src.rare(5) else value


def render(msg: Any, *, ascii_only: bool = True) -> bytes:
    """JSON text of a generated value, with the raw number and depth tokens put in."""
    data = json.dumps(msg, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if b"@@" in data:
        for i, token in enumerate(NUMBER_TOKENS):
            data = data.replace(b'"@@N%d@@"' % i, token)
        for d in DEPTHS:
            data = data.replace(b'"@@D%d@@"' % d, b"[" * d + b"]" * d)
    return data


# Messages hold tokens the filler replaces when the line is sent: "$ID" (a fresh unique id),
# "$OLD" (the previous one again), "$ASKED" (the id of the peer's latest request), "$a"/"$b"
# (a live session id), so that the oracle can count answers per id.

SESSION_REFS: Final = ("$a", "$b", "$a", "$b", "nope", "s9", "$own", "$own2")
PROMPTS: Final = (
    "count 2",
    "count 0",
    "count 5",
    "permission",
    "permission",
    "wait",
    "crash",
    "hello",
    "",
)
CLIENT_METHODS: Final = (
    "session/prompt",
    "session/new",
    "session/prompt",
    "session/load",
    "session/resume",
    "session/close",
    "session/prompt",
    "initialize",
    "session/delete",
    "session/fork",
    "session/set_mode",
    "session/set_config_option",
    "session/list",
    "authenticate",
    "logout",
    "_acp_bridge/set_log_level",
    "_acp_bridge/status",
    "_acp_bridge/agents",
    "_ext/thing",
    "_acp_bridge/unknown",
    "unknown/method",
    "$/cancel_request",
    "session/cancel",
    "",
)
CLIENT_NOTIFICATIONS: Final = ("session/cancel", "$/cancel_request", "_ext/note", "whatever")
WEIRD_IDS: Final = ({"x": 1}, True, 1.5, None, [1], -1, "", 0)


def client_params(src: Source, method: str) -> Any:
    sid = maybe(src, src.pick(SESSION_REFS))
    params: Any
    if method == "initialize":
        caps = {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True}
        params = {"protocolVersion": maybe(src, 1), "clientCapabilities": maybe(src, caps)}
        if src.rare(3):
            params["_meta"] = {"acp_bridge": {"seq": maybe(src, True)}}
    elif method in ("session/new", "session/fork"):
        meta: dict[str, Any] = {"agent": maybe(src, src.pick(("a", "b", "zzz")))}
        if src.rare(4):
            meta["unattended"] = maybe(src, True)
        params = {
            "cwd": maybe(src, src.pick(("/w", "relative"))),
            "mcpServers": maybe(src, []),
            "_meta": {"acp_bridge": meta},
        }
        if method == "session/fork":
            params["sessionId"] = sid
    elif method == "session/prompt":
        block: Any = {"type": maybe(src, "text"), "text": src.pick(PROMPTS)}
        if src.rare(8):
            block = {"type": "image", "data": "", "mimeType": "image/png"}
        params = {"sessionId": sid, "prompt": maybe(src, [maybe(src, block)])}
    elif method in ("session/load", "session/resume"):
        params = {"sessionId": sid, "cwd": "/w", "mcpServers": []}
        if src.rare(2):
            params["_meta"] = {"acp_bridge": {"after_seq": maybe(src, src.below(6) - 1)}}
    elif method == "session/list":
        params = {"cursor": maybe(src, src.pick((None, "", "eyJhIjo5fQ==", "!!", "W10=")))}
    elif method == "_acp_bridge/set_log_level":
        params = {"level": maybe(src, src.pick(("debug", "emergency", "loud")))}
    elif method == "authenticate":
        params = {"methodId": maybe(src, "m1")}
    elif method == "$/cancel_request":
        params = {"requestId": maybe(src, src.pick(("$OLD", 1, "nope")))}
    else:
        params = {"sessionId": sid}
        if src.rare(2):
            params["modeId"] = json_value(src)
    if src.rare(10):
        return json_value(src)  # params of the wrong type entirely
    if isinstance(params, dict) and src.rare(6):
        params[src.pick(KEYS)] = json_value(src)
    return params


def envelope(src: Source, method: str, params: Any, *, request: bool) -> dict[str, Any]:
    """A message around (method, params), its envelope sometimes broken."""
    msg: dict[str, Any] = {"jsonrpc": "2.0"}
    if request:
        msg["id"] = "$OLD" if src.rare(6) else src.pick(WEIRD_IDS) if src.rare(8) else "$ID"
    msg["method"] = method
    if params is not None or src.rare(2):
        msg["params"] = params
    damage = src.below(16)
    if damage == 15:
        msg["method"] = src.pick((5, None, ["x"], {"m": 1}))
    elif damage == 14:
        msg["jsonrpc"] = src.pick(("1.0", 2.0, None))
    elif damage == 13:
        del msg["jsonrpc"]
    elif damage == 12:
        msg["result"] = json_value(src)
    elif damage == 11:
        msg[src.pick(KEYS)] = json_value(src)
    return msg


def response(src: Source) -> dict[str, Any]:
    """A response to the peer's latest request (or to none): duplicates, unknown ids..."""
    msg: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": src.pick(("$ASKED", "$ASKED2", 999_999, "x", None)),
    }
    if src.rare(2):
        msg["error"] = maybe(src, {"code": -32000, "message": "no"})
    else:
        msg["result"] = maybe(
            src, src.pick(({}, {"outcome": {"outcome": "selected", "optionId": "yes"}}, None))
        )
    return msg


def client_message(src: Source) -> Any:
    """A message a client might send, before its tokens are filled in."""
    kind = src.below(10)
    if kind <= 5:
        method = src.pick(CLIENT_METHODS)
        return envelope(src, method, client_params(src, method), request=True)
    if kind <= 7:
        method = src.pick(CLIENT_NOTIFICATIONS)
        params: Any = {"sessionId": src.pick(SESSION_REFS)}
        if method == "$/cancel_request":
            params = {"requestId": maybe(src, src.pick(("$OLD", 1, "nope")))}
        return envelope(src, method, params, request=False)
    if kind == 8:
        return response(src)
    batch = [{"jsonrpc": "2.0", "id": "$BATCH", "method": "x"}, json_value(src)]
    return batch[: src.below(3)]


RAW_LINES: Final = (
    b"",
    b"\r",
    b"  ",
    b"\xff\xfe",
    b"\xed\xa0\x80",
    b"\xef\xbb\xbf{}",
    b"{",
    b"[]",
    b"[1,2]",
    b"null",
    b"5",
    b'"x"',
    b"{}",
    b'{"jsonrpc":"2.0"}',
    b'{"jsonrpc":"2.0","id":5}',
    b'{"jsonrpc":"2.0","method":"session/cancel"}{"jsonrpc":"2.0"}',
    b"x" * (CAP - 1),
    b"x" * CAP,
    b"x" * (CAP + 1),
    b"x" * (3 * CAP),
)


def raw_line(src: Source) -> bytes:
    if src.rare(2):
        return src.blob(24)
    return bytes(src.pick(RAW_LINES))


@attrs.frozen
class Item:
    """One line of a program: a message (or raw bytes) and how it goes on the wire."""

    shape: Any
    #: end the line with \r\n
    crlf: bool = False
    #: pad a message with spaces to this many bytes (around the cap); 0: no padding
    pad: int = 0
    #: non-ASCII kept raw, lone surrogates passed through: invalid UTF-8
    raw_unicode: bool = False
    #: where to cut the line into pieces (offsets modulo its length)
    cuts: tuple[int, ...] = ()
    #: send its last piece together with the next line's first
    glue: bool = False
    #: let everything settle once the line is written
    settle: bool = False
    #: which agent writes it (agent programs)
    agent: str = "a"


def item(src: Source, shape: Any, *, agent: str = "a") -> Item:
    return Item(
        shape=shape,
        crlf=src.rare(8),
        pad=src.pick((CAP - 1, CAP, CAP + 1)) if src.rare(12) else 0,
        raw_unicode=src.rare(10),
        cuts=tuple(src.below(4096) for _ in range(src.below(3))),
        glue=src.rare(4),
        settle=src.rare(2),
        agent=agent,
    )


def client_program(data: bytes) -> list[Item]:
    """A client's fuzzed input: mostly messages, some raw bytes."""
    src = Source(data)
    return [
        item(src, raw_line(src) if src.rare(4) else client_message(src))
        for _ in range(1 + src.below(8))
    ]


AGENT_REQUESTS: Final = (
    "session/request_permission",
    "fs/read_text_file",
    "fs/write_text_file",
    "session/request_permission",
    "terminal/create",
    "elicitation/create",
    "terminal/output",
    "_ext/ask",
    "unknown/x",
    "initialize",
    "session/update",
)
AGENT_NOTIFICATIONS: Final = (
    "session/update",
    "session/update",
    "session/update",
    "$/cancel_request",
    "elicitation/complete",
    "_ext/note",
    "session/cancel",
    "unknown",
)
UPDATE_KINDS: Final = (
    "agent_message_chunk",
    "tool_call",
    "current_mode_update",
    "config_option_update",
    "user_message_chunk",
    "plan",
    "???",
)


def agent_params(src: Source, method: str) -> Any:
    sid = maybe(src, src.pick(("$own", "$own", "$own2", "nope")))
    params: Any
    if method == "session/request_permission":
        call = {
            "toolCallId": "t1",
            "title": "x",
            "kind": src.pick(("edit", "execute", "read")),
            "locations": [{"path": maybe(src, "/w/x.txt")}],
            "content": [{"type": "diff", "path": maybe(src, "/w/x.txt"), "newText": "n"}],
        }
        options = [
            {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": maybe(src, "reject_once")},
        ]
        params = {"sessionId": sid, "toolCall": maybe(src, call), "options": maybe(src, options)}
    elif method in ("fs/read_text_file", "fs/write_text_file"):
        params = {"sessionId": sid, "path": maybe(src, src.pick(STRINGS[6:11]))}
        if method == "fs/write_text_file":
            params["content"] = maybe(src, "text")
    elif method == "terminal/create":
        params = {"sessionId": sid, "command": "ls", "cwd": maybe(src, src.pick(("/w", "/etc")))}
    elif method == "elicitation/create":
        params = {"sessionId": sid, "elicitationId": "e1", "mode": "url", "url": "https://x"}
    elif method == "session/update":
        update: dict[str, Any] = {
            "sessionUpdate": maybe(src, src.pick(UPDATE_KINDS)),
            "content": {"type": "text", "text": "fuzz"},
        }
        if src.rare(2):
            update[src.pick(("currentModeId", "configOptions"))] = json_value(src)
        params = {"sessionId": sid, "update": maybe(src, update)}
    elif method == "$/cancel_request":
        params = {"requestId": maybe(src, src.pick(("$OLD", "$BRIDGE", 1)))}
    elif method == "elicitation/complete":
        params = {"elicitationId": maybe(src, "e1")}
    else:
        params = {"sessionId": sid}
    if src.rare(10):
        return json_value(src)
    if isinstance(params, dict) and src.rare(6):
        params[src.pick(KEYS)] = json_value(src)
    return params


def agent_message(src: Source) -> Any:
    kind = src.below(10)
    if kind <= 3:
        method = src.pick(AGENT_REQUESTS)
        return envelope(src, method, agent_params(src, method), request=True)
    if kind <= 7:
        method = src.pick(AGENT_NOTIFICATIONS)
        return envelope(src, method, agent_params(src, method), request=False)
    msg = response(src)
    msg["id"] = src.pick(("$BRIDGE", "$BRIDGE", "$BRIDGE2", 999_999, "x", None))
    return msg


#: what the client does in an agent program (valid requests: the agents' lines are the fuzz)
CLIENT_ACTIONS: Final = (
    ("session/prompt", "$a", "count 2"),
    ("session/prompt", "$a", "permission"),
    ("session/prompt", "$b", "wait"),
    ("session/prompt", "$a", "count 5"),
    ("session/cancel", "$b", ""),
    ("session/prompt", "$b", "permission"),
    ("session/new", "b", ""),
    ("session/load", "$a", ""),
    ("session/resume", "$b", ""),
    ("session/prompt", "$a", "crash"),
)


def client_action(src: Source) -> Any:
    method, target, text = src.pick(CLIENT_ACTIONS)
    if method == "session/cancel":
        return {"jsonrpc": "2.0", "method": method, "params": {"sessionId": target}}
    params: dict[str, Any] = {"sessionId": target}
    if method == "session/new":
        params = {"cwd": "/w", "mcpServers": [], "_meta": {"acp_bridge": {"agent": target}}}
    elif method == "session/prompt":
        params["prompt"] = [{"type": "text", "text": text}]
    elif method in ("session/load", "session/resume"):
        params.update(cwd="/w", mcpServers=[])
    return {"jsonrpc": "2.0", "id": "$ID", "method": method, "params": params}


def agent_program(data: bytes) -> list[Item]:
    """Lines the agents write (``agent`` says which; "client": a client action), interleaved."""
    src = Source(data)
    steps = []
    for _ in range(1 + src.below(10)):
        who = src.pick(("a", "b", "a", "b", "client"))
        if who == "client":
            steps.append(item(src, client_action(src), agent="client"))
        else:
            shape = raw_line(src) if src.rare(5) else agent_message(src)
            steps.append(item(src, shape, agent=who))
    return steps


@attrs.define
class Filler:
    """Turns shapes into bytes as they are sent: fresh unique ids, real ids of the moment."""

    #: what "$<name>" tokens stand for (a function: the value of the moment)
    refs: dict[str, Callable[[], Any]]
    #: the example's serial: its ids are unique on the connection
    serial: int = 0
    prefix: str = "q"
    fresh: Iterable[int] = attrs.field(factory=lambda: itertools.count(1))
    sent_ids: list[Any] = attrs.field(factory=list)

    def fill(self, value: Any) -> Any:
        if type(value) is str and value.startswith("$"):
            if value == "$ID":
                n = next(self.fresh)
                new: Any = f"{self.prefix}{self.serial}.{n}" if n % 2 else self.serial * 1000 + n
                if self.prefix != "q":
                    new = new if n % 2 else -new  # the agents' ints are negative
                self.sent_ids.append(new)
                return new
            if value == "$OLD":
                return self.sent_ids[-1] if self.sent_ids else f"{self.prefix}{self.serial}.0"
            if value == "$BATCH":
                return f"batch{next(self.fresh)}"
            ref = self.refs.get(value[1:])
            return ref() if ref is not None else value
        if type(value) is list:
            return [self.fill(v) for v in value]
        if type(value) is dict:
            return {k: self.fill(v) for k, v in value.items()}
        return value

    def line(self, item: Item, *, newline: bool = True) -> bytes:
        """The bytes of one item (``newline``: with its line ending)."""
        if isinstance(item.shape, bytes):
            data = item.shape
        else:
            data = render(self.fill(item.shape), ascii_only=not item.raw_unicode)
            size = len(data) + item.crlf
            if item.pad and type(item.shape) is dict and size < item.pad:
                data = data[:-1] + b" " * (item.pad - size) + b"}"
        if not newline:
            return data
        return data + (b"\r\n" if item.crlf else b"\n")


def cut(blob: bytes, cuts: Iterable[int]) -> list[bytes]:
    """The blob in pieces, cut at the given offsets (modulo its length)."""
    if not blob:
        return []
    points = sorted({c % len(blob) for c in cuts} - {0})
    pieces, start = [], 0
    for point in points:
        pieces.append(blob[start:point])
        start = point
    pieces.append(blob[start:])
    return pieces


def groups(program: list[Item]) -> list[list[Item]]:
    """Consecutive items glued together (written as one stream of pieces)."""
    out: list[list[Item]] = [[]]
    for step in program:
        out[-1].append(step)
        if not step.glue:
            out.append([])
    return [g for g in out if g]


def pieces_of(lines: list[bytes], steps: list[Item]) -> list[bytes]:
    """The bytes of glued lines, cut where each line's cuts say."""
    blob = b"".join(lines)
    points: list[int] = []
    offset = 0
    for line, step in zip(lines, steps, strict=True):
        points += [offset + c % len(line) for c in step.cuts if c % len(line)]
        offset += len(line)
        points.append(offset)
    return [p for p in cut(blob, points) if p]


# -- the WebSocket client -----------------------------------------------------------------------

WS_TOKEN: Final = "fuzz-token-" + "k" * 32
WS_PORT: Final = 8765


class WsClient(RawClient):
    """The raw client over a WebSocket: one message per text frame (binary if not UTF-8)."""

    def __init__(self, stream: trio.abc.HalfCloseableStream, policies: list[str]) -> None:
        super().__init__(stream, policies)
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.accepted = trio.Event()
        self.ended = trio.Event()
        self.close_code: int | None = None
        self._text: list[str] = []

    async def _send_event(self, event: wsproto.events.Event) -> None:
        if self.closed:
            return
        async with self.lock:
            try:
                await self.stream.send_all(self.ws.send(event))
            except (
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                wsproto.utilities.LocalProtocolError,
            ):
                self.closed = True

    async def handshake(self) -> None:
        headers = [(b"Authorization", f"Bearer {WS_TOKEN}".encode())]
        await self._send_event(
            wsproto.events.Request(
                host=f"127.0.0.1:{WS_PORT}", target="/acp", extra_headers=headers
            )
        )
        await self.accepted.wait()

    async def read_loop(self) -> None:
        try:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while data := await self.stream.receive_some(65536):
                    self.ws.receive_data(data)
                    for event in self.ws.events():
                        await self._event(event)
        finally:
            self.ended.set()

    async def _event(self, event: wsproto.events.Event) -> None:
        if isinstance(event, wsproto.events.AcceptConnection):
            self.accepted.set()
        elif isinstance(event, wsproto.events.TextMessage):
            self._text.append(event.data)
            if event.message_finished:
                self.take("".join(self._text).encode())
                self._text = []
        elif isinstance(event, wsproto.events.Ping):
            await self._send_event(event.response())
        elif isinstance(event, wsproto.events.CloseConnection):
            self.close_code = event.code
            await self._send_event(event.response())
            self.closed = True
        elif isinstance(event, wsproto.events.RejectConnection):
            self.violations.append(f"handshake refused: {event.status_code}")
            self.accepted.set()

    async def write(self, data: bytes) -> None:
        """One message: ``data`` without its trailing newline (binary when not UTF-8)."""
        text = data[:-1] if data.endswith(b"\n") else data
        record("C>", text)
        try:
            message: wsproto.events.Event = wsproto.events.TextMessage(data=text.decode("utf-8"))
        except UnicodeDecodeError:
            message = wsproto.events.BytesMessage(data=text)
        await self._send_event(message)

    async def flush(self) -> bool:
        if not self.outbox:
            return False
        out, self.outbox = self.outbox, []
        for data in out:
            await self.write(data)
        return True

    async def close(self) -> None:
        await self._send_event(wsproto.events.CloseConnection(code=1000))
        self.closed = True
        await self.ended.wait()
        await self.stream.aclose()


def ws_settings(**overrides: Any) -> WebSocketConfig:
    settings: dict[str, Any] = {
        "port": WS_PORT,
        "token": WS_TOKEN,
        "ping_interval": 0,
        "idle_timeout": 0,
        **overrides,
    }
    return WebSocketConfig(**settings)


# -- atheris -------------------------------------------------------------------------------------


def atheris_main(argv: list[str]) -> None:
    """
    ``python -m tests.fuzz_targets TARGET [libFuzzer options]``: one fuzz target under atheris
    (coverage-guided; ``scripts/fuzz --atheris TARGET``). The targets are the tests' own case
    builders and checks fed with raw bytes, a fresh bridge per input. Optional: atheris is not
    a dependency of the project.
    """
    import atheris

    from tests import test_fuzz, test_ordering

    targets = {**test_fuzz.byte_targets(), **test_ordering.byte_targets()}
    if len(argv) < 2 or argv[1] not in targets:
        print(f"usage: {argv[0]} TARGET [libFuzzer options]; targets: {', '.join(targets)}")
        raise SystemExit(2)
    configure_logging(level="error", fmt="json", stream=sys.stderr)
    atheris.instrument_all()
    atheris.Setup([argv[0], *argv[2:]], targets[argv[1]])
    atheris.Fuzz()


if __name__ == "__main__":
    from tests.support.fuzz_targets import atheris_main as main  # the module, not a second copy

    main(sys.argv)
