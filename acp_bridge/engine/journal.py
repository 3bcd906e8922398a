"""
The journal's trio side: sessions, their relayed updates and pending approvals go to the store
in batches — one transaction per burst, never one per message — off the event loop.

Recording never waits and costs the hot path one dict lookup: the updates are already in the
session's in-memory history (``History``), so the bridge only tells the journal which
session has new entries (:meth:`Journal.updated`), and the writer takes them from the history
when it commits. It commits what has gathered every ``interval`` seconds at most (so a
``kill -9`` loses at most the last ``interval`` plus one transaction's worth of updates; a
clean stop loses nothing). An entry the history's bounds trim before the writer came for it
is handed over at that moment (``History.spill``) and kept here until the commit. Bounded:
past ``max_backlog`` entries kept that way, new ones are dropped and their sessions marked
as having a gap, which a later replay reports as "resync required".
"""

from __future__ import annotations

import functools
import operator
import time
from typing import TYPE_CHECKING, Final

import attrs
import structlog
import trio

if TYPE_CHECKING:
    from acp_bridge.sessions.table import Chunk, History
    from acp_bridge.store.db import SessionRow, Store

logger = structlog.get_logger("acp_bridge.journal")

FLUSH_INTERVAL: Final = 0.05
#: a run row holds about this many bytes at most: a flood is written as rows of this size
#: (SQLite stores a large blob as a chain of overflow pages; rows of megabytes cost it about
#: 1.7 us of CPU per entry here, rows of 64 KiB about 1.1)
RUN_MAX_BYTES: Final = 64 * 1024
#: a chunk of this many bytes or more is a row of its own, never joined to the chunks beside
#: it: the join would copy it into fresh memory (the writer's page faults), dearer than the
#: index row it saves (a relayed run is a chunk of up to a reader's turn of lines)
RUN_OWN_BYTES: Final = 4 * 1024
#: entries handed over by trimmed histories, at most (see the module's notes)
MAX_BACKLOG: Final = 200_000
#: retention runs every this many seconds, over the sessions written to since the last pass
#: (the first pass after a start: every session); commits wait while it runs
TRIM_EVERY: Final = 60.0

#: a journal row: (session, first seq, last seq, live, time, the entries' lines joined)
Row = tuple[str, int, int, int, float, bytes]

_LINE = operator.itemgetter(1)  # (of a history entry: seq, line, live)
_LIVE = operator.itemgetter(2)
_LAST_BYTE = operator.itemgetter(-1)


class Journal:
    """Batches writes for one store. Run :meth:`run` in a nursery."""

    def __init__(
        self,
        store: Store,
        *,
        keep_entries: int = 100_000,
        max_age: float | None = None,
        interval: float = FLUSH_INTERVAL,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        self.store = store
        self.keep_entries = keep_entries
        self.max_age = max_age
        self.interval = interval
        self.max_backlog = max_backlog
        self._sessions: dict[str, SessionRow] = {}
        #: sessions whose history has entries the journal has not taken: bridge id → history
        self._updated: dict[str, History] = {}
        #: chunks trimmed from a history before the journal took them, per session, in order
        self._spilled: dict[str, list[Chunk]] = {}
        self._spilled_count = 0
        self._deleted: list[str] = []
        #: sessions given another bridge id: (old, new), written before the rest of a commit
        self._renamed: list[tuple[str, str]] = []
        #: the new ids of renames not in the store yet (reads of them wait: :meth:`moved`)
        self._moving: set[str] = set()
        #: sessions with entries written since the last retention pass (None: every session,
        #: the first pass: the limits may have changed since the journal was last written)
        self._grown: set[str] | None = None
        self._pending_added: dict[str, tuple[str, str, str, str]] = {}
        self._pending_removed: list[str] = []
        #: changes taken by the commit being written in the worker thread (not in the store yet)
        self._writing = 0
        self._wake = trio.Event()
        self._committed = trio.Event()
        #: sessions whose journal lost entries (past ``max_backlog``, or trimmed from a
        #: history the journal does not :meth:`follow`)
        self.gaps: set[str] = set()
        self.commits = 0
        self.entries_written = 0

    # -- recording (never awaits)

    def session(self, row: SessionRow) -> None:
        self._sessions[row.bridge_id] = row
        self._wake.set()

    def updated(self, session: str, history: History) -> None:
        """
        ``session`` appended to its ``history``: the entries after ``history.journaled`` go
        to the store with the next commit. Each must be one newline-terminated line.
        """
        if session not in self._updated:
            self._updated[session] = history
            self._wake.set()

    def follow(self, session: str, history: History) -> None:
        """Journal ``session``'s ``history`` (:meth:`updated` says when it has new entries)."""
        history.spill = functools.partial(self._keep, session)

    def _keep(self, session: str, chunks: list[Chunk]) -> None:
        """Chunks of ``session`` its history trimmed before the journal took them."""
        kept = self._spilled.setdefault(session, [])
        for chunk in chunks:
            size = chunk[1] - chunk[0] + 1
            if self._spilled_count + size > self.max_backlog:
                if session not in self.gaps:
                    logger.error("journal_backlog_full", session=session)
                self.gaps.add(session)
                break
            self._spilled_count += size
            kept.append(chunk)

    def delete(self, bridge_id: str) -> None:
        self._sessions.pop(bridge_id, None)
        self._updated.pop(bridge_id, None)
        self._spilled_count -= entry_count(self._spilled.pop(bridge_id, []))
        self._deleted.append(bridge_id)
        self._wake.set()

    def rename(self, old: str, new: str) -> None:
        """
        Session ``old`` is called ``new`` from now on: its row and journal move with it (in
        the next commit, before anything else it writes, so ``old`` is free for a new session
        in that same commit). ``new`` is an id the store does not hold (the session table
        keeps closed sessions' ids taken); were anything there, it would go.
        """
        row = self._sessions.pop(old, None)
        if row is not None:
            self._sessions[new] = attrs.evolve(row, bridge_id=new)
        history = self._updated.pop(old, None)
        if history is not None:
            self._updated[new] = history
        spilled = self._spilled.pop(old, None)
        if spilled is not None:
            self._spilled[new] = spilled
        for keys in (self.gaps, self._grown):
            if keys is not None and old in keys:
                keys.discard(old)
                keys.add(new)
        self._renamed.append((old, new))
        self._moving.add(new)
        self._wake.set()

    def pending_added(self, key: str, session: str, agent: str, params: str) -> None:
        self._pending_added[key] = (key, session, agent, params)
        self._wake.set()

    def pending_removed(self, key: str) -> None:
        if self._pending_added.pop(key, None) is None:
            self._pending_removed.append(key)
            self._wake.set()

    def backlog(self) -> int:
        """Changes recorded and not committed yet (0: the store has everything)."""
        return (
            len(self._sessions)
            + sum(h.last_seq - h.journaled for h in self._updated.values())
            + self._spilled_count
            + len(self._deleted)
            + len(self._renamed)
            + len(self._pending_added)
            + len(self._pending_removed)
            + self._writing
        )

    def statistics(self) -> dict[str, object]:
        return {
            "commits": self.commits,
            "entriesWritten": self.entries_written,
            "backlog": self.backlog(),
            "gaps": sorted(self.gaps),
        }

    # -- writing

    async def wait_committed(self) -> None:
        """Wait until everything recorded so far is in the store."""
        while self.backlog():
            committed = self._committed
            self._wake.set()
            await committed.wait()

    async def moved(self, session: str) -> None:
        """Wait until a rename to ``session`` is in the store (at once when none is pending)."""
        while session in self._moving:
            committed = self._committed
            self._wake.set()
            await committed.wait()

    async def run(self) -> None:
        last_trim = trio.current_time()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                await self._commit()
                if trio.current_time() - last_trim > TRIM_EVERY:
                    last_trim = trio.current_time()
                    grown, self._grown = self._grown, set()
                    await trio.to_thread.run_sync(self._trim, grown)
                await trio.sleep(self.interval)  # gather the next burst
        finally:
            with trio.CancelScope(shield=True):
                await self._commit()

    def _trim(self, grown: set[str] | None) -> None:
        removed = self.store.trim_journal(
            keep_entries=self.keep_entries, max_age=self.max_age, sessions=grown
        )
        if removed:
            logger.info("journal_trimmed", entries=removed)

    async def _commit(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        updated, self._updated = self._updated, {}
        spilled, self._spilled, self._spilled_count = self._spilled, {}, 0
        taken: list[tuple[str, list[Chunk]]] = []
        for session, history in updated.items():
            entries, complete = history.take_unjournaled()
            if not complete and session not in self.gaps:
                logger.error("journal_gap", session=session, reason="trimmed from the history")
                self.gaps.add(session)
            older = spilled.pop(session, None)
            if older:
                entries = older + entries
            if entries:
                taken.append((session, entries))
        taken += spilled.items()  # (trimmed, and not noted as updated since: not in practice)
        count = sum(entry_count(e) for _, e in taken)
        deleted, self._deleted = self._deleted, []
        renamed, self._renamed = self._renamed, []
        added, self._pending_added = list(self._pending_added.values()), {}
        removed, self._pending_removed = self._pending_removed, []
        if sessions or count or deleted or renamed or added or removed:
            self._writing = (
                len(sessions) + count + len(deleted) + len(renamed) + len(added) + len(removed)
            )
            stamp = time.time()
            try:
                await trio.to_thread.run_sync(
                    lambda: self.store.write(
                        renamed=renamed,
                        sessions=sessions,
                        journal_runs=[row for s, e in taken for row in runs(s, e, stamp)],
                        deleted=deleted,
                        pending_added=added,
                        pending_removed=removed,
                    )
                )
            finally:
                self._writing = 0
            self.commits += 1
            self.entries_written += count
            if self._grown is not None:
                self._grown.update(session for session, _ in taken)
            self._moving -= {new for _, new in renamed} - {new for _, new in self._renamed}
        # Every commit wakes those waiting for one (each waits on the event of its time).
        self._committed.set()
        self._committed = trio.Event()


def entry_count(chunks: list[Chunk]) -> int:
    """How many entries the chunks hold."""
    return sum(last - first + 1 for first, last, _, _ in chunks)


def runs(session: str, chunks: list[Chunk], stamp: float) -> list[Row]:
    """
    Consecutive chunks of a session's history as journal rows: small chunks of the same
    ``live`` with no number missing between them joined while the row stays within
    ``RUN_MAX_BYTES``; a chunk of ``RUN_OWN_BYTES`` or more is a row of its own (a run
    relayed as one slice, up to a reader's turn), as it is, not copied. The store splits a
    row at its newlines, so a chunk of one entry that does not end with a newline is a row
    of its own.
    """
    rows: list[Row] = []
    pending: list[bytes] = []
    size = 0
    row_first = row_last = 0
    row_live = True
    for first, last, data, live in chunks:
        if pending and (
            live is not row_live
            or first != row_last + 1
            or size + len(data) > RUN_MAX_BYTES
            or len(data) >= RUN_OWN_BYTES
            or len(pending[0]) >= RUN_OWN_BYTES
            or not pending[-1].endswith(b"\n")
            or not data.endswith(b"\n")
        ):
            rows.append((session, row_first, row_last, int(row_live), stamp, b"".join(pending)))
            pending = []
        if not pending:
            row_first, row_live, size = first, live, 0
        pending.append(data)
        size += len(data)
        row_last = last
    if pending:
        rows.append((session, row_first, row_last, int(row_live), stamp, b"".join(pending)))
    return rows
