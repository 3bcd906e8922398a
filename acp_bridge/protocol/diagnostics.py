"""
Diagnostics, pure: the severities of the log channel (``_acp_bridge/log``, shaped after ACP
RFD #392), the one shape of its notifications, the per-agent rate budget, and the level an
agent's stderr line announces.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

import attrs

# (defined with the wire extensions: the stdlib phase of ``acp-bridge stdio`` reads them)
from acp_bridge.protocol.wire import LEVEL_RANK as LEVEL_RANK
from acp_bridge.protocol.wire import LOG_LEVELS as LOG_LEVELS

if TYPE_CHECKING:
    from collections.abc import Mapping

#: agent diagnostics relayed as notifications: a token bucket per agent (lines per second,
#: burst); what it holds back is counted and summarized ("N lines suppressed") a second later
LOG_RATE: Final = 50.0
LOG_BURST: Final = 200.0
#: the log channel's notification method (a bridge extension: the ``_`` prefix)
LOG_METHOD: Final = "_acp_bridge/log"
#: level words an agent's stderr line may start with (bare, in capitals)...
_LEVEL_BARE: Final = re.compile(
    r"^\W{0,3}(?:[\d:.TZ+-]+\s+)?(TRACE|DEBUG|INFO|NOTICE|WARN(?:ING)?|ERR(?:OR)?|FATAL|"
    r"CRIT(?:ICAL)?|PANIC|ALERT|EMERG(?:ENCY)?)\b"
)
#: ...or marked anywhere near the start: [debug], <warn>, level=info, "level":"error"
_LEVEL_MARKED: Final = re.compile(
    r"(?:\[|<|level\"?\s*[=:]\s*\"?)(trace|debug|info|notice|warn(?:ing)?|err(?:or)?|fatal|"
    r"crit(?:ical)?|panic|alert|emerg(?:ency)?)\b",
    re.IGNORECASE,
)
_LEVEL_OF_WORD: Final = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "notice": "notice",
    "warn": "warning",
    "warning": "warning",
    "err": "error",
    "error": "error",
    "fatal": "critical",
    "crit": "critical",
    "critical": "critical",
    "panic": "emergency",
    "alert": "alert",
    "emerg": "emergency",
    "emergency": "emergency",
}


def log_params(
    level: str,
    message: str,
    *,
    logger: str = "acp_bridge",
    session_id: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """
    The params of one ``_acp_bridge/log`` notification: ``level``, ``logger`` (``acp_bridge``
    for the bridge's own events, ``agent.<name>`` for an agent's output), ``sessionId`` when it
    is about one session, and ``data`` (``message`` first, then ``data``'s fields).
    """
    params: dict[str, Any] = {"level": level, "logger": logger}
    if session_id is not None:
        params["sessionId"] = session_id
    params["data"] = {"message": message, **data} if data else {"message": message}
    return params


@attrs.define
class LogBudget:
    """
    One agent's budget of diagnostic lines: a token bucket of ``burst`` lines refilled at
    ``rate`` a second (clock given: ``now`` in seconds, any monotonic origin). At the bound a
    line is held back and counted in ``suppressed``, for a summary the caller sends later.
    """

    rate: float = LOG_RATE
    burst: float = LOG_BURST
    tokens: float = attrs.field(default=attrs.Factory(lambda self: self.burst, takes_self=True))
    #: when ``tokens`` was last brought up to date
    stamp: float = 0.0
    #: lines held back since the last :meth:`take_suppressed`
    suppressed: int = 0

    def take(self, now: float) -> bool:
        """One line at ``now``: True if it may go; False if it is held back (and counted)."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        """The lines held back since the last call (the count starts again at 0)."""
        count, self.suppressed = self.suppressed, 0
        return count


def guess_level(line: str) -> str:
    """The severity an agent's stderr line announces (``info`` when it says none)."""
    head = line[:120]
    found = _LEVEL_BARE.match(head) or _LEVEL_MARKED.search(head)
    return _LEVEL_OF_WORD[found.group(1).lower()] if found else "info"


__all__ = [
    "LEVEL_RANK",
    "LOG_BURST",
    "LOG_LEVELS",
    "LOG_METHOD",
    "LOG_RATE",
    "LogBudget",
    "guess_level",
    "log_params",
]
