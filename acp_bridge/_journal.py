"""
The journal's trio side: sessions, their relayed updates and pending approvals go to the store
in batches — one transaction per burst, never one per message — off the event loop.

Recording never waits: the bridge's hot path appends to a list and wakes the writer. The
writer commits what has gathered every ``interval`` seconds at most (so a ``kill -9`` loses at
most the last ``interval`` plus one transaction's worth of updates; a clean stop loses
nothing). Bounded: past ``max_backlog`` uncommitted entries, new entries are dropped and their
sessions marked as having a gap, which a later replay reports as "resync required".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import structlog
import trio

if TYPE_CHECKING:
    from acp_bridge._store import SessionRow, Store

logger = structlog.get_logger("acp_bridge.journal")

FLUSH_INTERVAL: Final = 0.05
#: a run row holds about this many bytes at most: a flood is written as rows of this size
#: (SQLite stores a large blob as a chain of overflow pages; rows of megabytes cost it about
#: 1.7 us of CPU per entry here, rows of 64 KiB about 1.1)
RUN_MAX_BYTES: Final = 64 * 1024
MAX_BACKLOG: Final = 200_000
#: retention runs every this many seconds
TRIM_EVERY: Final = 60.0


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
        #: runs of consecutive entries of a session (one row each, see the store's schema):
        #: [session, first seq, last seq, live, time, [lines], bytes], in the order they began
        self._runs: list[list[Any]] = []
        #: the run each session is extending
        self._open: dict[str, list[Any]] = {}
        self._backlog = 0
        self._deleted: list[str] = []
        self._pending_added: dict[str, tuple[str, str, str, str]] = {}
        self._pending_removed: list[str] = []
        #: changes taken by the commit being written in the worker thread (not in the store yet)
        self._writing = 0
        self._wake = trio.Event()
        self._committed = trio.Event()
        #: sessions whose journal lost entries to the backlog bound
        self.gaps: set[str] = set()
        self.commits = 0
        self.entries_written = 0

    # -- recording (never awaits)

    def session(self, row: SessionRow) -> None:
        self._sessions[row.bridge_id] = row
        self._wake.set()

    def entry(self, session: str, seq: int, data: bytes, *, live: bool = True) -> None:
        """Record one entry: ``data`` is one line, newline-terminated (a relayed message)."""
        if self._backlog >= self.max_backlog:
            if session not in self.gaps:
                logger.error("journal_backlog_full", session=session)
            self.gaps.add(session)
            return
        self._backlog += 1
        flag = 1 if live else 0
        run = self._open.get(session)
        size = len(data)
        if data.find(b"\n") != size - 1:
            # Not one plain line (not from the bridge): a run of its own, never joined.
            self._runs.append([session, seq, seq, flag, time.time(), [data], size])
            self._open.pop(session, None)
        elif (
            run is not None
            and run[2] == seq - 1
            and run[3] == flag
            and run[6] + size <= RUN_MAX_BYTES
        ):
            run[2] = seq
            run[5].append(data)
            run[6] += size
        else:
            run = [session, seq, seq, flag, time.time(), [data], size]
            self._runs.append(run)
            self._open[session] = run
        if not self._wake.is_set():
            self._wake.set()

    def delete(self, bridge_id: str) -> None:
        self._sessions.pop(bridge_id, None)
        self._open.pop(bridge_id, None)
        kept = [r for r in self._runs if r[0] != bridge_id]
        self._backlog -= sum(len(r[5]) for r in self._runs if r[0] == bridge_id)
        self._runs = kept
        self._deleted.append(bridge_id)
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
            + self._backlog
            + len(self._deleted)
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
            self._committed = trio.Event()
            self._wake.set()
            await self._committed.wait()

    async def run(self) -> None:
        last_trim = trio.current_time()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                await self._commit()
                if trio.current_time() - last_trim > TRIM_EVERY:
                    last_trim = trio.current_time()
                    await trio.to_thread.run_sync(self._trim)
                await trio.sleep(self.interval)  # gather the next burst
        finally:
            with trio.CancelScope(shield=True):
                await self._commit()

    def _trim(self) -> None:
        removed = self.store.trim_journal(keep_entries=self.keep_entries, max_age=self.max_age)
        if removed:
            logger.info("journal_trimmed", entries=removed)

    async def _commit(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        runs, self._runs, self._open = self._runs, [], {}
        entries, self._backlog = self._backlog, 0
        deleted, self._deleted = self._deleted, []
        added, self._pending_added = list(self._pending_added.values()), {}
        removed, self._pending_removed = self._pending_removed, []
        if sessions or entries or deleted or added or removed:
            self._writing = len(sessions) + entries + len(deleted) + len(added) + len(removed)
            try:
                await trio.to_thread.run_sync(
                    lambda: self.store.write(
                        sessions=sessions,
                        journal_runs=[_row(run) for run in runs],
                        deleted=deleted,
                        pending_added=added,
                        pending_removed=removed,
                    )
                )
            finally:
                self._writing = 0
            self.commits += 1
            self.entries_written += entries
        self._committed.set()


def _row(run: list[Any]) -> tuple[str, int, int, int, float, bytes]:
    """A run as a journal row (its lines joined: each is one newline-terminated line)."""
    session, first, last, live, stamp, lines, _ = run
    return (session, first, last, live, stamp, lines[0] if first == last else b"".join(lines))
