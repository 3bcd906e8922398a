"""
The WebSocket face's outbound hop: a message to an idle client is framed and written by the
task that has it (``ReplayStream.offer`` through ``ClientLink.pump_batches``), the rest of a
frame the socket does not take is written by the connection's writer before anything else.
Over real loopback TCP sockets: the immediate write needs a socket's descriptor.
"""

from __future__ import annotations

import contextlib
import json
import socket
from typing import TYPE_CHECKING, Any

import trio
import trio.testing
from wsproto.frame_protocol import FrameProtocol, Opcode

from acp_bridge.engine.links import ClientLink
from acp_bridge.faces.ws import _ReplayStream
from tests.faces.test_ws import TIMEOUT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

#: a message far larger than the small socket buffers below take at once
BIG = 256 * 1024


@contextlib.asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    """(server side, client side) of a loopback TCP connection with small buffers: the
    server's send buffer and the client's receive buffer hold a few KiB."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client_sock = trio.socket.socket()
    client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await client_sock.connect(("127.0.0.1", port))
    client = trio.SocketStream(client_sock)
    server = await listeners[0].accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    async with server, client:
        await listeners[0].aclose()
        yield server, client


class FrameLog:
    """The client's side: server frames read and parsed (wsproto), messages reassembled."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.parser = FrameProtocol(client=True, extensions=[])
        #: (opcode, whole payload) in the order they came (a close frame's: (code, reason))
        self.frames: list[tuple[Opcode, Any]] = []
        self._part: list[Any] = []

    async def read_until(self, count: int) -> None:
        while len(self.frames) < count:
            data = await self.stream.receive_some(65536)
            assert data, "the connection ended"
            self.parser.receive_bytes(data)
            for frame in self.parser.received_frames():
                self._part.append(frame.payload)
                if frame.message_finished:
                    first = self._part[0]
                    whole = type(first)().join(self._part) if len(self._part) > 1 else first
                    self.frames.append((frame.opcode, whole))
                    self._part = []


def message(tag: str, size: int = 0) -> bytes:
    return json.dumps({"tag": tag, "pad": "x" * size}).encode() + b"\n"


async def test_a_frame_the_socket_takes_in_part_is_finished_first_and_whole():
    """The socket's buffer takes part of an offered frame: the rest stays the connection's
    (the tail), the writer is woken and writes it before the messages queued meanwhile and
    before a control frame another task sends; every frame arrives whole, in order."""
    with trio.fail_after(TIMEOUT):
        async with tcp_pair() as (server, client), trio.open_nursery() as nursery:
            replay = _ReplayStream(server, b"", send_timeout=TIMEOUT)
            link = ClientLink(name="c", queue_size=10, blocking=False)

            async def send(batch: list[bytes]) -> None:
                assert await replay.send_messages(batch)

            nursery.start_soon(link.pump_batches, send, replay.offer)
            await trio.testing.wait_all_tasks_blocked()  # (the writer is idle)
            big = message("big", BIG)
            assert link.send_nowait(big)  # offered at once: the socket takes part of it
            assert replay.tail_waiting
            assert replay.offer(message("refused")) is None  # (one tail at most)
            assert link.send_nowait(message("after-1"))  # queued: the writer is awake
            assert link.send_nowait(message("after-2"))
            nursery.start_soon(replay.send_all, b"\x8a\x02hi")  # a pong, from another task
            log = FrameLog(client)
            await log.read_until(4)
            assert not replay.tail_waiting
            texts = [json.loads(p)["tag"] for op, p in log.frames if op == Opcode.TEXT]
            assert texts == ["big", "after-1", "after-2"]
            assert json.loads(log.frames[0][1])["pad"] == "x" * BIG  # (whole)
            assert (Opcode.PONG, b"hi") in log.frames[1:]
            link.finish()


async def test_the_rest_of_a_frame_alone_is_written_by_the_woken_writer():
    """Nothing else to write after a frame the socket took in part: the writer, woken with
    nothing queued, writes the rest by itself (without it the client waits forever)."""
    with trio.fail_after(TIMEOUT):
        async with tcp_pair() as (server, client), trio.open_nursery() as nursery:
            replay = _ReplayStream(server, b"", send_timeout=TIMEOUT)
            link = ClientLink(name="c", queue_size=10, blocking=False)
            sends: list[list[bytes]] = []

            async def send(batch: list[bytes]) -> None:
                sends.append(batch)
                assert await replay.send_messages(batch)

            nursery.start_soon(link.pump_batches, send, replay.offer)
            await trio.testing.wait_all_tasks_blocked()
            assert link.send_nowait(message("big", BIG))
            assert replay.tail_waiting
            log = FrameLog(client)
            await log.read_until(1)
            assert json.loads(log.frames[0][1]) == {"tag": "big", "pad": "x" * BIG}
            assert sends == [[]]  # (the flush: an empty batch)
            await trio.testing.wait_all_tasks_blocked()
            assert link.send_nowait(message("small"))  # idle again: written at once
            assert sends == [[]]
            await log.read_until(2)
            assert json.loads(log.frames[1][1])["tag"] == "small"
            link.finish()


async def test_nothing_is_offered_past_the_close_frame_or_beside_a_write():
    """The immediate write stands aside while a write holds the lock, and for good once the
    close frame is out; the rest of an offered frame goes before the close frame."""
    with trio.fail_after(TIMEOUT):
        async with tcp_pair() as (server, client):
            replay = _ReplayStream(server, b"", send_timeout=TIMEOUT)
            assert replay.offer(message("big", BIG))  # (bytes left: the tail)
            async with replay._write_lock:
                assert replay.offer(message("while-locked")) is None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replay.send_all, b"\x88\x02\x03\xe8")  # close, 1000
                log = FrameLog(client)
                await log.read_until(2)
            assert replay.close_sent
            assert replay.offer(message("late")) is None
            assert [op for op, _ in log.frames] == [Opcode.TEXT, Opcode.CLOSE]
            assert log.frames[1][1] == (1000, "")
            assert json.loads(log.frames[0][1])["tag"] == "big"
