"""
Sessions from before a restart: the store's sessions come back as STORED at start; a
``session/load`` restores one through its agent (or replays its journal); a stored session,
or an ended one whose id went to a new session, can be closed or deleted without its agent.

The decisions over the session table are pure (``sessions.transitions``); this service does
the waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps, params_of
from acp_bridge.sessions import transitions
from acp_bridge.sessions.table import SessionState, capture_setup
from acp_bridge.store.db import AuditRecord

if TYPE_CHECKING:
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import ClientLink
    from acp_bridge.engine.reattach import Reattach
    from acp_bridge.engine.subagents import Subagents
    from acp_bridge.engine.supervisor import Supervisor
    from acp_bridge.protocol.jsonrpc import JsonObject
    from acp_bridge.sessions.table import Session


class Restore:
    """
    Restore after a restart; stored and reused sessions.

    Args:
        hub: the shared state.
        supervisor: starts a stored session's agent.
        reattach: attaches a restored session, replays a journal, closes a stored session.
        subagents: offer the MCP servers to a load of the bridge's own (its ``offers``).
    """

    def __init__(
        self, hub: Hub, supervisor: Supervisor, reattach: Reattach, subagents: Subagents
    ) -> None:
        self._hub = hub
        self._supervisor = supervisor
        self._reattach = reattach
        self._subagents = subagents

    async def restore_all(self) -> None:
        """
        After a restart: the sessions the store knows come back as STORED (listed, loadable;
        their numbering continues), and approvals that were waiting when the bridge stopped
        are settled by the unattended rule (the agents that asked are gone): audited.
        """
        journal = self._hub.journal
        assert journal is not None
        store = journal.store
        rows = await trio.to_thread.run_sync(store.sessions)
        for row in rows:
            session = transitions.restore_row(self._hub.sessions, row, self._hub.agents)
            if session is None:
                continue
            _, last = await trio.to_thread.run_sync(store.journal_bounds, row.bridge_id)
            self._hub.history(session).continue_from(last)
        leftovers = await trio.to_thread.run_sync(store.pending_approvals)
        for key, sid, agent, _params in leftovers:
            await self._hub.audit.record(
                AuditRecord(
                    session=sid,
                    agent=agent,
                    decision="deny",
                    source="restart",
                    detail="pending when the bridge stopped; the agent that asked is gone",
                )
            )
            journal.pending_removed(key)
        if rows or leftovers:
            self._hub.log.info("restored", sessions=len(self._hub.sessions), settled=len(leftovers))

    async def stored_request(self, client: ClientLink, msg: JsonObject, session: Session) -> None:
        """A session known only from the store (the bridge restarted)."""
        if msg["method"] == "session/load":
            self._hub.spawn(self._restore_session, client, msg, session)
        elif not await self._closed(client, msg, session):
            why = self._hub.unrestorable.get(session.bridge_id)
            raise JsonRpcError.resource_not_found(
                f"session {session.bridge_id!r} cannot continue: {why}"
                if why is not None
                else f"session {session.bridge_id!r} is not live since the bridge restarted: "
                "session/load it first"
            )

    async def reused_request(self, client: ClientLink, msg: JsonObject, session: Session) -> None:
        """An ended session whose agent id went to a new session: it can only be closed."""
        if not await self._closed(client, msg, session):
            raise JsonRpcError.resource_not_found(
                f"session {session.bridge_id!r} ended: agent {session.agent!r} restarted and "
                "gave its id to a new session"
            )

    async def _closed(self, client: ClientLink, msg: JsonObject, session: Session) -> bool:
        """``session/close`` or ``delete`` of a session that cannot go on: done and answered."""
        method: str = msg["method"]
        if method not in ("session/close", "session/delete"):
            return False
        self._reattach.close_session(session, delete=method == "session/delete")
        await client.send(dumps(rpc.result(msg["id"], {})))
        return True

    async def _restore_session(self, client: ClientLink, msg: JsonObject, session: Session) -> None:
        """
        ``session/load`` after a restart: the agent restores the session when it can
        (``loadSession``: its own replay is relayed); otherwise — or when it fails — the load
        fails with -32002 and the reason, unless the client asked for journal replays
        (``_meta.acp_bridge.journal_replay: true``): then it gets the journal's replay and a
        clear statement that the agent cannot continue it (``_meta.acp_bridge.restored:
        false`` with the reason; a prompt then fails with -32002).
        """
        params = params_of(msg)
        agent = self._hub.agents[session.agent]
        reason = f"agent {agent.name!r} does not support session/load"
        try:
            await self._supervisor.ensure_ready(agent)
            if not self._hub.sessions.owns_agent_id(session):
                reason = f"agent {agent.name!r} gave its id to a new session"
            elif agent.capabilities.get("loadSession"):
                self._hub.strip_setup(agent, params)
                query = {**params, "sessionId": session.agent_id}
                query.pop("_meta", None)
                await self._subagents.offers.offer_bound(agent, query, session, client)
                session.state = SessionState.LOADING
                session.client = client
                try:
                    result = await self._hub.internal_request(agent, "session/load", query)
                except JsonRpcError as exc:
                    reason = f"agent {agent.name!r} could not load it: {exc.message}"
                else:
                    session.state = SessionState.ACTIVE
                    capture_setup(session, result)
                    self._hub.persist(session)
                    answer = dict(result) if isinstance(result, dict) else {}
                    answer["_meta"] = {
                        "acp_bridge": {
                            "restored": True,
                            "lastSeq": self._hub.history(session).last_seq,
                        }
                    }
                    await client.send(dumps(rpc.result(msg["id"], answer)))
                    await self._reattach.attach(session, client)
                    return
                finally:
                    if session.state is SessionState.LOADING:
                        session.state = SessionState.STORED
                        session.client = None
        except JsonRpcError as exc:
            reason = f"agent {agent.name!r} is not available: {exc.message}"
        try:
            await self._reattach.replay_journal(client, msg, params, session, reason)
        except JsonRpcError as exc:
            await self._hub.reply_error(client, msg["id"], exc)


__all__ = ["Restore"]
