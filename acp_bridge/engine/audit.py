"""
The audit trail's trio side: records are queued (bounded) and written to the store in batches,
off the event loop, one transaction per batch.

Backpressure: :meth:`AuditLog.record` waits when ``queue`` records are already waiting for the
disk, so no decision goes unrecorded; the writer drains up to ``batch`` records per
transaction. At shutdown what is queued is written before the task ends.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Final

import structlog
import trio

from acp_bridge.store.db import AuditRecord

if TYPE_CHECKING:
    from acp_bridge.store.db import Store

logger = structlog.get_logger("acp_bridge.audit")

AUDIT_QUEUE: Final = 10_000
AUDIT_BATCH: Final = 500


class AuditLog:
    """
    Where decisions go. Without a store they are only logged (and kept in :attr:`recent`).

    Run :meth:`run` in a nursery when a store is given.
    """

    def __init__(self, store: Store | None = None, *, recent: int = 1000) -> None:
        self.store = store
        self._send, self._receive = trio.open_memory_channel[AuditRecord](AUDIT_QUEUE)
        #: the latest records, newest last (for status and tests)
        self.recent: collections.deque[AuditRecord] = collections.deque(maxlen=recent)
        self.written = 0
        self._progress = trio.Event()

    async def wait_written(self, count: int) -> None:
        """Wait until at least ``count`` records are in the store."""
        while self.written < count:
            self._progress = trio.Event()
            await self._progress.wait()

    async def record(self, record: AuditRecord) -> None:
        self.recent.append(record)
        logger.info(
            "audit",
            decision=record.decision,
            source=record.source,
            session=record.session,
            agent=record.agent,
            tool_call=record.tool_call_id,
            option=record.option_id,
            detail=record.detail,
        )
        if self.store is not None:
            await self._send.send(record)

    async def run(self) -> None:
        store = self.store
        assert store is not None
        try:
            async for record in self._receive:
                batch = [record]
                while len(batch) < AUDIT_BATCH:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                await trio.to_thread.run_sync(store.append_audit, batch)
                self.written += len(batch)
                self._progress.set()
        finally:
            with trio.CancelScope(shield=True):
                rest = []
                while True:
                    try:
                        rest.append(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if rest:
                    await trio.to_thread.run_sync(store.append_audit, rest)
                    self.written += len(rest)
