"""
The attach shim's sessions (kept by ``attach.core``): no I/O, no trio, no clock.

:class:`SessionBook` follows the sessions the editor has open through the shim, and how far
(by the bridge's ``seq``) the editor has each one's updates, so that after a reconnect the shim
can take them back with a replay of exactly what it missed (a session the editor watches, as a
watcher again: never from its owner). It learns of them from the editor's requests and their
answers (:class:`Request`) and from the updates relayed; it says which session/load or
session/resume to send after the shim's own ``initialize`` has been answered, and which
requests of a lost connection the bridge answers on the new one.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import structlog

from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.jsonrpc import JsonObject, dumps
from acp_bridge.protocol.wire import bridge_meta

__all__ = ["Load", "Request", "SessionBook", "Tracked", "error_text", "log_line"]

logger = structlog.get_logger("acp_bridge.attach")

#: Requests carrying a sessionId that the bridge forwards to the agent bound to that session,
#: so that the connection which takes the session back gets their answers. (load/resume of a
#: live session and close without agent support are answered by the bridge at once: an
#: answer to a connection that died is lost.)
_NOT_MOVED: Final = frozenset({"session/load", "session/resume", "session/close"})


@attrs.define(slots=True)
class Tracked:
    """A session the shim takes back after a reconnect."""

    cwd: Any
    mcp_servers: Any
    agent: str | None
    #: seq of the last update relayed to the editor; None: unknown (resumed, nothing since)
    last_seq: int | None = 0
    #: False while the editor's own load/resume of it is out
    confirmed: bool = True
    #: the editor watches it (``_meta.acp_bridge.watch``; ``approve``: and answers approvals):
    #: it is taken back as a watcher, never from its owner
    watch: bool = False
    approve: bool = False


@attrs.define(slots=True)
class Request:
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
    previous: Tracked | None = None


@attrs.frozen
class Load:
    """A session/load or session/resume the shim sends to take a session back."""

    session_id: str
    method: str
    params: JsonObject


class SessionBook:
    """
    The sessions to take back after a reconnect, and from which seq; at most ``max_sessions``
    (more are relayed but not tracked: a reconnect loses them, with a warning in the log).

    Per connection: :meth:`opened` when it is up, :meth:`take_back` once the bridge knows the
    shim again, :meth:`taken_back` with each answer, :meth:`live` when all are in, and
    :meth:`lost` when it drops.
    """

    def __init__(self, max_sessions: int) -> None:
        self._max_sessions = max_sessions
        self.sessions: dict[str, Tracked] = {}
        #: sessions this connection is taking back / took back
        self._reattaching: set[str] = set()
        self._reattached: set[str] = set()
        self.log = logger

    # ------------------------------------------------------------------ the editor's requests

    def opening(self, request: Request, params: JsonObject) -> None:
        """
        ``request`` goes toward the bridge: note the session it creates or opens, and follow
        a session the editor loads or resumes from now on (provisionally, until answered).
        """
        method = request.method
        if method in ("session/new", "session/fork", "session/load", "session/resume"):
            agent = bridge_meta(params).get("agent")
            request.cwd = params.get("cwd")
            request.mcp_servers = params.get("mcpServers", [])
            request.agent = agent if isinstance(agent, str) else None
        if method in ("session/load", "session/resume") and request.session_id is not None:
            self._track_provisionally(request, params)

    def _track_provisionally(self, request: Request, params: JsonObject) -> None:
        """The editor loads or resumes a session: follow its seq from now on."""
        sid = request.session_id
        assert sid is not None
        previous = self.sessions.get(sid)
        if request.method == "session/load":
            after = bridge_meta(params).get("after_seq")
            last: int | None = after if type(after) is int else 0
        else:
            last = previous.last_seq if previous is not None else None
        ours = bridge_meta(params)
        tracked = Tracked(
            request.cwd,
            request.mcp_servers,
            request.agent,
            last,
            confirmed=False,
            watch=ours.get("watch") is True,
            approve=ours.get("watch") is True and ours.get("approve") is True,
        )
        if self._track(sid, tracked):
            request.provisional = True
            request.previous = previous

    def undo(self, request: Request) -> None:
        """A load/resume that will not succeed: its session's tracking goes back."""
        if not request.provisional:
            return
        request.provisional = False
        assert request.session_id is not None
        if request.previous is not None:
            self.sessions[request.session_id] = request.previous
        else:
            self.sessions.pop(request.session_id, None)

    def answered(self, request: Request, msg: JsonObject) -> None:
        """Session bookkeeping when an editor request is answered."""
        method = request.method
        result = msg.get("result")
        ok = "result" in msg
        sid = request.session_id
        if method in ("session/new", "session/fork"):
            new = result.get("sessionId") if isinstance(result, dict) else None
            if ok and isinstance(new, str):
                self._track(new, Tracked(request.cwd, request.mcp_servers, request.agent))
        elif method in ("session/load", "session/resume") and sid is not None:
            tracked = self.sessions.get(sid)
            if not ok or tracked is None:
                self.undo(request)
                return
            request.provisional = False
            tracked.confirmed = True
            last = bridge_meta(result).get("lastSeq")
            if type(last) is int:
                # Up to lastSeq the editor has everything now; later updates follow.
                tracked.last_seq = last
        elif method in ("session/close", "session/delete") and ok and sid is not None:
            self.sessions.pop(sid, None)

    def _track(self, sid: str, tracked: Tracked) -> bool:
        if sid not in self.sessions and len(self.sessions) >= self._max_sessions:
            self.log.warning("session_not_tracked", session=sid, limit=self._max_sessions)
            return False
        self.sessions[sid] = tracked
        return True

    def update(self, params: JsonObject) -> bool:
        """A session/update from the bridge: note its seq; whether to relay it to the editor."""
        sid = params.get("sessionId")
        tracked = self.sessions.get(sid) if isinstance(sid, str) else None
        if tracked is None:
            return True
        seq = bridge_meta(params).get("seq")
        if type(seq) is int:
            tracked.last_seq = seq
        update = params.get("update")
        # The bridge's history holds the editor's own prompts; a replay after a reconnect
        # would echo them back as if someone else had typed them.
        return not (
            sid in self._reattaching
            and isinstance(update, dict)
            and update.get("sessionUpdate") == "user_message_chunk"
        )

    # ------------------------------------------------------------------ connections

    def opened(self) -> None:
        """A new connection: nothing taken back on it yet."""
        self._reattaching.clear()
        self._reattached.clear()

    def lost(self) -> None:
        self._reattaching.clear()

    def live(self) -> None:
        """Every session is back (or given up): replays are over."""
        self._reattaching.clear()

    def take_back(self, out: list[bytes]) -> list[Load]:
        """
        The loads (resumes) that take every confirmed session back on this connection;
        warnings for the editor go to ``out``.
        """
        loads: list[Load] = []
        for sid, tracked in self.sessions.items():
            if not tracked.confirmed:
                continue
            params: JsonObject = {"sessionId": sid, "mcpServers": tracked.mcp_servers}
            if tracked.cwd is not None:
                params["cwd"] = tracked.cwd
            ours: JsonObject = {}
            if tracked.agent is not None:
                ours["agent"] = tracked.agent
            if tracked.watch:
                ours["watch"] = True
                if tracked.approve:
                    ours["approve"] = True
            if tracked.last_seq is None:
                # Resumed by the editor and quiet since: no seq to replay after.
                method = "session/resume"
                out.append(
                    log_line(
                        "warning",
                        "reconnected without replay: updates sent while disconnected may be "
                        "missing",
                        session=sid,
                    )
                )
            else:
                method = "session/load"
                ours["after_seq"] = tracked.last_seq
                if not tracked.watch:  # (only a live session is watched)
                    # The editor's stream goes on even when only the bridge's journal has the
                    # session (the daemon restarted); a prompt then says why it fails.
                    ours["journal_replay"] = True
            if ours:
                params["_meta"] = {"acp_bridge": ours}
            loads.append(Load(sid, method, params))
            self._reattaching.add(sid)
        return loads

    def taken_back(self, sid: str, msg: JsonObject) -> list[bytes]:
        """The answer to the load (resume) that takes ``sid`` back: lines for the editor."""
        tracked = self.sessions.get(sid)
        if "result" not in msg or tracked is None:
            self.sessions.pop(sid, None)
            self.log.warning("session_not_taken_back", session=sid, error=error_text(msg))
            return [
                log_line(
                    "error",
                    "after reconnecting, this session could not be taken back: " + error_text(msg),
                    session=sid,
                )
            ]
        self._reattached.add(sid)
        meta = bridge_meta(msg.get("result"))
        last = meta.get("lastSeq")
        if type(last) is int:
            tracked.last_seq = last
        if meta.get("complete") is False:
            return [
                log_line(
                    "warning",
                    "updates of this session were lost while disconnected (the "
                    "bridge's history no longer held them): resync required",
                    session=sid,
                )
            ]
        return []

    def moved(self, request: Request) -> bool:
        """Whether the bridge answers ``request``, sent on a lost connection, on this one."""
        return request.session_id in self._reattached and request.method not in _NOT_MOVED


# --------------------------------------------------------------------- helpers (pure)


def error_text(msg: JsonObject) -> str:
    err = msg.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    return "no answer"


def log_line(level: str, message: str, *, session: str | None = None) -> bytes:
    """A ``_acp_bridge/log`` notification from the shim itself."""
    params: JsonObject = {"level": level, "logger": "acp_bridge.attach"}
    if session is not None:
        params["sessionId"] = session
    params["data"] = {"message": message}
    return dumps(rpc.notification("_acp_bridge/log", params))
