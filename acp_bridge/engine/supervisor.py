"""
Supervision: the lives of the agent processes.

An agent is started on first use (:meth:`Supervisor.ensure_ready`), after a backoff when it
died recently, and not at all while it is in a crash loop (``agents.backoff``). One life is one task
(:meth:`Supervisor._agent_life`) owning a nursery with the launcher (which owns the process),
the agent's writer, its stderr reader (lines become ``_acp_bridge/log`` diagnostics) and its
protocol reader (the relay's: ``engine.relay``). The life starts with the ``initialize``
handshake, bounded by the agent's ``start_timeout``, and ends when the reader sees EOF: then
everything that waited on the agent is answered (:meth:`Supervisor.agent_gone`) and its
sessions end (published on :attr:`Supervisor.sessions_ended`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import trio

from acp_bridge.agents.backoff import CrashLoop
from acp_bridge.agents.process import AgentStartError, AgentTransport, StderrRing
from acp_bridge.config import remote
from acp_bridge.engine.approvals import Ask
from acp_bridge.engine.hub import answer_of
from acp_bridge.engine.links import AgentState, ClientLink, Waiter, pump_channel
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.diagnostics import guess_level
from acp_bridge.protocol.initialize import agent_fields, agent_params
from acp_bridge.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, JsonRpcError, JsonRpcId, dumps
from acp_bridge.protocol.notices import exit_notice, restart_notice
from acp_bridge.protocol.wire import PROTOCOL_VERSION
from acp_bridge.runtime import pipes
from acp_bridge.sessions.table import SessionState
from acp_bridge.sessions.topic import Topic

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from acp_bridge.agents.process import Launcher
    from acp_bridge.engine.approvals import Approvals
    from acp_bridge.engine.from_agent import FromAgent
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink
    from acp_bridge.engine.log_channel import LogChannel
    from acp_bridge.engine.subagents import Subagents

#: how long to wait for an exited agent's status before failing its requests without it
EXIT_STATUS_WAIT: Final = 0.25
#: the least an agent initialized before the bridge ran (``faces.early``) is still waited for
#: when its ``start_timeout`` ran out then: a moment for its stderr to be read, so that the
#: timeout's error carries what it printed, as it does otherwise
EARLY_LEFT_MIN: Final = 0.1


class Supervisor:
    """
    Starts, watches and stops the agents of one bridge.

    Args:
        hub: the bridge's shared state.
        launcher: how agents are started (a real subprocess launcher, or fakes in tests).
        logs: a diagnostic about an agent to its clients (its stderr, its starts and exits).
        from_agent: reads an agent's stdout; ends the requests forwarded to a dead one.
        approvals: settles the permission requests of an agent that exited.
        subagents: what an ssh agent is launched with (a forward to the MCP listener).
    """

    def __init__(
        self,
        hub: Hub,
        launcher: Launcher,
        logs: LogChannel,
        from_agent: FromAgent,
        approvals: Approvals,
        subagents: Subagents,
    ) -> None:
        self._hub = hub
        self._sessions = hub.sessions
        self._launcher = launcher
        self._logs = logs
        self._from_agent = from_agent
        self._approvals = approvals
        self._subagents = subagents
        #: an agent died: its sessions ended (told after everything waiting on it was answered)
        self.sessions_ended: Topic[[AgentLink]] = Topic()

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
                if agent.start_error is not None and not self.is_ready(agent):
                    raise agent.start_error
                continue
            if self._hub.stopping:
                raise JsonRpcError(INTERNAL_ERROR, "the bridge is shutting down")
            delay = self._restart_delay(agent)
            agent.state = AgentState.STARTING
            agent.settled = trio.Event()
            agent.start_error = None
            self._hub.spawn(self._agent_life, agent, delay)
            if agent.starts:
                # Its sessions that ended with its last life: their clients see it come back.
                ended = [
                    s for s in self._sessions.of_agent(agent.name) if s.state is SessionState.ENDED
                ]
                self._logs.agent_notice(agent, restart_notice(agent.name, delay), ended)

    def when_ready(
        self,
        client: ClientLink,
        request_id: JsonRpcId,
        agent: AgentLink,
        then: Callable[[], Awaitable[None]],
        *,
        failed: Callable[[], None] | None = None,
    ) -> None:
        """
        Run ``then`` in a task of its own once ``agent`` is up (a request must not hold its
        client's other lines while an agent starts). A start failure, or ``then``'s error, is
        answered to ``client`` under ``request_id``, after ``failed`` undid what was begun.
        """
        self._hub.spawn(self._when_ready, client, request_id, agent, then, failed)

    async def _when_ready(
        self,
        client: ClientLink,
        request_id: JsonRpcId,
        agent: AgentLink,
        then: Callable[[], Awaitable[None]],
        failed: Callable[[], None] | None,
    ) -> None:
        try:
            await self.ensure_ready(agent)
            await then()
        except JsonRpcError as exc:
            if failed is not None:
                failed()
            await self._hub.reply_error(client, request_id, exc)

    @staticmethod
    def is_ready(agent: AgentLink) -> bool:
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
        log = agent.log
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
            nursery.start_soon(self._from_agent.reader, agent, transport.receive, eof)
            log.info("agent_spawned", pid=transport.pid)
            if transport.initialized is not None:
                # Initialized before the imports (``faces.early``), under the id its first
                # request would have had here: that id is spent.
                agent.pending.pop(agent.pending.add(Waiter()))
                self._initialized(agent, transport.initialized)
            else:
                try:
                    await self._handshake(agent, eof, transport.initialize_sent)
                except JsonRpcError as exc:
                    self._start_failed(agent, exc)
                    nursery.cancel_scope.cancel()
                    await self.agent_gone(agent, reason="failed to initialize")
                    return
            agent.state = AgentState.READY
            agent.settled.set()
            log.info("agent_ready", pid=transport.pid)
            verb = "restarted" if agent.starts > 1 else "started"
            await self._logs.agent_log(
                agent, "info", f"agent {verb} (pid {transport.pid})", stream=None
            )
            await eof.wait()
            with trio.move_on_after(EXIT_STATUS_WAIT):
                await agent.exited.wait()
            log.warning("agent_exited", status=agent.exit_status, failure=agent.failure)
            reason = (
                remote.death_reason(agent.config, agent.exit_status)
                if agent.failure is None
                else f"was stopped: {agent.failure}"
            )
            await self._logs.agent_log(
                agent,
                "warning" if agent.failure is None else "error",
                f"agent {reason} (status {agent.exit_status})",
                stream=None,
            )
            # (Not when the bridge stops it: its clients are going too. Before the errors of
            # what waited on it: the user reads why first.)
            if agent.state is not AgentState.STOPPING and not self._hub.stopping:
                self._exit_notice(agent, reason)
            await self.agent_gone(agent, reason=reason)
            nursery.cancel_scope.cancel()

    def _exit_notice(self, agent: AgentLink, reason: str) -> None:
        """The sessions that end with the agent are told, and whether it comes back."""
        verdict = agent.restarts.next_start(trio.current_time(), dying=True)
        crash_loop = (verdict.deaths, verdict.window) if isinstance(verdict, CrashLoop) else None
        notice = exit_notice(agent.name, agent.exit_status, reason, crash_loop)
        self._logs.agent_notice(agent, notice)

    async def _run_launcher(
        self, agent: AgentLink, *, task_status: trio.TaskStatus[AgentTransport]
    ) -> None:
        try:
            config = await self._subagents.offers.launch_config(agent.config)
            agent.exit_status = await self._launcher(config, task_status=task_status)
        finally:
            agent.exited.set()

    async def _handshake(self, agent: AgentLink, eof: trio.Event, sent: float | None) -> None:
        """
        The agent's ``initialize``, checked. ``sent``: it was sent one before the bridge ran
        (``faces.early``, at that ``time.monotonic()``), under the link's first id: its answer is
        waited for in what is left of ``start_timeout`` (at least ``EARLY_LEFT_MIN``).
        """
        caps = self._hub.fixed_client_capabilities
        caps = remote.offered_capabilities(
            agent.config, self._hub.client_capabilities if caps is None else caps
        )
        params = agent_params(caps)
        wait = agent.config.start_timeout
        if sent is not None:
            wait = max(wait - (time.monotonic() - sent), EARLY_LEFT_MIN)

        async def ask() -> Any:
            if sent is None:
                return await self._hub.internal_request(agent, "initialize", params)
            waiter = Waiter()
            agent.pending.add(waiter)  # (the first id: the one it was sent)
            return await answer_of(agent, waiter)

        result: Any = None
        refused: JsonRpcError | None = None
        async with trio.open_nursery() as nursery:

            async def watch_eof() -> None:
                await eof.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_eof)
            with trio.move_on_after(wait) as timeout:
                try:
                    result = await ask()
                except JsonRpcError as exc:
                    # (raised out of here: inside the nursery it would be an exception
                    # group, which nobody catches, and the bridge would crash)
                    refused = exc
            nursery.cancel_scope.cancel()
        if refused is not None:
            raise refused
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
        self._initialized(agent, result)

    @staticmethod
    def _initialized(agent: AgentLink, result: JsonObject) -> None:
        """An agent's ``initialize`` result (checked), kept on its link."""
        agent.capabilities, agent.auth_methods, agent.agent_info = agent_fields(result)

    def _start_failed(self, agent: AgentLink, exc: JsonRpcError) -> None:
        agent.state = AgentState.DEAD
        agent.start_error = exc
        agent.restarts.died(trio.current_time())
        agent.settled.set()
        agent.log.error("agent_start_failed", error=exc.message)

    async def agent_gone(self, agent: AgentLink, *, reason: str) -> None:
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
        # Its requests withdrawn from the clients first, then what waited on it answered.
        for agent_id, (client, client_id) in list(agent.inflight.items()):
            shown = client.pending.get(client_id)
            if shown is not None and isinstance(shown.extra, Ask):
                await self._approvals.agent_gone(shown)
                continue
            del agent.inflight[agent_id]
            client.pending.pop(client_id)
            await client.send(dumps(rpc.notification("$/cancel_request", {"requestId": client_id})))
        for _, entry in agent.pending.drain():
            if isinstance(entry, Waiter):
                entry.set(rpc.error(None, err))
                continue
            client = entry.origin
            assert isinstance(client, ClientLink)
            client.done(entry.origin_id)
            self._from_agent.undo_forward(agent, entry, ok=False)
            answer = dumps(rpc.error(entry.origin_id, err))
            session = entry.session
            if client.closed and session is not None and session.client is None:
                # Its connection is gone: held for whoever takes the session back.
                if not self._hub.hold_answer(session, entry.origin_id, answer):
                    session.log.warning("held_response_dropped")
                continue
            await client.send(answer)
        for session in self._sessions.of_agent(agent.name):
            session.state = SessionState.ENDED
            for entry in list(session.parked):
                if isinstance(entry.extra, Ask):
                    await self._approvals.agent_gone(entry)
            session.parked.clear()
            session.pending_permissions.clear()
        agent.new_in_flight = 0
        agent.early_updates.clear()
        self.sessions_ended.publish(agent)

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
            agent.log.debug("agent_stdin_closed")

    async def _agent_stderr(self, agent: AgentLink, stream: trio.abc.ReceiveStream) -> None:
        """
        Every stderr line becomes a ``_acp_bridge/log`` notification (rate-limited) and a log
        line; the protocol reader is another task, so a flood here never delays it.
        """
        try:
            while data := await stream.receive_some(pipes.READ_BUFFER_BYTES):
                for line in agent.stderr.feed(data):
                    await self._logs.agent_log(agent, guess_level(line), line, stream="stderr")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        tail = agent.stderr.flush()
        if tail is not None:
            await self._logs.agent_log(agent, guess_level(tail), tail, stream="stderr")


__all__ = ["EXIT_STATUS_WAIT", "Supervisor"]
