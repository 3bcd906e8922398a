"""
The line scanner's cost per line: ``acp_bridge.protocol.scan``'s C scanner, its pure-Python
reference, and decoding every line instead (LineDecoder plus one ``protocol.jsonrpc.loads``
per line), on one realistic read of an agent's stdout.

    python -m bench.scan [--lines N] [--repeat R]

The block: N ``session/update`` lines as agents write them (orjson-compact, 150-250 bytes:
message chunks with text of varying length, escapes and non-ASCII, and tool-call updates),
runs of one session broken now and then by another session's update. Prints ns per line,
the best of R timings of each (the least disturbed by the machine's other load).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import TYPE_CHECKING

import orjson

from acp_bridge.protocol import scan
from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.protocol.jsonrpc import loads

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_LINE = 16 * 1024 * 1024


def realistic_block(lines: int, seed: int = 1) -> bytes:
    """``lines`` update lines of 150-250 bytes, mostly one session at a time."""
    rng = random.Random(seed)
    words = ["the", "bridge", "relays", "naïve", "line", "scan", 'a "quote"', "tab\there", "→"]
    out = []
    sid = "sess_4f2a9c"
    for n in range(lines):
        if rng.random() < 0.05:
            sid = rng.choice(["sess_4f2a9c", "sess_77b1e0", "sess_0c33d5"])
        text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        if n % 7 == 0:
            update: dict[str, object] = {
                "sessionUpdate": "tool_call_update",
                "toolCallId": f"call_{n}",
                "status": "in_progress",
                "content": [{"type": "content", "content": {"type": "text", "text": text}}],
            }
        else:
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            }
        params = {"sessionId": sid, "update": update}
        msg = {"jsonrpc": "2.0", "method": "session/update", "params": params}
        out.append(orjson.dumps(msg) + b"\n")
    return b"".join(out)


def per_line_loads(block: bytes) -> None:
    """The way without a scanner: split the read, then decode every line."""
    for line in LineDecoder(max_line_bytes=MAX_LINE).feed(block):
        if type(line) is bytes:
            loads(line)


def best_ns(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    block = realistic_block(args.lines)
    n = args.lines
    print(f"{n} lines, {len(block) / n:.0f} bytes per line on average")
    if scan.scan_c is not None:
        scan_c = scan.scan_c
        whole = sys.maxsize  # (no cut into runs: the scan alone)
        assert scan_c(block, MAX_LINE, whole) == scan.scan_reference(block, MAX_LINE)
        c = best_ns(lambda: scan_c(block, MAX_LINE, whole), args.repeat)
        print(f"C scanner:          {c / n:8.1f} ns/line")
    else:
        print("C scanner:          not built (no compiler at install time)")
    ref = best_ns(lambda: scan.scan_reference(block, MAX_LINE), max(3, args.repeat // 5))
    print(f"reference scanner:  {ref / n:8.1f} ns/line")
    old = best_ns(lambda: per_line_loads(block), max(3, args.repeat // 5))
    print(f"per-line loads:     {old / n:8.1f} ns/line")


if __name__ == "__main__":
    main()
