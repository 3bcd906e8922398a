"""
Sessions coming and going, as transitions of the session table: a client takes a session
(who owned it, whose requests move, what it is owed), a session is let go, a restart brings
sessions back from the store, a load binds an id the bridge never saw.

Pure: no I/O, no trio, no clock. A client connection is seen through :class:`Link`
(``engine.links.ClientLink`` is one), an agent as the opaque value its links' tables hold.
``engine.reattach`` and ``engine.restore`` run these transitions and do the sending and the waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import attrs

from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps, loads
from acp_bridge.protocol.wire import bridge_meta, set_seq
from acp_bridge.sessions.table import Forwarded, SessionState, Watcher, roots_of

if TYPE_CHECKING:
    from collections.abc import Container

    from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcId
    from acp_bridge.sessions.table import PendingTable, Session, SessionTable
    from acp_bridge.store.db import SessionRow


class Link(Protocol):
    """A client connection, as far as a session's owner matters here."""

    #: the connection is gone (what it had asked is answered to the next owner)
    closed: bool
    #: its requests still out at an agent: its id → (agent, id on the agent's link)
    inflight: dict[JsonRpcId, tuple[Any, int]]
    #: the agents' requests it was shown and has not answered
    pending: PendingTable[Forwarded]

    def done(self, origin_id: JsonRpcId) -> None:
        """One of its requests is settled (it waits for no answer to it any more)."""


@attrs.frozen
class Takeover:
    """What :func:`take_ownership` changed that its caller must act on."""

    #: the previous owner, still connected: taken over (it must be told); None if not
    previous: Any = None
    #: the ids the previous owner asked with whose answers now go to the new owner
    moved: list[JsonRpcId] = attrs.field(factory=list)
    #: agent requests the previous owner was shown and had not answered, with its id for
    #: each (to be withdrawn from it, parked and shown to the new owner)
    shown: list[tuple[int, Forwarded]] = attrs.field(factory=list)


def take_ownership(
    session: Session, client: Link, agent: object, out_at_agent: PendingTable[Any]
) -> Takeover:
    """
    Make ``client`` the owner of ``session``, which is ``agent``'s (``out_at_agent``: the
    requests waiting on that agent, by the bridge's id on its link).

    Requests still out at the agent for this session are answered to the new owner, under
    the ids they were asked with (the attach shim relies on it): those of a closed
    connection, and those of a previous owner still connected (taken over: its requests,
    and the agent's requests it was shown, move with the session). The new owner's own
    requests, and a live non-owner's (a look-only request), stay where they are.
    """
    previous = session.client
    session.detach_deadline = None
    session.client = client
    session.state = SessionState.ACTIVE
    taken_over = previous is not None and previous is not client and not previous.closed
    moved: list[JsonRpcId] = []
    for bridge_id, entry in out_at_agent.find(
        lambda e: isinstance(e, Forwarded) and e.session is session
    ):
        if entry.origin is client:
            continue
        if entry.origin is previous and taken_over:
            previous.done(entry.origin_id)
            moved.append(entry.origin_id)
        elif not entry.origin.closed:
            continue
        entry.origin = client
        client.inflight[entry.origin_id] = (agent, bridge_id)
    if not taken_over:
        return Takeover()
    shown: list[tuple[int, Forwarded]] = []
    for client_id, entry in previous.pending.find(lambda e: e.session is session):
        previous.pending.pop(client_id)
        shown.append((client_id, entry))
    return Takeover(previous=previous, moved=moved, shown=shown)


def answers_owed(
    session: Session, client: Link, out_at_agent: PendingTable[Any]
) -> list[JsonRpcId]:
    """
    Ids of requests whose answers go to ``client`` once it owns ``session``: answers held
    while nobody was attached, and requests still out at the agent that are its own, a
    closed connection's, or the current owner's (it is taking the session over).
    """
    owner = session.client
    ids: list[JsonRpcId] = [origin_id for _, origin_id, _ in session.held_responses]
    for _, entry in out_at_agent.find(lambda e: isinstance(e, Forwarded) and e.session is session):
        if entry.origin is client or entry.origin.closed or entry.origin is owner:
            ids.append(entry.origin_id)
    return ids


def take_held(session: Session, upto: float) -> list[bytes]:
    """Answers that came while nobody was attached, up to history position ``upto``."""
    if not session.held_responses:
        return []
    out = [data for seq, _, data in session.held_responses if seq <= upto]
    session.held_responses = [h for h in session.held_responses if h[0] > upto]
    return out


def take_parked(session: Session, asked: PendingTable[Forwarded]) -> list[Forwarded]:
    """
    The agent requests that waited on an earlier owner, for the new one (``asked``: what
    the new owner is being asked now). Permission ids an earlier owner was shown are stale;
    those the new owner is still asked stay pending (a resume on the same connection), so a
    ``session/cancel`` still settles them.
    """
    parked, session.parked = session.parked, []
    session.pending_permissions = {
        i for i in session.pending_permissions if asked.get(i) is not None
    }
    return parked


def watcher_of(session: Session, client: object) -> Watcher | None:
    """``client``'s watch of ``session``, None when it does not watch it."""
    watchers = session.watchers
    if watchers is not None:
        for watcher in watchers:
            if watcher.link is client:
                return watcher
    return None


def watch_refusal(session: Session, client: object, max_watchers: int) -> str | None:
    """
    Why ``client`` may not watch ``session`` (None: it may). The owner does not watch its
    own session; a connection already watching may watch again (another replay); a new one
    past ``max_watchers`` is refused.
    """
    if session.client is client:
        return f"this connection owns session {session.bridge_id!r}: it cannot also watch it"
    watchers = session.watchers or []
    if watcher_of(session, client) is None and len(watchers) >= max_watchers:
        return (
            f"session {session.bridge_id!r} has {len(watchers)} watchers already "
            f"(max_watchers {max_watchers})"
        )
    return None


def add_watcher(session: Session, client: object, *, approve: bool) -> Watcher:
    """``client`` watches ``session`` from now on (once: a second watch replaces the first)."""
    drop_watcher(session, client)
    watcher = Watcher(client, approve)
    session.watchers = [*(session.watchers or ()), watcher]
    return watcher


def watched(session: Session, sessions: SessionTable) -> bool:
    """
    Whether a live connection watches ``session``, or the session its tree hangs from (a
    child lives and ends with its parent): such a session stays open without an owner.
    """
    seen: set[str] = set()
    one: Session | None = session
    while one is not None and one.bridge_id not in seen:
        if one.watchers is not None and any(not w.link.closed for w in one.watchers):
            return True
        seen.add(one.bridge_id)
        one = sessions.get(one.parent) if one.parent is not None else None
    return False


def approvers(session: Session) -> list[Any]:
    """The links of the session's live watchers that approve (``_meta.acp_bridge.approve``)."""
    watchers = session.watchers
    if watchers is None:
        return []
    return [w.link for w in watchers if w.approve and not w.link.closed]


def drop_watcher(session: Session, client: object) -> bool:
    """``client`` no longer watches ``session`` (gone, or taking it over); whether it did."""
    watchers = session.watchers
    if watchers is None:
        return False
    kept = [w for w in watchers if w.link is not client]
    # (None, not []: the relay's hot path checks for None alone)
    session.watchers = kept or None
    return len(kept) < len(watchers)


def let_go(session: Session, deadline: float | None) -> None:
    """
    Nobody owns ``session`` any more: what its owner was asked is its owner's no longer;
    it lives until ``deadline`` (clock seconds) unless taken back (None: no grace).
    """
    session.client = None
    session.pending_permissions.clear()
    session.detach_deadline = deadline


def stamped(want_seq: bool, seq: int, data: bytes) -> bytes:
    """A history entry as a client gets it (with its seq number if it opted in)."""
    if not want_seq:
        return data
    msg = loads(data)
    set_seq(msg["params"], seq)
    return dumps(msg)


def from_journal(want_seq: bool, bridge_id: str, seq: int, data: bytes) -> bytes:
    """
    A journal entry as a client gets it: under the session's bridge id ``bridge_id`` (a
    session moved aside after a restart has its lines recorded under its earlier id), with
    its seq number if the client opted in. (Decoded each: journal replays follow restarts
    only.)
    """
    msg = loads(data)
    params = msg.get("params") if isinstance(msg, dict) else None
    if not isinstance(params, dict):
        return data
    if params.get("sessionId") == bridge_id and not want_seq:
        return data
    params["sessionId"] = bridge_id
    if want_seq:
        set_seq(params, seq)
    return dumps(msg)


def restore_row(sessions: SessionTable, row: SessionRow, agents: Container[str]) -> Session | None:
    """
    After a restart: a session the store knows comes back as STORED (listed, loadable),
    with its roots, setup and flags. None when it does not: a closed session, or one of an
    agent no longer configured, keeps its id (its row and journal stay its own, for
    ``sessions export``); one whose bridge id another session took is skipped.
    """
    if row.state == "closed" or row.agent not in agents:
        sessions.keep(row.bridge_id, row.agent, row.agent_id)
        return None
    try:
        session = sessions.bind(row.agent, row.agent_id, row.bridge_id)
    except ValueError:
        return None
    session.state = SessionState.STORED
    session.roots = row.roots
    session.setup = dict(row.setup)
    session.unattended = row.unattended
    session.created = row.created
    session.parent = row.parent
    return session


def bind_unknown(sessions: SessionTable, agent: str, sid: str, params: JsonObject) -> Session:
    """
    ``session/load`` (or resume) of an id the bridge never saw, for ``agent``: bound as
    LOADING under that same id (its replayed updates are routed already), with the roots
    and flags the request gives.

    Raises:
        JsonRpcError: the id is another session's.
    """
    if sessions.get(sid) is not None:
        raise JsonRpcError.invalid_params(f"session id {sid!r} is taken")
    session = sessions.bind(agent, sid, sid)
    session.state = SessionState.LOADING
    session.roots = roots_of(params)
    session.unattended = bridge_meta(params).get("unattended") is True
    return session


__all__ = [
    "Link",
    "Takeover",
    "add_watcher",
    "answers_owed",
    "approvers",
    "bind_unknown",
    "drop_watcher",
    "from_journal",
    "let_go",
    "restore_row",
    "stamped",
    "take_held",
    "take_ownership",
    "take_parked",
    "watch_refusal",
    "watched",
    "watcher_of",
]
