"""
The daemon's listener, pure: who may use it (:class:`ListenerPolicy`), its endpoints
(:func:`listener_site`) and where it may bind (:func:`check_bind`).

One port serves, through ``http.server`` (checks in the order of ``http.wire``):

- ``GET /healthz``: the agents' states, to anyone (no token: it carries no session data);
- ``GET /status`` (JSON) and ``GET /metrics`` (Prometheus text): ``Origin`` absent or in
  ``allowed_origins`` (**403**), the token (**401**);
- the ACP path (``/acp``): ``GET`` with a WebSocket upgrade (``faces.handshake.check_upgrade``:
  **426**, **400**), ``GET`` of server-sent events (``Accept: text/event-stream``, else
  **406**), ``POST`` and ``DELETE`` (ACP over HTTP: ``faces.http_acp_core``; any other method
  **405**); then ``Origin`` as above and the token, or the approval console's session cookie
  (**401**);
- ``/console`` and below: the approval console, with its own rules
  (``faces.console_core.console_routes``).

``Host`` must name this daemon on every path: a loopback name, the configured host or an
``allowed_hosts`` entry, with the right port (**403**). The token is
``Authorization: Bearer TOKEN`` or ``?token=TOKEN``, compared in constant time; ``Origin``
present, including the literal ``null``, must be listed.

Pure: no trio, no socket, no clock (fenced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeVar

import attrs

from acp_bridge.config.model import ConfigError
from acp_bridge.faces.console_core import ConsoleSession, console_routes
from acp_bridge.faces.handshake import check_upgrade
from acp_bridge.faces.token import is_loopback
from acp_bridge.http.wire import (
    LOOPBACK_NAMES,
    BearerToken,
    Hosts,
    OriginRule,
    RequestHead,
    Response,
    Route,
    Site,
    bracketed,
    host_key,
    origin_key,
    plain,
    presented_bearer,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from acp_bridge.config.model import Config, WebSocketConfig
    from acp_bridge.faces.console_core import ConsoleKeys

__all__ = [
    "BUSY",
    "HANDLERS",
    "AcpCredential",
    "ConnectionSlots",
    "ListenerPolicy",
    "check_acp",
    "check_bind",
    "listener_site",
]

H = TypeVar("H")

_WILDCARD_HOSTS: Final = ("", "0.0.0.0", "::")
#: The answer to a connection that finds every handshake place taken (see ``http.server``).
BUSY: Final = plain(503, "busy: too many handshakes", (("Retry-After", "5"),))
#: The handlers :func:`listener_site` needs, by name.
HANDLERS: Final = (
    "acp",
    "acp.post",
    "acp.delete",
    "health",
    "status",
    "metrics",
    "console.page",
    "console.events",
    "console.answer",
    "console.session",
    "console.session_events",
    "console.sequence",
    "console.asset",
)


@attrs.frozen
class ListenerPolicy:
    """
    Everything the listener decides by. Build it with :meth:`build`.

    Attributes:
        path: the ACP endpoint's path.
        token: the bearer token, as bytes.
        hosts: the accepted ``Host`` values.
        port: the listening port.
        origins: accepted ``Origin`` values, normalized.
        max_connections: ACP connections allowed at once, WebSocket and HTTP together.
    """

    path: str
    token: bytes = attrs.field(repr=False)
    hosts: Hosts
    port: int
    origins: frozenset[str]
    max_connections: int

    @classmethod
    def build(
        cls, settings: WebSocketConfig, *, token: bytes, port: int, tls: bool
    ) -> ListenerPolicy:
        """The policy of a listener configured by ``settings``, bound to ``port``."""
        names = list(LOOPBACK_NAMES)
        host = settings.host
        if host not in _WILDCARD_HOSTS:
            names.append(bracketed(host))
        keys = {f"{name.lower()}:{port}" for name in names}
        for entry in settings.allowed_hosts:
            key = host_key(entry, default_port=port)
            if key is not None:
                keys.add(key)
        hosts = Hosts(
            frozenset(keys),
            any_ip_port=port if host in _WILDCARD_HOSTS else None,
            default_port=443 if tls else 80,
        )
        return cls(
            path=settings.path,
            token=token,
            hosts=hosts,
            port=port,
            origins=frozenset(origin_key(o) for o in settings.allowed_origins),
            max_connections=settings.max_connections,
        )


class ConnectionSlots:
    """The ACP connections open, WebSocket and HTTP together, against ``max_connections``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.taken = 0

    def take(self) -> bool:
        """A place for one more connection (taken now); False when all are taken."""
        if self.taken >= self.cap:
            return False
        self.taken += 1
        return True

    def give(self) -> None:
        self.taken -= 1


def check_acp(head: RequestHead) -> Response | None:
    """
    The form of a request on the ACP path: a GET is a WebSocket upgrade (when it names one,
    it must be well formed) or asks for server-sent events (**406** otherwise); POST and
    DELETE are judged by their handlers.
    """
    if head.method != "GET":
        return None
    if head.values("upgrade") or "upgrade" in head.tokens("connection"):
        return check_upgrade(head)
    if "text/event-stream" not in {t.split(";", 1)[0] for t in head.tokens("accept")}:
        return plain(
            406,
            "not acceptable: a WebSocket upgrade, or Accept: text/event-stream",
            (("Upgrade", "websocket"),),
        )
    return None


@attrs.frozen
class AcpCredential:
    """
    Who may use the ACP path: the token (``Authorization: Bearer`` or ``?token=``), or the
    approval console's session cookie (a browser that logged in there); the principal is
    True, or the console session's nonce.
    """

    bearer: BearerToken
    console: ConsoleSession

    def authenticate(self, head: RequestHead, *, now: float) -> object:
        if presented_bearer(head, query=True) is None and head.values("cookie"):
            session = self.console.authenticate(head, now=now)
            if not isinstance(session, Response):
                return session
        return self.bearer.authenticate(head, now=now)


def listener_site(policy: ListenerPolicy, keys: ConsoleKeys, handlers: Mapping[str, H]) -> Site[H]:
    """The listener's endpoints, each with its handler from ``handlers`` (every name of
    :data:`HANDLERS`). The ACP path wins over any other, ``/healthz`` over it."""
    listed = OriginRule(policy.origins, plain(403, "forbidden: Origin not allowed"))
    bearer = BearerToken(policy.token)
    routes = console_routes(keys, token=policy.token, origins=policy.origins, handlers=handlers)
    for path in ("/status", "/metrics"):
        routes[path] = Route({"GET": handlers[path[1:]]}, origin=listed, credential=bearer)
    routes[policy.path] = Route(
        {"GET": handlers["acp"], "POST": handlers["acp.post"], "DELETE": handlers["acp.delete"]},
        check=check_acp,
        origin=listed,
        credential=AcpCredential(bearer, ConsoleSession(keys, policy.token)),
    )
    routes["/healthz"] = Route({"GET": handlers["health"]})
    return Site(policy.hosts, routes)


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
