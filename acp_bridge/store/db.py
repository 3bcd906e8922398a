"""
The bridge's SQLite store: sessions and their journal, pending approvals, the audit log.
Standard-library ``sqlite3``, WAL, one writer.

Pure of trio: the blocking calls live here; ``engine.audit.AuditLog`` and
``engine.journal.Journal`` are the trio adapters that batch writes and run them off the event
loop.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any, Concatenate, Final, ParamSpec, TypeVar

import attrs
import structlog

from acp_bridge.store import elide
from acp_bridge.store.segments import Segments

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

logger = structlog.get_logger("acp_bridge.store")

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _serialized(
    method: Callable[Concatenate[Store, _P], _R],
) -> Callable[Concatenate[Store, _P], _R]:
    """
    One call at a time on the connection: the journal and the audit trail write from
    different worker threads, and SQLite allows one transaction per connection.
    """

    @functools.wraps(method)
    def call(store: Store, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with store._lock:
            return method(store, *args, **kwargs)

    return call


def _lines(data: bytes) -> list[bytes]:
    """The entries of a run: its newline-terminated lines."""
    return [line + b"\n" for line in data.split(b"\n")[:-1]]


#: The schema, one migration per version; ``PRAGMA user_version`` says which ran.
MIGRATIONS: Final[Sequence[str]] = (
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        session TEXT,
        agent TEXT,
        tool_call_id TEXT,
        title TEXT,
        kind TEXT,
        options TEXT NOT NULL,
        decision TEXT NOT NULL,
        option_id TEXT,
        source TEXT NOT NULL,
        connection TEXT,
        detail TEXT
    );
    """,
    """
    CREATE TABLE sessions (
        bridge_id TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        roots TEXT NOT NULL,
        setup TEXT NOT NULL,
        unattended INTEGER NOT NULL,
        state TEXT NOT NULL,
        created REAL NOT NULL,
        last_active REAL NOT NULL
    );
    CREATE TABLE journal (
        session TEXT NOT NULL,
        seq INTEGER NOT NULL,
        live INTEGER NOT NULL,
        time REAL NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (session, seq)
    ) WITHOUT ROWID;
    CREATE TABLE pending_approvals (
        key TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        agent TEXT NOT NULL,
        params TEXT NOT NULL,
        time REAL NOT NULL
    );
    """,
    # The journal keeps runs: consecutive entries of a session, with the same ``live``, in
    # one row (each entry one newline-terminated line of ``data``). An insert costs about as
    # much as relaying the update itself: one row per entry would double the bridge's cost
    # per update; one row per run and per commit makes it negligible.
    """
    CREATE TABLE journal_runs (
        session TEXT NOT NULL,
        first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL,
        live INTEGER NOT NULL,
        time REAL NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (session, first_seq)
    ) WITHOUT ROWID;
    INSERT INTO journal_runs SELECT session, seq, seq, live, time, data FROM journal;
    DROP TABLE journal;
    ALTER TABLE journal_runs RENAME TO journal;
    """,
    # The journal as a rowid table with a unique index on (session, first_seq), not a
    # WITHOUT ROWID table: its rows are runs of up to 64 KiB, which SQLite lays out as
    # overflow chains, which a rowid table inserts with less CPU (``bench/journal_store.py``
    # compares the layouts), and the index holds only the two keys.
    """
    CREATE TABLE journal_rows (
        session TEXT NOT NULL,
        first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL,
        live INTEGER NOT NULL,
        time REAL NOT NULL,
        data BLOB NOT NULL
    );
    INSERT INTO journal_rows SELECT session, first_seq, last_seq, live, time, data
        FROM journal ORDER BY session, first_seq;
    DROP TABLE journal;
    ALTER TABLE journal_rows RENAME TO journal;
    CREATE UNIQUE INDEX journal_run ON journal (session, first_seq);
    """,
    # The age limit's index: without it each retention pass would read the whole journal.
    """
    CREATE INDEX journal_time ON journal (time);
    """,
    # A sub-agent's session names its parent's (docs/subagents.md); NULL: a client's own.
    """
    ALTER TABLE sessions ADD COLUMN parent TEXT;
    """,
    # The journal's bytes in segment files (``store.segments``): a row written since holds the
    # run's place there and an empty ``data``; older rows keep theirs inline (read as they
    # are: no rewrite of an existing store). The partial index finds whether a segment
    # is still referenced (retention deletes the files no row points into).
    """
    ALTER TABLE journal ADD COLUMN segment INTEGER;
    ALTER TABLE journal ADD COLUMN position INTEGER;
    ALTER TABLE journal ADD COLUMN length INTEGER;
    CREATE INDEX journal_segment ON journal (segment) WHERE segment IS NOT NULL;
    """,
    # A run in a segment may be stored with each line's prefix shared with the line before
    # elided (``store.elide``; ``length`` is then the stored bytes'): ``raw_length`` is its length
    # once restored. NULL: the bytes as they are (every row written before, and a run that
    # eliding would not make smaller).
    """
    ALTER TABLE journal ADD COLUMN raw_length INTEGER;
    """,
)

#: The page size of a new store (an existing one keeps its own). 16 KiB, not SQLite's 4 KiB:
#: the journal's runs span a quarter of the pages, and each page written costs system calls
#: twice (the WAL, then the checkpoint), so fewer, larger pages cost the store less CPU per
#: journal entry, while a commit of one small update writes only a few pages either way.
PAGE_SIZE: Final = 16 * 1024

#: Compaction copies at most this many bytes per retention pass, or, when more, what the
#: journal appended since the previous pass (or one segment's kept bytes, when a single one
#: is more): each byte copied frees more than one, so a pass that stops at this bound has
#: still freed more than was written since the one before (docs/performance.md, "The
#: journal's bytes in append-only segments": compaction).
COMPACT_BYTES: Final = 64 * 1024 * 1024


@attrs.frozen
class SessionRow:
    """What the store keeps of a session: enough to list it, route it and replay it."""

    bridge_id: str
    agent: str
    agent_id: str
    roots: tuple[str, ...] = ()
    setup: dict[str, Any] = attrs.field(factory=dict)
    unattended: bool = False
    state: str = "active"
    created: float = attrs.field(factory=time.time)
    last_active: float = attrs.field(factory=time.time)
    #: the bridge id of the session that spawned it (a sub-agent), None for a client's own
    parent: str | None = None


@attrs.frozen
class JournalEntry:
    """One relayed update (or the user's prompt: ``live`` False) of a session, numbered."""

    session: str
    seq: int
    data: bytes
    live: bool = True
    time: float = attrs.field(factory=time.time)


@attrs.frozen
class AuditRecord:
    """
    One decision about an agent's request (permission, file access, elicitation).

    Attributes:
        decision: what was answered: ``allow``, ``deny``, ``cancelled``, ``refused``...
        source: who decided: a rule id, ``client``, ``timeout``, ``cancel``, ``unattended``,
            ``grace``, ``agent_exit``, ``agent_cancel``, ``containment``, ``late_answer``...
    """

    session: str | None
    agent: str | None
    decision: str
    source: str
    tool_call_id: str | None = None
    title: str | None = None
    kind: str | None = None
    options: tuple[str, ...] = ()
    option_id: str | None = None
    connection: str | None = None
    detail: str | None = None
    time: float = attrs.field(factory=time.time)

    def as_row(self) -> tuple[Any, ...]:
        return (
            self.time,
            self.session,
            self.agent,
            self.tool_call_id,
            self.title,
            self.kind,
            json.dumps(list(self.options)),
            self.decision,
            self.option_id,
            self.source,
            self.connection,
            self.detail,
        )


_COLUMNS: Final = (
    "time, session, agent, tool_call_id, title, kind, options, decision, option_id, source, "
    "connection, detail"
)


class Store:
    """
    The database. Open with :func:`open_store`; every method blocks (call it off the event
    loop, e.g. through ``trio.to_thread``), and only one thread may write at a time.
    """

    def __init__(
        self, conn: sqlite3.Connection, path: str, segments: Segments | None = None
    ) -> None:
        self._conn = conn
        self.path = path
        self._lock = threading.RLock()
        #: where the journal's bytes go (None: inline in the rows, a ``:memory:`` store)
        self.segments = segments
        self._compaction = _Compaction(conn, segments)

    @_serialized
    def close(self) -> None:
        self._conn.close()
        if self.segments is not None:
            self.segments.close()

    @_serialized
    def append_audit(self, records: Iterable[AuditRecord]) -> None:
        """Append records in one transaction."""
        with self._conn:
            self._conn.executemany(
                f"INSERT INTO audit ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [r.as_row() for r in records],
            )

    # -- sessions and journal

    @_serialized
    def write(
        self,
        *,
        sessions: Iterable[SessionRow] = (),
        journal: Iterable[JournalEntry] = (),
        journal_runs: Sequence[tuple[str, int, int, int, float, bytes]] = (),
        deleted: Iterable[str] = (),
        renamed: Iterable[tuple[str, str]] = (),
        pending_added: Iterable[tuple[str, str, str, str]] = (),
        pending_removed: Iterable[str] = (),
    ) -> None:
        """
        One transaction for a batch of changes (the journal writer calls this). The
        journal's bytes go to the segment files first (one write, then ``fdatasync``), then the
        transaction commits the rows that index them; an ``OSError`` there (a full disk)
        leaves the store as it was and is raised, as SQLite's own errors are.

        ``journal_runs`` are runs of entries already in column order (session, first seq,
        last seq, live, time, the entries' lines joined): the writer's hot path, with no
        object per entry. ``journal`` entries are written one run each. ``renamed`` sessions
        (old bridge id, new) move first, with their journal, over whatever was at the new id;
        then the ``deleted`` ones go: the rows and entries of the batch, recorded after the
        delete, are of a new session with that id (an agent counting from 1 again).
        """
        rows = [(e.session, e.seq, e.seq, int(e.live), e.time, e.data) for e in journal]
        rows += journal_runs
        index: list[
            tuple[str, int, int, int, float, bytes, int | None, int | None, int, int | None]
        ] = []
        dead: dict[int, int] = {}  # (segment: bytes of the rows the transaction removes)
        if rows and self.segments is not None:
            # Each run's lines with the prefix shared with the line before elided, here in the
            # writer's thread: far fewer bytes to write (None: not smaller, stored as is).
            elided = [elide.elide(row[5]) for row in rows]
            blobs = [row[5] if e is None else e for row, e in zip(rows, elided, strict=True)]
            segment, start = self.segments.append(blobs)
            position = start
            for (session, first, last, live, stamp, data), blob, e in zip(
                rows, blobs, elided, strict=True
            ):
                raw = None if e is None else len(data)
                index.append(
                    (session, first, last, live, stamp, b"", segment, position, len(blob), raw)
                )
                position += len(blob)
            dead[segment] = start - position  # (negative: bytes added)
            self._compaction.appended += position - start
        else:
            index = [(*row, None, None, len(row[5]), None) for row in rows]
        with self._conn as conn:
            for old, new in renamed:
                self._compaction.removing(dead, "WHERE session = ?", (new,))
                conn.execute("DELETE FROM journal WHERE session = ?", (new,))
                conn.execute("DELETE FROM sessions WHERE bridge_id = ?", (new,))
                conn.execute("UPDATE journal SET session = ? WHERE session = ?", (new, old))
                conn.execute("UPDATE sessions SET bridge_id = ? WHERE bridge_id = ?", (new, old))
            for bridge_id in deleted:
                self._compaction.removing(dead, "WHERE session = ?", (bridge_id,))
                conn.execute("DELETE FROM journal WHERE session = ?", (bridge_id,))
                conn.execute("DELETE FROM sessions WHERE bridge_id = ?", (bridge_id,))
            conn.executemany(
                "INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(bridge_id) DO "
                "UPDATE SET agent=excluded.agent, agent_id=excluded.agent_id, "
                "roots=excluded.roots, setup=excluded.setup, unattended=excluded.unattended, "
                "state=excluded.state, last_active=excluded.last_active, "
                "parent=excluded.parent",
                [
                    (
                        r.bridge_id,
                        r.agent,
                        r.agent_id,
                        json.dumps(list(r.roots)),
                        json.dumps(r.setup),
                        int(r.unattended),
                        r.state,
                        r.created,
                        r.last_active,
                        r.parent,
                    )
                    for r in sessions
                ],
            )
            if index:
                conn.executemany(
                    "INSERT OR REPLACE INTO journal VALUES (?,?,?,?,?,?,?,?,?,?)", index
                )
            conn.executemany(
                "INSERT OR REPLACE INTO pending_approvals VALUES (?,?,?,?,?)",
                [
                    (key, sid, agent, params, time.time())
                    for key, sid, agent, params in pending_added
                ],
            )
            conn.executemany(
                "DELETE FROM pending_approvals WHERE key = ?", [(k,) for k in pending_removed]
            )
        self._compaction.count_dead(dead)
        if deleted or renamed:
            self._remove_segments()

    @_serialized
    def sessions(self) -> list[SessionRow]:
        rows = self._conn.execute(
            "SELECT bridge_id, agent, agent_id, roots, setup, unattended, state, created, "
            "last_active, parent FROM sessions ORDER BY created"
        ).fetchall()
        return [
            SessionRow(
                bridge_id=r[0],
                agent=r[1],
                agent_id=r[2],
                roots=tuple(json.loads(r[3])),
                setup=json.loads(r[4]),
                unattended=bool(r[5]),
                state=r[6],
                created=r[7],
                last_active=r[8],
                parent=r[9],
            )
            for r in rows
        ]

    @_serialized
    def journal(
        self, session: str, *, after_seq: int = 0, live_only: bool = False, limit: int = 10**9
    ) -> list[JournalEntry]:
        query = (
            "SELECT first_seq, last_seq, live, time, data, segment, position, length, "
            "raw_length FROM journal WHERE session = ? AND last_seq > ?"
        )
        if live_only:
            query += " AND live = 1"
        out: list[JournalEntry] = []
        read = None  # (the segment files are opened once per call, when a row is in one)
        start, retried = after_seq, None
        with contextlib.ExitStack() as stack:
            while True:
                cursor = self._conn.execute(query + " ORDER BY first_seq", (session, start))
                for first, last, live, stamp, data, segment, position, length, raw in cursor:
                    if segment is not None:
                        if self.segments is None:
                            raise StoreError(f"{self.path}: a journal row in a segment file")
                        if read is None:
                            read = stack.enter_context(self.segments.reading())
                        data = read(segment, position, length)
                        if data is None and retried != (first, segment, position):
                            # The file went since the select (another process's retention
                            # or compaction): select again from this row, in a new snapshot
                            # of the index (once the cursor is closed), where the row is
                            # gone (trimmed) or points at its copy (compacted).
                            retried = (first, segment, position)
                            start = max(after_seq, first - 1)
                            break
                        if data is None:  # (gone in the new snapshot too: trimmed)
                            continue
                        if raw is not None:
                            data = self._restore(session, first, segment, position, data, raw)
                            if data is None:  # (corrupt: skipped as a run whose bytes went)
                                continue
                    lines = [bytes(data)] if first == last else _lines(bytes(data))
                    for seq, line in enumerate(lines, first):
                        if seq > after_seq:
                            if len(out) >= limit:
                                return out
                            out.append(JournalEntry(session, seq, line, bool(live), stamp))
                else:
                    return out
                cursor.close()

    def _restore(
        self, session: str, first: int, segment: int, position: int, blob: bytes, size: int
    ) -> bytes | None:
        """A run stored elided, restored; None (logged) when its bytes are not a valid one."""
        try:
            return elide.restore(blob, size)
        except ValueError as exc:
            logger.error(
                "journal_run_corrupt",
                session=session,
                first_seq=first,
                file=self.segments.path(segment) if self.segments else None,
                position=position,
                reason=str(exc),
            )
            return None

    @_serialized
    def journal_bounds(self, session: str) -> tuple[int, int]:
        """(first, last) sequence numbers kept for a session; (0, 0) when none."""
        return self._bounds(session)

    def _bounds(self, session: str) -> tuple[int, int]:
        # Seeks in the (session, first_seq) index. (MIN/MAX over the session's rows would
        # read every one of them: a cost per load that grows with the journal.)
        first = self._conn.execute(
            "SELECT first_seq FROM journal WHERE session = ? ORDER BY first_seq LIMIT 1",
            (session,),
        ).fetchone()
        return (0, 0) if first is None else (first[0], self._last_seq(session))

    def _last_seq(self, session: str) -> int:
        # The runs of a session are consecutive and do not overlap: its last run by first_seq
        # holds its last sequence number.
        last = self._conn.execute(
            "SELECT last_seq FROM journal WHERE session = ? ORDER BY first_seq DESC LIMIT 1",
            (session,),
        ).fetchone()
        return 0 if last is None else int(last[0])

    @_serialized
    def trim_journal(
        self,
        *,
        keep_entries: int,
        max_age: float | None = None,
        sessions: Iterable[str] | None = None,
        compact_bytes: int | None = None,
    ) -> int:
        """
        Retention: per session keep the newest ``keep_entries``, none older than ``max_age``
        (whole runs: a run with any entry to keep is kept). ``sessions``: the sessions that
        may have grown past ``keep_entries`` (None: every session in the journal). Returns
        the entries removed.

        Each session costs index seeks and the runs removed; the age limit, a range of
        the ``time`` index. Nothing here reads the whole journal: on a large journal such a
        pass takes seconds, and commits wait behind it. Then compaction of the segment
        files (``_Compaction.run``), at most ``compact_bytes`` copied (None: ``COMPACT_BYTES`` or
        what was appended since the last pass, whichever is more).
        """
        removed = 0
        dead: dict[int, int] = {}
        with self._conn as conn:
            if sessions is None:
                sessions = [s for (s,) in conn.execute("SELECT DISTINCT session FROM journal")]
            for session in sessions:
                bound = self._last_seq(session) - keep_entries  # runs ending at or before it go
                if bound < 1:
                    continue
                where = "WHERE session = ? AND first_seq <= ? AND last_seq <= ?"
                (count,) = conn.execute(
                    "SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM journal " + where,
                    (session, bound, bound),
                ).fetchone()
                if count:
                    self._compaction.removing(dead, where, (session, bound, bound))
                    conn.execute("DELETE FROM journal " + where, (session, bound, bound))
                    removed += count
            if max_age is not None:
                cutoff = time.time() - max_age
                (aged,) = conn.execute(
                    "SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM journal WHERE time < ?",
                    (cutoff,),
                ).fetchone()
                if aged:
                    self._compaction.removing(dead, "WHERE time < ?", (cutoff,))
                    conn.execute("DELETE FROM journal WHERE time < ?", (cutoff,))
                    removed += aged
        self._compaction.count_dead(dead)
        if removed:
            self._remove_segments()
        self._compaction.run(compact_bytes)
        return int(removed)

    def _remove_segments(self) -> None:
        """
        Delete the segment files no row points into any more (after the commit that removed
        the rows: a crash before leaves a file, never a row without its bytes). One seek in
        the ``journal_segment`` index per file.
        """
        if self.segments is None:
            return
        self.segments.remove_unreferenced(
            lambda number: (
                self._conn.execute(
                    "SELECT 1 FROM journal WHERE segment = ? LIMIT 1", (number,)
                ).fetchone()
                is not None
            )
        )

    @_serialized
    def pending_approvals(self) -> list[tuple[str, str, str, str]]:
        """(key, session, agent, params JSON) of approvals that were waiting at the last stop."""
        return [
            (r[0], r[1], r[2], r[3])
            for r in self._conn.execute(
                "SELECT key, session, agent, params FROM pending_approvals ORDER BY time"
            )
        ]

    # -- audit

    @_serialized
    def audit(self, *, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        """Audit records with an id above ``after_id``, oldest first."""
        cursor = self._conn.execute(
            f"SELECT id, {_COLUMNS} FROM audit WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit),
        )
        names = [d[0] for d in cursor.description]
        rows = []
        for row in cursor:
            record = dict(zip(names, row, strict=True))
            record["options"] = json.loads(record["options"])
            rows.append(record)
        return rows


class _Compaction:
    """
    The segment files' compaction (``Store.trim_journal`` runs it, under the store's lock)
    and the count of the kept bytes in each segment it chooses by.
    """

    def __init__(self, conn: sqlite3.Connection, segments: Segments | None) -> None:
        self._conn = conn
        self.segments = segments
        #: the bytes of kept rows in each segment, counted at the first retention pass, then
        #: kept up to date by the statements that add and remove rows
        self._live: dict[int, int] | None = None
        #: the bytes the writer appended since the last retention pass (compaction's budget)
        self.appended = 0

    def removing(self, dead: dict[int, int], where: str, args: tuple[Any, ...]) -> None:
        """
        Add to ``dead`` the bytes per segment of the rows ``where`` selects, before the
        statement that deletes them (a cost in the rows removed, which the delete reads too).
        No ``segment IS NOT NULL`` term: it would let SQLite scan the partial index.
        """
        if self._live is None:
            return
        for segment, length in self._conn.execute(
            "SELECT segment, SUM(length) FROM journal " + where + " GROUP BY segment", args
        ):
            if segment is not None:
                dead[segment] = dead.get(segment, 0) + length

    def count_dead(self, dead: dict[int, int]) -> None:
        """After the commit: the rows added (negative) and removed, in each segment's count."""
        if self._live is not None:
            for segment, length in dead.items():
                self._live[segment] = self._live.get(segment, 0) - length

    def run(self, budget: int | None) -> None:
        """
        Copy the kept runs of each sealed segment less than half kept into the newest one,
        then delete it: the segments' total stays under twice the kept bytes plus the newest
        (docs/performance.md). Least kept first, until ``budget`` bytes are copied (the rest
        waits for the next pass). A segment's runs: one append (synced), their rows
        re-pointed in one transaction, the file deleted after the commit: a crash between
        leaves both copies and the rows pointing at one; the old file goes at the next pass.
        """
        segments = self.segments
        if segments is None:
            return
        if budget is None:
            budget = max(COMPACT_BYTES, self.appended)
        self.appended = 0
        if self._live is None:  # (once per open: a seek in ``journal_segment`` per file)
            self._live = {n: self._kept_in(n) for n in segments.numbers()}
        for number in set(self._live) - set(segments.numbers()):
            del self._live[number]
        copied, seen = 0, set[int]()
        while fresh := [n for n in segments.sealed() if n not in seen]:
            # (again when the copies rotated: the segment appended to before is sealed now)
            copied = self._compact_some(fresh, budget, copied)
            seen.update(fresh)
            if copied >= budget:
                break

    def _compact_some(self, numbers: list[int], budget: int, copied: int) -> int:
        """``run`` of these sealed segments; returns the bytes copied in the pass."""
        segments = self.segments
        assert segments is not None
        assert self._live is not None
        candidates = []
        for number in numbers:
            size, kept = segments.size(number), self._live.get(number, 0)
            if 2 * kept < size:
                candidates.append((kept / size, number))
        for _, number in sorted(candidates):
            rows = self._conn.execute(
                "SELECT rowid, position, length FROM journal WHERE segment = ? ORDER BY position",
                (number,),
            ).fetchall()
            kept = self._live[number] = sum(length for _, _, length in rows)
            if 2 * kept >= segments.size(number):  # (the count was off: it is not)
                continue
            if copied and copied + kept > budget:
                return budget  # (the rest: at the next pass)
            if rows:
                with segments.reading() as read:
                    blobs = [read(number, position, length) for _, position, length in rows]
                if any(blob is None for blob in blobs):  # (never: the file is ours to delete)
                    raise StoreError(f"{segments.path(number)}: shorter than its index")
                segment, position = segments.append([blob for blob in blobs if blob is not None])
                moved = []
                for rowid, _, length in rows:
                    moved.append((segment, position, rowid))
                    position += length
                with self._conn as conn:
                    conn.executemany(
                        "UPDATE journal SET segment = ?, position = ? WHERE rowid = ?", moved
                    )
                self._live[segment] = self._live.get(segment, 0) + kept
                copied += kept
            segments.remove(number)
            del self._live[number]
        return copied

    def _kept_in(self, number: int) -> int:
        (kept,) = self._conn.execute(
            "SELECT COALESCE(SUM(length), 0) FROM journal WHERE segment = ?", (number,)
        ).fetchone()
        return int(kept)


def open_store(path: str) -> Store:
    """
    Open (creating if needed) the database at ``path`` (``":memory:"`` for a throwaway one) and
    bring its schema up to date.
    """
    try:
        return _open(path)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open the store {path}: {exc}") from None


def _open(path: str) -> Store:
    if path != ":memory:":
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # (before anything is written: a new store)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.isolation_level = "DEFERRED"
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version > len(MIGRATIONS):
        conn.close()
        raise StoreError(
            f"{path}: schema version {version} is newer than this acp-bridge knows "
            f"({len(MIGRATIONS)})"
        )
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        with conn:
            conn.executescript(f"BEGIN;{script};PRAGMA user_version={number};COMMIT;")
    segments = None if path == ":memory:" else Segments(path + ".journal")
    return Store(conn, path, segments)


class StoreError(Exception):
    pass


def format_audit(record: dict[str, Any]) -> str:
    """One audit record as a line a person reads."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["time"]))
    what = record["title"] or record["kind"] or "request"
    chosen = f" ({record['option_id']})" if record.get("option_id") else ""
    parts = [
        stamp,
        f"{record['decision'].upper():9}",
        f"by {record['source']}",
        f"agent={record['agent']}",
        f"session={record['session']}",
        f"{what!r}{chosen}",
    ]
    if record.get("detail"):
        parts.append(f"— {record['detail']}")
    return "  ".join(parts)


def follow(store: Store, *, poll: float = 0.5) -> Iterator[dict[str, Any]]:
    """Yield audit records as they are written (a CLI helper; polls the database)."""
    last = 0
    while True:
        rows = store.audit(after_id=last)
        yield from rows
        if rows:
            last = rows[-1]["id"]
        else:
            time.sleep(poll)
