"""
A client's requests on a session it names (``session/prompt``, ``load``, ``resume``,
``close``, ``set_mode``, ...; a load of an id the bridge never saw is asked of an agent), and
:meth:`SessionRequests.forward`, the last step of every client request that goes to an agent.

A client's ``session/prompt`` reaches its agent in four steps:

1. ``FromClient.line`` (``engine.from_client``) decodes the line, and ``FromClient._request``
   dispatches it by method to
2. :meth:`SessionRequests.request`: the session looked up by ``sessionId``, its state and its
   owning connection checked (a stored, ended or elsewhere-owned session is served here or
   refused);
3. :meth:`SessionRequests.forward_session_request`: gated on the agent's capabilities, the
   prompt's content checked and recorded for replay;
4. :meth:`SessionRequests.forward`: a bridge id minted, the request put on the agent's queue
   (``AgentLink.send_nowait``). The agent's answer comes back through
   ``FromAgent.agent_response``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from acp_bridge.config import remote
from acp_bridge.engine.links import AgentState
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import (
    LOOK_ONLY_METHODS,
    SESSION_METHODS,
    agent_selector,
    check_prompt_content,
    has_session_cap,
)
from acp_bridge.protocol.jsonrpc import (
    INTERNAL_ERROR,
    JsonObject,
    JsonRpcError,
    dumps,
    params_of,
)
from acp_bridge.protocol.wire import attached_elsewhere, bridge_meta, watching_only
from acp_bridge.sessions import transitions
from acp_bridge.sessions.table import Forwarded, Session, SessionState, Setup, roots_of

if TYPE_CHECKING:
    from acp_bridge.engine.cancel import Cancel
    from acp_bridge.engine.from_agent import FromAgent
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.engine.reattach import Reattach
    from acp_bridge.engine.restore import Restore
    from acp_bridge.engine.subagents import Subagents
    from acp_bridge.engine.supervisor import Supervisor


class SessionRequests:
    """
    Requests on an existing session, from a client to the session's agent.

    Args:
        hub: the shared state.
        supervisor: starts the session's agent, then goes on.
        from_agent: the bookkeeping of a request that never went out.
        restore: sessions only the store has, and ended ones whose id went elsewhere.
        reattach: sessions taken back, attached, closed.
        cancel: a closed session's open approvals settled.
        subagents: the MCP servers offered to a session being opened (its ``offers``).
    """

    def __init__(
        self,
        hub: Hub,
        supervisor: Supervisor,
        from_agent: FromAgent,
        restore: Restore,
        reattach: Reattach,
        cancel: Cancel,
        subagents: Subagents,
    ) -> None:
        self._hub = hub
        self._supervisor = supervisor
        self._from_agent = from_agent
        self._restore = restore
        self._reattach = reattach
        self._cancel = cancel
        self._subagents = subagents

    async def request(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        """
        Step 2 of a prompt's way (see the module): route a request by its ``sessionId``.

        Unknown ids (a load or resume asks the agent; delete is fine), sessions only in the
        store, ended ones, reattaching loads and closes the agent cannot do are served or
        refused here; another connection's session is refused; an agent still starting is
        waited for in a task of its own. Anything else goes on to
        :meth:`forward_session_request`.

        Raises:
            JsonRpcError: answered to the client under the request's id by the caller.
        """
        method: str = msg["method"]
        sid = params.get("sessionId")
        if not isinstance(sid, str):
            raise JsonRpcError.invalid_params("sessionId must be a string")
        session = self._hub.sessions.get(sid)
        if session is None:
            if method in ("session/load", "session/resume"):
                await self.load_unknown(client, msg, params, sid)
                return
            if method == "session/delete":
                await client.send(dumps(rpc.result(msg["id"], {})))  # unknown: silently fine
                return
            raise JsonRpcError.resource_not_found(f"unknown session {sid!r}")
        if session.parent is not None:
            # The subagents RFD: a client does not drive a child; its parent does.
            raise JsonRpcError.invalid_params(
                f"session {sid!r} is a sub-agent of {session.parent!r}: its parent drives it"
            )
        reattaching = method in ("session/load", "session/resume")
        if reattaching and bridge_meta(params).get("watch") is True:
            await self._watch(client, msg, params, session)
            return
        if (
            not reattaching
            and session.watchers is not None
            and transitions.watcher_of(session, client) is not None
        ):
            # A watcher only follows: what changes the session is the owner's.
            raise watching_only(sid, method)
        owner = session.client
        elsewhere = owner is not None and owner is not client and not owner.closed
        if elsewhere and method not in ("session/load", "session/resume"):
            # Only the owner acts on a session (close and delete above all: the bridge serves
            # them itself for most agents); another connection must take it over first.
            raise attached_elsewhere(sid)
        agent = self._hub.agents[session.agent]
        if session.state is SessionState.STORED:
            await self._restore.stored_request(client, msg, session)
            return
        if session.state is SessionState.ENDED and not self._hub.sessions.owns_agent_id(session):
            await self._restore.reused_request(client, msg, session)
            return
        live = session.state is SessionState.ACTIVE and agent.state is AgentState.READY
        if live and method in ("session/load", "session/resume"):
            await self._reattach.reattach(client, msg, params, session)
            return
        if (
            live
            and method in ("session/close", "session/delete")
            and not has_session_cap(agent.capabilities, method.removeprefix("session/"))
        ):
            await self._close_without_agent(client, msg, session, agent)
            return
        if elsewhere:  # a load or resume that the bridge cannot serve as a takeover
            raise attached_elsewhere(sid)
        if owner is None and live and method not in LOOK_ONLY_METHODS:
            await self._reattach.attach(session, client)
        if agent.state is not AgentState.READY:
            if method in ("session/load", "session/resume") or agent.state is AgentState.STARTING:
                then = functools.partial(
                    self.forward_session_request, client, msg, params, session, agent
                )
                self._supervisor.when_ready(client, msg["id"], agent, then)
                return
            raise JsonRpcError(
                INTERNAL_ERROR,
                f"session {sid!r} ended: agent {agent.name!r} is {agent.state.value}",
                agent.failure_data(),
            )
        await self.forward_session_request(client, msg, params, session, agent)

    async def _watch(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> None:
        """A load or resume with ``_meta.acp_bridge.watch``: of a live session only."""
        agent = self._hub.agents[session.agent]
        if session.state is not SessionState.ACTIVE or agent.state is not AgentState.READY:
            raise JsonRpcError.invalid_request(
                f"session {session.bridge_id!r} cannot be watched: it is not live "
                f"({session.state.value}, agent {agent.state.value}); load it without "
                "_meta.acp_bridge.watch first"
            )
        await self._reattach.watch(client, msg, params, session)

    async def forward_session_request(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        agent: AgentLink,
    ) -> None:
        """
        Step 3: a request on ``session`` to its ``agent``, which is ready. Gated on the
        agent's capabilities (-32601); a prompt's content checked and the prompt recorded
        in the history; a load's, resume's or fork's setup trimmed to what the agent takes.
        The session id becomes the agent's own, then :meth:`forward`.
        """
        method: str = msg["method"]
        gate = SESSION_METHODS.get(method)
        if gate is not None and not gate(agent.capabilities):
            raise JsonRpcError.method_not_found(
                method, f"agent {agent.name!r} does not support {method}"
            )
        stripped: tuple[str, ...] = ()
        if method == "session/prompt":
            check_prompt_content(agent.name, agent.capabilities, params)
            self._hub.remember_prompt(session, params.get("prompt"))
        elif method in ("session/load", "session/resume", "session/fork"):
            self._hub.redactor.add_mcp_servers(params.get("mcpServers"))
            stripped = self._hub.strip_setup(agent, params)
            if method == "session/load":
                # Replayed updates arrive before the response: route them already.
                previous = (session.state, session.client)
                session.state = SessionState.LOADING
                session.client = client
                await self.forward(client, msg, agent, session, previous, stripped=stripped)
                return
        if session.client is None and method not in LOOK_ONLY_METHODS:
            session.client = client
        if session.rewrite:
            params["sessionId"] = session.agent_id
        setup = None
        if method == "session/fork":
            setup = Setup(roots_of(params) or session.roots, session.unattended)
        await self.forward(client, msg, agent, session, setup, stripped=stripped)

    async def forward(
        self,
        client: ClientLink,
        msg: JsonObject,
        agent: AgentLink,
        session: Session | None,
        context: Any = None,
        *,
        stripped: tuple[str, ...] = (),
    ) -> None:
        """
        Step 4, the last of every client request that goes to an agent (session/new,
        authenticate and connection-scoped requests come here from ``FromClient``): send it
        under a bridge id, remembered in ``agent.pending`` with ``context`` for the response's
        bookkeeping (and ``stripped``: what of a session's setup the agent was not sent, told
        with the answer); the client's id goes back on the response.

        Raises:
            JsonRpcError: the agent's queue is full or it is not running (never waits).
        """
        origin_id = msg["id"]
        entry = Forwarded(client, origin_id, msg["method"], session, context, stripped=stripped)
        # The MCP servers of the session being opened: the bridge's own, the client's acp ones
        entry.extra = await self._subagents.offers.offer(
            agent, msg["method"], params_of(msg), session, client
        )
        bridge_id = agent.pending.add(entry)
        msg["id"] = bridge_id
        remote.map_to_agent(agent.config, msg["method"], params_of(msg))
        if not agent.send_nowait(dumps(msg)):
            agent.pending.pop(bridge_id)
            self._from_agent.undo_forward(agent, entry, ok=False)
            msg["id"] = origin_id  # the error goes back under the client's own id
            raise JsonRpcError(
                INTERNAL_ERROR,
                f"agent {agent.name!r} is not accepting input (queue full or not running)",
                agent.failure_data(),
            )
        client.inflight[origin_id] = (agent, bridge_id)

    async def load_unknown(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, sid: str
    ) -> None:
        """``session/load`` of an id the bridge never saw: ask the selected (or default) agent."""
        name = agent_selector(params) or self._hub.default_agent
        agent = self._hub.agents.get(name)
        if agent is None:
            raise JsonRpcError.invalid_params(f"unknown agent {name!r}")
        session = transitions.bind_unknown(self._hub.sessions, name, sid, params)
        if agent.state is AgentState.READY:
            try:
                await self.forward_session_request(client, msg, params, session, agent)
            except JsonRpcError:
                self._hub.sessions.remove(session)  # it never went out: nothing to keep
                raise
        else:
            self._supervisor.when_ready(
                client,
                msg["id"],
                agent,
                functools.partial(
                    self.forward_session_request, client, msg, params, session, agent
                ),
                failed=functools.partial(self._hub.sessions.remove, session),
            )

    async def _close_without_agent(
        self, client: ClientLink, msg: JsonObject, session: Session, agent: AgentLink
    ) -> None:
        """
        ``session/close`` (or ``delete``) for an agent without it: cancel its work, forget the
        session (delete: its journal too).
        """
        agent.send_nowait(
            dumps(rpc.notification("session/cancel", {"sessionId": session.agent_id}))
        )
        await self._cancel.settle_permissions(session, "cancelled", "close")
        self._reattach.close_session(session, delete=msg["method"] == "session/delete")
        await client.send(dumps(rpc.result(msg["id"], {})))


__all__ = ["SessionRequests"]
