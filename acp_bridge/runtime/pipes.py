"""
Pipe I/O with one scheduler round less per hop.

trio's ``FdStream.send_all`` and ``receive_some`` begin with a checkpoint: a whole round of
the scheduler before the bytes move. On a busy bridge a round is a turn of every flooding
agent reader, and a request's round trip crosses four such hops. These helpers move the
bytes at once when the pipe allows, and wait (``wait_readable`` / ``send_all``) only when it
does not. Streams that are not pipes (memory streams in tests, sockets) get the stream's own
calls unchanged.

A read yields once, as trio's does, but after it took what was waiting (see
:func:`receive_some`): a reader of a pipe that is never empty still lets the others in
between reads. Cancellation is noticed at every call (``checkpoint_if_cancelled``).

A read lands in a buffer kept for the thread (:func:`read_now`) and comes back as ``bytes``
of its own length. ``os.read(fd, 65536)`` would allocate 64 KiB and then shrink it to what
arrived: a 64 KiB carving from glibc's heap for every few hundred bytes an agent writes.
"""

from __future__ import annotations

import os
import threading
from typing import Final

import trio

#: what one read takes at most (larger ``max_bytes`` are cut to it)
READ_BUFFER_BYTES: Final = 64 * 1024


class _ReadBuffer(threading.local):
    def __init__(self) -> None:
        self.view = memoryview(bytearray(READ_BUFFER_BYTES))


_buffer = _ReadBuffer()


def pipe_fd(stream: trio.abc.SendStream | trio.abc.ReceiveStream) -> int | None:
    """The file descriptor of a pipe stream (trio's ``FdStream``: non-blocking), else None."""
    return stream.fileno() if isinstance(stream, trio.lowlevel.FdStream) else None


def socket_fd(stream: trio.abc.SendStream) -> int | None:
    """The file descriptor of a plain TCP stream (non-blocking; not TLS), else None."""
    return stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None


def write_now(fd: int, data: bytes) -> int:
    """
    Write what a non-blocking pipe takes now, without waiting; 0 on any error (the stream's
    own ``send_all`` then meets the error and raises it the way trio does).
    """
    try:
        return os.write(fd, data)
    except OSError:
        return 0


async def send_all(stream: trio.abc.SendStream, data: bytes) -> None:
    """``stream.send_all(data)``; to a pipe, the bytes are offered at once first."""
    fd = pipe_fd(stream)
    if fd is not None:
        await trio.lowlevel.checkpoint_if_cancelled()
        sent = write_now(fd, data)
        if sent == len(data):
            return
        data = data[sent:]
    await stream.send_all(data)


def read_now(fd: int, max_bytes: int) -> bytes:
    """
    ``os.read(fd, max_bytes)`` (at most :data:`READ_BUFFER_BYTES`), through the thread's
    buffer: the bytes returned are allocated at their own size. Raises what ``os.read`` does.
    """
    view = _buffer.view
    got = os.readv(fd, [view[: min(max_bytes, READ_BUFFER_BYTES)]])
    return bytes(view[:got])


async def read_fd(fd: int, max_bytes: int, *, drained: bool = False) -> bytes:
    """
    The next bytes of a non-blocking pipe or socket (at most ``max_bytes``); ``b""`` at its
    end. Raises what ``os.read`` does, but ``BlockingIOError``.

    It yields to the scheduler once, as trio's own reads do, but after the read: data that
    was waiting is read, then the others get their turn (shielded: what was read is
    returned), and data that was not is waited for (the wait is the turn). So a reader
    calls it in a loop and needs no turn of its own between reads; and a quiet pipe costs
    one scheduler round per message, not two (a yield, then the wait). ``drained``: the
    last read took less than it could (the pipe had no more then: :func:`drained`), so
    this one waits first, sparing a read that would find nothing (as libuv does); data that
    came since ends the wait at once.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    if not drained:
        try:
            data = read_now(fd, max_bytes)
        except BlockingIOError:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return data
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return read_now(fd, max_bytes)
        except BlockingIOError:
            pass


def drained(data: bytes | bytearray, max_bytes: int) -> bool:
    """Whether a read that returned ``data`` took all the pipe had (less than it could)."""
    return len(data) < min(max_bytes, READ_BUFFER_BYTES)


async def receive_some(
    stream: trio.abc.ReceiveStream, max_bytes: int, *, drained: bool = False
) -> bytes | bytearray:
    """
    ``stream.receive_some(max_bytes)``; from a pipe, through :func:`read_fd` (``drained``:
    the caller's last read from it was short, :func:`drained`).
    """
    fd = pipe_fd(stream)
    if fd is not None:
        try:
            return await read_fd(fd, max_bytes, drained=drained)
        except OSError:
            pass  # closed or broken: the stream's own call raises the proper error
    return await stream.receive_some(max_bytes)
