"""
Many timers, one task: detach grace periods, permission deadlines.

A task per timer would cost a task (and its memory) for every detached session and every
pending approval; here one task sleeps until the earliest deadline. Scheduling and cancelling
are O(log n) and never await.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable


class Deadlines:
    """
    Run ``fn()`` at ``when`` for each scheduled key, unless the key is cancelled first.

    Callbacks run one at a time in the :meth:`run` task, in deadline order; a callback that
    raises ends the task (and so the bridge): they must handle their own errors.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._live: dict[Hashable, tuple[int, Callable[[], Awaitable[object]]]] = {}
        self._counter = itertools.count()
        self._changed = trio.Event()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    def schedule(self, key: Hashable, when: float, fn: Callable[[], Awaitable[object]]) -> None:
        """Run ``fn`` at ``when`` (trio clock); replaces an earlier schedule of the same key."""
        token = next(self._counter)
        self._live[key] = (token, fn)
        heapq.heappush(self._heap, (when, token, key))
        self._changed.set()

    def cancel(self, key: Hashable) -> bool:
        """Forget a key; True if it was scheduled."""
        return self._live.pop(key, None) is not None

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            _, token, key = heap[0]
            live = self._live.get(key)
            if live is not None and live[0] == token:
                return
            heapq.heappop(heap)

    async def run(self) -> None:
        while True:
            self._changed = trio.Event()
            self._drop_stale()
            if not self._heap:
                await self._changed.wait()
                continue
            when, token, key = self._heap[0]
            with trio.move_on_at(when) as waiting:
                await self._changed.wait()
            if not waiting.cancelled_caught:
                continue
            self._drop_stale()
            if not self._heap or self._heap[0][1] != token:
                continue
            heapq.heappop(self._heap)
            _, fn = self._live.pop(key)
            await fn()
