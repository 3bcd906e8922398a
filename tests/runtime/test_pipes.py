"""Pipe reads and writes without a scheduler round (``runtime.pipes``), reads sized to what came."""

from __future__ import annotations

import fcntl
import os
import threading
import tracemalloc

import pytest
import trio
import trio.testing

from acp_bridge.runtime import pipes


@pytest.fixture
def pipe():
    r, w = os.pipe()
    os.set_blocking(r, False)
    yield r, w
    for fd in (r, w):
        os.close(fd)


def test_read_now_gives_what_is_there_as_bytes(pipe):
    r, w = pipe
    os.write(w, b"one\ntwo\n")
    data = pipes.read_now(r, 65536)
    assert data == b"one\ntwo\n"
    assert type(data) is bytes


def test_read_now_takes_at_most_max_bytes_and_at_most_its_buffer(pipe):
    r, w = pipe
    os.write(w, b"abcdef")
    assert pipes.read_now(r, 4) == b"abcd"
    assert pipes.read_now(r, 4) == b"ef"
    if hasattr(fcntl, "F_SETPIPE_SZ"):  # Linux: room for more than one buffer
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4 * pipes.READ_BUFFER_BYTES)
    else:
        pytest.skip("a pipe's size is fixed here")
    os.write(w, b"z" * (pipes.READ_BUFFER_BYTES + 10))
    assert len(pipes.read_now(r, 10 * pipes.READ_BUFFER_BYTES)) == pipes.READ_BUFFER_BYTES
    assert pipes.read_now(r, 100) == b"z" * 10


def test_read_now_raises_what_os_read_does():
    r, w = os.pipe()
    os.set_blocking(r, False)
    with pytest.raises(BlockingIOError):
        pipes.read_now(r, 100)
    os.close(w)
    assert pipes.read_now(r, 100) == b""  # end of file
    os.close(r)
    with pytest.raises(OSError, match="Bad file descriptor"):
        pipes.read_now(r, 100)


def test_a_small_read_allocates_only_what_it_returns(pipe):
    """
    ``os.read(fd, 65536)`` allocates 64 KiB and shrinks it (the control); the read through the
    buffer never allocates more than the bytes it returns.
    """
    r, w = pipe

    def peak_of(read) -> tuple[int, int]:
        os.write(w, b"y" * 300)
        tracemalloc.start()
        try:
            start, _ = tracemalloc.get_traced_memory()
            data = read(r, 65536)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return len(data), peak - start

    assert peak_of(os.read)[1] > 65536
    got, peak = peak_of(pipes.read_now)
    assert got == 300
    assert peak < 1024


def test_each_thread_reads_into_its_own_buffer():
    views: list[memoryview] = []
    thread = threading.Thread(target=lambda: views.append(pipes._buffer.view))
    thread.start()
    thread.join()
    assert views[0] is not pipes._buffer.view
    assert views[0].obj is not pipes._buffer.view.obj


async def test_receive_some_from_a_pipe_stream_waits_then_reads():
    r, w = os.pipe()
    async with trio.lowlevel.FdStream(r) as receive, trio.lowlevel.FdStream(w) as send:
        async with trio.open_nursery() as nursery:
            got: list[bytes | bytearray] = []

            async def reader() -> None:
                got.append(await pipes.receive_some(receive, 65536))

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await pipes.send_all(send, b"hello\n")
        assert got == [b"hello\n"]
        await send.aclose()
        assert await pipes.receive_some(receive, 65536) == b""


async def test_a_read_that_finds_data_gives_the_others_their_turn_after_it():
    """
    A pipe that is never empty does not hold the scheduler: each read with data waiting
    yields once (so a reader needs no turn of its own between reads), after the read, and
    what it read is returned even when the reader is cancelled during that turn.
    """
    r, w = os.pipe()
    me = trio.lowlevel.current_task()
    suspended = 0

    class Count(trio.abc.Instrument):
        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            nonlocal suspended
            suspended += task is me

    async with trio.lowlevel.FdStream(r) as receive:
        os.write(w, b"one\n")
        trio.lowlevel.add_instrument(Count())
        assert await pipes.receive_some(receive, 65536) == b"one\n"
        assert suspended == 1  # (one turn given, with the data already in hand)
        # Cancelled from another task, before the read or during its turn: the bytes are
        # returned, or still in the pipe; never lost.
        for _ in range(20):
            os.write(w, b"two\n")
            got = None
            with trio.CancelScope() as scope:

                async def cancel(scope: trio.CancelScope = scope) -> None:
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel)
                    got = await pipes.receive_some(receive, 65536)
                    await trio.sleep_forever()
            if got is None:
                got = await pipes.receive_some(receive, 65536)
            assert got == b"two\n"
        os.close(w)
        assert await pipes.receive_some(receive, 65536) == b""


async def test_after_a_short_read_the_next_one_waits_first(monkeypatch):
    """
    A read that took less than it could emptied the pipe: the next read waits before it
    reads (no read that finds nothing), and data already there ends the wait at once.
    """
    calls: list[int] = []
    real = pipes.read_now

    def counting(fd: int, max_bytes: int) -> bytes:
        calls.append(fd)
        return real(fd, max_bytes)

    monkeypatch.setattr(pipes, "read_now", counting)
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        os.write(w, b"one\n")
        first = await pipes.read_fd(r, 65536)
        assert first == b"one\n"
        assert pipes.drained(first, 65536)
        assert not pipes.drained(b"x" * 8, 8)
        assert not pipes.drained(b"x" * pipes.READ_BUFFER_BYTES, 1 << 20)
        calls.clear()
        async with trio.open_nursery() as nursery:
            got: list[bytes] = []

            async def reader() -> None:
                got.append(await pipes.read_fd(r, 65536, drained=True))

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert calls == []  # (waiting, not reading)
            os.write(w, b"two\n")
        assert got == [b"two\n"]
        assert calls == [r]
        calls.clear()
        os.write(w, b"three\n")  # (already there: the wait ends at once)
        assert await pipes.read_fd(r, 65536, drained=True) == b"three\n"
        assert calls == [r]
    finally:
        os.close(r)
        os.close(w)
