"""
Sub-agents (docs/subagents.md): the bridge's side of the ``acp-bridge`` MCP
server. :class:`Subagents` is the :class:`~acp_bridge.mcp.tools.SubagentHost` the tools run
on; its :class:`~acp_bridge.engine.offers.Offers` offer the server to every agent session the
bridge opens.

A child is an ordinary bridge session (registered, journalled, listed with its parent), owned
by the connection of the client's session at the top of its tree: its permission requests
pass the one policy and go to that human (on the child's own session for a client that
advertises ``clientCapabilities.subagents``, announced first with a ``subagent_update`` on
its parent; else on the client's session, ``_meta.acp_bridge.child`` naming it). A child's
turn is a ``session/prompt`` of the bridge's own; what it streams is recorded as any session's,
and its agent message text is kept for the parent's tool result. The decisions are pure
(``sessions.tree``); this waits, sends and keeps the turns.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Final

import attrs
import structlog
import trio

from acp_bridge.engine.offers import Offers
from acp_bridge.mcp.tools import AgentInfo, ChildStatus, ToolError
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import has_session_cap
from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError, dumps
from acp_bridge.sessions.table import Session, SessionState, Setup
from acp_bridge.sessions.tree import (
    IDLE,
    RUNNING,
    Child,
    child_cwd,
    may_spawn,
    message_text,
    spawn_refusal,
    subagent_update,
    supports_subagents,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from acp_bridge.engine.approvals import Approvals
    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.engine.from_agent import FromAgent
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.engine.mcp_acp import McpOverAcp
    from acp_bridge.engine.reattach import Reattach
    from acp_bridge.mcp.server import McpEndpoint

logger = structlog.get_logger("acp_bridge.subagents")

#: Seconds a child's ``session/close`` may take before it is given up (logged).
CLOSE_TIMEOUT: Final = 10.0


@attrs.define(eq=False)
class _Turn:
    done: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


class Subagents:
    """
    Children as bridge sessions, driven by their parents' tool calls.

    Args:
        hub: the shared state (its ``tree``: the children).
        from_agent: binds the session a child's ``session/new`` answer names.
        approvals: a child's pending permission requests settled when it is cancelled.
        reattach: a closed child's session forgotten.
        mcp: MCP over ACP (the bridge's own server reached through an agent's pipe, a
            client's re-exported servers), for the :class:`~acp_bridge.engine.offers.Offers`
            this builds.
        bridge: reaches the supervisor, built after this service (it asks this one how to
            launch an ssh agent), to start a child's agent.
    """

    def __init__(
        self,
        hub: Hub,
        from_agent: FromAgent,
        approvals: Approvals,
        reattach: Reattach,
        mcp: McpOverAcp,
        bridge: Bridge,
    ) -> None:
        self._hub = hub
        self._config = hub.config.subagents
        self._from_agent = from_agent
        self._approvals = approvals
        self._reattach = reattach
        self._bridge = bridge
        self.tree = hub.tree
        #: the MCP servers offered to the sessions the bridge opens, and the endpoint
        self.offers = Offers(hub, mcp, self)
        self._turns: dict[str, _Turn] = {}

    @property
    def endpoint(self) -> McpEndpoint:
        """The MCP endpoint (:attr:`Offers.endpoint`)."""
        return self.offers.endpoint

    # ------------------------------------------------------------------ sessions ending

    def removed(self, session: Session) -> None:
        """A session left the table (closed, deleted, expired): its tokens, its children."""
        if (endpoint := self.offers.started) is not None:
            endpoint.revoke_session(session.bridge_id)
        child = self.tree.remove(session.bridge_id)
        if child is not None:
            child.state = "closed"
            turn = self._turns.get(child.id)
            if turn is not None:
                turn.scope.cancel()
        self._close_later(session.bridge_id)

    def agent_gone(self, agent: AgentLink) -> None:
        """An agent exited: its sessions ended, and with them their children."""
        endpoint = self.offers.started
        for session in self._hub.sessions.of_agent(agent.name):
            if endpoint is not None:
                endpoint.revoke_session(session.bridge_id)
            self._close_later(session.bridge_id)

    def _close_later(self, parent: str) -> None:
        if self.tree.of(parent) and not self._hub.stopping:
            self._hub.spawn(self._close_children, parent)

    async def _close_children(self, parent: str) -> None:
        for child in self.tree.of(parent):
            await self._close(child)

    # ------------------------------------------------------------------ what clients see

    def _visible(self, session: Session | None) -> ClientLink | None:
        """The client that sees a child's own session (it advertised ``subagents``)."""
        client: ClientLink | None = session.client if session is not None else None
        if client is None or client.closed or not supports_subagents(client.capabilities):
            return None
        return client

    def _watch(self, child: Child, params: JsonObject) -> bool:
        """Each update of a child's session: its text kept; True: its client sees it."""
        if child.state == RUNNING:
            text = message_text(params.get("update"))
            if text is not None:
                child.add_text(text)
        return self._visible(self._hub.sessions.get(child.id)) is not None

    async def _tell_parent(self, child: Child, update: JsonObject) -> None:
        """
        A ``subagent_update`` on the child's parent: recorded in its history (a replay, a
        watcher, has it), sent to its owner if it asked for them.
        """
        parent = self._hub.sessions.get(child.parent)
        if parent is None:
            return
        data = self._from_agent.record_own_update(parent, update)
        client = self._visible(parent)
        if client is not None:
            await client.send(data)

    # ------------------------------------------------------------------ the tools

    def _live(self, caller: str) -> Session:
        session = self._hub.sessions.get(caller)
        if session is None or session.state is not SessionState.ACTIVE:
            raise ToolError("the calling session has ended")
        return session

    def _owned(self, caller: str, child: str) -> Child:
        self._live(caller)
        found = self.tree.owned(caller, child)
        if found is None:
            raise ToolError(f"no child {child[:256]!r} of this session (closed, or not yours)")
        return found

    async def list_agents(self, caller: str) -> Sequence[AgentInfo]:
        self._live(caller)
        if self.tree.depth(caller) >= self._config.max_depth:
            return []
        return [
            AgentInfo(name, agent.state.value)
            for name, agent in self._hub.agents.items()
            if may_spawn(name, self._config.agents)
        ]

    async def spawn(
        self, caller: str, agent: str, prompt: str, cwd: str | None, wait: bool
    ) -> ChildStatus:
        parent = self._live(caller)
        depth = self.tree.depth(caller)
        refusal = spawn_refusal(
            self._config,
            parent_depth=depth,
            open_children=len(self.tree.of(caller)),
            agent=agent,
            agents=list(self._hub.agents),
        )
        if refusal is not None:
            raise ToolError(refusal)
        try:
            where = child_cwd(cwd, parent.roots)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        link = self._hub.agents[agent]
        with trio.CancelScope(shield=True):
            # (Shielded, bounded: a session the agent opened is never left unknown.)
            with trio.move_on_after(link.config.start_timeout) as bound:
                session = await self._new_session(parent, link, where, depth + 1)
        if bound.cancelled_caught:
            raise ToolError(f"agent {agent!r} did not open a session in time")
        child = Child(session.bridge_id, caller, agent, depth + 1, where)
        self.tree.add(child)
        session.watch = functools.partial(self._watch, child)
        await self._tell_parent(child, subagent_update(child, prompt=prompt))
        logger.info("subagent_spawned", parent=caller, child=child.id, agent=agent)
        return await self._turn(child, session, prompt, wait)

    async def _new_session(
        self, parent: Session, agent: AgentLink, cwd: str, depth: int
    ) -> Session:
        try:
            await self._bridge.supervisor.ensure_ready(agent)
        except JsonRpcError as exc:
            raise ToolError(f"agent {agent.name!r} is not available: {exc.message}") from None
        params: JsonObject = {"cwd": cwd, "mcpServers": []}
        offer = await self.offers.offer_child(agent, params, depth)
        agent.new_in_flight += 1
        try:
            result = await self._hub.internal_request(agent, "session/new", params)
        except JsonRpcError as exc:
            self.offers.withdraw(offer)
            raise ToolError(f"agent {agent.name!r} refused session/new: {exc.message}") from None
        finally:
            agent.new_in_flight = max(0, agent.new_in_flight - 1)
        sid = result.get("sessionId") if isinstance(result, dict) else None
        live = self._hub.sessions.find(agent.name, sid) if isinstance(sid, str) else None
        if not isinstance(sid, str) or (
            live is not None and live.state in (SessionState.ACTIVE, SessionState.LOADING)
        ):
            self.offers.withdraw(offer)
            raise ToolError(f"agent {agent.name!r} answered session/new without a new session")
        assert isinstance(result, dict)
        session, early = self._from_agent.open_session(
            agent, result, parent.client, Setup((cwd,), parent.unattended), parent=parent.bridge_id
        )
        self.offers.bind(offer, session, replace=False)
        if early:
            logger.info("subagent_early_updates", child=session.bridge_id, count=len(early))
        return session

    async def prompt(self, caller: str, child: str, prompt: str, wait: bool) -> ChildStatus:
        found = self._owned(caller, child)
        if found.state == RUNNING:
            raise ToolError(f"child {child!r} is still running its turn (see wait_agents)")
        session = self._hub.sessions.get(found.id)
        if found.state != IDLE or session is None or session.state is not SessionState.ACTIVE:
            raise ToolError(f"child {child!r} has ended: {found.error or 'its session is gone'}")
        return await self._turn(found, session, prompt, wait)

    async def _turn(self, child: Child, session: Session, prompt: str, wait: bool) -> ChildStatus:
        """Start a turn of ``child`` (a task of the bridge's); with ``wait``, its end."""
        child.start_turn()
        turn = _Turn()
        self._turns[child.id] = turn
        self._hub.remember_prompt(session, prompt)
        await self._tell_parent(child, subagent_update(child, state=RUNNING))
        self._hub.spawn(self._run_turn, child, session, prompt, turn)
        if not wait:
            return child.status()
        await turn.done.wait()
        if child.error is not None:
            raise ToolError(f"child {child.id!r} ({child.agent}): {child.error}")
        return child.status()

    async def _run_turn(self, child: Child, session: Session, prompt: str, turn: _Turn) -> None:
        agent = self._hub.agents[child.agent]
        params = {"sessionId": session.agent_id, "prompt": [{"type": "text", "text": prompt}]}
        try:
            with turn.scope:
                try:
                    result = await self._hub.internal_request(agent, "session/prompt", params)
                except JsonRpcError as exc:
                    child.end_turn(None, exc.message)
                else:
                    stop = result.get("stopReason") if isinstance(result, dict) else None
                    child.end_turn(stop if isinstance(stop, str) else None)
            if turn.scope.cancelled_caught:
                # Its agent did not end a cancelled turn in time, or the child was closed.
                child.end_turn("cancelled")
        finally:
            if self._turns.get(child.id) is turn:
                del self._turns[child.id]
            turn.done.set()
        await self._tell_parent(child, subagent_update(child, state=IDLE))

    async def wait(
        self, caller: str, children: Sequence[str] | None, timeout_ms: int | None
    ) -> Sequence[ChildStatus]:
        if children is None:
            self._live(caller)
            found = self.tree.of(caller)
        else:
            found = [self._owned(caller, c) for c in children]
        turns = [self._turns[c.id] for c in found if c.id in self._turns]
        if found and len(turns) == len(found):  # all running: wait for the first to end
            seconds = math.inf if timeout_ms is None else timeout_ms / 1000
            with trio.move_on_after(seconds):
                async with trio.open_nursery() as nursery:
                    for turn in turns:
                        nursery.start_soon(_first, turn.done, nursery.cancel_scope)
        return [c.status() for c in found]

    async def cancel(self, caller: str, child: str) -> ChildStatus:
        found = self._owned(caller, child)
        await self._cancel([*self.tree.descendants(found.id), found])
        return found.status()

    async def close(self, caller: str, child: str) -> ChildStatus:
        found = self._owned(caller, child)
        await self._close(found)
        return found.status()

    # ------------------------------------------------------------------ cancel and close

    def cascade(self, session: Session) -> None:
        """
        The client cancelled ``session``'s turn: every running child under it is cancelled
        now (its permission requests settled ``cancelled``, ``session/cancel`` sent), so the
        parent's tool calls are answered with the children's ``cancelled`` turns; the cancel
        grace is enforced in a task (the client's reader never waits here).
        """
        running = [c for c in self.tree.descendants(session.bridge_id) if c.id in self._turns]
        if running and not self._hub.stopping:
            self._hub.spawn(self._cancel, running)

    async def _cancel(self, children: Sequence[Child]) -> None:
        """Cancel the children's turns at once; wait for them (``cancel_grace`` at most)."""
        turns = []
        for child in children:
            turn = self._turns.get(child.id)
            session = self._hub.sessions.get(child.id)
            if turn is None or session is None:
                continue
            turns.append(turn)
            agent = self._hub.agents[session.agent]
            agent.send_nowait(
                dumps(rpc.notification("session/cancel", {"sessionId": session.agent_id}))
            )
            await self._approvals.settle_session(session, "cancel")
        grace = self._hub.config.bridge.cancel_grace
        for turn in turns:
            with trio.move_on_after(grace if grace > 0 else math.inf):
                await turn.done.wait()
            turn.scope.cancel()  # (a no-op once it ended)
            await turn.done.wait()

    async def _close(self, child: Child) -> None:
        """Close ``child`` and everything under it (deepest first); its agent told."""
        for one in [*self.tree.descendants(child.id), child]:
            if one.id in self._turns:
                await self._cancel([one])
            self.tree.remove(one.id)
            one.state = "closed"
            self.endpoint.revoke_session(one.id)
            session = self._hub.sessions.get(one.id)
            if session is None:
                continue
            owned = self._hub.sessions.owns_agent_id(session)
            self._hub.sessions.remove(session)
            self._reattach.forget(session)
            agent = self._hub.agents[session.agent]
            if owned and session.state is SessionState.ACTIVE:
                await self._close_at_agent(agent, session.agent_id)
            logger.info("subagent_closed", parent=one.parent, child=one.id)

    async def _close_at_agent(self, agent: AgentLink, agent_sid: str) -> None:
        if not has_session_cap(agent.capabilities, "close"):
            agent.send_nowait(dumps(rpc.notification("session/cancel", {"sessionId": agent_sid})))
            return
        with trio.move_on_after(CLOSE_TIMEOUT):
            try:
                await self._hub.internal_request(agent, "session/close", {"sessionId": agent_sid})
            except JsonRpcError as exc:
                logger.warning("subagent_close_failed", agent=agent.name, error=exc.message)


async def _first(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


__all__ = ["CLOSE_TIMEOUT", "Subagents"]
