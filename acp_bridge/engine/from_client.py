"""
Every line a client sends, on its way to an agent (or answered by the bridge itself).

Where a client's ``session/prompt`` reaches an agent:

1. :meth:`FromClient.line`: the line decoded and classified (what cannot be read is answered
   here); a request goes to :meth:`FromClient._request`, which dispatches it by method;
2. ``SessionRequests.request`` (``engine.session_requests``): the session found by its
   ``sessionId``, its state and owning connection checked;
3. ``SessionRequests.forward_session_request``: gated on the agent's capabilities, the prompt
   checked and recorded for replay;
4. ``SessionRequests.forward``: under a bridge id onto the agent's queue.

The rest of this module: ``initialize`` (answered by the bridge, for all agents),
``session/new`` (to the selected agent), ``authenticate`` and the connection-scoped requests
(``logout``, ``providers/*``: to the named or default agent), the bridge's own
``_acp_bridge/*`` requests, and the client's notifications (``session/cancel``,
``$/cancel_request``, extension notifications on a session).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import attrs

from acp_bridge.engine import status as status_report
from acp_bridge.engine.links import AgentState
from acp_bridge.mcp.acp import MCP_MESSAGE
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import CONNECTION_METHODS, SESSION_METHODS, agent_selector
from acp_bridge.protocol.diagnostics import LEVEL_RANK, LOG_LEVELS
from acp_bridge.protocol.framing import Oversize
from acp_bridge.protocol.initialize import ClientOptions, bridge_answer, client_options
from acp_bridge.protocol.jsonrpc import (
    INTERNAL_ERROR,
    JsonObject,
    JsonRpcError,
    Kind,
    classify,
    dumps,
    loads,
    params_of,
)
from acp_bridge.protocol.wire import CLIENT_NOTIFICATIONS, bridge_meta, id_of, is_id
from acp_bridge.sessions.table import Setup, roots_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from acp_bridge.engine.approvals import Approvals
    from acp_bridge.engine.cancel import Cancel
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.engine.listing import Listing
    from acp_bridge.engine.mcp_acp import McpOverAcp
    from acp_bridge.engine.reverse import Reverse
    from acp_bridge.engine.session_requests import SessionRequests
    from acp_bridge.engine.supervisor import Supervisor


@attrs.define(eq=False)
class FromClient:
    """
    A client's lines: decoded, dispatched, answered or sent on to an agent.

    Args:
        hub: the shared state.
        session_requests: a session's requests, and the last step of any request to an agent.
        supervisor: starts an agent (``initialize`` waits for the default one).
        listing: ``session/list``.
        cancel: ``session/cancel``.
        reverse: the clients' answers to agents' requests (and, with ``approvals``, what
            ``_acp_bridge/status`` reports of them).
        approvals: the permission requests settled so far (for ``_acp_bridge/status``).
        mcp: the answers and notifications of the client's ``acp`` MCP servers.
    """

    _hub: Hub
    _session_requests: SessionRequests
    _supervisor: Supervisor
    _listing: Listing
    _cancel: Cancel
    _reverse: Reverse
    _approvals: Approvals
    _mcp: McpOverAcp

    async def line(self, client: ClientLink, line: bytes | Oversize) -> None:
        """
        Step 1 of every client message: one line from ``client`` (the transports call this
        through ``Bridge.handle_client_line``). Decoded and classified: a request to
        :meth:`_request` (its JsonRpcError answered under its id), a notification to
        :meth:`_notification`, a response (to an agent's request) to
        ``Reverse.client_response``; what is over the size limit, unreadable or not JSON-RPC
        is answered with an error.
        """
        self._hub.counters["from_client"] += 1
        tracer = self._hub.tracer
        if tracer is not None and isinstance(line, bytes):
            tracer(f"client:{client.name}", "in", line)
        if isinstance(line, Oversize):
            await self._hub.reply_error(
                client,
                None,
                JsonRpcError.invalid_request(f"message of {line.size} bytes is over the limit"),
            )
            return
        try:
            msg = loads(line)
        except JsonRpcError as exc:
            await self._hub.reply_error(client, None, exc)
            return
        kind = classify(msg)
        if kind is Kind.REQUEST:
            try:
                await self._request(client, msg)
            except JsonRpcError as exc:
                await self._hub.reply_error(client, msg["id"], exc)
        elif kind is Kind.NOTIFICATION:
            await self._notification(client, msg)
        elif kind is Kind.RESPONSE:
            if not await self._mcp.client_response(client, msg):
                await self._reverse.client_response(client, msg)
        elif isinstance(msg, list):
            await self._hub.reply_error(
                client, None, JsonRpcError.invalid_request("batches are not supported")
            )
        else:
            await self._hub.reply_error(client, id_of(msg), JsonRpcError.invalid_request())

    async def _request(self, client: ClientLink, msg: JsonObject) -> None:
        """
        A client's request, by method: ``initialize`` first; a notification sent as a request
        taken as the notification, then answered ``null``; a session's requests (and unknown
        ones naming a session) to ``SessionRequests.request``; the others here.
        Raises JsonRpcError to be answered under the request's id.
        """
        method: str = msg["method"]
        if method == "initialize":
            await self._initialize(client, msg)
            return
        if not client.initialized:
            raise JsonRpcError.invalid_request("the first request must be initialize")
        if method in CLIENT_NOTIFICATIONS:
            # A notification sent as a request: it takes effect as the notification (never
            # forwarded with its id: an agent need not answer it), then it is answered null.
            await self._notification(client, {k: v for k, v in msg.items() if k != "id"})
            await client.send(dumps(rpc.result(msg["id"], None)))
            return
        params = params_of(msg)
        if method in SESSION_METHODS:
            await self._session_requests.request(client, msg, params)
        elif method == "session/new":
            await self._session_new(client, msg, params)
        elif method == "session/list":
            self._hub.spawn(self._listing.session_list, client, msg, params)
        elif method == "authenticate":
            await self._auth_request(client, msg, params)
        elif method in CONNECTION_METHODS:
            await self._connection_request(client, msg, params)
        elif method == "_acp_bridge/set_log_level":
            level = params.get("level")
            if not isinstance(level, str) or level not in LEVEL_RANK:
                raise JsonRpcError.invalid_params(f"level: expected one of {', '.join(LOG_LEVELS)}")
            client.log_level = level
            client.extensions = True
            await client.send(dumps(rpc.result(msg["id"], {})))
        elif method == "_acp_bridge/status":
            status = status_report.status(self._hub, self._approvals, self._reverse)
            await client.send(dumps(rpc.result(msg["id"], status)))
        elif method == "_acp_bridge/agents":
            await client.send(
                dumps(
                    rpc.result(
                        msg["id"],
                        {
                            "default": self._hub.default_agent,
                            "agents": [a.describe() for a in self._hub.agents.values()],
                        },
                    )
                )
            )
        elif isinstance(params.get("sessionId"), str) and (
            method.startswith("_") or self._hub.sessions.get(params["sessionId"]) is not None
        ):
            # What the bridge does not know goes to the session's agent, which answers it
            # (its own -32601 when it does not know it either).
            await self._session_requests.request(client, msg, params)
        else:
            raise JsonRpcError.method_not_found(method)

    async def _initialize(self, client: ClientLink, msg: JsonObject) -> None:
        """
        ``initialize``, answered by the bridge once the default agent is up: the client's
        capabilities and ``_meta.acp_bridge`` options (seq, log) noted, the bridge's
        capabilities (``protocol.capabilities.advertised``) and every agent's name answered.
        """
        self._note_client(client, client_options(params_of(msg)))
        default_agent = self._hub.default_agent
        default = self._hub.agents[default_agent]
        try:
            await self._supervisor.ensure_ready(default)
        except JsonRpcError as exc:
            await self._hub.reply_error(client, msg["id"], exc)
            return
        client.initialized = True
        answer = bridge_answer(
            default.capabilities,
            [a.capabilities for a in self._hub.agents.values()],
            default.auth_methods,
            default_agent,
            list(self._hub.agents),
        )
        await client.send(dumps(rpc.result(msg["id"], answer)))

    def _note_client(self, client: ClientLink, options: ClientOptions) -> None:
        """What a client's ``initialize`` says about it, noted on its link (and the hub)."""
        client.capabilities = options.capabilities
        client.want_seq = options.want_seq
        client.log_level = options.log_level
        client.extensions = options.extensions
        self._hub.client_capabilities = client.capabilities

    async def initialized_early(self, client: ClientLink, msg: JsonObject) -> None:
        """
        ``initialize`` as ``acp-bridge stdio`` answered it before the imports (``faces.early``):
        the client noted as :meth:`protocol.initialize` notes it, and the default agent, which that
        phase initialized, adopted now (its launch skips the handshake: ``engine.supervisor``).
        """
        self._hub.counters["from_client"] += 1
        self._note_client(client, client_options(params_of(msg)))
        # (initialized before the agent's reader runs: what it wrote before its answer, stray
        # lines, reaches this client's log channel as what it writes later does)
        client.initialized = True
        default = self._hub.agents[self._hub.default_agent]
        try:
            await self._supervisor.ensure_ready(default)
        except JsonRpcError as exc:  # (an adopted process does not fail to start: not expected)
            default.log.error("early_agent_not_adopted", error=exc.message)

    async def _session_new(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        """``session/new`` to the selected (or default) agent, started first if need be."""
        agent = self._selected_agent(params)
        await self._when_ready(
            client,
            msg,
            agent,
            functools.partial(self._forward_session_new, client, msg, params, agent),
        )

    def _selected_agent(self, params: JsonObject) -> AgentLink:
        """The agent ``params`` name in ``_meta.acp_bridge.agent``, else the default one."""
        name = agent_selector(params) or self._hub.default_agent
        agent = self._hub.agents.get(name)
        if agent is None:
            raise JsonRpcError.invalid_params(
                f"unknown agent {name!r}; configured: {', '.join(self._hub.agents)}"
            )
        return agent

    async def _when_ready(
        self,
        client: ClientLink,
        msg: JsonObject,
        agent: AgentLink,
        then: Callable[[], Awaitable[None]],
    ) -> None:
        """``then`` now if the agent is up, else once it is (its failure answers ``msg``)."""
        if agent.state is AgentState.READY:
            await then()
        else:
            self._supervisor.when_ready(client, msg["id"], agent, then)

    async def _forward_session_new(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, agent: AgentLink
    ) -> None:
        self._hub.redactor.add_mcp_servers(params.get("mcpServers"))
        stripped = self._hub.strip_setup(agent, params)
        agent.new_in_flight += 1
        setup = Setup(roots_of(params), bridge_meta(params).get("unattended") is True)
        await self._session_requests.forward(client, msg, agent, None, setup, stripped=stripped)

    async def _auth_request(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        """``authenticate``: to the named agent, else the first ready one offering the method."""
        name = agent_selector(params)
        default_agent = self._hub.default_agent
        if name is None:
            method_id = params.get("methodId")
            for candidate in (self._hub.agents[default_agent], *self._hub.agents.values()):
                if candidate.state is AgentState.READY and any(
                    isinstance(m, dict) and m.get("id") == method_id for m in candidate.auth_methods
                ):
                    name = candidate.name
                    break
        agent = self._hub.agents.get(name or default_agent)
        if agent is None:
            raise JsonRpcError.invalid_params(f"unknown agent {name!r}")
        if agent.state is not AgentState.READY:
            raise JsonRpcError(INTERNAL_ERROR, f"agent {agent.name!r} is {agent.state.value}")
        await self._session_requests.forward(client, msg, agent, None, None)

    async def _connection_request(
        self, client: ClientLink, msg: JsonObject, params: JsonObject
    ) -> None:
        """``logout``, ``auth/status``, ``providers/*``: to the named (or default) agent."""
        agent = self._selected_agent(params)
        await self._when_ready(
            client,
            msg,
            agent,
            functools.partial(self._forward_connection_request, client, msg, agent),
        )

    async def _forward_connection_request(
        self, client: ClientLink, msg: JsonObject, agent: AgentLink
    ) -> None:
        method: str = msg["method"]
        if not CONNECTION_METHODS[method](agent.capabilities):
            raise JsonRpcError.method_not_found(
                method, f"agent {agent.name!r} does not support {method}"
            )
        await self._session_requests.forward(client, msg, agent, None, None)

    async def _notification(self, client: ClientLink, msg: JsonObject) -> None:
        """
        A client's notification: ``session/cancel`` (to ``Cancel.cancel_session``),
        ``$/cancel_request`` (to the agent the request went to, under its bridge id), an
        extension notification on one of its sessions (to the session's agent). Any other
        is ignored, as the spec asks; one its agent's queue cannot take is reported to the
        client (``Hub.not_delivered``).
        """
        method: str = msg["method"]
        params = params_of(msg)
        if method == "session/cancel":
            await self._cancel.cancel_session(client, msg, params)
        elif method == MCP_MESSAGE:
            self._mcp.client_notification(client, msg)
        elif method == "$/cancel_request":
            request_id = params.get("requestId")
            target = client.inflight.get(request_id) if is_id(request_id) else None
            if target is not None:
                agent, bridge_id = target
                cancel = rpc.notification("$/cancel_request", {"requestId": bridge_id})
                if not agent.send_nowait(dumps(cancel)):
                    self._hub.not_delivered(client, agent, method, None)
        elif method.startswith("_") and isinstance(params.get("sessionId"), str):
            session = self._hub.sessions.get(params["sessionId"])
            # Another connection's session is not this one's to act on: dropped, as a
            # notification cannot be refused (session/cancel does the same).
            if session is not None and session.client in (client, None):
                if session.rewrite:
                    params["sessionId"] = session.agent_id
                agent = self._hub.agents[session.agent]
                if not agent.send_nowait(dumps(msg)):
                    self._hub.not_delivered(client, agent, method, session)
        # Any other notification is ignored, as the spec asks.


__all__ = ["FromClient"]
