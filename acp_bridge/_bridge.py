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
from typing import TYPE_CHECKING, Any, Final

import structlog
import trio

from acp_bridge import _pipes as pipes
from acp_bridge import _remote as remote
from acp_bridge import _status_report as status_report
from acp_bridge._approvals import Approvals, Ask
from acp_bridge._audit import AuditLog
from acp_bridge._backoff import Restarts
from acp_bridge._cancel import Cancel
from acp_bridge._capabilities import (
    CLIENT_METHOD_GATES,
    CONTAINED_PATHS,
)
from acp_bridge._containment import PathRefused, contain
from acp_bridge._framing import LineDecoder, Oversize
from acp_bridge._from_client import FromClient
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
from acp_bridge._jsonrpc import result as result_msg
from acp_bridge._links import (
    AgentLink,
    ClientLink,
    Tracer,
    Waiter,
)
from acp_bridge._listing import Listing
from acp_bridge._log_channel import LogChannel
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
    track_setup,
)
from acp_bridge._session_requests import SessionRequests
from acp_bridge._store import AuditRecord
from acp_bridge._supervisor import Supervisor
from acp_bridge._wire import (
    id_of,
    is_id,
    set_seq,
    well_formed_error,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from acp_bridge._agent import Launcher
    from acp_bridge._config import Config
    from acp_bridge._journal import Journal

logger = structlog.get_logger("acp_bridge.bridge")

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
        self.logs = LogChannel(hub)
        self.supervisor = Supervisor(
            hub,
            launcher=launcher,
            read_chunk=READ_CHUNK,
            reader=self._agent_reader,
            agent_log=self.logs.agent_log,
            undo_forward=self._undo_forward,
            approval_agent_gone=self.approvals.agent_gone,
            ask_type=Ask,
        )
        self.cancel = Cancel(
            hub,
            not_delivered=hub.not_delivered,
            agent_response=self._agent_response,
            send_log=self.logs.send_log,
            settle_session=self.approvals.settle_session,
        )
        self.listing = Listing(
            hub, internal_request=self.supervisor.internal_request, reply_error=hub.reply_error
        )
        #: sessions coming and going: detach, expire, forget, attach, reattach with replay
        self.reattach = Reattach(
            hub,
            answer_unattended=self._answer_unattended,
            internal_request=self.supervisor.internal_request,
            agent_log=self.logs.agent_log,
            send_log=self.logs.send_log,
            show_approval=self.approvals.show,
            forget_client=self.approvals.forget_client,
        )
        #: a client's requests on its sessions, and forward: the last step to an agent
        self.session_requests = SessionRequests(
            hub,
            ensure_ready=self.supervisor.ensure_ready,
            undo_forward=self._undo_forward,
            load_unknown=self._load_unknown,
            stored_request=self._stored_request,
            reused_request=self._reused_request,
            reattach=self.reattach.reattach,
            attach=self.reattach.attach,
            forget=self.reattach.forget,
            settle_permissions=self.cancel.settle_permissions,
        )
        #: sessions from before a restart (stored), reused ids, loads of unknown sessions
        self.restore = Restore(
            hub,
            ensure_ready=self.supervisor.ensure_ready,
            internal_request=self.supervisor.internal_request,
            strip_setup=hub.strip_setup,
            reply_error=hub.reply_error,
            forward_session_request=self.session_requests.forward_session_request,
            attach=self.reattach.attach,
            replay_journal=self.reattach.replay_journal,
            forget=self.reattach.forget,
        )
        self.log = logger
        #: every line a client sends (the transports call handle_client_line)
        self.from_client = FromClient(
            hub,
            session_request=self.session_requests.request,
            forward=self.session_requests.forward,
            ensure_ready=self.supervisor.ensure_ready,
            status=self.status,
            session_list=self.listing.session_list,
            cancel_session=self.cancel.cancel_session,
            client_response=self._client_response,
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
        """Everything ``acp-bridge status`` and ``/metrics`` show (see ``_status_report``)."""
        return status_report.status(
            self.hub, approvals=self.approvals.counts, requests_waiting=self._requests_waiting
        )

    def health(self) -> tuple[bool, JsonObject]:
        """Whether the default agent can serve now, and every agent's state (for /healthz)."""
        return status_report.health(self.hub)

    # ------------------------------------------------------------------ client → bridge

    async def handle_client_line(self, client: ClientLink, line: bytes | Oversize) -> None:
        """Handle one line from a client: answer it, or route it to an agent (``_from_client``)."""
        await self.from_client.line(client, line)

    def _history(self, session: Session) -> History:
        return self.hub.history(session)

    # The session requests and the restore need each other: these two are looked up when
    # called (the restore is built after the session requests).
    async def _load_unknown(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, sid: str
    ) -> None:
        await self.restore.load_unknown(client, msg, params, sid)

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
        """Start the agent if needed and wait until it completed ``initialize`` (Supervisor)."""
        await self.supervisor.ensure_ready(agent)

    async def agent_log(
        self, agent: AgentLink, level: str, message: str, *, stream: str | None
    ) -> None:
        """A diagnostic about an agent to the clients of its sessions (see LogChannel)."""
        await self.logs.agent_log(agent, level, message, stream=stream)

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
        await self.supervisor.stop_agents()


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
