"""
``acp-bridge serve``: the daemon's listener, from the configuration to the sockets.

Before a socket or an agent exists, :func:`prepare_listener` checks the bind policy (a
non-loopback ``websocket.host`` needs ``--allow-remote``, and TLS or ``--insecure``), loads
the TLS files and the token. Then :func:`serve_websocket` listens on ``[websocket] host:port``
and hands every TCP connection to a :class:`~acp_bridge.faces.ws.WebSocketFace`; :func:`run_serve`
is the whole command: the bridge, its default agent, the listener and the one summary it
prints (:func:`startup_summary`).
"""

from __future__ import annotations

import json
import shutil
import ssl
import sys
import urllib.parse
from functools import partial
from typing import TYPE_CHECKING, Final

import attrs
import structlog
import trio

from acp_bridge.config.model import ConfigError
from acp_bridge.faces.listener_core import check_bind
from acp_bridge.faces.stdio import with_bridge
from acp_bridge.faces.token import is_loopback, load_or_create_token
from acp_bridge.faces.ws import WebSocketFace
from acp_bridge.http.wire import bracketed
from acp_bridge.observe.redact import Redactor
from acp_bridge.observe.trace import open_wire_trace
from acp_bridge.protocol.jsonrpc import JsonRpcError
from acp_bridge.runtime.nursery import leaves

if TYPE_CHECKING:
    from typing import IO

    from acp_bridge.config.model import Config
    from acp_bridge.engine.bridge import Bridge

__all__ = [
    "ListenError",
    "ListenInfo",
    "prepare_listener",
    "run_serve",
    "serve_websocket",
    "startup_summary",
]

logger = structlog.get_logger("acp_bridge.ws")

#: Exit status of ``run_serve`` for an unusable configuration (as the CLI's usage errors).
EXIT_CONFIG: Final = 2
#: Exit status of ``run_serve`` when the port cannot be bound.
EXIT_LISTEN: Final = 1


class ListenError(Exception):
    """The listening socket could not be opened (port in use, address not available...)."""


@attrs.frozen
class ListenInfo:
    """
    Where ``serve_websocket`` listens (what ``task_status.started`` reports).

    Attributes:
        host: the address bound (the first one, if a name resolved to several).
        port: the port bound (the real one when the config said 0).
        url: the ACP endpoint, ``ws://`` or ``wss://``, for local clients (over HTTP the
            same path: :attr:`http_url`).
        token_path: the token file, or None when the token is inline in the config.
        console_login: the approval console's login link (it carries the token).
    """

    host: str
    port: int
    url: str
    token_path: str | None
    console_login: str | None = attrs.field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        """The ACP endpoint for HTTP clients (POST and server-sent events): ``http(s)://``."""
        scheme, rest = self.url.split("://", 1)
        return f"{scheme.replace('ws', 'http')}://{rest}"


@attrs.frozen
class _Prepared:
    """What ``serve`` needs besides the socket: checked before any agent starts."""

    token: bytes = attrs.field(repr=False)
    token_path: str | None
    ssl_context: ssl.SSLContext | None
    remote: bool


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


def _url(scheme: str, host: str, port: int, path: str) -> str:
    if host in ("", "0.0.0.0"):  # a wildcard bind is reachable on loopback
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"{scheme}://{bracketed(host)}:{port}{path}"


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
    token = urllib.parse.quote(prepared.token.decode("utf-8", "surrogateescape"), safe="")
    info = ListenInfo(
        host=str(bound[0][0]),
        port=port,
        url=_url(scheme, host, port, settings.path),
        token_path=prepared.token_path,
        console_login=_url(scheme.replace("ws", "http"), host, port, f"/console?token={token}"),
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


def startup_summary(
    info: ListenInfo, *, agent: str, agent_state: str, show_token: bool = False
) -> str:
    """
    The one message ``serve`` prints once listening: where, the token, an editor entry.

    The console's login link carries the token: it is printed whole only with
    ``show_token`` (stderr is a terminal, whose reader may have the token anyway). Otherwise
    (stderr is a log file, a journal, a CI log, which others may read) the link is printed
    without it, with where the token is.
    """
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
    console: list[str] = []
    if info.console_login is not None and show_token:
        console = [f"  console: {info.console_login} (approvals; holds the token)"]
    elif info.console_login is not None:
        where = info.token_path if info.token_path is not None else "websocket.token in the config"
        console = [
            f"  console: {info.console_login.split('?', 1)[0]} (approvals; log in with "
            f"/console?token=TOKEN, the token in {where})"
        ]
    return "\n".join(
        [
            f"acp-bridge serve: listening on {info.url}",
            f"  http:    {info.http_url} (ACP over HTTP: POST, and server-sent events on GET)",
            f"  agent:   {agent} ({agent_state})",
            token_line,
            f"  health:  {http_scheme}://{base}/healthz",
            *console,
            f"  status:  acp-bridge status, or {http_scheme}://{base}/status and /metrics "
            "(with the token)",
            "  Zed: add to settings.json:",
            *(f"    {line}" for line in snippet.splitlines()),
        ]
    )


#: What agents of the daemon are told their client can do. Clients come and go and differ;
#: the bridge relays these to whichever client holds the session, and refuses a call (-32601
#: to the agent) when that client did not advertise it. Not ``session.notices``: a notice
#: cannot be refused, only dropped unseen for a client without it, where the agent would
#: otherwise have said the same in a message every client shows.
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
    says 503; a later ``initialize`` retries), then prints one summary to stderr (the
    console's login link with its token only when stderr is a terminal). With
    ``trace_file``, every message is recorded there (see ``observe.trace.py``).

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
            name = bridge.hub.default_agent
            try:
                await bridge.supervisor.ensure_ready(bridge.hub.agents[name])
                state = "ready"
            except JsonRpcError as exc:
                logger.error("default_agent_failed", agent=name, error=exc.message)
                state = f"failed to start: {exc.message}"
            # (The token only to a terminal: a redirected stderr is a log others may read.)
            summary = startup_summary(
                info, agent=name, agent_state=state, show_token=sys.stderr.isatty()
            )
            print(summary, file=sys.stderr, flush=True)

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
