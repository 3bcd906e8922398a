"""
The hub: the state the bridge's services share, and the few things every one of them does
with it (start a task, record a session, open its history).

It decides nothing. The services (``_supervisor``, ``_from_client``, ``_from_agent``, ...)
each hold the hub and the callables they need of one another, given at construction by the
:class:`~acp_bridge._bridge.Bridge` that composes them; none imports another.
"""

from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING, Any

import attrs
import structlog

from acp_bridge._jsonrpc import INTERNAL_ERROR, JsonObject, JsonRpcError
from acp_bridge._routing import History, Session, SessionTable
from acp_bridge._store import SessionRow
from acp_bridge._timers import Deadlines

if TYPE_CHECKING:
    from collections.abc import Callable

    import trio

    from acp_bridge._audit import AuditLog
    from acp_bridge._config import Config
    from acp_bridge._journal import Journal
    from acp_bridge._links import AgentLink, ClientLink, Tracer
    from acp_bridge._redact import Redactor

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
                )
            )

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


__all__ = ["Hub"]
