"""
Sessions from before a restart, and sessions the bridge never saw: the store's sessions come
back as STORED at start; a ``session/load`` restores one through its agent (or replays its
journal); a stored session can be closed or deleted without its agent; a load of an unknown
id is asked of the selected agent.

The decisions over the session table are pure (``sessions.transitions``); this service does
the waiting.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol

import trio

from acp_bridge.engine.links import AgentState
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import agent_selector
from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps
from acp_bridge.sessions import transitions
from acp_bridge.sessions.table import SessionState, capture_setup
from acp_bridge.store.db import AuditRecord

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from acp_bridge.engine.hub import Hub, WhenReady
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcId
    from acp_bridge.sessions.table import Session


class Forget(Protocol):
    """``Reattach.close_session``: a session out of the table, closed in the store (or deleted)."""

    def __call__(self, session: Session, *, delete: bool = False) -> None: ...


class Restore:
    """
    Restore after a restart; stored, reused and unknown sessions.

    Args:
        hub: the shared state.
        ensure_ready: starts an agent if need be and waits until it is ready.
        when_ready: the same in a task of its own, then a next step (errors answered).
        internal_request: sends a request of the bridge's own to an agent, returns its result.
        strip_setup: drops from a session's setup what the agent cannot take (and logs it).
        reply_error: answers a client's request with an error.
        forward_session_request: sends a session-scoped request on to its agent.
        attach, replay_journal, close_session: of :class:`~acp_bridge.engine.reattach.Reattach`.
        offer: adds the bridge's MCP server to a load of the bridge's own, its token bound
            to the session (``Subagents.offer_bound``).
    """

    def __init__(
        self,
        hub: Hub,
        *,
        ensure_ready: Callable[[AgentLink], Awaitable[None]],
        when_ready: WhenReady,
        internal_request: Callable[[AgentLink, str, JsonObject], Awaitable[Any]],
        strip_setup: Callable[[AgentLink, JsonObject], None],
        reply_error: Callable[[ClientLink, JsonRpcId, JsonRpcError], Awaitable[None]],
        forward_session_request: Callable[
            [ClientLink, JsonObject, JsonObject, Session, AgentLink], Awaitable[None]
        ],
        attach: Callable[[Session, ClientLink], Awaitable[None]],
        replay_journal: Callable[
            [ClientLink, JsonObject, JsonObject, Session, str], Awaitable[None]
        ],
        close_session: Forget,
        offer: Callable[[AgentLink, JsonObject, Session], Awaitable[None]] | None = None,
    ) -> None:
        self._hub = hub
        self._offer = offer
        self._agents = hub.agents
        self._sessions = hub.sessions
        self._ensure_ready = ensure_ready
        self._when_ready = when_ready
        self._internal_request = internal_request
        self._strip_setup = strip_setup
        self._reply_error = reply_error
        self._forward_session_request = forward_session_request
        self._attach = attach
        self._replay_journal = replay_journal
        self._close_session = close_session

    async def restore_all(self) -> None:
        """
        After a restart: the sessions the store knows come back as STORED (listed, loadable;
        their numbering continues), and approvals that were waiting when the bridge stopped
        are settled by the unattended rule (the agents that asked are gone): audited.
        """
        journal = self._hub.journal
        assert journal is not None
        store = journal.store
        rows = await trio.to_thread.run_sync(store.sessions)
        for row in rows:
            session = transitions.restore_row(self._sessions, row, self._agents)
            if session is None:
                continue
            _, last = await trio.to_thread.run_sync(store.journal_bounds, row.bridge_id)
            self._hub.history(session).continue_from(last)
        leftovers = await trio.to_thread.run_sync(store.pending_approvals)
        for key, sid, agent, _params in leftovers:
            await self._hub.audit.record(
                AuditRecord(
                    session=sid,
                    agent=agent,
                    decision="deny",
                    source="restart",
                    detail="pending when the bridge stopped; the agent that asked is gone",
                )
            )
            journal.pending_removed(key)
        if rows or leftovers:
            self._hub.log.info("restored", sessions=len(self._sessions), settled=len(leftovers))

    async def stored_request(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        agent: AgentLink,
    ) -> None:
        """A session known only from the store (the bridge restarted)."""
        method: str = msg["method"]
        if method == "session/load":
            self._hub.spawn(self._restore_session, client, msg, params, session, agent)
        elif method in ("session/close", "session/delete"):
            self._close_session(session, delete=method == "session/delete")
            await client.send(dumps(rpc.result(msg["id"], {})))
        else:
            why = self._hub.unrestorable.get(session.bridge_id)
            raise JsonRpcError.resource_not_found(
                f"session {session.bridge_id!r} cannot continue: {why}"
                if why is not None
                else f"session {session.bridge_id!r} is not live since the bridge restarted: "
                "session/load it first"
            )

    async def reused_request(self, client: ClientLink, msg: JsonObject, session: Session) -> None:
        """An ended session whose agent id went to a new session: it can only be closed."""
        if msg["method"] in ("session/close", "session/delete"):
            self._close_session(session, delete=msg["method"] == "session/delete")
            await client.send(dumps(rpc.result(msg["id"], {})))
            return
        raise JsonRpcError.resource_not_found(
            f"session {session.bridge_id!r} ended: agent {session.agent!r} restarted and gave "
            "its id to a new session"
        )

    async def _restore_session(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        agent: AgentLink,
    ) -> None:
        """
        ``session/load`` after a restart: the agent restores the session when it can
        (``loadSession``: its own replay is relayed); otherwise — or when it fails — the load
        fails with -32002 and the reason, unless the client asked for journal replays
        (``_meta.acp_bridge.journal_replay: true``): then it gets the journal's replay and a
        clear statement that the agent cannot continue it (``_meta.acp_bridge.restored:
        false`` with the reason; a prompt then fails with -32002).
        """
        reason = f"agent {agent.name!r} does not support session/load"
        try:
            await self._ensure_ready(agent)
            if not self._sessions.owns_agent_id(session):
                reason = f"agent {agent.name!r} gave its id to a new session"
            elif agent.capabilities.get("loadSession"):
                self._strip_setup(agent, params)
                query = {**params, "sessionId": session.agent_id}
                query.pop("_meta", None)
                if self._offer is not None:
                    await self._offer(agent, query, session)
                session.state = SessionState.LOADING
                session.client = client
                try:
                    result = await self._internal_request(agent, "session/load", query)
                except JsonRpcError as exc:
                    reason = f"agent {agent.name!r} could not load it: {exc.message}"
                else:
                    session.state = SessionState.ACTIVE
                    capture_setup(session, result)
                    self._hub.persist(session)
                    answer = dict(result) if isinstance(result, dict) else {}
                    answer["_meta"] = {
                        "acp_bridge": {
                            "restored": True,
                            "lastSeq": self._hub.history(session).last_seq,
                        }
                    }
                    await client.send(dumps(rpc.result(msg["id"], answer)))
                    await self._attach(session, client)
                    return
                finally:
                    if session.state is SessionState.LOADING:
                        session.state = SessionState.STORED
                        session.client = None
        except JsonRpcError as exc:
            reason = f"agent {agent.name!r} is not available: {exc.message}"
        try:
            await self._replay_journal(client, msg, params, session, reason)
        except JsonRpcError as exc:
            await self._reply_error(client, msg["id"], exc)

    async def load_unknown(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, sid: str
    ) -> None:
        """``session/load`` of an id the bridge never saw: ask the selected (or default) agent."""
        name = agent_selector(params) or self._hub.default_agent
        agent = self._agents.get(name)
        if agent is None:
            raise JsonRpcError.invalid_params(f"unknown agent {name!r}")
        session = transitions.bind_unknown(self._sessions, name, sid, params)
        if agent.state is AgentState.READY:
            try:
                await self._forward_session_request(client, msg, params, session, agent)
            except JsonRpcError:
                self._sessions.remove(session)  # it never went out: nothing to keep
                raise
        else:
            self._when_ready(
                client,
                msg["id"],
                agent,
                functools.partial(
                    self._forward_session_request, client, msg, params, session, agent
                ),
                failed=functools.partial(self._sessions.remove, session),
            )


__all__ = ["Forget", "Restore"]
