"""
Diagnostics, pure: the severities of the log channel (``_acp_bridge/log``, shaped after ACP
RFD #392) and the level an agent's stderr line announces.
"""

from __future__ import annotations

import re
from typing import Final

#: RFC 5424 severities, as ACP RFD #392 names them, lowest first
LOG_LEVELS: Final = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
LEVEL_RANK: Final = {name: rank for rank, name in enumerate(LOG_LEVELS)}
#: agent diagnostics relayed as notifications: a token bucket per agent (lines per second,
#: burst); what it holds back is counted and summarized ("N lines suppressed") a second later
LOG_RATE: Final = 50.0
LOG_BURST: Final = 200.0
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


def guess_level(line: str) -> str:
    """The severity an agent's stderr line announces (``info`` when it says none)."""
    head = line[:120]
    found = _LEVEL_BARE.match(head) or _LEVEL_MARKED.search(head)
    return _LEVEL_OF_WORD[found.group(1).lower()] if found else "info"


__all__ = ["LEVEL_RANK", "LOG_BURST", "LOG_LEVELS", "LOG_RATE", "guess_level"]
