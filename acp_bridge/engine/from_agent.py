"""
From the agents: each agent's stdout read and routed to the clients.

The reader and the hot path live in :mod:`acp_bridge.engine.relay` (runs of plain updates
relayed as slices, other updates without a coroutine). Every other line goes through
:meth:`FromAgent.line`: updates that must wait for room or be held, notifications, answers to
requests the bridge forwarded (and the session bookkeeping they end:
:meth:`FromAgent.undo_forward`), and the agent's own requests (handed to ``engine.reverse``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import structlog

from acp_bridge.engine.links import AgentLink, ClientLink, Waiter
from acp_bridge.engine.relay import Relay
from acp_bridge.mcp.acp import MCP_MESSAGE
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.framing import Oversize
from acp_bridge.protocol.jsonrpc import (
    INTERNAL_ERROR,
    JsonObject,
    JsonRpcError,
    Kind,
    classify,
    dumps,
    loads,
    params_of,
)
from acp_bridge.protocol.notices import is_notice, setup_notice, wants_notices
from acp_bridge.protocol.wire import id_of, is_id, well_formed_error
from acp_bridge.sessions.table import (
    Forwarded,
    Session,
    SessionState,
    SessionTable,
    Setup,
    capture_setup,
)
from acp_bridge.sessions.topic import Topic

if TYPE_CHECKING:
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.log_channel import LogChannel
    from acp_bridge.engine.mcp_acp import McpOverAcp
    from acp_bridge.engine.reattach import Reattach
    from acp_bridge.engine.reverse import Reverse

logger = structlog.get_logger("acp_bridge.bridge")  # (the hub's: one logger for routing)

#: updates held for a session id the bridge does not know yet (agent sent them before its
#: session/new response); beyond this they are dropped
EARLY_UPDATES_MAX: Final = 64


class FromAgent:
    """
    What the agents send: relayed, answered or handed on.

    Args:
        hub: the shared state.
        logs: a diagnostic about an agent to its clients (a stray line on its stdout).
        reverse: an agent's own requests of a client, and its other notifications.
        reattach: the sessions a forwarded request binds, closes or hands to a new owner.
        mcp: an agent's ``mcp/message`` requests and their withdrawals (MCP over ACP).
    """

    def __init__(
        self, hub: Hub, logs: LogChannel, reverse: Reverse, reattach: Reattach, mcp: McpOverAcp
    ) -> None:
        self._hub = hub
        self._sessions = hub.sessions
        self._counters = hub.counters
        self._tracer = hub.tracer
        self._config = hub.config
        self._logs = logs
        self._reverse = reverse
        self._reattach = reattach
        self._mcp = mcp
        #: a forwarded ``session/new``, ``load``, ``resume`` or ``fork`` ended: its entry
        #: (``extra``: what the sub-agents offered the agent in it), its session (None: failed)
        self.opened: Topic[[Forwarded, Session | None]] = Topic()
        self._relay = Relay(hub, self)
        #: one life of an agent's stdout read until EOF (:meth:`Relay.reader`)
        self.reader = self._relay.reader

    def record_own_update(self, session: Session, update: JsonObject) -> bytes:
        """
        An update of the bridge's own on ``session`` (a ``subagent_update``): recorded like
        an agent's (history, journal, watchers), so a replay has it; the bytes for its owner.
        """
        self._hub.history(session)
        params: JsonObject = {"sessionId": session.bridge_id, "update": update}
        msg = rpc.notification("session/update", params)
        # (Already the bridge's id: a rewrite, if the session has them, re-encodes the same.)
        data = self._relay.record_update(session, msg, params, dumps(msg)[:-1])
        client = session.client
        return dumps(msg) if client is not None and client.want_seq else data

    async def line(self, agent: AgentLink, line: bytes | Oversize) -> None:
        """Any line of an agent's that the relay (:meth:`Relay.relay_update`) did not take."""
        self._counters["from_agent"] += 1
        if self._tracer is not None and isinstance(line, bytes):
            self._tracer(f"agent:{agent.name}", "in", line)
        if isinstance(line, Oversize):
            agent.log.warning("agent_line_oversize", size=line.size)
            cap = self._config.bridge.max_line_bytes
            agent.fail(f"it sent a line of {line.size} bytes, over max_line_bytes ({cap})")
            return
        try:
            msg = loads(line)
        except JsonRpcError:
            # A stray line (a shell profile, a print): a diagnostic, not a dead session.
            await self._logs.agent_log(
                agent, "warning", line[:65536].decode("utf-8", "replace"), stream="stdout"
            )
            return
        kind = classify(msg)
        if kind is Kind.NOTIFICATION:
            method = msg["method"]
            if method == "session/update":
                await self._agent_update(agent, msg, line)
            elif not (method == "$/cancel_request" and self._mcp_withdrew(agent, msg)):
                await self._reverse.agent_notification(agent, msg)
        elif kind is Kind.RESPONSE:
            await self.agent_response(agent, msg)
        elif kind is Kind.REQUEST:
            if msg["method"] == MCP_MESSAGE:
                await self._mcp.agent_request(agent, msg)
            else:
                await self._reverse.agent_request(agent, msg)
        else:
            agent.log.warning("agent_invalid_message")
            req_id = id_of(msg)
            if req_id is not None:
                agent.answer(dumps(rpc.error(req_id, JsonRpcError.invalid_request())))

    def _mcp_withdrew(self, agent: AgentLink, msg: JsonObject) -> bool:
        """The agent's ``$/cancel_request`` named an ``mcp/message`` of its (now withdrawn)."""
        request_id = params_of(msg).get("requestId")
        return is_id(request_id) and self._mcp.agent_withdrew(agent, request_id)

    async def _agent_update(self, agent: AgentLink, msg: JsonObject, line: bytes) -> None:
        """A session/update the relay left: maybe held, maybe waiting for room."""
        params = msg.get("params")
        sid = params.get("sessionId") if type(params) is dict else None
        session = self._sessions.find(agent.name, sid) if type(sid) is str else None
        if session is None:
            held = len(agent.early_updates)
            if agent.new_in_flight and type(sid) is str and held < EARLY_UPDATES_MAX:
                agent.early_updates.append((sid, line))
                return
            agent.log.warning("update_for_unknown_session", session=sid)
            return
        assert type(params) is dict
        if is_notice(params.get("update")):
            self._relay.relay_notice(agent, session, msg, params, line)
            return
        data = self._relay.record_update(session, msg, params, line)
        client = session.client
        if client is None or (session.watch is not None and not session.watch(params)):
            return
        if client.want_seq:
            data = dumps(msg)
        await client.send(data)

    async def agent_response(self, agent: AgentLink, msg: JsonObject) -> None:
        """An agent's answer: to whoever waits on it, under the id it was asked with."""
        entry = agent.pending.pop(msg["id"])
        if entry is None:
            agent.log.warning("agent_response_unmatched", id=msg["id"])
            return
        if isinstance(entry, Waiter):
            entry.set(msg)
            return
        client = entry.origin
        assert isinstance(client, ClientLink)
        client.done(entry.origin_id)
        ok = "result" in msg
        if ok and entry.method in ("session/new", "session/fork"):
            refused = live_id_reused(self._sessions, agent, msg["result"])
            if refused is not None:
                msg = rpc.error(msg["id"], refused)
                ok = False
        early = self.undo_forward(agent, entry, ok=ok, result=msg.get("result"))
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
            if not self._hub.hold_answer(session, entry.origin_id, dumps(msg)):
                session.log.warning("held_response_dropped")
            return
        for line in early:
            await client.send(line)
        if session is None:
            await client.send(dumps(msg))
        else:
            await client.send_answer(dumps(msg), session)
        if ok and entry.stripped:
            self._setup_stripped(agent, entry, msg["result"])
        if (
            ok
            and entry.method in ("session/load", "session/resume")
            and session is not None
            and session.client is client
            and not client.closed
        ):
            # A load or resume the agent served: what waited on a dead connection is shown
            # to the new owner after the answer, as after one the bridge serves (attach).
            await self._reattach.present_parked(session, client)

    def _setup_stripped(self, agent: AgentLink, entry: Forwarded, result: Any) -> None:
        """
        A session opened (new, fork) or taken up (load, resume) without what of its setup the
        agent could not take: its client is told, after the answer (a new session's id is not
        known before).
        """
        session = entry.session
        if entry.method in ("session/new", "session/fork"):
            sid = result.get("sessionId") if isinstance(result, dict) else None
            session = self._sessions.get(sid) if isinstance(sid, str) else None
        if session is not None:
            self._logs.notice(session, setup_notice(agent.name, entry.stripped))

    def open_session(
        self,
        agent: AgentLink,
        result: JsonObject,
        client: ClientLink,
        setup: Setup | None,
        *,
        parent: str | None = None,
    ) -> tuple[Session, list[bytes]]:
        """
        A ``session/new`` (or fork) answer binds its session (``result`` names it; its id is
        rewritten there if the bridge gave it another): registered, owned by ``client``,
        recorded. Returns it with the updates the agent sent for it before the answer.
        """
        new = bind_new_session(self._hub, agent, result, client, setup, parent=parent)
        return new, take_early_updates(agent, new)

    def undo_forward(
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
                setup = entry.context if isinstance(entry.context, Setup) else None
                new, early = self.open_session(agent, result, client, setup)
                if client.closed:
                    # Its connection died before the answer came: nobody knows the session
                    # yet; it expires like any detached one unless someone takes it.
                    self._reattach.schedule_detach(new)
                self.opened.publish(entry, new)
            else:
                self.opened.publish(entry, None)
        elif method == "session/load" and session is not None:
            self.opened.publish(entry, session if ok else None)
            if ok:
                if client.closed:  # (gone meanwhile: detached, its grace runs on)
                    session.state, session.client = SessionState.ACTIVE, client
                else:
                    # The loader owns it as after a take-back the bridge serves: answers to
                    # requests a dead connection left out at the agent come to it, and the
                    # grace ends. (Nobody else can own it: the load was refused then.)
                    self._reattach.take_ownership(session, client)
                capture_setup(session, result)
                self._hub.persist(session)
                early = self._reattach.take_held(session, float("inf"))  # answered while away
            elif isinstance(entry.context, tuple) and entry.context[0] is not SessionState.LOADING:
                session.state, session.client = entry.context
            else:
                # A load of an id the bridge did not know: nothing to go back to.
                self._sessions.remove(session)
        elif method == "session/resume" and session is not None:
            self.opened.publish(entry, session if ok else None)
            if ok:
                if client.closed:  # (as for a load)
                    session.state, session.client = SessionState.ACTIVE, client
                else:
                    self._reattach.take_ownership(session, client)
                self._hub.history(session)
                capture_setup(session, result)
                self._hub.persist(session)
                early = self._reattach.take_held(session, float("inf"))  # answered while away
            elif session.state is SessionState.LOADING:
                self._sessions.remove(session)
        elif method == "session/set_config_option" and session is not None and ok:
            capture_setup(session, result)
        elif method in ("session/close", "session/delete") and session is not None and ok:
            self._reattach.close_session(session, delete=method == "session/delete")
        elif method == "session/archive" and session is not None and ok:
            # The agent closed it (the spec: as session/close would) but keeps it: the bridge
            # keeps its id routable (unarchive, load) like a listed session, attached to none.
            self._reattach.forget(session)
            session.state = SessionState.LISTED
            session.client = None
        return early


def live_id_reused(sessions: SessionTable, agent: AgentLink, result: Any) -> JsonRpcError | None:
    """
    The error for a new session the agent answered with the id of one of its sessions
    that is live (a client's, or being loaded): merging them would hand the first client's
    session, its roots and its permission requests to the second. The agent's own session
    is left alone (it is the first client's); the new one is refused.
    """
    sid = result.get("sessionId") if isinstance(result, dict) else None
    if not isinstance(sid, str):
        return None
    live = sessions.find(agent.name, sid)
    if live is None or live.state not in (SessionState.ACTIVE, SessionState.LOADING):
        return None
    agent.log.warning("agent_reused_live_session_id", agent_session=sid)
    return JsonRpcError(
        INTERNAL_ERROR,
        f"agent {agent.name!r} answered with the id of a session that is already open "
        f"({sid!r}): the new session is refused",
        {"agent": agent.name, "sessionId": sid},
    )


def take_early_updates(agent: AgentLink, session: Session) -> list[bytes]:
    """Updates the agent sent for a new session before its answer, as the client gets them."""
    if not agent.early_updates:
        return []
    mine = [line for sid, line in agent.early_updates if sid == session.agent_id]
    agent.early_updates = [(s, ln) for s, ln in agent.early_updates if s != session.agent_id]
    if not agent.new_in_flight:
        agent.early_updates.clear()
    client = session.client
    notices = client is not None and wants_notices(client.capabilities)
    out = []
    for line in mine:
        if not notices and b"notice" in line and is_notice(loads(line)["params"].get("update")):
            continue  # (a client that does not take notices gets none)
        if session.rewrite:
            msg = loads(line)
            msg["params"]["sessionId"] = session.bridge_id
            out.append(dumps(msg))
        else:
            out.append(line + b"\n")
    return out


def bind_new_session(
    hub: Hub,
    agent: AgentLink,
    result: JsonObject,
    client: ClientLink,
    setup: Setup | None,
    *,
    parent: str | None = None,
) -> Session:
    """
    A ``session/new`` (or ``fork``) answered with a session id: the new session, registered
    and owned by ``client`` (the agent's id kept unless another live session has it, then
    rewritten in ``result``), with the setup it asked for, recorded.
    """
    sid = result["sessionId"]
    stale = hub.sessions.find(agent.name, sid)
    if stale is not None and stale.state in (SessionState.ENDED, SessionState.STORED):
        # A restarted agent minted the id a session of its earlier life had: the
        # new session is another one (its own history and journal).
        hub.sessions.release_agent_id(stale)
    holder = hub.sessions.get(sid)
    if (
        holder is not None
        and holder.state is SessionState.STORED
        and (holder.agent, holder.agent_id) == (agent.name, sid)
    ):
        # Stored (the bridge restarted), not live: it does not keep the new session
        # from the agent's own id. (A stored session of another agent does: its
        # agent may still restore it under that id.)
        displace(hub, holder)
    new = hub.sessions.register(agent.name, sid, client=client)
    new.client = client
    new.state = SessionState.ACTIVE
    new.parent = parent
    if setup is not None:
        new.roots = setup.roots
        new.unattended = setup.unattended
    hub.history(new)
    capture_setup(new, result)
    hub.persist(new)
    if new.rewrite:
        result["sessionId"] = new.bridge_id
    return new


def displace(hub: Hub, session: Session) -> None:
    """
    A stored session (from before a restart) whose agent gave its id to a new session:
    the new session takes the bridge id (its client sees the agent's id unchanged), the
    stored one moves to an id of its own, with its journal (still listed, still loadable
    with a journal replay).
    """
    old = session.bridge_id
    new = hub.sessions.displace(session)
    why = hub.unrestorable.pop(old, None)
    if why is not None:
        hub.unrestorable[new] = why
    if hub.journal is not None:
        hub.journal.rename(old, new)
        if session.history is not None:
            hub.journal.follow(new, session.history)
    hub.log.info("stored_session_moved", session=old, to=new, agent=session.agent)


__all__ = ["EARLY_UPDATES_MAX", "FromAgent"]
