"""
The attach shim in front of an ACP v2 editor (kept by ``attach.core``): no I/O, no trio, no
clock (docs/v2.md).

When the editor's ``initialize`` asks for protocol 2, the shim relays v2 lines to the daemon's
v2 face (``serve --experimental-v2``) unchanged, as it relays v1. What differs is the take-back
after a reconnect, which :class:`V2TakeBack` decides:

- A session is taken back with v2 ``session/resume`` without ``replayFrom``: the face serves
  no cursor but ``start``, whose replay would come under fresh message ids and so show the
  editor its conversation twice. Updates sent while the shim was away are therefore missing,
  and the editor is told so (a ``_acp_bridge/log`` warning per session).
- A prompt turn under way goes on: the face of the new connection takes the turn's answer over
  (the bridge names it among the answers owed) and says ``state_update running`` before its
  resume answer, then reports the turn's end. When it does not (the turn's end is lost: the
  daemon restarted, say) while the editor saw the turn start and not end, the shim ends it for
  the editor with ``state_update idle``, ``stopReason: "error"`` and an error saying why.
- Other editor requests sent on the lost connection are not answered on the new one (the face
  answered them under its own ids): the core fails those requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from acp_bridge.attach.sessions import Load, log_line
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, dumps

if TYPE_CHECKING:
    from acp_bridge.attach.sessions import Tracked

__all__ = ["LOST_TURN", "V2TakeBack"]

#: the error a turn cut by a reconnect ends with, for the editor
LOST_TURN = "the connection to the bridge was lost during this turn: its end was not seen"


class V2TakeBack:
    """
    A v2 editor's sessions across reconnects: which turns run, how to take sessions back.

    Fed every ``session/update`` relayed (:meth:`update`); asked for the resumes after the
    shim's own ``initialize`` (:meth:`take_back`) and what each answer means
    (:meth:`taken_back`). Bounded by the sessions the book tracks: only those are followed.
    """

    def __init__(self) -> None:
        #: sessions whose turn the editor saw start and not end
        self.running: set[str] = set()
        #: sessions whose turn ran at the drop, until their resume says it still does
        self._unsure: set[str] = set()

    def update(self, params: JsonObject) -> None:
        """A v2 ``session/update`` relayed to the editor: follow its turn state."""
        sid, update = params.get("sessionId"), params.get("update")
        if not isinstance(sid, str) or not isinstance(update, dict):
            return
        if update.get("sessionUpdate") != "state_update":
            return
        if update.get("state") == "idle":
            self.running.discard(sid)
        elif update.get("state") in ("running", "requires_action"):
            self.running.add(sid)

    def take_back(self, sessions: dict[str, Tracked], out: list[bytes]) -> list[Load]:
        """The v2 resumes that take every confirmed session back; warnings go to ``out``."""
        self._unsure = self.running & sessions.keys()
        self.running = set()
        loads: list[Load] = []
        for sid, tracked in sessions.items():
            if not tracked.confirmed:
                continue
            params: JsonObject = {"sessionId": sid}
            if tracked.cwd is not None:
                params["cwd"] = tracked.cwd
            if isinstance(tracked.mcp_servers, list):
                params["mcpServers"] = tracked.mcp_servers
            loads.append(Load(sid, "session/resume", params))
            out.append(
                log_line(
                    "warning",
                    "reconnected without replay (ACP v2): updates sent while disconnected are "
                    "missing",
                    session=sid,
                )
            )
        return loads

    def taken_back(self, sid: str, msg: JsonObject) -> list[bytes]:
        """The answer to the resume of ``sid``: lines for the editor."""
        if sid not in self._unsure or sid in self.running or "result" not in msg:
            # Not running at the drop, carried on by the face, or gone (the book says so).
            self._unsure.discard(sid)
            return []
        self._unsure.discard(sid)
        idle = {
            "sessionUpdate": "state_update",
            "state": "idle",
            "stopReason": "error",
            "error": {"code": INTERNAL_ERROR, "message": LOST_TURN},
        }
        return [
            log_line("warning", LOST_TURN, session=sid),
            dumps(rpc.notification("session/update", {"sessionId": sid, "update": idle})),
        ]
