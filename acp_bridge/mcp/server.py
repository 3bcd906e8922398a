"""
The bridge's ``acp-bridge`` MCP server on a trio listener: Streamable HTTP on 127.0.0.1, one
request per connection (``Connection: close``), served by ``http.server``. ``mcp.core``
decides; the two handlers here (POST, DELETE) run the tool calls on the
:class:`~acp_bridge.mcp.tools.SubagentHost`.

A call ends in one of five ways: its result (200); ``notifications/cancelled`` for it (202
and no JSON-RPC answer, as MCP asks); its connection dropped (nothing to answer); the call
deadline (``call_timeout``, an ``isError`` result that says so); its token revoked (an
``isError`` result: the session ended). The last three cancel the host's call; so does the
first when the host is still working, which it cannot be. Every other wait is bounded too: a
head in ``head_timeout``, a body in ``body_timeout`` (408 after), a write in ``send_timeout``
(the connection is dropped after), at most ``MCP_LIMITS.max_connections`` at once (503 after).
"""

from __future__ import annotations

import pathlib
import sys
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson
import structlog
import trio

from acp_bridge import __version__
from acp_bridge.http.server import HttpServer, Limits
from acp_bridge.http.wire import MAX_HEAD_BYTES, Response, plain
from acp_bridge.mcp import modern
from acp_bridge.mcp.acp import BACKEND_FAILED, RESOURCE_LIMIT
from acp_bridge.mcp.core import (
    ACCEPTED,
    MAX_BODY_BYTES,
    Cancel,
    Grant,
    McpCore,
    McpSession,
    Run,
    TokenRegistry,
)
from acp_bridge.mcp.tools import (
    ALL_TOOLS,
    ToolError,
    error_result,
    invoke,
    tool_definitions,
    tool_result,
)
from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from acp_bridge.http.server import EventStream, Exchange
    from acp_bridge.mcp.tools import SubagentHost

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "MAX_EXPORT_CALLS",
    "TOKEN_ENV",
    "ClientServers",
    "McpEndpoint",
    "installed_command",
]

logger = structlog.get_logger("acp_bridge.mcp")

#: A tool call's deadline, in seconds (a child's turn can be long; past it the call answers
#: an error that says the child keeps running, and ``wait_agents`` picks it up).
DEFAULT_CALL_TIMEOUT: Final = 3600.0
#: The variable ``acp-bridge mcp`` reads its bearer token from.
TOKEN_ENV: Final = "ACP_BRIDGE_MCP_TOKEN"
#: Requests in flight per re-exported server (the SDK's re-export: 64 per connection); one
#: more is answered 429 with ``RESOURCE_LIMIT``.
MAX_EXPORT_CALLS: Final = 64
#: Notifications of one re-exported request waiting to be written as events; one more ends
#: the request (``RESOURCE_LIMIT``), as the SDK's re-export does when its buffer fills.
EXPORT_EVENTS: Final = 256


class ClientServers(Protocol):
    """
    Where a re-exported ``acp`` server's requests go: the client that declared it (the bridge
    implements it, ``engine.mcp_acp``).
    """

    async def call(
        self,
        target: object,
        method: str,
        params: JsonObject | None,
        events: trio.MemorySendChannel[JsonObject],
    ) -> tuple[str, JsonObject]:
        """
        Ask ``target``'s client: the inner request's id as the client saw it, and its outcome
        (``{"result": ...}`` or ``{"error": ...}``); each of its notifications (the
        ``mcp/message`` params) put on ``events`` meanwhile, which is closed at the end.

        Raises:
            JsonRpcError: an outer failure of the binding (its code is the binding's).
        """
        ...


#: The endpoint's bounds: what a request may still send after its answer is a body (drained
#: before closing), and a connection past the cap is answered 503.
MCP_LIMITS: Final = Limits(
    max_connections=256, linger_bytes=MAX_BODY_BYTES, busy=plain(503, "busy")
)


class McpEndpoint:
    """
    The MCP server of one bridge: its tokens and its loopback listener.

    The bridge mints a token before each ``session/new`` (:meth:`mint`), puts
    :meth:`server_entry` in its ``mcpServers``, binds the token when the answer names the
    session (:meth:`bind`) and revokes it when the session ends (:meth:`revoke`).
    """

    def __init__(
        self,
        host: SubagentHost,
        *,
        clients: ClientServers | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        path: str = "/mcp",
        limits: Limits = MCP_LIMITS,
    ) -> None:
        self.host = host
        self.clients = clients
        self.call_timeout = call_timeout
        self.tokens = TokenRegistry()
        self.core = McpCore(
            self.tokens,
            tool_definitions(max_wait_ms=int(call_timeout * 1000)),
            server_version=__version__,
            path=path,
        )
        self.port: int | None = None
        #: agent name -> the remote port its ssh connection forwards here (one per agent: a
        #: relaunch replaces it, so the set ``Host`` may name is bounded by the agents)
        self.forwarded: dict[str, int] = {}
        self._http = HttpServer(
            self.core.site(self._post, self._delete, self._export), limits, name="mcp"
        )
        # (MCP session id, JSON-RPC id) -> the call's scope, and why it was cancelled
        self._calls: dict[tuple[str, object], tuple[trio.CancelScope, list[str]]] = {}
        # (re-export token's grant, JSON-RPC id) -> the scope of that request in flight
        self._exported: dict[tuple[Grant, object], trio.CancelScope] = {}
        self._started: trio.Event | None = None

    # ------------------------------------------------------------------ tokens

    def mint(self, tools: Sequence[str] = ALL_TOOLS) -> str:
        """A pending token for a session about to be opened (see :class:`TokenRegistry`)."""
        return self.tokens.mint(tools)

    def mint_export(self, target: object) -> str:
        """A pending token for a client's server re-exported to a session being opened."""
        return self.core.exports.mint((), target=target)

    def bind(self, token: str, session: str) -> None:
        """The session of ``token`` is now known: calls under it run as ``session``."""
        registry = self.core.exports if self.core.exports.check(token) else self.tokens
        registry.bind(token, session)

    def revoke(self, token: str) -> None:
        """End ``token``: refused from now on, its MCP sessions gone, its calls cancelled."""
        self.core.exports.revoke(token)
        grant = self.tokens.revoke(token)
        if grant is not None:
            self._cancel_sessions(self.core.drop_grant(grant), "revoked")

    def revoke_session(self, session: str) -> None:
        """End every token bound to ``session`` (as :meth:`revoke`)."""
        self.core.exports.revoke_session(session)
        for grant in self.tokens.revoke_session(session):
            self._cancel_sessions(self.core.drop_grant(grant), "revoked")

    def _cancel_sessions(self, sessions: Sequence[McpSession], why: str) -> None:
        ids = {s.id for s in sessions}
        for (session_id, _), (scope, reasons) in list(self._calls.items()):
            if session_id in ids:
                reasons.append(why)
                scope.cancel()

    # ------------------------------------------------------------------ listener

    @property
    def url(self) -> str:
        """The endpoint's URL (once listening)."""
        if self.port is None:
            raise RuntimeError("the MCP endpoint is not listening")
        return self.url_at(self.port)

    def url_at(self, port: int) -> str:
        """The endpoint's URL as seen through a loopback ``port`` forwarded to it."""
        return f"http://127.0.0.1:{port}{self.core.path}"

    def allow_port(self, agent: str, port: int) -> None:
        """Requests may also name ``port`` in ``Host``: ``agent``'s forward to the listener."""
        self.forwarded[agent] = port

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1, an ephemeral port; ``task_status.started(url)``; serve forever."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        logger.info("mcp_listening", url=self.url)
        task_status.started(self.url)
        await trio.serve_listeners(self.handle_connection, listeners)

    async def start(self, nursery: trio.Nursery) -> str:
        """
        Listen in ``nursery`` unless already listening (stdio mode: only once needed).

        Raises:
            OSError: no loopback port could be bound (the first caller; later ones get
                RuntimeError from :attr:`url`: there is no retry).
        """
        if self._started is None:
            self._started = trio.Event()
            try:
                await nursery.start(self.serve)
            finally:
                self._started.set()  # callers waiting meanwhile must not wait forever
        else:
            await self._started.wait()
        return self.url

    def server_entry(
        self,
        token: str,
        *,
        http: bool,
        command: Sequence[str] | None = None,
        url: str | None = None,
    ) -> dict[str, Any]:
        """
        The ``mcpServers`` entry of a session: ``http`` when the agent advertises
        ``mcpCapabilities.http``, else stdio through ``acp-bridge mcp`` (``command``: how to
        run this installation's ``acp-bridge``, default :func:`installed_command`). ``url``:
        where the agent reaches the listener (default :attr:`url`; see :meth:`url_at`).
        """
        if http:
            return {
                "type": "http",
                "name": "acp-bridge",
                "url": self.url if url is None else url,
                "headers": [{"name": "Authorization", "value": f"Bearer {token}"}],
            }
        argv = list(command) if command is not None else installed_command()
        return {
            "name": "acp-bridge",
            "command": argv[0],
            "args": [*argv[1:], "mcp", "--url", self.url],
            "env": [{"name": TOKEN_ENV, "value": token}],
        }

    def export_entry(self, server: JsonObject, token: str, *, url: str | None = None) -> JsonObject:
        """
        The ``mcpServers`` entry that re-exports a client's ``acp`` ``server`` over HTTP: its
        name and ``_meta`` kept, at :attr:`McpCore.export_path`, the token in ``headers``.
        """
        base = self.url if url is None else url
        entry: JsonObject = {
            "type": "http",
            "name": server["name"],
            "url": base.removesuffix(self.core.path) + self.core.export_path,
            "headers": [{"name": "Authorization", "value": f"Bearer {token}"}],
        }
        if "_meta" in server:
            entry["_meta"] = server["_meta"]
        return entry

    # ------------------------------------------------------------------ over ACP

    async def acp_call(self, token: str, method: str, params: JsonObject | None) -> JsonObject:
        """
        An agent's ``mcp/message`` to the bridge's own server (MCP 2026-07-28 over ACP), under
        the ``token`` its session was offered the server with: its inner outcome. A tool call
        runs as over HTTP, with the same deadline; the caller's scope cancels it (the agent
        withdrew it, or its session ended).
        """
        grant = self.tokens.check(token)
        if grant is None:
            return self.core.acp_outcome(error_result("the calling session has ended"))
        outcome = self.core.acp_message(grant, method, params)
        if not isinstance(outcome, Run):
            return outcome
        log = logger.bind(tool=outcome.call.tool, caller=outcome.caller, over="acp")
        with trio.move_on_after(self.call_timeout):
            return self.core.acp_outcome(await _call(self.host, outcome, log))
        log.info("mcp_call_ended", why="deadline")
        return self.core.acp_outcome(
            error_result(
                f"{outcome.call.tool}: no answer within {self.call_timeout:g} s; the call was "
                "abandoned (a child keeps running: see wait_agents)"
            )
        )

    # ------------------------------------------------------------------ one connection

    async def handle_connection(self, stream: trio.abc.Stream, *, port: int | None = None) -> None:
        """Serve one request on ``stream`` and close it. ``port``: the one ``Host`` must name
        (default: the listener's), or one of :attr:`forwarded`."""
        port = self.port if port is None else port
        hosts = self.core.hosts({-1 if port is None else port, *self.forwarded.values()})
        await self._http.handle_connection(stream, hosts=hosts)

    async def _delete(self, exchange: Exchange) -> Response:
        admit = self.core.admit(exchange.head, _grant(exchange))
        if isinstance(admit, Response):
            return admit
        answer, session = self.core.delete(admit)
        if session is not None:
            self._cancel_sessions([session], "deleted")
        return answer

    async def _post(self, exchange: Exchange) -> Response | None:
        admit = self.core.admit(exchange.head, _grant(exchange))
        if isinstance(admit, Response):
            return admit
        body = await exchange.body(MAX_BODY_BYTES)
        if isinstance(body, Response):
            return body
        outcome = self.core.post(admit, body)
        if isinstance(outcome, Cancel):
            entry = self._calls.get((outcome.session.id, _key(outcome.request_id)))
            if entry is not None:
                entry[1].append("cancelled")
                entry[0].cancel()
            return ACCEPTED
        if isinstance(outcome, Run):
            return await self._run(exchange, outcome)
        return outcome

    async def _run(self, exchange: Exchange, run: Run) -> Response | None:
        """The call's answer; None when its client hung up (nobody to answer)."""
        assert run.session is not None  # (over HTTP a call belongs to an MCP session)
        key = (run.session.id, _key(run.request_id))
        scope = trio.CancelScope(deadline=trio.current_time() + self.call_timeout)
        reasons: list[str] = []
        self._calls[key] = (scope, reasons)
        log = logger.bind(tool=run.call.tool, caller=run.caller, mcp_session=run.session.id)
        result: dict[str, Any] | None = None

        async def watch_peer() -> None:
            # The only way a JSON response can be abandoned: its client hangs up.
            await exchange.wait_gone(MAX_HEAD_BYTES)  # (junk meanwhile, not unboundedly)
            reasons.append("gone")
            scope.cancel()

        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch_peer)
                    result = await _call(self.host, run, log)
                    nursery.cancel_scope.cancel()
        finally:
            del self._calls[key]
            self.core.release(run)
        if result is None:
            why = reasons[0] if reasons else "deadline"
            log.info("mcp_call_ended", why=why)
            if why in ("cancelled", "gone", "deleted"):
                return ACCEPTED if why != "gone" else None
            if why == "deadline":
                result = error_result(
                    f"{run.call.tool}: no answer within {self.call_timeout:g} s; the call was "
                    "abandoned (a child keeps running: see wait_agents)"
                )
            else:
                result = error_result(f"{run.call.tool}: the calling session has ended")
        return self.core.finish(run, result)

    async def _export(self, exchange: Exchange) -> Response | None:
        """
        A POST to a client's re-exported server: checked as MCP 2026-07-28 over HTTP (or
        translated from an earlier revision: ``mcp.modern``), then one ``mcp/message`` to the
        client; its answer as JSON, or as events when notifications come first. The HTTP
        client hanging up (or, of an earlier revision, cancelling it) cancels it at the client.
        """
        grant = _grant(exchange)
        refusal = modern.export_head(exchange.head)
        if refusal is not None:
            return refusal
        if self.clients is None or grant.in_flight >= MAX_EXPORT_CALLS:
            busy = {"code": RESOURCE_LIMIT, "message": "Too many outstanding MCP requests"}
            refused = orjson.dumps({"jsonrpc": "2.0", "error": busy})
            return Response(429, refused, content_type="application/json")
        grant.in_flight += 1
        try:
            body = await exchange.body(modern.MAX_EXPORT_BODY)
            if isinstance(body, Response):
                return body
            request = modern.export_request(
                body, exchange.head, capabilities=grant.client_capabilities
            )
            if isinstance(request, Response):
                return request
            if isinstance(request, modern.Cancelled):
                scope = self._exported.get((grant, _key(request.id)))
                if scope is not None:
                    scope.cancel()
                return ACCEPTED
            if isinstance(request, modern.Initialize):
                return await self._initialize(grant, request)
            return await self._forward(exchange, grant, request)
        finally:
            grant.in_flight -= 1

    async def _initialize(self, grant: Grant, initialize: modern.Initialize) -> Response:
        """A handshake client's ``initialize``: answered from the server's ``server/discover``."""
        assert self.clients is not None
        grant.client_capabilities = initialize.capabilities
        params = modern.with_envelope(None, initialize.capabilities)
        send, _ = trio.open_memory_channel[JsonObject](EXPORT_EVENTS)
        discovered: JsonObject = {"error": {"code": BACKEND_FAILED, "message": "no answer"}}
        with send, trio.move_on_after(self.call_timeout):
            try:
                _, discovered = await self.clients.call(
                    grant.target, "server/discover", params, send
                )
            except JsonRpcError as exc:
                discovered = {"error": {"code": exc.code, "message": exc.message}}
        status, message = modern.handshake_answer(initialize, discovered, "mcp-over-acp")
        return Response(status, orjson.dumps(message), content_type="application/json")

    async def _forward(
        self, exchange: Exchange, grant: Grant, request: modern.ExportRequest
    ) -> Response | None:
        assert self.clients is not None
        clients = self.clients
        send, receive = trio.open_memory_channel[JsonObject](EXPORT_EVENTS)
        ended: list[JsonRpcError | tuple[str, JsonObject]] = []
        gone = False
        events: EventStream | None = None

        async def ask() -> None:
            with send, trio.move_on_after(self.call_timeout):
                try:
                    ended.append(
                        await clients.call(grant.target, request.method, request.params, send)
                    )
                except JsonRpcError as exc:
                    ended.append(exc)
                return
            ended.append(JsonRpcError(BACKEND_FAILED, "no answer from the client in time"))

        async def watch_peer() -> None:
            nonlocal gone
            await exchange.wait_gone(MAX_HEAD_BYTES)
            gone = True
            nursery.cancel_scope.cancel()

        key = (grant, _key(request.id))
        async with trio.open_nursery() as nursery:
            self._exported[key] = nursery.cancel_scope
            nursery.start_soon(watch_peer)
            nursery.start_soon(ask)
            async for note in receive:
                if events is None:
                    head = Response(200, b"", (("X-Accel-Buffering", "no"),), "text/event-stream")
                    events = await exchange.stream(
                        head, send_timeout=self._http.limits.send_timeout
                    )
                message = {"jsonrpc": "2.0", "method": note.get("method")}
                inner = modern.rewrite_notification(
                    note.get("params"), str(note.get("requestId")), request.id
                )
                if inner is not None:
                    message["params"] = inner
                if events is None or not await events.send(modern.sse(message)):
                    gone = True
                    nursery.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
        if self._exported.get(key) is nursery.cancel_scope:
            del self._exported[key]
        if gone or not ended:  # (its client hung up, or cancelled it: nobody to answer)
            return None
        last = ended[0]
        if isinstance(last, JsonRpcError):
            status, message = modern.binding_error(request, last.code, last.message)
        else:
            status, message = modern.answer(request, *last)
        if events is not None:
            await events.send(modern.sse(message))
            return None
        return Response(status, orjson.dumps(message), content_type="application/json")


def _grant(exchange: Exchange) -> Grant:
    assert isinstance(exchange.principal, Grant)  # (the route's credential: McpBearer)
    return exchange.principal


async def _call(host: SubagentHost, run: Run, log: Any) -> dict[str, Any]:
    """Run the host's side of a call: its result, or what the model should read instead."""
    try:
        return tool_result(await invoke(host, run.caller, run.call))
    except ToolError as exc:
        return error_result(f"{run.call.tool}: {exc}")
    except Exception:
        log.exception("mcp_tool_failed")
        return error_result(f"{run.call.tool}: internal error in the bridge (see its log)")


def _key(request_id: object) -> object:
    # 1 and "1" are different JSON-RPC ids; a float id was refused already
    return (type(request_id).__name__, request_id)


def installed_command() -> list[str]:
    """How to run this installation's ``acp-bridge``: the script beside the interpreter, else
    ``python -m acp_bridge``."""
    script = pathlib.Path(sys.executable).with_name("acp-bridge")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "acp_bridge"]
