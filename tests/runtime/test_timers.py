"""One task for many timers: exact virtual times, cancel and reschedule."""

from __future__ import annotations

import gc
import random
import weakref

import trio

from acp_bridge.runtime.timers import COMPACT_MIN, Deadlines


async def test_deadlines_fire_in_order_at_exact_times_and_cancel_holds(autojump_clock):
    deadlines = Deadlines()
    fired = []

    def note(name):
        async def fn():
            fired.append((name, trio.current_time()))

        return fn

    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.run)
        deadlines.schedule("c", 30, note("c"))
        deadlines.schedule("a", 10, note("a"))
        deadlines.schedule("b", 20, note("b"))
        deadlines.schedule("x", 15, note("x"))
        assert deadlines.cancel("x")
        assert not deadlines.cancel("x")
        deadlines.schedule("b", 25, note("b"))  # rescheduled: the old time no longer counts
        await trio.sleep(12)
        deadlines.schedule("d", 13, note("d"))  # earlier than anything pending
        await trio.sleep(40)
        assert fired == [("a", 10), ("d", 13), ("b", 25), ("c", 30)]
        assert len(deadlines) == 0
        assert "a" not in deadlines
        nursery.cancel_scope.cancel()


class _Key:
    """A hashable key that can be watched for being freed."""

    def __init__(self, n: int) -> None:
        self.n = n


async def test_cancelled_timers_do_not_keep_their_keys_alive():
    # A cancelled timer's key (in the bridge: a session and its history) must not stay
    # referenced until the time it would have fired: that held every closed session's
    # history for the detach grace period (300 s by default) after a reconnect.
    deadlines = Deadlines()
    keys = [_Key(n) for n in range(1000)]
    refs = [weakref.ref(k) for k in keys]

    async def never() -> None:
        raise AssertionError("a cancelled timer fired")

    for key in keys:
        deadlines.schedule(key, 10_000.0, never)
    kept = keys[::100]  # ten stay scheduled
    for key in keys:
        if key not in kept:
            assert deadlines.cancel(key)
    del keys, key
    gc.collect()
    assert {r() for r in refs} == {None, *kept}
    assert len(deadlines._heap) <= COMPACT_MIN + 2 * len(kept)
    assert len(deadlines) == len(kept)


async def test_compaction_keeps_every_live_deadline_at_its_exact_time(autojump_clock):
    # Random schedules, reschedules and cancels (enough to compact the heap many times)
    # against a model: what fires, and when, is exactly what the model says.
    rng = random.Random(8)
    deadlines = Deadlines()
    model: dict[int, float] = {}
    fired: list[tuple[int, float]] = []

    def note(key: int):
        async def fn() -> None:
            fired.append((key, trio.current_time()))

        return fn

    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.run)
        for _ in range(20):
            now = trio.current_time()
            for _ in range(200):
                key = rng.randrange(300)
                if rng.random() < 0.6:
                    when = now + rng.choice([0.5, 1.0, 2.0, 50.0, 100.0])
                    deadlines.schedule(key, when, note(key))
                    model[key] = when
                else:
                    assert deadlines.cancel(key) == (key in model)
                    model.pop(key, None)
            assert len(deadlines._heap) <= max(COMPACT_MIN, 2 * len(model)) + 1
            await trio.sleep(1.5)
            due = sorted((when, key) for key, when in model.items() if when <= now + 1.5)
            assert sorted((when, key) for key, when in fired) == due
            for _, key in due:
                del model[key]
            fired.clear()
        nursery.cancel_scope.cancel()
