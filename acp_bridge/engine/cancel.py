"""
Cancelling a session's turn: ``session/cancel`` from its client, the cancel grace, and
settling the session's pending permission requests.

A ``session/cancel`` goes to the agent and answers the session's permission requests
``cancelled`` at once (the spec asks the client side to). If ``cancel_grace`` is set and the
agent has not ended the turn when it passes, the bridge answers the prompt itself
(``stopReason: cancelled``), so a client never waits on an agent that ignores cancels.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import trio

from acp_bridge.protocol.jsonrpc import dumps
from acp_bridge.sessions.table import Forwarded

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.protocol.jsonrpc import JsonObject
    from acp_bridge.sessions.table import Session


class Cancel:
    """``session/cancel`` and what follows it, for one bridge."""

    def __init__(
        self,
        hub: Hub,
        *,
        not_delivered: Callable[[ClientLink, AgentLink, str, Session | None], None],
        agent_response: Callable[[AgentLink, JsonObject], Awaitable[None]],
        send_log: Callable[..., Awaitable[None]],
        settle_session: Callable[[Session, str], Awaitable[None]],
        cascade: Callable[[Session], None] | None = None,
    ) -> None:
        """
        Args:
            hub: the shared state.
            not_delivered: tells a client its notification found the agent's queue full.
            agent_response: handles a response as if the agent had sent it.
            send_log: a ``_acp_bridge/log`` notification to one client.
            settle_session: answers every pending permission request of a session.
            cascade: cancels the session's running sub-agents (``Subagents.cascade``).
        """
        self._hub = hub
        self._not_delivered = not_delivered
        self._agent_response = agent_response
        self._send_log = send_log
        self._settle_session = settle_session
        self._cascade = cascade

    async def cancel_session(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        hub = self._hub
        sid = params.get("sessionId")
        session = hub.sessions.get(sid) if isinstance(sid, str) else None
        if session is None or session.client not in (client, None):
            return  # unknown, or not this connection's to cancel
        agent = hub.agents[session.agent]
        if self._cascade is not None:
            # (First: the parent's tool calls get their children's cancelled turns.)
            self._cascade(session)
        if session.rewrite:
            params["sessionId"] = session.agent_id
        if not agent.send_nowait(dumps(msg)):
            self._not_delivered(client, agent, "session/cancel", session)
        await self.settle_permissions(session, "cancelled", "cancel")
        grace = hub.config.bridge.cancel_grace
        key = ("cancel", session)
        if grace > 0 and key not in hub.deadlines and self._prompts_of(agent, session):
            # (A second cancel does not push the deadline back.)
            hub.deadlines.schedule(
                key,
                trio.current_time() + grace,
                functools.partial(self._cancel_grace_expired, agent, session),
            )

    def _prompts_of(self, agent: AgentLink, session: Session) -> list[int]:
        """The agent-link ids of the session's prompts still waiting on ``agent``."""
        return [
            bridge_id
            for bridge_id, entry in agent.pending.find(
                lambda e: (
                    isinstance(e, Forwarded)
                    and e.session is session
                    and e.method == "session/prompt"
                )
            )
        ]

    async def _cancel_grace_expired(self, agent: AgentLink, session: Session) -> None:
        """
        ``cancel_grace`` passed since a ``session/cancel`` and the agent still has not ended
        the turn: each of the session's prompts still waiting on it is answered
        ``cancelled`` here, as if by the agent (so held, ordered and accounted the same
        way); the agent's own answer, if it ever comes, finds nothing waiting and is
        dropped (logged).
        """
        late = self._prompts_of(agent, session)
        if not late:
            return
        grace = self._hub.config.bridge.cancel_grace
        session.log.warning("cancel_grace_expired", prompts=len(late))
        for bridge_id in late:
            result = {
                "stopReason": "cancelled",
                "_meta": {"acp_bridge": {"cancelGraceExpired": grace}},
            }
            await self._agent_response(agent, {"jsonrpc": "2.0", "id": bridge_id, "result": result})
        client = session.client
        if client is not None and not client.closed:
            await self._send_log(
                client,
                "warning",
                f"agent {agent.name!r} did not end the cancelled turn within {grace:g}s: "
                "the bridge ended it; the agent's late answer will be dropped",
                session=session,
            )

    async def settle_permissions(self, session: Session, outcome: str, reason: str) -> None:
        """Answer every pending permission request of a session ``outcome`` at once."""
        assert outcome == "cancelled"
        await self._settle_session(session, reason)


__all__ = ["Cancel"]
