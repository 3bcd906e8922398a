"""
The line scanner: one read of an agent's stdout, split into lines, with the runs of *plain*
``session/update`` notifications of one session found without decoding them.

Pure: no I/O, no trio. :func:`scan_reference` is the definition, in Python: it decodes each
line with the bridge's codec. ``acp_bridge.protocol.scanc`` (C, compiled by pip at install
time when a compiler is there; optional) does the same in one validating pass over the bytes
and is held equal to the reference by tests/protocol/test_scan.py. :data:`scan` is the C one
when it was built and the environment variable ``ACP_BRIDGE_PURE_SCAN`` is not ``1``; the
reference otherwise (:data:`ACCELERATED` says which).

A line is PLAIN (see :func:`plain_session`) when it decodes to a JSON-RPC 2.0
``session/update`` notification (no ``id``) whose ``params`` is an object with a string
``sessionId`` and an object ``update`` whose ``sessionUpdate`` is a string that is not one of
:data:`DECODED_KINDS` (setup updates, :data:`acp_bridge.protocol.jsonrpc.SETUP_UPDATES`, change
the session's recorded state; a ``notice`` is not history and goes only to clients that take
notices: the caller decodes those), and it holds no ``\\r`` but possibly as its last byte. The C
scanner is sound and may be conservative: it calls a line plain only if the reference does,
with the same session id; on what is rare (an escape in a key or in the values it reads, a
duplicate of a key it reads, numbers that could overflow a double) it says LINE and the
caller decodes that line as usual.

Segments, in order (a segment is a tuple, told apart by its first item):

- ``(RUN, start, end, count, sid)``: ``count`` consecutive plain lines of session ``sid``,
  the bytes ``block[start:end]`` (newlines included); runs are maximal (up to ``max_run``
  lines: a longer one comes as several, for the reader's turns), and a blank line,
  another session's update or any other line ends one.
- ``(LINE, start, end)``: any other line, ``block[start:end]`` without its newline (a ``\\r``
  before it is kept, as :class:`acp_bridge.protocol.framing.LineDecoder` keeps it).
- ``(OVERSIZE, size)``: a line longer than ``max_line`` bytes (``size`` without the newline),
  as LineDecoder's :class:`~acp_bridge.protocol.framing.Oversize`; the cap is checked first.

Blank lines (empty, or just ``\\r``) give nothing, as LineDecoder skips them.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from acp_bridge.protocol.jsonrpc import SETUP_UPDATES, JsonRpcError, loads
from acp_bridge.protocol.notices import NOTICE

if TYPE_CHECKING:
    from collections.abc import Callable

RUN: Final = 0
LINE: Final = 1
OVERSIZE: Final = 2

#: ``(RUN, start, end, count, sid)``, ``(LINE, start, end)`` or ``(OVERSIZE, size)``
Segment: TypeAlias = tuple[Any, ...]

#: The ``sessionUpdate`` kinds that are never plain: the caller decodes each such update
DECODED_KINDS: Final = SETUP_UPDATES | {NOTICE}


def plain_session(line: bytes) -> str | None:
    """The session id of a PLAIN line (see the module's notes), None for any other line."""
    if b"\r" in line[:-1]:
        return None  # (a run is split back into messages with splitlines)
    try:
        msg = loads(line)
    except JsonRpcError:
        return None
    if type(msg) is not dict:
        return None
    if msg.get("jsonrpc") != "2.0" or msg.get("method") != "session/update" or "id" in msg:
        return None
    params = msg.get("params")
    if type(params) is not dict:
        return None
    sid = params.get("sessionId")
    update = params.get("update")
    if type(sid) is not str or type(update) is not dict:
        return None
    kind = update.get("sessionUpdate")
    if type(kind) is not str or kind in DECODED_KINDS:
        return None
    return sid


def scan_reference(block: bytes, max_line: int, max_run: int = sys.maxsize) -> list[Segment]:
    """The segments of ``block`` (complete lines, each ending in ``\\n``), by the definition."""
    if block and not block.endswith(b"\n"):
        raise ValueError("the block must end with a newline")
    out: list[Segment] = []
    run: list[Any] | None = None  # [start, end, count, sid] of the run being grown
    start = 0
    for line in block.split(b"\n")[:-1]:
        end = start + len(line)
        sid = None
        if len(line) > max_line:
            segment: Segment | None = (OVERSIZE, len(line))
        elif not line or line == b"\r":
            segment = None
        else:
            sid = plain_session(line)
            segment = None if sid is not None else (LINE, start, end)
        if sid is not None and run is not None and run[3] == sid and run[2] < max_run:
            run[1] = end + 1
            run[2] += 1
        else:
            if run is not None:
                out.append((RUN, *run))
            run = [start, end + 1, 1, sid] if sid is not None else None
            if segment is not None:
                out.append(segment)
        start = end + 1
    if run is not None:
        out.append((RUN, *run))
    return out


#: The kinds that are never plain, as the C scanner takes them (UTF-8 bytes)
_SETUP_KINDS: Final = tuple(sorted(kind.encode() for kind in DECODED_KINDS))


def _load_c() -> Callable[[bytes, int, int], list[Segment]] | None:
    """The C scanner, or None when it was not built (no compiler at install time)."""
    try:
        from acp_bridge.protocol.scanc import scan as c_scan
    except ImportError:
        return None

    def scan_c(block: bytes, max_line: int, max_run: int = sys.maxsize) -> list[Segment]:
        return c_scan(block, max_line, _SETUP_KINDS, max_run)

    return scan_c


#: The C scanner when it was built (whatever ``ACP_BRIDGE_PURE_SCAN`` says), else None
scan_c: Final = _load_c()
#: The scanner to use: ``scan(block, max_line) -> list of segments``
scan: Final = (
    scan_reference if scan_c is None or os.environ.get("ACP_BRIDGE_PURE_SCAN") == "1" else scan_c
)
#: Whether :data:`scan` is the C scanner
ACCELERATED: Final = scan is not scan_reference
