"""
The daemon's network face: ACP over WebSocket (``GET /acp``) and ``GET /healthz``, one port.

Every TCP connection is read up to the end of its HTTP request head (h11; at most
:data:`MAX_HEAD_BYTES`, 16 KiB, else **431**; within ``handshake_timeout``, TLS included) and
judged by the pure :func:`judge` before anything else happens, in this order:

1. ``Host`` must name this daemon: a loopback name, the configured host or an
   ``allowed_hosts`` entry, with the right port. Anything else is a DNS-rebinding attempt or
   a mistake: **403**.
2. The path: ``/healthz`` answers **200** or **503** with the agents' states (no token: it
   carries no session data); ``/status`` (JSON) and ``/metrics`` (Prometheus text) answer
   ``GET`` with the token only (``Origin`` and token checked as below, **401** without);
   the configured path (``/acp``) goes on; anything else **404**.
3. ``GET`` only (**405**), with ``Upgrade: websocket`` (**426**) and a well-formed upgrade
   (**400**).
4. ``Origin``: absent is fine (non-browser clients hold the token); present, including the
   literal ``null``, it must be listed in ``allowed_origins``: **403**.
5. The token, ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``, compared in constant time:
   **401** with ``WWW-Authenticate: Bearer``.
6. The connection cap: **503**.

Every refusal is a tiny plain HTTP response with ``Connection: close``, written before any
session data exists. An accepted request is handed to trio-websocket, replaying the bytes
already read, and answered with **101** and an ``Acp-Connection-Id`` header. Each WebSocket
connection is then one ACP client of the bridge (:meth:`Bridge.open_client`, non-blocking):
the first message must be ``initialize`` (else close 1002), each text frame is one JSON-RPC
message, binary frames are ignored. A frame wsproto refuses (invalid UTF-8, unmasked, an
unknown opcode) ends the connection with a close frame, 1007 or 1002: trio-websocket would
only drop the TCP connection, so :meth:`_ReplayStream.send_close` sends the frame.

Backpressure:
    Inbound, trio-websocket holds at most one whole message beyond the one being handled; a
    client that sends faster than the bridge takes is slowed down by TCP. A message over
    ``max_message_bytes`` (counted in characters of text) closes the connection with 1009.
    Outbound, the bridge queues at most ``bridge.client_queue`` messages for a connection;
    when that queue overflows the bridge closes the link and the connection is closed with
    1008 (a reconnecting client gets its sessions back). A client that does not take a frame
    we send within ``ping_timeout`` seconds is cut off without a close frame: there is no
    way to deliver one to a peer that does not read. The writer frames what is queued
    itself and sends a burst in one write (:func:`text_frames`), serialised with
    trio-websocket's own frames; nothing follows the close frame.

Resource handling:
    At most ``max_connections`` WebSocket connections (then 503) and, apart from them,
    ``max_handshakes`` handshakes under way, each closed at ``handshake_timeout``. A
    connection that finds the handshakes all taken takes the place of the oldest if that one
    is :data:`HANDSHAKE_EVICT_AGE` old (a client trickling in its request head, slowloris,
    holds a place for a second, not for the deadline), else it is answered 503; at most
    ``max_handshakes`` such answers at once (and under TLS, none): past that it is closed
    unanswered.
"""

from __future__ import annotations

import contextlib
import hmac
import http
import ipaddress
import json
import math
import shutil
import ssl
import struct
import sys
import urllib.parse
import uuid
from functools import partial
from typing import TYPE_CHECKING, Final

import attrs
import h11
import structlog
import trio
import trio_websocket

from acp_bridge import _pipes as pipes
from acp_bridge._config import ConfigError
from acp_bridge._jsonrpc import JsonRpcError, loads
from acp_bridge._nursery import leaves
from acp_bridge._redact import Redactor
from acp_bridge._status import METRICS_CONTENT_TYPE, render_metrics
from acp_bridge._stdio import with_bridge
from acp_bridge._token import is_loopback, load_or_create_token
from acp_bridge._trace import open_wire_trace

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import IO

    from structlog.typing import FilteringBoundLogger as Log

    from acp_bridge._bridge import Bridge
    from acp_bridge._config import Config, WebSocketConfig
    from acp_bridge._links import ClientLink

__all__ = [
    "HandshakePolicy",
    "Health",
    "ListenError",
    "ListenInfo",
    "Refuse",
    "Report",
    "RequestHead",
    "Upgrade",
    "WebSocketFace",
    "WebSocketStatistics",
    "check_bind",
    "judge",
    "run_serve",
    "serve_websocket",
    "startup_summary",
]

logger = structlog.get_logger("acp_bridge.ws")

#: The largest HTTP request head accepted (request line plus headers).
MAX_HEAD_BYTES: Final = 16 * 1024
#: A handshake this old (seconds) gives its place to a new connection when ``max_handshakes``
#: are under way: a client that has not sent its request head by then trickles it in.
HANDSHAKE_EVICT_AGE: Final = 1.0
#: Seconds a closing handshake may take before the TCP connection is simply closed.
CLOSE_TIMEOUT: Final = 2.0
#: After an HTTP error response: how long, and how much, of the rest of the request is read.
LINGER_SECONDS: Final = 1.0
LINGER_BYTES: Final = 64 * 1024
#: Exit status of ``run_serve`` for an unusable configuration (as the CLI's usage errors).
EXIT_CONFIG: Final = 2
#: Exit status of ``run_serve`` when the port cannot be bound.
EXIT_LISTEN: Final = 1
#: Messages trio-websocket may hold for us beyond the one being handled.
_INBOUND_QUEUE: Final = 1
_READ_CHUNK: Final = 4096
_LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")
_WILDCARD_HOSTS: Final = ("", "0.0.0.0", "::")


# --- the pure part: judging a request head -------------------------------------------------


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

    @classmethod
    def from_h11(cls, event: h11.Request) -> RequestHead:
        return cls(
            method=event.method.decode("ascii", "replace"),
            target=event.target.decode("latin-1"),
            http_version=event.http_version.decode("ascii", "replace"),
            headers=tuple(
                (name.decode("latin-1").lower(), value.decode("latin-1"))
                for name, value in event.headers
            ),
        )

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
            names.append(_bracketed(host))
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


Verdict = Refuse | Health | Report | Upgrade

#: Paths of the reports a token holder may read (with GET), and what each is.
_REPORTS: Final = {"/status": "status", "/metrics": "metrics"}

_BEARER: Final = (("WWW-Authenticate", 'Bearer realm="acp-bridge"'),)
_RETRY: Final = (("Retry-After", "5"),)
_BAD_TOKEN: Final = (("WWW-Authenticate", 'Bearer realm="acp-bridge", error="invalid_token"'),)


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


def _bracketed(host: str) -> str:
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


# --- start-up: bind policy, TLS, token -----------------------------------------------------


class ListenError(Exception):
    """The listening socket could not be opened (port in use, address not available...)."""


@attrs.frozen
class ListenInfo:
    """
    Where ``serve_websocket`` listens (what ``task_status.started`` reports).

    Attributes:
        host: the address bound (the first one, if a name resolved to several).
        port: the port bound (the real one when the config said 0).
        url: the ACP endpoint, ``ws://`` or ``wss://``, for local clients.
        token_path: the token file, or None when the token is inline in the config.
    """

    host: str
    port: int
    url: str
    token_path: str | None


@attrs.frozen
class _Prepared:
    """What ``serve`` needs besides the socket: checked before any agent starts."""

    token: bytes = attrs.field(repr=False)
    token_path: str | None
    ssl_context: ssl.SSLContext | None
    remote: bool


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


def make_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The server TLS context of ``tls_cert``/``tls_key``, or None without them."""
    ws = config.websocket
    if ws.tls_cert is None or ws.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(ws.tls_cert, ws.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            config.source,
            [f"websocket.tls_cert/tls_key: cannot load {ws.tls_cert!r} and {ws.tls_key!r}: {exc}"],
        ) from None
    return context


def prepare_listener(config: Config, *, allow_remote: bool, insecure: bool) -> _Prepared:
    """
    Everything about ``serve`` that can be checked before a socket or an agent exists.

    Blocking (reads or writes the token file).

    Raises:
        ConfigError: bind policy, TLS files or token file.
    """
    check_bind(config, allow_remote=allow_remote, insecure=insecure)
    context = make_ssl_context(config)
    token, token_path = load_or_create_token(config)
    return _Prepared(
        token=token,
        token_path=token_path,
        ssl_context=context,
        remote=not is_loopback(config.websocket.host),
    )


# --- the trio part ---------------------------------------------------------------------------


class _ReplayStream(trio.abc.Stream):
    """
    The connection as trio-websocket sees it: the bytes already read come first.

    Every write must complete within ``send_timeout`` seconds; one that does not marks the
    stream broken (the peer stopped reading) and closes the transport.

    Writes are serialised here, so the bridge's writer can send many text frames in one write
    (:meth:`send_messages`) beside trio-websocket's own control frames; once trio-websocket
    has sent its close frame, no data frame follows it.

    Cancellation: a write in progress is finished first (within ``send_timeout``), so the
    peer never gets half a frame.
    """

    def __init__(self, stream: trio.abc.Stream, prefix: bytes, *, send_timeout: float) -> None:
        self._stream = stream
        self._prefix = prefix
        self._send_timeout = send_timeout
        self._write_lock = trio.StrictFIFOLock()
        self._fd = pipes.socket_fd(stream)
        self.stalled = False
        self.broken = False
        #: the close frame went out (written by trio-websocket): no data frame may follow
        self.close_sent = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            size = len(self._prefix) if max_bytes is None else max_bytes
            chunk, self._prefix = self._prefix[:size], self._prefix[size:]
            return chunk
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._write_lock:
            if data[:1] == b"\x88":  # (trio-websocket writes each frame by itself)
                if self.close_sent:
                    return  # one close frame only (send_close may have sent it)
                self.close_sent = True
            await self._write(data)

    async def send_messages(self, messages: list[bytes]) -> bool:
        """
        Write each message (a JSON line, its newline dropped) as one unfragmented text frame,
        all in one write. False, writing nothing, once the close frame is out.

        When no other write is under way, the socket is offered the frames at once (no
        scheduler round before the bytes move: a round trip's last hop); the rest, if the
        socket does not take it all, is written as usual.
        """
        frames = text_frames(messages)
        if self._fd is not None and not self.broken:
            try:
                self._write_lock.acquire_nowait()
            except trio.WouldBlock:
                pass
            else:
                try:
                    if self.close_sent:
                        return False
                    sent = pipes.write_now(self._fd, frames)
                    if sent < len(frames):
                        await self._write(frames[sent:])
                    return True
                finally:
                    self._write_lock.release()
        async with self._write_lock:
            if self.close_sent:
                return False
            await self._write(frames)
            return True

    async def _write(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            raise trio.BrokenResourceError("an earlier write failed")
        # Shielded: a frame is written whole even when the connection is being cancelled
        # (half a frame would turn our close frame into garbage); the deadline still cuts
        # off a peer that takes nothing.
        deadline = trio.current_time() + self._send_timeout
        with trio.CancelScope(deadline=deadline, shield=True) as scope:
            try:
                await self._stream.send_all(data)
            except BaseException:
                self.broken = True
                raise
        if scope.cancelled_caught:
            self.broken = self.stalled = True
            await trio.aclose_forcefully(self._stream)
            raise trio.BrokenResourceError(f"the peer took nothing for {self._send_timeout:g}s")

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        if not self.close_sent and not self.broken:
            # trio-websocket closes the connection without a close frame when wsproto finds
            # a protocol error (invalid UTF-8, an unmasked frame, an unknown opcode): it is
            # left open for the handler to send one (:meth:`send_close`); the handler
            # closes the transport in any case.
            return
        await self._stream.aclose()

    async def send_close(self, code: int, reason: str) -> None:
        """Send the close frame trio-websocket did not send (if none went out), then close."""
        payload = struct.pack("!H", code) + reason.encode()[:123]
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with self._write_lock:
                if not self.close_sent:
                    self.close_sent = True
                    await self._write(bytes((0x88, len(payload))) + payload)
        await self._stream.aclose()


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


@attrs.define
class _Ending:
    """Why a connection ends: the first task to decide wins, and ends the others."""

    scope: trio.CancelScope
    code: int = 1001
    reason: str = "server shutting down"
    decided: bool = False

    def decide(self, code: int, reason: str) -> None:
        if not self.decided:
            self.decided = True
            self.code, self.reason = code, reason
        self.scope.cancel()


class _LinkClosed(Exception):
    pass


@attrs.define(eq=False)
class _Handshake:
    """One connection's place among the handshakes under way (see ``max_handshakes``)."""

    started: float
    #: its deadline is ``handshake_timeout``; cancelled early when the place is taken
    scope: trio.CancelScope
    evicted: bool = False


@attrs.frozen
class WebSocketStatistics:
    """
    Attributes:
        connections: WebSocket connections open.
        handshakes: connections still in their HTTP/TLS handshake.
        accepted: WebSocket connections accepted since start.
        refused: requests answered with an HTTP error since start.
    """

    connections: int
    handshakes: int
    accepted: int
    refused: int


class WebSocketFace:
    """
    Serves TCP connections (or any stream) for one bridge: handshake, then ACP over WebSocket.

    Args:
        bridge: the running bridge whose client each connection becomes.
        settings: the ``[websocket]`` table.
        token: the bearer token.
        port: the listening port (``Host`` must carry it).
        ssl_context: wrap each connection in TLS with it.
    """

    def __init__(
        self,
        bridge: Bridge,
        settings: WebSocketConfig,
        *,
        token: bytes,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._bridge = bridge
        self._settings = settings
        self._ssl = ssl_context
        self.policy = HandshakePolicy.build(
            settings, token=token, port=port, tls=ssl_context is not None
        )
        self._connections: set[str] = set()
        #: handshakes under way, oldest first
        self._pending: dict[_Handshake, None] = {}
        #: 503 answers to connections that found no handshake place, under way
        self._busy = 0
        self._accepted = 0
        self._refused = 0

    def statistics(self) -> WebSocketStatistics:
        return WebSocketStatistics(
            connections=len(self._connections),
            handshakes=len(self._pending),
            accepted=self._accepted,
            refused=self._refused,
        )

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """
        Serve one connection until it ends; always closes ``stream``.

        Cancellation: a cancelled connection is closed with 1001 (going away): a frame being
        written is finished first (within ``ping_timeout``), then the closing handshake gets
        :data:`CLOSE_TIMEOUT` seconds.
        """
        log = logger.bind(peer=_peer_of(stream))
        try:
            slot = self._handshake_slot()
            if slot is None:
                await self._refuse_busy(stream, log)
                return
            try:
                async with trio.open_nursery() as nursery:
                    # trio-websocket's reader task runs shielded, so that a cancelled
                    # connection still completes its closing handshake; it ends with the
                    # connection.
                    reader_scope = trio.CancelScope(shield=True)
                    ws_nursery: trio.Nursery = await nursery.start(_nursery_in, reader_scope)
                    try:
                        await self._handle(stream, ws_nursery, log, slot)
                    finally:
                        reader_scope.cancel()
            finally:
                self._pending.pop(slot, None)
        finally:
            await trio.aclose_forcefully(stream)

    def _handshake_slot(self) -> _Handshake | None:
        """
        A place among the handshakes under way (synchronous: taken as it is checked); None
        when all ``max_handshakes`` are younger than :data:`HANDSHAKE_EVICT_AGE`.

        A handshake that old is cut off to make room: a client trickling in its request head
        (slowloris) holds a place for a second, not for ``handshake_timeout``.
        """
        now = trio.current_time()
        if len(self._pending) >= self._settings.max_handshakes:
            oldest = next(iter(self._pending))  # (dicts keep insertion order: oldest first)
            if now - oldest.started < HANDSHAKE_EVICT_AGE:
                return None
            del self._pending[oldest]
            oldest.evicted = True
            oldest.scope.cancel()
        slot = _Handshake(now, trio.CancelScope(deadline=now + self._settings.handshake_timeout))
        self._pending[slot] = None
        return slot

    async def _refuse_busy(self, stream: trio.abc.Stream, log: Log) -> None:
        """
        503 to a connection that found every handshake place taken by a young handshake.

        At most ``max_handshakes`` such answers are under way (each lingers up to
        :data:`LINGER_SECONDS`); past that, and under TLS (an answer would cost a TLS
        handshake first), the connection is closed unanswered.
        """
        if self._ssl is not None or self._busy >= self._settings.max_handshakes:
            log.warning("ws_handshake_overload", handshakes=len(self._pending))
            return
        self._busy += 1
        try:
            await self._refuse(stream, Refuse(503, "busy: too many handshakes", _RETRY), log)
        finally:
            self._busy -= 1

    async def _handle(
        self, raw: trio.abc.Stream, nursery: trio.Nursery, log: Log, slot: _Handshake
    ) -> None:
        accepted = None
        try:
            with slot.scope:
                accepted = await self._handshake(raw, nursery, log)
            if slot.scope.cancelled_caught:
                log.info("ws_handshake_evicted" if slot.evicted else "ws_handshake_timeout")
        finally:
            self._pending.pop(slot, None)
        if accepted is None:
            return
        ws, conn_id, replay = accepted
        try:
            await self._serve(ws, conn_id, replay)
        finally:
            self._connections.discard(conn_id)

    async def _handshake(
        self, raw: trio.abc.Stream, nursery: trio.Nursery, log: Log
    ) -> tuple[trio_websocket.WebSocketConnection, str, _ReplayStream] | None:
        stream: trio.abc.Stream = raw
        try:
            if self._ssl is not None:
                # Not https_compatible: a refusal ends with close_notify, as TLS clients
                # other than browsers insist on.
                tls = trio.SSLStream(raw, self._ssl, server_side=True)
                await tls.do_handshake()
                stream = tls
            read = await _read_head(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("ws_handshake_broken", error=str(exc))
            return None
        if read is None:
            log.debug("ws_no_request")
            return None
        if isinstance(read, Refuse):
            await self._refuse(stream, read, log)
            return None
        head, received = read
        verdict = judge(head, self.policy, connections=len(self._connections))
        if isinstance(verdict, Refuse):
            await self._refuse(stream, verdict, log, method=head.method, path=_path_of(head))
            return None
        if isinstance(verdict, Health):
            await self._health(stream, log)
            return None
        if isinstance(verdict, Report):
            await self._report(stream, verdict, log)
            return None
        conn_id = str(uuid.uuid4())
        self._connections.add(conn_id)  # taken now: the cap counts handshakes being accepted
        replay = _ReplayStream(stream, received, send_timeout=self._settings.ping_timeout)
        try:
            request = await trio_websocket.wrap_server_stream(
                nursery,
                replay,
                message_queue_size=_INBOUND_QUEUE,
                max_message_size=self._settings.max_message_bytes,
            )
            ws = await request.accept(extra_headers=[(b"Acp-Connection-Id", conn_id.encode())])
        except trio_websocket.ConnectionClosed:
            self._connections.discard(conn_id)
            log.debug("ws_accept_failed")
            return None
        except BaseException:
            self._connections.discard(conn_id)
            raise
        self._accepted += 1
        return ws, conn_id, replay

    async def _refuse(
        self,
        stream: trio.abc.Stream,
        refusal: Refuse,
        log: Log,
        *,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        self._refused += 1
        log.info("ws_refused", status=refusal.status, why=refusal.why, method=method, path=path)
        body = (refusal.why + "\n").encode()
        response = render_response(
            refusal.status, body, content_type="text/plain; charset=utf-8", headers=refusal.headers
        )
        await _send_quietly(stream, response)

    async def _health(self, stream: trio.abc.Stream, log: Log) -> None:
        ok, data = self._bridge.health()
        log.debug("ws_health", ok=ok)
        body = json.dumps(data, separators=(",", ":")).encode() + b"\n"
        await _send_quietly(
            stream, render_response(200 if ok else 503, body, content_type="application/json")
        )

    async def _report(self, stream: trio.abc.Stream, report: Report, log: Log) -> None:
        status = self._bridge.status()
        log.debug("ws_report", what=report.what)
        if report.what == "metrics":
            body, content_type = render_metrics(status).encode(), METRICS_CONTENT_TYPE
        else:
            body = json.dumps(status, separators=(",", ":")).encode() + b"\n"
            content_type = "application/json"
        await _send_quietly(stream, render_response(200, body, content_type=content_type))

    async def _serve(
        self, ws: trio_websocket.WebSocketConnection, conn_id: str, replay: _ReplayStream
    ) -> None:
        """One ACP client over one WebSocket, until either side ends it."""
        log = logger.bind(connection_id=conn_id)
        log.info("ws_connected", connections=len(self._connections))
        client = self._bridge.open_client(f"ws:{conn_id[:8]}", blocking=False)
        ending = _Ending(trio.CancelScope())
        try:
            with ending.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer, ws, client, ending, replay)
                    if self._settings.ping_interval > 0:
                        nursery.start_soon(self._keepalive, ws, ending)
                    await self._reader(ws, client, ending, replay)
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await self._bridge.close_client(client, ending.reason)
                if ending.code not in (1005, 1006):  # codes that are never sent
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await ws.aclose(ending.code, _truncated(ending.reason))
                        # (A protocol error: trio-websocket closed without sending it.)
                        await replay.send_close(ending.code, _truncated(ending.reason))
            log.info("ws_closed", code=ending.code, reason=ending.reason)

    async def _reader(
        self,
        ws: trio_websocket.WebSocketConnection,
        client: ClientLink,
        ending: _Ending,
        replay: _ReplayStream,
    ) -> None:
        idle = self._settings.idle_timeout or math.inf
        handle = self._bridge.handle_client_line
        first = True
        while True:
            message: str | bytes | None = None
            with trio.move_on_after(idle):
                try:
                    message = await ws.get_message()
                except trio_websocket.ConnectionClosed as exc:
                    ending.decide(*self._closed_by(exc, replay))
                    return
            if message is None:
                ending.decide(1000, "idle")
                return
            if isinstance(message, bytes):
                continue  # the transport RFD: binary frames are ignored
            if first:
                if not is_initialize(message):
                    ending.decide(1002, "the first message must be initialize")
                    return
                first = False
            await handle(client, message.encode())
            if client.closed:
                ending.decide(1008, client.close_reason or "closed by the bridge")
                return

    async def _writer(
        self,
        ws: trio_websocket.WebSocketConnection,
        client: ClientLink,
        ending: _Ending,
        replay: _ReplayStream,
    ) -> None:
        async def send(batch: list[bytes]) -> None:
            if client.closed:  # the link overflowed: what is still queued is not sent
                raise _LinkClosed
            if ws.closed is not None:
                raise trio_websocket.ConnectionClosed(ws.closed)
            # Many frames in one write: one system call (and one TCP segment, mostly) for a
            # burst, instead of one per message through trio-websocket's send_message.
            if not await replay.send_messages(batch):
                raise trio_websocket.ConnectionClosed(ws.closed)

        try:
            await client.pump_batches(send)
        except _LinkClosed:
            pass
        except trio_websocket.ConnectionClosed as exc:
            ending.decide(*self._closed_by(exc, replay))
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            ending.decide(1006, "client stopped reading" if replay.stalled else "connection lost")
            return
        ending.decide(1008, client.close_reason or "closed by the bridge")

    def _closed_by(
        self, exc: trio_websocket.ConnectionClosed, replay: _ReplayStream
    ) -> tuple[int, str]:
        """The (code, reason) of a connection trio-websocket found closed."""
        reason = exc.reason
        if replay.stalled:
            return 1006, "client stopped reading"
        if reason is None or reason.code == 1006:
            return 1006, "connection lost"
        if reason.code == 1009:
            return 1009, f"message over {self._settings.max_message_bytes} bytes"
        if reason.code in (1002, 1007) and not replay.close_sent and not replay.broken:
            # No close frame went out, so none came in (trio-websocket answers one before
            # it reports it to the reader): wsproto found a protocol error.
            return reason.code, f"protocol error: {reason.reason or reason.name}"
        return reason.code, f"closed by client: {reason.reason or reason.name}"

    async def _keepalive(self, ws: trio_websocket.WebSocketConnection, ending: _Ending) -> None:
        interval, timeout = self._settings.ping_interval, self._settings.ping_timeout
        while True:
            await trio.sleep(interval)
            with trio.move_on_after(timeout) as scope:
                try:
                    await ws.ping()
                except trio_websocket.ConnectionClosed:
                    return  # the reader sees it too, and says why
            if scope.cancelled_caught:
                ending.decide(1011, f"keepalive: no pong within {timeout:g}s")
                return


async def _nursery_in(
    scope: trio.CancelScope, *, task_status: trio.TaskStatus[trio.Nursery]
) -> None:
    """Open a nursery inside ``scope`` and lend it out until ``scope`` is cancelled."""
    with scope:
        async with trio.open_nursery() as nursery:
            task_status.started(nursery)
            await trio.sleep_forever()


def _truncated(reason: str) -> str:
    """A close reason fits in 123 bytes of UTF-8."""
    return reason.encode()[:120].decode("utf-8", "ignore")


def _peer_of(stream: trio.abc.Stream) -> str | None:
    socket_stream = stream
    if isinstance(socket_stream, trio.SSLStream):
        socket_stream = socket_stream.transport_stream
    if isinstance(socket_stream, trio.SocketStream):
        try:
            address = socket_stream.socket.getpeername()
        except OSError:
            return None
        return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
    return None


def _path_of(head: RequestHead) -> str:
    """The target's path only: a query may carry the token, and is never logged."""
    return urllib.parse.urlsplit(head.target).path[:200]


async def _read_head(stream: trio.abc.Stream) -> tuple[RequestHead, bytes] | Refuse | None:
    """
    Read up to the end of an HTTP request head: the head and every byte read (to replay).

    Returns None at EOF before a whole head, a :class:`Refuse` for a malformed one (400) or
    one over :data:`MAX_HEAD_BYTES` (431).
    """
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    received = bytearray()
    while True:
        try:
            event = parser.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            return Refuse(status, "request head too large" if status == 431 else "bad request")
        if event is h11.NEED_DATA:
            # Read no further than the cap: h11 checks its limit only between reads, so a
            # last read of a whole chunk would let a head grow past it.
            room = MAX_HEAD_BYTES - len(received)
            if room <= 0:
                return Refuse(431, "request head too large")
            data = bytes(await stream.receive_some(min(_READ_CHUNK, room)))
            if not data:
                return None
            received += data
            parser.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            return RequestHead.from_h11(event), bytes(received)
        return None


async def _send_quietly(stream: trio.abc.Stream, data: bytes) -> None:
    """
    Write a refusal or a health answer, then linger: a peer that went away is no error.

    Closing a socket with unread input resets the connection, and the reset can destroy the
    response before the peer read it; so the rest of the request (a large head, a body) is
    read and dropped first, for at most :data:`LINGER_SECONDS` and :data:`LINGER_BYTES`.
    Under TLS the stream ends with a close_notify instead.
    """
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(data)
        if isinstance(stream, trio.SSLStream):
            await stream.aclose()  # close_notify: TLS's own end of data, then the socket
            return
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        with trio.move_on_after(LINGER_SECONDS):
            drained = 0
            while drained < LINGER_BYTES and (chunk := await stream.receive_some(_READ_CHUNK)):
                drained += len(chunk)


def _url(scheme: str, host: str, port: int, path: str) -> str:
    if host in ("", "0.0.0.0"):  # a wildcard bind is reachable on loopback
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"{scheme}://{_bracketed(host)}:{port}{path}"


async def serve_websocket(
    bridge: Bridge,
    config: Config,
    *,
    allow_remote: bool = False,
    insecure: bool = False,
    task_status: trio.TaskStatus[ListenInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    """
    Listen on ``[websocket] host:port`` and serve every connection until cancelled.

    Reports :class:`ListenInfo` through ``task_status`` once listening (with the real port
    when the config says 0).

    Raises:
        ConfigError: the bind policy, the TLS files or the token file (before listening).
        ListenError: the port cannot be bound.
    """
    prepared = await trio.to_thread.run_sync(
        partial(prepare_listener, config, allow_remote=allow_remote, insecure=insecure)
    )
    await _serve_prepared(bridge, config, prepared, task_status=task_status)


async def _serve_prepared(
    bridge: Bridge,
    config: Config,
    prepared: _Prepared,
    *,
    task_status: trio.TaskStatus[ListenInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    settings = config.websocket
    host = settings.host
    try:
        listeners = await trio.open_tcp_listeners(
            settings.port, host=None if host in ("", "*") else host
        )
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {host}:{settings.port}: {exc.strerror or exc}"
        ) from None
    if settings.port == 0 and len(listeners) > 1:
        # A name with several addresses got a different free port on each: keep one.
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    bound = [listener.socket.getsockname() for listener in listeners]
    if not prepared.remote and not all(is_loopback(str(address[0])) for address in bound):
        for listener in listeners:
            await listener.aclose()
        raise ConfigError(
            config.source, [f"websocket.host {host!r} resolves to a non-loopback address"]
        )
    port = int(bound[0][1])
    face = WebSocketFace(
        bridge, settings, token=prepared.token, port=port, ssl_context=prepared.ssl_context
    )
    scheme = "wss" if prepared.ssl_context is not None else "ws"
    info = ListenInfo(
        host=str(bound[0][0]),
        port=port,
        url=_url(scheme, host, port, settings.path),
        token_path=prepared.token_path,
    )

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await face.handle_connection(stream)
        except Exception:  # one connection's bug must not take the daemon down
            logger.exception("ws_connection_crashed")

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        logger.info("ws_listening", url=info.url, addresses=[str(a[0]) for a in bound])
        task_status.started(info)


def startup_summary(info: ListenInfo, *, agent: str, agent_state: str) -> str:
    """The one message ``serve`` prints once listening: where, the token, an editor entry."""
    http_scheme = "https" if info.url.startswith("wss:") else "http"
    base = info.url.split("://", 1)[1].split("/", 1)[0]
    command = shutil.which("acp-bridge")
    if command is not None:
        argv = [command, "attach", info.url]
    else:
        argv = [sys.executable, "-m", "acp_bridge", "attach", info.url]
    if info.token_path is not None:
        argv += ["--token-file", info.token_path]
        token_line = f"  token:   {info.token_path} (clients send: Authorization: Bearer TOKEN)"
    else:
        token_line = (
            "  token:   websocket.token in the config (for `attach`, put it in a 0600 file and "
            "pass --token-file)"
        )
    entry = {"acp-bridge": {"type": "custom", "command": argv[0], "args": argv[1:], "env": {}}}
    snippet = json.dumps({"agent_servers": entry}, indent=2)
    return "\n".join(
        [
            f"acp-bridge serve: listening on {info.url}",
            f"  agent:   {agent} ({agent_state})",
            token_line,
            f"  health:  {http_scheme}://{base}/healthz",
            f"  status:  acp-bridge status, or {http_scheme}://{base}/status and /metrics "
            "(with the token)",
            "  Zed: add to settings.json:",
            *(f"    {line}" for line in snippet.splitlines()),
        ]
    )


#: What agents of the daemon are told their client can do. Clients come and go and differ;
#: the bridge relays these to whichever client holds the session, and refuses a call (-32601
#: to the agent) when that client did not advertise it.
DAEMON_AGENT_CAPABILITIES: Final = {
    "fs": {"readTextFile": True, "writeTextFile": True},
    "terminal": True,
}


def run_serve(
    config: Config,
    *,
    allow_remote: bool = False,
    insecure: bool = False,
    trace_file: IO[bytes] | None = None,
    redactor: Redactor | None = None,
) -> int:
    """
    ``acp-bridge serve``: the bridge with real agents, and the WebSocket face, until a signal.

    Starts listening first, then the default agent (a failure is logged and ``/healthz``
    says 503; a later ``initialize`` retries), then prints one summary to stderr. With
    ``trace_file``, every message is recorded there (see ``_trace.py``).

    Returns:
        The exit status: 0 after SIGTERM/SIGINT, 2 for an unusable configuration (bind
        policy, TLS or token file), 1 when the port cannot be bound.
    """
    try:
        prepared = prepare_listener(config, allow_remote=allow_remote, insecure=insecure)
    except ConfigError as exc:
        print(f"acp-bridge serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # The bridge's secrets, in its logs and trace too: give the one logging was configured with.
    redactor = redactor if redactor is not None else Redactor()
    redactor.add(prepared.token.decode("utf-8", "replace"))  # never in logs or traces

    async def body(bridge: Bridge) -> None:
        async with trio.open_nursery() as nursery:
            info: ListenInfo = await nursery.start(
                partial(_serve_prepared, bridge, config, prepared)
            )
            name = bridge.default_agent
            try:
                await bridge.ensure_ready(bridge.agents[name])
                state = "ready"
            except JsonRpcError as exc:
                logger.error("default_agent_failed", agent=name, error=exc.message)
                state = f"failed to start: {exc.message}"
            print(startup_summary(info, agent=name, agent_state=state), file=sys.stderr, flush=True)

    async def main() -> None:
        async with open_wire_trace(trace_file, redactor=redactor) as tracer:
            await with_bridge(
                config,
                body,
                agent_client_capabilities=DAEMON_AGENT_CAPABILITIES,
                tracer=tracer,
                redactor=redactor,
            )

    problems: list[str] = []
    status = 0
    try:
        trio.run(main)
    except* ListenError as group:
        problems = [str(exc) for exc in leaves(group)]
        status = EXIT_LISTEN
    except* ConfigError as group:
        problems = [str(exc) for exc in leaves(group)]
        status = EXIT_CONFIG
    for problem in problems:
        print(f"acp-bridge serve: {problem}", file=sys.stderr)
    return status
