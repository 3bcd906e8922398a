"""
Many timers, one task: detach grace periods, permission deadlines.

A task per timer would cost a task (and its memory) for every detached session and every
pending approval; here one task sleeps until the earliest deadline. Scheduling and cancelling
are O(log n) and never await.

Cancelling (or rescheduling) lets go of the key and the callback at once: a key holds a
session or a pending request, and with them histories of thousands of updates, which must not
stay alive until the time the timer would have fired (minutes later for a grace period). What
stays in the heap is an empty timer; empty timers are dropped all at once when they outnumber
the live ones (and ``COMPACT_MIN``), so the heap holds at most twice the live timers plus
``COMPACT_MIN``, and the copy is amortised over the cancels that made it necessary.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Final

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable

#: the heap is compacted only past this many entries (below it, empty timers cost little)
COMPACT_MIN: Final = 64


class _Timer:
    """One scheduled call; emptied (``fn`` None) when cancelled or replaced."""

    __slots__ = ("fn", "key")

    def __init__(self, key: Hashable, fn: Callable[[], Awaitable[object]]) -> None:
        self.key: Hashable = key
        self.fn: Callable[[], Awaitable[object]] | None = fn

    def empty(self) -> None:
        self.key = self.fn = None


class Deadlines:
    """
    Run ``fn()`` at ``when`` for each scheduled key, unless the key is cancelled first.

    Callbacks run one at a time in the :meth:`run` task, in deadline order; a callback that
    raises ends the task (and so the bridge): they must handle their own errors.
    """

    def __init__(self) -> None:
        #: (when, order, timer): the order breaks ties, so timers are never compared
        self._heap: list[tuple[float, int, _Timer]] = []
        self._live: dict[Hashable, _Timer] = {}
        self._counter = itertools.count()
        self._changed = trio.Event()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    def schedule(self, key: Hashable, when: float, fn: Callable[[], Awaitable[object]]) -> None:
        """Run ``fn`` at ``when`` (trio clock); replaces an earlier schedule of the same key."""
        timer = _Timer(key, fn)
        replaced = self._live.get(key)
        if replaced is not None:
            replaced.empty()
        self._live[key] = timer
        heapq.heappush(self._heap, (when, next(self._counter), timer))
        self._changed.set()
        self._compact_if_stale()

    def cancel(self, key: Hashable) -> bool:
        """Forget a key (and let go of it and its callback); True if it was scheduled."""
        timer = self._live.pop(key, None)
        if timer is None:
            return False
        timer.empty()
        self._compact_if_stale()
        return True

    def _compact_if_stale(self) -> None:
        heap = self._heap
        if len(heap) > COMPACT_MIN and len(heap) > 2 * len(self._live):
            kept = [entry for entry in heap if entry[2].fn is not None]
            heapq.heapify(kept)
            self._heap = kept

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and heap[0][2].fn is None:
            heapq.heappop(heap)

    async def run(self) -> None:
        while True:
            self._changed = trio.Event()
            self._drop_stale()
            if not self._heap:
                await self._changed.wait()
                continue
            when, _, timer = self._heap[0]
            with trio.move_on_at(when) as waiting:
                await self._changed.wait()
            if not waiting.cancelled_caught:
                continue
            self._drop_stale()
            if not self._heap or self._heap[0][2] is not timer:
                continue
            heapq.heappop(self._heap)
            fn = timer.fn
            assert fn is not None
            del self._live[timer.key]
            timer.empty()
            await fn()
