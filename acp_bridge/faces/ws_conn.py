"""
An accepted WebSocket connection, after the handshake (``faces.ws.py``): the bridge reads and
writes its frames itself.

:class:`ReplayStream` is the transport: reads (the bytes read past the request head first,
then the socket at once when data is there) and serialised writes, each bounded by
``send_timeout``. :class:`Frames` is the connection: messages read and parsed
(``faces.ws_frames.py``) in the task that handles them, control frames answered there, keepalive
pings, the closing handshake.
"""

from __future__ import annotations

import contextlib
from typing import Final

import trio

from acp_bridge.faces import ws_frames as frames
from acp_bridge.faces.handshake import text_frames
from acp_bridge.runtime import pipes

__all__ = ["Closed", "Frames", "ReplayStream"]

#: What one read of an accepted connection takes at most.
RECEIVE_BYTES: Final = pipes.READ_BUFFER_BYTES


class ReplayStream(trio.abc.Stream):
    """
    An accepted connection: the bytes already read after the request head come first.

    Every write must complete within ``send_timeout`` seconds; one that does not marks the
    stream broken (the peer stopped reading) and closes the transport.

    Writes are serialised here, so the bridge's writer can send many text frames in one write
    (:meth:`send_messages`) beside the control frames (:meth:`send_all`); once the close
    frame went out, no data frame follows it.

    Cancellation: a write in progress is finished first (within ``send_timeout``), so the
    peer never gets half a frame.

    :meth:`offer` writes a frame without the lock, from any task, when no write is under
    way; what the socket does not take of it is the *tail*, which every later write sends
    first (see :meth:`offer` for who must make that write).
    """

    def __init__(self, stream: trio.abc.Stream, prefix: bytes, *, send_timeout: float) -> None:
        self._stream = stream
        self._prefix = prefix
        self._send_timeout = send_timeout
        self._write_lock = trio.StrictFIFOLock()
        self._fd = pipes.socket_fd(stream)
        self.stalled = False
        self.broken = False
        #: the close frame went out: no data frame may follow
        self.close_sent = False
        #: the rest of a frame :meth:`offer` wrote in part: the next write sends it first
        self._tail = b""
        #: the last read from the socket was short: the next one waits first (``read_fd``)
        self._drained = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """
        The bytes already read first; then, from a plain TCP socket, what is there now (no
        scheduler round before the bytes move), else the next data. Under TLS, or on any
        other stream, the stream's own ``receive_some``.

        Every call yields to the scheduler once, so a client that floods never starves the
        others: a read that found data at once yields after it (shielded: the bytes are
        returned), one that waited for data has yielded in the wait. So a message that
        arrives while the reader waits costs no scheduler round besides the wake-up.
        """
        if self._prefix:
            await trio.lowlevel.checkpoint()
            size = len(self._prefix) if max_bytes is None else max_bytes
            chunk, self._prefix = self._prefix[:size], self._prefix[size:]
            return chunk
        fd = self._fd
        size = RECEIVE_BYTES if max_bytes is None else max_bytes
        if fd is not None and not self.broken:
            try:
                data = await pipes.read_fd(fd, size, drained=self._drained)
            except OSError:
                pass  # reset or closed: the stream's own call raises the proper error
            else:
                self._drained = pipes.drained(data, size)
                return data
        return await self._stream.receive_some(size)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._write_lock:
            if data[:1] == b"\x88":  # (a control frame is written by itself)
                if self.close_sent:
                    return  # one close frame only (send_close may have sent it)
                self.close_sent = True
            await self._write(data)

    async def send_messages(self, messages: list[bytes]) -> bool:
        """
        Write each message (a JSON line, its newline dropped) as one unfragmented text frame,
        all in one write. False, writing nothing, once the close frame is out.

        When no other write is under way, the socket is offered the frames at once (no
        scheduler round before the bytes move: a round trip's last hop); the rest, if the
        socket does not take it all, is written as usual.
        """
        data = text_frames(messages)
        if self._fd is not None and not self.broken:
            try:
                self._write_lock.acquire_nowait()
            except trio.WouldBlock:
                pass
            else:
                try:
                    if self.close_sent:
                        return False
                    if self._tail:  # (under the lock: nothing else can come between)
                        data, self._tail = self._tail + data, b""
                    sent = pipes.write_now(self._fd, data)
                    if sent < len(data):
                        await self._write(data[sent:])
                    return True
                finally:
                    self._write_lock.release()
        async with self._write_lock:
            if self.close_sent:
                return False
            await self._write(data)
            return True

    def offer(self, message: bytes) -> int | None:
        """
        Write ``message`` (a JSON line) as one text frame now, without waiting, if no write
        is under way and none waits (the write lock is free), the socket is plain TCP, and
        the close frame is not out: an answer to an idle client leaves from the task that
        has it, with no task switch. None: nothing written (the caller queues the message
        for its writer as usual).

        Else the bytes of the frame the socket did not take (0: all written). They are the
        *tail*, which the next write under the lock sends before anything else, so frames
        stay whole and in order. The caller must make sure such a write comes (the bridge
        wakes the connection's writer, which flushes with an empty :meth:`send_messages`);
        until then any other write (a pong, the close frame) sends the tail first. Bound: one
        tail (the rest of one message); while it waits, ``offer`` takes nothing.
        """
        fd = self._fd
        if fd is None or self.broken or self.close_sent or self._tail or self._write_lock.locked():
            return None
        data = text_frames([message])
        sent = pipes.write_now(fd, data)
        if not sent:  # (full, or an error: the writer's own write meets it)
            return None
        if sent < len(data):
            self._tail = data[sent:]
        return len(data) - sent

    @property
    def tail_waiting(self) -> bool:
        """Part of a frame :meth:`offer` wrote waits for the next write."""
        return bool(self._tail)

    async def _write(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            raise trio.BrokenResourceError("an earlier write failed")
        if self._tail:  # (the rest of an offered frame goes before anything else)
            data = self._tail + bytes(data)
            self._tail = b""
        # Shielded: a frame is written whole even when the connection is being cancelled
        # (half a frame would turn our close frame into garbage); the deadline still cuts
        # off a peer that takes nothing.
        deadline = trio.current_time() + self._send_timeout
        with trio.CancelScope(deadline=deadline, shield=True) as scope:
            try:
                await self._stream.send_all(data)
            except BaseException:
                self.broken = True
                raise
        if scope.cancelled_caught:
            self.broken = self.stalled = True
            await trio.aclose_forcefully(self._stream)
            raise trio.BrokenResourceError(f"the peer took nothing for {self._send_timeout:g}s")

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def send_close(self, code: int, reason: str) -> None:
        """Send a close frame (if none went out yet), then close the transport."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with self._write_lock:
                if not self.close_sent:
                    self.close_sent = True
                    await self._write(frames.close_frame(code, reason))
        await self._stream.aclose()


class Closed(Exception):
    """The WebSocket connection ended: the (code, reason) the face reports."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class Frames:
    """
    One accepted WebSocket connection, its frames read and written by the bridge itself.

    The task that handles the client's messages calls :meth:`next_message`: it reads the
    socket, parses, answers pings and the client's close frame, and returns a message to
    handle, all in that task. :meth:`ping` (the keepalive) waits for the reader to see the
    pong. Inbound memory: one :class:`~acp_bridge.faces.ws_frames.FrameReader` (see its bounds).
    """

    def __init__(self, replay: ReplayStream, max_message_bytes: int) -> None:
        self.replay = replay
        self._reader = frames.FrameReader(max_message_bytes)
        #: why the connection ended, once it did (a close frame came in, a protocol error)
        self.closed: tuple[int, str] | None = None
        #: our pings waiting for their pong, oldest first
        self._pings: dict[bytes, trio.Event] = {}
        self._ping_number = 0

    def offer(self, message: bytes) -> int | None:
        """
        Write ``message`` at once if the connection can take it now
        (:meth:`ReplayStream.offer`); never once it ended (the writer does not either).
        """
        return self.replay.offer(message) if self.closed is None else None

    async def next_message(self) -> bytes | None:
        """
        The next text message (its UTF-8 bytes), or None for a binary one. Raises
        :class:`Closed` when the connection ends (close frame, EOF, a protocol error).
        """
        reader = self._reader
        while True:
            try:
                event = reader.next()
            except frames.ProtocolError as exc:
                raise self._end(exc.code, _refusal(exc)) from None
            if event is None:
                await self._read()
                continue
            opcode, payload = event
            if opcode == frames.TEXT:
                return payload
            if opcode == frames.BINARY:
                return None
            await self._control(opcode, payload)

    async def _read(self) -> None:
        # (every read yields once: a client that floods does not starve the other tasks)
        try:
            data = await self.replay.receive_some(RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            if self.replay.stalled:
                raise self._end(1006, "client stopped reading")
            raise self._end(1006, "connection lost")
        self._reader.feed(bytes(data))

    async def _control(self, opcode: int, payload: bytes) -> None:
        if opcode == frames.PING:
            if not self.replay.close_sent:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.replay.send_all(frames.control_frame(frames.PONG, payload))
        elif opcode == frames.PONG:
            if payload in self._pings:  # (a pong settles its ping and any skipped before it)
                while self._pings:
                    key, event = next(iter(self._pings.items()))
                    del self._pings[key]
                    event.set()
                    if key == payload:
                        break
        else:
            try:
                code, reason = frames.close_payload(payload)
            except frames.ProtocolError as exc:
                raise self._end(exc.code, _refusal(exc)) from None
            ended = self._end(code, f"closed by client: {reason or code}")
            # Answered with the same code: the closing handshake is complete on our side.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.replay.send_all(frames.close_frame(code, reason))
            raise ended

    def _end(self, code: int, reason: str) -> Closed:
        if self.closed is None:
            self.closed = (code, reason)
        return Closed(*self.closed)

    async def ping(self) -> None:
        """Send a ping and wait for its pong. Raises :class:`Closed` once closed."""
        if self.closed is not None:
            raise Closed(*self.closed)
        self._ping_number += 1
        payload = self._ping_number.to_bytes(4, "big")
        event = self._pings[payload] = trio.Event()
        await self.replay.send_all(frames.control_frame(frames.PING, payload))
        await event.wait()

    async def close(self, code: int, reason: str) -> None:
        """
        End the connection with ``code``: send the close frame (unless one went out) and,
        unless it already ended (the client's close came in, or a protocol error: closed at
        once), read until the client answers it or the connection ends; then close the
        transport. The caller bounds the time (``CLOSE_TIMEOUT``).
        """
        replay = self.replay
        try:
            if self.closed is None and not replay.close_sent and not replay.broken:
                self.closed = (code, reason)
                await replay.send_all(frames.close_frame(code, reason))
                with contextlib.suppress(Closed):
                    while True:
                        await self.next_message()  # (anything but the close is dropped)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await replay.send_close(code, reason)


def _refusal(exc: frames.ProtocolError) -> str:
    if exc.code == 1009:
        return exc.reason
    return f"protocol error: {exc.reason}"
