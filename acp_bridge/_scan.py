"""
(Lead's stand-in until the C scanner lands: the pure-Python reference of ``scan``.)
"""

from __future__ import annotations

from typing import Final

from acp_bridge._jsonrpc import JsonRpcError, loads
from acp_bridge._routing import SETUP_UPDATES

RUN: Final = 0
LINE: Final = 1
OVERSIZE: Final = 2
ACCELERATED: Final = False


def _plain_sid(line: bytes) -> str | None:
    if b"\r" in line[:-1]:
        return None
    try:
        msg = loads(line)
    except JsonRpcError:
        return None
    if (
        type(msg) is not dict
        or msg.get("jsonrpc") != "2.0"
        or msg.get("method") != "session/update"
        or "id" in msg
    ):
        return None
    params = msg.get("params")
    if type(params) is not dict:
        return None
    sid = params.get("sessionId")
    update = params.get("update")
    if type(sid) is not str or type(update) is not dict:
        return None
    kind = update.get("sessionUpdate")
    if type(kind) is not str or kind in SETUP_UPDATES:
        return None
    return sid


def scan_reference(block: bytes, max_line: int) -> list[tuple]:  # type: ignore[type-arg]
    out: list[tuple] = []  # type: ignore[type-arg]
    start = 0
    run_sid: str | None = None
    run_start = run_count = 0
    size = len(block)
    while start < size:
        nl = block.index(b"\n", start)
        line = block[start:nl]
        sid = None
        if len(line) > max_line:
            kind = OVERSIZE
        elif not line or line == b"\r":
            kind = -1
        else:
            sid = _plain_sid(line)
            kind = RUN if sid is not None else LINE
        if run_sid is not None and (kind != RUN or sid != run_sid):
            out.append((RUN, run_start, start, run_count, run_sid))
            run_sid = None
        if kind == RUN:
            if run_sid is None:
                run_sid, run_start, run_count = sid, start, 0
            run_count += 1
        elif kind == LINE:
            out.append((LINE, start, nl))
        elif kind == OVERSIZE:
            out.append((OVERSIZE, len(line)))
        start = nl + 1
    if run_sid is not None:
        out.append((RUN, run_start, start, run_count, run_sid))
    return out


scan = scan_reference
