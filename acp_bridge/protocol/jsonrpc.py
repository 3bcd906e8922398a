"""
JSON-RPC 2.0 for ACP: the codec, message classification and error constructors.

Pure: no I/O, no trio. Messages stay plain dicts (the raw JSON) so that ``_meta``, unknown
fields and unknown enum values survive the trip through the bridge untouched.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any, Final, TypeAlias

import orjson

#: A decoded JSON object (a JSON-RPC message, params or result).
JsonObject: TypeAlias = dict[str, Any]
#: A JSON-RPC id: the type the peer used (number or string; null only in some error replies).
JsonRpcId: TypeAlias = int | float | str | None

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800
AUTH_REQUIRED: Final = -32000
RESOURCE_NOT_FOUND: Final = -32002
#: The bridge's own "server error" range code for an agent that is down or failed.
AGENT_UNAVAILABLE: Final = -32003

#: JSON texts nested deeper than this are refused (serde_json's limit): deeper ones would hit
#: Python's recursion limit when the bridge encodes them again
MAX_DEPTH: Final = 128


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


# The reference codec: the standard library's, with its rules. NaN, Infinity and numbers
# beyond a double are refused: they could not be encoded again.
_decoder = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

# The fast codec (orjson, several times the standard library's speed: it is on the hot
# path) is tried first. It accepts a subset of what the reference codec accepts, with the
# same values, except integers beyond 64 bits (it makes them floats): a text with a run of
# 19 digits anywhere goes to the reference codec. Whatever the fast codec refuses (a lone
# surrogate, a BOM, huge numbers, nesting past its limit) is decided by the reference
# codec, so what is accepted, and the values, are exactly the reference codec's. One
# ``translate`` pass finds the digit runs and counts the brackets for the depth check (a
# regex costs more than the parse itself).
_fast_loads = orjson.loads
_fast_dumps = orjson.dumps
_FAST_ERROR = orjson.JSONDecodeError
#: digits → "0", "[" and "{" → "[", anything else → " "
_SHAPE = bytes(48 if 48 <= b <= 57 else 91 if b in (91, 123) else 32 for b in range(256))
_LONG_DIGITS = b"0" * 19
_NEWLINE = orjson.OPT_APPEND_NEWLINE


class Kind(enum.Enum):
    """What a decoded message is."""

    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"
    INVALID = "invalid"


class JsonRpcError(Exception):
    """
    An error to send back as a JSON-RPC error object.

    Named constructors follow the ACP SDK's (``parse_error()``, ``method_not_found(m)``...).
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_error(self) -> JsonObject:
        err: JsonObject = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err

    @classmethod
    def parse_error(cls, detail: str | None = None) -> JsonRpcError:
        return cls(
            PARSE_ERROR, _said("Parse error", detail), {"detail": detail} if detail else None
        )

    @classmethod
    def invalid_request(cls, detail: str | None = None) -> JsonRpcError:
        return cls(
            INVALID_REQUEST,
            _said("Invalid request", detail),
            {"detail": detail} if detail else None,
        )

    @classmethod
    def method_not_found(cls, method: str, detail: str | None = None) -> JsonRpcError:
        data: JsonObject = {"method": method}
        if detail:
            data["detail"] = detail
        return cls(METHOD_NOT_FOUND, _said("Method not found", detail or method), data)

    @classmethod
    def invalid_params(cls, detail: str) -> JsonRpcError:
        return cls(INVALID_PARAMS, _said("Invalid params", detail), {"detail": detail})

    @classmethod
    def internal_error(cls, detail: str | None = None, **data: Any) -> JsonRpcError:
        payload: JsonObject = dict(data)
        if detail:
            payload["detail"] = detail
        return cls(INTERNAL_ERROR, "Internal error", payload or None)

    @classmethod
    def cancelled(cls, detail: str | None = None) -> JsonRpcError:
        return cls(REQUEST_CANCELLED, "Request cancelled", {"detail": detail} if detail else None)

    @classmethod
    def resource_not_found(cls, detail: str) -> JsonRpcError:
        return cls(RESOURCE_NOT_FOUND, _said("Resource not found", detail), {"detail": detail})


def _said(name: str, detail: str | None) -> str:
    """An error message that carries its detail: "Invalid params: cwd must be absolute"."""
    return f"{name}: {detail}" if detail else name


def loads(line: bytes | str) -> Any:
    """Decode one JSON text; raises :class:`JsonRpcError` (parse error) on bad input."""
    if type(line) is bytes:
        shape = line.translate(_SHAPE)
        if _LONG_DIGITS not in shape:
            try:
                value = _fast_loads(line)
            except _FAST_ERROR:
                pass  # the reference codec decides, and says why
            else:
                # (no more than MAX_DEPTH brackets in all cannot nest deeper: a cheap count)
                if (
                    len(line) > 2 * MAX_DEPTH
                    and shape.count(b"[") > MAX_DEPTH
                    and _deeper_than(value, MAX_DEPTH)
                ):
                    raise JsonRpcError.parse_error(f"nested deeper than {MAX_DEPTH}")
                return value
    return _reference_loads(line)


def _reference_loads(line: bytes | str) -> Any:
    try:
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        value = _decoder.decode(line)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise JsonRpcError.parse_error(type(exc).__name__) from None
    if line.count("[") + line.count("{") > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise JsonRpcError.parse_error(f"nested deeper than {MAX_DEPTH}")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value nests arrays and objects more than ``limit`` deep."""
    level = [value] if type(value) in (dict, list) else []
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if type(node) is dict else node)
            if type(child) in (dict, list)
        ]
        if not level:
            return False
    return True


def dumps(msg: Any) -> bytes:
    """
    Encode one message as a compact JSON line, newline included.

    A lone surrogate (JSON ``"\\ud800"`` decodes to one) is written back as the same escape.
    """
    try:
        return _fast_dumps(msg, option=_NEWLINE)
    except TypeError:
        # (orjson refuses lone surrogates, integers beyond 64 bits, non-str keys)
        return (_encoder.encode(msg) + "\n").encode("utf-8", "backslashreplace")


_SESSION_KEY = b'"sessionId"'


def rewrite_session_id(line: bytes, old: str, new: str) -> bytes | None:
    """
    ``line`` (one JSON message whose ``params.sessionId`` is ``old``) with that value made
    ``new``, every other byte kept; None when that cannot be done safely on the bytes, and
    the caller encodes the message again.

    Safe means: no ``\\u`` escape anywhere (so every member named sessionId is spelt
    ``"sessionId"``), that spelling exactly once (so it is the member of ``params``, which
    the caller knows is there), and written compactly as ``"sessionId":"old"``. (The
    spelling followed by a colon is a member name: a string value is never followed by one.)
    """
    if b"\\u" in line or line.count(_SESSION_KEY) != 1:
        return None
    member = _SESSION_KEY + b":" + _fast_dumps(old)
    if member not in line:
        return None
    return line.replace(member, _SESSION_KEY + b":" + _fast_dumps(new), 1)


def rewrite_run_session_id(data: bytes, count: int, old: str, new: str) -> bytes | None:
    """
    :func:`rewrite_session_id` for ``count`` whole lines at once (a run of one session's
    updates, each with ``params.sessionId`` ``old``); None when any of them cannot be done
    safely on the bytes. Each line holds the spelling ``"sessionId"`` at least once (its
    member of ``params``), so as many of them as lines means exactly one each, and as many
    compact ``"sessionId":"old"`` members means that one is it, in every line.
    """
    if b"\\u" in data or data.count(_SESSION_KEY) != count:
        return None
    member = _SESSION_KEY + b":" + _fast_dumps(old)
    if data.count(member) != count:
        return None
    return data.replace(member, _SESSION_KEY + b":" + _fast_dumps(new))


def classify(msg: Any) -> Kind:
    """
    Classify a decoded JSON value as a JSON-RPC 2.0 message.

    Only the envelope is checked; params and results are the peers' business.
    """
    if type(msg) is not dict or msg.get("jsonrpc") != "2.0":
        return Kind.INVALID
    method = msg.get("method")
    if method is not None:
        if type(method) is not str:
            return Kind.INVALID
        params = msg.get("params")
        if params is not None and type(params) not in (dict, list):
            return Kind.INVALID
        if "id" not in msg:
            return Kind.NOTIFICATION
        return Kind.REQUEST if is_valid_id(msg["id"]) else Kind.INVALID
    if "id" in msg and (("result" in msg) != ("error" in msg)):
        return Kind.RESPONSE if is_valid_id(msg["id"]) or msg["id"] is None else Kind.INVALID
    return Kind.INVALID


def is_valid_id(value: Any) -> bool:
    """A request id we accept: a string or an integer (JSON-RPC discourages fractions)."""
    t = type(value)
    return t is str or t is int


def request(id_: JsonRpcId, method: str, params: Any = None) -> JsonObject:
    msg: JsonObject = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def notification(method: str, params: Any = None) -> JsonObject:
    msg: JsonObject = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def result(id_: JsonRpcId, value: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": id_, "result": value}


def error(id_: JsonRpcId, err: JsonRpcError) -> JsonObject:
    return {"jsonrpc": "2.0", "id": id_, "error": err.to_error()}


def params_of(msg: JsonObject) -> JsonObject:
    """The params object of a request or notification ({} when absent or not an object)."""
    params = msg.get("params")
    return params if type(params) is dict else {}


#: session updates that change a session's recorded state (its mode, options, title)
SETUP_UPDATES: Final = frozenset(
    {"current_mode_update", "config_option_update", "session_info_update"}
)
