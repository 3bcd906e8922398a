"""
The WebSocket frame parser and the server's own frames (``faces.ws_frames.py``), pure: frames as
a real client library writes them (wsproto's client side), and hand-made ones it never would.
"""

from __future__ import annotations

import os
import struct

import pytest
import wsproto
import wsproto.events as ev
from wsproto.frame_protocol import FrameProtocol

from acp_bridge.faces.ws_frames import (
    BINARY,
    CLOSE,
    PING,
    PONG,
    TEXT,
    FrameReader,
    ProtocolError,
    accept_response,
    close_frame,
    close_payload,
    control_frame,
    unmask,
)

MAX = 100_000


def client() -> FrameProtocol:
    """A client's frame writer: masks every frame with a fresh random key."""
    return FrameProtocol(client=True, extensions=[])


def events(data: bytes, *, max_bytes: int = MAX, step: int | None = None) -> list[object]:
    """Everything a fresh reader makes of ``data``, fed at once or ``step`` bytes at a time."""
    reader = FrameReader(max_bytes)
    out: list[object] = []
    step = step or max(len(data), 1)
    for i in range(0, len(data), step):
        reader.feed(data[i : i + step])
        while (event := reader.next()) is not None:
            out.append(event)
    return out


def refusal(data: bytes, *, max_bytes: int = MAX) -> tuple[int, str]:
    with pytest.raises(ProtocolError) as caught:
        events(data, max_bytes=max_bytes)
    return caught.value.code, caught.value.reason


def masked(
    first: int, payload: bytes, key: bytes = b"\x01\x02\x03\x04", *, length: int = -1
) -> bytes:
    """A hand-made masked frame: first byte, then the length in 7 bits, or 16/64 if asked."""
    n = len(payload)
    if length == 16:
        head = bytes((first, 0x80 | 126)) + struct.pack("!H", n)
    elif length == 64:
        head = bytes((first, 0x80 | 127)) + struct.pack("!Q", n)
    else:
        head = bytes((first, 0x80 | n))
    return head + key + unmask(payload, key)


def test_unmask_is_its_own_inverse_and_matches_the_rfc():
    """XOR with the key repeated: applying it twice gives the payload back, any length."""
    key = os.urandom(4)
    for n in (0, 1, 3, 4, 5, 127, 4097):
        payload = os.urandom(n)
        expected = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        assert unmask(payload, key) == expected
        assert unmask(expected, key) == payload


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70_000])
def test_text_of_every_length_encoding_reads_back(size):
    """7-bit, 16-bit and 64-bit lengths (the boundaries 125/126, 65535/65536), masked by a
    real client, read back whole, fed at once or in odd pieces."""
    text = ("é" + "x" * size)[:size] if size else ""
    data = client().send_data(text)
    assert events(data) == [(TEXT, text.encode())]
    assert events(data, step=7) == [(TEXT, text.encode())]


def test_binary_messages_are_told_apart():
    assert events(client().send_data(b"\x00\xff")) == [(BINARY, b"\x00\xff")]


def test_fragments_are_joined_with_control_frames_between_them():
    """A message in three fragments with a ping and a pong between them: the control frames
    come out as they arrive, then the whole message; a UTF-8 character may straddle two
    fragments."""
    proto = client()
    word = "né".encode()
    data = (
        proto.send_data(word[:2], fin=False)  # (bytes: "n" and half of "é")
        + proto.ping(b"p1")
        + proto.send_data(word[2:], fin=False)
        + proto.pong(b"p2")
    )
    # A text message whose first fragment is a str in wsproto; write its opcode by hand.
    data = bytes((0x01,)) + data[1:]
    data += masked(0x80, b"!")  # the final continuation frame
    assert events(data) == [(PING, b"p1"), (PONG, b"p2"), (TEXT, "né!".encode())]
    assert events(data, step=1) == [(PING, b"p1"), (PONG, b"p2"), (TEXT, "né!".encode())]


def test_many_frames_in_one_read_come_out_in_order():
    proto = client()
    data = b"".join(proto.send_data(f'{{"n":{i}}}') for i in range(50))
    assert events(data) == [(TEXT, f'{{"n":{i}}}'.encode()) for i in range(50)]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        pytest.param(bytes((0x81, 0x02)) + b"{}", 1002, id="unmasked"),
        pytest.param(masked(0xC1, b"x"), 1002, id="reserved-bit"),
        pytest.param(masked(0x83, b""), 1002, id="reserved-data-opcode"),
        pytest.param(masked(0x8B, b""), 1002, id="reserved-control-opcode"),
        pytest.param(masked(0x80, b"x"), 1002, id="continuation-outside-a-message"),
        pytest.param(masked(0x01, b"a") + masked(0x81, b"b"), 1002, id="message-in-a-message"),
        pytest.param(masked(0x09, b"p"), 1002, id="fragmented-ping"),
        pytest.param(masked(0x89, b"p" * 126, length=16), 1002, id="ping-over-125"),
        pytest.param(masked(0x81, b"x" * 125, length=16), 1002, id="16-bit-length-not-needed"),
        pytest.param(masked(0x81, b"x" * 65535, length=64), 1002, id="64-bit-length-not-needed"),
        pytest.param(
            bytes((0x81, 0xFF)) + struct.pack("!Q", 1 << 63) + b"\0\0\0\0", 1002, id="top-bit"
        ),
        pytest.param(masked(0x81, b"\xff\xfe"), 1007, id="invalid-utf8"),
        pytest.param(masked(0x01, b"\xc3") + masked(0x80, b"("), 1007, id="invalid-utf8-split"),
    ],
)
def test_frames_a_server_must_refuse(data, code):
    assert refusal(data)[0] == code


def test_the_size_cap_is_exact_and_decided_from_the_header():
    """A message of max bytes is read; one more byte is refused with 1009 from the frame
    header alone (the payload never arrives), and so is a fragment that takes a message over."""
    assert events(client().send_data(b"x" * 2000), max_bytes=2000) == [(BINARY, b"x" * 2000)]
    header = client().send_data("x" * 2001)[:8]  # (2 + 2-byte length + mask key)
    assert refusal(header, max_bytes=2000) == (1009, "message over 2000 bytes")
    proto = client()
    two = proto.send_data(b"x" * 1500, fin=False) + proto.send_data(b"x" * 501, fin=True)
    assert refusal(two, max_bytes=2000)[0] == 1009
    # Control frames are not counted in the message.
    proto = client()
    mixed = proto.send_data(b"x" * 1000, fin=False) + proto.ping(b"p" * 125)
    mixed += proto.send_data(b"x" * 1000, fin=True)
    assert events(mixed, max_bytes=2000) == [(PING, b"p" * 125), (BINARY, b"x" * 2000)]


def test_what_a_reader_holds_is_one_partial_frame_and_the_fragments():
    """Fed a frame a byte short, then the rest: it holds that much, then nothing."""
    data = client().send_data("x" * 5000)
    reader = FrameReader(MAX)
    reader.feed(data[:-1])
    assert reader.next() is None
    assert reader.buffered == len(data) - 1
    reader.feed(data[-1:])
    assert reader.next() == (TEXT, b"x" * 5000)
    assert reader.buffered == 0


def test_close_payloads():
    """Empty: 1005; a code and a UTF-8 reason; codes no peer may send (1005, 1006, 1015,
    unassigned ones, out of range), a 1-byte payload (1002) and a reason not UTF-8 (1007)."""
    assert close_payload(b"") == (1005, "")
    assert close_payload(struct.pack("!H", 1000) + "bye ✓".encode()) == (1000, "bye ✓")
    assert close_payload(struct.pack("!H", 4000)) == (4000, "")
    for code in (999, 1004, 1005, 1006, 1015, 1100, 2999, 5000):
        with pytest.raises(ProtocolError) as caught:
            close_payload(struct.pack("!H", code))
        assert caught.value.code == 1002
    with pytest.raises(ProtocolError) as caught:
        close_payload(b"\x03")
    assert caught.value.code == 1002
    with pytest.raises(ProtocolError) as caught:
        close_payload(struct.pack("!H", 1000) + b"\xff")
    assert caught.value.code == 1007
    assert events(client().close(1000, "done")) == [(CLOSE, struct.pack("!H", 1000) + b"done")]


def test_the_servers_frames_are_what_a_client_reads():
    """Ping, pong and close frames (the reason cut to fit 125 bytes), read by wsproto's
    client side; and the 101 answer is the RFC 6455 example's."""
    data = control_frame(PING, b"abc") + control_frame(PONG) + close_frame(1001, "é" * 100)
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    request = conn.send(ev.Request(host="x", target="/acp"))
    key = next(
        line.split(b": ", 1)[1].decode()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key")
    )
    conn.receive_data(accept_response(key, [("Acp-Connection-Id", "id-1")]) + data)
    got = list(conn.events())
    assert isinstance(got[0], ev.AcceptConnection)
    assert (b"acp-connection-id", b"id-1") in got[0].extra_headers
    assert isinstance(got[1], ev.Ping)
    assert got[1].payload == b"abc"
    assert isinstance(got[2], ev.Pong)
    assert isinstance(got[3], ev.CloseConnection)
    assert (got[3].code, got[3].reason) == (1001, "é" * 61)  # (cut at a character's end)
    assert close_frame(1005, "ignored") == b"\x88\x00"
    sample = accept_response("dGhlIHNhbXBsZSBub25jZQ==", [])
    assert b"\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in sample
