"""
``acp-bridge attach URL``: an editor's stdio on one side, the daemon's WebSocket on the other.

An editor spawns ``attach`` as its agent. Each NDJSON line from the editor goes out as one text
frame; each frame comes back as one line. What the shim adds is continuity: when the socket
drops, it reconnects with backoff, initializes again, takes its sessions back with
``session/load`` after the last update the editor saw (``_meta.acp_bridge.after_seq``), and only
then lets through what the editor sent meanwhile. A network blip costs the editor nothing: its
update stream simply continues, and a prompt that was running is answered under its own id.

:class:`AttachCore` decides (no I/O, no trio, no clock); :func:`attach` runs it with one task per
direction and peer: an editor reader and writer, and per connection a socket reader, a socket
writer and a keepalive.

Ids:
    Editor → bridge ids pass unchanged: the bridge answers the requests of a lost connection on
    the connection that takes their session back, with the same ids. Bridge → editor requests
    (permission, fs, terminal) get ids minted here instead, because the bridge mints them per
    connection and shows the unanswered ones again, under new ids, after a reconnect: the editor
    keeps one id for one question, and its answer goes to the connection that asks now.
    The shim's own requests use string ids with a random per-process prefix.

Backpressure:
    Toward the bridge, one queue of at most :data:`HELD_MESSAGES` messages and
    :data:`HELD_BYTES` bytes. While connected, an editor that writes faster than the socket
    takes waits for room. While disconnected (or taking sessions back), what does not fit is
    refused: a request gets a -32603 "bridge unreachable" error, a notification or an answer is
    dropped and logged. Toward the editor, a bounded channel: a slow editor slows the socket
    reader, and past its own queue the daemon closes the connection, which this shim repairs
    like any drop.

Giving up:
    A connection that made it to live starts a new window of ``reconnect_for`` seconds (the
    daemon's default grace) when it drops; the first connection gets ``connect_for``. Delays
    double from 0.1 s to 5 s, with jitter. A refusal no retry can change (401 token, 403
    Host/Origin, 404 path, an untrusted certificate) ends it at once. Either way every editor
    request still waiting is answered with a -32603 "bridge unreachable: <why>" error, and
    the exit status is 1.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import ipaddress
import itertools
import json
import math
import os
import random
import secrets
import signal
import ssl
import sys
import urllib.parse
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import attrs
import structlog
import trio
import trio_websocket

from acp_bridge._framing import DEFAULT_MAX_LINE_BYTES, LineDecoder, Oversize
from acp_bridge._jsonrpc import (
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
from acp_bridge._jsonrpc import error as error_msg
from acp_bridge._jsonrpc import notification as notification_msg
from acp_bridge._jsonrpc import request as request_msg
from acp_bridge._jsonrpc import result as result_msg

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
    from contextlib import AbstractAsyncContextManager

    #: Opens one WebSocket connection to the daemon (and closes it on exit).
    Connect = Callable[[], AbstractAsyncContextManager[trio_websocket.WebSocketConnection]]

__all__ = [
    "AttachCore",
    "AttachStatistics",
    "Backoff",
    "Outgoing",
    "Phase",
    "ReattachFailed",
    "TokenError",
    "attach",
    "check_url",
    "main_attach",
    "resolve_token",
    "run_attach",
    "websocket_connector",
]

logger = structlog.get_logger("acp_bridge.attach")

#: Exit status: the editor ended (or a signal asked us to stop).
EXIT_OK: Final = 0
#: Exit status: the bridge could not be reached, refused us, or stayed away too long.
EXIT_UNREACHABLE: Final = 1
#: Exit status: bad command line (URL, token).
EXIT_USAGE: Final = 2

#: Seconds to keep trying after a drop: the bridge's default detach grace.
RECONNECT_FOR: Final = 300.0
#: Seconds to keep trying to make the first connection.
CONNECT_FOR: Final = 10.0
#: Editor messages held toward the bridge, by count and bytes.
HELD_MESSAGES: Final = 1000
HELD_BYTES: Final = 16 * 1024 * 1024
#: Editor requests waiting for an answer; one more is refused at once.
MAX_PENDING: Final = 10_000
#: Bridge requests waiting for the editor's answer; one more is refused at once.
MAX_ASKS: Final = 10_000
#: Sessions the shim takes back after a reconnect; more are relayed but not tracked.
MAX_SESSIONS: Final = 10_000
#: Messages queued for the editor's stdout.
EDITOR_QUEUE: Final = 256
#: Keepalive: a ping this often, and a pong within the timeout, or the connection is dropped.
PING_INTERVAL: Final = 20.0
PING_TIMEOUT: Final = 20.0
#: Seconds for TCP, TLS and the upgrade; seconds for a closing handshake.
CONNECT_TIMEOUT: Final = 10.0
CLOSE_TIMEOUT: Final = 2.0
#: After the editor's end of input: how long answers to its last requests are waited for.
LINGER: Final = 2.0
#: HTTP statuses that no retry will change: bad request, token, origin/host, path, method.
FINAL_STATUSES: Final = frozenset({400, 401, 403, 404, 405, 426})

_READ_CHUNK: Final = 64 * 1024
_WRITE_BATCH: Final = 64 * 1024
#: Requests carrying a sessionId that the bridge forwards to the agent bound to that session,
#: so that the connection which takes the session back gets their answers. (load/resume of a
#: live session and close without agent support are answered by the bridge at once: an
#: answer to a connection that died is lost.)
_NOT_MOVED: Final = frozenset({"session/load", "session/resume", "session/close"})
_HINTS: Final = {
    401: "the token was refused: check --token-file / --token-env",
    403: "the daemon refused this Host or Origin (see websocket.allowed_hosts)",
    404: "no ACP endpoint at this path (the default is /acp)",
}


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
class _Tracked:
    """A session the shim takes back after a reconnect."""

    cwd: Any
    mcp_servers: Any
    agent: str | None
    #: seq of the last update relayed to the editor; None: unknown (resumed, nothing since)
    last_seq: int | None = 0
    #: False while the editor's own load/resume of it is out
    confirmed: bool = True


@attrs.define(slots=True)
class _Request:
    """An editor request waiting for its answer."""

    method: str
    session_id: str | None
    #: the connection it went out on; 0 while held
    epoch: int = 0
    cwd: Any = None
    mcp_servers: Any = None
    agent: str | None = None
    #: a load/resume that tracks its session provisionally: what to restore if it fails
    provisional: bool = False
    previous: _Tracked | None = None


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
        self._max_sessions = max_sessions
        #: the editor's initialize params (with seq on), once one of them went out
        self._init_params: JsonObject | None = None
        self._init_sent = False
        self.sessions: dict[str, _Tracked] = {}
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
        #: sessions this connection is taking back / took back
        self._reattaching: set[str] = set()
        self._reattached: set[str] = set()
        self.log = logger

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
            return [dumps(error_msg(None, JsonRpcError.parse_error()))]
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
            return [dumps(error_msg(req_id, err))]
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
        if method in ("session/new", "session/fork", "session/load", "session/resume"):
            agent = _bridge_meta(params).get("agent")
            request.cwd = params.get("cwd")
            request.mcp_servers = params.get("mcpServers", [])
            request.agent = agent if isinstance(agent, str) else None
        if method in ("session/load", "session/resume") and request.session_id is not None:
            self._track_provisionally(request, params)
        self._requests[req_id] = request
        return self._hold(_Held(_text(msg) if changed else text, size, request_id=req_id))

    def _track_provisionally(self, request: _Request, params: JsonObject) -> None:
        """The editor loads or resumes a session: follow its seq from now on."""
        sid = request.session_id
        assert sid is not None
        previous = self.sessions.get(sid)
        if request.method == "session/load":
            after = _bridge_meta(params).get("after_seq")
            last: int | None = after if type(after) is int else 0
        else:
            last = previous.last_seq if previous is not None else None
        tracked = _Tracked(request.cwd, request.mcp_servers, request.agent, last, confirmed=False)
        if self._track(sid, tracked):
            request.provisional = True
            request.previous = previous

    def _undo(self, request: _Request) -> None:
        """A load/resume that will not succeed: its session's tracking goes back."""
        if not request.provisional:
            return
        request.provisional = False
        assert request.session_id is not None
        if request.previous is not None:
            self.sessions[request.session_id] = request.previous
        else:
            self.sessions.pop(request.session_id, None)

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
            self._undo(request)
        return dumps(error_msg(req_id, JsonRpcError(INTERNAL_ERROR, message)))

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
            sid = params.get("sessionId")
            tracked = self.sessions.get(sid) if isinstance(sid, str) else None
            if tracked is not None:
                seq = _bridge_meta(params).get("seq")
                if type(seq) is int:
                    tracked.last_seq = seq
                update = params.get("update")
                if (
                    sid in self._reattaching
                    and isinstance(update, dict)
                    and update.get("sessionUpdate") == "user_message_chunk"
                ):
                    # The bridge's history holds the editor's own prompts; a replay after
                    # a reconnect would echo them back as if someone else had typed them.
                    return []
            return [_line(msg, text)]
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
            self._control.append(_text(error_msg(bridge_id, err)))
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
        self._settle(request, msg)
        return [_line(msg, text)]

    def _settle(self, request: _Request, msg: JsonObject) -> None:
        """Session bookkeeping when an editor request is answered."""
        method = request.method
        result = msg.get("result")
        ok = "result" in msg
        sid = request.session_id
        if method in ("session/new", "session/fork"):
            new = result.get("sessionId") if isinstance(result, dict) else None
            if ok and isinstance(new, str):
                self._track(new, _Tracked(request.cwd, request.mcp_servers, request.agent))
        elif method in ("session/load", "session/resume") and sid is not None:
            tracked = self.sessions.get(sid)
            if not ok or tracked is None:
                self._undo(request)
                return
            request.provisional = False
            tracked.confirmed = True
            last = _bridge_meta(result).get("lastSeq")
            if type(last) is int:
                # Up to lastSeq the editor has everything now; later updates follow.
                tracked.last_seq = last
        elif method in ("session/close", "session/delete") and ok and sid is not None:
            self.sessions.pop(sid, None)

    def _track(self, sid: str, tracked: _Tracked) -> bool:
        if sid not in self.sessions and len(self.sessions) >= self._max_sessions:
            self.log.warning("session_not_tracked", session=sid, limit=self._max_sessions)
            return False
        self.sessions[sid] = tracked
        return True

    # ------------------------------------------------------------------ connections

    def connection_opened(self) -> list[bytes]:
        """A new connection is up: initialize again and take the sessions back."""
        self.epoch += 1
        self._control.clear()
        self._internal.clear()
        self._reattaching.clear()
        self._reattached.clear()
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
        self._reattaching.clear()
        for ask_id, ask in self._asks.items():
            if ask.bridge_id is not None:
                ask.bridge_id = None
                self._orphans.setdefault(ask.key, []).append(ask_id)
        self._by_bridge_id.clear()
        for request in self._requests.values():
            if request.epoch and request.method in ("session/load", "session/resume"):
                self._undo(request)

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
        self._control.append(_text(request_msg(req_id, method, params)))

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
                    out.append(dumps(result_msg(req_id, result)))
            self._take_sessions_back(out)
        elif internal.kind == "load":
            sid = internal.session_id
            assert sid is not None
            tracked = self.sessions.get(sid)
            if "result" not in msg or tracked is None:
                self.sessions.pop(sid, None)
                self.log.warning("session_not_taken_back", session=sid, error=_error_text(msg))
                out.append(
                    _log_line(
                        "error",
                        "after reconnecting, this session could not be taken back: "
                        + _error_text(msg),
                        session=sid,
                    )
                )
            else:
                self._reattached.add(sid)
                meta = _bridge_meta(result)
                last = meta.get("lastSeq")
                if type(last) is int:
                    tracked.last_seq = last
                if meta.get("complete") is False:
                    out.append(
                        _log_line(
                            "warning",
                            "updates of this session were lost while disconnected (the "
                            "bridge's history no longer held them): resync required",
                            session=sid,
                        )
                    )
        return out + self._maybe_live()

    def _take_sessions_back(self, out: list[bytes]) -> None:
        for sid, tracked in self.sessions.items():
            if not tracked.confirmed:
                continue
            params: JsonObject = {"sessionId": sid, "mcpServers": tracked.mcp_servers}
            if tracked.cwd is not None:
                params["cwd"] = tracked.cwd
            ours: JsonObject = {}
            if tracked.agent is not None:
                ours["agent"] = tracked.agent
            if tracked.last_seq is None:
                # Resumed by the editor and quiet since: no seq to replay after.
                method = "session/resume"
                out.append(
                    _log_line(
                        "warning",
                        "reconnected without replay: updates sent while disconnected may be "
                        "missing",
                        session=sid,
                    )
                )
            else:
                method = "session/load"
                ours["after_seq"] = tracked.last_seq
            if ours:
                params["_meta"] = {"acp_bridge": ours}
            self._internal_request(method, params, _Internal("load", sid))
            self._reattaching.add(sid)
        if self._orphans:
            # Requests the bridge shows again come right after each load's answer; once
            # this is answered, those that did not come were settled while we were away.
            self._internal_request("_acp_bridge/agents", {}, _Internal("barrier"))

    def _maybe_live(self) -> list[bytes]:
        if self.phase is not Phase.ATTACHING or self._internal:
            return []
        self.phase = Phase.LIVE
        self._reattaching.clear()
        out: list[bytes] = []
        for ids in self._orphans.values():
            for ask_id in ids:
                self._asks.pop(ask_id, None)
                out.append(dumps(notification_msg("$/cancel_request", {"requestId": ask_id})))
        self._orphans.clear()
        for req_id, request in list(self._requests.items()):
            if request.epoch in (0, self.epoch):
                continue
            if request.session_id in self._reattached and request.method not in _NOT_MOVED:
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


def _bridge_meta(params: object) -> JsonObject:
    """``params._meta.acp_bridge``, or {}."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    ours = meta.get("acp_bridge") if isinstance(meta, dict) else None
    return ours if isinstance(ours, dict) else {}


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


def _error_text(msg: JsonObject) -> str:
    err = msg.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    return "no answer"


def _log_line(level: str, message: str, *, session: str | None = None) -> bytes:
    """A ``_acp_bridge/log`` notification from the shim itself."""
    params: JsonObject = {"level": level, "logger": "acp_bridge.attach"}
    if session is not None:
        params["sessionId"] = session
    params["data"] = {"message": message}
    return dumps(notification_msg("_acp_bridge/log", params))


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


# --------------------------------------------------------------------- the trio adapter


@attrs.frozen
class _Ended:
    """How one connection ended: ``reason`` None when we closed it (the editor ended)."""

    reason: str | None
    final: bool = False


class _Link:
    """One connection's tasks: the first failure ends them all, and says why."""

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.reason: str | None = None
        #: we are closing it (the editor ended): what the other tasks see is no failure
        self.closing = False

    def fail(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


class _Attach:
    def __init__(
        self,
        core: AttachCore,
        editor_in: trio.abc.ReceiveStream,
        editor_out: trio.abc.SendStream,
        connect: Connect,
        *,
        reconnect_for: float,
        connect_for: float,
        backoff: Backoff,
        ping_interval: float,
        ping_timeout: float,
        max_line_bytes: int,
        jitter: Callable[[], float],
    ) -> None:
        self._core = core
        self._editor_in = editor_in
        self._editor_out = editor_out
        self._connect = connect
        self._reconnect_for = reconnect_for
        self._connect_for = connect_for
        self._backoff = backoff
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._max_line_bytes = max_line_bytes
        self._jitter = jitter
        self._to_editor, self._editor_queue = trio.open_memory_channel[bytes](EDITOR_QUEUE)
        #: set (and replaced) whenever the core's state moved: queue room, work, phase
        self._changed = trio.Event()
        #: the editor is done (end of input, or its output closed)
        self._ended = trio.Event()
        #: after the editor's end: when to stop delivering what it sent and waiting for answers
        self._stop_at = math.inf
        self._live = False
        #: the connection attempt or the backoff wait under way (the editor's end cuts it)
        self._attempt: trio.CancelScope | None = None
        self._backoff_wait: trio.CancelScope | None = None
        self._log = logger

    def _kick(self) -> None:
        if self._core.phase is Phase.LIVE and not self._live:
            self._live = True
            self._log.info("attach_live", connection=self._core.epoch)
        self._changed.set()
        self._changed = trio.Event()

    def _editor_done(self, why: str, *, at_once: bool = False) -> None:
        """
        The editor ended. What it sent still goes out, and answers to its requests are
        waited for, for up to :data:`LINGER` seconds (a script that pipes its requests in
        gets its answers); with nothing left to deliver, or ``at_once``, it stops now.
        """
        if self._ended.is_set():
            return
        core = self._core
        idle = core.outbound_idle and not core.answers_pending
        now = trio.current_time()
        self._stop_at = now if at_once or idle else now + LINGER
        self._log.info("editor_ended", reason=why, linger=self._stop_at - now)
        self._ended.set()
        self._kick()
        if self._backoff_wait is not None:
            self._backoff_wait.deadline = min(self._backoff_wait.deadline, self._stop_at)
        if self._attempt is not None:
            if core.phase is Phase.OFFLINE:
                # Still connecting: nothing to close properly.
                self._attempt.deadline = self._stop_at
            else:
                # Connected: the socket writer closes it properly by then.
                self._attempt.deadline = self._stop_at + 2 * CLOSE_TIMEOUT

    async def run(self) -> int:
        async with trio.open_nursery() as outer:
            outer.start_soon(self._editor_writer)
            async with trio.open_nursery() as inner:
                inner.start_soon(self._editor_reader)
                status = await self._connection_loop()
                inner.cancel_scope.cancel()
            # What is queued for the editor is written, within reason.
            await self._to_editor.aclose()
            outer.cancel_scope.deadline = trio.current_time() + CLOSE_TIMEOUT
        return status

    # ------------------------------------------------------------------ the editor side

    async def _editor_reader(self) -> None:
        decoder = LineDecoder(max_line_bytes=self._max_line_bytes)
        try:
            while data := await self._editor_in.receive_some(_READ_CHUNK):
                for line in decoder.feed(data):
                    await self._from_editor(line)
            rest = decoder.feed_eof()
            if rest is not None:
                await self._from_editor(rest)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._editor_done("end of input")

    async def _from_editor(self, line: bytes | Oversize) -> None:
        if isinstance(line, Oversize):
            err = JsonRpcError.invalid_request(f"message of {line.size} bytes is over the limit")
            await self._to_editor.send(dumps(error_msg(None, err)))
            return
        while self._core.must_wait(len(line)):
            await self._changed.wait()
        lines = self._core.from_editor(line)
        self._kick()
        for out in lines:
            await self._to_editor.send(out)

    async def _editor_writer(self) -> None:
        """The one writer of the editor's stdout: batches what is queued."""
        queue = self._editor_queue
        try:
            async for data in queue:
                batch = [data]
                size = len(data)
                while size < _WRITE_BATCH:
                    try:
                        more = queue.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    batch.append(more)
                    size += len(more)
                await self._editor_out.send_all(b"".join(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._editor_done("editor closed its input", at_once=True)

    # ------------------------------------------------------------------ connections

    async def _connection_loop(self) -> int:
        window = self._connect_for
        since = trio.current_time()
        attempt = 0
        while trio.current_time() < self._stop_at:
            self._live = False
            ended = _Ended("cancelled")
            with trio.CancelScope() as self._attempt:
                ended = await self._try_connection()
            self._attempt = None
            if self._ended.is_set() and (
                ended.reason is None or trio.current_time() >= self._stop_at
            ):
                break
            assert ended.reason is not None
            self._core.connection_lost()
            self._kick()
            if self._live:
                # It was attached: a new outage starts now, with the full window.
                since = trio.current_time()
                window = self._reconnect_for
                attempt = 0
            if ended.final:
                return await self._give_up(ended.reason)
            elapsed = trio.current_time() - since
            if elapsed >= window:
                return await self._give_up(f"{ended.reason} (gave up after {elapsed:.0f}s)")
            delay = min(self._backoff.delay(attempt, self._jitter()), window - elapsed)
            attempt += 1
            self._log.warning("attach_disconnected", reason=ended.reason, retry_in=delay)
            with trio.move_on_at(min(trio.current_time() + delay, self._stop_at)) as waiting:
                self._backoff_wait = waiting
                await trio.sleep_forever()
            self._backoff_wait = None
        return EXIT_OK

    async def _give_up(self, reason: str) -> int:
        self._log.error("attach_gave_up", reason=reason)
        lines = self._core.give_up(reason)
        lines.append(_log_line("error", f"bridge unreachable: {reason}"))
        with trio.move_on_after(CLOSE_TIMEOUT):
            for line in lines:
                await self._to_editor.send(line)
        return EXIT_UNREACHABLE

    async def _try_connection(self) -> _Ended:
        try:
            async with self._connect() as ws:
                return await self._serve_connection(ws)
        except trio_websocket.ConnectionRejected as exc:
            status = exc.status_code
            reason = f"the bridge refused the connection: HTTP {status}"
            hint = _HINTS.get(status)
            if hint is not None:
                reason += f" ({hint})"
            self._log.warning("attach_refused", status=status)
            return _Ended(reason, final=status in FINAL_STATUSES)
        except trio_websocket.HandshakeError as exc:
            cause = exc.__cause__
            if isinstance(cause, ssl.SSLCertVerificationError):
                return _Ended(f"TLS certificate not trusted: {cause.verify_message}", final=True)
            return _Ended(_describe(cause or exc))
        except (trio_websocket.ConnectionClosed, OSError, trio.BrokenResourceError) as exc:
            return _Ended(_describe(exc))

    async def _serve_connection(self, ws: trio_websocket.WebSocketConnection) -> _Ended:
        connection_id = next(
            (
                v.decode("latin-1")
                for k, v in ws.handshake_headers
                if k.lower() == b"acp-connection-id"
            ),
            None,
        )
        self._log.info("attach_connected", connection=self._core.epoch + 1, id=connection_id)
        lines = self._core.connection_opened()
        self._kick()
        if self._attempt is not None and self._stop_at < math.inf:
            # The editor ended while we were connecting: the socket writer closes properly.
            self._attempt.deadline = self._stop_at + 2 * CLOSE_TIMEOUT
        for line in lines:
            await self._to_editor.send(line)
        async with trio.open_nursery() as nursery:
            link = _Link(nursery.cancel_scope)
            nursery.start_soon(self._socket_reader, ws, link)
            nursery.start_soon(self._socket_writer, ws, link)
            if self._ping_interval > 0:
                nursery.start_soon(self._keepalive, ws, link)
        return _Ended(None if link.closing else link.reason or "connection ended")

    async def _socket_reader(self, ws: trio_websocket.WebSocketConnection, link: _Link) -> None:
        try:
            while True:
                message = await ws.get_message()
                if not isinstance(message, str):
                    continue  # binary frames carry no ACP
                lines = self._core.from_bridge(message)
                self._kick()
                for line in lines:
                    await self._to_editor.send(line)
        except trio_websocket.ConnectionClosed as exc:
            link.fail(_closed_text(exc))
        except ReattachFailed as exc:
            link.fail(str(exc))

    async def _socket_writer(self, ws: trio_websocket.WebSocketConnection, link: _Link) -> None:
        core = self._core
        while True:
            out = core.next_for_bridge()
            if out is None:
                if self._ended.is_set() and (
                    (core.outbound_idle and not core.answers_pending)
                    or trio.current_time() >= self._stop_at
                ):
                    break
                with trio.move_on_at(self._stop_at):
                    await self._changed.wait()
                continue
            try:
                await ws.send_message(out.text)
            except trio_websocket.ConnectionClosed as exc:
                core.unsent(out)
                link.fail(_closed_text(exc))
                return
            except BaseException:
                core.unsent(out)
                raise
            core.sent(out)
            self._kick()
        # The editor is done: close the socket properly, then end this connection.
        self._log.info("attach_closing")
        link.closing = True
        with trio.move_on_after(CLOSE_TIMEOUT):
            await ws.aclose()
        link.scope.cancel()

    async def _keepalive(self, ws: trio_websocket.WebSocketConnection, link: _Link) -> None:
        try:
            while True:
                await trio.sleep(self._ping_interval)
                with trio.move_on_after(self._ping_timeout):
                    await ws.ping()
                    continue
                link.fail(f"no pong within {self._ping_timeout:g}s")
                return
        except trio_websocket.ConnectionClosed as exc:
            link.fail(_closed_text(exc))


def _closed_text(exc: trio_websocket.ConnectionClosed) -> str:
    reason = exc.reason
    if reason is None:
        return "connection closed"
    text = f"connection closed ({reason.code} {reason.name})"
    return f"{text}: {reason.reason}" if reason.reason else text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect: {exc.strerror}"
    if isinstance(exc, trio_websocket.ConnectionTimeout):
        return "cannot connect: timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def attach(
    editor_in: trio.abc.ReceiveStream,
    editor_out: trio.abc.SendStream,
    connect: Connect,
    *,
    agent: str | None = None,
    reconnect_for: float = RECONNECT_FOR,
    connect_for: float = CONNECT_FOR,
    backoff: Backoff | None = None,
    ping_interval: float = PING_INTERVAL,
    ping_timeout: float = PING_TIMEOUT,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    jitter: Callable[[], float] = random.random,
    core: AttachCore | None = None,
) -> int:
    """
    Relay the editor's streams to the bridge until the editor ends; repair every drop.

    Args:
        editor_in: what the editor writes (NDJSON).
        editor_out: what the editor reads (NDJSON; protocol only).
        connect: opens one WebSocket connection (see :func:`websocket_connector`).
        agent: the agent of every ``session/new`` (and load/resume) that names none.
        reconnect_for: seconds to keep trying after a drop before giving up.
        connect_for: the same, for the first connection.
        backoff: delays between attempts.
        ping_interval: seconds between keepalive pings (0: none); ``ping_timeout`` for the
            pong.
        max_line_bytes: the longest editor line accepted.
        jitter: a source of numbers in [0, 1) for the backoff.
        core: the decisions (a fresh :class:`AttachCore` by default).

    Returns:
        The exit status: :data:`EXIT_OK` when the editor ended, :data:`EXIT_UNREACHABLE` after
        giving up (every request still waiting was answered with an error first).

    Resource handling:
        Does not close the editor's streams. When the editor's input ends, what it sent still
        goes out and answers still come back for up to :data:`LINGER` seconds (at once if
        nothing is left), then the socket is closed with a closing handshake.

    Cancellation:
        Cancelling it drops the connection without a closing handshake.
    """
    runner = _Attach(
        core if core is not None else AttachCore(agent=agent),
        editor_in,
        editor_out,
        connect,
        reconnect_for=reconnect_for,
        connect_for=connect_for,
        backoff=backoff if backoff is not None else Backoff(),
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        max_line_bytes=max_line_bytes,
        jitter=jitter,
    )
    return await runner.run()


def websocket_connector(
    url: str,
    token: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    max_message_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ssl_context: ssl.SSLContext | None = None,
    open_stream: Callable[[], Awaitable[trio.abc.Stream]] | None = None,
) -> Connect:
    """
    How :func:`attach` opens a connection: ``url`` with ``Authorization: Bearer token``.

    ``open_stream`` replaces the TCP (and TLS, for ``wss://``) connection, for tests.

    Resource handling:
        The connector owns the byte stream under each connection and always closes it
        (trio-websocket 0.12 leaves it open when the peer ended the connection).

    Raises (on entering):
        trio_websocket.ConnectionRejected: the daemon answered the upgrade with an HTTP error.
        trio_websocket.HandshakeError: no connection within ``connect_timeout``, or a network
            or TLS error (the cause is chained).
    """
    parts = urllib.parse.urlsplit(url)
    secure = parts.scheme == "wss"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port in (80, 443) else f"{shown}:{port}"
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = [(b"Authorization", b"Bearer " + token.encode("ascii"))]
    if secure and ssl_context is None:
        ssl_context = ssl.create_default_context()

    async def open_default() -> trio.abc.Stream:
        if ssl_context is not None:
            return await trio.open_ssl_over_tcp_stream(
                host, port, ssl_context=ssl_context, https_compatible=True
            )
        return await trio.open_tcp_stream(host, port)

    opener = open_stream if open_stream is not None else open_default

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[trio_websocket.WebSocketConnection]:
        try:
            with trio.fail_after(connect_timeout):
                stream = await opener()
        except trio.TooSlowError:
            raise trio_websocket.ConnectionTimeout from None
        except OSError as exc:
            raise trio_websocket.HandshakeError from exc
        try:
            with _single_error():
                async with trio.open_nursery() as nursery:
                    try:
                        with trio.fail_after(connect_timeout):
                            ws = await trio_websocket.wrap_client_stream(
                                nursery,
                                stream,  # type: ignore[arg-type]  # any stream will do
                                host_header,
                                resource,
                                extra_headers=headers,
                                max_message_size=max_message_bytes,
                            )
                    except trio.TooSlowError:
                        raise trio_websocket.ConnectionTimeout from None
                    try:
                        yield ws
                    finally:
                        with trio.move_on_after(CLOSE_TIMEOUT):
                            await ws.aclose()
                        nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await stream.aclose()

    return connect


@contextlib.contextmanager
def _single_error() -> Iterator[None]:
    """Let the one exception of a nursery through as itself (trio wraps it in a group)."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = [e for e in _leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


# --------------------------------------------------------------------- the command


class TokenError(Exception):
    """No usable token (or URL): a usage error."""


def check_url(url: str) -> str:
    """
    A ``ws://`` or ``wss://`` URL with a host, else :class:`TokenError`.

    A token sent over plain ``ws://`` to another machine travels in clear text: that is
    allowed (an SSH tunnel, a trusted network) but logged.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise TokenError(f"not a WebSocket URL: {url!r} (expected ws://HOST:PORT/acp)")
    if parts.scheme == "ws" and not _is_loopback(parts.hostname):
        logger.warning("attach_insecure_url", host=parts.hostname, hint="use wss:// or a tunnel")
    return url


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(
    token_file: str | None,
    token_env: str | None,
    url: str,
    *,
    environ: Mapping[str, str] | None = None,
) -> str:
    """
    The bearer token: from ``token_file`` (whitespace stripped), else the variable
    ``token_env``; with neither, ``$ACP_BRIDGE_TOKEN``, else (for a loopback URL only) the
    token file a local ``acp-bridge serve`` generates under its state directory.

    Raises:
        TokenError: the file is missing or unreadable, the variable unset, the token empty or
            not fit for an HTTP header.
    """
    env = os.environ if environ is None else environ
    if token_file is not None:
        try:
            with open(token_file, "rb") as f:
                raw = f.read(4096)
        except OSError as exc:
            raise TokenError(f"token file {token_file}: {exc.strerror or exc}") from None
        token = raw.decode("utf-8", "replace").strip()
        source = f"token file {token_file}"
    elif token_env is not None:
        token = env.get(token_env, "").strip()
        source = f"environment variable {token_env}"
    elif env.get("ACP_BRIDGE_TOKEN", "").strip():
        token = env["ACP_BRIDGE_TOKEN"].strip()
        source = "environment variable ACP_BRIDGE_TOKEN"
    else:
        from acp_bridge._config import default_state_dir

        host = urllib.parse.urlsplit(url).hostname or ""
        default = default_state_dir() / "token"
        if not _is_loopback(host) or not default.is_file():
            raise TokenError(
                "no token: give --token-file FILE or --token-env VAR "
                "(`acp-bridge serve` prints where its token is)"
            )
        return resolve_token(str(default), None, url, environ=env)
    if not token:
        raise TokenError(f"{source}: empty")
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise TokenError(f"{source}: not a token (spaces or control characters)")
    return token


def run_attach(
    url: str,
    *,
    token: str,
    agent: str | None,
    reconnect_for: float,
    protocol_fd: int,
    connect_for: float = CONNECT_FOR,
) -> int:
    """
    ``acp-bridge attach``: relay stdin and ``protocol_fd`` to ``url`` until stdin ends.

    SIGTERM and SIGINT stop it (status 0). Returns the exit status (see :func:`attach`).
    """

    async def main() -> int:
        editor_in = trio.lowlevel.FdStream(os.dup(0))
        editor_out = trio.lowlevel.FdStream(protocol_fd)
        status = EXIT_OK
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_signals, nursery.cancel_scope)
                status = await attach(
                    editor_in,
                    editor_out,
                    websocket_connector(url, token),
                    agent=agent,
                    reconnect_for=reconnect_for,
                    connect_for=connect_for,
                )
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await editor_in.aclose()
                await editor_out.aclose()
        return status

    return trio.run(main)


async def _cancel_on_signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logger.info("signal_received", signal=signal.Signals(signum).name)
            scope.cancel()
            return


def main_attach(args: argparse.Namespace) -> int:
    """The ``attach`` subcommand, from parsed arguments (see ``_cli.build_parser``)."""
    from acp_bridge._log import configure_logging
    from acp_bridge._stdio import claim_stdout

    # Before anything can print: from here on fd 1 is stderr, the protocol has its own fd.
    protocol_fd = claim_stdout()
    configure_logging(level=args.log_level, fmt=args.log_format, file=args.log_file)
    try:
        url = check_url(args.url)
        token = resolve_token(args.token_file, args.token_env, url)
    except TokenError as exc:
        print(f"acp-bridge attach: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run_attach(
        url,
        token=token,
        agent=args.agent,
        reconnect_for=args.reconnect_for,
        connect_for=args.connect_for,
        protocol_fd=protocol_fd,
    )
