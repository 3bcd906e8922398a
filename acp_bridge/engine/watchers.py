"""
A session's watchers (docs/daemon.md#watchers): connections that follow a session they do
not own. What the session records goes to each of them in the order the owner gets it, and
never waits on one: a watcher that stops reading is cut off (it catches up with
``after_seq``), so it never slows the owner or the agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from acp_bridge.protocol.jsonrpc import dumps
from acp_bridge.protocol.notices import wants_notices
from acp_bridge.protocol.wire import set_seq
from acp_bridge.sessions.tree import SUBAGENT_UPDATE, supports_subagents

if TYPE_CHECKING:
    from acp_bridge.protocol.jsonrpc import JsonObject
    from acp_bridge.sessions.table import Session, Watcher

#: why a watcher is cut off (it comes back with ``after_seq`` and misses nothing)
WATCHER_TOO_SLOW: Final = (
    "watcher is not reading: outbound queue full (load the session again with "
    "_meta.acp_bridge.after_seq to catch up)"
)


def fan_out(
    session: Session,
    watchers: list[Watcher],
    msg: JsonObject,
    params: JsonObject,
    data: bytes,
    seq: int,
) -> None:
    """
    A recorded update of ``session`` to each of its watchers, in the order the owner gets
    it. Never waits: a watcher whose queue is full is cut off at once (its connection
    closed), so it never slows the owner or the agent; it catches up with ``after_seq``.
    A ``subagent_update`` goes only to a watcher that advertised ``subagents``, as to the
    owner and in a replay: a client that never asked for it may report it as an error.
    """
    update = params.get("update")
    tree = type(update) is dict and update.get("sessionUpdate") == SUBAGENT_UPDATE
    stamped: bytes | None = None
    for watcher in watchers:
        link = watcher.link
        if link.closed or (tree and not supports_subagents(link.capabilities)):
            continue
        if not link.has_room():
            link.close(WATCHER_TOO_SLOW)
            continue
        if link.want_seq:
            if stamped is None:
                set_seq(params, seq)
                stamped = dumps(msg)
            link.put_update(stamped, session)
        else:
            link.put_update(data, session)


def offer_notice(session: Session, watchers: list[Watcher], data: bytes) -> None:
    """
    A ``notice`` on ``session`` to each watcher that takes notices and has room. One without
    room just misses it: a notice is droppable (never history), not worth cutting anyone off.
    """
    for watcher in watchers:
        link = watcher.link
        if not link.closed and wants_notices(link.capabilities) and link.has_room():
            link.put_update(data, session)


__all__ = ["WATCHER_TOO_SLOW", "fan_out", "offer_notice"]
