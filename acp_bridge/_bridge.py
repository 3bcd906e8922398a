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
from acp_bridge._approvals import Approvals, Ask
from acp_bridge._audit import AuditLog
from acp_bridge._backoff import CrashLoop, Restarts
from acp_bridge._capabilities import (
    CLIENT_METHOD_GATES,
    CONNECTION_METHODS,
    CONTAINED_PATHS,
    LOOK_ONLY_METHODS,
    SESSION_METHODS,
    agent_selector,
    check_prompt_content,
    has_session_cap,
)
from acp_bridge._containment import PathRefused, contain
from acp_bridge._diagnostics import LEVEL_RANK as _LEVEL_RANK
from acp_bridge._diagnostics import LOG_BURST, LOG_LEVELS, LOG_RATE, guess_level
from acp_bridge._framing import LineDecoder, Oversize
from acp_bridge._heap import memory_figures
from acp_bridge._hub import Hub
from acp_bridge._jsonrpc import (
    INTERNAL_ERROR,
    JsonObject,
    JsonRpcError,
    JsonRpcId,
    Kind,
    classify,
    dumps,
    loads,
    params_of,
    rewrite_session_id,
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
from acp_bridge._reattach import Reattach
from acp_bridge._redact import Redactor
from acp_bridge._restore import Restore
from acp_bridge._routing import (
    HELD_RESPONSES_MAX,
    SETUP_UPDATES,
    Forwarded,
    History,
    Session,
    SessionState,
    SessionTable,
    Setup,
    capture_setup,
    roots_of,
    track_setup,
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
    well_formed_error,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from acp_bridge._config import Config
    from acp_bridge._journal import Journal

logger = structlog.get_logger("acp_bridge.bridge")

#: how long to wait for an exited agent's status before failing its requests without it
EXIT_STATUS_WAIT: Final = 0.25
#: updates held for a session id the bridge does not know yet (agent sent them before its
#: session/new response); beyond this they are dropped
EARLY_UPDATES_MAX: Final = 64
#: URL elicitations remembered per agent, to route their completion (oldest forgotten)
ELICITATIONS_MAX: Final = 1024
READ_CHUNK: Final = 64 * 1024
#: Agents' readers share a budget of lines per scheduler round: each reader with lines to
#: handle lets the other tasks run after its share (``READ_ROUND_LINES`` over the readers
#: busy at that moment, at least ``READER_TURN_MIN``). So one flooding agent relays in long
#: turns (few writes, little scheduling), and fifty of them in short ones: either way, a
#: round of the scheduler, which every hop of another session's round trip waits for, holds
#: about the same work.
READ_ROUND_LINES: Final = 128
READER_TURN_MIN: Final = 4


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
        #: agents' readers handling lines right now (see ``READ_ROUND_LINES``)
        self._busy_readers = 0
        self.deadlines = hub.deadlines
        self.audit = hub.audit
        self.approvals = Approvals(self, config.policy, self.audit)
        #: sessions coming and going: detach, expire, forget, attach, reattach with replay
        self.reattach = Reattach(
            hub,
            answer_unattended=self._answer_unattended,
            internal_request=self._internal_request,
            agent_log=self.agent_log,
            send_log=self.send_log,
            show_approval=self.approvals.show,
            forget_client=self.approvals.forget_client,
        )
        #: sessions from before a restart (stored), reused ids, loads of unknown sessions
        self.restore = Restore(
            hub,
            ensure_ready=self.ensure_ready,
            internal_request=self._internal_request,
            strip_unsupported_setup=self._strip_unsupported_setup,
            reply_error=self._reply_error,
            forward_session_request=self._forward_session_request,
            attach=self.reattach.attach,
            replay_journal=self.reattach.replay_journal,
            forget=self.reattach.forget,
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
                "requestsInFlight": self._requests_waiting(a),
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
            await self._client_response(client, msg)
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
                await self.restore.load_unknown(client, msg, params, sid)
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
            await self.restore.stored_request(client, msg, params, session, agent)
            return
        if session.state is SessionState.ENDED and not self.sessions.owns_agent_id(session):
            await self.restore.reused_request(client, msg, session)
            return
        live = session.state is SessionState.ACTIVE and agent.state is AgentState.READY
        if live and method in ("session/load", "session/resume"):
            await self.reattach.reattach(client, msg, params, session)
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
            await self.reattach.attach(session, client)
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

    def _history(self, session: Session) -> History:
        return self.hub.history(session)

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
        self.reattach.forget(session, delete=msg["method"] == "session/delete")
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
            self._undo_forward(agent, entry, ok=False)
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
            await self._agent_response(agent, {"jsonrpc": "2.0", "id": bridge_id, "result": result})
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

    async def _client_response(self, client: ClientLink, msg: JsonObject) -> None:
        client_id = msg["id"]
        well_formed_error(msg)
        entry = client.pending.pop(client_id)
        if entry is None:
            # Late (already settled by the bridge) or unknown: nothing is waiting on it.
            if not await self.approvals.late_answer(client, client_id):
                self.log.debug("client_response_unmatched", id=client_id)
            return
        if isinstance(entry.extra, Ask):
            await self.approvals.client_answer(client, client_id, entry, msg)
            return
        agent = entry.origin
        assert isinstance(agent, AgentLink)
        agent.inflight.pop(entry.origin_id, None)
        msg["id"] = entry.origin_id
        if not agent.answer(dumps(msg)):
            # Not running any more (its requests died with it), or stalled (being stopped).
            self.log.warning("response_not_delivered", agent=agent.name, method=entry.method)

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
            nursery.start_soon(self._agent_reader, agent, transport.receive, eof)
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
            self._undo_forward(agent, entry, ok=False)
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

    async def _agent_reader(
        self, agent: AgentLink, stream: trio.abc.ReceiveStream, eof: trio.Event
    ) -> None:
        decoder = LineDecoder(max_line_bytes=self.config.bridge.max_line_bytes)
        handle = self._agent_line
        relay = self._relay_update
        try:
            while data := await stream.receive_some(READ_CHUNK):
                lines = decoder.feed(data)
                yielded = False  # (just now, after the last line)
                if lines:
                    self._busy_readers += 1
                    try:
                        turn = self._reader_turn()
                        for line in lines:
                            # Most lines are session updates, relayed without a coroutine.
                            if not relay(agent, line):
                                await handle(agent, line)
                            turn -= 1
                            yielded = not turn
                            if yielded:
                                # One read can hold hundreds of lines: let the others in
                                # (no line of the chunk is dropped on cancellation).
                                await trio.lowlevel.cancel_shielded_checkpoint()
                                turn = self._reader_turn()
                    finally:
                        self._busy_readers -= 1
                if decoder.discarding is not None and agent.failure is None:
                    # A line past the cap: stopped now, not when (or if) the line ends.
                    cap = self.config.bridge.max_line_bytes
                    agent.fail(
                        f"it is writing a line over max_line_bytes ({cap}): "
                        f"{decoder.discarding} bytes so far"
                    )
                if not yielded:
                    # (A read of a pipe with data waiting does not yield: this one does, so
                    # an agent that never stops writing never holds the others up.)
                    await trio.lowlevel.cancel_shielded_checkpoint()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            eof.set()
        rest = decoder.feed_eof()
        if rest is not None:
            self.log.warning("agent_partial_line_at_exit", agent=agent.name)

    def _reader_turn(self) -> int:
        """Lines a busy agent reader handles before it lets the others run."""
        return max(READER_TURN_MIN, READ_ROUND_LINES // max(1, self._busy_readers))

    def _relay_update(self, agent: AgentLink, line: bytes | Oversize) -> bool:
        """
        The hot path: relay a ``session/update`` of a known session to a client that has room
        (or record it for a detached one) without awaiting. False leaves the line untouched
        for :meth:`_agent_line` (anything else, or an update that must wait or be held).
        """
        if type(line) is not bytes or b'"session/update"' not in line:
            return False
        try:
            msg = loads(line)
        except JsonRpcError:
            return False
        if (
            type(msg) is not dict
            or msg.get("method") != "session/update"
            or "id" in msg
            or msg.get("jsonrpc") != "2.0"
        ):
            return False
        params = msg.get("params")
        if type(params) is not dict:
            return False
        sid = params.get("sessionId")
        session = self.sessions.find(agent.name, sid) if type(sid) is str else None
        if session is None:
            return False
        client = session.client
        if client is not None and not client.closed and not client.has_room():
            return False
        self.counters["from_agent"] += 1
        if self.tracer is not None:
            self.tracer(f"agent:{agent.name}", "in", line)
        data = self._record_update(session, msg, params, line)
        if client is not None:
            if client.want_seq:
                data = dumps(msg)
            client.put_update(data, session)
        return True

    async def _agent_line(self, agent: AgentLink, line: bytes | Oversize) -> None:
        self.counters["from_agent"] += 1
        if self.tracer is not None and isinstance(line, bytes):
            self.tracer(f"agent:{agent.name}", "in", line)
        if isinstance(line, Oversize):
            self.log.warning("agent_line_oversize", agent=agent.name, size=line.size)
            cap = self.config.bridge.max_line_bytes
            agent.fail(f"it sent a line of {line.size} bytes, over max_line_bytes ({cap})")
            return
        try:
            msg = loads(line)
        except JsonRpcError:
            # A stray line (a shell profile, a print): a diagnostic, not a dead session.
            await self.agent_log(
                agent, "warning", line[:65536].decode("utf-8", "replace"), stream="stdout"
            )
            return
        kind = classify(msg)
        if kind is Kind.NOTIFICATION:
            if msg["method"] == "session/update":
                await self._agent_update(agent, msg, line)
            else:
                await self._agent_notification(agent, msg)
        elif kind is Kind.RESPONSE:
            await self._agent_response(agent, msg)
        elif kind is Kind.REQUEST:
            await self._agent_request(agent, msg)
        else:
            self.log.warning("agent_invalid_message", agent=agent.name)
            req_id = id_of(msg)
            if req_id is not None:
                agent.answer(dumps(error_msg(req_id, JsonRpcError.invalid_request())))

    async def _agent_update(self, agent: AgentLink, msg: JsonObject, line: bytes) -> None:
        """A session/update :meth:`_relay_update` left: maybe held, maybe waiting for room."""
        params = msg.get("params")
        sid = params.get("sessionId") if type(params) is dict else None
        session = self.sessions.find(agent.name, sid) if type(sid) is str else None
        if session is None:
            held = len(agent.early_updates)
            if agent.new_in_flight and type(sid) is str and held < EARLY_UPDATES_MAX:
                agent.early_updates.append((sid, line))
                return
            self.log.warning("update_for_unknown_session", agent=agent.name, session=sid)
            return
        assert type(params) is dict
        data = self._record_update(session, msg, params, line)
        client = session.client
        if client is None:
            return
        if client.want_seq:
            data = dumps(msg)
        await client.send(data)

    def _record_update(
        self, session: Session, msg: JsonObject, params: JsonObject, line: bytes
    ) -> bytes:
        """
        Rewrite the session id if needed, number and record the update (history, journal),
        track setup changes; the bytes to relay (unchanged when no rewrite is needed). With
        ``_meta.acp_bridge.seq`` stamped in ``msg`` for a client that opted in.
        """
        if session.rewrite:
            params["sessionId"] = session.bridge_id
            rewritten = rewrite_session_id(line, session.agent_id, session.bridge_id)
            data = dumps(msg) if rewritten is None else rewritten + b"\n"
        else:
            data = line + b"\n"
        history = session.history
        seq = 0
        if history is not None and session.state is not _LOADING:
            # (An agent's own load replay repeats what the journal has: not recorded again.)
            seq = history.append(data)
            if self.journal is not None:
                self.journal.updated(session.bridge_id, history)
        update = params.get("update")
        if type(update) is dict:
            kind = update.get("sessionUpdate")
            if type(kind) is str and kind in SETUP_UPDATES:
                track_setup(session, update)
        client = session.client
        if client is not None and client.want_seq:
            set_seq(params, seq)
        return data

    async def _agent_notification(self, agent: AgentLink, msg: JsonObject) -> None:
        method: str = msg["method"]
        params = params_of(msg)
        if method == "$/cancel_request":
            request_id = params.get("requestId")
            if is_id(request_id):
                await self._agent_withdrew(agent, request_id)
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
            session = self.sessions.find(agent.name, sid)
            if session is not None and session.client is not None:
                if session.rewrite:
                    params["sessionId"] = session.bridge_id
                await session.client.send(dumps(msg))
                return
        self.log.debug("agent_notification_ignored", agent=agent.name, method=method)

    async def _agent_withdrew(self, agent: AgentLink, request_id: JsonRpcId) -> None:
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
        ask = isinstance(entry.extra, Ask)
        if not ask:
            # Settled before anything yields: an answer the client sends meanwhile is late.
            client.pending.pop(client_id)
            agent.inflight.pop(request_id, None)
            if entry.session is not None:
                entry.session.pending_permissions.discard(client_id)
            withdrawn = JsonRpcError.cancelled("withdrawn by the agent")
            agent.send_nowait(dumps(error_msg(request_id, withdrawn)))
        await client.send(dumps(notification_msg("$/cancel_request", {"requestId": client_id})))
        if ask:
            # (Exactly once: a no-op if the client's answer settled it meanwhile.)
            await self.approvals.settle(entry, {"outcome": "cancelled"}, source="agent_cancel")

    async def _withdraw_parked(self, agent: AgentLink, request_id: JsonRpcId) -> None:
        """A withdrawn request parked for a reattach: answered now, never shown again."""
        found = self._find_parked(agent, request_id)
        if found is None:
            return
        session, entry = found
        if isinstance(entry.extra, Ask):
            await self.approvals.settle(entry, {"outcome": "cancelled"}, source="agent_cancel")
            return
        session.parked.remove(entry)
        withdrawn = JsonRpcError.cancelled("withdrawn by the agent")
        agent.send_nowait(dumps(error_msg(request_id, withdrawn)))

    async def _agent_request(self, agent: AgentLink, msg: JsonObject) -> None:
        method: str = msg["method"]
        params = params_of(msg)
        agent_id = msg["id"]
        if agent_id in agent.inflight or self._find_parked(agent, agent_id) is not None:
            # One request per id: a second would hide the first from the bookkeeping, and
            # its answer could then reach the agent's next process after a restart. (A
            # parked request is still in flight: it is shown again to the next connection.)
            duplicate = JsonRpcError.invalid_request(f"request id {agent_id!r} is in flight")
            agent.answer(dumps(error_msg(agent_id, duplicate)))
            return
        sid = params.get("sessionId")
        session = self.sessions.find(agent.name, sid) if isinstance(sid, str) else None
        gate = CLIENT_METHOD_GATES.get(method)
        if gate is None and not method.startswith("_"):
            agent.answer(dumps(error_msg(agent_id, JsonRpcError.method_not_found(method))))
            return
        if not remote.may_call_client(agent.config, method):
            why = "the client's files are not offered to a remote agent (client_fs = false)"
            agent.answer(dumps(error_msg(agent_id, JsonRpcError.method_not_found(method, why))))
            return
        if session is None:
            err = (
                JsonRpcError.resource_not_found(f"unknown session {sid!r}")
                if sid is not None
                else JsonRpcError.method_not_found(method, "no session to route it by")
            )
            agent.answer(dumps(error_msg(agent_id, err)))
            return
        if self._requests_waiting(agent) >= self.config.bridge.max_agent_requests:
            await self._refuse_over_limit(agent, msg, params, session)
            return
        if method == "session/request_permission":
            await self.approvals.permission_request(agent, msg, params, session)
            return
        if method in CONTAINED_PATHS and not await self._contain(agent, msg, params, session):
            return
        client = session.client
        if (
            client is None
            or client.closed
            or (session.unattended and method == "elicitation/create")
        ):
            await self._answer_unattended(
                Forwarded(agent, agent_id, method, session, params), "unattended"
            )
            return
        if gate is not None and not gate(client.capabilities):
            agent.answer(
                dumps(
                    error_msg(
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
        if method == "elicitation/create" and isinstance(params.get("elicitationId"), str):
            if len(agent.elicitations) >= ELICITATIONS_MAX:
                agent.elicitations.pop(next(iter(agent.elicitations)))  # the oldest goes
            agent.elicitations[params["elicitationId"]] = client
        msg["id"] = client_id
        if session.rewrite:
            params["sessionId"] = session.bridge_id
        await client.send(dumps(msg))

    def _requests_waiting(self, agent: AgentLink) -> int:
        """
        The requests of ``agent`` that wait on a client: shown (``inflight``) or parked for
        the session's next owner. Counted from the tables themselves, so whatever ends a
        request (an answer, a cancel, the deadline, the agent's exit, the client's) frees
        its place; a parked one is counted once even while still listed as shown.
        """
        inflight = agent.inflight
        parked = sum(
            1
            for session in self.sessions.of_agent(agent.name)
            for entry in session.parked
            if entry.origin is agent and entry.origin_id not in inflight
        )
        return len(inflight) + parked

    async def _refuse_over_limit(
        self, agent: AgentLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> None:
        """
        ``max_agent_requests`` of the agent's requests wait on clients already: this one is
        answered at once (a permission ``cancelled``, audited; anything else an error), so an
        agent that asks without end of a client that never answers holds bounded memory.
        """
        limit = self.config.bridge.max_agent_requests
        agent.requests_refused += 1
        method = msg["method"]
        self.log.warning(
            "agent_requests_over_limit",
            agent=agent.name,
            session=session.bridge_id,
            method=method,
            limit=limit,
            refused=agent.requests_refused,
        )
        detail = f"{limit} requests of agent {agent.name!r} already wait on a client"
        if method == "session/request_permission":
            await self.approvals.over_limit(agent, msg["id"], params, session, detail)
            return
        err = JsonRpcError(
            INTERNAL_ERROR,
            f"too many requests in flight: {detail} (max_agent_requests)",
            {"maxAgentRequests": limit},
        )
        agent.answer(dumps(error_msg(msg["id"], err)))

    def _find_parked(
        self, agent: AgentLink, agent_id: JsonRpcId
    ) -> tuple[Session, Forwarded] | None:
        """The request of ``agent`` with that id waiting for a session's next owner, if any."""
        for session in self.sessions.of_agent(agent.name):
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
            params[key] = contain(path, session.roots, self.config.policy.deny_paths)
        except PathRefused as exc:
            self.log.warning(
                "file_access_refused",
                agent=agent.name,
                session=session.bridge_id,
                reason=exc.reason,
            )
            await self.approvals.file_refused(session, agent, msg["method"], path, exc)
            agent.answer(
                dumps(
                    error_msg(
                        msg["id"],
                        JsonRpcError.invalid_params(f"{key} refused ({exc.reason}): {exc}"),
                    )
                )
            )
            return False
        return True

    async def _answer_unattended(self, entry: Forwarded, reason: str) -> None:
        """
        Nobody can answer an agent's request: a permission is denied (through the approval
        rules: audited, exactly once), an elicitation declined, anything else an error.
        """
        if isinstance(entry.extra, Ask):
            await self.approvals.unattended(entry, reason)
            return
        agent = entry.origin
        assert isinstance(agent, AgentLink)
        agent.inflight.pop(entry.origin_id, None)
        if entry.method == "elicitation/create":
            agent.answer(dumps(result_msg(entry.origin_id, {"action": "decline"})))
            if entry.session is not None:
                await self.audit.record(
                    AuditRecord(
                        session=entry.session.bridge_id,
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
                    error_msg(
                        entry.origin_id,
                        JsonRpcError(INTERNAL_ERROR, "no client is attached to this session"),
                    )
                )
            )

    async def _agent_response(self, agent: AgentLink, msg: JsonObject) -> None:
        entry = agent.pending.pop(msg["id"])
        if entry is None:
            self.log.warning("agent_response_unmatched", agent=agent.name, id=msg["id"])
            return
        if isinstance(entry, Waiter):
            entry.set(msg)
            return
        client = entry.origin
        assert isinstance(client, ClientLink)
        client.done(entry.origin_id)
        ok = "result" in msg
        if ok and entry.method in ("session/new", "session/fork"):
            refused = self._live_id_reused(agent, msg["result"])
            if refused is not None:
                msg = error_msg(msg["id"], refused)
                ok = False
        early = self._undo_forward(agent, entry, ok=ok, result=msg.get("result"))
        msg["id"] = entry.origin_id
        well_formed_error(msg)
        session = entry.session
        if (
            client.closed
            and session is not None
            and (session.client is None or session.client is client)
            and session.state is SessionState.ACTIVE
        ):
            # Its connection is gone (or closed and about to be detached: an overflow) and
            # nobody else has the session: keep the answer for whoever takes it back within
            # the grace period (in its place in the stream).
            if len(session.held_responses) < HELD_RESPONSES_MAX:
                session.held_responses.append(
                    (self._history(session).last_seq, entry.origin_id, dumps(msg))
                )
            else:
                self.log.warning("held_response_dropped", session=session.bridge_id)
            return
        for line in early:
            await client.send(line)
        if session is None:
            await client.send(dumps(msg))
        else:
            await client.send_answer(dumps(msg), session)

    def _live_id_reused(self, agent: AgentLink, result: Any) -> JsonRpcError | None:
        """
        The error for a new session the agent answered with the id of one of its sessions
        that is live (a client's, or being loaded): merging them would hand the first client's
        session, its roots and its permission requests to the second. The agent's own session
        is left alone (it is the first client's); the new one is refused.
        """
        sid = result.get("sessionId") if isinstance(result, dict) else None
        if not isinstance(sid, str):
            return None
        live = self.sessions.find(agent.name, sid)
        if live is None or live.state not in (SessionState.ACTIVE, SessionState.LOADING):
            return None
        self.log.warning("agent_reused_live_session_id", agent=agent.name, agent_session=sid)
        return JsonRpcError(
            INTERNAL_ERROR,
            f"agent {agent.name!r} answered with the id of a session that is already open "
            f"({sid!r}): the new session is refused",
            {"agent": agent.name, "sessionId": sid},
        )

    def _displace(self, session: Session) -> None:
        """
        A stored session (from before a restart) whose agent gave its id to a new session:
        the new session takes the bridge id (its client sees the agent's id unchanged), the
        stored one moves to an id of its own, with its journal (still listed, still loadable
        with a journal replay).
        """
        old = session.bridge_id
        new = self.sessions.displace(session)
        why = self._unrestorable.pop(old, None)
        if why is not None:
            self._unrestorable[new] = why
        if self.journal is not None:
            self.journal.rename(old, new)
            if session.history is not None:
                self.journal.follow(new, session.history)
        self.log.info("stored_session_moved", session=old, to=new, agent=session.agent)

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

    def _undo_forward(
        self, agent: AgentLink, entry: Forwarded, *, ok: bool, result: Any = None
    ) -> list[bytes]:
        """
        Bookkeeping when a forwarded request ends: bind, rebind or forget sessions.

        Returns updates held back for a new session (to be sent before the response).
        """
        method = entry.method
        session = entry.session
        early: list[bytes] = []
        client = entry.origin
        if method in ("session/new", "session/fork"):
            if method == "session/new":
                agent.new_in_flight = max(0, agent.new_in_flight - 1)
            if ok and isinstance(result, dict) and isinstance(result.get("sessionId"), str):
                sid = result["sessionId"]
                stale = self.sessions.find(agent.name, sid)
                if stale is not None and stale.state in (SessionState.ENDED, SessionState.STORED):
                    # A restarted agent minted the id a session of its earlier life had: the
                    # new session is another one (its own history and journal).
                    self.sessions.release_agent_id(stale)
                holder = self.sessions.get(sid)
                if (
                    holder is not None
                    and holder.state is SessionState.STORED
                    and (holder.agent, holder.agent_id) == (agent.name, sid)
                ):
                    # Stored (the bridge restarted), not live: it does not keep the new session
                    # from the agent's own id. (A stored session of another agent does: its
                    # agent may still restore it under that id.)
                    self._displace(holder)
                new = self.sessions.register(agent.name, sid, client=client)
                new.client = client
                new.state = SessionState.ACTIVE
                if isinstance(entry.context, Setup):
                    new.roots = entry.context.roots
                    new.unattended = entry.context.unattended
                self._history(new)
                capture_setup(new, result)
                self.persist(new)
                if new.rewrite:
                    result["sessionId"] = new.bridge_id
                early = self._take_early_updates(agent, new)
                if client.closed:
                    # Its connection died before the answer came: nobody knows the session
                    # yet; it expires like any detached one unless someone takes it.
                    self.reattach.schedule_detach(new)
        elif method == "session/load" and session is not None:
            if ok:
                session.state = SessionState.ACTIVE
                session.client = client
                capture_setup(session, result)
                self.persist(session)
                early = self.reattach.take_held(session, float("inf"))  # answered while away
            elif isinstance(entry.context, tuple) and entry.context[0] is not SessionState.LOADING:
                session.state, session.client = entry.context
            else:
                # A load of an id the bridge did not know: nothing to go back to.
                self.sessions.remove(session)
        elif method == "session/resume" and session is not None:
            if ok:
                session.state = SessionState.ACTIVE
                session.client = client
                self._history(session)
                capture_setup(session, result)
                self.persist(session)
                early = self.reattach.take_held(session, float("inf"))  # answered while away
            elif session.state is SessionState.LOADING:
                self.sessions.remove(session)
        elif method == "session/set_config_option" and session is not None and ok:
            capture_setup(session, result)
        elif method in ("session/close", "session/delete") and session is not None and ok:
            self.sessions.remove(session)
            self.reattach.forget(session, delete=method == "session/delete")
        elif method == "session/archive" and session is not None and ok:
            # The agent closed it (the spec: as session/close would) but keeps it: the bridge
            # keeps its id routable (unarchive, load) like a listed session, attached to none.
            self.reattach.forget(session)
            session.state = SessionState.LISTED
            session.client = None
        return early

    def _take_early_updates(self, agent: AgentLink, session: Session) -> list[bytes]:
        if not agent.early_updates:
            return []
        mine = [line for sid, line in agent.early_updates if sid == session.agent_id]
        agent.early_updates = [(s, ln) for s, ln in agent.early_updates if s != session.agent_id]
        if not agent.new_in_flight:
            agent.early_updates.clear()
        out = []
        for line in mine:
            if session.rewrite:
                msg = loads(line)
                msg["params"]["sessionId"] = session.bridge_id
                out.append(dumps(msg))
            else:
                out.append(line + b"\n")
        return out

    async def stop_agents(self) -> None:
        """Stop every agent (stdin EOF → SIGTERM → SIGKILL) and wait for them."""
        for agent in self.agents.values():
            if agent.stop_scope is not None and agent.state is not AgentState.STOPPED:
                agent.state = AgentState.STOPPING
                agent.stop_scope.cancel()


#: Agent calls whose path (or cwd) must stay inside the session's roots: method → param.
#: (an enum member's lookup through its class costs ~70 ns on CPython 3.11: once per update)
_LOADING: Final = SessionState.LOADING


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
