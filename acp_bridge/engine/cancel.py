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
from acp_bridge.protocol.wire import TAKE_OVER_HINT
from acp_bridge.sessions import transitions
from acp_bridge.sessions.table import Forwarded

if TYPE_CHECKING:
    from acp_bridge.engine.approvals import Approvals
    from acp_bridge.engine.from_agent import FromAgent
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.engine.log_channel import LogChannel
    from acp_bridge.engine.subagents import Subagents
    from acp_bridge.protocol.jsonrpc import JsonObject
    from acp_bridge.sessions.table import Session


class Cancel:
    """``session/cancel`` and what follows it, for one bridge."""

    def __init__(
        self,
        hub: Hub,
        logs: LogChannel,
        from_agent: FromAgent,
        approvals: Approvals,
        subagents: Subagents,
    ) -> None:
        """
        Args:
            hub: the shared state.
            logs: tells a client the bridge ended a turn its agent did not.
            from_agent: takes the bridge's ``cancelled`` answer as if the agent had sent it.
            approvals: answers every pending permission request of a session.
            subagents: cancels the session's running sub-agents first.
        """
        self._hub = hub
        self._logs = logs
        self._from_agent = from_agent
        self._approvals = approvals
        self._subagents = subagents

    async def cancel_session(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        hub = self._hub
        sid = params.get("sessionId")
        session = hub.sessions.get(sid) if isinstance(sid, str) else None
        if (
            session is not None
            and session.watchers is not None
            and transitions.watcher_of(session, client) is not None
        ):
            # (A notification has no answer: the watcher is told on the log channel.)
            await self._logs.send_log(
                client,
                "warning",
                f"session/cancel refused: this connection only watches the session; "
                f"{TAKE_OVER_HINT}",
                session=session,
            )
            return
        if session is None or session.client not in (client, None):
            return  # unknown, or not this connection's to cancel
        agent = hub.agents[session.agent]
        # (First: the parent's tool calls get their children's cancelled turns.)
        self._subagents.cascade(session)
        if session.rewrite:
            params["sessionId"] = session.agent_id
        if not agent.send_nowait(dumps(msg)):
            hub.not_delivered(client, agent, "session/cancel", session)
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
            await self._from_agent.agent_response(
                agent, {"jsonrpc": "2.0", "id": bridge_id, "result": result}
            )
        client = session.client
        if client is not None and not client.closed:
            await self._logs.send_log(
                client,
                "warning",
                f"agent {agent.name!r} did not end the cancelled turn within {grace:g}s: "
                "the bridge ended it; the agent's late answer will be dropped",
                session=session,
            )

    async def settle_permissions(self, session: Session, outcome: str, reason: str) -> None:
        """Answer every pending permission request of a session ``outcome`` at once."""
        assert outcome == "cancelled"
        await self._approvals.settle_session(session, reason)


__all__ = ["Cancel"]
