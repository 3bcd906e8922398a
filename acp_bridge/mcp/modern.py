"""
MCP 2026-07-28, sans I/O: the revision MCP over ACP carries (the only one the TypeScript SDK's
binding speaks), for the two places the bridge meets it:

- the bridge's own server over ACP: each request carries its protocol version and client
  capabilities in ``params._meta`` (no ``initialize``; ``server/discover`` says what the
  server is), and every result says ``resultType`` (:func:`envelope_error`,
  :func:`discover_result`, :func:`complete`);
- a client's ``acp`` server re-exported to an agent that speaks only HTTP MCP: each POST is one
  request (:func:`export_head` and :func:`export_request` check it as the SDK's
  ``McpOverAcpHttpBridge`` does: routing headers that match the body, no batches,
  notifications or ``initialize``), its answer JSON, or server-sent events when notifications
  come first (:func:`answer`, :func:`sse`).

The re-export also translates for an HTTP MCP client of an earlier revision (the ``initialize``
handshake, :data:`HANDSHAKE_VERSIONS`: what most agents' MCP clients speak today), which the
SDK's does not: its ``initialize`` is answered from the server's ``server/discover``
(:func:`handshake_answer`), ``ping`` and notifications here, and each other request goes on
with the envelope the revision requires, the capabilities its ``initialize`` named
(:func:`export_request`); a result loses what only the revision has, and one asking for more
input, which the earlier revisions cannot carry, is an error (:func:`answer`).

Pure: no trio, no socket.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any, Final

import attrs
import orjson

from acp_bridge.http.wire import Response, body_framing

if TYPE_CHECKING:
    from acp_bridge.http.wire import RequestHead
    from acp_bridge.protocol.jsonrpc import JsonObject

__all__ = [
    "HANDSHAKE_VERSIONS",
    "HEADER_MISMATCH",
    "MODERN_VERSION",
    "UNSUPPORTED_VERSION",
    "Cancelled",
    "ExportRequest",
    "Initialize",
    "answer",
    "binding_error",
    "complete",
    "discover_result",
    "envelope_error",
    "export_head",
    "export_request",
    "handshake_answer",
    "rewrite_notification",
    "sse",
    "strip_header_annotations",
    "with_envelope",
]

#: The revision: its requests carry it in ``params._meta``.
MODERN_VERSION: Final = "2026-07-28"
#: The revisions of the ``initialize`` handshake, newest first.
HANDSHAKE_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
META_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION: Final = "io.modelcontextprotocol/subscriptionId"
#: A routing header that disagrees with the body.
HEADER_MISMATCH: Final = -32020
#: A protocol version the server does not speak (``data``: supported and requested).
UNSUPPORTED_VERSION: Final = -32022
#: The most a re-exported request's body may be (the SDK's re-export takes 1 MiB).
MAX_EXPORT_BODY: Final = 4 * 1024 * 1024
#: Methods whose ``Mcp-Name`` header mirrors a param, and which param.
NAMED: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

_JSON: Final = "application/json"


# ----------------------------------------------------------------------------- a server


def envelope_error(params: JsonObject | None) -> JsonObject | None:
    """
    The inner error for a request whose ``_meta`` lacks what the revision requires (the
    binding answers it as an MCP outcome, not an ACP error); None when it is complete.
    """
    meta = params.get("_meta") if isinstance(params, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    version = meta.get(META_VERSION)
    if not isinstance(version, str):
        return {
            "code": -32602,
            "message": f"Invalid params: missing {META_VERSION} in params._meta",
        }
    if version != MODERN_VERSION:
        return {
            "code": UNSUPPORTED_VERSION,
            "message": "Unsupported protocol version",
            "data": {"supported": [MODERN_VERSION], "requested": version},
        }
    if not isinstance(meta.get(META_CAPABILITIES), dict):
        return {
            "code": -32602,
            "message": f"Invalid params: missing {META_CAPABILITIES} in params._meta",
        }
    return None


def complete(result: JsonObject, server_info: JsonObject | None = None) -> JsonObject:
    """A result as the revision has it: ``resultType`` said, the server named in ``_meta``."""
    out = {**result, "resultType": "complete"}
    if server_info is not None:
        meta = out.get("_meta")
        out["_meta"] = {**(meta if isinstance(meta, dict) else {}), META_SERVER_INFO: server_info}
    return out


def discover_result(
    capabilities: JsonObject, server_info: JsonObject, instructions: str | None = None
) -> JsonObject:
    """``server/discover``'s answer: this revision only; not to be cached across sessions."""
    result: JsonObject = {
        "supportedVersions": [MODERN_VERSION],
        "capabilities": capabilities,
        "cacheScope": "private",
        "ttlMs": 0,
    }
    if instructions:
        result["instructions"] = instructions
    return complete(result, server_info)


# ----------------------------------------------------------------------------- re-export


@attrs.frozen
class ExportRequest:
    """
    A POSTed request that passed: its JSON-RPC id, method and params (with the revision's
    envelope); ``handshake``: from a client of an earlier revision, answered as one.
    """

    id: str | int
    method: str
    params: JsonObject | None
    handshake: bool = False


@attrs.frozen
class Initialize:
    """An ``initialize`` of a client of an earlier revision: the version to answer, and the
    capabilities it named (each of its later requests carries them on)."""

    id: str | int
    version: str
    capabilities: JsonObject


@attrs.frozen
class Cancelled:
    """``notifications/cancelled`` of a client of an earlier revision: its request ``id``."""

    id: object


def _error_body(request_id: object, code: int, message: str, data: Any = None) -> JsonObject:
    error: JsonObject = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body: JsonObject = {"jsonrpc": "2.0"}
    if request_id is not None:
        body["id"] = request_id
    body["error"] = error
    return body


def _refuse(
    status: int,
    request_id: object,
    code: int,
    message: str,
    data: Any = None,
    headers: tuple[tuple[str, str], ...] = (),
    *,
    status_ok: bool = False,
) -> Response:
    body = orjson.dumps(_error_body(request_id, code, message, data))
    return Response(200 if status_ok else status, body, headers, _JSON)


def export_head(head: RequestHead) -> Response | None:
    """
    A re-exported server's POST, before its body is read (``Host``, ``Origin``, path, method
    and token are the site's): one of each routing header, a client that takes JSON and
    server-sent events, a JSON body of a size the framing states.
    """
    for name in ("origin", "authorization", "mcp-protocol-version", "mcp-method", "mcp-name"):
        if len(head.values(name)) > 1:
            return _refuse(400, None, HEADER_MISMATCH, "HeaderMismatch: duplicate routing header")
    accepted = {
        item.split(";")[0].strip().lower()
        for value in head.values("accept")
        for item in value.split(",")
    }
    if not {"application/json", "text/event-stream"} <= accepted:
        return _refuse(
            406, None, -32600, "Accept must include application/json and text/event-stream"
        )
    kind = (head.values("content-type") or [""])[0].split(";")[0].strip().lower()
    if kind != _JSON:
        return _refuse(415, None, -32600, "Expected application/json")
    framing = body_framing(head, max_bytes=MAX_EXPORT_BODY)
    return framing if isinstance(framing, Response) else None


def export_request(
    body: bytes, head: RequestHead, *, capabilities: JsonObject | None = None
) -> ExportRequest | Initialize | Cancelled | Response:
    """
    A re-exported server's POSTed body: one request of this revision, or the refusal; from a
    client of an earlier revision (see the module), its ``initialize``, a cancel, a request
    with the envelope added (``capabilities``: what its ``initialize`` named), or the answer
    given here (``ping``, other notifications).
    """
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _refuse(400, None, -32700, "Parse error")
    if isinstance(message, dict) and _handshake_era(message, head):
        return _handshake_request(message, capabilities or {})
    obj = message if isinstance(message, dict) else None
    raw_id = obj.get("id") if obj is not None else None
    request_id = raw_id if type(raw_id) in (str, int) else None
    if (
        obj is None
        or obj.get("jsonrpc") != "2.0"
        or "result" in obj
        or "error" in obj
        or request_id is None
    ):
        return _refuse(
            400,
            request_id,
            -32600,
            "Expected one JSON-RPC request; batches, notifications and responses are unsupported",
        )
    assert isinstance(request_id, str | int)
    method = obj.get("method")
    if not isinstance(method, str):
        return _refuse(400, request_id, -32600, "Missing method")
    params = obj.get("params")
    if params is not None and not isinstance(params, dict):
        return _refuse(400, request_id, -32602, "Parameters must be an object")
    meta = params.get("_meta") if params is not None else None
    version = meta.get(META_VERSION) if isinstance(meta, dict) else None
    if not isinstance(version, str):
        return _refuse(
            400, request_id, -32602, f"params._meta must contain {META_VERSION} as a string"
        )
    if _single(head, "mcp-protocol-version") != version:
        return _refuse(
            400,
            request_id,
            HEADER_MISMATCH,
            "HeaderMismatch: MCP-Protocol-Version does not match params._meta",
        )
    if version != MODERN_VERSION:
        data = {"supported": [MODERN_VERSION], "requested": version}
        return _refuse(400, request_id, UNSUPPORTED_VERSION, "Unsupported protocol version", data)
    assert isinstance(meta, dict)
    assert params is not None
    if not isinstance(meta.get(META_CAPABILITIES), dict):
        return _refuse(
            400, request_id, -32602, f"params._meta must contain {META_CAPABILITIES} as an object"
        )
    if _single(head, "mcp-method") != method:
        return _refuse(
            400, request_id, HEADER_MISMATCH, "HeaderMismatch: Mcp-Method does not match method"
        )
    named = NAMED.get(method)
    if named is not None:
        value = params.get(named)
        if not isinstance(value, str):
            return _refuse(400, request_id, -32602, f"Missing params.{named}")
        if _unmirror(_single(head, "mcp-name")) != value:
            return _refuse(
                400, request_id, HEADER_MISMATCH, "HeaderMismatch: Mcp-Name does not match request"
            )
    if any(name.startswith("mcp-param-") for name, _ in head.headers):
        # The re-export strips x-mcp-header annotations: mirrored params mean nothing here.
        return _refuse(
            400, request_id, HEADER_MISMATCH, "HeaderMismatch: Mcp-Param headers are not supported"
        )
    if method == "initialize" or method.startswith("notifications/"):
        return _refuse(404, request_id, -32601, "Method not found")
    return ExportRequest(request_id, method, params)


def _handshake_era(message: JsonObject, head: RequestHead) -> bool:
    """
    A message of an earlier revision: ``initialize``, or one whose body names no version (the
    revision's envelope) and whose header names one of those revisions or none (clients before
    2025-06-18 send none). A body that names a version is judged as the revision's (a
    mismatch, or a version it does not serve, is said so).
    """
    if message.get("method") == "initialize":
        return True
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and META_VERSION in meta:
        return False
    header = _single(head, "mcp-protocol-version")
    return header is None or header in HANDSHAKE_VERSIONS


def _handshake_request(
    message: JsonObject, capabilities: JsonObject
) -> ExportRequest | Initialize | Cancelled | Response:
    raw_id = message.get("id")
    method = message.get("method")
    params = message.get("params")
    if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
        if "result" in message or "error" in message:
            return Response(202)  # (an answer: the re-export asks nothing of its clients)
        return _refuse(400, None, -32600, "not a JSON-RPC 2.0 message", status_ok=True)
    if params is not None and not isinstance(params, dict):
        return _refuse(400, raw_id, -32602, "Parameters must be an object")
    if "id" not in message:
        if method == "notifications/cancelled" and isinstance(params, dict):
            return Cancelled(params.get("requestId"))
        return Response(202)
    if type(raw_id) not in (str, int):
        return _refuse(400, None, -32600, "id must be a string or an integer")
    assert isinstance(raw_id, str | int)
    if method == "initialize":
        asked = params.get("protocolVersion") if params is not None else None
        version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
        named = params.get("capabilities") if params is not None else None
        assert isinstance(version, str)
        return Initialize(raw_id, version, named if isinstance(named, dict) else {})
    if method == "ping":
        pong = orjson.dumps({"jsonrpc": "2.0", "id": raw_id, "result": {}})
        return Response(200, pong, (), _JSON)
    return ExportRequest(raw_id, method, with_envelope(params, capabilities), handshake=True)


def with_envelope(params: JsonObject | None, capabilities: JsonObject) -> JsonObject:
    """``params`` with the revision's envelope in ``_meta`` (what else is there is kept)."""
    inner = dict(params) if params is not None else {}
    meta = inner.get("_meta")
    inner["_meta"] = {
        **(meta if isinstance(meta, dict) else {}),
        META_VERSION: MODERN_VERSION,
        META_CAPABILITIES: capabilities,
    }
    return inner


def handshake_answer(
    initialize: Initialize, discovered: JsonObject, name: str
) -> tuple[int, JsonObject]:
    """
    The answer to a handshake client's ``initialize``, from the server's ``server/discover``
    outcome (its capabilities, instructions and name; ``name`` when it gives none).
    """
    if "result" not in discovered or not isinstance(discovered["result"], dict):
        error = discovered.get("error")
        error = error if isinstance(error, dict) else {"code": -32603, "message": "no answer"}
        return 200, {"jsonrpc": "2.0", "id": initialize.id, "error": error}
    found = discovered["result"]
    meta = found.get("_meta")
    info = meta.get(META_SERVER_INFO) if isinstance(meta, dict) else None
    capabilities = found.get("capabilities")
    result: JsonObject = {
        "protocolVersion": initialize.version,
        "capabilities": capabilities if isinstance(capabilities, dict) else {},
        "serverInfo": info if isinstance(info, dict) else {"name": name, "version": "0"},
    }
    if isinstance(found.get("instructions"), str):
        result["instructions"] = found["instructions"]
    return 200, {"jsonrpc": "2.0", "id": initialize.id, "result": result}


def _single(head: RequestHead, name: str) -> str | None:
    values = head.values(name)
    return values[0].strip() if len(values) == 1 else None


def _unmirror(value: str | None) -> str | None:
    """A mirrored header's value: as sent, or decoded from the ``=?base64?...?=`` form (only a
    canonical encoding: two readers must not disagree on what it says)."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    encoded = value[len("=?base64?") : -len("?=")]
    try:
        decoded = base64.b64decode(encoded, validate=True)
        text = decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return text if base64.b64encode(decoded).decode("ascii") == encoded else None


def answer(request: ExportRequest, request_id: str, outcome: JsonObject) -> tuple[int, JsonObject]:
    """
    The HTTP status and JSON-RPC message for a call's inner ``outcome`` (a result or an error
    carrier; the inner request went to the client as ``request_id``).
    """
    if "result" not in outcome and isinstance(outcome.get("error"), dict):
        message = _error_body(request.id, 0, "")
        message["error"] = outcome["error"]
        return _status_of(outcome["error"].get("code"), request.handshake), message
    result = outcome.get("result")
    if request.method == "tools/list":
        result = strip_header_annotations(result)
    if isinstance(result, dict):
        result = _rewrite_subscription(result, request_id, request.id)
    if request.handshake and isinstance(result, dict):
        kind = result.get("resultType", "complete")
        if kind != "complete":
            # (An input-required result: the server asks the client for more, in a way only
            # this revision has.)
            why = f"the server answered {kind!r}, which MCP {MODERN_VERSION} alone can carry"
            return 200, _error_body(request.id, -32603, why)
        result = {k: v for k, v in result.items() if k not in _MODERN_ONLY}
    return 200, {"jsonrpc": "2.0", "id": request.id, "result": result}


#: The outer codes an HTTP client is told as they are: the binding's, and a cancel.
BINDING_CODES: Final = frozenset({-33000, -33001, -33002, -32800})


def binding_error(request: ExportRequest, code: int, message: str) -> tuple[int, JsonObject]:
    """
    The HTTP status and message for an outer failure of the binding: its code kept when it is
    one of the binding's, else ``-33002`` (the provider failed without an MCP outcome).
    """
    code = code if code in BINDING_CODES else -33002
    return _status_of(code, request.handshake), _error_body(request.id, code, message)


def rewrite_notification(params: JsonObject | None, request_id: str, http_id: object) -> Any:
    """A notification's params as the HTTP client sees them (its subscription id its own)."""
    return _rewrite_subscription(params, request_id, http_id) if params is not None else None


def sse(message: JsonObject) -> bytes:
    """One server-sent event carrying ``message``."""
    return b"event: message\ndata: " + orjson.dumps(message) + b"\n\n"


#: What a result of the revision says that an earlier revision's has no place for.
_MODERN_ONLY: Final = frozenset({"resultType", "cacheScope", "ttlMs"})


def _status_of(code: object, handshake: bool = False) -> int:
    """The HTTP status of an error answer: the revision's; always 200 for an earlier one."""
    if handshake:
        return 200
    if code in (HEADER_MISMATCH, -32021, UNSUPPORTED_VERSION, -32602):
        return 400
    return 404 if code == -32601 else 200


def _rewrite_subscription(payload: Any, request_id: str, http_id: object) -> Any:
    meta = payload.get("_meta") if isinstance(payload, dict) else None
    if not isinstance(meta, dict) or meta.get(META_SUBSCRIPTION) != request_id:
        return payload
    return {**payload, "_meta": {**meta, META_SUBSCRIPTION: http_id}}


#: JSON Schema keywords whose values are schemas: by name, one, or a list of them.
_SCHEMA_MAPS: Final = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
)
_SCHEMA_ONE: Final = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "contentSchema",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
)
_SCHEMA_LISTS: Final = ("allOf", "anyOf", "oneOf", "prefixItems")


def strip_header_annotations(result: Any) -> Any:
    """
    A ``tools/list`` result without the transport-only ``x-mcp-header`` annotations in its
    tools' input schemas: they promise routing headers the re-export does not honour.
    """
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        return result
    tools = [
        {**tool, "inputSchema": _strip(tool["inputSchema"])}
        if isinstance(tool, dict) and "inputSchema" in tool
        else tool
        for tool in result["tools"]
    ]
    return {**result, "tools": tools}


def _strip(schema: Any) -> Any:
    if isinstance(schema, list):  # (draft-07 tuple items)
        return [_strip(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "x-mcp-header"}
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _strip(child) for name, child in out[key].items()}
    for key in _SCHEMA_ONE:
        if key in out:
            out[key] = _strip(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_strip(child) for child in out[key]]
    return out
