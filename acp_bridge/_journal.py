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
from typing import TYPE_CHECKING, Final

import structlog
import trio

from acp_bridge._store import JournalEntry, SessionRow

if TYPE_CHECKING:
    from acp_bridge._store import Store

logger = structlog.get_logger("acp_bridge.journal")

FLUSH_INTERVAL: Final = 0.05
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
        #: (session, seq, data, live, time): plain tuples on the hot path, rows in the thread
        self._entries: list[tuple[str, int, bytes, bool, float]] = []
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
        if len(self._entries) >= self.max_backlog:
            if session not in self.gaps:
                logger.error("journal_backlog_full", session=session)
            self.gaps.add(session)
            return
        self._entries.append((session, seq, data, live, time.time()))
        if not self._wake.is_set():
            self._wake.set()

    def delete(self, bridge_id: str) -> None:
        self._sessions.pop(bridge_id, None)
        self._entries = [e for e in self._entries if e[0] != bridge_id]
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
            + len(self._entries)
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
        entries, self._entries = self._entries, []
        deleted, self._deleted = self._deleted, []
        added, self._pending_added = list(self._pending_added.values()), {}
        removed, self._pending_removed = self._pending_removed, []
        if sessions or entries or deleted or added or removed:
            self._writing = len(sessions) + len(entries) + len(deleted) + len(added) + len(removed)
            try:
                await trio.to_thread.run_sync(
                    lambda: self.store.write(
                        sessions=sessions,
                        journal=[JournalEntry(*e) for e in entries],
                        deleted=deleted,
                        pending_added=added,
                        pending_removed=removed,
                    )
                )
            finally:
                self._writing = 0
            self.commits += 1
            self.entries_written += len(entries)
        self._committed.set()
