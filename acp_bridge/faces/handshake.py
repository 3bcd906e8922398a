"""
The WebSocket upgrade's own rules, pure: the form of an upgrade request, the connection cap,
the first message, and the text frames the face writes.

The daemon's listener (``faces.listener_core``) checks ``Host``, path and method of every
request first; for the ACP path, :func:`check_upgrade` then asks for ``Upgrade: websocket``
(**426**) and a well-formed upgrade (**400**), before ``Origin`` and the token. A request
that passed them all is accepted unless ``max_connections`` are open (:data:`TOO_MANY`:
**503**). After the upgrade the first message must be ``initialize`` (:func:`is_initialize`),
and the bridge's messages go out as text frames the face builds itself (:func:`text_frames`).

Pure: no trio, no socket, no clock (fenced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import struct
from typing import Final

from acp_bridge.http.wire import RequestHead, Response, plain
from acp_bridge.protocol.jsonrpc import JsonRpcError, loads

__all__ = ["TOO_MANY", "check_upgrade", "is_initialize", "text_frames"]

#: The answer to an upgrade past ``max_connections``.
TOO_MANY: Final = plain(503, "too many connections", (("Retry-After", "5"),))


def check_upgrade(head: RequestHead) -> Response | None:
    """The refusal of a request that is not a well-formed WebSocket upgrade; None if it is."""
    if "websocket" not in head.tokens("upgrade"):
        return plain(426, "WebSocket upgrade required", (("Upgrade", "websocket"),))
    if head.http_version != "1.1" or "upgrade" not in head.tokens("connection"):
        return plain(400, "malformed WebSocket upgrade")
    if head.values("sec-websocket-version") != ["13"]:
        return plain(426, "unsupported WebSocket version", (("Sec-WebSocket-Version", "13"),))
    if len(head.values("sec-websocket-key")) != 1:
        return plain(400, "malformed WebSocket upgrade")
    return None


def is_initialize(message: str) -> bool:
    """Whether a text message is a JSON object with ``"method": "initialize"``. Pure."""
    try:
        msg = loads(message)
    except JsonRpcError:
        return False
    return isinstance(msg, dict) and msg.get("method") == "initialize"


def text_frames(messages: list[bytes]) -> bytes:
    """
    RFC 6455 server frames: each message (with a trailing newline, which is dropped) as one
    final, unmasked text frame. The payload must be UTF-8 (the bridge relays only what it
    decoded as JSON, and encodes UTF-8). No extension is ever negotiated, so RSV bits are 0.
    """
    parts: list[bytes | memoryview] = []
    for message in messages:
        n = len(message) - 1
        if n < 126:
            parts.append(bytes((0x81, n)))
        elif n < 1 << 16:
            parts.append(struct.pack("!BBH", 0x81, 126, n))
        else:
            parts.append(struct.pack("!BBQ", 0x81, 127, n))
        parts.append(memoryview(message)[:n])
    return b"".join(parts)
