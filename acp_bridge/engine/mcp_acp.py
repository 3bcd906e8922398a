"""
MCP over ACP (docs/protocol.md, "MCP servers over ACP"): an agent's ``mcp/message`` to an
``acp`` server relayed to the client that declared it, or handed to the bridge's own server;
the client's answers and notifications back to the one caller whose request they belong to;
a withdrawn request cancelled at the client. The bridge's own requests of a client's server
(an agent that speaks only HTTP MCP reaches it through the re-export, ``mcp.server``) take
the same way.

Which server an id names and where each message goes are ``mcp.acp``'s decisions
(:class:`~acp_bridge.mcp.acp.McpRouter`); this sends and waits. The requests are not those of
``engine.reverse``: they belong to the connection that declared the server, so they are never
parked for another connection; the client going away ends them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from acp_bridge.engine.links import AgentLink, ClientLink
from acp_bridge.mcp.acp import (
    BACKEND_FAILED,
    MCP_MESSAGE,
    SERVER_UNAVAILABLE,
    Call,
    McpRouter,
    read_envelope,
)
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError, JsonRpcId, dumps, params_of
from acp_bridge.protocol.wire import well_formed_error
from acp_bridge.sessions.topic import Topic

if TYPE_CHECKING:
    from acp_bridge.engine.hub import Hub
    from acp_bridge.sessions.table import Session


@attrs.define(eq=False)
class OwnCall:
    """
    An agent's ``mcp/message`` to the bridge's own server, for the sub-agents to run
    (:attr:`McpOverAcp.own_calls`) and answer (:meth:`McpOverAcp.answer_own`) inside
    ``scope``, which is cancelled when the agent withdraws it or its session ends.
    """

    agent: AgentLink
    call: Call
    grant: object
    method: str
    params: JsonObject | None
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class Export:
    """A client's ``acp`` server re-exported over HTTP to a session (a re-export token's
    target): its client, its id there, the session once it is open."""

    client: ClientLink
    server_id: str
    session: str | None = None


@attrs.define(eq=False)
class _Asked:
    """A request of the bridge's own at a client's server, waiting for its answer."""

    events: trio.MemorySendChannel[JsonObject]
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: JsonObject | None = None
    failure: JsonRpcError | None = None


class McpOverAcp:
    """
    The ``mcp/message`` traffic between agents, clients and the bridge's own server.

    Args:
        hub: the shared state (the ids of requests to clients are its counter's).
    """

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self.router = McpRouter()
        #: an agent called the bridge's own server (the sub-agents run it)
        self.own_calls: Topic[[OwnCall]] = Topic()

    # ------------------------------------------------------------------ from the agents

    async def agent_request(self, agent: AgentLink, msg: JsonObject) -> None:
        """An agent's ``mcp/message``: to its provider under the ids the provider knows."""
        agent_id = msg["id"]
        try:
            envelope = read_envelope(params_of(msg))
            call = self.router.admit(agent, agent_id, envelope)
        except JsonRpcError as exc:
            agent.answer(dumps(rpc.error(agent_id, exc)))
            return
        client = call.provider
        if client is None:
            route = self.router.route(agent, envelope.server_id)
            assert route is not None
            own = OwnCall(agent, call, route.grant, envelope.method, envelope.params)
            call.handle = own
            self.own_calls.publish(own)
            return
        assert isinstance(client, ClientLink)
        if client.closed:
            self.router.end(call)
            gone = JsonRpcError(SERVER_UNAVAILABLE, "the client that serves it is gone")
            agent.answer(dumps(rpc.error(agent_id, gone)))
            return
        outer = next(self._hub.client_request_ids)
        self.router.sent(call, outer)
        params = params_of(msg)
        params["serverId"], params["requestId"] = call.provider_id, call.request_id
        msg["id"] = outer
        await client.send(dumps(msg))

    def agent_withdrew(self, agent: AgentLink, request_id: JsonRpcId) -> bool:
        """
        ``$/cancel_request`` of an agent: if it names an ``mcp/message`` in flight, the
        agent is answered ``-32800`` at once (as any withdrawn request: a client need not
        honour the cancel) and the call cancelled where it runs. False: not one of these.
        """
        call = self.router.withdrawn(agent, request_id)
        if call is None:
            return False
        withdrawn = JsonRpcError.cancelled("withdrawn by the agent")
        agent.answer(dumps(rpc.error(call.caller_id, withdrawn)))
        self._cancel_at(call)
        return True

    def answer_own(self, own: OwnCall, outcome: JsonObject) -> None:
        """The bridge's own server answered ``own`` (unless it ended meanwhile)."""
        if self.router.end(own.call):
            own.agent.answer(dumps(rpc.result(own.call.caller_id, outcome)))

    # ------------------------------------------------------------------ from the clients

    async def client_response(self, client: ClientLink, msg: JsonObject) -> bool:
        """A client's answer, if it is to an ``mcp/message``: to its caller. False: not one."""
        call = self.router.answered(client, msg["id"])
        if call is None:
            return False
        well_formed_error(msg)
        if call.caller is None:
            asked = call.handle
            assert isinstance(asked, _Asked)
            asked.answer = msg
            asked.done.set()
            return True
        agent = call.caller
        assert isinstance(agent, AgentLink)
        msg["id"] = call.caller_id
        if not agent.answer(dumps(msg)):
            agent.log.warning("response_not_delivered", method=MCP_MESSAGE)
        return True

    def client_notification(self, client: ClientLink, msg: JsonObject) -> None:
        """
        A client's ``mcp/message`` notification: to the one caller of the request it names
        (``serverId``, ``requestId``), under that caller's ids; dropped when none is in flight
        (it ended: the binding drops them too).
        """
        params = params_of(msg)
        server_id, request_id = params.get("serverId"), params.get("requestId")
        call = (
            self.router.belongs(client, server_id, request_id)
            if isinstance(server_id, str) and isinstance(request_id, str)
            else None
        )
        if call is None:
            client.log.debug("mcp_notification_dropped", server=server_id)
            return
        if call.caller is None:
            asked = call.handle
            assert isinstance(asked, _Asked)
            try:
                asked.events.send_nowait(params)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                # Its reader fell behind (a slow HTTP client): it ends, as the SDK's does.
                if self.router.end(call):
                    self._cancel_at(call)
                    self._fail(call, JsonRpcError(-33000, "MCP notification buffer overflow"))
            return
        agent = call.caller
        assert isinstance(agent, AgentLink)
        params["serverId"], params["requestId"] = call.caller_server_id, call.caller_request_id
        if not agent.send_nowait(dumps(msg)):
            agent.log.warning("mcp_notification_not_delivered", server=call.caller_server_id)

    # ------------------------------------------------------------------ the re-export

    async def call(
        self,
        target: object,
        method: str,
        params: JsonObject | None,
        events: trio.MemorySendChannel[JsonObject],
    ) -> tuple[str, JsonObject]:
        """A request of the bridge's own at a client's server (``mcp.server.ClientServers``)."""
        assert isinstance(target, Export)
        client = target.client
        if client.closed:
            raise JsonRpcError(SERVER_UNAVAILABLE, "the client that serves it is gone")
        owner = target.session if target.session is not None else target
        call = self.router.bridge_call(client, target.server_id, owner)
        asked = _Asked(events)
        call.handle = asked
        outer = next(self._hub.client_request_ids)
        self.router.sent(call, outer)
        envelope: JsonObject = {
            "serverId": call.provider_id,
            "requestId": call.request_id,
            "method": method,
        }
        if params is not None:
            envelope["params"] = params
        try:
            await client.send(dumps(rpc.request(outer, MCP_MESSAGE, envelope)))
            await asked.done.wait()
        finally:
            if self.router.end(call):  # (cancelled: the HTTP client is gone)
                self._cancel_at(call)
        if asked.failure is not None:
            raise asked.failure
        assert asked.answer is not None
        return call.request_id, _outcome(asked.answer)

    # ------------------------------------------------------------------ endings

    def client_gone(self, client: ClientLink) -> None:
        """A client left: its servers are gone; the calls it was serving fail."""
        for call in self.router.drop_provider(client):
            self._fail(call, JsonRpcError(BACKEND_FAILED, "the client that serves it is gone"))

    def agent_gone(self, agent: AgentLink) -> None:
        """An agent's process ended: its calls are withdrawn where they run."""
        for call in self.router.drop_agent(agent):
            self._cancel_at(call)

    def session_removed(self, session: Session) -> None:
        """A session left the table: its servers go, and the calls made under them end."""
        for call in self.router.drop_session(session.bridge_id):
            self._cancel_at(call)
            self._fail(call, JsonRpcError.cancelled("its session ended"))

    def _cancel_at(self, call: Call) -> None:
        """Stop ``call`` where it runs: the bridge's own server's scope, or the client told."""
        if call.provider is None:
            own = call.handle
            if isinstance(own, OwnCall):
                own.scope.cancel()
            return
        client = call.provider
        assert isinstance(client, ClientLink)
        if call.outer_id is not None:
            cancel = rpc.notification("$/cancel_request", {"requestId": call.outer_id})
            client.offer(dumps(cancel))

    def _fail(self, call: Call, error: JsonRpcError) -> None:
        """Answer ``call``'s caller with ``error`` (an agent; or the bridge's own waiter)."""
        if call.caller is None:
            asked = call.handle
            if isinstance(asked, _Asked):
                asked.failure = error
                asked.done.set()
            return
        agent = call.caller
        assert isinstance(agent, AgentLink)
        agent.answer(dumps(rpc.error(call.caller_id, error)))


def _outcome(answer: JsonObject) -> JsonObject:
    """
    The inner outcome a client's answer carries, read as the binding reads it (``result``
    wins; an error must have an integer code and a string message).

    Raises:
        JsonRpcError: the client's outer error, or ``BACKEND_FAILED`` for a carrier that is
            neither.
    """
    error = answer.get("error")
    if "result" not in answer and isinstance(error, dict):
        code = error.get("code")
        raise JsonRpcError(code if type(code) is int else BACKEND_FAILED, str(error.get("message")))
    carrier: Any = answer.get("result")
    if isinstance(carrier, dict):
        if "result" in carrier:
            return {"result": carrier["result"]}
        inner = carrier.get("error")
        if (
            isinstance(inner, dict)
            and type(inner.get("code")) is int
            and isinstance(inner.get("message"), str)
        ):
            return {"error": inner}
    raise JsonRpcError(BACKEND_FAILED, "Invalid MCP-over-ACP response carrier")


__all__ = ["Export", "McpOverAcp", "OwnCall"]
