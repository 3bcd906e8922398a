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

import collections
import functools
from typing import TYPE_CHECKING, Any

import structlog
import trio

from acp_bridge.agents.backoff import Restarts
from acp_bridge.engine import status as status_report
from acp_bridge.engine.approvals import Approvals, Ask
from acp_bridge.engine.audit import AuditLog
from acp_bridge.engine.cancel import Cancel
from acp_bridge.engine.from_agent import FromAgent
from acp_bridge.engine.from_client import FromClient
from acp_bridge.engine.hub import Hub
from acp_bridge.engine.links import (
    AgentLink,
    ClientLink,
    Tracer,
)
from acp_bridge.engine.listing import Listing
from acp_bridge.engine.log_channel import LogChannel
from acp_bridge.engine.reattach import Reattach
from acp_bridge.engine.restore import Restore
from acp_bridge.engine.reverse import Reverse
from acp_bridge.engine.session_requests import SessionRequests
from acp_bridge.engine.subagents import Subagents, launch_config
from acp_bridge.engine.supervisor import Supervisor
from acp_bridge.observe.redact import Redactor
from acp_bridge.runtime import pipes
from acp_bridge.sessions.table import (
    Forwarded,
    History,
    Session,
    SessionTable,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from acp_bridge.agents.process import Launcher
    from acp_bridge.config.model import Config
    from acp_bridge.engine.journal import Journal
    from acp_bridge.protocol.framing import Oversize
    from acp_bridge.protocol.jsonrpc import (
        JsonObject,
    )

logger = structlog.get_logger("acp_bridge.bridge")


class Bridge:
    """
    The routing core with its trio plumbing. Construct, then ``await nursery.start(bridge.run)``.

    Args:
        config: the configuration (agents, limits).
        launcher: how agents are started (a real subprocess launcher, or fakes in tests).
        agent_client_capabilities: the ``clientCapabilities`` every agent is initialized
            with. None (stdio): those of the client whose ``initialize`` started it. A daemon
            serving many clients passes what it can relay to any of them (fs, terminal); each
            call is still gated on the capabilities of the client attached to the session.
        redactor: the secrets to hide in diagnostics; pass the one the logs and the trace use
            (a new one by default). The bridge adds the agents' and sessions' secrets to it.
    """

    def __init__(
        self,
        config: Config,
        launcher: Launcher,
        *,
        agent_client_capabilities: JsonObject | None = None,
        audit: AuditLog | None = None,
        tracer: Tracer | None = None,
        journal: Journal | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        redactor = redactor if redactor is not None else Redactor()
        for agent_config in config.agents.values():
            redactor.add_env(agent_config.env)
        counters: collections.Counter[str] = collections.Counter()
        limits = config.bridge
        agents = {
            name: AgentLink(
                config=agent,
                queue_size=limits.agent_queue,
                tracer=tracer,
                counters=counters,
                restarts=Restarts.from_config(limits),
                redactor=redactor,
            )
            for name, agent in config.agents.items()
        }
        #: what the services share (see _hub); the attributes below are the same objects
        self.hub = hub = Hub(
            config=config,
            audit=audit if audit is not None else AuditLog(),
            redactor=redactor,
            agents=agents,
            default_agent=config.default_agent.name,
            tracer=tracer,
            journal=journal,
            fixed_client_capabilities=agent_client_capabilities,
            counters=counters,
            sessions=SessionTable(on_move=self._kept_moved),
        )
        self.config = config
        self.tracer = tracer
        self.journal = journal
        self._unrestorable = hub.unrestorable
        self.redactor = redactor
        self.counters = counters
        self._fixed_client_capabilities = agent_client_capabilities
        self.agents = agents
        self.default_agent = hub.default_agent
        self.sessions = hub.sessions
        self.clients = hub.clients
        self._client_ids = hub.client_ids
        self._client_request_ids = hub.client_request_ids
        #: agents' readers handling lines right now (see ``READ_ROUND_LINES``)
        self._busy_readers = 0
        self.deadlines = hub.deadlines
        self.audit = hub.audit
        self.logs = LogChannel(hub)
        #: every permission request: rule, unattended, ask, deadline, one settlement
        self.approvals = Approvals(
            config.policy,
            self.audit,
            sessions=hub.sessions,
            deadlines=hub.deadlines,
            journal=journal,
            send_log=self.logs.send_log,
            present=self._present,
        )
        #: agent → client requests: gates, containment, the approvals, the answers back
        self.reverse = Reverse(hub, approvals=self.approvals, present=self._present)
        #: sessions coming and going: detach, expire, forget, attach, reattach with replay
        self.reattach = Reattach(
            hub,
            answer_unattended=self.reverse.answer_unattended,
            internal_request=self._internal_request,
            agent_log=self.logs.agent_log,
            send_log=self.logs.send_log,
            show_approval=self.approvals.show,
            forget_client=self.approvals.forget_client,
        )
        #: every line an agent writes: the relay (hot path), responses, its requests
        self.from_agent = FromAgent(
            hub,
            read_chunk=pipes.READ_BUFFER_BYTES,
            agent_log=self.logs.agent_log,
            agent_request=self.reverse.agent_request,
            agent_notification=self.reverse.agent_notification,
            schedule_detach=self.reattach.schedule_detach,
            take_held=self.reattach.take_held,
            forget=self.reattach.forget,
            close_session=self.reattach.close_session,
            take_ownership=self.reattach.take_ownership,
            present_parked=self.reattach.present_parked,
            opened=self._opened,
        )
        #: the agents' lives: start on demand, initialize, death, stop
        self.supervisor = Supervisor(
            hub,
            launcher=launcher,
            read_chunk=pipes.READ_BUFFER_BYTES,
            reader=self.from_agent.reader,
            agent_log=self.logs.agent_log,
            undo_forward=self.from_agent.undo_forward,
            approval_agent_gone=self.approvals.agent_gone,
            ask_type=Ask,
            sessions_ended=self._sessions_ended,
        )
        #: sub-agents: the bridge's MCP server and the children its tools open (_subagents)
        self.subagents = Subagents(
            hub,
            ensure_ready=self.supervisor.ensure_ready,
            internal_request=self.supervisor.internal_request,
            open_session=self.from_agent.open_session,
            settle_session=self.approvals.settle_session,
            forget=self.reattach.forget,
        )
        hub.sessions.on_remove = self.subagents.removed
        self.supervisor.launch_config = functools.partial(launch_config, self.subagents)
        self.cancel = Cancel(
            hub,
            not_delivered=hub.not_delivered,
            agent_response=self.from_agent.agent_response,
            send_log=self.logs.send_log,
            settle_session=self.approvals.settle_session,
            cascade=self.subagents.cascade,
        )
        self.listing = Listing(
            hub, internal_request=self.supervisor.internal_request, reply_error=hub.reply_error
        )
        #: a client's requests on its sessions, and forward: the last step to an agent
        self.session_requests = SessionRequests(
            hub,
            when_ready=self.supervisor.when_ready,
            undo_forward=self.from_agent.undo_forward,
            load_unknown=self._load_unknown,
            stored_request=self._stored_request,
            reused_request=self._reused_request,
            reattach=self.reattach.reattach,
            attach=self.reattach.attach,
            close_session=self.reattach.close_session,
            settle_permissions=self.cancel.settle_permissions,
            offer=self.subagents.offer,
        )
        #: sessions from before a restart (stored), reused ids, loads of unknown sessions
        self.restore = Restore(
            hub,
            ensure_ready=self.supervisor.ensure_ready,
            when_ready=self.supervisor.when_ready,
            internal_request=self.supervisor.internal_request,
            strip_setup=hub.strip_setup,
            reply_error=hub.reply_error,
            forward_session_request=self.session_requests.forward_session_request,
            attach=self.reattach.attach,
            replay_journal=self.reattach.replay_journal,
            close_session=self.reattach.close_session,
            offer=self.subagents.offer_bound,
        )
        self.log = logger
        #: every line a client sends (the transports call handle_client_line)
        self.from_client = FromClient(
            hub,
            session_request=self.session_requests.request,
            forward=self.session_requests.forward,
            ensure_ready=self.supervisor.ensure_ready,
            when_ready=self.supervisor.when_ready,
            status=self.status,
            session_list=self.listing.session_list,
            cancel_session=self.cancel.cancel_session,
            client_response=self.reverse.client_response,
        )

    # ------------------------------------------------------------------ lifetime

    async def run(self, *, task_status: trio.TaskStatus[Bridge] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; agents are stopped when it ends."""
        async with trio.open_nursery() as nursery:
            self.hub.nursery = nursery
            nursery.start_soon(self.deadlines.run)
            if self.audit.store is not None:
                nursery.start_soon(self.audit.run)
            if self.journal is not None:
                await self.restore.restore_all()
                nursery.start_soon(self.journal.run)
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self.hub.stopping = True

    def persist(self, session: Session, state: str = "active") -> None:
        """Record a session's row in the store (no-op without one)."""
        self.hub.persist(session, state)

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        self.hub.spawn(fn, *args)

    @property
    def stopping(self) -> bool:
        """The bridge is ending: no task is started any more."""
        return self.hub.stopping

    @property
    def _client_capabilities(self) -> JsonObject:
        return self.hub.client_capabilities

    @_client_capabilities.setter
    def _client_capabilities(self, value: JsonObject) -> None:
        self.hub.client_capabilities = value

    def open_client(self, name: str, *, blocking: bool) -> ClientLink:
        link = ClientLink(
            name=name,
            queue_size=self.config.bridge.client_queue,
            blocking=blocking,
            tracer=self.tracer,
            counters=self.counters,
            ids=self._client_ids,
            request_ids=self._client_request_ids,
        )
        self.clients.add(link)
        return link

    async def close_client(self, client: ClientLink, reason: str) -> None:
        """The client is gone: its sessions detach (see :meth:`Reattach.close_client`)."""
        await self.reattach.close_client(client, reason)

    async def send_log(
        self,
        client: ClientLink,
        level: str,
        message: str,
        *,
        session: Session | None = None,
        **data: Any,
    ) -> None:
        """A ``_acp_bridge/log`` notification to one client, if it asked for this level."""
        await self.logs.send_log(client, level, message, session=session, **data)

    def status(self) -> JsonObject:
        """Everything ``acp-bridge status`` and ``/metrics`` show (see ``engine.status``)."""
        return status_report.status(
            self.hub,
            approvals=self.approvals.counts,
            requests_waiting=self.reverse.requests_waiting,
        )

    def health(self) -> tuple[bool, JsonObject]:
        """Whether the default agent can serve now, and every agent's state (for /healthz)."""
        return status_report.health(self.hub)

    # ------------------------------------------------------------------ client → bridge

    async def handle_client_line(self, client: ClientLink, line: bytes | Oversize) -> None:
        """One line from a client: answered, or routed to an agent (``engine.from_client``)."""
        await self.from_client.line(client, line)

    def _history(self, session: Session) -> History:
        return self.hub.history(session)

    # The session requests and the restore need each other: these two are looked up when
    # called (the restore is built after the session requests).
    async def _load_unknown(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, sid: str
    ) -> None:
        await self.restore.load_unknown(client, msg, params, sid)

    # The approvals, the reverse requests and the relay are built before the sub-agents (which
    # need them): these are looked up when called.
    def _present(self, session: Session, client: ClientLink, params: JsonObject) -> JsonObject:
        return self.subagents.present(session, client, params)

    def _opened(self, entry: Forwarded, session: Session | None) -> None:
        self.subagents.opened(entry, session)

    def _sessions_ended(self, agent: AgentLink) -> None:
        self.subagents.agent_gone(agent)

    async def _internal_request(self, agent: AgentLink, method: str, params: JsonObject) -> Any:
        # (The reattach is built before the supervisor, which needs the relay, which needs
        # the reattach: this one is looked up when called.)
        return await self.supervisor.internal_request(agent, method, params)

    async def _stored_request(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        agent: AgentLink,
    ) -> None:
        await self.restore.stored_request(client, msg, params, session, agent)

    async def _reused_request(self, client: ClientLink, msg: JsonObject, session: Session) -> None:
        await self.restore.reused_request(client, msg, session)

    # ------------------------------------------------------------------ agents

    async def ensure_ready(self, agent: AgentLink) -> None:
        """Start the agent if needed and wait until it completed ``initialize`` (Supervisor)."""
        await self.supervisor.ensure_ready(agent)

    async def agent_log(
        self, agent: AgentLink, level: str, message: str, *, stream: str | None
    ) -> None:
        """A diagnostic about an agent to the clients of its sessions (see LogChannel)."""
        await self.logs.agent_log(agent, level, message, stream=stream)

    def _kept_moved(self, old: str, new: str) -> None:
        """
        A session only the store has (closed, or not loaded back) gave its id to a new one:
        its row and journal move to ``new`` (written before anything else of the commit, and
        taking along what was still waiting for it: nothing of the new session mixes in).
        """
        # (A closed session's history gets nothing more: nothing would spill under ``old``.)
        if self.journal is not None:
            self.journal.rename(old, new)
        self.log.info("kept_session_moved", session=old, to=new)

    async def stop_agents(self) -> None:
        """Stop every agent (stdin EOF → SIGTERM → SIGKILL) and wait for them."""
        await self.supervisor.stop_agents()


__all__ = ["Bridge", "ClientLink"]
