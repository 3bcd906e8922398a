"""Freed heap memory goes back to the system (glibc's malloc_trim), on a timer."""

from __future__ import annotations

import sys

import pytest
import trio

from acp_bridge import _heap

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or _heap.malloc_trim() is None,
    reason="malloc_trim is glibc's",
)


def rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon")


@glibc
def test_trim_gives_back_the_free_pages_a_fragmented_heap_keeps():
    # 40 MiB of 2 KiB blocks (malloc's, not Python's small-object arenas), one in 16 kept:
    # the freed ones stay resident, scattered between live ones, until trimmed.
    blocks = [bytes(2048) for _ in range(20_000)]
    kept = blocks[::16]
    del blocks
    before = rss_anon_kib()
    took = _heap.trim_heap()
    after = rss_anon_kib()
    assert took is not None
    assert took >= 0
    assert before - after > 20 * 1024, (before, after)
    assert len(kept) == 1250


async def test_the_daemon_trims_every_interval_in_a_worker_thread(monkeypatch, autojump_clock):
    times: list[float] = []

    async def in_thread(fn):
        assert fn is _heap.trim_heap
        times.append(trio.current_time())
        return 0.001

    monkeypatch.setattr(_heap, "malloc_trim", lambda: lambda pad: 1)
    monkeypatch.setattr(trio.to_thread, "run_sync", in_thread)
    with trio.move_on_after(35):
        await _heap.trim_heap_forever(10)
    assert times == [10.0, 20.0, 30.0]


async def test_without_malloc_trim_the_trimmer_returns_at_once(monkeypatch, autojump_clock):
    monkeypatch.setattr(_heap, "malloc_trim", lambda: None)
    start = trio.current_time()
    await _heap.trim_heap_forever(10)
    assert trio.current_time() == start
