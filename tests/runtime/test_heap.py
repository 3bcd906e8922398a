"""Freed heap memory goes back to the system (glibc's malloc_trim), on a timer."""

from __future__ import annotations

import sys

import attrs
import pytest
import trio
import trio.testing

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.config.model import StoreConfig
from acp_bridge.faces import stdio
from acp_bridge.runtime import heap
from tests.support.fakes import FakeAgent, make_config

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or heap.malloc_trim() is None,
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
    took = heap.trim_heap()
    after = rss_anon_kib()
    assert took is not None
    assert took >= 0
    assert before - after > 20 * 1024, (before, after)
    assert len(kept) == 1250


async def _trims(monkeypatch, traffic_times: list[float], until: float) -> list[float]:
    """When the trimmer trims (mock clock), with a message at each of ``traffic_times``."""
    trims: list[float] = []
    count = 0

    async def in_thread(fn):
        assert fn is heap.trim_heap
        trims.append(trio.current_time())
        return 0.001

    async def traffic() -> None:
        nonlocal count
        for t in traffic_times:
            await trio.sleep_until(t)
            count += 1

    monkeypatch.setattr(heap, "malloc_trim", lambda: lambda pad: 1)
    monkeypatch.setattr(trio.to_thread, "run_sync", in_thread)
    with trio.move_on_after(until):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(traffic)
            await heap.trim_heap_forever(lambda: count, interval=10, quiet=1)
    return trims


async def test_no_trim_while_nothing_happens(monkeypatch, autojump_clock):
    assert await _trims(monkeypatch, [], 100) == []


async def test_a_trim_once_a_burst_is_over(monkeypatch, autojump_clock):
    # Messages at 0.5..3.5 s; the checks at 4 s (one more than at 3 s) and 5 s (none: over).
    trims = await _trims(monkeypatch, [0.5, 1.5, 2.5, 3.5], 60)
    assert trims == [5.0]


async def test_every_interval_while_traffic_goes_on(monkeypatch, autojump_clock):
    traffic = [i / 4 for i in range(1, 4 * 35)]  # a message every 0.25 s for 35 s
    trims = await _trims(monkeypatch, traffic, 60)
    assert trims == [10.0, 20.0, 30.0, 36.0]  # (and once more when it stops)


async def test_without_malloc_trim_the_trimmer_returns_at_once(monkeypatch, autojump_clock):
    monkeypatch.setattr(heap, "malloc_trim", lambda: None)
    start = trio.current_time()
    await heap.trim_heap_forever(lambda: 0)
    assert trio.current_time() == start


async def test_the_daemon_runs_the_trimmer_on_its_own_traffic(monkeypatch):
    started: list[object] = []

    async def trimmer(activity, **_: object) -> None:
        started.append(activity)
        await trio.sleep_forever()

    fixed: list[bool] = []
    monkeypatch.setattr(stdio, "trim_heap_forever", trimmer)
    monkeypatch.setattr(stdio, "fix_mmap_threshold", lambda: fixed.append(True) or True)
    config = attrs.evolve(make_config({"a": FakeAgent("a")}), store=StoreConfig(path=":memory:"))

    async def body(bridge) -> None:
        await trio.testing.wait_all_tasks_blocked()
        [activity] = started
        before = activity()
        bridge.hub.counters["from_agent"] += 3
        bridge.hub.counters["to_client"] += 2
        assert activity() == before + 5

    launcher = make_in_process_launcher({"a": FakeAgent("a")})
    with trio.fail_after(10):
        await stdio.with_bridge(config, body, launcher=launcher)
    assert len(started) == 1
    assert fixed == [True]


_LARGE_BLOCK_MAPPED = """
import sys
from acp_bridge.runtime import heap
if sys.argv[1] == "fix":
    assert heap.fix_mmap_threshold()
freed = bytearray(4 << 20)  # a mapped block; freeing it raises glibc's threshold to 4 MiB
del freed
before = heap._mallinfo2()().hblks
held = bytearray(512 << 10)
print(heap._mallinfo2()().hblks - before)
"""


def test_fix_mmap_threshold_without_mallopt(monkeypatch):
    monkeypatch.setattr(heap, "_libc_function", lambda name: None)
    assert heap.fix_mmap_threshold() is False


@glibc
def test_memory_figures_see_a_heap_block_held_and_freed():
    """heapInUseKiB follows what malloc handed out; RSS and Python's blocks are there too."""
    # Earlier tests in this process may have left freed pages resident in the heap, which
    # the blocks below would reuse without RSS growing: hand them back first.
    trim = heap.malloc_trim()
    if trim is not None:
        trim(0)
    before = heap.memory_figures()
    held = [bytes(4096) for _ in range(4096)]  # 16 MiB in blocks of malloc's, not Python's
    during = heap.memory_figures()
    del held
    after = heap.memory_figures()
    assert during["heapInUseKiB"] - before["heapInUseKiB"] >= 16 * 1024
    assert during["heapInUseKiB"] - after["heapInUseKiB"] >= 16 * 1024
    assert during["rssKiB"] - before["rssKiB"] >= 15 * 1024
    assert {"heapFreeKiB", "pythonBlocks"} <= set(after)


def test_memory_figures_without_the_c_library_functions(monkeypatch):
    """Where there is no mallinfo2 (musl, macOS), the heap figures are left out, not faked."""
    monkeypatch.setattr(heap, "_mallinfo2", lambda: None)
    figures = heap.memory_figures()
    assert "heapInUseKiB" not in figures
    assert "heapFreeKiB" not in figures
    assert figures["pythonBlocks"] > 0


@glibc
def test_the_c_library_is_found_without_running_ldconfig(monkeypatch):
    # find_library("c") runs `ldconfig -p` in a subprocess: start-up time (issue 23) spent on
    # a library the process has loaded already.
    import ctypes.util

    def no_search(name: str) -> None:
        raise AssertionError(f"find_library({name!r}) searched the system")

    monkeypatch.setattr(ctypes.util, "find_library", no_search)
    assert heap._libc_function("malloc_trim") is not None
    assert heap._libc_function("mallopt") is not None
    assert heap._libc_function("no_such_function_in_libc") is None
