"""Durable sessions: the journal in SQLite, replay without loss, recovery after a restart."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import random
import sqlite3
import threading
import time

import hypothesis
import hypothesis.strategies as st
import structlog.testing
import trio
import trio.lowlevel
import trio.testing

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.engine import journal as journal_mod
from acp_bridge.engine.audit import AuditLog
from acp_bridge.engine.bridge import Bridge
from acp_bridge.engine.journal import RUN_MAX_BYTES, RUN_OWN_BYTES, Journal, runs
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.sessions.table import History, SessionState, chunk_lines
from acp_bridge.store import db as store_db
from acp_bridge.store.db import JournalEntry, SessionRow, open_store
from tests.support.fakes import FakeAgent, TestClient, connect, make_config, open_bridge

NEW = {"cwd": "/w", "mcpServers": []}
#: a load's opt-in to a replay from the journal when the agent cannot restore the session
JOURNAL_REPLAY = {"acp_bridge": {"journal_replay": True}}


def record(journal: Journal, session: str, history: History, data: bytes, live: bool = True):
    """What the bridge does with each relayed update (and prompt): history, then journal."""
    history.append(data, live=live)
    journal.updated(session, history)


def history(max_entries: int = 10**6) -> History:
    return History(max_entries=max_entries, max_bytes=1 << 40)


@contextlib.asynccontextmanager
async def durable_bridge(path, agents, **bridge):
    """A bridge with a journal in the store at ``path``; stopped cleanly at the end."""
    store = open_store(str(path))
    config = make_config(agents, **bridge)
    journal = Journal(store)
    try:
        async with trio.open_nursery() as nursery:
            b = await nursery.start(
                Bridge(
                    config,
                    make_in_process_launcher(dict(agents)),
                    audit=AuditLog(store),
                    journal=journal,
                ).run
            )
            client_side, bridge_side = trio.testing.memory_stream_pair()
            nursery.start_soon(
                functools.partial(serve_client_stream, b, bridge_side, bridge_side, linger=0)
            )
            client = TestClient(client_side)
            nursery.start_soon(client.read_loop)
            await client.initialize()
            yield client, b, nursery
            nursery.cancel_scope.cancel()
    finally:
        store.close()


def texts(messages, sid):
    return [
        m["params"]["update"]["content"]["text"]
        for m in messages
        if m.get("method") == "session/update" and m["params"]["sessionId"] == sid
    ]


def test_store_journal_round_trip_trim_and_delete(tmp_path):
    store = open_store(str(tmp_path / "b.db"))
    store.write(
        sessions=[SessionRow("s1", "a", "s1", roots=("/w",), setup={"modes": {}})],
        journal=[JournalEntry("s1", i, b"u%d" % i, live=i != 1) for i in range(1, 21)],
    )
    assert store.journal_bounds("s1") == (1, 20)
    assert [e.seq for e in store.journal("s1", after_seq=15)] == [16, 17, 18, 19, 20]
    assert [e.seq for e in store.journal("s1", live_only=True)][:2] == [2, 3]
    assert store.trim_journal(keep_entries=5) == 15
    assert store.journal_bounds("s1") == (16, 20)
    [row] = store.sessions()
    assert (row.roots, row.setup) == (("/w",), {"modes": {}})
    store.write(deleted=["s1"])
    assert store.sessions() == []
    assert store.journal_bounds("s1") == (0, 0)
    store.close()
    # Reopening keeps the schema (migrations are not run twice).
    open_store(str(tmp_path / "b.db")).close()


async def test_journal_writes_runs_of_entries_and_reads_them_back_one_by_one(tmp_path):
    """Consecutive entries of a session are one row (one insert per run, not per update);
    reading, bounds, retention and deletion still work entry by entry."""
    store = open_store(str(tmp_path / "b.db"))
    journal = Journal(store)
    lines = {seq: b'{"n":%d}\n' % seq for seq in range(1, 31)}
    h1, h2 = history(), history()
    for seq in range(1, 11):
        record(journal, "s1", h1, lines[seq])
        record(journal, "s2", h2, lines[seq])
    record(journal, "s1", h1, lines[11], live=False)  # a user prompt: a new run
    for seq in range(12, 31):
        record(journal, "s1", h1, lines[seq])
    assert journal.backlog() == 40
    await journal._commit()
    assert journal.backlog() == 0
    record(journal, "s2", h2, b"no newline")  # not one line: each entry a row of its own
    record(journal, "s2", h2, lines[12])
    await journal._commit()
    assert journal.entries_written == 42
    assert journal.commits == 2
    rows = store._conn.execute(
        "SELECT session, first_seq, last_seq, live FROM journal ORDER BY session, first_seq"
    ).fetchall()
    assert rows == [
        ("s1", 1, 10, 1), ("s1", 11, 11, 0), ("s1", 12, 30, 1),
        ("s2", 1, 10, 1), ("s2", 11, 11, 1), ("s2", 12, 12, 1),
    ]  # fmt: skip
    assert [(e.seq, e.data) for e in store.journal("s1")] == sorted(lines.items())
    assert [e.seq for e in store.journal("s1", after_seq=9, limit=4)] == [10, 11, 12, 13]
    assert [e.live for e in store.journal("s1", after_seq=9, limit=3)] == [True, False, True]
    assert 11 not in [e.seq for e in store.journal("s1", live_only=True)]
    assert [e.data for e in store.journal("s2", after_seq=10)] == [b"no newline", lines[12]]
    assert store.journal_bounds("s1") == (1, 30)
    # Retention keeps whole runs: the newest 15 of s1 are in its last run (12..30).
    assert store.trim_journal(keep_entries=15) == 11
    assert store.journal_bounds("s1") == (12, 30)
    assert store.journal_bounds("s2") == (1, 12)  # (its last 15 reach back to its first run)
    assert journal.gaps == set()
    journal.delete("s2")
    store.close()


async def test_the_hot_path_only_notes_the_session_and_the_commit_takes_the_history_tail():
    """``updated`` keeps one reference per session however many updates come; the commit
    takes exactly what the history gained since the last one, nothing twice."""
    store = open_store(":memory:")
    journal = Journal(store)
    h = history()
    for seq in range(1, 6):
        record(journal, "s1", h, b'{"n":%d}\n' % seq)
    assert list(journal._updated) == ["s1"]
    assert journal.backlog() == 5
    await journal._commit()
    assert (journal._updated, h.journaled, journal.backlog()) == ({}, 5, 0)
    await journal._commit()  # nothing new: nothing written again
    for seq in range(6, 8):
        record(journal, "s1", h, b'{"n":%d}\n' % seq)
    await journal._commit()
    assert [e.seq for e in store.journal("s1")] == list(range(1, 8))
    assert journal.entries_written == 7
    store.close()


async def test_entries_trimmed_from_the_history_before_the_commit_are_kept_for_it():
    """A history that trims entries the journal has not taken yet hands them over
    (``History.spill``): the store gets every entry, in order."""
    store = open_store(":memory:")
    journal = Journal(store)
    h = history(max_entries=5)
    journal.follow("s1", h)
    for seq in range(1, 13):
        record(journal, "s1", h, b'{"n":%d}\n' % seq)
    assert (len(h), journal.backlog()) == (5, 12)
    await journal._commit()
    assert [e.seq for e in store.journal("s1")] == list(range(1, 13))
    assert (journal.gaps, journal.backlog(), journal.entries_written) == (set(), 0, 12)
    store.close()


async def test_past_max_backlog_trimmed_entries_are_dropped_and_the_session_has_a_gap():
    """The bound of what waits for the store: past ``max_backlog`` handed-over entries, the
    trimmed ones are dropped, said once in the log, and the session is flagged (a replay
    then says resync); without ``follow`` nothing is handed over: a gap at once."""
    store = open_store(":memory:")
    journal = Journal(store, max_backlog=2)
    h = history(max_entries=5)
    journal.follow("s1", h)
    with structlog.testing.capture_logs() as logs:
        for seq in range(1, 10):
            record(journal, "s1", h, b'{"n":%d}\n' % seq)
        await journal._commit()
    assert journal.gaps == {"s1"}
    assert [e.seq for e in store.journal("s1")] == [1, 2, 5, 6, 7, 8, 9]
    assert [entry["event"] for entry in logs] == ["journal_backlog_full"]
    unfollowed = history(max_entries=5)
    with structlog.testing.capture_logs() as logs:
        for seq in range(1, 9):
            record(journal, "s2", unfollowed, b'{"n":%d}\n' % seq)
        await journal._commit()
    assert journal.gaps == {"s1", "s2"}
    assert [e.seq for e in store.journal("s2")] == [4, 5, 6, 7, 8]
    assert [entry["event"] for entry in logs] == ["journal_gap"]
    store.close()


async def test_a_run_row_holds_at_most_run_max_bytes(tmp_path):
    """A flood is written as rows of up to ``RUN_MAX_BYTES`` (SQLite handles rows of
    megabytes slowly), read back entry by entry as one."""
    store = open_store(str(tmp_path / "b.db"))
    journal = Journal(store)
    line = b'{"text":"%s"}\n' % (b"x" * 1000)
    per_row = RUN_MAX_BYTES // len(line)
    total = 3 * per_row + 5
    h = history()
    for _ in range(total):
        record(journal, "s1", h, line)
    await journal._commit()
    rows = store._conn.execute(
        "SELECT first_seq, last_seq, length(data) FROM journal ORDER BY first_seq"
    ).fetchall()
    assert [(first, last) for first, last, _ in rows] == [
        (1, per_row),
        (per_row + 1, 2 * per_row),
        (2 * per_row + 1, 3 * per_row),
        (3 * per_row + 1, total),
    ]
    assert all(size <= RUN_MAX_BYTES for _, _, size in rows)
    assert [e.seq for e in store.journal("s1")] == list(range(1, total + 1))
    assert {e.data for e in store.journal("s1")} == {line}
    store.close()


def test_a_journal_of_the_previous_schema_is_migrated_entry_by_entry(tmp_path):
    """A store written by the version before runs (one row per entry) opens with its journal
    intact, numbering included."""
    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path)
    for number, script in enumerate(store_db.MIGRATIONS[:2], start=1):
        conn.executescript(f"BEGIN;{script};PRAGMA user_version={number};COMMIT;")
    conn.executemany(
        "INSERT INTO journal VALUES (?,?,?,?,?)",
        [("s1", seq, int(seq != 2), 1.0, b"u%d\n" % seq) for seq in range(1, 6)],
    )
    conn.commit()
    conn.close()
    store = open_store(path)
    assert [(e.seq, e.live, e.data) for e in store.journal("s1")] == [
        (seq, seq != 2, b"u%d\n" % seq) for seq in range(1, 6)
    ]
    assert store.journal_bounds("s1") == (1, 5)
    store.close()


def test_a_journal_of_runs_in_a_without_rowid_table_is_migrated(tmp_path):
    """A store of schema 3 (runs in a WITHOUT ROWID table, 4 KiB pages) opens with its runs
    intact; the rewritten table still refuses two runs at one (session, first seq) — a run
    written again replaces the old one — and the store keeps its own page size."""
    path = str(tmp_path / "v3.db")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size=4096")
    for number, script in enumerate(store_db.MIGRATIONS[:3], start=1):
        conn.executescript(f"BEGIN;{script};PRAGMA user_version={number};COMMIT;")
    conn.executemany(
        "INSERT INTO journal VALUES (?,?,?,?,?,?)",
        [("s1", 1, 3, 1, 1.0, b"u1\nu2\nu3\n"), ("s1", 4, 4, 0, 2.0, b"p4\n")],
    )
    conn.commit()
    conn.close()
    store = open_store(path)
    assert [(e.seq, e.live, e.data) for e in store.journal("s1")] == [
        (1, True, b"u1\n"), (2, True, b"u2\n"), (3, True, b"u3\n"), (4, False, b"p4\n"),
    ]  # fmt: skip
    store.write(journal_runs=[("s1", 4, 5, 1, 3.0, b"u4\nu5\n")])
    assert [e.data for e in store.journal("s1", after_seq=3)] == [b"u4\n", b"u5\n"]
    assert store._conn.execute("SELECT COUNT(*) FROM journal").fetchone() == (2,)
    assert store._conn.execute("PRAGMA page_size").fetchone() == (4096,)
    assert store._conn.execute("PRAGMA user_version").fetchone() == (len(store_db.MIGRATIONS),)
    store.close()


def test_a_new_store_has_pages_of_page_size(tmp_path):
    store = open_store(str(tmp_path / "new.db"))
    assert store._conn.execute("PRAGMA page_size").fetchone() == (store_db.PAGE_SIZE,)
    assert store._conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    store.close()


async def test_restart_lists_the_session_and_replays_the_journal_when_the_agent_cannot(tmp_path):
    """The new agent process does not know the session: a client that asked for journal
    replays gets one + a clear statement, and a prompt then fails with -32002 saying why."""
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, _, _n):
        sid = await client.new_session()
        await client.prompt(sid, "count 5")
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, _bridge, _n):
        listed = await client.call("session/list", {})
        assert sid in [s["sessionId"] for s in listed["sessions"]]
        before = len(client.received)
        answer = await client.request(
            "session/load", {**NEW, "sessionId": sid, "_meta": JOURNAL_REPLAY}
        )
        ours = answer["result"]["_meta"]["acp_bridge"]
        assert ours["restored"] is False
        assert "could not load it" in ours["reason"]
        assert ours["complete"] is True
        replay = client.received[before : client.received.index(answer)]
        assert texts(replay, sid) == ["count 5"] + [f"a:s1:{i}" for i in range(5)]
        refused = await client.prompt(sid, "count 1")
        assert refused["error"]["code"] == -32002
        assert "cannot continue" in refused["error"]["message"]


async def test_restart_restores_through_an_agent_that_can_load_and_numbering_continues(tmp_path):
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, _, _n):
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": 99,
                "method": "initialize",
                "params": {"protocolVersion": 1, "_meta": {"acp_bridge": {"seq": True}}},
            }
        )
        await client.wait_for(lambda m: m.get("id") == 99)
        sid = await client.new_session()
        await client.prompt(sid, "count 3")
        last = client.seqs(sid)[-1]
    reborn = FakeAgent("a")
    reborn.sessions.append("s1")  # this agent can take its session up again
    async with durable_bridge(db, {"a": reborn}) as (client, bridge, _n):
        answer = await client.request("session/load", {**NEW, "sessionId": sid})
        assert answer["result"]["_meta"]["acp_bridge"]["restored"] is True
        assert texts(client.received, sid) == ["a:s1:replay"]  # the agent's own replay
        reply = await client.prompt(sid, "count 2")
        assert reply["result"]["stopReason"] == "end_turn"
        now = bridge.hub.sessions.get(sid).history.last_seq
        assert now > last
        # The journal goes on from where it stopped: no gap, every number once.
        await bridge.hub.journal.wait_committed()
        assert bridge.hub.journal.gaps == set()
        stored = await trio.to_thread.run_sync(bridge.hub.journal.store.journal, sid)
        assert [e.seq for e in stored] == list(range(1, now + 1))


async def test_the_journal_keeps_what_a_small_history_trims_before_the_commit(tmp_path):
    """A history of 5 under a stream of 200 updates (far more than 5 per commit interval):
    the trimmed ones are handed to the journal, which stores every number once."""
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a")}, history_limit=5) as (client, bridge, _):
        sid = await client.new_session()
        await client.prompt(sid, "count 200")
        await bridge.hub.journal.wait_committed()
        last = bridge.hub.sessions.get(sid).history.last_seq
        assert len(bridge.hub.sessions.get(sid).history) == 5
        stored = await trio.to_thread.run_sync(bridge.hub.journal.store.journal, sid)
        assert [e.seq for e in stored] == list(range(1, last + 1))
        stored_texts = texts([json.loads(e.data) for e in stored], sid)
        assert stored_texts[-200:] == [f"a:s1:{i}" for i in range(200)]
        assert bridge.hub.journal.gaps == set()


async def test_an_agent_without_load_gets_the_journal_replay(tmp_path):
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a", capabilities={})}) as (client, _, _n):
        sid = await client.new_session()
        await client.prompt(sid, "count 2")
    async with durable_bridge(db, {"a": FakeAgent("a", capabilities={})}) as (client, _, _n):
        answer = await client.request(
            "session/load", {**NEW, "sessionId": sid, "_meta": JOURNAL_REPLAY}
        )
        assert "does not support session/load" in answer["result"]["_meta"]["acp_bridge"]["reason"]
        assert texts(client.received, sid)[-2:] == ["a:s1:0", "a:s1:1"]
        assert (await client.prompt(sid, "count 1"))["error"]["code"] == -32002


async def test_a_pending_approval_at_stop_is_settled_by_the_unattended_rule_after_restart(
    tmp_path,
):
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, _, nursery):
        sid = await client.new_session()
        nursery.start_soon(client.prompt, sid, "permission")
        await client.agent_requests.receive()
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, bridge, _n):
        restarted = [r for r in bridge.hub.audit.recent if r.source == "restart"]
        assert len(restarted) == 1
        assert restarted[0].decision == "deny"
        assert restarted[0].session == sid
    store = open_store(str(db))
    assert store.pending_approvals() == []
    store.close()


async def test_a_load_only_the_journal_can_serve_is_refused_unless_asked_for(tmp_path):
    """acpx's way after a restart: session/load its saved session, session/new when that
    fails. Without ``journal_replay: true`` a load the agent cannot serve is -32002 with the
    reason and replays nothing (a success would say the session goes on: acpx then never
    fell back, and every prompt failed); the session stays stored, and the fallback's new
    session has the agent's own id and works."""
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, _, _n):
        sid = await client.new_session()
        await client.prompt(sid, "count 2")
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, bridge, _n):
        before = len(client.received)
        for meta in ({}, {"_meta": {"acp_bridge": {"journal_replay": False}}}):
            refused = await client.request("session/load", {**NEW, "sessionId": sid, **meta})
            assert refused["error"]["code"] == -32002
            assert "cannot be restored" in refused["error"]["message"]
            assert "could not load it" in refused["error"]["message"]
            assert "could not load it" in refused["error"]["data"]["reason"]
        assert texts(client.received[before:], sid) == []
        assert bridge.hub.sessions.get(sid).state is SessionState.STORED
        assert (await client.prompt(sid, "count 1"))["error"]["code"] == -32002
        new = await client.new_session()
        assert new == sid == "s1"  # (the stored one moved aside: it was not live)
        reply = await client.prompt(new, "count 1")
        assert reply["result"]["stopReason"] == "end_turn"
        assert client.updates(new) == ["a:s1:0"]


async def test_an_agent_without_load_is_refused_too_without_the_opt_in(tmp_path):
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a", capabilities={})}) as (client, _, _n):
        sid = await client.new_session()
        await client.prompt(sid, "count 2")
    async with durable_bridge(db, {"a": FakeAgent("a", capabilities={})}) as (client, _, _n):
        refused = await client.request("session/load", {**NEW, "sessionId": sid})
        assert refused["error"]["code"] == -32002
        assert "does not support session/load" in refused["error"]["data"]["reason"]
        assert texts(client.received, sid) == []


async def test_after_restarts_new_sessions_keep_the_agents_ids_and_stored_ones_move_aside(
    tmp_path,
):
    """Three runs on one store of an agent that counts its ids from s1 each run: every
    run's sessions have the agent's ids unchanged (no ``~a``, no ``~a~2``: the earlier runs'
    sessions are stored, not live). Those move to ids of their own with their journal: still
    listed, and a load with the opt-in replays each one's own conversation."""
    db = tmp_path / "bridge.db"
    for run in range(3):
        async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, bridge, _n):
            assert {s.state for s in bridge.hub.sessions} <= {SessionState.STORED}
            assert [await client.new_session(), await client.new_session()] == ["s1", "s2"]
            await client.prompt("s1", f"count {run + 1}")
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, bridge, _n):
        listed = {s["sessionId"] for s in (await client.call("session/list", {}))["sessions"]}
        assert listed == {"s1", "s2", "s1~a", "s2~a", "s1~a~2", "s2~a~2"}
        for sid, run in (("s1~a", 0), ("s1~a~2", 1), ("s1", 2)):
            before = len(client.received)
            answer = await client.request(
                "session/load", {**NEW, "sessionId": sid, "_meta": JOURNAL_REPLAY}
            )
            assert answer["result"]["_meta"]["acp_bridge"]["complete"] is True
            replay = client.received[before : client.received.index(answer)]
            assert texts(replay, sid) == [f"count {run + 1}"] + [
                f"a:s1:{i}" for i in range(run + 1)
            ]


def test_store_renames_a_session_with_its_journal_over_a_closed_ones_leftovers(tmp_path):
    store = open_store(str(tmp_path / "b.db"))
    store.write(
        sessions=[
            SessionRow("s1", "a", "s1", state="active"),
            SessionRow("s1~a", "a", "s1", state="closed"),
        ],
        journal=[JournalEntry("s1", 1, b"mine\n"), JournalEntry("s1~a", 1, b"old\n")],
    )
    # One commit: s1 moves aside, and a new s1 is written in its place.
    store.write(
        renamed=[("s1", "s1~a")],
        sessions=[SessionRow("s1", "a", "s1", state="active")],
        journal=[JournalEntry("s1", 1, b"new\n")],
    )
    assert {r.bridge_id: r.state for r in store.sessions()} == {"s1~a": "active", "s1": "active"}
    assert [e.data for e in store.journal("s1~a")] == [b"mine\n"]
    assert [e.data for e in store.journal("s1")] == [b"new\n"]
    store.close()


async def test_a_replay_of_a_moved_session_waits_until_the_move_is_in_the_store(tmp_path):
    """A session moved aside (Journal.rename) is read back only once its rename is written:
    what was pending for it (its row, its entries) goes under its new id."""
    store = open_store(str(tmp_path / "b.db"))
    store.write(sessions=[SessionRow("s1", "a", "s1")], journal=[JournalEntry("s1", 1, b"x\n")])
    journal = Journal(store)
    h = history()
    h.continue_from(1)
    record(journal, "s1", h, b"y\n")
    journal.rename("s1", "s1~a")
    moved = trio.Event()

    async def read():
        await journal.moved("s1~a")
        moved.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert not moved.is_set()
        await journal._commit()
        await moved.wait()
    await journal.moved("s2")  # nothing pending for it: at once
    assert [e.data for e in store.journal("s1~a")] == [b"x\n", b"y\n"]
    assert store.journal_bounds("s1") == (0, 0)
    assert [r.bridge_id for r in store.sessions()] == ["s1~a"]
    store.close()


async def test_a_new_session_recorded_after_a_delete_of_its_id_in_one_commit_is_kept(tmp_path):
    """s1 is deleted and a new s1 (a restarted agent's) is recorded before the next commit:
    the delete is of the old one only (written first), the new one's row and entries stay."""
    store = open_store(str(tmp_path / "b.db"))
    store.write(sessions=[SessionRow("s1", "a", "s1")], journal=[JournalEntry("s1", 1, b"old\n")])
    journal = Journal(store)
    journal.delete("s1")
    journal.session(SessionRow("s1", "a", "s1"))
    record(journal, "s1", h := history(), b"new\n")
    await journal._commit()
    assert [r.bridge_id for r in store.sessions()] == ["s1"]
    assert [e.data for e in store.journal("s1")] == [b"new\n"]
    assert h.journaled == 1
    store.close()


async def test_close_frees_and_delete_removes_the_journal(tmp_path):
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, bridge, _n):
        first = await client.new_session()
        second = await client.new_session()
        await client.prompt(first, "count 2")
        await client.call("session/close", {"sessionId": first})
        await client.call("session/delete", {"sessionId": second})
        await bridge.hub.journal.wait_committed()
        store = bridge.hub.journal.store
        rows = {r.bridge_id: r.state for r in store.sessions()}
        assert rows == {first: "closed"}
        assert store.journal_bounds(first) == (1, 3)


def kept(store, sid):
    """A session's journal as the texts of its updates and prompts (``sessions export``)."""
    return [json.loads(e.data)["params"]["update"]["content"]["text"] for e in store.journal(sid)]


async def test_a_closed_session_keeps_its_row_and_journal_when_a_new_run_reuses_its_id(tmp_path):
    """The agent counts from s1 again in a new run; the earlier run's s1 was closed (the store
    keeps it, for ``sessions export``). The new s1 keeps the agent's id; the closed one moves
    aside with its row and journal: neither overwritten nor mixed with the new one's."""
    db = tmp_path / "bridge.db"
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, bridge, _n):
        assert await client.new_session() == "s1"
        await client.prompt("s1", "count 2")
        await client.call("session/close", {"sessionId": "s1"})
    run1 = ["count 2", "a:s1:0", "a:s1:1"]
    async with durable_bridge(db, {"a": FakeAgent("a")}) as (client, bridge, _n):
        assert await client.new_session() == "s1"
        await client.prompt("s1", "count 3")
        await bridge.hub.journal.wait_committed()
        store = bridge.hub.journal.store
        rows = {r.bridge_id: r for r in store.sessions()}
        assert {i: (r.agent_id, r.state) for i, r in rows.items()} == {
            "s1~a": ("s1", "closed"),
            "s1": ("s1", "active"),
        }
        assert kept(store, "s1~a") == run1
        assert kept(store, "s1") == ["count 3", "a:s1:0", "a:s1:1", "a:s1:2"]
        assert [e.seq for e in store.journal("s1")] == [1, 2, 3, 4]


async def test_a_session_closed_in_this_run_keeps_its_journal_when_a_restarted_agent_reuses_its_id(
    tmp_path,
):
    """Within one run: s1 is closed (gone from the session table, kept in the store), the
    agent crashes and, restarted, mints s1 again: the closed s1 moves aside, even when its
    row and entries are still waiting for the journal's next commit."""
    db = tmp_path / "bridge.db"
    a = FakeAgent("a")
    async with durable_bridge(db, {"a": a}) as (client, bridge, _n):
        assert await client.new_session() == "s1"
        await client.prompt("s1", "count 2")
        await client.call("session/close", {"sessionId": "s1"})
        assert await client.new_session() == "s2"
        assert (await client.prompt("s2", "crash"))["error"]["code"] == -32603
        assert await client.new_session() == "s1"
        assert a.starts == 2
        await client.prompt("s1", "count 3")
        await bridge.hub.journal.wait_committed()
        store = bridge.hub.journal.store
        rows = {r.bridge_id: (r.agent_id, r.state) for r in store.sessions()}
        assert rows["s1~a"] == ("s1", "closed")
        assert rows["s1"] == ("s1", "active")
        assert kept(store, "s1~a") == ["count 2", "a:s1:0", "a:s1:1"]
        assert kept(store, "s1") == ["count 3", "a:s1:0", "a:s1:1", "a:s1:2"]


async def test_a_closed_sessions_id_is_not_given_to_a_second_agent_either(tmp_path):
    """Two agents both mint s1: the second gets ``s1~b``. Closed in one run, that id stays
    its own in the next: b's new s1 gets another one."""
    db = tmp_path / "bridge.db"
    agents = {"a": FakeAgent("a"), "b": FakeAgent("b")}
    async with durable_bridge(db, agents) as (client, bridge, _n):
        assert [await client.new_session("a"), await client.new_session("b")] == ["s1", "s1~b"]
        await client.prompt("s1~b", "count 2")
        await client.call("session/close", {"sessionId": "s1~b"})
    async with durable_bridge(db, agents) as (client, bridge, _n):
        assert await client.new_session("a") == "s1"  # (a's stored s1 moved aside)
        second = await client.new_session("b")
        assert second not in ("s1", "s1~b")
        await client.prompt(second, "count 1")
        await bridge.hub.journal.wait_committed()
        store = bridge.hub.journal.store
        states = {r.bridge_id: (r.agent, r.state) for r in store.sessions()}
        assert states["s1~b"] == ("b", "closed")
        assert states[second] == ("b", "active")
        assert kept(store, "s1~b") == ["count 2", "b:s1:0", "b:s1:1"]
        assert kept(store, second) == ["count 1", "b:s1:0"]


async def reconnect_storm(*, reconnects, total, history_limit, seed):
    """Drop and come back ``reconnects`` times while an agent streams ``total`` updates;
    each time load after the last seq seen. Returns what the client saw, in order:
    numbers, and None where a load said the history was trimmed (resync)."""
    agent = FakeAgent("a")
    rng = random.Random(seed)
    seen: list[int | None] = []
    last_seq = 0
    async with open_bridge({"a": agent}, history_limit=history_limit) as (client, bridge):
        sid = await client.new_session()
        await client.disconnect()
        done = trio.Event()

        async def stream():
            for i in range(total):
                await agent.update("s1", str(i))
                await trio.lowlevel.checkpoint()  # a checkpoint, so clients come and go mid-stream
            done.set()

        async def visit(budget):
            nonlocal last_seq
            async with trio.open_nursery() as conn:
                peer = await connect(bridge, conn, seq=True)
                answer = await peer.request(
                    "session/load",
                    {**NEW, "sessionId": sid, "_meta": {"acp_bridge": {"after_seq": last_seq}}},
                )
                if not answer["result"]["_meta"]["acp_bridge"]["complete"]:
                    seen.append(None)

                def updates():
                    return [m for m in peer.received if m.get("method") == "session/update"]

                while len(updates()) < budget and not done.is_set():
                    await peer.changed.wait()
                for m in updates():
                    last_seq = m["params"]["_meta"]["acp_bridge"]["seq"]
                    seen.append(int(m["params"]["update"]["content"]["text"]))
                await peer.disconnect()
                conn.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream)
            for _ in range(reconnects):
                await visit(rng.randrange(0, 12))
            await done.wait()
            await visit(0)  # a last look: whatever is left
    return seen


def check_no_silent_gap(seen, total):
    """Consecutive and never repeated, except right after an explicit resync marker."""
    expected = 0
    for n in seen:
        if n is None:
            expected = None
            continue
        if expected is not None:
            assert n == expected, f"got {n}, expected {expected}"
        expected = n + 1
    assert seen[-1] == total - 1


async def test_1000_random_disconnects_with_after_seq_lose_and_repeat_nothing():
    """A client drops at random points while an agent streams; each time it comes back it
    loads after the last seq it saw: every update exactly once, in order."""
    seen = await reconnect_storm(reconnects=1000, total=3000, history_limit=100_000, seed=1)
    check_no_silent_gap(seen, 3000)
    assert None not in seen
    assert seen == list(range(3000))


async def test_random_disconnects_past_retention_say_resync_instead_of_a_silent_gap():
    seen = await reconnect_storm(reconnects=300, total=3000, history_limit=20, seed=2)
    check_no_silent_gap(seen, 3000)
    assert None in seen


def test_sessions_command_lists_and_exports(capsys):
    from acp_bridge.cli.main import main
    from acp_bridge.config.model import default_state_dir

    store = open_store(str(default_state_dir() / "bridge.db"))
    update = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1"}}\n'
    store.write(
        sessions=[SessionRow("s1", "demo", "s1", roots=("/w",))],
        journal=[JournalEntry("s1", 1, update), JournalEntry("s1", 2, update)],
    )
    store.close()
    assert main(["sessions"]) == 0
    out = capsys.readouterr().out
    assert "s1" in out
    assert "demo" in out
    assert "updates 1..2" in out
    assert main(["sessions", "export", "s1"]) == 0
    assert capsys.readouterr().out == (update * 2).decode()
    assert main(["sessions", "export", "nope"]) == 1


class _SlowStore:
    """A store whose ``write`` waits (in the journal's worker thread) until released."""

    def __init__(self) -> None:
        self.writing = threading.Event()
        self.release = threading.Event()
        self.written: list[int] = []

    def write(
        self, *, journal_runs: list[tuple[str, int, int, int, float, bytes]], **_: object
    ) -> None:
        self.writing.set()
        self.release.wait(10)
        self.written.append(sum(last - first + 1 for _, first, last, *_ in journal_runs))


async def test_the_backlog_counts_a_commit_still_being_written():
    """Regression: the journal took its entries out of the backlog before writing them, so
    ``backlog`` (and ``_acp_bridge/status``) said 0 — "the store has everything" — while the
    transaction was still running in its thread; a kill -9 then lost what status had called
    committed (the kill -9 end-to-end test failed now and then on a loaded machine)."""
    store = _SlowStore()
    journal = Journal(store)  # type: ignore[arg-type]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(journal.run)
            h = history()
            record(journal, "s1", h, b"{}\n")
            record(journal, "s1", h, b"{}\n")
            assert await trio.to_thread.run_sync(store.writing.wait, 10)
            try:
                assert journal.backlog() == 2  # being written: not in the store yet
                assert journal.statistics()["backlog"] == 2
            finally:
                store.release.set()
            await journal.wait_committed()
            assert journal.backlog() == 0
            assert store.written == [2]
            nursery.cancel_scope.cancel()


@hypothesis.given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(1, 2 * RUN_OWN_BYTES), st.integers(1, RUN_MAX_BYTES + 100)),
            st.booleans(),
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 10**6),
)
@hypothesis.example([(RUN_MAX_BYTES // 2, True)] * 3 + [(RUN_MAX_BYTES, True), (1, True)], 1)
@hypothesis.example(
    [(100, True)] * 3
    + [(RUN_OWN_BYTES, True), (100, True), (RUN_OWN_BYTES - 1, True), (100, True)],
    1,
)
@hypothesis.example([(10, True), (10, False), (10, False), (10, True)], 7)
def test_journal_rows_are_greedy_runs_of_one_live_flag_up_to_run_max_bytes(shape, first):
    """``runs`` against a plain model: a new row where ``live`` changes, where a number is
    missing (entries dropped past the backlog bound), where the next entry would take the
    row past ``RUN_MAX_BYTES`` (an entry bigger than that alone), and around an entry of
    ``RUN_OWN_BYTES`` or more (a row of its own, not copied into a join)."""
    seqs = itertools.accumulate((1 + (size % 7 == 0) for size, _ in shape), initial=first)
    entries = [
        (seq, b"x" * (size - 1) + b"\n", live)
        for seq, (size, live) in zip(seqs, shape, strict=False)
    ]
    expected: list[list[tuple[int, bytes, bool]]] = []
    for entry in entries:
        row = expected[-1] if expected else None
        if (
            row is not None
            and row[-1][2] == entry[2]
            and row[-1][0] + 1 == entry[0]
            and sum(len(e[1]) for e in row) + len(entry[1]) <= RUN_MAX_BYTES
            and len(entry[1]) < RUN_OWN_BYTES
            and len(row[0][1]) < RUN_OWN_BYTES
        ):
            row.append(entry)
        else:
            expected.append([entry])
    chunks = [(seq, seq, line, live) for seq, line, live in entries]
    assert runs("s", chunks, 1.5) == [
        ("s", row[0][0], row[-1][0], int(row[0][2]), 1.5, b"".join(e[1] for e in row))
        for row in expected
    ]


def _single_runs(session: str, first: int, last: int, stamp: float = 1.0):
    return [(session, seq, seq, 1, stamp, b"u%d\n" % seq) for seq in range(first, last + 1)]


def test_retention_of_named_sessions_and_by_age(tmp_path):
    store = open_store(str(tmp_path / "b.db"))
    store.write(journal_runs=_single_runs("s1", 1, 20) + _single_runs("s2", 1, 20))
    assert store.trim_journal(keep_entries=5, sessions=["s1"]) == 15
    assert store.journal_bounds("s1") == (16, 20)
    assert store.journal_bounds("s2") == (1, 20)  # not named: not read
    assert store.trim_journal(keep_entries=5, sessions=["nothing-here"]) == 0
    assert store.trim_journal(keep_entries=5) == 15  # None: every session
    assert store.journal_bounds("s2") == (16, 20)
    now = time.time()
    store.write(journal_runs=_single_runs("s3", 1, 3, now - 100) + _single_runs("s3", 4, 6, now))
    assert store.trim_journal(keep_entries=1000, max_age=50, sessions=[]) == 13  # s1, s2 (1.0)
    assert store.journal_bounds("s3") == (4, 6)
    assert store.journal_bounds("s1") == (0, 0)
    store.close()


def test_retention_and_bounds_never_read_the_whole_journal(tmp_path):
    """
    Regression (the 60-minute soak): the retention pass grouped the whole journal every minute
    (7.6 s over the soak's million runs, while commits waited and the backlog piled up in
    memory), and ``journal_bounds`` read every run of a session. Each statement they run now
    searches an index; only the first pass (every session) scans one, the covering index of
    sessions. So do the segment files' compaction's (a segment per commit here: each pass
    compacts some), which counts each segment's kept bytes at the first pass.
    """
    store = open_store(str(tmp_path / "b.db"))
    store.segments.max_bytes = 1
    now = time.time()  # (kept by the age limit: the passes have runs to compact)
    for first in range(1, 40, 10):
        store.write(journal_runs=_single_runs("s1", first, first + 9, now))
        store.write(journal_runs=_single_runs("s2", first, first + 9, now))
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    store.journal_bounds("s1")
    store.trim_journal(keep_entries=13, max_age=3600.0, sessions=["s1", "s2"])
    store.write(journal_runs=_single_runs("s1", 41, 45, now) + _single_runs("s2", 41, 45, now))
    store.trim_journal(keep_entries=11, max_age=3600.0, sessions=["s1", "s2"])
    store._conn.set_trace_callback(None)
    reads = [s for s in statements if s.lstrip().startswith(("SELECT", "DELETE"))]
    assert len(reads) >= 7
    assert any("GROUP BY segment" in s for s in reads)  # (the kept bytes removed)
    assert any("ORDER BY position" in s for s in reads)  # (the runs copied)
    for sql in reads:
        plan = [row[-1] for row in store._conn.execute("EXPLAIN QUERY PLAN " + sql)]
        assert not any(step.startswith("SCAN") for step in plan), (sql, plan)
        assert any("INDEX journal_" in step for step in plan), (sql, plan)
    store.close()


async def test_retention_passes_after_the_first_read_only_sessions_that_grew(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "TRIM_EVERY", -1.0)  # a pass after every commit
    store = open_store(str(tmp_path / "b.db"))
    store.write(journal_runs=_single_runs("old", 1, 20))  # over the limit before the start
    passes: list[tuple[set[str] | None, int]] = []
    passed = threading.Semaphore(0)
    trim = store.trim_journal

    def counted(**kwargs):
        removed = trim(**kwargs)
        passes.append((kwargs["sessions"], removed))
        passed.release()
        return removed

    store.trim_journal = counted  # type: ignore[method-assign]
    journal = Journal(store, keep_entries=5)
    h = history()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(journal.run)
            for _ in range(8):
                record(journal, "s1", h, b"{}\n")
            assert await trio.to_thread.run_sync(passed.acquire, True, 10)
            assert passes == [(None, 15)]  # the first pass: every session ("old")
            assert store.journal_bounds("old") == (16, 20)
            store.write(journal_runs=_single_runs("other", 1, 20))  # not through the journal
            record(journal, "s1", h, b"{}\n")
            assert await trio.to_thread.run_sync(passed.acquire, True, 10)
            assert passes[1][0] == {"s1"}
            assert store.journal_bounds("other") == (1, 20)
            nursery.cancel_scope.cancel()
    store.close()


async def test_only_the_owner_acts_on_a_session(tmp_path):
    """Another connection's requests about a session are refused (-32002, attached
    elsewhere), its notifications dropped; close and delete above all, which the bridge
    serves itself for an agent without them: the session and its journal stay. A load or
    resume takes the session over (the owner is told); then the new owner may delete it."""
    agent = FakeAgent("a", capabilities={"sessionCapabilities": {"resume": {}}})
    async with durable_bridge(tmp_path / "bridge.db", {"a": agent}) as (owner, bridge, nursery):
        sid = await owner.new_session()
        await owner.prompt(sid, "count 2")
        await bridge.hub.journal.wait_committed()
        bounds = bridge.hub.journal.store.journal_bounds(sid)
        other = await connect(bridge, nursery, name="other")
        asks = {
            "session/close": {"sessionId": sid},
            "session/delete": {"sessionId": sid},
            "session/prompt": {"sessionId": sid, "prompt": [{"type": "text", "text": "count 1"}]},
            "session/set_mode": {"sessionId": sid, "modeId": "x"},
            "session/set_config_option": {"sessionId": sid, "configId": "x", "value": "y"},
            "_vendor/thing": {"sessionId": sid},
        }
        for method, params in asks.items():
            refused = await other.request(method, params)
            assert refused["error"]["code"] == -32002, (method, refused)
            assert "attached elsewhere" in refused["error"]["message"], method
        await other.notify("session/cancel", {"sessionId": sid})
        await other.notify("_vendor/poke", {"sessionId": sid})
        await trio.testing.wait_all_tasks_blocked()
        sent = [m.get("method") for m in agent.received]
        assert "session/cancel" not in sent
        assert not [m for m in sent if m and m.startswith("_vendor")]
        assert sent.count("session/prompt") == 1  # the owner's only
        await bridge.hub.journal.wait_committed()
        assert bridge.hub.sessions.get(sid).client is not None
        assert {r.bridge_id: r.state for r in bridge.hub.journal.store.sessions()} == {
            sid: "active"
        }
        assert bridge.hub.journal.store.journal_bounds(sid) == bounds
        assert (await owner.prompt(sid, "count 1"))["result"]["stopReason"] == "end_turn"
        assert not [m for m in owner.received if m.get("method") == "_acp_bridge/log"]

        await other.call("session/resume", {"sessionId": sid, **NEW})
        told = await owner.wait_for(lambda m: m.get("method") == "_acp_bridge/log")
        assert "taken over" in told["params"]["data"]["message"]
        refused = await owner.request("session/delete", {"sessionId": sid})
        assert refused["error"]["code"] == -32002
        await other.call("session/delete", {"sessionId": sid})
        await bridge.hub.journal.wait_committed()
        assert bridge.hub.sessions.get(sid) is None
        assert list(bridge.hub.journal.store.sessions()) == []


class _HistoryModel:
    """A history as a plain list of (seq, line, live), trimmed one entry at a time."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.entries: list[tuple[int, bytes, bool]] = []
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.last_seq = self.journaled = 0
        self.spilled: list[tuple[int, bytes, bool]] = []

    def append(self, line: bytes, live: bool) -> None:
        self.last_seq += 1
        self.entries.append((self.last_seq, line, live))
        while len(self.entries) > self.max_entries or (
            sum(len(e[1]) for e in self.entries) > self.max_bytes
        ):
            entry = self.entries.pop(0)
            if entry[0] > self.journaled:
                self.journaled = entry[0]
                self.spilled.append(entry)

    def take(self) -> tuple[list[tuple[int, bytes, bool]], bool]:
        count = self.last_seq - self.journaled
        complete = count <= len(self.entries)
        tail = self.entries[len(self.entries) - min(count, len(self.entries)) :] if count else []
        self.journaled = self.last_seq
        return tail, complete


def _entries(chunks) -> list[tuple[int, bytes, bool]]:

    return [
        (n, line, chunk[3])
        for chunk in chunks
        for n, line in enumerate(chunk_lines(chunk), chunk[0])
    ]


@hypothesis.given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["run", "lines", "prompt"]),
            st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=12),
        ),
        max_size=30,
    ),
    max_entries=st.integers(0, 50),
    max_bytes=st.integers(0, 600),
    take_every=st.integers(1, 6),
)
def test_a_history_kept_in_chunks_is_a_list_trimmed_entry_by_entry(
    steps, max_entries, max_bytes, take_every
):
    """``History`` (runs kept as one chunk each, trimmed by moving a head and cutting a chunk
    where a bound falls inside it) keeps, numbers, trims, replays and hands the journal
    exactly what a plain list trimmed one entry at a time does, whatever the bounds."""
    history = History(max_entries=max_entries, max_bytes=max_bytes)
    model = _HistoryModel(max_entries, max_bytes)
    spilled: list = []
    history.spill = spilled.extend
    for n, (how, shape) in enumerate(steps):
        lines = [bytes([97 + n % 26]) * size + (b"\r\n" if crlf else b"\n") for size, crlf in shape]
        live = how != "prompt"
        if how == "run":
            last = history.extend(b"".join(lines), len(lines))
        else:
            for line in lines:
                last = history.append(line, live=live)
        for line in lines:
            model.append(line, live)
        assert last == model.last_seq
        assert (len(history), history.total_bytes) == (
            len(model.entries),
            sum(len(e[1]) for e in model.entries),
        )
        assert history.first_seq == (model.entries[0][0] if model.entries else model.last_seq + 1)
        if n % take_every == 0:
            taken, complete = history.take_unjournaled()
            assert (_entries(taken), complete) == model.take()
    for after in (0, model.last_seq // 2):
        for live_only in (False, True):
            assert history.after(after, live_only=live_only) == (
                [(s, d) for s, d, lv in model.entries if s > after and (lv or not live_only)],
                after + 1 >= (model.entries[0][0] if model.entries else model.last_seq + 1),
            )
    assert _entries(spilled) == model.spilled


def test_journal_rows_join_whole_chunks_and_keep_an_unterminated_entry_alone():
    """A run kept as one chunk joins its neighbours in a row; an entry without its newline
    (the store splits rows at newlines) is a row of its own."""
    chunks = [
        (1, 3, b"a\nb\nc\n", True),
        (4, 4, b"d", True),
        (5, 6, b"e\nf\n", True),
        (7, 7, b"g\n", True),
    ]
    assert runs("s", chunks, 2.0) == [
        ("s", 1, 3, 1, 2.0, b"a\nb\nc\n"),
        ("s", 4, 4, 1, 2.0, b"d"),
        ("s", 5, 7, 1, 2.0, b"e\nf\ng\n"),
    ]
