"""
The WebSocket wire of the server side (RFC 6455), pure: the ``101`` answer to an upgrade the
judge accepted, the frames a client sends parsed into messages and control frames
(:class:`FrameReader`), and the control frames the server sends.

The face (``faces.ws.py``) reads the socket and feeds each read to a :class:`FrameReader` in the
task that handles the messages: a client message goes from the socket read to the bridge
with no task or channel between (trio-websocket's reader task and its memory channel cost
three scheduler rounds per message).

What a client may send, and what else is refused (:class:`ProtocolError`, with its close
code): masked frames only, no reserved bit (no extension is negotiated), the opcodes of RFC
6455 only, control frames unfragmented and of at most 125 bytes, lengths in their shortest
encoding, continuation frames only inside a fragmented message and no new message inside
one (1002); text that is not UTF-8 (1007); a message over ``max_message_bytes`` bytes of
payload (1009, decided from the frame header: the payload is never buffered). Binary
messages are parsed like text ones and handed on as such.

Bounds: a reader holds at most one message's fragments and the frame being received (both
within ``max_message_bytes``, checked at each frame header), a frame header (14 bytes), and
whatever followed them in the last read fed (the caller reads only when :meth:`next` has
nothing more: at most one read's worth).

Pure: no trio, no socket, no clock (fenced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Final

__all__ = [
    "BINARY",
    "CLOSE",
    "PING",
    "PONG",
    "TEXT",
    "FrameReader",
    "ProtocolError",
    "accept_response",
    "close_frame",
    "close_payload",
    "control_frame",
    "unmask",
]

TEXT: Final = 0x1
BINARY: Final = 0x2
CLOSE: Final = 0x8
PING: Final = 0x9
PONG: Final = 0xA

_CONTINUATION: Final = 0x0
_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: close codes a peer may send (RFC 6455 §7.4 and the IANA registry); 3000-4999 besides
_KNOWN_CODES: Final = frozenset((1000, 1001, 1002, 1003, *range(1007, 1015)))


class ProtocolError(Exception):
    """What the client sent breaks the protocol: close the connection with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def unmask(payload: bytes | bytearray, key: bytes | bytearray) -> bytes:
    """The payload XORed with the 4-byte masking key (one big-integer XOR: C speed)."""
    n = len(payload)
    if not n:
        return b""
    mask = (bytes(key) * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(mask, "little")).to_bytes(
        n, "little"
    )


class FrameReader:
    """
    Parses what a client sends: :meth:`feed` it the bytes read, then take what :meth:`next`
    returns until it returns None (it needs more bytes).

    Events are ``(opcode, payload)``: ``(TEXT, utf-8 bytes)`` and ``(BINARY, bytes)`` for
    whole messages (fragments joined), ``(PING, data)``, ``(PONG, data)`` and ``(CLOSE,
    payload)`` (see :func:`close_payload`) for control frames, which may come between the
    fragments of a message. :class:`ProtocolError` for anything refused; after one, the
    reader is of no further use.
    """

    __slots__ = ("_buf", "_max", "_opcode", "_parts", "_pos", "_size")

    def __init__(self, max_message_bytes: int) -> None:
        self._max = max_message_bytes
        #: bytes fed and not yet parsed start at ``_pos``
        self._buf: bytes | bytearray = b""
        self._pos = 0
        #: the fragmented message being received: its opcode (0: none), parts, size
        self._opcode = 0
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def buffered(self) -> int:
        """Bytes held: unparsed input and the fragments of the message under way."""
        return len(self._buf) - self._pos + self._size

    def feed(self, data: bytes) -> None:
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            self._buf, self._pos = data, 0  # (the usual case: no copy)
            return
        # A partial frame is left: grow it in place (a large frame arrives over many reads).
        if isinstance(buf, bytearray):
            if pos:
                del buf[:pos]
        else:
            buf = bytearray(memoryview(buf)[pos:])
        buf += data
        self._buf, self._pos = buf, 0

    def next(self) -> tuple[int, bytes] | None:
        """The next message or control frame, or None until more bytes are fed."""
        while True:
            buf, pos = self._buf, self._pos
            avail = len(buf) - pos
            if avail < 2:
                return None
            b0, b1 = buf[pos], buf[pos + 1]
            if b0 & 0x70:
                raise ProtocolError(1002, "reserved bit set")
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            if opcode >= CLOSE:
                if opcode > PONG:
                    raise ProtocolError(1002, f"unknown opcode {opcode}")
                if not fin:
                    raise ProtocolError(1002, "fragmented control frame")
                if b1 & 0x7F > 125:
                    raise ProtocolError(1002, "control frame over 125 bytes")
            elif opcode == _CONTINUATION:
                if not self._opcode:
                    raise ProtocolError(1002, "continuation frame outside a message")
            elif opcode <= BINARY:
                if self._opcode:
                    raise ProtocolError(1002, "new message inside a fragmented one")
            else:
                raise ProtocolError(1002, f"unknown opcode {opcode}")
            if not b1 & 0x80:
                raise ProtocolError(1002, "unmasked frame")
            length = b1 & 0x7F
            if length < 126:
                head = 6
            elif length == 126:
                if avail < 4:
                    return None
                head = 8
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                if length < 126:
                    raise ProtocolError(1002, "a 16-bit length that fits in 7 bits")
            else:
                if avail < 10:
                    return None
                head = 14
                (length,) = struct.unpack_from("!Q", buf, pos + 2)
                if length >> 63:
                    raise ProtocolError(1002, "a 64-bit length with its top bit set")
                if length < 0x10000:
                    raise ProtocolError(1002, "a 64-bit length that fits in 16 bits")
            if opcode < CLOSE and self._size + length > self._max:
                # Before the payload arrives: a message over the cap is never buffered.
                raise ProtocolError(1009, f"message over {self._max} bytes")
            start = pos + head
            end = start + length
            if len(buf) < end:
                return None
            payload = unmask(buf[start:end], buf[start - 4 : start])
            self._pos = end
            if opcode >= CLOSE:
                return opcode, payload
            if opcode != _CONTINUATION:
                if fin:
                    return opcode, _checked(opcode, payload)
                self._opcode = opcode
                self._parts = [payload]
                self._size = length
                continue
            self._parts.append(payload)
            self._size += length
            if fin:
                opcode, message = self._opcode, b"".join(self._parts)
                self._opcode, self._parts, self._size = 0, [], 0
                return opcode, _checked(opcode, message)


def _checked(opcode: int, payload: bytes) -> bytes:
    """A whole message: text must be UTF-8 (1007)."""
    if opcode == TEXT and not payload.isascii():
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(1007, "invalid UTF-8 in a text message") from None
    return payload


def close_payload(payload: bytes) -> tuple[int, str]:
    """
    The (code, reason) of a close frame's payload: 1005 (none) when empty; a code no peer
    may send or a truncated code is a protocol error (1002), a reason not UTF-8 is 1007.
    """
    if not payload:
        return 1005, ""
    if len(payload) == 1:
        raise ProtocolError(1002, "close frame with a 1-byte payload")
    code = (payload[0] << 8) | payload[1]
    if code not in _KNOWN_CODES and not 3000 <= code <= 4999:
        raise ProtocolError(1002, f"close code {code} is not one a peer may send")
    try:
        reason = payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(1007, "invalid UTF-8 in a close reason") from None
    return code, reason


def control_frame(opcode: int, payload: bytes = b"") -> bytes:
    """A server's (unmasked) control frame: ping, pong or close; payload at most 125 bytes."""
    if len(payload) > 125:
        raise ValueError("control frame payload over 125 bytes")
    return bytes((0x80 | opcode, len(payload))) + payload


def close_frame(code: int, reason: str) -> bytes:
    """
    A close frame with ``code`` (none for 1005) and ``reason``, cut at a character's end to
    fit 123 bytes.
    """
    if code == 1005:
        return control_frame(CLOSE)
    cut = reason.encode()[:123].decode("utf-8", "ignore").encode()
    return control_frame(CLOSE, struct.pack("!H", code) + cut)


def accept_response(key: str, extra_headers: list[tuple[str, str]]) -> bytes:
    """The ``101 Switching Protocols`` answer to an upgrade with ``Sec-WebSocket-Key: key``."""
    token = base64.b64encode(hashlib.sha1(key.strip().encode() + _GUID).digest()).decode()
    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {token}",
        *(f"{name}: {value}" for name, value in extra_headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
