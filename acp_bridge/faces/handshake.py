"""
The WebSocket face's decisions, pure: what to answer a request head, and the wire's rules.

Every TCP connection is read up to the end of its HTTP request head (by ``faces.ws.py``) and
judged by :func:`judge` before anything else happens, in this order:

1. ``Host`` must name this daemon: a loopback name, the configured host or an
   ``allowed_hosts`` entry, with the right port. Anything else is a DNS-rebinding attempt or
   a mistake: **403**.
2. The path: ``/healthz`` answers **200** or **503** with the agents' states (no token: it
   carries no session data); ``/status`` (JSON) and ``/metrics`` (Prometheus text) answer
   ``GET`` with the token only (``Origin`` and token checked as below, **401** without);
   ``/console`` and below go to the approval console, which judges them itself
   (``faces.console_core.judge_console``); the configured path (``/acp``) goes on; anything else
   **404**.
3. ``GET`` only (**405**), with ``Upgrade: websocket`` (**426**) and a well-formed upgrade
   (**400**).
4. ``Origin``: absent is fine (non-browser clients hold the token); present, including the
   literal ``null``, it must be listed in ``allowed_origins``: **403**.
5. The token, ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``, compared in constant time:
   **401** with ``WWW-Authenticate: Bearer``.
6. The connection cap: **503**.

Every refusal is a tiny plain HTTP response with ``Connection: close``
(:func:`render_response`), written before any session data exists. After the upgrade the
first message must be ``initialize`` (:func:`is_initialize`), and the bridge's messages go out
as text frames the face builds itself (:func:`text_frames`). Before any of it,
:func:`check_bind` decides whether the listener may bind where it was configured to.

Pure: no trio, no socket, no clock (fenced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import hmac
import http
import ipaddress
import struct
import urllib.parse
from typing import TYPE_CHECKING, Final

import attrs

from acp_bridge.config.model import ConfigError
from acp_bridge.faces.token import is_loopback
from acp_bridge.protocol.jsonrpc import JsonRpcError, loads

if TYPE_CHECKING:
    from collections.abc import Iterable

    from acp_bridge.config.model import Config, WebSocketConfig

__all__ = [
    "BUSY",
    "Console",
    "HandshakePolicy",
    "Health",
    "Refuse",
    "Report",
    "RequestHead",
    "Upgrade",
    "Verdict",
    "bracketed",
    "check_bind",
    "is_initialize",
    "judge",
    "render_response",
    "text_frames",
]

_LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")
_WILDCARD_HOSTS: Final = ("", "0.0.0.0", "::")


@attrs.frozen
class RequestHead:
    """
    What the judge looks at: a parsed HTTP request head.

    Attributes:
        method: e.g. ``"GET"``.
        target: the request target as sent (path and query).
        http_version: e.g. ``"1.1"``.
        headers: (lower-case name, value) pairs in arrival order, values decoded as Latin-1.
    """

    method: str
    target: str
    http_version: str
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        """Every value of header ``name`` (lower case)."""
        return [value for key, value in self.headers if key == name]

    def tokens(self, name: str) -> set[str]:
        """The comma-separated tokens of header ``name``, lower-cased (``Connection``...)."""
        return {
            token.strip().lower()
            for value in self.values(name)
            for token in value.split(",")
            if token.strip()
        }


@attrs.frozen
class HandshakePolicy:
    """
    Everything :func:`judge` decides by. Build it with :meth:`build`.

    Attributes:
        path: the ACP endpoint's path.
        token: the bearer token, as bytes.
        hosts: accepted ``Host`` values, normalized ``name:port``.
        any_ip_host: accept any IP-literal ``Host`` with the listening port (a wildcard
            bind: the daemon cannot know all its addresses, and an IP literal cannot be a
            DNS-rebinding attack).
        port: the listening port.
        default_port: the port a ``Host`` without one means (80, or 443 with TLS).
        origins: accepted ``Origin`` values, normalized.
        max_connections: WebSocket connections allowed at once.
    """

    path: str
    token: bytes = attrs.field(repr=False)
    hosts: frozenset[str]
    any_ip_host: bool
    port: int
    default_port: int
    origins: frozenset[str]
    max_connections: int

    @classmethod
    def build(
        cls, settings: WebSocketConfig, *, token: bytes, port: int, tls: bool
    ) -> HandshakePolicy:
        """The policy of a listener configured by ``settings``, bound to ``port``."""
        names = list(_LOOPBACK_NAMES)
        host = settings.host
        if host not in _WILDCARD_HOSTS:
            names.append(bracketed(host))
        hosts = {f"{name.lower()}:{port}" for name in names}
        for entry in settings.allowed_hosts:
            key = _host_key(entry, default_port=port)
            if key is not None:
                hosts.add(key)
        return cls(
            path=settings.path,
            token=token,
            hosts=frozenset(hosts),
            any_ip_host=host in _WILDCARD_HOSTS,
            port=port,
            default_port=443 if tls else 80,
            origins=frozenset(_origin_key(o) for o in settings.allowed_origins),
            max_connections=settings.max_connections,
        )


@attrs.frozen
class Refuse:
    """
    Answer with an HTTP error and close.

    Attributes:
        status: the HTTP status.
        why: a fixed, short explanation (the response body and the log; never echoes input).
        headers: extra response headers.
    """

    status: int
    why: str
    headers: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Health:
    """Answer ``/healthz``."""


@attrs.frozen
class Report:
    """
    Answer ``/status`` or ``/metrics`` (the token was checked).

    Attributes:
        what: ``"status"`` or ``"metrics"``.
    """

    what: str


@attrs.frozen
class Upgrade:
    """Accept the WebSocket upgrade."""


@attrs.frozen
class Console:
    """A request for the approval console (``/console``...): judged by the console itself."""


Verdict = Refuse | Health | Report | Upgrade | Console

#: Paths of the reports a token holder may read (with GET), and what each is.
_REPORTS: Final = {"/status": "status", "/metrics": "metrics"}

_BEARER: Final = (("WWW-Authenticate", 'Bearer realm="acp-bridge"'),)
_RETRY: Final = (("Retry-After", "5"),)
_BAD_TOKEN: Final = (("WWW-Authenticate", 'Bearer realm="acp-bridge", error="invalid_token"'),)
#: The answer to a connection that finds every handshake place taken (see ``faces.ws.py``).
BUSY: Final = Refuse(503, "busy: too many handshakes", _RETRY)


def judge(head: RequestHead, policy: HandshakePolicy, *, connections: int) -> Verdict:
    """
    Decide what to do with a request, before any session data exists. Pure.

    Args:
        head: the request.
        policy: what is allowed.
        connections: WebSocket connections open now.
    """
    hosts = head.values("host")
    if len(hosts) != 1 or not _host_allowed(hosts[0], policy):
        return Refuse(403, "forbidden: unknown Host")
    if not head.target.startswith("/"):
        return Refuse(400, "bad request target")
    parts = urllib.parse.urlsplit(head.target)
    if parts.path == "/healthz":
        if head.method != "GET":
            return Refuse(405, "method not allowed", (("Allow", "GET"),))
        return Health()
    if parts.path in _REPORTS and parts.path != policy.path:
        if head.method != "GET":
            return Refuse(405, "method not allowed", (("Allow", "GET"),))
        refusal = _check_origin_and_token(head, policy, parts.query)
        return refusal if refusal is not None else Report(_REPORTS[parts.path])
    if parts.path != policy.path and (
        parts.path == "/console" or parts.path.startswith("/console/")
    ):
        return Console()
    if parts.path != policy.path:
        return Refuse(404, "not found")
    if head.method != "GET":
        return Refuse(405, "method not allowed: WebSocket only", (("Allow", "GET"),))
    if "websocket" not in head.tokens("upgrade"):
        return Refuse(426, "WebSocket upgrade required", (("Upgrade", "websocket"),))
    if head.http_version != "1.1" or "upgrade" not in head.tokens("connection"):
        return Refuse(400, "malformed WebSocket upgrade")
    if head.values("sec-websocket-version") != ["13"]:
        return Refuse(426, "unsupported WebSocket version", (("Sec-WebSocket-Version", "13"),))
    if len(head.values("sec-websocket-key")) != 1:
        return Refuse(400, "malformed WebSocket upgrade")
    refusal = _check_origin_and_token(head, policy, parts.query)
    if refusal is not None:
        return refusal
    if connections >= policy.max_connections:
        return Refuse(503, "too many connections", _RETRY)
    return Upgrade()


def _check_origin_and_token(
    head: RequestHead, policy: HandshakePolicy, query: str
) -> Refuse | None:
    """403 for an Origin not allowed, 401 without the right token; None when both pass."""
    origins = head.values("origin")
    if origins and (len(origins) > 1 or _origin_key(origins[0]) not in policy.origins):
        return Refuse(403, "forbidden: Origin not allowed")
    given = _presented_token(head, query)
    if given is None:
        return Refuse(401, "unauthorized: a bearer token is required", _BEARER)
    if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), policy.token):
        return Refuse(401, "unauthorized: wrong token", _BAD_TOKEN)
    return None


def _presented_token(head: RequestHead, query: str) -> str | None:
    """The bearer token from ``Authorization``, else from the ``token`` query parameter."""
    auth = head.values("authorization")
    if len(auth) > 1:
        return None
    if auth:
        scheme, _, credentials = auth[0].strip().partition(" ")
        return credentials.strip() if scheme.lower() == "bearer" and credentials else None
    values = urllib.parse.parse_qs(query, keep_blank_values=True).get("token", [])
    return values[0] if len(values) == 1 else None


def bracketed(host: str) -> str:
    """An IPv6 literal in URL/Host form (``[::1]``); anything else unchanged."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _host_key(value: str, *, default_port: int) -> str | None:
    """Normalize a ``Host`` value to ``name:port``; None if it is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    else:
        name, sep, port_text = value.partition(":")
        if ":" in port_text or (sep and not port_text):
            return None
    if not name or any(c.isspace() or c in "/@\\" for c in name):
        return None
    if not port_text:
        return f"{name}:{default_port}"
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return f"{name}:{int(port_text)}"


def _host_allowed(value: str, policy: HandshakePolicy) -> bool:
    key = _host_key(value, default_port=policy.default_port)
    if key is None:
        return False
    if key in policy.hosts:
        return True
    if not policy.any_ip_host:
        return False
    name, _, port = key.rpartition(":")
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return int(port) == policy.port


def _origin_key(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def is_initialize(message: str) -> bool:
    """Whether a text message is a JSON object with ``"method": "initialize"``. Pure."""
    try:
        msg = loads(message)
    except JsonRpcError:
        return False
    return isinstance(msg, dict) and msg.get("method") == "initialize"


def render_response(
    status: int, body: bytes, *, content_type: str, headers: Iterable[tuple[str, str]] = ()
) -> bytes:
    """A complete HTTP/1.1 response that closes the connection. Pure."""
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


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


def check_bind(config: Config, *, allow_remote: bool, insecure: bool) -> None:
    """
    Refuse a non-loopback listener without ``--allow-remote``, and without TLS or ``--insecure``.

    Raises:
        ConfigError: naming ``websocket.host`` and what to do.
    """
    ws = config.websocket
    if is_loopback(ws.host):
        return
    where = f"websocket.host {ws.host!r} is not a loopback address"
    if not allow_remote:
        raise ConfigError(
            config.source,
            [f"{where}: pass --allow-remote to listen beyond this machine (or use 127.0.0.1)"],
        )
    if ws.tls_cert is None and not insecure:
        raise ConfigError(
            config.source,
            [
                f"{where}: configure websocket.tls_cert and websocket.tls_key, or pass "
                "--insecure to send the token and every session in clear text"
            ],
        )
