"""
The attach shim's decisions (run by ``faces.attach``): no I/O, no trio, no clock.

:class:`AttachCore` is fed the editor's lines and the bridge's frames and says what goes where;
``faces.attach`` runs it with one task per direction and peer. The sessions it takes back after
a reconnect are kept by a :class:`~acp_bridge.attach.sessions.SessionBook` it owns.
:class:`Backoff` spaces the reconnection attempts, given a source of jitter.

Ids:
    Editor → bridge ids pass unchanged: the bridge answers the requests of a lost connection on
    the connection that takes their session back, with the same ids. Bridge → editor requests
    (permission, fs, terminal) get ids minted here instead, because the bridge mints them per
    connection and shows the unanswered ones again, under new ids, after a reconnect: the editor
    keeps one id for one question, and its answer goes to the connection that asks now.
    The shim's own requests use string ids with a random per-process prefix.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import json
import secrets
from collections import deque
from typing import Any, Final

import attrs
import structlog

from acp_bridge.attach.sessions import Request as _Request
from acp_bridge.attach.sessions import SessionBook, Tracked, log_line
from acp_bridge.attach.sessions import error_text as _error_text
from acp_bridge.attach.v2 import V2TakeBack
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.jsonrpc import (
    INTERNAL_ERROR,
    JsonObject,
    JsonRpcError,
    JsonRpcId,
    Kind,
    classify,
    dumps,
    loads,
    params_of,
)
from acp_bridge.protocol.wire import bridge_meta as _bridge_meta
from acp_bridge.v2.shapes import wants_v2

__all__ = [
    "HELD_BYTES",
    "HELD_MESSAGES",
    "MAX_ASKS",
    "MAX_PENDING",
    "MAX_SESSIONS",
    "AttachCore",
    "AttachStatistics",
    "Backoff",
    "Outgoing",
    "Phase",
    "ReattachFailed",
    "log_line",
]

logger = structlog.get_logger("acp_bridge.attach")

#: Editor messages held toward the bridge, by count and bytes.
HELD_MESSAGES: Final = 1000
HELD_BYTES: Final = 16 * 1024 * 1024
#: Editor requests waiting for an answer; one more is refused at once.
MAX_PENDING: Final = 10_000
#: Bridge requests waiting for the editor's answer; one more is refused at once.
MAX_ASKS: Final = 10_000
#: Sessions the shim takes back after a reconnect; more are relayed but not tracked.
MAX_SESSIONS: Final = 10_000


class Phase(enum.Enum):
    """Where the connection to the bridge is."""

    #: no connection; editor messages are held
    OFFLINE = "offline"
    #: connected; initializing again and taking sessions back, editor messages still held
    ATTACHING = "attaching"
    LIVE = "live"


class ReattachFailed(Exception):
    """The bridge refused to be initialized again: this connection is no use."""


@attrs.frozen
class Outgoing:
    """One message for the socket, and what to do with it once sent (or not)."""

    text: str
    held: _Held | None


@attrs.frozen
class AttachStatistics:
    phase: Phase
    connection: int
    held_messages: int
    held_bytes: int
    pending_requests: int
    editor_asks: int
    sessions: int


@attrs.define(slots=True)
class _Ask:
    """A bridge request shown to the editor under an id of ours."""

    key: str
    #: its id on the current connection; None after a drop, until the bridge shows it again
    bridge_id: JsonRpcId


@attrs.define(slots=True)
class _Held:
    """An editor message waiting for the socket."""

    text: str
    size: int
    request_id: JsonRpcId = None
    #: an answer to one of the bridge's requests (its id is ours, translated when sent)
    answer: JsonObject | None = None


@attrs.define(slots=True)
class _Internal:
    """A request of the shim's own."""

    kind: str  # "initialize" | "load" | "barrier"
    session_id: str | None = None


class AttachCore:
    """
    The attach shim's decisions, with no I/O: feed it messages, take what it wants sent.

    Editor lines go in through :meth:`from_editor`, bridge frames through :meth:`from_bridge`;
    both return lines for the editor. What goes to the bridge is taken with
    :meth:`next_for_bridge` and confirmed with :meth:`sent` (or put back with :meth:`unsent`).
    :meth:`connection_opened` and :meth:`connection_lost` frame each connection.
    """

    def __init__(
        self,
        *,
        agent: str | None = None,
        nonce: str | None = None,
        held_messages: int = HELD_MESSAGES,
        held_bytes: int = HELD_BYTES,
        max_pending: int = MAX_PENDING,
        max_asks: int = MAX_ASKS,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.agent = agent
        self.phase = Phase.OFFLINE
        #: connections made so far (the current one's number)
        self.epoch = 0
        self._prefix = f"acp-bridge-attach:{nonce or secrets.token_hex(8)}:"
        self._ids = itertools.count(1)
        self._held_messages = held_messages
        self._held_max_bytes = held_bytes
        self._max_pending = max_pending
        self._max_asks = max_asks
        #: the editor's initialize params (with seq on), once one of them went out
        self._init_params: JsonObject | None = None
        self._init_sent = False
        self._book = SessionBook(max_sessions)
        #: the editor speaks ACP v2 (its initialize said so): the take-back is v2's
        self.v2: V2TakeBack | None = None
        self._requests: dict[JsonRpcId, _Request] = {}
        self._asks: dict[int, _Ask] = {}
        self._ask_ids = itertools.count(1)
        self._by_bridge_id: dict[JsonRpcId, int] = {}
        #: asks of a lost connection by content, waiting to be shown again
        self._orphans: dict[str, list[int]] = {}
        self._internal: dict[str, _Internal] = {}
        self._control: deque[str] = deque()
        self._held: deque[_Held] = deque()
        self._held_bytes = 0
        self.log = logger

    @property
    def sessions(self) -> dict[str, Tracked]:
        """The sessions taken back after a reconnect, by id."""
        return self._book.sessions

    def statistics(self) -> AttachStatistics:
        return AttachStatistics(
            phase=self.phase,
            connection=self.epoch,
            held_messages=len(self._held),
            held_bytes=self._held_bytes,
            pending_requests=len(self._requests),
            editor_asks=len(self._asks),
            sessions=len(self.sessions),
        )

    # ------------------------------------------------------------------ editor → bridge

    def has_room(self, size: int) -> bool:
        """Whether a message of ``size`` bytes fits in the queue toward the bridge."""
        return not self._held or (
            len(self._held) < self._held_messages
            and self._held_bytes + size <= self._held_max_bytes
        )

    def must_wait(self, size: int) -> bool:
        """True while connected with a full queue: the editor should wait (not be refused)."""
        return self.phase is Phase.LIVE and not self.has_room(size)

    @property
    def outbound_idle(self) -> bool:
        return not self._held and not self._control

    @property
    def answers_pending(self) -> bool:
        return bool(self._requests)

    def from_editor(self, line: bytes) -> list[bytes]:
        """One line from the editor: queue it for the bridge (or refuse it)."""
        try:
            text = line.decode("utf-8")
            msg = loads(text)
        except (UnicodeDecodeError, JsonRpcError):
            return [dumps(rpc.error(None, JsonRpcError.parse_error()))]
        kind = classify(msg)
        if kind is Kind.REQUEST:
            return self._editor_request(msg, text, len(line))
        if kind is Kind.RESPONSE:
            ask_id = msg["id"]
            if type(ask_id) is not int or ask_id not in self._asks:
                self.log.info("editor_answer_unmatched", id=ask_id)
                return []
            return self._hold(_Held("", len(line), answer=msg))
        # Notifications, and what the bridge refuses itself (bad shapes, batches).
        return self._hold(_Held(text, len(line)))

    def _editor_request(self, msg: JsonObject, text: str, size: int) -> list[bytes]:
        req_id: JsonRpcId = msg["id"]
        method: str = msg["method"]
        if len(self._requests) >= self._max_pending and req_id not in self._requests:
            err = JsonRpcError(INTERNAL_ERROR, "too many requests waiting for the bridge")
            return [dumps(rpc.error(req_id, err))]
        raw = msg.get("params")
        params: JsonObject = raw if isinstance(raw, dict) else {}
        changed = False
        if method == "initialize" and (raw is None or isinstance(raw, dict)):
            # The shim relays the bridge's diagnostics, so it asks for them (at info, unless
            # the editor asked for a level itself).
            level = _bridge_meta(params).get("log")
            params = _with_bridge_meta(params, seq=True, log=level if level is not None else "info")
            msg["params"] = params
            self._init_params = params
            self.v2 = V2TakeBack() if wants_v2(text) else None
            changed = True
        elif (
            method in ("session/new", "session/load", "session/resume")
            and self.agent is not None
            and isinstance(raw, dict)
            and not isinstance(_bridge_meta(params).get("agent"), str)
        ):
            params = _with_bridge_meta(params, agent=self.agent)
            msg["params"] = params
            changed = True
        sid = params.get("sessionId")
        request = _Request(method, sid if isinstance(sid, str) else None)
        self._book.opening(request, params)
        self._requests[req_id] = request
        return self._hold(_Held(_text(msg) if changed else text, size, request_id=req_id))

    def _hold(self, held: _Held) -> list[bytes]:
        if self.phase is not Phase.LIVE and not self.has_room(held.size):
            # Disconnected with a full queue: refuse rather than grow.
            self.log.warning(
                "editor_message_refused",
                reason="queue full while the bridge is unreachable",
                request=held.request_id,
                size=held.size,
            )
            if held.request_id is not None:
                return [self._fail_request(held.request_id, "bridge unreachable")]
            return []
        self._held.append(held)
        self._held_bytes += held.size
        return []

    def _fail_request(self, req_id: JsonRpcId, message: str) -> bytes:
        request = self._requests.pop(req_id, None)
        if request is not None:
            self._book.undo(request)
        return dumps(rpc.error(req_id, JsonRpcError(INTERNAL_ERROR, message)))

    def next_for_bridge(self) -> Outgoing | None:
        """
        The next message to send: the shim's own first; the editor's only once live.

        Call :meth:`sent` after sending it, or :meth:`unsent` if that failed.
        """
        if self._control:
            return Outgoing(self._control.popleft(), None)
        while self.phase is Phase.LIVE and self._held:
            held = self._held.popleft()
            self._held_bytes -= held.size
            if held.answer is None:
                return Outgoing(held.text, held)
            ask = self._asks.get(held.answer["id"])
            if ask is None or ask.bridge_id is None:
                # Settled elsewhere meanwhile (cancelled, answered by rule or deadline).
                self.log.info("editor_answer_dropped", id=held.answer["id"])
                continue
            return Outgoing(_text({**held.answer, "id": ask.bridge_id}), held)
        return None

    def sent(self, out: Outgoing) -> None:
        held = out.held
        if held is None:
            return
        if held.request_id is not None:
            request = self._requests.get(held.request_id)
            if request is not None:
                request.epoch = self.epoch
                self._init_sent = self._init_sent or request.method == "initialize"
        elif held.answer is not None:
            self._forget_ask(held.answer["id"])

    def unsent(self, out: Outgoing) -> None:
        """Sending ``out`` failed: editor messages go back to the front of the queue."""
        if out.held is not None:
            self._held.appendleft(out.held)
            self._held_bytes += out.held.size

    def _forget_ask(self, ask_id: int) -> None:
        ask = self._asks.pop(ask_id, None)
        if ask is not None and ask.bridge_id is not None:
            self._by_bridge_id.pop(ask.bridge_id, None)

    # ------------------------------------------------------------------ bridge → editor

    def from_bridge(self, text: str) -> list[bytes]:
        """
        One frame from the bridge: the lines it means for the editor.

        Raises:
            ReattachFailed: the bridge refused the shim's own ``initialize``.
        """
        try:
            msg = loads(text)
        except JsonRpcError:
            self.log.warning("bridge_message_not_json", size=len(text))
            return []
        kind = classify(msg)
        if kind is Kind.NOTIFICATION:
            return self._bridge_notification(msg, text)
        if kind is Kind.RESPONSE:
            return self._bridge_response(msg, text)
        if kind is Kind.REQUEST:
            return self._bridge_request(msg)
        self.log.warning("bridge_message_invalid")
        return []

    def _bridge_notification(self, msg: JsonObject, text: str) -> list[bytes]:
        method: str = msg["method"]
        params = params_of(msg)
        if method == "session/update":
            if self.v2 is not None:
                self.v2.update(params)
            return [_line(msg, text)] if self._book.update(params) else []
        if method in ("$/cancel_request", "_acp_bridge/permission_resolved"):
            bridge_id = params.get("requestId")
            ask_id = self._by_bridge_id.get(bridge_id) if _hashable(bridge_id) else None
            if ask_id is None:
                return []
            if method == "_acp_bridge/permission_resolved":
                self._forget_ask(ask_id)
            msg["params"] = {**params, "requestId": ask_id}
            return [dumps(msg)]
        return [_line(msg, text)]

    def _bridge_request(self, msg: JsonObject) -> list[bytes]:
        bridge_id: JsonRpcId = msg["id"]
        key = _ask_key(msg)
        orphans = self._orphans.get(key)
        if orphans:
            # Shown again after a reconnect: the editor has it already, under our id.
            ask_id = orphans.pop(0)
            if not orphans:
                del self._orphans[key]
            self._asks[ask_id].bridge_id = bridge_id
            self._by_bridge_id[bridge_id] = ask_id
            return []
        if len(self._asks) >= self._max_asks:
            err = JsonRpcError(INTERNAL_ERROR, "too many requests waiting for the editor")
            self._control.append(_text(rpc.error(bridge_id, err)))
            return []
        ask_id = next(self._ask_ids)
        self._asks[ask_id] = _Ask(key, bridge_id)
        self._by_bridge_id[bridge_id] = ask_id
        msg["id"] = ask_id
        return [dumps(msg)]

    def _bridge_response(self, msg: JsonObject, text: str) -> list[bytes]:
        resp_id = msg["id"]
        if isinstance(resp_id, str) and resp_id.startswith(self._prefix):
            internal = self._internal.pop(resp_id, None)
            return [] if internal is None else self._internal_response(internal, msg)
        request = self._requests.pop(resp_id, None) if _hashable(resp_id) else None
        if request is None:
            if resp_id is None:
                return [_line(msg, text)]  # an error about a message it could not read
            # Answered here already (the connection it went out on was lost meanwhile).
            self.log.info("bridge_answer_unmatched", id=resp_id)
            return []
        self._book.answered(request, msg)
        return [_line(msg, text)]

    # ------------------------------------------------------------------ connections

    def connection_opened(self) -> list[bytes]:
        """A new connection is up: initialize again and take the sessions back."""
        self.epoch += 1
        self._control.clear()
        self._internal.clear()
        self._book.opened()
        self.phase = Phase.ATTACHING
        if self._init_params is None or not self._init_sent:
            return self._maybe_live()
        self._internal_request("initialize", self._init_params, _Internal("initialize"))
        return []

    def connection_lost(self) -> None:
        """The connection is gone: hold everything until the next one is attached."""
        self.phase = Phase.OFFLINE
        self._control.clear()
        self._internal.clear()
        self._book.lost()
        for ask_id, ask in self._asks.items():
            if ask.bridge_id is not None:
                ask.bridge_id = None
                self._orphans.setdefault(ask.key, []).append(ask_id)
        self._by_bridge_id.clear()
        for request in self._requests.values():
            if request.epoch and request.method in ("session/load", "session/resume"):
                self._book.undo(request)

    def give_up(self, reason: str) -> list[bytes]:
        """The bridge stays unreachable: every request still waiting gets an error."""
        out = [
            self._fail_request(req_id, f"bridge unreachable: {reason}")
            for req_id in [*self._requests]
        ]
        self._held.clear()
        self._held_bytes = 0
        self.phase = Phase.OFFLINE
        return out

    def _internal_request(self, method: str, params: JsonObject, internal: _Internal) -> None:
        req_id = f"{self._prefix}{next(self._ids)}"
        self._internal[req_id] = internal
        self._control.append(_text(rpc.request(req_id, method, params)))

    def _internal_response(self, internal: _Internal, msg: JsonObject) -> list[bytes]:
        out: list[bytes] = []
        result = msg.get("result")
        if internal.kind == "initialize":
            if "result" not in msg:
                raise ReattachFailed(f"the bridge refused initialize: {_error_text(msg)}")
            # An initialize of the editor's that went out on a lost connection: this answers it.
            for req_id, request in list(self._requests.items()):
                if request.method == "initialize" and 0 < request.epoch < self.epoch:
                    del self._requests[req_id]
                    out.append(dumps(rpc.result(req_id, result)))
            book = self._book
            loads = (
                book.take_back(out) if self.v2 is None else self.v2.take_back(book.sessions, out)
            )
            for load in loads:
                self._internal_request(load.method, load.params, _Internal("load", load.session_id))
            if self._orphans:
                # Requests the bridge shows again come right after each load's answer; once
                # this is answered, those that did not come were settled while we were away.
                self._internal_request("_acp_bridge/agents", {}, _Internal("barrier"))
        elif internal.kind == "load":
            assert internal.session_id is not None
            out += self._book.taken_back(internal.session_id, msg)
            if self.v2 is not None:
                out += self.v2.taken_back(internal.session_id, msg)
        return out + self._maybe_live()

    def _maybe_live(self) -> list[bytes]:
        if self.phase is not Phase.ATTACHING or self._internal:
            return []
        self.phase = Phase.LIVE
        self._book.live()
        out: list[bytes] = []
        for ids in self._orphans.values():
            for ask_id in ids:
                self._asks.pop(ask_id, None)
                out.append(dumps(rpc.notification("$/cancel_request", {"requestId": ask_id})))
        self._orphans.clear()
        for req_id, request in list(self._requests.items()):
            if request.epoch in (0, self.epoch):
                continue
            if self.v2 is None and self._book.moved(request):
                # (A v2 editor's requests are answered to the lost connection's face.)
                continue  # the bridge answers it on this connection, with the same id
            out.append(
                self._fail_request(
                    req_id, "the connection to the bridge was lost before this was answered"
                )
            )
        return out


# --------------------------------------------------------------------- helpers (pure)


def _text(msg: JsonObject) -> str:
    return dumps(msg)[:-1].decode("utf-8")


def _line(msg: JsonObject, text: str) -> bytes:
    """The frame as an NDJSON line: unchanged, unless it has raw line breaks in it."""
    if "\n" in text or "\r" in text:
        return dumps(msg)
    return text.encode("utf-8") + b"\n"


def _hashable(value: object) -> bool:
    return value is None or type(value) in (int, str, float)


def _with_bridge_meta(params: JsonObject, **fields: Any) -> JsonObject:
    """A copy of ``params`` with ``_meta.acp_bridge`` fields merged in (other _meta kept)."""
    meta = params.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    ours = meta.get("acp_bridge")
    meta["acp_bridge"] = {**(ours if isinstance(ours, dict) else {}), **fields}
    return {**params, "_meta": meta}


def _ask_key(msg: JsonObject) -> str:
    """What identifies a bridge request when it is shown again under another id."""
    body = json.dumps([msg["method"], msg.get("params")], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


@attrs.frozen
class Backoff:
    """
    Delays between connection attempts: doubling from ``initial`` up to ``maximum``.

    Each delay is drawn between half and all of its step (jitter), so shims that lost the
    same daemon do not all knock again at the same instant.
    """

    initial: float = 0.1
    maximum: float = 5.0

    def delay(self, attempt: int, jitter: float) -> float:
        """The delay before retry number ``attempt`` (from 0); ``jitter`` is in [0, 1)."""
        step = min(self.maximum, self.initial * 2.0 ** min(attempt, 64))
        return step * (0.5 + 0.5 * jitter)
