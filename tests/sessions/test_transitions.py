"""
Sessions coming and going as transitions of the session table (``sessions.transitions``): plain
synchronous tests, no trio. A client connection is a :class:`Conn` (what
``sessions.transitions.Link``
asks of ``ClientLink``), an agent an opaque marker with its table of requests out.
"""

from __future__ import annotations

import pytest

from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps, loads
from acp_bridge.protocol.jsonrpc import notification as notification_msg
from acp_bridge.sessions import transitions
from acp_bridge.sessions.table import Forwarded, PendingTable, SessionState, SessionTable
from acp_bridge.store.db import SessionRow


class Conn:
    """A client connection as the transitions see it."""

    def __init__(self, name: str, *, closed: bool = False) -> None:
        self.name = name
        self.closed = closed
        self.inflight: dict[object, tuple[object, int]] = {}
        self.pending: PendingTable[Forwarded] = PendingTable()
        self.settled: list[object] = []

    def done(self, origin_id: object) -> None:
        self.inflight.pop(origin_id, None)
        self.settled.append(origin_id)

    def __repr__(self) -> str:
        return f"Conn({self.name})"


AGENT = object()


def _session(owner: Conn | None = None):
    table = SessionTable()
    session = table.register("a", "s1", client=owner)
    return table, session


def _ask(out: PendingTable, conn: Conn, origin_id: object, session, method="session/prompt"):
    """``conn`` sends a request of ``session`` to the agent: out at the agent, in flight."""
    entry = Forwarded(origin=conn, origin_id=origin_id, method=method, session=session)
    bridge_id = out.add(entry)
    conn.inflight[origin_id] = (AGENT, bridge_id)
    return bridge_id, entry


# ------------------------------------------------------------------ take_ownership


def test_a_detached_session_taken_back_gets_the_closed_connections_requests():
    old = Conn("old", closed=True)
    _table, session = _session(None)
    session.state = SessionState.LOADING
    session.detach_deadline = 12.5
    out: PendingTable = PendingTable()
    bridge_id, entry = _ask(out, old, 7, session)
    new = Conn("new")

    takeover = transitions.take_ownership(session, new, AGENT, out)

    assert takeover == transitions.Takeover()  # nobody to tell
    assert (session.client, session.state, session.detach_deadline) == (
        new,
        SessionState.ACTIVE,
        None,
    )
    assert entry.origin is new
    assert new.inflight == {7: (AGENT, bridge_id)}  # answered under the id it was asked with


def test_a_live_owner_taken_over_is_told_which_of_its_requests_moved():
    prev = Conn("prev")
    table, session = _session(prev)
    out: PendingTable = PendingTable()
    _, moved_entry = _ask(out, prev, "p1", session)
    # an agent request prev was shown and has not answered moves with the session
    shown = Forwarded(origin=AGENT, origin_id=3, method="fs/read_text_file", session=session)
    shown_id = prev.pending.add(shown)
    other = table.register("a", "s2", client=prev)
    not_this = Forwarded(origin=AGENT, origin_id=4, method="fs/read_text_file", session=other)
    prev.pending.add(not_this)
    new = Conn("new")

    takeover = transitions.take_ownership(session, new, AGENT, out)

    assert takeover.previous is prev
    assert takeover.moved == ["p1"]
    assert prev.settled == ["p1"]
    assert "p1" not in prev.inflight
    assert moved_entry.origin is new
    assert "p1" in new.inflight
    assert takeover.shown == [(shown_id, shown)]
    # only this session's: the other session's request stays with prev
    assert [e for _, e in prev.pending.find(lambda e: True)] == [not_this]


def test_a_live_non_owners_request_and_the_new_owners_own_stay_where_they_are():
    prev = Conn("prev")
    looker = Conn("looker")  # a look-only request from a connection that does not own it
    table, session = _session(prev)
    out: PendingTable = PendingTable()
    _, looked = _ask(out, looker, 1, session, method="session/status")
    new = Conn("new")
    _, own = _ask(out, new, 2, session)
    # another session's requests and the agent's own waiters are not this session's business
    other = table.register("a", "s2", client=Conn("gone", closed=True))
    _, elsewhere = _ask(out, other.client, 3, other)
    out.add(object())

    transitions.take_ownership(session, new, AGENT, out)

    assert looked.origin is looker
    assert own.origin is new
    assert new.inflight[2] == (AGENT, 2)
    assert elsewhere.origin is other.client


def test_taking_back_ones_own_session_moves_nothing():
    conn = Conn("same")
    _, session = _session(conn)
    out: PendingTable = PendingTable()
    _ask(out, conn, 1, session)
    conn.pending.add(Forwarded(origin=AGENT, origin_id=3, method="x", session=session))

    takeover = transitions.take_ownership(session, conn, AGENT, out)

    assert takeover == transitions.Takeover()
    assert len(conn.pending) == 1
    assert conn.settled == []


# ------------------------------------------------------------------ answers_owed


def test_answers_owed_are_held_ones_then_those_that_will_come_to_the_new_owner():
    owner = Conn("owner")
    looker = Conn("looker")
    gone = Conn("gone", closed=True)
    new = Conn("new")
    _, session = _session(owner)
    session.held_responses = [(3, "h1", b"{}")]
    out: PendingTable = PendingTable()
    _ask(out, owner, "o", session)
    _ask(out, looker, "l", session)
    _ask(out, gone, "g", session)
    _ask(out, new, "n", session)

    assert transitions.answers_owed(session, new, out) == ["h1", "o", "g", "n"]


# ------------------------------------------------------------------ held, parked, let go


def test_held_answers_are_taken_up_to_a_position_and_only_once():
    _, session = _session()
    session.held_responses = [(1, "a", b"A"), (4, "b", b"B"), (9, "c", b"C")]
    assert transitions.take_held(session, 4) == [b"A", b"B"]
    assert transitions.take_held(session, 4) == []
    assert transitions.take_held(session, float("inf")) == [b"C"]
    assert session.held_responses == []


def test_parked_requests_are_taken_once_and_stale_permission_ids_dropped():
    conn = Conn("new")
    _, session = _session(conn)
    parked = Forwarded(origin=AGENT, origin_id=5, method="session/request_permission")
    session.parked = [parked]
    still_asked = conn.pending.add(Forwarded(origin=AGENT, origin_id=6, method="x"))
    session.pending_permissions = {still_asked, 999}  # 999: shown to an earlier owner

    assert transitions.take_parked(session, conn.pending) == [parked]
    assert session.parked == []
    assert session.pending_permissions == {still_asked}
    assert transitions.take_parked(session, conn.pending) == []


def test_a_session_let_go_has_no_owner_and_its_deadline():
    conn = Conn("c")
    _, session = _session(conn)
    session.pending_permissions = {1, 2}
    transitions.let_go(session, 30.0)
    assert (session.client, session.pending_permissions, session.detach_deadline) == (
        None,
        set(),
        30.0,
    )


# ------------------------------------------------------------------ replay lines


def _update(sid: str) -> bytes:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}
    return dumps(notification_msg("session/update", {"sessionId": sid, "update": update}))


def test_a_history_entry_is_stamped_only_for_a_client_that_opted_in():
    line = _update("s1")
    assert transitions.stamped(False, 3, line) is line
    assert loads(transitions.stamped(True, 3, line))["params"]["_meta"] == {
        "acp_bridge": {"seq": 3}
    }


def test_a_journal_entry_comes_under_the_sessions_bridge_id():
    line = _update("s1")
    assert transitions.from_journal(False, "s1", 2, line) is line
    moved = loads(transitions.from_journal(False, "s1~a", 2, line))
    assert moved["params"]["sessionId"] == "s1~a"
    assert "_meta" not in moved["params"]
    stamped = loads(transitions.from_journal(True, "s1", 2, line))
    assert stamped["params"]["_meta"] == {"acp_bridge": {"seq": 2}}
    odd = dumps({"jsonrpc": "2.0", "method": "x"})
    assert transitions.from_journal(True, "s1", 2, odd) is odd


# ------------------------------------------------------------------ restart, unknown loads


def test_a_stored_row_comes_back_as_stored_with_its_setup():
    table = SessionTable()
    row = SessionRow(
        bridge_id="s1~a",
        agent="a",
        agent_id="s1",
        roots=("/w",),
        setup={"modes": {"currentModeId": "ask"}},
        unattended=True,
        created=5.0,
    )
    session = transitions.restore_row(table, row, {"a"})
    assert session is not None
    assert table.get("s1~a") is session
    assert (session.state, session.roots, session.unattended, session.created) == (
        SessionState.STORED,
        ("/w",),
        True,
        5.0,
    )
    assert session.setup == row.setup
    assert session.setup is not row.setup
    assert session.rewrite


@pytest.mark.parametrize(
    ("state", "agent"), [("closed", "a"), ("active", "gone")], ids=["closed", "unknown-agent"]
)
def test_a_closed_or_orphan_row_is_not_loaded_but_keeps_its_id(state, agent):
    moves: list[tuple[str, str]] = []
    table = SessionTable()
    table.moved.subscribe(lambda old, new: moves.append((old, new)))
    row = SessionRow(bridge_id="s1", agent=agent, agent_id="s1", state=state)
    assert transitions.restore_row(table, row, {"a"}) is None
    assert table.get("s1") is None
    table.register("b", "s1")  # a new session takes the id: the kept one moves aside
    assert moves == [("s1", "s1~" + agent)]


def test_a_row_whose_id_another_session_has_is_skipped():
    table = SessionTable()
    table.register("b", "s1")
    row = SessionRow(bridge_id="s1", agent="a", agent_id="s1")
    assert transitions.restore_row(table, row, {"a", "b"}) is None
    assert table.get("s1").agent == "b"


def test_a_load_of_an_unknown_id_binds_it_loading_with_its_roots():
    table = SessionTable()
    params = {
        "sessionId": "x",
        "cwd": "/w",
        "additionalDirectories": ["/o", "relative"],
        "_meta": {"acp_bridge": {"unattended": True}},
    }
    session = transitions.bind_unknown(table, "a", "x", params)
    assert table.find("a", "x") is session
    assert table.get("x") is session
    assert (session.state, session.roots, session.unattended) == (
        SessionState.LOADING,
        ("/w", "/o"),
        True,
    )
    with pytest.raises(JsonRpcError, match="is taken"):
        transitions.bind_unknown(table, "b", "x", {})
