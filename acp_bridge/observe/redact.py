"""
Redaction: secrets never appear in diagnostics (log notifications, logs, traces, errors).

Pure: no trio. The bridge registers what it knows to be secret: values of agents' ``env``
entries and of ``mcpServers`` env/headers whose names look secret, and the daemon's token.
Each bridge owns one :class:`Redactor` (``Bridge.redactor``); the command that runs it gives
the same one to the log processor and to the wire trace, so a secret the bridge registers is
hidden in all three. Nothing is shared between two bridges in one process.
Protocol messages themselves are never altered: an agent must still receive its MCP headers.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

#: Names whose values are secret (case-insensitive substring match).
SECRET_NAME: Final = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL|COOKIE", re.I)
#: Shorter values are not worth hiding (and would mangle ordinary text).
MIN_SECRET_LENGTH: Final = 6
#: Secrets remembered at most (each session's MCP headers add some; the oldest stay).
MAX_SECRETS: Final = 10_000
MASK: Final = "***"


class Redactor:
    """A growing set of secret strings, replaced by ``***`` wherever they appear."""

    __slots__ = ("_pattern", "_secrets")

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def __len__(self) -> int:
        return len(self._secrets)

    def add(self, value: object) -> None:
        if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH:
            return
        if value in self._secrets or len(self._secrets) >= MAX_SECRETS:
            return
        self._secrets.add(value)
        # Longest first, so a secret containing another is masked whole.
        ordered = sorted(self._secrets, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(s) for s in ordered))

    def add_env(self, env: Mapping[str, str]) -> None:
        """Values of environment entries whose names look secret."""
        for name, value in env.items():
            if SECRET_NAME.search(name):
                self.add(value)

    def add_mcp_servers(self, servers: object) -> None:
        """Secret-looking env values and headers of ``mcpServers`` (as ``session/new`` has them)."""
        if not isinstance(servers, list):
            return
        for server in servers:
            if not isinstance(server, dict):
                continue
            for key in ("env", "headers"):
                for entry in _pairs(server.get(key)):
                    name, value = entry
                    if SECRET_NAME.search(name):
                        self.add(value)
                        # "Bearer abc": the credential alone may appear elsewhere too.
                        if " " in value:
                            self.add(value.split(" ", 1)[1])

    def redact(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        return pattern.sub(MASK, text)

    def redact_json(self, value: Any) -> Any:
        """A copy of a JSON value with every string redacted."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redact_json(v) for v in value]
        if isinstance(value, dict):
            return {k: self.redact_json(v) for k, v in value.items()}
        return value


def _pairs(value: object) -> Iterable[tuple[str, str]]:
    """ACP's ``[{name, value}]`` lists (and plain objects, to be lenient)."""
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                name, val = item.get("name"), item.get("value")
                if isinstance(name, str) and isinstance(val, str):
                    yield name, val
    elif isinstance(value, dict):
        for name, val in value.items():
            if isinstance(name, str) and isinstance(val, str):
                yield name, val
