"""
What a running bridge reports of itself: the snapshot behind ``/status``, ``/metrics`` and
``_acp_bridge/status``, and the answer of ``/healthz``.

Read from the hub at the moment of asking; :mod:`acp_bridge.faces.status` renders the snapshot
(and stays free of trio, which the hub's links are not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from acp_bridge.config import remote
from acp_bridge.engine.links import AgentState
from acp_bridge.runtime.heap import memory_figures

if TYPE_CHECKING:
    from acp_bridge.engine.approvals import Approvals
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.reverse import Reverse
    from acp_bridge.protocol.jsonrpc import JsonObject


def status(hub: Hub, approvals: Approvals, reverse: Reverse) -> JsonObject:
    """
    Everything ``acp-bridge status`` and ``/metrics`` show: agents, sessions, counters (and
    the permission requests settled so far, by ``decision:source``).
    """
    agents = [
        {
            "name": a.name,
            "state": a.state.value,
            "runsOn": remote.location(a.config),
            "pid": a.pid,
            "starts": a.starts,
            "restarts": max(a.starts - 1, 0),
            "sessions": len(hub.sessions.of_agent(a.name)),
            "queueDepth": a.queue_depth(),
            "pendingRequests": len(a.pending),
            # its own requests waiting on clients, and those refused past the limit
            "requestsInFlight": reverse.requests_waiting(a),
            "requestsRefused": a.requests_refused,
        }
        for a in hub.agents.values()
    ]
    sessions = session_rows(hub)
    clients = [
        {
            "name": c.name,
            "transport": c.transport,
            "queueDepth": c.queue_depth(),
            "pendingRequests": len(c.inflight),
        }
        for c in hub.clients
    ]
    return {
        "defaultAgent": hub.default_agent,
        "agents": agents,
        "sessions": sessions,
        "connections": clients,
        "counters": dict(hub.counters),
        "approvals": dict(approvals.counts),
        "journal": hub.journal.statistics() if hub.journal is not None else None,
        "memory": memory(hub),
    }


def session_rows(hub: Hub) -> list[JsonObject]:
    """One row per session: its agent, state, parent, owner connection, watchers..."""
    return [
        {
            "sessionId": s.bridge_id,
            "agent": s.agent,
            "state": s.state.value,
            # a sub-agent's: the session that spawned it (the tree: docs/subagents.md)
            "parent": s.parent,
            "connection": s.client.name if s.client is not None else None,
            # connections that follow it without owning it (_meta.acp_bridge.watch)
            "watchers": len(s.watchers) if s.watchers is not None else 0,
            "pendingApprovals": len(s.pending_permissions) + len(s.parked),
            "historyLastSeq": s.history.last_seq if s.history is not None else 0,
        }
        for s in hub.sessions
    ]


def tree(hub: Hub) -> JsonObject:
    """What the console's session tree is made of: agents (name, state) and session rows."""
    agents = [{"name": a.name, "state": a.state.value} for a in hub.agents.values()]
    return {"agents": agents, "sessions": session_rows(hub)}


def memory(hub: Hub) -> JsonObject:
    """:func:`memory_figures`, and what the sessions' replay histories hold."""
    histories = [s.history for s in hub.sessions if s.history is not None]
    return {
        **memory_figures(),
        "historyEntries": sum(len(h) for h in histories),
        "historyKiB": sum(h.total_bytes for h in histories) // 1024,
    }


def health(hub: Hub) -> tuple[bool, JsonObject]:
    """Whether the default agent can serve now, and every agent's state (for /healthz)."""
    ok = hub.agents[hub.default_agent].state is AgentState.READY
    agents = {
        a.name: {"state": a.state.value, "pid": a.pid, "starts": a.starts}
        for a in hub.agents.values()
    }
    return ok, {"ok": ok, "defaultAgent": hub.default_agent, "agents": agents}


__all__ = ["health", "memory", "session_rows", "status", "tree"]
