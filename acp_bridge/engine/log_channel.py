"""
The log channel: diagnostics for clients as ``_acp_bridge/log`` notifications (shaped after
ACP RFD #392), each client getting those at or above the level it asked for; and the
session-scoped ones as ACP ``notice`` session updates, to the clients that advertise
``session.notices`` (:meth:`LogChannel.notice`; what each says: ``protocol.notices``).

Two kinds: the bridge's own, about a session or a connection (:meth:`LogChannel.send_log`),
and those about an agent (:meth:`LogChannel.agent_log`): its stderr, stray stdout, starts
and exits. An agent's output is rate-limited per agent (``protocol.diagnostics.LogBudget``);
what the
budget holds back is summarized ("N lines ... suppressed") a second after the first line it
held back. Secrets are redacted from what an agent wrote before anyone sees it.

Notices are bounded per connection (``protocol.notices.NOTICE_RATE``, a token bucket): what
the bound holds back is dropped, counted, and told in one notice
(``NOTICE_SUMMARY_DELAY`` after the first held back). They never wait: a client whose queue is
full loses the notice, nothing more. They are live, never in a session's history.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

import trio

from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.diagnostics import LEVEL_RANK, LOG_METHOD, log_params
from acp_bridge.protocol.jsonrpc import dumps
from acp_bridge.protocol.notices import (
    NOTICE_SUMMARY_DELAY,
    Notice,
    notice_params,
    stderr_notice,
    suppressed_notice,
    wants_notices,
)
from acp_bridge.sessions.table import SessionState
from acp_bridge.sessions.transitions import watcher_of

if TYPE_CHECKING:
    from collections.abc import Iterable

    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.sessions.table import Session

#: seconds after the first line held back that the summary of the held-back lines is sent
SUMMARY_DELAY: Final = 1.0
#: an agent's stderr line at this level or above is also a notice on its sessions
STDERR_NOTICE_RANK: Final = LEVEL_RANK["error"]


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
        if stream == "stderr" and LEVEL_RANK.get(level, 0) >= STDERR_NOTICE_RANK:
            # (Within the agent's log budget, taken above: a flood is cut there first.)
            self.agent_notice(agent, stderr_notice(agent.name, text))

    # ------------------------------------------------------------------ notices

    def notice(self, session: Session, notice: Notice) -> None:
        """
        A notice on ``session``, to its client and to each of its watchers that advertised
        ``session.notices``, each within its own budget (never waits; redacted).
        """
        client = session.client
        if (
            client is not None
            and not client.closed
            and wants_notices(client.capabilities)
            # (not a sub-agent's whose client does not see the child's session)
            and (session.watch is None or session.watch({}))
            and self._notice_budget(client, session)
        ):
            self._offer_notice(client, session, notice)
        if session.watchers is not None:
            for watcher in session.watchers:
                link: ClientLink = watcher.link
                if (
                    not link.closed
                    and wants_notices(link.capabilities)
                    and self._notice_budget(link, session)
                ):
                    self._offer_notice(link, session, notice)

    def agent_notice(
        self, agent: AgentLink, notice: Notice, sessions: Iterable[Session] | None = None
    ) -> None:
        """A notice about an agent on each of ``sessions`` (default: its live ones)."""
        if sessions is None:
            sessions = [
                s
                for s in self._sessions.of_agent(agent.name)
                if s.state in (SessionState.ACTIVE, SessionState.LOADING)
            ]
        for session in sessions:
            self.notice(session, notice)

    def _offer_notice(self, client: ClientLink, session: Session, notice: Notice) -> None:
        redact = self._redactor.redact
        said = Notice(
            notice.severity,
            redact(notice.title),
            redact(notice.description) if notice.description is not None else None,
        )
        params = notice_params(session.bridge_id, said)
        client.offer(dumps(rpc.notification("session/update", params)))

    def _notice_budget(self, client: ClientLink, session: Session) -> bool:
        budget = client.notice_budget
        now = trio.current_time()
        if budget.take(now):
            return True
        if budget.suppressed == 1:  # the first held back: the count is told later
            self._deadlines.schedule(
                ("notice_suppressed", client),
                now + NOTICE_SUMMARY_DELAY,
                functools.partial(self._notice_summary, client, session),
            )
        return False

    async def _notice_summary(self, client: ClientLink, session: Session) -> None:
        count = client.notice_budget.take_suppressed()
        if (
            count
            and not client.closed
            and (session.client is client or watcher_of(session, client) is not None)
        ):
            self._offer_notice(client, session, suppressed_notice(count))

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
