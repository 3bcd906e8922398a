"""acp-bridge: one ACP client, many ACP agents."""

from __future__ import annotations

__version__ = "0.1.0"
