"""
NDJSON framing: split a byte stream into lines, with a hard cap on line length.

Pure: no I/O, no trio. Modeled on h11's receive buffer: the decoder remembers how far it has
scanned so a long line fed in many small chunks costs O(n), and a line over the cap is never
held in memory whole; its bytes are dropped as they arrive and one ``Oversize`` marker stands in
for it once its newline is seen.
"""

from __future__ import annotations

from typing import Final

import attrs

#: Default cap on one protocol line (16 MiB: room for large embedded resources and images).
DEFAULT_MAX_LINE_BYTES: Final = 16 * 1024 * 1024


@attrs.frozen
class Oversize:
    """
    Stands in for a line that was longer than the cap; its content was discarded.

    Attributes:
        size: how many bytes the line had (without the newline).
    """

    size: int


class LineDecoder:
    """
    Split a byte stream into lines (without the trailing ``\\n``; a ``\\r`` before it is kept).

    ``feed`` returns the complete lines found so far; a line longer than ``max_line_bytes``
    comes out as an :class:`Oversize` marker instead. Empty lines are skipped (ACP peers
    sometimes emit a bare newline; it carries no message).

    Backpressure: the decoder holds at most ``max_line_bytes`` of an incomplete line plus one
    chunk; discarding starts as soon as the cap is passed.
    """

    __slots__ = ("_buf", "_discarding", "_max", "_scanned")

    def __init__(self, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self._max = max_line_bytes
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline
        self._discarding = -1  # >= 0: size so far of an oversize line being dropped

    @property
    def pending(self) -> int:
        """Bytes held for an incomplete line."""
        return len(self._buf)

    @property
    def discarding(self) -> int | None:
        """
        While an oversize line is being dropped (past the cap, before its end): its size so
        far; None otherwise. (Its :class:`Oversize` marker comes out when it ends.)
        """
        return self._discarding if self._discarding >= 0 else None

    def feed(self, data: bytes | bytearray) -> list[bytes | Oversize]:
        """Add ``data``; return every line it completed, in order."""
        if type(data) is not bytes:
            data = bytes(data)
        out: list[bytes | Oversize] = []
        if self._discarding >= 0:
            nl = data.find(b"\n")
            if nl < 0:
                self._discarding += len(data)
                return out
            out.append(Oversize(self._discarding + nl))
            self._discarding = -1
            data = data[nl + 1 :]
        if not self._buf and b"\n" in data:
            # Fast path: no pending partial line, so split the chunk directly.
            *lines, rest = data.split(b"\n")
            for line in lines:
                if len(line) > self._max:
                    out.append(Oversize(len(line)))
                elif line and line != b"\r":
                    out.append(line)
            self._start_partial(rest, out)
            return out
        buf = self._buf
        buf += data
        start = 0
        search = self._scanned
        while True:
            nl = buf.find(b"\n", search)
            if nl < 0:
                break
            line = bytes(buf[start:nl])
            if len(line) > self._max:
                out.append(Oversize(len(line)))
            elif line and line != b"\r":
                out.append(line)
            start = search = nl + 1
        if start:
            del buf[:start]
        self._scanned = len(buf)
        if len(buf) > self._max:
            self._discarding = len(buf)
            buf.clear()
            self._scanned = 0
        return out

    def feed_block(self, data: bytes | bytearray) -> tuple[Oversize | None, bytes]:
        """
        Add ``data``; return the lines it completed as one block, each line with its
        ``\\n`` (b"" if none), for a caller that scans a whole read at once
        (``acp_bridge.protocol.scan``); blank lines and lines over the cap are left in the block for
        that scan to find (it skips the one, reports the other). First: the marker of an
        oversize line that was being dropped and ended in ``data`` (None if none).

        Not to be mixed with :meth:`feed` on one decoder mid-line; the same bounds hold.
        """
        if type(data) is not bytes:
            data = bytes(data)
        marker = None
        if self._discarding >= 0:
            nl = data.find(b"\n")
            if nl < 0:
                self._discarding += len(data)
                return None, b""
            marker = Oversize(self._discarding + nl)
            self._discarding = -1
            data = data[nl + 1 :]
        last = data.rfind(b"\n")
        if last < 0:
            buf = self._buf
            buf += data
            if len(buf) > self._max:
                self._discarding = len(buf)
                buf.clear()
            self._scanned = len(buf)
            return marker, b""
        end = last + 1
        if self._buf:
            block = bytes(self._buf) + data[:end]
            self._buf.clear()
        else:
            block = data if end == len(data) else data[:end]
        self._scanned = 0
        if end < len(data):
            self._start_partial(data[end:], [])
        return marker, block

    def _start_partial(self, rest: bytes, out: list[bytes | Oversize]) -> None:
        if len(rest) > self._max:
            self._discarding = len(rest)
        else:
            self._buf += rest
            self._scanned = len(rest)

    def feed_eof(self) -> bytes | Oversize | None:
        """
        End of stream: return a final unterminated line, if any, and reset.

        A peer that exits mid-line leaves a fragment; the caller decides what it means
        (usually: not a message, report it).
        """
        if self._discarding >= 0:
            size, self._discarding = self._discarding, -1
            return Oversize(size)
        if not self._buf:
            return None
        line = bytes(self._buf)
        self._buf.clear()
        self._scanned = 0
        return line
