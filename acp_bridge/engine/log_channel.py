"""
The log channel: diagnostics for clients as ``_acp_bridge/log`` notifications (shaped after
ACP RFD #392), each client getting those at or above the level it asked for.

Two kinds: the bridge's own, about a session or a connection (:meth:`LogChannel.send_log`),
and those about an agent (:meth:`LogChannel.agent_log`): its stderr, stray stdout, starts
and exits. An agent's output is rate-limited per agent (``protocol.diagnostics.LogBudget``);
what the
budget holds back is summarized ("N lines ... suppressed") a second after the first line it
held back. Secrets are redacted from what an agent wrote before anyone sees it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

import trio

from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.diagnostics import LOG_METHOD, log_params
from acp_bridge.protocol.jsonrpc import dumps

if TYPE_CHECKING:
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.sessions.table import Session

#: seconds after the first line held back that the summary of the held-back lines is sent
SUMMARY_DELAY: Final = 1.0


class LogChannel:
    """The ``_acp_bridge/log`` notifications of one bridge."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self._sessions = hub.sessions
        self._clients = hub.clients
        self._redactor = hub.redactor
        self._deadlines = hub.deadlines

    async def send_log(
        self,
        client: ClientLink,
        level: str,
        message: str,
        *,
        session: Session | None = None,
        **data: Any,
    ) -> None:
        """One notification to one client, if it asked for this level."""
        if not client.wants_log(level):
            return
        session_id = None
        if session is not None:
            session_id = session.bridge_id
            data.setdefault("agent", session.agent)
        params = log_params(level, message, session_id=session_id, data=data)
        await client.send(dumps(rpc.notification(LOG_METHOD, params)))

    async def agent_log(
        self, agent: AgentLink, level: str, message: str, *, stream: str | None
    ) -> None:
        """
        A diagnostic about an agent, to the clients of its sessions (all clients while it has
        none). Agent output (``stream``: ``stderr``, ``stdout``) is rate-limited per agent; the
        bridge's own events (``stream=None``) never are. Secrets are redacted.
        """
        if stream is not None and not self._log_budget(agent):
            return
        text = self._redactor.redact(message)
        if stream is not None:
            agent.log.info("agent_" + stream, level=level, line=text)
        sessions = self._sessions.of_agent(agent.name)
        data: dict[str, Any] = {"agent": agent.name}
        if stream is not None:
            data["stream"] = stream
        params = log_params(
            level,
            text,
            logger=f"agent.{agent.name}" if stream is not None else "acp_bridge",
            session_id=sessions[0].bridge_id if len(sessions) == 1 else None,
            data=data,
        )
        line = dumps(rpc.notification(LOG_METHOD, params))
        owners = {s.client for s in sessions if s.client is not None}
        targets = owners if sessions else {c for c in self._clients if c.initialized}
        for client in targets:
            if client.wants_log(level):
                # Never waits: a client whose queue is full loses this line, nothing more.
                client.offer(line)

    def _log_budget(self, agent: AgentLink) -> bool:
        budget = agent.log_budget
        now = trio.current_time()
        if budget.take(now):
            return True
        if budget.suppressed == 1:  # the first held back: its summary is due a second later
            self._deadlines.schedule(
                ("log_suppressed", agent),
                now + SUMMARY_DELAY,
                functools.partial(self._log_summary, agent),
            )
        return False

    async def _log_summary(self, agent: AgentLink) -> None:
        count = agent.log_budget.take_suppressed()
        if count:
            await self.agent_log(
                agent,
                "warning",
                f"{count} lines of agent output suppressed (more than {agent.log_budget.rate:g}/s)",
                stream=None,
            )


__all__ = ["LogChannel"]
