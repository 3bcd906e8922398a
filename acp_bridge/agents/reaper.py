"""
The reaper: a tiny watchdog process that kills the bridge's agents if the bridge dies.

The bridge starts it once (``python -m acp_bridge.agents.reaper``) in a session of its own,
and tells it on stdin about every agent process group: ``+PGID`` when one starts, ``-PGID``
when it has been reaped. When its stdin reaches EOF (the bridge exited, however abruptly:
even SIGKILL closes the pipe), it sends SIGTERM to every group still registered, waits
briefly, then SIGKILL. Agents run in their own process group, so their children
(grandchildren of the bridge) go with them.

Stdlib only, no trio: it must start fast and hold no state but a set of integers.
"""

from __future__ import annotations

import os
import signal
import sys
import time

#: how long agents get between SIGTERM and SIGKILL after the bridge died
TERM_GRACE = 1.0


def _signal_groups(groups: set[int], sig: int) -> set[int]:
    alive = set()
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
            alive.add(pgid)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass
    return alive


def _any_alive(groups: set[int]) -> bool:
    for pgid in groups:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def main() -> int:
    # Terminal signals aimed at the bridge's group must not take the watchdog with it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if len(line) < 2:
            continue
        try:
            pgid = int(line[1:])
        except ValueError:
            continue
        if pgid <= 1:
            continue
        if line[:1] == b"+":
            groups.add(pgid)
        elif line[:1] == b"-":
            groups.discard(pgid)
    if not groups:
        return 0
    groups = _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE
    while groups and time.monotonic() < deadline and _any_alive(groups):
        time.sleep(0.02)
    _signal_groups(groups, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
