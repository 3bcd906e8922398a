"""
A journal run stored with each line's prefix shared with the line before elided (fewer
bytes for the journal to write). A session's updates share a long envelope
(``{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"…","update":{…``), so a
run of them shrinks to a fraction of its size (docs/performance.md, "The journal's runs
stored with shared prefixes elided").

Pure: no I/O, no trio. The format, for any bytes (not only JSON lines):

- The raw bytes are cut into lines: each up to and including a newline, and the *tail*, the
  bytes after the last newline when they do not end with one (never empty).
- Each line is one record: the length ``s`` of the prefix its content (the line without its
  newline) shares with the content of the line before (0 for the first line: every stored
  blob decodes alone), as an unsigned LEB128 varint of at most 9 bytes, minimal (no last
  byte 0 but a lone one); then the line's bytes after the first ``s``, its newline included.
  ``s`` is the whole shared prefix: the first byte after it differs from the line before's.

So every record is ``varint + rest`` with ``rest`` at least the newline (the tail: at least
one byte, or ``s`` > 0), and the encoding of given bytes is unique: :func:`restore_reference`
refuses whatever :func:`records_reference` cannot produce (a record cut short, ``s`` past the
line before, a prefix not whole, an empty tail, a varint not minimal or too long) and any
length but the one the index holds, and never writes past it.

The bound: a record is at most one byte more than its line (``s`` = 0: a one-byte varint; a
varint of ``s`` > 0 is never longer than the ``s`` bytes it stands for), so the encoded form
is at most the raw size plus one byte per line; :func:`elide` returns None unless it is
smaller than the raw bytes, and the store then keeps them as they are: a stored run is never
bigger than its bytes.

:func:`elide_reference` and :func:`restore_reference` are the definition, in Python;
``acp_bridge.protocol.scanc`` (the optional C extension, ``acp_bridge/protocol/scanc.c``) has
the same two, held equal to them by tests/store/test_elide.py. :func:`elide` is the C one, or,
without it (not built, or ``ACP_BRIDGE_PURE_SCAN=1``), one that elides nothing: in the
journal's writer thread the Python reference would cost more than the bytes it saves.
:func:`restore` is the C one or the reference.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

#: a varint is at most this many bytes (63 bits: more than any length)
MAX_VARINT: Final = 9


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def elide_reference(data: bytes) -> bytes | None:
    """``data`` with shared prefixes elided, or None when that is not smaller than ``data``."""
    out = records_reference(data)
    return out if len(out) < len(data) else None


def records_reference(data: bytes) -> bytes:
    """The records of ``data`` (see the module's notes), whatever their size."""
    out = bytearray()
    prev = b""
    at, size = 0, len(data)
    while at < size:
        newline = data.find(b"\n", at)
        end = size if newline < 0 else newline  # (the content: without the newline)
        content = data[at:end]
        shared = 0
        while shared < min(len(prev), len(content)) and prev[shared] == content[shared]:
            shared += 1
        out += _varint(shared)
        out += data[at + shared : size if newline < 0 else newline + 1]
        prev, at = content, size if newline < 0 else newline + 1
    return bytes(out)


def restore_reference(blob: bytes, size: int) -> bytes:
    """
    The ``size`` bytes ``blob`` holds elided. Raises ValueError when ``blob`` is not what
    :func:`elide_reference` makes of ``size`` bytes (see the module's notes).
    """
    out = bytearray()
    prev = b""
    at, end = 0, len(blob)
    while at < end:
        shared = shift = 0
        for count in range(1, MAX_VARINT + 1):
            if at >= end:
                raise ValueError("a record cut short in its prefix length")
            byte = blob[at]
            at += 1
            shared |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                if byte == 0 and count > 1:
                    raise ValueError("a prefix length not minimal")
                break
        else:
            raise ValueError("a prefix length of more than 9 bytes")
        if shared > len(prev):
            raise ValueError("a prefix longer than the line before")
        newline = blob.find(b"\n", at)
        stop = end if newline < 0 else newline + 1
        rest = blob[at:stop]
        content = blob[at : end if newline < 0 else newline]
        if shared < len(prev) and content and content[0] == prev[shared]:
            raise ValueError("a shared prefix not whole")
        if newline < 0 and shared + len(rest) == 0:
            raise ValueError("an empty last line")
        if len(out) + shared + len(rest) > size:
            raise ValueError("more bytes than the index says")
        prev = prev[:shared] + content
        out += prev if newline < 0 else prev + b"\n"
        at = stop
    if len(out) != size:
        raise ValueError("fewer bytes than the index says")
    return bytes(out)


def _elide_nothing(data: bytes) -> bytes | None:
    """Without the C extension: every run stored as it is (see the module's notes)."""
    return None


def _load_c() -> tuple[Callable[[bytes], bytes | None], Callable[[bytes, int], bytes]] | None:
    try:
        from acp_bridge.protocol.scanc import elide as c_elide
        from acp_bridge.protocol.scanc import restore as c_restore
    except ImportError:
        return None
    return c_elide, c_restore


_C: Final = _load_c()
#: The C functions when they were built (whatever ``ACP_BRIDGE_PURE_SCAN`` says), else None
elide_c: Final = _C[0] if _C is not None else None
restore_c: Final = _C[1] if _C is not None else None
#: Whether :data:`elide` and :data:`restore` are the C ones
ACCELERATED: Final = _C is not None and os.environ.get("ACP_BRIDGE_PURE_SCAN") != "1"
#: ``elide(data) -> bytes | None``: what the journal's writer stores (None: ``data`` itself)
elide: Final = _C[0] if _C is not None and ACCELERATED else _elide_nothing
#: ``restore(blob, size) -> bytes``: the run a stored blob holds (ValueError: corrupt)
restore: Final = _C[1] if _C is not None and ACCELERATED else restore_reference
