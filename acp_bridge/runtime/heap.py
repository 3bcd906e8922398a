"""
Giving freed heap memory back to the operating system (glibc), so the daemon's RSS follows
what it really holds.

glibc's ``malloc`` keeps what a process frees for reuse and returns to the system only free
space at the very top of a heap. A relay allocates buffers of every size all the time (reads,
lines, write batches, replays), so its heaps fragment: free pages stay resident between live
blocks, and RSS creeps up while live memory stays flat (``bench.soak`` shows it).

:func:`trim_heap_forever` calls ``malloc_trim(0)`` in a worker thread (it walks every free
block, a few milliseconds for tens of MiB, and the event loop keeps running meanwhile): once
a burst of traffic is over (a ``QUIET`` second with no message after some), and every
``TRIM_INTERVAL`` seconds while traffic goes on; never while nothing happens. Where the C
library has no ``malloc_trim`` (musl, macOS) it returns at once and nothing changes.

:func:`fix_mmap_threshold` (at start) keeps large buffers out of the heap: glibc gives a
block of ``M_MMAP_THRESHOLD`` or more its own mapping, returned whole when freed, but raises
that threshold to the size of each mapped block freed (up to 32 MiB), so after one large
replay every later large buffer is carved from the heap, where it can fragment it. A fixed
threshold turns that off.

:func:`memory_figures` tells apart what the process holds from what its allocators keep
(``/status``, ``/metrics``, the soak): resident memory, glibc's heap in use and free, and
Python's live objects. A long run whose RSS creeps while those stay flat is fragmentation,
not a leak.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import time
from typing import TYPE_CHECKING, Any, Final

import structlog
import trio

if TYPE_CHECKING:
    from collections.abc import Callable

logger = structlog.get_logger("acp_bridge.heap")

TRIM_INTERVAL: Final = 10.0
QUIET: Final = 1.0
#: blocks of this size and more get their own mapping (glibc's default starting threshold)
MMAP_THRESHOLD: Final = 128 * 1024
_M_MMAP_THRESHOLD: Final = -3  # mallopt's parameter number (malloc.h)


def _libc_function(name: str) -> Any:
    """A function of the C library, or None when it has none (musl, macOS: glibc's own)."""
    try:
        # The process's own symbols, which hold the C library's: find_library("c") would
        # run `ldconfig -p` in a subprocess at start-up for the same answer.
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):
        return None


@functools.cache
def malloc_trim() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim``, or None when it has none."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    fn: Callable[[int], int] = trim
    return fn


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` at ``size`` (no more raising); False without glibc."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, size))


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (2.33 and later): every field a size_t
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    """The C library's ``mallinfo2``, or None when it has none."""
    info = _libc_function("mallinfo2")
    if info is None:
        return None
    info.argtypes = []
    info.restype = _MallInfo2
    fn: Callable[[], _MallInfo2] = info
    return fn


def _resident_kib() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * mmap.PAGESIZE // 1024


def memory_figures() -> dict[str, int]:
    """
    The process's memory as the system and its allocators see it; what this platform does
    not tell is left out.

    - ``rssKiB``: resident (Linux ``/proc/self/statm``);
    - ``heapInUseKiB``, ``heapFreeKiB``: glibc's heaps, all threads' arenas — what ``malloc``
      handed out and has not had back (its own large ``mmap`` blocks included), and what it
      keeps free for reuse (partly resident; :func:`trim_heap` gives back whole free pages);
    - ``pythonBlocks``: blocks Python's small-object allocator has handed out (its live
      objects and buffers of up to 512 bytes, a count, not bytes).
    """
    figures = {"pythonBlocks": sys.getallocatedblocks()}
    rss = _resident_kib()
    if rss is not None:
        figures["rssKiB"] = rss
    info = _mallinfo2()
    if info is not None:
        heap = info()
        figures["heapInUseKiB"] = (heap.uordblks + heap.hblkhd) // 1024
        figures["heapFreeKiB"] = heap.fordblks // 1024
    return figures


def trim_heap() -> float | None:
    """Release free heap pages now; the seconds it took (None: not available here)."""
    trim = malloc_trim()
    if trim is None:
        return None
    started = time.perf_counter()
    trim(0)
    return time.perf_counter() - started


async def trim_heap_forever(
    activity: Callable[[], int], *, interval: float = TRIM_INTERVAL, quiet: float = QUIET
) -> None:
    """
    Trim the heap after each burst of traffic and every ``interval`` seconds during one, until
    cancelled. ``activity()`` counts messages so far: a burst is over when it has not moved
    for ``quiet`` seconds. Returns at once without glibc.
    """
    if malloc_trim() is None:
        return
    trimmed = seen = activity()
    last_trim = trio.current_time()
    while True:
        await trio.sleep(quiet)
        now, count = trio.current_time(), activity()
        burst_over = count == seen != trimmed
        if burst_over or (count != trimmed and now - last_trim >= interval):
            took = await trio.to_thread.run_sync(trim_heap)
            logger.debug("heap_trimmed", ms=round((took or 0.0) * 1000, 2))
            trimmed, last_trim = count, trio.current_time()
        seen = count
