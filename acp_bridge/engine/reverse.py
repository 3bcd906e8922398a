"""
Agent → client requests: an agent's own request of a client (``fs/*``, ``terminal/*``,
``session/request_permission``, elicitations, extensions) routed by its session (an
elicitation tied to a request instead: to the connection that made it), gated on the
client's capabilities, its paths contained in the session's roots, shown to the attached
client (or answered as unattended); the client's answer back to the agent; a request the
agent withdraws. Permissions go through :class:`~acp_bridge.engine.approvals.Approvals`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from acp_bridge.config import remote
from acp_bridge.engine.approvals import Ask
from acp_bridge.engine.links import AgentLink, ClientLink
from acp_bridge.policy.containment import PathRefused, contain
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import CLIENT_METHOD_GATES, CONTAINED_PATHS
from acp_bridge.protocol.jsonrpc import (
    INTERNAL_ERROR,
    JsonObject,
    JsonRpcError,
    JsonRpcId,
    dumps,
    params_of,
)
from acp_bridge.protocol.wire import is_id, well_formed_error
from acp_bridge.sessions.table import Forwarded, Session, Setup
from acp_bridge.store.db import AuditRecord

if TYPE_CHECKING:
    from acp_bridge.engine.approvals import Approvals
    from acp_bridge.engine.hub import Hub

#: URL elicitations remembered per agent, to route their completion (oldest forgotten)
ELICITATIONS_MAX: Final = 1024


class Reverse:
    """
    The agents' requests of clients, and the clients' answers.

    Args:
        hub: the shared state.
        approvals: where every ``session/request_permission`` is decided and settled.
    """

    def __init__(self, hub: Hub, approvals: Approvals) -> None:
        self._hub = hub
        #: a child's request may be shown on its root's session (``Tree.present``)
        self._tree = hub.tree
        self._approvals = approvals

    async def agent_notification(self, agent: AgentLink, msg: JsonObject) -> None:
        """An agent's notification other than ``session/update``, to the client it concerns."""
        method: str = msg["method"]
        params = params_of(msg)
        if method == "$/cancel_request":
            request_id = params.get("requestId")
            if is_id(request_id):
                await self.agent_withdrew(agent, request_id)
            return
        if method == "elicitation/complete":
            # Only to the connection that was shown the elicitation (ACP: bound to it).
            elicitation_id = params.get("elicitationId")
            owner = (
                agent.elicitations.pop(elicitation_id, None)
                if isinstance(elicitation_id, str)
                else None
            )
            if owner is not None:
                await owner.send(dumps(msg))
            return
        sid = params.get("sessionId")
        if isinstance(sid, str):
            session = self._hub.sessions.find(agent.name, sid)
            watch = session.watch if session is not None else None
            if watch is not None and not watch({}):
                return  # a sub-agent's, whose client does not see the child's session
            if session is not None and session.client is not None:
                if session.rewrite:
                    params["sessionId"] = session.bridge_id
                await session.client.send(dumps(msg))
                return
        agent.log.debug("agent_notification_ignored", method=method)

    async def agent_withdrew(self, agent: AgentLink, request_id: JsonRpcId) -> None:
        """
        The agent withdrew (``$/cancel_request``) a request it made of a client: the client is
        told (the id translated), and the agent is answered here, at once: ``-32800``, or the
        ``cancelled`` outcome for a permission. Not left to the client: honouring
        ``$/cancel_request`` is optional in ACP, so a client may never answer a withdrawn
        request, and the agent would wait for it forever. The client's late answer is dropped
        (a permission's: refused and audited, as after any other settlement).
        """
        shown = agent.inflight.get(request_id)
        if shown is None:
            await self._withdraw_parked(agent, request_id)
            return
        client, client_id = shown
        entry = client.pending.get(client_id)
        if entry is None:
            return
        if isinstance(entry.extra, Ask):
            # The settlement withdraws it from every client it is shown to.
            await self._approvals.settle(entry, {"outcome": "cancelled"}, source="agent_cancel")
            return
        # Settled before anything yields: an answer the client sends meanwhile is late.
        client.pending.pop(client_id)
        agent.inflight.pop(request_id, None)
        if entry.session is not None:
            entry.session.pending_permissions.discard(client_id)
        withdrawn = JsonRpcError.cancelled("withdrawn by the agent")
        agent.send_nowait(dumps(rpc.error(request_id, withdrawn)))
        await client.send(dumps(rpc.notification("$/cancel_request", {"requestId": client_id})))

    async def _withdraw_parked(self, agent: AgentLink, request_id: JsonRpcId) -> None:
        """A withdrawn request parked for a reattach: answered now, never shown again."""
        found = self._find_parked(agent, request_id)
        if found is None:
            return
        session, entry = found
        if isinstance(entry.extra, Ask):
            await self._approvals.settle(entry, {"outcome": "cancelled"}, source="agent_cancel")
            return
        session.parked.remove(entry)
        withdrawn = JsonRpcError.cancelled("withdrawn by the agent")
        agent.send_nowait(dumps(rpc.error(request_id, withdrawn)))

    async def agent_request(self, agent: AgentLink, msg: JsonObject) -> None:
        """An agent's request of a client: routed by its session, gated, shown or answered."""
        method: str = msg["method"]
        params = params_of(msg)
        agent_id = msg["id"]
        if agent_id in agent.inflight or self._find_parked(agent, agent_id) is not None:
            # One request per id: a second would hide the first from the bookkeeping, and
            # its answer could then reach the agent's next process after a restart. (A
            # parked request is still in flight: it is shown again to the next connection.)
            duplicate = JsonRpcError.invalid_request(f"request id {agent_id!r} is in flight")
            agent.answer(dumps(rpc.error(agent_id, duplicate)))
            return
        sid = params.get("sessionId")
        session = self._hub.sessions.find(agent.name, sid) if isinstance(sid, str) else None
        gate = CLIENT_METHOD_GATES.get(method)
        if gate is None and not method.startswith("_"):
            agent.answer(dumps(rpc.error(agent_id, JsonRpcError.method_not_found(method))))
            return
        if not remote.may_call_client(agent.config, method):
            why = "the client's files are not offered to a remote agent (client_fs = false)"
            agent.answer(dumps(rpc.error(agent_id, JsonRpcError.method_not_found(method, why))))
            return
        if method == "elicitation/create" and sid is None and is_id(params.get("requestId")):
            await self._request_scoped(agent, msg, params)
            return
        if session is None:
            err = (
                JsonRpcError.resource_not_found(f"unknown session {sid!r}")
                if sid is not None
                else JsonRpcError.method_not_found(method, "no session to route it by")
            )
            agent.answer(dumps(rpc.error(agent_id, err)))
            return
        if self.requests_waiting(agent) >= self._hub.config.bridge.max_agent_requests:
            await self._refuse_over_limit(agent, msg, params, session)
            return
        if method == "session/request_permission":
            await self._approvals.permission_request(agent, msg, params, session)
            return
        if method in CONTAINED_PATHS and not await self._contain(agent, msg, params, session):
            return
        client = session.client
        if (
            client is None
            or client.closed
            or (session.unattended and method == "elicitation/create")
        ):
            await self.answer_unattended(
                Forwarded(agent, agent_id, method, session, params), "unattended"
            )
            return
        if gate is not None and not gate(client.capabilities):
            agent.answer(
                dumps(
                    rpc.error(
                        agent_id,
                        JsonRpcError.method_not_found(
                            method, "the client did not advertise this capability"
                        ),
                    )
                )
            )
            return
        entry = Forwarded(agent, agent_id, method, session, params)
        client_id = client.pending.add(entry)
        agent.inflight[agent_id] = (client, client_id)
        if method == "elicitation/create":
            self._remember_elicitation(agent, params, client)
        msg["id"] = client_id
        if session.rewrite:
            params["sessionId"] = session.bridge_id
        if session.parent is not None:
            msg["params"] = self._tree.present(session.bridge_id, client.capabilities, params)
        await client.send(dumps(msg))

    async def _request_scoped(self, agent: AgentLink, msg: JsonObject, params: JsonObject) -> None:
        """
        An elicitation tied to a request rather than a session (ACP's request scope: an
        ``authenticate``, a ``session/new`` under way): to the connection whose request it
        names, the id translated back to that client's own, gated on its ``elicitation``
        capability. Declined when nobody can answer: the request is the bridge's own or
        already answered, its connection is gone, or it opens an unattended session.
        """
        agent_id = msg["id"]
        method: str = msg["method"]
        if self.requests_waiting(agent) >= self._hub.config.bridge.max_agent_requests:
            await self._refuse_over_limit(agent, msg, params, None)
            return
        named = agent.pending.get(params["requestId"])
        entry = Forwarded(agent, agent_id, method, None, params)
        client = named.origin if isinstance(named, Forwarded) else None
        if (
            not isinstance(client, ClientLink)
            or client.closed
            or not isinstance(named, Forwarded)
            or (isinstance(named.context, Setup) and named.context.unattended)
            or (named.session is not None and named.session.unattended)
        ):
            await self.answer_unattended(entry, "unattended")
            return
        if not CLIENT_METHOD_GATES[method](client.capabilities):
            why = "the client did not advertise this capability"
            agent.answer(dumps(rpc.error(agent_id, JsonRpcError.method_not_found(method, why))))
            return
        params["requestId"] = named.origin_id
        client_id = client.pending.add(entry)
        agent.inflight[agent_id] = (client, client_id)
        self._remember_elicitation(agent, params, client)
        msg["id"] = client_id
        await client.send(dumps(msg))

    @staticmethod
    def _remember_elicitation(agent: AgentLink, params: JsonObject, client: ClientLink) -> None:
        """A URL elicitation's completion goes only to the connection that was shown it."""
        if isinstance(params.get("elicitationId"), str):
            if len(agent.elicitations) >= ELICITATIONS_MAX:
                agent.elicitations.pop(next(iter(agent.elicitations)))  # the oldest goes
            agent.elicitations[params["elicitationId"]] = client

    def requests_waiting(self, agent: AgentLink) -> int:
        """
        The requests of ``agent`` that wait on a client: shown (``inflight``) or parked for
        the session's next owner. Counted from the tables themselves, so whatever ends a
        request (an answer, a cancel, the deadline, the agent's exit, the client's) frees
        its place; a parked one is counted once even while still listed as shown.
        """
        inflight = agent.inflight
        parked = sum(
            1
            for session in self._hub.sessions.of_agent(agent.name)
            for entry in session.parked
            if entry.origin is agent and entry.origin_id not in inflight
        )
        return len(inflight) + parked

    async def _refuse_over_limit(
        self, agent: AgentLink, msg: JsonObject, params: JsonObject, session: Session | None
    ) -> None:
        """
        ``max_agent_requests`` of the agent's requests wait on clients already: this one is
        answered at once (a permission ``cancelled``, audited; anything else an error), so an
        agent that asks without end of a client that never answers holds bounded memory.
        """
        limit = self._hub.config.bridge.max_agent_requests
        agent.requests_refused += 1
        method = msg["method"]
        self._hub.log.warning(
            "agent_requests_over_limit",
            agent=agent.name,
            session=session.bridge_id if session is not None else None,
            method=method,
            limit=limit,
            refused=agent.requests_refused,
        )
        detail = f"{limit} requests of agent {agent.name!r} already wait on a client"
        if method == "session/request_permission" and session is not None:
            await self._approvals.over_limit(agent, msg, params, session, detail)
            return
        err = JsonRpcError(
            INTERNAL_ERROR,
            f"too many requests in flight: {detail} (max_agent_requests)",
            {"maxAgentRequests": limit},
        )
        agent.answer(dumps(rpc.error(msg["id"], err)))

    def _find_parked(
        self, agent: AgentLink, agent_id: JsonRpcId
    ) -> tuple[Session, Forwarded] | None:
        """The request of ``agent`` with that id waiting for a session's next owner, if any."""
        for session in self._hub.sessions.of_agent(agent.name):
            for entry in session.parked:
                if entry.origin is agent and entry.origin_id == agent_id:
                    return session, entry
        return None

    async def _contain(
        self, agent: AgentLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> bool:
        """
        Keep an agent's file access inside the session's roots: the path is replaced by its
        resolved form (what was checked is what the client touches), or the call is refused.
        """
        key = CONTAINED_PATHS[msg["method"]]
        remote.map_from_agent(agent.config, params, key)  # (path_map: the remote's to ours)
        path = params.get(key)
        if path is None and key == "cwd":
            return True  # terminal/create without a cwd: the client's default
        try:
            params[key] = contain(path, session.roots, self._hub.config.policy.deny_paths)
        except PathRefused as exc:
            self._hub.log.warning(
                "file_access_refused",
                agent=agent.name,
                session=session.bridge_id,
                reason=exc.reason,
            )
            await self._hub.audit.record(
                AuditRecord(
                    session=session.bridge_id,
                    agent=agent.name,
                    decision="refused",
                    source="containment",
                    title=msg["method"],
                    detail=f"{exc.reason}: {path!r}",
                )
            )
            agent.answer(
                dumps(
                    rpc.error(
                        msg["id"],
                        JsonRpcError.invalid_params(f"{key} refused ({exc.reason}): {exc}"),
                    )
                )
            )
            return False
        return True

    async def answer_unattended(self, entry: Forwarded, reason: str) -> None:
        """
        Nobody can answer an agent's request: a permission is denied (through the approval
        rules: audited, exactly once), an elicitation declined, anything else an error.
        """
        if isinstance(entry.extra, Ask):
            await self._approvals.unattended(entry, reason)
            return
        agent = entry.origin
        assert isinstance(agent, AgentLink)
        agent.inflight.pop(entry.origin_id, None)
        if entry.method == "elicitation/create":
            agent.answer(dumps(rpc.result(entry.origin_id, {"action": "decline"})))
            await self._hub.audit.record(
                AuditRecord(
                    session=entry.session.bridge_id if entry.session is not None else None,
                    agent=agent.name,
                    decision="decline",
                    source="unattended",
                    title="elicitation/create",
                    detail=reason,
                )
            )
        else:
            agent.answer(
                dumps(
                    rpc.error(
                        entry.origin_id,
                        JsonRpcError(INTERNAL_ERROR, "no client is attached to this session"),
                    )
                )
            )

    async def client_response(self, client: ClientLink, msg: JsonObject) -> None:
        """A client's answer to an agent's request: back to the agent under its own id."""
        client_id = msg["id"]
        well_formed_error(msg)
        entry = client.pending.pop(client_id)
        if entry is None:
            # Late (already settled by the bridge) or unknown: nothing is waiting on it.
            if not await self._approvals.late_answer(client, client_id):
                self._hub.log.debug("client_response_unmatched", id=client_id)
            return
        if isinstance(entry.extra, Ask):
            await self._approvals.client_answer(client, client_id, entry, msg)
            return
        agent = entry.origin
        assert isinstance(agent, AgentLink)
        agent.inflight.pop(entry.origin_id, None)
        msg["id"] = entry.origin_id
        if not agent.answer(dumps(msg)):
            # Not running any more (its requests died with it), or stalled (being stopped).
            self._hub.log.warning("response_not_delivered", agent=agent.name, method=entry.method)


__all__ = ["ELICITATIONS_MAX", "Reverse"]
