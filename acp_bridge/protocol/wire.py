"""
The bridge's own wire extensions, pure: ``_meta.acp_bridge`` read and stamped, the errors the
bridge answers with, ids read from peers' messages, and its ``session/list`` cursors.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

from acp_bridge.protocol.jsonrpc import (
    INTERNAL_ERROR,
    JsonObject,
    JsonRpcError,
    JsonRpcId,
    dumps,
    loads,
)

PROTOCOL_VERSION: Final = 1

#: What ACP defines as notifications a client sends (no answer expected). One sent as a
#: request (with an ``id``) still takes effect, and is then answered ``null``: JSON-RPC owes
#: every request one answer, and the notification's effect is all there is to it.
CLIENT_NOTIFICATIONS: Final = frozenset({"session/cancel", "$/cancel_request"})

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


def bridge_meta(params: object) -> JsonObject:
    """``params._meta.acp_bridge`` (the bridge's own wire extensions), or {} (also when
    ``params`` is no object: a peer's JSON may put anything there)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    ours = meta.get("acp_bridge") if isinstance(meta, dict) else None
    return ours if isinstance(ours, dict) else {}


def set_seq(params: JsonObject, seq: int) -> None:
    """Stamp ``_meta.acp_bridge.seq`` on a session/update, keeping any other _meta."""
    meta = params.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    ours = meta.get("acp_bridge")
    meta["acp_bridge"] = {**ours, "seq": seq} if isinstance(ours, dict) else {"seq": seq}
    params["_meta"] = meta


def stamp_run(data: bytes, first: int) -> bytes:
    """
    A run of updates (whole lines) with ``_meta.acp_bridge.seq`` stamped on each, numbered
    from ``first`` (0: none of them numbered, each stamped 0), as a client that asked for the
    numbers gets them.
    """
    out = []
    for i, line in enumerate(data.split(b"\n")[:-1]):
        msg = loads(line)
        set_seq(msg["params"], first + i if first else 0)
        out.append(dumps(msg))
    return b"".join(out)


def attached_elsewhere(sid: str) -> JsonRpcError:
    """The refusal of a request about a session another connection owns (-32002)."""
    return JsonRpcError.resource_not_found(
        f"session {sid!r} is attached elsewhere (another connection owns it); "
        "take it over with session/resume or session/load"
    )


#: how a watcher takes a session over (in every refusal of what only the owner may do)
TAKE_OVER_HINT: Final = "send session/load without _meta.acp_bridge.watch to take it over"


def watching_only(sid: str, method: str) -> JsonRpcError:
    """The refusal of what a watcher (``_meta.acp_bridge.watch``) asks of a session (-32002)."""
    return JsonRpcError.resource_not_found(
        f"{method} refused: this connection watches session {sid!r} without owning it; "
        + TAKE_OVER_HINT
    )


def well_formed_error(msg: JsonObject) -> None:
    """A peer's error that is not one (an integer code and a message) is relayed as -32603."""
    err = msg.get("error")
    if "error" not in msg or (
        type(err) is dict and type(err.get("code")) is int and type(err.get("message")) is str
    ):
        return
    msg["error"] = JsonRpcError(
        INTERNAL_ERROR, "Internal error: the peer answered with a malformed error", {"error": err}
    ).to_error()


def is_id(value: object) -> bool:
    """A string or an integer: usable as a key (a peer's JSON may put a list anywhere)."""
    return type(value) in (int, str)


def id_of(msg: Any) -> JsonRpcId:
    if isinstance(msg, dict):
        value = msg.get("id")
        if type(value) in (int, str):
            return value
    return None


def encode_cursor(agent_index: int, cursor: str | None) -> str:
    raw = dumps({"a": agent_index, "c": cursor}).rstrip(b"\n")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_cursor(cursor: object) -> tuple[int, str | None]:
    if not isinstance(cursor, str):
        raise JsonRpcError.invalid_params("cursor must be a string")
    try:
        value = loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (binascii.Error, ValueError, JsonRpcError):
        raise JsonRpcError.invalid_params("unknown cursor") from None
    if not isinstance(value, dict):
        raise JsonRpcError.invalid_params("unknown cursor")
    index, inner = value.get("a"), value.get("c")
    if type(index) is not int or index < 0 or not (inner is None or isinstance(inner, str)):
        raise JsonRpcError.invalid_params("unknown cursor")
    return index, inner


__all__ = [
    "CLIENT_NOTIFICATIONS",
    "PROTOCOL_VERSION",
    "TAKE_OVER_HINT",
    "attached_elsewhere",
    "bridge_meta",
    "decode_cursor",
    "encode_cursor",
    "id_of",
    "is_id",
    "set_seq",
    "watching_only",
    "well_formed_error",
]
