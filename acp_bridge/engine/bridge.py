"""
The bridge: one ACP agent toward its clients, one ACP client toward each agent process.

Tasks (all in the nursery of :meth:`Bridge.run`):

- per client link: a reader (the transport's, calling :meth:`Bridge.handle_client_line`) and
  one writer draining the link's bounded queue;
- per agent process: a reader, a stderr reader, one writer, and the launcher task that owns
  the process.

Backpressure:
    Client → agent hand-offs never wait: each agent has a bounded queue, and a request that
    finds it full is answered with an error at once (a stalled agent never blocks the client's
    other sessions); a notification that finds it full is reported to its client. Answers to
    the agent's own requests are never refused for a full queue: they have a reserve as large
    again, and an agent that lets even that fill up has stopped reading: it is killed, and
    everything waiting on it answered (the same happens to an agent that writes a line over
    ``max_line_bytes``). Agent → client hand-offs wait for room on a *blocking* link (stdio: the one
    client must read what it asked for; nothing is dropped) and disconnect a *non-blocking* link
    whose queue is full (a slow WebSocket observer never stalls anyone else).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from acp_bridge.engine import status as status_report
from acp_bridge.engine.approvals import Approvals
from acp_bridge.engine.cancel import Cancel
from acp_bridge.engine.from_agent import FromAgent
from acp_bridge.engine.from_client import FromClient
from acp_bridge.engine.hub import Hub
from acp_bridge.engine.links import ClientLink
from acp_bridge.engine.listing import Listing
from acp_bridge.engine.log_channel import LogChannel
from acp_bridge.engine.mcp_acp import McpOverAcp
from acp_bridge.engine.reattach import Reattach
from acp_bridge.engine.restore import Restore
from acp_bridge.engine.reverse import Reverse
from acp_bridge.engine.session_requests import SessionRequests
from acp_bridge.engine.subagents import Subagents
from acp_bridge.engine.supervisor import Supervisor

if TYPE_CHECKING:
    from acp_bridge.agents.process import Launcher
    from acp_bridge.config.model import Config
    from acp_bridge.engine.audit import AuditLog
    from acp_bridge.engine.journal import Journal
    from acp_bridge.observe.redact import Redactor
    from acp_bridge.observe.trace import WireTrace
    from acp_bridge.protocol.framing import Oversize
    from acp_bridge.protocol.jsonrpc import JsonObject


class Bridge:
    """
    The routing core with its trio plumbing. Construct, then ``await nursery.start(bridge.run)``.

    Builds the hub and the services in the order they use each other (each is handed those
    it calls), then subscribes the listeners to what the services publish. See "How the
    services fit" in docs/architecture.md.

    Args:
        config: the configuration (agents, limits).
        launcher: how agents are started (a real subprocess launcher, or fakes in tests).
        agent_client_capabilities: the ``clientCapabilities`` every agent is initialized
            with. None (stdio): those of the client whose ``initialize`` started it. A daemon
            serving many clients passes what it can relay to any of them (fs, terminal); each
            call is still gated on the capabilities of the client attached to the session.
        redactor: the secrets to hide in diagnostics; pass the one the logs and the trace use
            (a new one by default). The bridge adds the agents' and sessions' secrets to it.
        tracer: sees every message crossing the bridge (``--trace``); its recent records are
            the console's sequence view.
    """

    def __init__(
        self,
        config: Config,
        launcher: Launcher,
        *,
        agent_client_capabilities: JsonObject | None = None,
        audit: AuditLog | None = None,
        tracer: WireTrace | None = None,
        journal: Journal | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self.trace = tracer
        self.hub = hub = Hub.build(
            config,
            fixed_client_capabilities=agent_client_capabilities,
            audit=audit,
            tracer=tracer,
            journal=journal,
            redactor=redactor,
        )
        self.logs = LogChannel(hub)
        self.approvals = Approvals(hub, self.logs)
        self.reverse = Reverse(hub, self.approvals)
        self.mcp = McpOverAcp(hub)
        self.reattach = Reattach(hub, self.logs, self.reverse, self.approvals)
        self.from_agent = FromAgent(hub, self.logs, self.reverse, self.reattach, self.mcp)
        # (the Bridge itself: a child's agent is started by the supervisor, built after it)
        self.subagents = Subagents(
            hub, self.from_agent, self.approvals, self.reattach, self.mcp, self
        )
        self.supervisor = Supervisor(
            hub, launcher, self.logs, self.from_agent, self.approvals, self.subagents
        )
        self.cancel = Cancel(hub, self.logs, self.from_agent, self.approvals, self.subagents)
        self.listing = Listing(hub)
        self.restore = Restore(hub, self.supervisor, self.reattach, self.subagents)
        self.session_requests = SessionRequests(
            hub,
            self.supervisor,
            self.from_agent,
            self.restore,
            self.reattach,
            self.cancel,
            self.subagents,
        )
        self.from_client = FromClient(
            hub,
            self.session_requests,
            self.supervisor,
            self.listing,
            self.cancel,
            self.reverse,
            self.approvals,
            self.mcp,
        )
        # what the services publish, and who listens
        hub.sessions.moved.subscribe(self.reattach.kept_moved)
        hub.sessions.removed.subscribe(self.subagents.removed)
        hub.sessions.removed.subscribe(self.mcp.session_removed)
        self.from_agent.opened.subscribe(self.subagents.offers.opened)
        self.supervisor.sessions_ended.subscribe(self.subagents.agent_gone)
        self.supervisor.sessions_ended.subscribe(self.mcp.agent_gone)
        self.mcp.own_calls.subscribe(self.subagents.offers.acp_call)

    async def run(self, *, task_status: trio.TaskStatus[Bridge] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; agents are stopped when it ends."""
        hub = self.hub
        async with trio.open_nursery() as nursery:
            hub.nursery = nursery
            nursery.start_soon(hub.deadlines.run)
            if hub.audit.store is not None:
                nursery.start_soon(hub.audit.run)
            if hub.journal is not None:
                await self.restore.restore_all()
                nursery.start_soon(hub.journal.run)
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                hub.stopping = True

    # ------------------------------------------------------------------ what the faces call

    def open_client(self, name: str, *, blocking: bool, transport: str = "stdio") -> ClientLink:
        hub = self.hub
        link = ClientLink(
            name=name,
            queue_size=hub.config.bridge.client_queue,
            blocking=blocking,
            tracer=hub.tracer,
            counters=hub.counters,
            ids=hub.client_ids,
            request_ids=hub.client_request_ids,
            transport=transport,
        )
        hub.clients.add(link)
        return link

    async def handle_client_line(self, client: ClientLink, line: bytes | Oversize) -> None:
        """One line from a client: answered, or routed to an agent (``engine.from_client``)."""
        await self.from_client.line(client, line)

    async def close_client(self, client: ClientLink, reason: str) -> None:
        """The client is gone: its sessions detach (see :meth:`Reattach.close_client`)."""
        await self.reattach.close_client(client, reason)
        self.mcp.client_gone(client)  # (its MCP servers were the connection's, not the sessions')

    def status(self) -> JsonObject:
        """Everything ``acp-bridge status`` and ``/metrics`` show (see ``engine.status``)."""
        return status_report.status(self.hub, self.approvals, self.reverse)

    def tree(self) -> JsonObject:
        """The agents and their sessions, for the console's session tree (``engine.status``)."""
        return status_report.tree(self.hub)

    def session_log(
        self, bridge_id: str, entries: bool = True
    ) -> tuple[list[tuple[int, bytes]], bool, int] | None:
        """A session's history (numbered lines, whether complete, its last number; without
        the lines when not ``entries``); None when there is no such session (the console's
        session page)."""
        session = self.hub.sessions.get(bridge_id)
        if session is None:
            return None
        history = session.history
        if history is None:
            return [], True, 0
        if not entries:
            return [], True, history.last_seq
        lines, complete = history.after(0)
        return lines, complete, history.last_seq

    def health(self) -> tuple[bool, JsonObject]:
        """Whether the default agent can serve now, and every agent's state (for /healthz)."""
        return status_report.health(self.hub)


__all__ = ["Bridge"]
