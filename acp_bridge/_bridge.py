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
from typing import TYPE_CHECKING, Any, Final

import structlog
import trio

from acp_bridge import __version__
from acp_bridge import _pipes as pipes
from acp_bridge import _remote as remote
from acp_bridge._agent import (
    AgentStartError,
    AgentTransport,
    Launcher,
    StderrRing,
)
from acp_bridge._approvals import Approvals, Ask, park
from acp_bridge._audit import AuditLog
from acp_bridge._backoff import CrashLoop, Restarts
from acp_bridge._capabilities import (
    CONNECTION_METHODS,
    LOOK_ONLY_METHODS,
    SESSION_METHODS,
    agent_selector,
    check_prompt_content,
    has_session_cap,
)
from acp_bridge._diagnostics import LEVEL_RANK as _LEVEL_RANK
from acp_bridge._diagnostics import LOG_BURST, LOG_LEVELS, LOG_RATE, guess_level
from acp_bridge._framing import LineDecoder, Oversize
from acp_bridge._from_agent import FromAgent
from acp_bridge._heap import memory_figures
from acp_bridge._hub import Hub
from acp_bridge._jsonrpc import (
    INTERNAL_ERROR,
    RESOURCE_NOT_FOUND,
    JsonObject,
    JsonRpcError,
    JsonRpcId,
    Kind,
    classify,
    dumps,
    loads,
    params_of,
)
from acp_bridge._jsonrpc import error as error_msg
from acp_bridge._jsonrpc import notification as notification_msg
from acp_bridge._jsonrpc import request as request_msg
from acp_bridge._jsonrpc import result as result_msg
from acp_bridge._links import (
    AgentLink,
    AgentState,
    ClientLink,
    Tracer,
    Waiter,
    pump_channel,
)
from acp_bridge._redact import Redactor
from acp_bridge._reverse import Reverse
from acp_bridge._routing import (
    HELD_RESPONSES_MAX,
    Forwarded,
    History,
    Session,
    SessionState,
    SessionTable,
    Setup,
    capture_setup,
    roots_of,
)
from acp_bridge._store import AuditRecord
from acp_bridge._wire import (
    PROTOCOL_VERSION,
    attached_elsewhere,
    bridge_meta,
    decode_cursor,
    encode_cursor,
    id_of,
    is_id,
    set_seq,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from acp_bridge._config import Config
    from acp_bridge._journal import Journal

logger = structlog.get_logger("acp_bridge.bridge")

#: how long to wait for an exited agent's status before failing its requests without it
EXIT_STATUS_WAIT: Final = 0.25
#: bytes per read of a client's or an agent's stream (the agents' readers: ``_from_agent``)
READ_CHUNK: Final = 64 * 1024


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
        self._launcher = launcher
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
        self.deadlines = hub.deadlines
        self.audit = hub.audit
        self.approvals = Approvals(
            config.policy,
            self.audit,
            sessions=hub.sessions,
            deadlines=hub.deadlines,
            journal=journal,
            send_log=self.send_log,
        )
        self.reverse = Reverse(hub, approvals=self.approvals)
        self.from_agent = FromAgent(
            hub,
            read_chunk=READ_CHUNK,
            agent_log=self.agent_log,
            agent_request=self.reverse.agent_request,
            agent_withdrew=self.reverse.agent_withdrew,
            schedule_detach=self._schedule_detach,
            take_held=self._take_held,
            forget=self._forget,
        )
        self.log = logger

    # ------------------------------------------------------------------ lifetime

    async def run(self, *, task_status: trio.TaskStatus[Bridge] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; agents are stopped when it ends."""
        async with trio.open_nursery() as nursery:
            self.hub.nursery = nursery
            nursery.start_soon(self.deadlines.run)
            if self.audit.store is not None:
                nursery.start_soon(self.audit.run)
            if self.journal is not None:
                await self._restore()
                nursery.start_soon(self.journal.run)
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self.hub.stopping = True

    async def _restore(self) -> None:
        """
        After a restart: the sessions the store knows come back as STORED (listed, loadable;
        their numbering continues), and approvals that were waiting when the bridge stopped
        are settled by the unattended rule (the agents that asked are gone): audited.
        """
        assert self.journal is not None
        store = self.journal.store
        rows = await trio.to_thread.run_sync(store.sessions)
        for row in rows:
            if row.state == "closed" or row.agent not in self.agents:
                # Not loaded back, but its row and journal stay its own (sessions export).
                self.sessions.keep(row.bridge_id, row.agent, row.agent_id)
                continue
            try:
                session = self.sessions.bind(row.agent, row.agent_id, row.bridge_id)
            except ValueError:
                continue
            session.state = SessionState.STORED
            session.roots = row.roots
            session.setup = dict(row.setup)
            session.unattended = row.unattended
            session.created = row.created
            _, last = await trio.to_thread.run_sync(store.journal_bounds, row.bridge_id)
            self._history(session).continue_from(last)
        leftovers = await trio.to_thread.run_sync(store.pending_approvals)
        for key, sid, agent, _params in leftovers:
            await self.audit.record(
                AuditRecord(
                    session=sid,
                    agent=agent,
                    decision="deny",
                    source="restart",
                    detail="pending when the bridge stopped; the agent that asked is gone",
                )
            )
            self.journal.pending_removed(key)
        if rows or leftovers:
            self.log.info("restored", sessions=len(self.sessions), settled=len(leftovers))

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
        """
        The client is gone: its sessions detach for ``detach_grace`` seconds.

        Agents keep working; what they relay is kept in each session's history. Requests the
        agents had made of this client are parked and shown again to the connection that
        takes the session back, or answered as unattended when the grace period ends.
        """
        client.close(reason)
        self.clients.discard(client)
        for _, entry in client.pending.drain():
            agent = entry.origin
            assert isinstance(agent, AgentLink)
            agent.inflight.pop(entry.origin_id, None)
            if entry.session is not None and entry.session.client is client:
                park(entry)
            else:
                await self.reverse.answer_unattended(entry, "client_gone")
        # The client's own requests stay out at the agents: their answers go to whoever
        # takes the session back (same ids: what the attach shim relies on), else nowhere.
        client.inflight.clear()
        for session in self.sessions:
            if session.client is client:
                await self._detach(session)
        self.approvals.forget_client(client)

    async def _detach(self, session: Session) -> None:
        if self.config.bridge.detach_grace <= 0:
            session.client = None
            session.pending_permissions.clear()
            await self._expire(session)
            return
        self._schedule_detach(session)

    def _schedule_detach(self, session: Session) -> None:
        """Nobody owns the session now: it lives ``detach_grace`` seconds more, unless taken."""
        session.client = None
        session.pending_permissions.clear()
        grace = self.config.bridge.detach_grace
        self.log.info("session_detached", session=session.bridge_id, grace=grace)
        session.detach_deadline = trio.current_time() + max(grace, 0.0)
        self.deadlines.schedule(
            ("detach", session), session.detach_deadline, functools.partial(self._expire, session)
        )

    async def _expire(self, session: Session) -> None:
        """Nobody took the session back in time: settle what waits on it, close it."""
        session.detach_deadline = None
        agent = self.agents[session.agent]
        for entry in list(session.parked):
            await self.reverse.answer_unattended(entry, "grace")
        session.parked.clear()
        ours = self.sessions.owns_agent_id(session)  # (not if its id went to a new session)
        self.sessions.remove(session)
        self._forget(session)
        self.log.info("session_closed_after_grace", session=session.bridge_id, agent=agent.name)
        await self.agent_log(
            agent, "info", f"session {session.bridge_id} closed: nobody took it back", stream=None
        )
        if agent.state is AgentState.READY and ours and not self.stopping:
            # (Stopping: the agents go with the bridge; nothing more is started.)
            if has_session_cap(agent.capabilities, "close"):
                self._spawn(self._close_quietly, agent, session.agent_id)
            else:
                agent.send_nowait(
                    dumps(notification_msg("session/cancel", {"sessionId": session.agent_id}))
                )

    async def _close_quietly(self, agent: AgentLink, agent_sid: str) -> None:
        try:
            await self._internal_request(agent, "session/close", {"sessionId": agent_sid})
        except JsonRpcError as exc:
            self.log.warning("session_close_failed", agent=agent.name, error=exc.message)

    def _forget(self, session: Session, *, delete: bool = False) -> None:
        """A closed session: marked closed in the store (its journal kept); deleted: gone."""
        # (A grace period that was running must not close it a second time; its cancel
        # deadline is left to answer prompts the agent may still hold.)
        self.deadlines.cancel(("detach", session))
        if self.journal is not None:
            if delete:
                self.journal.delete(session.bridge_id)
            else:
                self.persist(session, "closed")
                # Kept for sessions export: a new session given its id must not write over it.
                self.sessions.keep(session.bridge_id, session.agent, session.agent_id)

    def _take_ownership(
        self, session: Session, client: ClientLink
    ) -> tuple[ClientLink | None, list[JsonRpcId]]:
        """
        Make ``client`` the session's owner (synchronous: nothing may slip in between).

        Requests still out at the agent for this session are answered to the new owner (same
        ids: the attach shim relies on it). Returns the previous owner if it is still
        connected (taken over), with the ids of its requests that moved: it must be told.
        """
        previous: ClientLink | None = session.client
        self.deadlines.cancel(("detach", session))
        session.detach_deadline = None
        session.client = client
        session.state = SessionState.ACTIVE
        agent = self.agents[session.agent]
        taken_over = previous is not None and previous is not client and not previous.closed
        moved: list[JsonRpcId] = []
        for bridge_id, entry in agent.pending.find(
            lambda e: isinstance(e, Forwarded) and e.session is session
        ):
            assert isinstance(entry, Forwarded)
            if entry.origin is client:
                continue
            if entry.origin is previous and taken_over:
                previous.done(entry.origin_id)
                moved.append(entry.origin_id)
            elif not entry.origin.closed:
                continue
            entry.origin = client
            client.inflight[entry.origin_id] = (agent, bridge_id)
        if taken_over:
            assert previous is not None
            # Its unanswered requests of the agent move with the session.
            for client_id, shown in previous.pending.find(lambda e: e.session is session):
                previous.pending.pop(client_id)
                park(shown)
            return previous, moved
        return None, []

    def _take_held(self, session: Session, upto: float) -> list[bytes]:
        """Answers that came while nobody was attached, up to history position ``upto``."""
        if not session.held_responses:
            return []
        out = [data for seq, _, data in session.held_responses if seq <= upto]
        session.held_responses = [h for h in session.held_responses if h[0] > upto]
        return out

    async def _present_parked(self, session: Session, client: ClientLink) -> None:
        """Show the new owner the agent requests that were waiting on the old one."""
        parked, session.parked = session.parked, []
        # Ids an earlier owner was shown are stale; what this client is still asked stays
        # pending (a resume on the same connection), so session/cancel still settles it.
        session.pending_permissions = {
            i for i in session.pending_permissions if client.pending.get(i) is not None
        }
        for entry in parked:
            if isinstance(entry.extra, Ask):
                await self.approvals.show(entry, client)
                continue
            agent = entry.origin
            assert isinstance(agent, AgentLink)
            client_id = client.pending.add(entry)
            agent.inflight[entry.origin_id] = (client, client_id)
            if entry.method == "session/request_permission":
                session.pending_permissions.add(client_id)
            await client.send(dumps(request_msg(client_id, entry.method, entry.context)))

    async def _attach(self, session: Session, client: ClientLink) -> None:
        previous, moved = self._take_ownership(session, client)
        if previous is not None:
            self.log.info("session_taken_over", session=session.bridge_id)
            gone = JsonRpcError.cancelled("session taken over by another connection")
            for origin_id in moved:
                await previous.send(dumps(error_msg(origin_id, gone)))
            await self.send_log(
                previous,
                "warning",
                "session taken over by another connection; this one no longer receives it",
                session=session,
            )
        for data in self._take_held(session, float("inf")):
            await client.send(data)
        await self._present_parked(session, client)

    async def send_log(
        self,
        client: ClientLink,
        level: str,
        message: str,
        *,
        session: Session | None = None,
        **data: Any,
    ) -> None:
        """
        A ``_acp_bridge/log`` notification (shaped after ACP RFD #392) to one client, if it
        asked for this level.
        """
        if not client.wants_log(level):
            return
        params: JsonObject = {"level": level, "logger": "acp_bridge"}
        if session is not None:
            params["sessionId"] = session.bridge_id
            data.setdefault("agent", session.agent)
        params["data"] = {"message": message, **data}
        await client.send(dumps(notification_msg("_acp_bridge/log", params)))

    def status(self) -> JsonObject:
        """Everything ``acp-bridge status`` and ``/metrics`` show: agents, sessions, counters."""
        agents = [
            {
                "name": a.name,
                "state": a.state.value,
                "runsOn": remote.location(a.config),
                "pid": a.pid,
                "starts": a.starts,
                "restarts": max(a.starts - 1, 0),
                "sessions": len(self.sessions.of_agent(a.name)),
                "queueDepth": a.queue_depth(),
                "pendingRequests": len(a.pending),
                # its own requests waiting on clients, and those refused past the limit
                "requestsInFlight": self.reverse.requests_waiting(a),
                "requestsRefused": a.requests_refused,
            }
            for a in self.agents.values()
        ]
        sessions = [
            {
                "sessionId": s.bridge_id,
                "agent": s.agent,
                "state": s.state.value,
                "connection": s.client.name if s.client is not None else None,
                "pendingApprovals": len(s.pending_permissions) + len(s.parked),
                "historyLastSeq": s.history.last_seq if s.history is not None else 0,
            }
            for s in self.sessions
        ]
        clients = [
            {"name": c.name, "queueDepth": c.queue_depth(), "pendingRequests": len(c.inflight)}
            for c in self.clients
        ]
        return {
            "defaultAgent": self.default_agent,
            "agents": agents,
            "sessions": sessions,
            "connections": clients,
            "counters": dict(self.counters),
            "approvals": dict(self.approvals.counts),
            "journal": self.journal.statistics() if self.journal is not None else None,
            "memory": self._memory(),
        }

    def _memory(self) -> JsonObject:
        """:func:`memory_figures`, and what the sessions' replay histories hold."""
        histories = [s.history for s in self.sessions if s.history is not None]
        return {
            **memory_figures(),
            "historyEntries": sum(len(h) for h in histories),
            "historyKiB": sum(h.total_bytes for h in histories) // 1024,
        }

    def health(self) -> tuple[bool, JsonObject]:
        """Whether the default agent can serve now, and every agent's state (for /healthz)."""
        ok = self.agents[self.default_agent].state is AgentState.READY
        agents = {
            a.name: {"state": a.state.value, "pid": a.pid, "starts": a.starts}
            for a in self.agents.values()
        }
        return ok, {"ok": ok, "defaultAgent": self.default_agent, "agents": agents}

    # ------------------------------------------------------------------ client → bridge

    async def handle_client_line(self, client: ClientLink, line: bytes | Oversize) -> None:
        """Handle one line from a client: answer it, or route it to an agent."""
        self.counters["from_client"] += 1
        if self.tracer is not None and isinstance(line, bytes):
            self.tracer(f"client:{client.name}", "in", line)
        if isinstance(line, Oversize):
            await self._reply_error(
                client,
                None,
                JsonRpcError.invalid_request(f"message of {line.size} bytes is over the limit"),
            )
            return
        try:
            msg = loads(line)
        except JsonRpcError as exc:
            await self._reply_error(client, None, exc)
            return
        kind = classify(msg)
        if kind is Kind.REQUEST:
            try:
                await self._client_request(client, msg)
            except JsonRpcError as exc:
                await self._reply_error(client, msg["id"], exc)
        elif kind is Kind.NOTIFICATION:
            await self._client_notification(client, msg)
        elif kind is Kind.RESPONSE:
            await self.reverse.client_response(client, msg)
        elif isinstance(msg, list):
            await self._reply_error(
                client, None, JsonRpcError.invalid_request("batches are not supported")
            )
        else:
            await self._reply_error(client, id_of(msg), JsonRpcError.invalid_request())

    async def _reply_error(self, client: ClientLink, id_: JsonRpcId, exc: JsonRpcError) -> None:
        self.counters[f"error:{exc.code}"] += 1
        await client.send(dumps(error_msg(id_, exc)))

    async def _client_request(self, client: ClientLink, msg: JsonObject) -> None:
        method: str = msg["method"]
        if method == "initialize":
            await self._initialize(client, msg)
            return
        if not client.initialized:
            raise JsonRpcError.invalid_request("the first request must be initialize")
        params = params_of(msg)
        if method in SESSION_METHODS:
            await self._session_request(client, msg, params)
        elif method == "session/new":
            await self._session_new(client, msg, params)
        elif method == "session/list":
            self._spawn(self._session_list, client, msg, params)
        elif method == "authenticate":
            await self._auth_request(client, msg, params)
        elif method in CONNECTION_METHODS:
            await self._connection_request(client, msg, params)
        elif method == "_acp_bridge/set_log_level":
            level = params.get("level")
            if not isinstance(level, str) or level not in _LEVEL_RANK:
                raise JsonRpcError.invalid_params(f"level: expected one of {', '.join(LOG_LEVELS)}")
            client.log_level = level
            client.extensions = True
            await client.send(dumps(result_msg(msg["id"], {})))
        elif method == "_acp_bridge/status":
            await client.send(dumps(result_msg(msg["id"], self.status())))
        elif method == "_acp_bridge/agents":
            await client.send(
                dumps(
                    result_msg(
                        msg["id"],
                        {
                            "default": self.default_agent,
                            "agents": [a.describe() for a in self.agents.values()],
                        },
                    )
                )
            )
        elif isinstance(params.get("sessionId"), str) and (
            method.startswith("_") or self.sessions.get(params["sessionId"]) is not None
        ):
            # What the bridge does not know goes to the session's agent, which answers it
            # (its own -32601 when it does not know it either).
            await self._session_request(client, msg, params)
        else:
            raise JsonRpcError.method_not_found(method)

    async def _initialize(self, client: ClientLink, msg: JsonObject) -> None:
        params = params_of(msg)
        requested = params.get("protocolVersion")
        if type(requested) is not int:
            raise JsonRpcError.invalid_params("protocolVersion: expected an integer")
        ours = bridge_meta(params)
        log_level = ours.get("log")
        if log_level is not None and (
            not isinstance(log_level, str) or log_level not in _LEVEL_RANK
        ):
            raise JsonRpcError.invalid_params(
                f"_meta.acp_bridge.log: expected one of {', '.join(LOG_LEVELS)}"
            )
        caps = params.get("clientCapabilities")
        client.capabilities = caps if isinstance(caps, dict) else {}
        client.want_seq = ours.get("seq") is True
        client.log_level = log_level
        # Any _meta.acp_bridge marks a client written for the bridge (ours add one).
        meta = params.get("_meta")
        client.extensions = isinstance(meta, dict) and isinstance(meta.get("acp_bridge"), dict)
        self._client_capabilities = client.capabilities
        default = self.agents[self.default_agent]
        try:
            await self.ensure_ready(default)
        except JsonRpcError as exc:
            await self._reply_error(client, msg["id"], exc)
            return
        client.initialized = True
        # The only version the bridge speaks (the spec: the requested one when supported,
        # else the latest supported; 0 is no version at all).
        version = PROTOCOL_VERSION
        caps_out = self._advertised_capabilities(default)
        answer: JsonObject = {
            "protocolVersion": version,
            "agentCapabilities": caps_out,
            "authMethods": default.auth_methods,
            "agentInfo": {"name": "acp-bridge", "title": "acp-bridge", "version": __version__},
            "_meta": {
                "acp_bridge": {
                    "defaultAgent": self.default_agent,
                    "agents": list(self.agents),
                }
            },
        }
        await client.send(dumps(result_msg(msg["id"], answer)))

    def _advertised_capabilities(self, default: AgentLink) -> JsonObject:
        """
        What the bridge advertises: the default agent's capabilities, as it is up now, plus
        what the bridge serves itself for every agent: ``loadSession`` and
        ``sessionCapabilities.resume``/``close`` for live sessions (replay from its own
        history; resume and close without the agent when it lacks them).

        Other calls on sessions of other agents are gated against their own agent's
        capabilities (-32601 when it lacks one); ``_acp_bridge/agents`` lists each agent's.
        """
        caps = dict(default.capabilities)
        caps["loadSession"] = True
        session_caps = dict(caps.get("sessionCapabilities") or {})
        session_caps["resume"] = {}
        session_caps["close"] = {}
        session_caps["delete"] = {}
        if any(has_session_cap(a.capabilities, "list") for a in self.agents.values()):
            session_caps["list"] = {}
        caps["sessionCapabilities"] = session_caps
        return caps

    async def _session_new(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        name = agent_selector(params) or self.default_agent
        agent = self.agents.get(name)
        if agent is None:
            raise JsonRpcError.invalid_params(
                f"unknown agent {name!r}; configured: {', '.join(self.agents)}"
            )
        if agent.state is AgentState.READY:
            await self._forward_session_new(client, msg, params, agent)
        else:
            self._spawn(self._session_new_when_ready, client, msg, params, agent)

    async def _session_new_when_ready(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, agent: AgentLink
    ) -> None:
        try:
            await self.ensure_ready(agent)
            await self._forward_session_new(client, msg, params, agent)
        except JsonRpcError as exc:
            await self._reply_error(client, msg["id"], exc)

    async def _forward_session_new(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, agent: AgentLink
    ) -> None:
        self.redactor.add_mcp_servers(params.get("mcpServers"))
        self._strip_unsupported_setup(agent, params)
        agent.new_in_flight += 1
        setup = Setup(roots_of(params), bridge_meta(params).get("unattended") is True)
        await self._forward(client, msg, agent, None, setup)

    def _strip_unsupported_setup(self, agent: AgentLink, params: JsonObject) -> None:
        """Drop what the agent did not advertise it can take (additionalDirectories, MCP kinds)."""
        caps = agent.capabilities
        if "additionalDirectories" in params and not has_session_cap(caps, "additionalDirectories"):
            del params["additionalDirectories"]
            self.log.warning("stripped_additional_directories", agent=agent.name)
        servers = params.get("mcpServers")
        if isinstance(servers, list):
            mcp = caps.get("mcpCapabilities")
            mcp = mcp if isinstance(mcp, dict) else {}
            kept = [
                s
                for s in servers
                if not isinstance(s, dict)
                or s.get("type") not in ("http", "sse", "acp")
                or mcp.get(s["type"])
            ]
            if len(kept) != len(servers):
                params["mcpServers"] = kept
                self.log.warning(
                    "stripped_mcp_servers", agent=agent.name, dropped=len(servers) - len(kept)
                )

    async def _session_request(
        self, client: ClientLink, msg: JsonObject, params: JsonObject
    ) -> None:
        method: str = msg["method"]
        sid = params.get("sessionId")
        if not isinstance(sid, str):
            raise JsonRpcError.invalid_params("sessionId must be a string")
        session = self.sessions.get(sid)
        if session is None:
            if method in ("session/load", "session/resume"):
                await self._load_unknown(client, msg, params, sid)
                return
            if method == "session/delete":
                await client.send(dumps(result_msg(msg["id"], {})))  # unknown: silently fine
                return
            raise JsonRpcError.resource_not_found(f"unknown session {sid!r}")
        owner = session.client
        elsewhere = owner is not None and owner is not client and not owner.closed
        if elsewhere and method not in ("session/load", "session/resume"):
            # Only the owner acts on a session (close and delete above all: the bridge serves
            # them itself for most agents); another connection must take it over first.
            raise attached_elsewhere(sid)
        agent = self.agents[session.agent]
        if session.state is SessionState.STORED:
            await self._stored_request(client, msg, params, session, agent)
            return
        if session.state is SessionState.ENDED and not self.sessions.owns_agent_id(session):
            await self._reused_request(client, msg, session)
            return
        live = session.state is SessionState.ACTIVE and agent.state is AgentState.READY
        if live and method in ("session/load", "session/resume"):
            await self._reattach(client, msg, params, session)
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
            await self._attach(session, client)
        if agent.state is not AgentState.READY:
            if method in ("session/load", "session/resume") or agent.state is AgentState.STARTING:
                self._spawn(self._session_request_when_ready, client, msg, params, session)
                return
            raise JsonRpcError(
                INTERNAL_ERROR,
                f"session {sid!r} ended: agent {agent.name!r} is {agent.state.value}",
                agent.failure_data(),
            )
        await self._forward_session_request(client, msg, params, session, agent)

    async def _session_request_when_ready(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> None:
        agent = self.agents[session.agent]
        try:
            await self.ensure_ready(agent)
            await self._forward_session_request(client, msg, params, session, agent)
        except JsonRpcError as exc:
            await self._reply_error(client, msg["id"], exc)

    async def _forward_session_request(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        agent: AgentLink,
    ) -> None:
        method: str = msg["method"]
        gate = SESSION_METHODS.get(method)
        if gate is not None and not gate(agent.capabilities):
            raise JsonRpcError.method_not_found(
                method, f"agent {agent.name!r} does not support {method}"
            )
        if method == "session/prompt":
            check_prompt_content(agent.name, agent.capabilities, params)
            self._remember_prompt(session, params)
        elif method in ("session/load", "session/resume", "session/fork"):
            self.redactor.add_mcp_servers(params.get("mcpServers"))
            self._strip_unsupported_setup(agent, params)
            if method == "session/load":
                # Replayed updates arrive before the response: route them already.
                previous = (session.state, session.client)
                session.state = SessionState.LOADING
                session.client = client
                await self._forward(client, msg, agent, session, previous)
                return
        if session.client is None and method not in LOOK_ONLY_METHODS:
            session.client = client
        if session.rewrite:
            params["sessionId"] = session.agent_id
        setup = None
        if method == "session/fork":
            setup = Setup(roots_of(params) or session.roots, session.unattended)
        await self._forward(client, msg, agent, session, setup)

    async def _stored_request(
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
            self._spawn(self._restore_session, client, msg, params, session, agent)
        elif method in ("session/close", "session/delete"):
            self.sessions.remove(session)
            self._forget(session, delete=method == "session/delete")
            await client.send(dumps(result_msg(msg["id"], {})))
        else:
            why = self._unrestorable.get(session.bridge_id)
            raise JsonRpcError.resource_not_found(
                f"session {session.bridge_id!r} cannot continue: {why}"
                if why is not None
                else f"session {session.bridge_id!r} is not live since the bridge restarted: "
                "session/load it first"
            )

    async def _reused_request(self, client: ClientLink, msg: JsonObject, session: Session) -> None:
        """An ended session whose agent id went to a new session: it can only be closed."""
        if msg["method"] in ("session/close", "session/delete"):
            self.sessions.remove(session)
            self._forget(session, delete=msg["method"] == "session/delete")
            await client.send(dumps(result_msg(msg["id"], {})))
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
            await self.ensure_ready(agent)
            if not self.sessions.owns_agent_id(session):
                reason = f"agent {agent.name!r} gave its id to a new session"
            elif agent.capabilities.get("loadSession"):
                self._strip_unsupported_setup(agent, params)
                query = {**params, "sessionId": session.agent_id}
                query.pop("_meta", None)
                session.state = SessionState.LOADING
                session.client = client
                try:
                    result = await self._internal_request(agent, "session/load", query)
                except JsonRpcError as exc:
                    reason = f"agent {agent.name!r} could not load it: {exc.message}"
                else:
                    session.state = SessionState.ACTIVE
                    capture_setup(session, result)
                    self.persist(session)
                    answer = dict(result) if isinstance(result, dict) else {}
                    answer["_meta"] = {
                        "acp_bridge": {"restored": True, "lastSeq": self._history(session).last_seq}
                    }
                    await client.send(dumps(result_msg(msg["id"], answer)))
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

    async def _replay_journal(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        reason: str,
    ) -> None:
        assert self.journal is not None
        self._unrestorable[session.bridge_id] = reason
        if bridge_meta(params).get("journal_replay") is not True:
            # A stock client takes success for "the session goes on" (acpx then never falls
            # back to session/new, and every prompt fails): only a client that asked for
            # journal replays gets one.
            raise JsonRpcError(
                RESOURCE_NOT_FOUND,
                f"session {session.bridge_id!r} cannot be restored: {reason} (its updates can "
                "be replayed from the bridge's journal: _meta.acp_bridge.journal_replay)",
                {"sessionId": session.bridge_id, "reason": reason},
            )
        after = bridge_meta(params).get("after_seq")
        catch_up = type(after) is int
        start = after if type(after) is int and after > 0 else 0
        await self.journal.moved(session.bridge_id)  # (a move aside is in the store)
        entries = await trio.to_thread.run_sync(
            functools.partial(
                self.journal.store.journal, session.bridge_id, after_seq=start, live_only=catch_up
            )
        )
        expected = start + 1
        complete = session.bridge_id not in self.journal.gaps
        for entry in entries:
            if entry.seq != expected and entry.live:
                complete = False
            expected = entry.seq + 1
            await client.send_wait(self._from_journal(client, session, entry.seq, entry.data))
        if entries and start and entries[0].seq > start + 1 and not catch_up:
            complete = False
        answer: JsonObject = dict(session.setup)
        answer["_meta"] = {
            "acp_bridge": {
                "restored": False,
                "reason": reason,
                "lastSeq": self._history(session).last_seq,
                "complete": complete,
            }
        }
        await client.send_wait(dumps(result_msg(msg["id"], answer)))
        await self.send_log(
            client,
            "warning",
            f"session replayed from the bridge's journal; the agent cannot continue it ({reason})",
            session=session,
        )

    async def _reattach(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> None:
        """
        ``session/load`` / ``session/resume`` of a live session, served by the bridge.

        load replays the session's history, then answers; with
        ``_meta.acp_bridge.after_seq: N`` it replays only what the live stream carried after
        update N (a catch-up: not the user's own prompts). resume answers at once. Either way
        the client becomes the owner, agent requests waiting on a previous connection are
        shown to it, and the answer's ``_meta.acp_bridge`` says ``lastSeq``, whether the
        replay is ``complete``, and which of the client's requests (``pending``: ids) are
        still to be answered on this connection.
        """
        load = msg["method"] == "session/load"
        requested = bridge_meta(params).get("after_seq") if load else None
        if requested is not None and (type(requested) is not int or requested < 0):
            raise JsonRpcError.invalid_params("_meta.acp_bridge.after_seq: expected an int")
        catch_up = requested is not None
        after: int = requested or 0
        history = self._history(session)
        complete = True
        if load:
            entries, complete = history.after(after, live_only=catch_up)
            for data in self._take_held(session, after):
                await client.send_wait(data)
            for seq, data in entries:
                await client.send_wait(self._stamped(client, seq, data))
                after = seq
                for held in self._take_held(session, seq):
                    await client.send_wait(held)
        else:
            after = history.last_seq  # resume: no replay
        result: JsonObject = dict(session.setup)
        result["_meta"] = {
            "acp_bridge": {
                "lastSeq": history.last_seq,
                "complete": complete,
                "pending": self._answers_owed(session, client),
            }
        }
        await client.send_wait(dumps(result_msg(msg["id"], result)))
        # Updates that came in meanwhile were kept, not sent: send them, then switch the live
        # stream over with no await in between (nothing lost, nothing twice).
        while history.last_seq > after:
            entries, caught_up = history.after(after, live_only=catch_up)
            complete = complete and caught_up
            if not entries:
                break
            for seq, data in entries:
                await client.send_wait(self._stamped(client, seq, data))
                after = seq
                for held in self._take_held(session, seq):
                    await client.send_wait(held)
        if not complete:
            await self.send_log(
                client,
                "warning",
                "history was trimmed: the replay is missing older updates (resync required)",
                session=session,
                firstSeq=history.first_seq,
            )
        await self._attach(session, client)

    def _answers_owed(self, session: Session, client: ClientLink) -> list[JsonRpcId]:
        """Ids of requests whose answers will go to ``client`` once it owns the session."""
        owner = session.client
        agent = self.agents[session.agent]
        ids: list[JsonRpcId] = [origin_id for _, origin_id, _ in session.held_responses]
        for _, entry in agent.pending.find(
            lambda e: isinstance(e, Forwarded) and e.session is session
        ):
            assert isinstance(entry, Forwarded)
            if entry.origin is client or entry.origin.closed or entry.origin is owner:
                ids.append(entry.origin_id)
        return ids

    def _history(self, session: Session) -> History:
        return self.hub.history(session)

    def _stamped(self, client: ClientLink, seq: int, data: bytes) -> bytes:
        """A history entry as this client gets it (with its seq number if it opted in)."""
        if not client.want_seq:
            return data
        msg = loads(data)
        set_seq(msg["params"], seq)
        return dumps(msg)

    def _from_journal(self, client: ClientLink, session: Session, seq: int, data: bytes) -> bytes:
        """
        A journal entry as ``client`` gets it: under the session's bridge id (a session moved
        aside after a restart has its lines recorded under its earlier id), with its seq
        number if the client opted in. (Decoded each: journal replays follow restarts only.)
        """
        msg = loads(data)
        params = msg.get("params") if isinstance(msg, dict) else None
        if not isinstance(params, dict):
            return data
        if params.get("sessionId") == session.bridge_id and not client.want_seq:
            return data
        params["sessionId"] = session.bridge_id
        if client.want_seq:
            set_seq(params, seq)
        return dumps(msg)

    async def _close_without_agent(
        self, client: ClientLink, msg: JsonObject, session: Session, agent: AgentLink
    ) -> None:
        """
        ``session/close`` (or ``delete``) for an agent without it: cancel its work, forget the
        session (delete: its journal too).
        """
        agent.send_nowait(
            dumps(notification_msg("session/cancel", {"sessionId": session.agent_id}))
        )
        await self._settle_permissions(session, "cancelled", "close")
        self.sessions.remove(session)
        self._forget(session, delete=msg["method"] == "session/delete")
        await client.send(dumps(result_msg(msg["id"], {})))

    def _remember_prompt(self, session: Session, params: JsonObject) -> None:
        """The user's prompt goes into the history as user_message_chunk updates (for load)."""
        prompt = params.get("prompt")
        if not isinstance(prompt, list):
            return
        history = self._history(session)
        for block in prompt:
            update = {"sessionUpdate": "user_message_chunk", "content": block}
            data = dumps(
                notification_msg(
                    "session/update", {"sessionId": session.bridge_id, "update": update}
                )
            )
            history.append(data, live=False)
        if self.journal is not None:
            self.journal.updated(session.bridge_id, history)

    async def _load_unknown(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, sid: str
    ) -> None:
        """``session/load`` of an id the bridge never saw: ask the selected (or default) agent."""
        name = agent_selector(params) or self.default_agent
        agent = self.agents.get(name)
        if agent is None:
            raise JsonRpcError.invalid_params(f"unknown agent {name!r}")
        if self.sessions.get(sid) is not None:
            raise JsonRpcError.invalid_params(f"session id {sid!r} is taken")
        session = self.sessions.bind(name, sid, sid)
        session.state = SessionState.LOADING
        session.roots = roots_of(params)
        session.unattended = bridge_meta(params).get("unattended") is True
        if agent.state is AgentState.READY:
            try:
                await self._forward_session_request(client, msg, params, session, agent)
            except JsonRpcError:
                self.sessions.remove(session)  # it never went out: nothing to keep
                raise
        else:
            self._spawn(self._load_unknown_when_ready, client, msg, params, session)

    async def _load_unknown_when_ready(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> None:
        agent = self.agents[session.agent]
        try:
            await self.ensure_ready(agent)
            await self._forward_session_request(client, msg, params, session, agent)
        except JsonRpcError as exc:
            self.sessions.remove(session)
            await self._reply_error(client, msg["id"], exc)

    async def _forward(
        self,
        client: ClientLink,
        msg: JsonObject,
        agent: AgentLink,
        session: Session | None,
        context: Any = None,
    ) -> None:
        """Send a client request on to an agent under a bridge id; the response comes back."""
        origin_id = msg["id"]
        entry = Forwarded(client, origin_id, msg["method"], session, context)
        bridge_id = agent.pending.add(entry)
        msg["id"] = bridge_id
        remote.map_to_agent(agent.config, msg["method"], params_of(msg))
        if not agent.send_nowait(dumps(msg)):
            agent.pending.pop(bridge_id)
            self.from_agent.undo_forward(agent, entry, ok=False)
            msg["id"] = origin_id  # the error goes back under the client's own id
            raise JsonRpcError(
                INTERNAL_ERROR,
                f"agent {agent.name!r} is not accepting input (queue full or not running)",
                agent.failure_data(),
            )
        client.inflight[origin_id] = (agent, bridge_id)

    async def _auth_request(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        name = agent_selector(params)
        if name is None:
            method_id = params.get("methodId")
            for candidate in (self.agents[self.default_agent], *self.agents.values()):
                if candidate.state is AgentState.READY and any(
                    isinstance(m, dict) and m.get("id") == method_id for m in candidate.auth_methods
                ):
                    name = candidate.name
                    break
        agent = self.agents.get(name or self.default_agent)
        if agent is None:
            raise JsonRpcError.invalid_params(f"unknown agent {name!r}")
        if agent.state is not AgentState.READY:
            raise JsonRpcError(INTERNAL_ERROR, f"agent {agent.name!r} is {agent.state.value}")
        await self._forward(client, msg, agent, None)

    async def _connection_request(
        self, client: ClientLink, msg: JsonObject, params: JsonObject
    ) -> None:
        """``logout``, ``auth/status``, ``providers/*``: to the named (or default) agent."""
        name = agent_selector(params) or self.default_agent
        agent = self.agents.get(name)
        if agent is None:
            raise JsonRpcError.invalid_params(
                f"unknown agent {name!r}; configured: {', '.join(self.agents)}"
            )
        if agent.state is AgentState.READY:
            await self._forward_connection_request(client, msg, agent)
        else:
            self._spawn(self._connection_request_when_ready, client, msg, agent)

    async def _connection_request_when_ready(
        self, client: ClientLink, msg: JsonObject, agent: AgentLink
    ) -> None:
        try:
            await self.ensure_ready(agent)
            await self._forward_connection_request(client, msg, agent)
        except JsonRpcError as exc:
            await self._reply_error(client, msg["id"], exc)

    async def _forward_connection_request(
        self, client: ClientLink, msg: JsonObject, agent: AgentLink
    ) -> None:
        method: str = msg["method"]
        if not CONNECTION_METHODS[method](agent.capabilities):
            raise JsonRpcError.method_not_found(
                method, f"agent {agent.name!r} does not support {method}"
            )
        await self._forward(client, msg, agent, None)

    async def _session_list(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        """``session/list`` merged across agents: one agent's pages after another's."""
        try:
            listing = [a for a in self.agents.values() if has_session_cap(a.capabilities, "list")]
            index, inner = (0, None)
            if params.get("cursor") is not None:
                index, inner = decode_cursor(params["cursor"])
            sessions: list[Any] = []
            next_cursor: str | None = None
            while index < len(listing):
                agent = listing[index]
                query: JsonObject = {}
                if "cwd" in params:
                    query["cwd"] = params["cwd"]
                if inner is not None:
                    query["cursor"] = inner
                page = await self._internal_request(agent, "session/list", query)
                for info in page.get("sessions") or []:
                    if isinstance(info, dict) and isinstance(info.get("sessionId"), str):
                        session = self.sessions.register(
                            agent.name, info["sessionId"], state=SessionState.LISTED
                        )
                        remote.map_listed_session(agent.config, info)
                        if not session.roots:
                            session.roots = roots_of(info)
                        info["sessionId"] = session.bridge_id
                        sessions.append(info)
                inner = page.get("nextCursor") if isinstance(page.get("nextCursor"), str) else None
                if inner is None:
                    index += 1
                if inner is not None or (sessions and index < len(listing)):
                    next_cursor = encode_cursor(index, inner)
                    break
            if next_cursor is None:
                sessions += self._bridge_listed(listing, params.get("cwd"))
            answer: JsonObject = {"sessions": sessions}
            if next_cursor is not None:
                answer["nextCursor"] = next_cursor
            await client.send(dumps(result_msg(msg["id"], answer)))
        except JsonRpcError as exc:
            await self._reply_error(client, msg["id"], exc)

    def _bridge_listed(self, listing: list[AgentLink], cwd: object) -> list[JsonObject]:
        """Sessions the bridge itself knows that no agent's own list covers (e.g. restored)."""
        listed = {a.name for a in listing}
        out: list[JsonObject] = []
        for session in self.sessions:
            if session.state is SessionState.LISTED:
                continue
            if session.agent in listed and session.state is not SessionState.STORED:
                continue
            root = session.roots[0] if session.roots else None
            if isinstance(cwd, str) and root != cwd:
                continue
            info: JsonObject = {"sessionId": session.bridge_id, "cwd": root or "/"}
            if len(session.roots) > 1:
                info["additionalDirectories"] = list(session.roots[1:])
            info["_meta"] = {"acp_bridge": {"agent": session.agent, "state": session.state.value}}
            out.append(info)
        return out

    async def _internal_request(self, agent: AgentLink, method: str, params: JsonObject) -> Any:
        """A request of the bridge's own to an agent; returns its result or raises."""
        waiter = Waiter()
        bridge_id = agent.pending.add(waiter)
        remote.map_to_agent(agent.config, method, params)
        if not agent.send_nowait(dumps(request_msg(bridge_id, method, params))):
            agent.pending.pop(bridge_id)
            raise JsonRpcError(INTERNAL_ERROR, f"agent {agent.name!r} is not accepting input")
        response = await waiter.wait()
        if "error" in response:
            err = response["error"]
            if isinstance(err, dict) and type(err.get("code")) is int:
                raise JsonRpcError(err["code"], str(err.get("message", "")), err.get("data"))
            raise JsonRpcError(INTERNAL_ERROR, f"agent {agent.name!r} answered an invalid error")
        return response.get("result")

    async def _client_notification(self, client: ClientLink, msg: JsonObject) -> None:
        method: str = msg["method"]
        params = params_of(msg)
        if method == "session/cancel":
            await self._cancel_session(client, msg, params)
        elif method == "$/cancel_request":
            request_id = params.get("requestId")
            target = client.inflight.get(request_id) if is_id(request_id) else None
            if target is not None:
                agent, bridge_id = target
                cancel = notification_msg("$/cancel_request", {"requestId": bridge_id})
                if not agent.send_nowait(dumps(cancel)):
                    self._not_delivered(client, agent, method, None)
        elif method.startswith("_") and isinstance(params.get("sessionId"), str):
            session = self.sessions.get(params["sessionId"])
            # Another connection's session is not this one's to act on: dropped, as a
            # notification cannot be refused (session/cancel does the same).
            if session is not None and session.client in (client, None):
                if session.rewrite:
                    params["sessionId"] = session.agent_id
                agent = self.agents[session.agent]
                if not agent.send_nowait(dumps(msg)):
                    self._not_delivered(client, agent, method, session)
        # Any other notification is ignored, as the spec asks.

    def _not_delivered(
        self, client: ClientLink, agent: AgentLink, method: str, session: Session | None
    ) -> None:
        """
        A client's notification found its agent's queue full (or the agent gone): it cannot
        be answered, so the client is told with a ``_acp_bridge/log`` warning instead.
        """
        self.log.warning("notification_not_delivered", agent=agent.name, method=method)
        if not client.wants_log("warning"):
            return
        why = "is not running" if agent.state is not AgentState.READY else "has a full queue"
        params: JsonObject = {"level": "warning", "logger": "acp_bridge"}
        if session is not None:
            params["sessionId"] = session.bridge_id
        params["data"] = {
            "message": f"{method} not delivered: agent {agent.name!r} {why}",
            "agent": agent.name,
        }
        client.offer(dumps(notification_msg("_acp_bridge/log", params)))

    async def _cancel_session(
        self, client: ClientLink, msg: JsonObject, params: JsonObject
    ) -> None:
        sid = params.get("sessionId")
        session = self.sessions.get(sid) if isinstance(sid, str) else None
        if session is None or session.client not in (client, None):
            return  # unknown, or not this connection's to cancel
        agent = self.agents[session.agent]
        if session.rewrite:
            params["sessionId"] = session.agent_id
        if not agent.send_nowait(dumps(msg)):
            self._not_delivered(client, agent, "session/cancel", session)
        await self._settle_permissions(session, "cancelled", "cancel")
        grace = self.config.bridge.cancel_grace
        key = ("cancel", session)
        if grace > 0 and key not in self.deadlines and self._prompts_of(agent, session):
            # (A second cancel does not push the deadline back.)
            self.deadlines.schedule(
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
        grace = self.config.bridge.cancel_grace
        self.log.warning(
            "cancel_grace_expired", agent=agent.name, session=session.bridge_id, prompts=len(late)
        )
        for bridge_id in late:
            result = {
                "stopReason": "cancelled",
                "_meta": {"acp_bridge": {"cancelGraceExpired": grace}},
            }
            await self.from_agent.agent_response(
                agent, {"jsonrpc": "2.0", "id": bridge_id, "result": result}
            )
        client = session.client
        if client is not None and not client.closed:
            await self.send_log(
                client,
                "warning",
                f"agent {agent.name!r} did not end the cancelled turn within {grace:g}s: "
                "the bridge ended it; the agent's late answer will be dropped",
                session=session,
            )

    async def _settle_permissions(self, session: Session, outcome: str, reason: str) -> None:
        """Answer every pending permission request of a session ``outcome`` at once."""
        assert outcome == "cancelled"
        await self.approvals.settle_session(session, reason)

    # ------------------------------------------------------------------ agents

    async def ensure_ready(self, agent: AgentLink) -> None:
        """
        Start the agent if needed and wait until it completed ``initialize``.

        Raises:
            JsonRpcError: it could not be started (with exit status and stderr tail), or it is
                in a crash loop.
        """
        while True:
            if agent.state is AgentState.READY:
                return
            if agent.state is AgentState.STARTING:
                await agent.settled.wait()
                if agent.start_error is not None and not self._is_ready(agent):
                    raise agent.start_error
                continue
            if self.stopping:
                raise JsonRpcError(INTERNAL_ERROR, "the bridge is shutting down")
            delay = self._restart_delay(agent)
            agent.state = AgentState.STARTING
            agent.settled = trio.Event()
            agent.start_error = None
            self._spawn(self._agent_life, agent, delay)

    @staticmethod
    def _is_ready(agent: AgentLink) -> bool:
        # A function call, so the type checker does not narrow the state across the await.
        return agent.state is AgentState.READY

    def _restart_delay(self, agent: AgentLink) -> float:
        verdict = agent.restarts.next_start(trio.current_time())
        if isinstance(verdict, CrashLoop):
            err = JsonRpcError(
                INTERNAL_ERROR,
                f"agent {agent.name!r} crashed {verdict.deaths} times in "
                f"{verdict.window:g}s; not restarting it until that calms down",
                agent.failure_data(),
            )
            agent.start_error = err
            raise err
        return verdict

    async def _agent_life(self, agent: AgentLink, delay: float) -> None:
        """One life of an agent process: start, initialize, relay until it exits."""
        if delay:
            await trio.sleep(delay)
        agent.starts += 1
        agent.exit_status = None
        agent.failure = None
        agent.exited = trio.Event()
        agent.stderr = StderrRing()
        log = self.log.bind(agent=agent.name)
        eof = trio.Event()
        async with trio.open_nursery() as nursery:
            agent.stop_scope = nursery.cancel_scope
            try:
                transport: AgentTransport = await nursery.start(self._run_launcher, agent)
            except AgentStartError as exc:
                self._start_failed(agent, JsonRpcError(INTERNAL_ERROR, str(exc), exc.data))
                return
            agent.pid = transport.pid
            agent.kill = transport.kill
            # agent_queue for requests and notifications, as much again for answers (AgentLink)
            send, receive = trio.open_memory_channel[bytes](2 * agent.queue_size)
            agent._send = send
            agent._fd = pipes.pipe_fd(transport.send)
            nursery.start_soon(self._agent_writer, agent, receive, transport.send)
            if transport.stderr is not None:
                nursery.start_soon(self._agent_stderr, agent, transport.stderr)
            nursery.start_soon(self.from_agent.reader, agent, transport.receive, eof)
            log.info("agent_spawned", pid=transport.pid)
            try:
                await self._handshake(agent, eof)
            except JsonRpcError as exc:
                self._start_failed(agent, exc)
                nursery.cancel_scope.cancel()
                await self._agent_gone(agent, reason="failed to initialize")
                return
            agent.state = AgentState.READY
            agent.settled.set()
            log.info("agent_ready", pid=transport.pid)
            verb = "restarted" if agent.starts > 1 else "started"
            await self.agent_log(agent, "info", f"agent {verb} (pid {transport.pid})", stream=None)
            await eof.wait()
            with trio.move_on_after(EXIT_STATUS_WAIT):
                await agent.exited.wait()
            log.warning("agent_exited", status=agent.exit_status, failure=agent.failure)
            reason = (
                remote.death_reason(agent.config, agent.exit_status)
                if agent.failure is None
                else f"was stopped: {agent.failure}"
            )
            await self.agent_log(
                agent,
                "warning" if agent.failure is None else "error",
                f"agent {reason} (status {agent.exit_status})",
                stream=None,
            )
            await self._agent_gone(agent, reason=reason)
            nursery.cancel_scope.cancel()

    async def _run_launcher(
        self, agent: AgentLink, *, task_status: trio.TaskStatus[AgentTransport]
    ) -> None:
        try:
            agent.exit_status = await self._launcher(agent.config, task_status=task_status)
        finally:
            agent.exited.set()

    async def _handshake(self, agent: AgentLink, eof: trio.Event) -> None:
        caps = self._fixed_client_capabilities
        caps = remote.offered_capabilities(
            agent.config, self._client_capabilities if caps is None else caps
        )
        params: JsonObject = {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": caps,
            "clientInfo": {"name": "acp-bridge", "version": __version__},
        }
        result: Any = None
        async with trio.open_nursery() as nursery:

            async def watch_eof() -> None:
                await eof.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_eof)
            with trio.move_on_after(agent.config.start_timeout) as timeout:
                result = await self._internal_request(agent, "initialize", params)
            nursery.cancel_scope.cancel()
        if eof.is_set() and result is None:
            with trio.move_on_after(EXIT_STATUS_WAIT):
                await agent.exited.wait()
            raise JsonRpcError(
                INTERNAL_ERROR,
                f"agent {agent.name!r} exited during initialize"
                + (f" (status {agent.exit_status})" if agent.exit_status is not None else "")
                + remote.start_failure(
                    agent.config, agent.exit_status, agent.failure_data()["stderrTail"]
                ),
                agent.failure_data(),
            )
        if timeout.cancelled_caught:
            raise JsonRpcError(
                INTERNAL_ERROR,
                f"agent {agent.name!r} did not answer initialize within "
                f"{agent.config.start_timeout:g}s{remote.start_timeout_note(agent.config)}",
                agent.failure_data(),
            )
        if not isinstance(result, dict):
            raise JsonRpcError(INTERNAL_ERROR, f"agent {agent.name!r} answered initialize oddly")
        if result.get("protocolVersion") != PROTOCOL_VERSION:
            raise JsonRpcError(
                INTERNAL_ERROR,
                f"agent {agent.name!r} speaks protocol version "
                f"{result.get('protocolVersion')!r}; the bridge speaks {PROTOCOL_VERSION}",
                agent.failure_data(),
            )
        caps = result.get("agentCapabilities")
        agent.capabilities = caps if isinstance(caps, dict) else {}
        methods = result.get("authMethods")
        agent.auth_methods = methods if isinstance(methods, list) else []
        info = result.get("agentInfo")
        agent.agent_info = info if isinstance(info, dict) else None

    def _start_failed(self, agent: AgentLink, exc: JsonRpcError) -> None:
        agent.state = AgentState.DEAD
        agent.start_error = exc
        agent.restarts.died(trio.current_time())
        agent.settled.set()
        self.log.error("agent_start_failed", agent=agent.name, error=exc.message)

    async def _agent_gone(self, agent: AgentLink, *, reason: str) -> None:
        """Every request waiting on the agent is answered; its sessions end."""
        if agent.state is not AgentState.STOPPING:
            if agent.state is AgentState.READY:
                agent.restarts.died(trio.current_time())
            agent.state = AgentState.DEAD
        agent._send = None
        agent._fd = None
        agent.kill = None
        status = f" (status {agent.exit_status})" if agent.exit_status is not None else ""
        err = JsonRpcError(
            INTERNAL_ERROR, f"agent {agent.name!r} {reason}{status}", agent.failure_data()
        )
        for _, entry in agent.pending.drain():
            if isinstance(entry, Waiter):
                entry.set(error_msg(None, err))
                continue
            client = entry.origin
            assert isinstance(client, ClientLink)
            client.done(entry.origin_id)
            self.from_agent.undo_forward(agent, entry, ok=False)
            answer = dumps(error_msg(entry.origin_id, err))
            session = entry.session
            if client.closed and session is not None and session.client is None:
                # Its connection is gone: held for whoever takes the session back.
                if len(session.held_responses) < HELD_RESPONSES_MAX:
                    held = (self._history(session).last_seq, entry.origin_id, answer)
                    session.held_responses.append(held)
                continue
            await client.send(answer)
        for agent_id, (client, client_id) in list(agent.inflight.items()):
            shown = client.pending.get(client_id)
            if shown is not None and isinstance(shown.extra, Ask):
                await self.approvals.agent_gone(shown)
                continue
            del agent.inflight[agent_id]
            client.pending.pop(client_id)
            await client.send(dumps(notification_msg("$/cancel_request", {"requestId": client_id})))
        for session in self.sessions.of_agent(agent.name):
            session.state = SessionState.ENDED
            for entry in list(session.parked):
                if isinstance(entry.extra, Ask):
                    await self.approvals.agent_gone(entry)
            session.parked.clear()
            session.pending_permissions.clear()
        agent.new_in_flight = 0
        agent.early_updates.clear()

    async def _agent_writer(
        self,
        agent: AgentLink,
        receive: trio.MemoryReceiveChannel[bytes],
        stream: trio.abc.SendStream,
    ) -> None:
        try:
            await pump_channel(receive, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The agent closed its stdin (or died); its reader sees EOF and reports it.
            self.log.debug("agent_stdin_closed", agent=agent.name)

    async def _agent_stderr(self, agent: AgentLink, stream: trio.abc.ReceiveStream) -> None:
        """
        Every stderr line becomes a ``_acp_bridge/log`` notification (rate-limited) and a log
        line; the protocol reader is another task, so a flood here never delays it.
        """
        try:
            while data := await stream.receive_some(READ_CHUNK):
                for line in agent.stderr.feed(data):
                    await self.agent_log(agent, guess_level(line), line, stream="stderr")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        tail = agent.stderr.flush()
        if tail is not None:
            await self.agent_log(agent, guess_level(tail), tail, stream="stderr")

    async def agent_log(
        self, agent: AgentLink, level: str, message: str, *, stream: str | None
    ) -> None:
        """
        A diagnostic about an agent, to the clients of its sessions (all clients while it has
        none), as ``_acp_bridge/log``. Agent output is rate-limited per agent; the bridge's
        own events (``stream=None``) never are. Secrets are redacted.
        """
        if stream is not None and not self._log_budget(agent):
            return
        text = self.redactor.redact(message)
        if stream is not None:
            self.log.info("agent_" + stream, agent=agent.name, level=level, line=text)
        params: JsonObject = {
            "level": level,
            "logger": f"agent.{agent.name}" if stream is not None else "acp_bridge",
        }
        sessions = self.sessions.of_agent(agent.name)
        if len(sessions) == 1:
            params["sessionId"] = sessions[0].bridge_id
        data: JsonObject = {"message": text, "agent": agent.name}
        if stream is not None:
            data["stream"] = stream
        params["data"] = data
        line = dumps(notification_msg("_acp_bridge/log", params))
        owners = {s.client for s in sessions if s.client is not None}
        targets = owners if sessions else {c for c in self.clients if c.initialized}
        for client in targets:
            if client.wants_log(level):
                client.offer(line)

    def _log_budget(self, agent: AgentLink) -> bool:
        now = trio.current_time()
        agent.log_tokens = min(LOG_BURST, agent.log_tokens + (now - agent.log_stamp) * LOG_RATE)
        agent.log_stamp = now
        if agent.log_tokens >= 1:
            agent.log_tokens -= 1
            return True
        if not agent.log_suppressed:
            self.deadlines.schedule(
                ("log_suppressed", agent), now + 1.0, functools.partial(self._log_summary, agent)
            )
        agent.log_suppressed += 1
        return False

    async def _log_summary(self, agent: AgentLink) -> None:
        count, agent.log_suppressed = agent.log_suppressed, 0
        if count:
            await self.agent_log(
                agent,
                "warning",
                f"{count} lines of agent output suppressed (more than {LOG_RATE:g}/s)",
                stream=None,
            )

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
        for agent in self.agents.values():
            if agent.stop_scope is not None and agent.state is not AgentState.STOPPED:
                agent.state = AgentState.STOPPING
                agent.stop_scope.cancel()


async def serve_client_stream(
    bridge: Bridge,
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    *,
    name: str = "stdio",
    linger: float | None = None,
) -> None:
    """
    Serve one client over a byte stream pair (stdio, or memory streams in tests) until EOF.

    At end of input, requests already under way get ``linger`` seconds (default: the
    bridge's ``stop_grace``) to finish and be written: a client that pipes its requests and
    closes its stdin still gets its answers.

    Resource handling: returns when the client closes its side; does not close ``send``.
    Its sessions are detached whatever way the connection ends.
    """
    client = bridge.open_client(name, blocking=True)
    grace = bridge.config.bridge.stop_grace if linger is None else linger
    decoder = LineDecoder(max_line_bytes=bridge.config.bridge.max_line_bytes)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump_then_cancel, client, send, nursery.cancel_scope)
            try:
                while data := await pipes.receive_some(receive, READ_CHUNK):
                    for line in decoder.feed(data):
                        await bridge.handle_client_line(client, line)
                    # (A read of a pipe with data waiting does not yield: this one does.)
                    await trio.lowlevel.cancel_shielded_checkpoint()
                rest = decoder.feed_eof()
                if rest is not None:
                    await bridge.handle_client_line(client, rest)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            with trio.move_on_after(grace):
                await client.wait_idle()
            await bridge.close_client(client, "end of input")
            client.finish()
            # The pump ends the nursery once the queue is written; a client that stopped
            # reading gets the same grace, then is let go.
            nursery.cancel_scope.deadline = trio.current_time() + grace
    finally:
        if client in bridge.clients:
            with trio.CancelScope(shield=True):
                await bridge.close_client(client, "connection lost")


async def _pump_then_cancel(
    client: ClientLink, stream: trio.abc.SendStream, scope: trio.CancelScope
) -> None:
    try:
        await client.pump(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        client.log.info("client_output_closed")
    # Output is finished (written, or the client stopped reading): the connection is over.
    scope.cancel()


__all__ = ["Bridge", "ClientLink", "serve_client_stream"]
