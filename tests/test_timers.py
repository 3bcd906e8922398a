"""One task for many timers: exact virtual times, cancel and reschedule."""

from __future__ import annotations

import trio

from acp_bridge._timers import Deadlines


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
