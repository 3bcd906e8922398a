"""
The hub: the state the bridge's services share, and the few things every one of them does
with it (start a task, record a session, open its history, ask an agent something of the
bridge's own, answer a client's request with an error, tell a client its notification went
nowhere).

It decides nothing and knows no service. :class:`~acp_bridge.engine.bridge.Bridge` builds the
hub, then the services in the order they use each other: each takes the hub and, typed, the
services it calls, all built before it (the one exception, the sub-agents reaching the
supervisor, goes through the Bridge: see docs/architecture.md). What one service tells
others (a session left the table, a kept session moved, an agent's sessions ended, a
forwarded session request ended) is a topic (``sessions.topic``) it publishes, and the
Bridge subscribes the listeners.
"""

from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING, Any

import attrs
import structlog

from acp_bridge.agents.backoff import Restarts
from acp_bridge.config import remote
from acp_bridge.engine.audit import AuditLog
from acp_bridge.engine.links import AgentLink, AgentState, Waiter
from acp_bridge.engine.watchers import fan_out
from acp_bridge.observe.redact import Redactor
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import strip_unsupported_setup
from acp_bridge.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, JsonRpcError, JsonRpcId, dumps
from acp_bridge.runtime.timers import Deadlines
from acp_bridge.sessions.table import HELD_RESPONSES_MAX, History, Session, SessionTable
from acp_bridge.sessions.tree import Tree
from acp_bridge.store.db import SessionRow

if TYPE_CHECKING:
    from collections.abc import Callable

    import trio

    from acp_bridge.config.model import Config
    from acp_bridge.engine.journal import Journal
    from acp_bridge.engine.links import ClientLink, Tracer

logger = structlog.get_logger("acp_bridge.bridge")


@attrs.define(eq=False)
class Hub:
    """What every service of one bridge shares (one per bridge: nothing process-wide)."""

    config: Config
    audit: AuditLog
    redactor: Redactor
    #: configured agents by name, in the config's order
    agents: dict[str, AgentLink]
    default_agent: str
    tracer: Tracer | None = None
    #: the durable side (sessions, journal, pending approvals); None: memory only
    journal: Journal | None = None
    #: the ``clientCapabilities`` every agent is initialized with (a daemon's); None: those
    #: of the client whose ``initialize`` started it (stdio), kept in ``client_capabilities``
    fixed_client_capabilities: JsonObject | None = None
    client_capabilities: JsonObject = attrs.field(factory=dict)
    sessions: SessionTable = attrs.field(factory=SessionTable)
    #: the sub-agents: every open child by parent (``engine.subagents`` keeps it)
    tree: Tree = attrs.field(factory=Tree)
    clients: set[ClientLink] = attrs.field(factory=set)
    #: messages by direction (from_client, to_client, from_agent, to_agent), errors the
    #: bridge answered by code (error:<code>): for status and metrics
    counters: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: timers: detached sessions' grace periods (key ("detach", session)), approval
    #: deadlines (key ("ask", entry)), cancel grace (key ("cancel", ...))
    deadlines: Deadlines = attrs.field(factory=Deadlines)
    #: numbers of client links, and ids of requests to clients (see ``ClientLink``)
    client_ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    client_request_ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    #: restored sessions whose agent could not take them up again: why
    unrestorable: dict[str, str] = attrs.field(factory=dict)
    #: set once the bridge is ending: no task is started any more
    stopping: bool = False
    nursery: trio.Nursery | None = None
    log: Any = logger

    @classmethod
    def build(
        cls,
        config: Config,
        *,
        fixed_client_capabilities: JsonObject | None = None,
        audit: AuditLog | None = None,
        tracer: Tracer | None = None,
        journal: Journal | None = None,
        redactor: Redactor | None = None,
    ) -> Hub:
        """A bridge's hub: one link per configured agent; the agents' secrets redacted."""
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
        return cls(
            config=config,
            audit=audit if audit is not None else AuditLog(),
            redactor=redactor,
            agents=agents,
            default_agent=config.default_agent.name,
            tracer=tracer,
            journal=journal,
            fixed_client_capabilities=fixed_client_capabilities,
            counters=counters,
        )

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        """
        Run ``fn(*args)`` in the bridge's nursery.

        Raises:
            JsonRpcError: the bridge is stopping (its nursery takes no new task; a connection
                that ends during shutdown must not try).
        """
        assert self.nursery is not None, "Bridge.run() is not running"
        if self.stopping:
            raise JsonRpcError(INTERNAL_ERROR, "the bridge is shutting down")
        self.nursery.start_soon(fn, *args)

    def persist(self, session: Session, state: str = "active") -> None:
        """Record a session's row in the store (no-op without one)."""
        if self.journal is not None:
            self.journal.session(
                SessionRow(
                    bridge_id=session.bridge_id,
                    agent=session.agent,
                    agent_id=session.agent_id,
                    roots=session.roots,
                    setup=session.setup,
                    unattended=session.unattended,
                    state=state,
                    created=session.created,
                    parent=session.parent,
                )
            )

    def strip_setup(self, agent: AgentLink, params: JsonObject) -> tuple[str, ...]:
        """
        Drop from a session's setup what ``agent`` cannot take (logged, names only); returns
        what was dropped, for the client to be told once the session is open.
        """
        if stripped := strip_unsupported_setup(agent.capabilities, params):
            self.log.warning("stripped_setup", agent=agent.name, stripped=stripped)
        return tuple(stripped)

    def hold_answer(self, session: Session, origin_id: JsonRpcId, data: bytes) -> bool:
        """
        An answer for a connection that went away, kept in its place in the session's stream
        for whoever takes the session back; False: ``HELD_RESPONSES_MAX`` are kept already
        (the caller says it dropped one).
        """
        if len(session.held_responses) >= HELD_RESPONSES_MAX:
            return False
        session.held_responses.append((self.history(session).last_seq, origin_id, data))
        return True

    def remember_prompt(self, session: Session, prompt: object) -> None:
        """
        A prompt (its content blocks, or a text) goes into the session's history as
        ``user_message_chunk`` updates, as the client sent it: a replay shows both sides. Not
        sent to the owner, which sent it; sent live to the watchers, which did not, so what a
        watcher sees live is what a replay would give it.
        """
        if isinstance(prompt, str):
            prompt = [{"type": "text", "text": prompt}]
        if not isinstance(prompt, list):
            return
        history = self.history(session)
        watchers = session.watchers
        for block in prompt:
            update = {"sessionUpdate": "user_message_chunk", "content": block}
            params: JsonObject = {"sessionId": session.bridge_id, "update": update}
            msg = rpc.notification("session/update", params)
            data = dumps(msg)
            seq = history.append(data, live=False)
            if watchers is not None:
                fan_out(session, watchers, msg, params, data, seq)
        if self.journal is not None:
            self.journal.updated(session.bridge_id, history)

    def history(self, session: Session) -> History:
        """The session's replay history, made (and followed by the journal) on first use."""
        if session.history is None:
            limits = self.config.bridge
            session.history = History(
                max_entries=limits.history_limit, max_bytes=limits.history_bytes
            )
            if self.journal is not None:
                self.journal.follow(session.bridge_id, session.history)
        return session.history

    async def internal_request(self, agent: AgentLink, method: str, params: JsonObject) -> Any:
        """A request of the bridge's own to an agent; returns its result or raises."""
        waiter = Waiter()
        bridge_id = agent.pending.add(waiter)
        remote.map_to_agent(agent.config, method, params)
        if not agent.send_nowait(dumps(rpc.request(bridge_id, method, params))):
            agent.pending.pop(bridge_id)
            raise JsonRpcError(INTERNAL_ERROR, f"agent {agent.name!r} is not accepting input")
        return await answer_of(agent, waiter)

    async def reply_error(self, client: ClientLink, id_: JsonRpcId, exc: JsonRpcError) -> None:
        """Answer a client's request (``id_``; None: unreadable) with an error, counted."""
        self.counters[f"error:{exc.code}"] += 1
        await client.send(dumps(rpc.error(id_, exc)))

    def not_delivered(
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
        client.offer(dumps(rpc.notification("_acp_bridge/log", params)))


async def answer_of(agent: AgentLink, waiter: Waiter) -> Any:
    """The result of the request ``waiter`` waits for, or its error raised."""
    response = await waiter.wait()
    if "error" in response:
        err = response["error"]
        if isinstance(err, dict) and type(err.get("code")) is int:
            raise JsonRpcError(err["code"], str(err.get("message", "")), err.get("data"))
        raise JsonRpcError(INTERNAL_ERROR, f"agent {agent.name!r} answered an invalid error")
    return response.get("result")


__all__ = ["Hub", "answer_of"]
