"""
When a dead agent may start again: the restart backoff and the crash-loop rule. Pure: the
caller gives the time (``now``, any monotonic clock; the bridge uses trio's).

An agent that died ``n`` times within the last ``window`` seconds waits
``initial * 2 ** (n - 1)`` seconds (at most ``maximum``) before its next start; at ``limit``
deaths in the window it is not started at all (:class:`CrashLoop`) until the oldest of them is
``window`` seconds old. A start is attempted only when something needs the agent (the next
``session/new``), so a crash-looping agent costs nothing while it is refused.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from acp_bridge.config.model import BridgeConfig

__all__ = ["MAX_DEATHS", "CrashLoop", "Restarts"]

#: Deaths remembered per agent (the oldest are forgotten): a ``limit`` above it never trips.
MAX_DEATHS: Final = 64


@attrs.frozen
class CrashLoop:
    """The verdict: ``deaths`` deaths within ``window`` seconds, no restart for now."""

    deaths: int
    window: float


@attrs.define(slots=True)
class Restarts:
    """One agent's recent deaths, and the rule that spaces its restarts."""

    initial: float
    maximum: float
    limit: int
    window: float
    _deaths: deque[float] = attrs.field(factory=lambda: deque(maxlen=MAX_DEATHS), init=False)

    @classmethod
    def from_config(cls, bridge: BridgeConfig) -> Restarts:
        """The rule of the ``[bridge]`` table (``restart_backoff_*``, ``crash_loop_*``)."""
        return cls(
            initial=bridge.restart_backoff_initial,
            maximum=bridge.restart_backoff_max,
            limit=bridge.crash_loop_limit,
            window=bridge.crash_loop_window,
        )

    def died(self, now: float) -> None:
        """The agent died (or failed to start) at ``now``."""
        self._deaths.append(now)

    def next_start(self, now: float, *, dying: bool = False) -> float | CrashLoop:
        """
        Seconds to wait before starting it at ``now`` (0.0: at once), or :class:`CrashLoop`;
        ``dying``: as if it died at ``now`` too (what its death, not yet recorded, will mean).
        """
        recent = sum(1 for t in self._deaths if now - t < self.window) + dying
        if recent >= self.limit:
            return CrashLoop(deaths=recent, window=self.window)
        if not recent:
            return 0.0
        return float(min(self.initial * 2 ** (recent - 1), self.maximum))
