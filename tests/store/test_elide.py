"""
The journal's run codec (acp_bridge.store.elide): the reference against hand-written cases, and the
C functions held to it: the same bytes for any input, the same refusals for any blob.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.store import elide
from acp_bridge.store.elide import elide_reference, records_reference, restore_reference
from tests.support.fakes import chunk_update

needs_c = pytest.mark.skipif(
    elide.elide_c is None,
    reason="acp_bridge.protocol.scanc is not built (no C compiler at install): C codec untested",
)

#: (elide, restore) pairs: the reference, and the C one when it is built
CODECS = [
    pytest.param(elide_reference, restore_reference, id="reference"),
    pytest.param(
        elide.elide_c or elide_reference,
        elide.restore_c or restore_reference,
        id="c",
        marks=needs_c,
    ),
]


def update(text: str, sid: str = "sess_0123456789abcdef") -> bytes:
    return orjson.dumps(chunk_update(sid, text)) + b"\n"


# --------------------------------------------------------------------------- the format


@pytest.mark.parametrize(("elide", "restore"), CODECS)
def test_each_line_keeps_what_follows_the_prefix_it_shares_with_the_line_before(elide, restore):
    data = b"abcdef\nabcxyz\nabcxyz\nab\n"
    blob = b"\x00abcdef\n\x03xyz\n\x06\n\x02\n"
    assert elide(data) == blob
    assert restore(blob, len(data)) == data


@pytest.mark.parametrize(("elide", "restore"), CODECS)
def test_a_last_line_without_a_newline_is_kept_and_may_be_all_prefix(elide, restore):
    data = b"hello world\nhello"
    assert elide(data) == b"\x00hello world\n\x05"
    assert restore(b"\x00hello world\n\x05", len(data)) == data
    data = b"hello world\nhello there"
    assert restore(elide(data), len(data)) == data


@pytest.mark.parametrize(("elide", "restore"), CODECS)
def test_long_prefixes_take_varints_of_two_and_three_bytes(elide, restore):
    for shared in (127, 128, 16383, 16384, 70000):
        data = b"p" * shared + b"a\n" + b"p" * shared + b"b\n"
        varint = b""
        value = shared
        while value >= 0x80:
            varint += bytes([value & 0x7F | 0x80])
            value >>= 7
        varint += bytes([value])
        blob = elide(data)
        assert blob == b"\x00" + b"p" * shared + b"a\n" + varint + b"b\n"
        assert len(varint) == (1 if shared < 128 else 2 if shared < 16384 else 3)
        assert restore(blob, len(data)) == data


@pytest.mark.parametrize(("elide", "restore"), CODECS)
def test_nothing_is_elided_unless_it_makes_the_bytes_smaller(elide, restore):
    assert elide(b"") is None
    assert elide(b"one line\n") is None  # (one byte more)
    assert elide(b"u1\nu2\nu3\n") is None  # (as big: kept as it is)
    assert elide(b"ab\ncd\n") is None
    assert elide(b"\n\n\n") is None  # (empty lines: two bytes each)
    assert elide(b"u1\nu2\nu3\nu4\n") is None
    assert elide(b"u10\nu11\nu12\n") == b"\x00u10\n\x021\n\x022\n"  # (11 bytes of 12)


@pytest.mark.parametrize(("elide", "restore"), CODECS)
def test_a_run_of_updates_shrinks_about_threefold(elide, restore):
    data = b"".join(update(f"chunk {i} of the answer") for i in range(1000))
    blob = elide(data)
    assert blob is not None
    assert len(blob) * 3 < len(data)
    assert restore(blob, len(data)) == data


BAD = [
    (b"", 1, "fewer bytes"),
    (b"\x00abc\n", 3, "more bytes"),
    (b"\x00abc\n", 5, "fewer bytes"),
    (b"\x80", 1, "cut short"),
    (b"\x00abc\n\x80", 7, "cut short"),
    (b"\x00abc\n\x83\x00d\n", 6, "not minimal"),
    (b"\x00abc\n" + b"\x80" * 9 + b"\x01\n", 6, "more than 9"),
    (b"\x00abc\n\x04d\n", 9, "longer than the line before"),
    (b"\x01abc\n", 5, "longer than the line before"),
    (b"\x00abc\n\x01bd\n", 7, "not whole"),
    (b"\x00abc\n\x00a\n", 6, "not whole"),
    (b"\x00abc\n\x00", 4, "empty last line"),
    (b"\x00", 0, "empty last line"),
]


@pytest.mark.parametrize(("elide", "restore"), CODECS)
@pytest.mark.parametrize(("blob", "size", "reason"), BAD)
def test_a_blob_it_cannot_have_made_is_refused(elide, restore, blob, size, reason):
    with pytest.raises(ValueError, match=reason):
        restore(blob, size)


@pytest.mark.parametrize(("elide", "restore"), CODECS)
def test_the_refusals_are_the_only_thing_in_the_way(elide, restore):
    """(The cases above, made right, restore: each refusal is for the reason named.)"""
    assert restore(b"\x00abc\n", 4) == b"abc\n"
    assert restore(b"\x00abc\n\x03\x00", 8) == b"abc\nabc\x00"
    assert restore(b"\x00abc\n\x03d\n", 9) == b"abc\nabcd\n"
    assert restore(b"\x00abc\n\x01d\n", 7) == b"abc\nad\n"
    assert restore(b"\x00abc\n\x00x\n", 6) == b"abc\nx\n"
    assert restore(b"\x00abc\n\x01", 5) == b"abc\na"


# --------------------------------------------------------------------------- C = reference

#: Lines from a small alphabet, so that prefixes are shared, with some long ones
LINE = st.one_of(
    st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"a")),
    st.sampled_from([b"", b"a", b"ab", b"abc", b"\r", b'{"jsonrpc":"2.0"']),
    st.integers(120, 140).map(lambda n: b"x" * n),
    st.integers(16378, 16390).map(lambda n: b"y" * n),
)


@st.composite
def line_runs(draw) -> bytes:
    """Lines, each maybe the one before with its end changed, and maybe a tail."""
    lines: list[bytes] = []
    for _ in range(draw(st.integers(0, 12))):
        if lines and draw(st.booleans()):
            prev = lines[-1]
            keep = draw(st.integers(0, len(prev)))
            lines.append(prev[:keep] + draw(LINE))
        else:
            lines.append(draw(LINE))
    data = b"".join(line + b"\n" for line in lines)
    if draw(st.booleans()):
        data += draw(LINE)
    return data


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.one_of(line_runs(), st.binary(max_size=300)))
def test_the_c_elide_is_the_reference_and_restores(data):
    assert elide.elide_c is not None
    assert elide.restore_c is not None
    blob = elide_reference(data)
    assert elide.elide_c(data) == blob
    encoded = records_reference(data)
    assert len(encoded) <= len(data) + data.count(b"\n") + 1  # (the bound)
    if blob is None:
        assert len(encoded) >= len(data)
    else:
        assert blob == encoded
        assert len(blob) < len(data)
    assert restore_reference(encoded, len(data)) == data
    assert elide.restore_c(encoded, len(data)) == data


def both(blob: bytes, size: int) -> bytes | None:
    """What both restores make of ``blob`` (None: both refuse it), held equal."""
    assert elide.restore_c is not None
    results = []
    for restore in (restore_reference, elide.restore_c):
        try:
            results.append(restore(blob, size))
        except ValueError:
            results.append(None)
    assert results[0] == results[1], (blob, size)
    return results[0]


@needs_c
@settings(max_examples=400, deadline=None)
@given(line_runs(), st.data())
def test_the_c_restore_refuses_what_the_reference_refuses(data, draw):
    """Valid blobs with one edit (a byte changed, inserted or removed, a size off by one):
    both accept or both refuse, and what they accept is the one encoding of what they
    give (no blob restores to bytes it is not the encoding of)."""
    blob = bytearray(records_reference(data))
    size = len(data) + draw.draw(st.sampled_from([0, 0, -1, 1]))
    if blob:
        at = draw.draw(st.integers(0, len(blob) - 1))
        edit = draw.draw(st.sampled_from(["set", "insert", "delete", "none"]))
        byte = draw.draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0x81, 10, 97, 255]))
        if edit == "set":
            blob[at] = byte
        elif edit == "insert":
            blob.insert(at, byte)
        elif edit == "delete":
            del blob[at]
    out = both(bytes(blob), max(size, 0))
    if out is not None:
        assert records_reference(out) == bytes(blob)


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 80))
def test_random_blobs_are_refused_alike_and_never_loop(blob, size):
    out = both(blob, size)
    if out is not None:
        assert records_reference(out) == blob


@needs_c
def test_the_c_codec_takes_any_buffer_and_refuses_a_negative_size():
    assert elide.elide_c is not None
    assert elide.restore_c is not None
    data = b"abcdef\nabcxyz\n"
    assert elide.elide_c(memoryview(data)) == elide.elide_c(bytearray(data))
    with pytest.raises(ValueError, match="negative"):
        elide.restore_c(b"", -1)
    with pytest.raises(TypeError):
        elide.elide_c("text")  # type: ignore[arg-type]
