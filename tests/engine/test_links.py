"""A client link's outbound queue: the answer lane, and each session's order through it."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.engine.bridge import Bridge
from acp_bridge.engine.links import LANE_MAX, ClientLink
from tests.support.fakes import FakeAgent, make_config


def link(queue_size: int = 64) -> ClientLink:
    return ClientLink(name="t", queue_size=queue_size, blocking=True)


async def drain(client: ClientLink) -> list[bytes]:
    """What the writer writes of everything queued so far (the link stays open)."""
    out: list[bytes] = []
    queued = client.queue_depth()
    while len(out) < queued:
        out += [m for e in await client._take(1 << 20) for m in e.splitlines()]
    return out


async def test_an_answer_of_a_quiet_session_is_written_before_other_sessions_floods():
    client = link()
    for i in range(5):
        client.put_update(f"a{i}\n".encode(), "A")
    await client.send_answer(b"answer-B\n", "B")
    assert await drain(client) == [b"answer-B", b"a0", b"a1", b"a2", b"a3", b"a4"]


async def test_an_answer_stays_behind_what_its_own_session_has_queued():
    client = link()
    client.put_update(b"a0\n", "A")
    client.put_update(b"b0\n", "B")
    client.put_update(b"a1\n", "A")
    await client.send_answer(b"answer-B\n", "B")
    assert await drain(client) == [b"a0", b"b0", b"a1", b"answer-B"]
    # Once B's update is written, B's next answer goes ahead again.
    client.put_update(b"a2\n", "A")
    await client.send_answer(b"answer-B2\n", "B")
    assert await drain(client) == [b"answer-B2", b"a2"]


async def test_an_answer_stays_behind_a_message_of_no_known_session():
    client = link()
    client.put_update(b"a0\n", "A")
    await client.send(b"note\n")  # (a notice the bridge sends: of no known session)
    await client.send_answer(b"answer-B\n", "B")
    assert await drain(client) == [b"a0", b"note", b"answer-B"]


async def test_an_answer_stays_behind_its_sessions_message_waiting_for_room():
    client = link(queue_size=2)
    client.put_update(b"a0\n", "A")
    client.put_update(b"a1\n", "A")
    async with trio.open_nursery() as nursery:
        # B's update waits for room (the queue is full of A's): B has nothing queued, but
        # its answer must not overtake the update that waits.
        nursery.start_soon(client.send, b"b0\n", "B")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(client.send_answer, b"answer-B\n", "B")
        await trio.testing.wait_all_tasks_blocked()
        out = await drain(client)
        out += await drain(client)
    out += await drain(client)
    assert out == [b"a0", b"a1", b"b0", b"answer-B"]


async def test_the_lane_holds_at_most_lane_max_answers_then_they_queue():
    client = link(queue_size=LANE_MAX * 2)
    client.put_update(b"flood\n", "A")
    for i in range(LANE_MAX + 1):
        await client.send_answer(f"answer-{i}\n".encode(), f"S{i}")
    out = await drain(client)
    assert out[:LANE_MAX] == [f"answer-{i}".encode() for i in range(LANE_MAX)]
    assert out[LANE_MAX:] == [b"flood", f"answer-{LANE_MAX}".encode()]


async def test_the_writer_takes_the_lane_first_and_the_queue_after_it_in_one_write():
    client = link()
    client.put_update(b"a0\n", "A")
    await client.send_answer(b"answer-B\n", "B")
    send, receive = trio.testing.memory_stream_pair()
    client.finish()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.pump, send)
        assert await receive.receive_some() == b"answer-B\na0\n"


# Any interleaving of updates, answers and notices of no session, with the writer taking
# batches of any size in between: each session's messages are written in the order they were
# sent, a notice before anything sent after it, and every message exactly once.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.sampled_from("ABC")),
        st.tuples(st.just("run"), st.sampled_from("ABC")),
        st.tuples(st.just("answer"), st.sampled_from("ABC")),
        st.tuples(st.just("note"), st.none()),
        st.tuples(st.just("take"), st.integers(1, 40)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_property_the_lane_keeps_each_sessions_order(ops):
    async def main() -> None:
        client = link(queue_size=1000)
        sent: list[tuple[str, str | None, int]] = []
        out: list[bytes] = []
        for n, (op, arg) in enumerate(ops):
            if op == "take":
                if client.queue_depth():
                    out.extend(await client._take(arg))
                continue
            n *= 10  # (numbered in the order sent: a run's three updates n, n+1, n+2)
            data = f"{n}\n".encode()
            if op == "run":
                sent += [("update", arg, n + k) for k in range(3)]
                client.put_run(b"".join(f"{n + k}\n".encode() for k in range(3)), 3, arg)
                continue
            sent.append((op, arg, n))
            if op == "update":
                client.put_update(data, arg)
            elif op == "answer":
                await client.send_answer(data, arg)
            else:
                await client.send(data)
        while client.queue_depth():
            out.extend(await client._take(1 << 20))
        order = [int(m) for e in out for m in e.splitlines()]
        assert sorted(order) == [n for _, _, n in sent]  # each exactly once
        position = {n: i for i, n in enumerate(order)}
        for session in "ABC":
            mine = [n for _, s, n in sent if s == session]
            assert [n for n in order if n in set(mine)] == mine
        for op, _, note in sent:
            if op == "note":
                later = [n for _, _, n in sent if n > note]
                assert all(position[n] > position[note] for n in later)

    trio.run(main)


async def test_two_bridges_in_one_process_count_their_own_ids():
    """Link numbers and ids of requests to clients belong to a bridge, not to the process:
    a second bridge counts from 1 again, while one bridge never reuses an id across links."""

    def bridge():
        agent = FakeAgent("a")
        return Bridge(make_config({"a": agent}), make_in_process_launcher({"a": agent}))

    first, second = bridge(), bridge()
    a1, a2 = first.open_client("a1", blocking=True), first.open_client("a2", blocking=True)
    b1 = second.open_client("b1", blocking=True)
    assert (a1.id, a2.id, b1.id) == (1, 2, 1)
    assert [a1.pending.add(object()), a2.pending.add(object()), a1.pending.add(object())] == [
        1,
        2,
        3,
    ]
    assert b1.pending.add(object()) == 1


async def test_a_run_counts_each_of_its_messages_against_the_bound():
    """A run of updates queued as one entry (``put_run``) takes as many places in the
    bounded queue as it has messages, and gives them back when written."""
    client = link(queue_size=10)
    assert client.has_room(10)
    assert not client.has_room(11)
    client.put_run(b"1\n2\n3\n4\n5\n6\n", 6, "A")
    assert client.queue_depth() == 6
    assert client.has_room(4)
    assert not client.has_room(5)
    for n in range(4):
        await client.send(f"x{n}\n".encode(), "B")
    assert not client.has_room()
    with trio.move_on_after(0) as blocked:  # (a blocking link waits for room)
        await client.send(b"waits\n", "B")
    assert blocked.cancelled_caught
    assert await drain(client) == [b"1", b"2", b"3", b"4", b"5", b"6", b"x0", b"x1", b"x2", b"x3"]
    assert client.queue_depth() == 0
    assert client.has_room(10)


async def test_a_message_transport_gets_a_run_as_its_messages():
    """``pump_batches`` (WebSocket: one frame per message) hands a run over message by
    message, each with its newline, in order with what was queued around it."""
    client = link()
    await client.send(b"before\n")
    client.put_run(b"u1\nu2\r\nu3\n", 3, "A")
    await client.send(b"after\n", "A")
    client.finish()
    batches: list[list[bytes]] = []

    async def send(batch: list[bytes]) -> None:
        batches.append(batch)

    await client.pump_batches(send)
    assert [m for b in batches for m in b] == [b"before\n", b"u1\n", b"u2\r\n", b"u3\n", b"after\n"]
