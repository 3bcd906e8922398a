"""
Sessions coming and going: a client connection ends and its sessions detach; a detached
session expires or is taken back (``session/load`` / ``session/resume`` replayed from the
bridge's history, or from the journal after a restart); a session is forgotten.

The decisions over the session table are pure (``sessions.transitions``); this service runs them and
does the sending, the waiting and the timers.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import trio

from acp_bridge.engine.approvals import Ask, park
from acp_bridge.engine.links import AgentLink, AgentState
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import has_session_cap
from acp_bridge.protocol.jsonrpc import RESOURCE_NOT_FOUND, JsonRpcError, dumps
from acp_bridge.protocol.wire import bridge_meta
from acp_bridge.sessions import transitions
from acp_bridge.sessions.tree import SUBAGENT_UPDATE, supports_subagents

if TYPE_CHECKING:
    from acp_bridge.engine.approvals import Approvals
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import ClientLink
    from acp_bridge.engine.log_channel import LogChannel
    from acp_bridge.engine.reverse import Reverse
    from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcId
    from acp_bridge.sessions.table import Forwarded, Session

#: a ``subagent_update`` as the bridge records it (compact: its own encoding)
_SUBAGENT_UPDATE = b'"sessionUpdate":"' + SUBAGENT_UPDATE.encode() + b'"'


class Reattach:
    """
    Detach, expire, forget; attach, take over, reattach with replay.

    Args:
        hub: the shared state.
        logs: the ``_acp_bridge/log`` channel (about an agent; to one client).
        reverse: answers an agent's request nobody can answer (a permission denied through
            the rules, anything else an error).
        approvals: shows a parked permission request again; forgets a connection's answers.
    """

    def __init__(self, hub: Hub, logs: LogChannel, reverse: Reverse, approvals: Approvals) -> None:
        self._hub = hub
        self._logs = logs
        self._reverse = reverse
        self._approvals = approvals

    # ------------------------------------------------------------------ letting go

    async def close_client(self, client: ClientLink, reason: str) -> None:
        """
        The client is gone: its sessions detach for ``detach_grace`` seconds.

        Agents keep working; what they relay is kept in each session's history. Requests the
        agents had made of this client are parked and shown again to the connection that
        takes the session back, or answered as unattended when the grace period ends.
        """
        client.close(reason)
        self._hub.clients.discard(client)
        for client_id, entry in client.pending.drain():
            agent = entry.origin
            assert isinstance(agent, AgentLink)
            if self._approvals.watcher_gone(client, client_id, entry):
                if agent.inflight.get(entry.origin_id) == (client, client_id):
                    del agent.inflight[entry.origin_id]
                continue  # (still waits on the owner, or on the other watchers)
            agent.inflight.pop(entry.origin_id, None)
            if entry.session is not None and entry.session.client is client:
                park(entry, client)
            else:
                await self._reverse.answer_unattended(entry, "client_gone")
        # The client's own requests stay out at the agents: their answers go to whoever
        # takes the session back (same ids: what the attach shim relies on), else nowhere.
        client.inflight.clear()
        for session in self._hub.sessions:
            if session.watchers is not None and transitions.drop_watcher(session, client):
                await self._unwatched(session)
            if session.client is client:
                await self.detach(session)
        self._approvals.forget_client(client)

    async def detach(self, session: Session) -> None:
        if self._hub.config.bridge.detach_grace <= 0:
            transitions.let_go(session, None)
            await self._expire(session)
            return
        self.schedule_detach(session)

    def schedule_detach(self, session: Session) -> None:
        """Nobody owns the session now: it lives ``detach_grace`` seconds more, unless taken."""
        transitions.let_go(session, None)
        session.log.info("session_detached", grace=self._hub.config.bridge.detach_grace)
        self._start_grace(session)

    def _start_grace(self, session: Session) -> None:
        """The session's grace runs from now (again, if it was running): ``_expire`` at its end."""
        when = trio.current_time() + max(self._hub.config.bridge.detach_grace, 0.0)
        session.detach_deadline = when
        self._hub.deadlines.schedule(
            ("detach", session), when, functools.partial(self._expire, session)
        )

    async def _unwatched(self, session: Session) -> None:
        """
        A watcher of ``session`` went away. If that leaves it with neither owner nor watcher,
        it closes ``detach_grace`` from now (its grace starts, or starts over: a watched
        session's deadline only comes round again), and so do its children, which live with
        it.
        """
        sessions = self._hub.sessions
        if session.client is not None or transitions.watched(session, sessions):
            return
        children = self._hub.tree.descendants(session.bridge_id)
        for one in [session, *(sessions.get(child.id) for child in children)]:
            if one is None or one.client is not None or sessions.get(one.bridge_id) is not one:
                continue  # (a child's owner is its root's; one closed meanwhile)
            if self._hub.config.bridge.detach_grace > 0:
                self._start_grace(one)
            else:
                await self._expire(one)

    async def _expire(self, session: Session) -> None:
        """
        Nobody took the session back in time: what waits on it is settled, and it closes.
        Unless a live connection still watches it (or its tree's root): then it stays open,
        a permission request shown to a watcher that approves still waits (it is attended),
        and this comes again after another ``detach_grace``.
        """
        session.detach_deadline = None
        sessions = self._hub.sessions
        agent = self._hub.agents[session.agent]
        watched = transitions.watched(session, sessions)
        for entry in list(session.parked):
            if watched and _shown_to_a_watcher(entry):
                continue
            if entry in session.parked:  # (not settled meanwhile)
                session.parked.remove(entry)
                await self._reverse.answer_unattended(entry, "grace")
        if sessions.get(session.bridge_id) is not session or session.client is not None:
            return  # closed, or taken back, while what waited was settled
        if transitions.watched(session, sessions):
            if self._hub.config.bridge.detach_grace > 0:
                self._start_grace(session)
            session.log.info("session_kept_for_watchers")
            return
        ours = sessions.owns_agent_id(session)  # (not if its id went to a new session)
        self.close_session(session)
        session.log.info("session_closed_after_grace")
        await self._logs.agent_log(
            agent, "info", f"session {session.bridge_id} closed: nobody took it back", stream=None
        )
        if agent.state is AgentState.READY and ours and not self._hub.stopping:
            # (Stopping: the agents go with the bridge; nothing more is started.)
            if has_session_cap(agent.capabilities, "close"):
                self._hub.spawn(self._close_quietly, agent, session.agent_id)
            else:
                agent.send_nowait(
                    dumps(rpc.notification("session/cancel", {"sessionId": session.agent_id}))
                )

    async def _close_quietly(self, agent: AgentLink, agent_sid: str) -> None:
        try:
            await self._hub.internal_request(agent, "session/close", {"sessionId": agent_sid})
        except JsonRpcError as exc:
            self._hub.log.warning("session_close_failed", agent=agent.name, error=exc.message)

    def close_session(self, session: Session, *, delete: bool = False) -> None:
        """A session ends here: out of the table, then :meth:`forget` (closed, or deleted)."""
        self._hub.sessions.remove(session)
        self.forget(session, delete=delete)

    def kept_moved(self, old: str, new: str) -> None:
        """
        A session only the store has (closed, or not loaded back) gave its id to a new one:
        its row and journal move to ``new``, ahead of anything else of the journal's next
        commit (nothing of the new session mixes in).
        """
        # (A closed session's history gets nothing more: nothing would spill under ``old``.)
        if self._hub.journal is not None:
            self._hub.journal.rename(old, new)
        self._hub.log.info("kept_session_moved", session=old, to=new)

    def forget(self, session: Session, *, delete: bool = False) -> None:
        """A closed session: marked closed in the store (its journal kept); deleted: gone."""
        # (A grace period that was running must not close it a second time; its cancel
        # deadline is left to answer prompts the agent may still hold.)
        self._hub.deadlines.cancel(("detach", session))
        journal = self._hub.journal
        if journal is not None:
            if delete:
                journal.delete(session.bridge_id)
            else:
                self._hub.persist(session, "closed")
                # Kept for sessions export: a new session given its id must not write over it.
                self._hub.sessions.keep(session.bridge_id, session.agent, session.agent_id)

    # ------------------------------------------------------------------ taking back

    def take_ownership(self, session: Session, client: ClientLink) -> transitions.Takeover:
        """
        Make ``client`` the session's owner (synchronous: nothing may slip in between); see
        :func:`~acp_bridge.sessions.transitions.take_ownership`. The agent requests a taken-over
        owner was shown are parked for the new one (no longer in flight to the old one: one
        the agent withdraws meanwhile is found parked); the caller withdraws them from it.
        """
        self._hub.deadlines.cancel(("detach", session))
        agent = self._hub.agents[session.agent]
        takeover = transitions.take_ownership(session, client, agent, agent.pending)
        previous = takeover.previous
        for client_id, shown in takeover.shown:
            park(shown, previous)
            origin = shown.origin
            if isinstance(origin, AgentLink) and origin.inflight.get(shown.origin_id) == (
                previous,
                client_id,
            ):
                del origin.inflight[shown.origin_id]
        return takeover

    #: answers held while nobody was attached, up to a history position (pure)
    take_held = staticmethod(transitions.take_held)

    async def present_parked(self, session: Session, client: ClientLink) -> None:
        """Show the new owner the agent requests that were waiting on the old one."""
        for entry in transitions.take_parked(session, client.pending):
            if isinstance(entry.extra, Ask):
                if client not in entry.extra.shown:  # (a watcher that approved has it)
                    await self._approvals.show(entry, client)
                continue
            agent = entry.origin
            assert isinstance(agent, AgentLink)
            client_id = client.pending.add(entry)
            agent.inflight[entry.origin_id] = (client, client_id)
            if entry.method == "session/request_permission":
                session.pending_permissions.add(client_id)
            # (A child's, to a client without ``subagents``: on its tree's root.)
            params = self._hub.tree.present(session.bridge_id, client.capabilities, entry.context)
            await client.send(dumps(rpc.request(client_id, entry.method, params)))

    async def attach(self, session: Session, client: ClientLink) -> None:
        """
        ``client`` owns ``session`` now: a previous owner is told, what waited is sent. Its
        children (every descendant, docs/subagents.md) move with it: what their agents asked
        of the previous owner is withdrawn from it and shown to ``client``.
        """
        await self._attach_one(session, client, tell=True)
        for child in self._hub.tree.descendants(session.bridge_id):
            found = self._hub.sessions.get(child.id)
            if found is not None and found.client is not client:
                await self._attach_one(found, client, tell=False)

    async def _attach_one(self, session: Session, client: ClientLink, *, tell: bool) -> None:
        takeover = self.take_ownership(session, client)
        previous: ClientLink | None = takeover.previous
        if previous is not None:
            session.log.info("session_taken_over")
            gone = JsonRpcError.cancelled("session taken over by another connection")
            for origin_id in takeover.moved:
                await previous.send(dumps(rpc.error(origin_id, gone)))
            # What the agent asked of it goes to the new owner: withdrawn from this one (its
            # dialogs close), as a request settled elsewhere is.
            for client_id, shown in takeover.shown:
                await self._approvals.withdraw(shown, previous, client_id)
            if tell:
                await self._logs.send_log(
                    previous,
                    "warning",
                    "session taken over by another connection; this one no longer receives it",
                    session=session,
                )
        for data in transitions.take_held(session, float("inf")):
            await client.send(data)
        await self.present_parked(session, client)

    async def watch(
        self, client: ClientLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> None:
        """
        ``session/load`` / ``session/resume`` with ``_meta.acp_bridge.watch``: ``client``
        follows the session without owning it (replayed as a load is, ``after_seq``
        honoured), then gets its updates live; the owner keeps it.

        Raises:
            JsonRpcError: the owner itself, or one watcher more than ``max_watchers``.
        """
        refusal = transitions.watch_refusal(session, client, self._hub.config.bridge.max_watchers)
        if refusal is not None:
            raise JsonRpcError.invalid_request(refusal)
        # (Watching again: not live while the replay runs, or it would get updates twice.)
        transitions.drop_watcher(session, client)
        approve = bridge_meta(params).get("approve") is True
        await self.reattach(client, msg, params, session, watch=approve)

    async def reattach(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        *,
        watch: bool | None = None,
    ) -> None:
        """
        ``session/load`` / ``session/resume`` of a live session, served by the bridge.

        load replays the session's history, then answers; with
        ``_meta.acp_bridge.after_seq: N`` it replays only what the live stream carried after
        update N (a catch-up: not the user's own prompts; a watcher's has them). resume
        answers at once. Either way the client becomes the owner, agent requests waiting on
        a previous connection are shown to it, and the answer's ``_meta.acp_bridge`` says
        ``lastSeq``, whether the replay is ``complete``, and which of the client's requests
        (``pending``: ids) are still to be answered on this connection.

        ``watch`` (not None: whether it approves too): the client becomes a watcher instead
        (:meth:`watch`); the owner's held answers and owed requests stay the owner's.
        """
        watching = watch is not None
        if not watching:
            # (A watcher taking the session over is its owner from now on.)
            transitions.drop_watcher(session, client)
        load = msg["method"] == "session/load"
        requested = bridge_meta(params).get("after_seq") if load else None
        if requested is not None and (type(requested) is not int or requested < 0):
            raise JsonRpcError.invalid_params("_meta.acp_bridge.after_seq: expected an int")
        # A catch-up skips the user's prompts, which the owner sent itself; a watcher's does
        # not: it gets them live (as the owner's other updates), so they are in its stream.
        skip_prompts = requested is not None and not watching
        after: int = requested or 0
        history = self._hub.history(session)
        take_held = _hold_nothing if watching else transitions.take_held
        # (``subagent_update``s are replayed to a client that advertised ``subagents`` only.)
        hide_tree = not supports_subagents(client.capabilities)
        complete = True
        if load:
            entries, complete = history.after(after, live_only=skip_prompts)
            for data in take_held(session, after):
                await client.send_wait(data)
            for seq, data in entries:
                if not (hide_tree and _SUBAGENT_UPDATE in data):
                    await client.send_wait(self.stamped(client, seq, data))
                after = seq
                for held in take_held(session, seq):
                    await client.send_wait(held)
        else:
            after = history.last_seq  # resume: no replay
        result: JsonObject = dict(session.setup)
        ours: JsonObject = {
            "lastSeq": history.last_seq,
            "complete": complete,
            "pending": [] if watching else self._answers_owed(session, client),
        }
        if watching:
            owner = session.client
            ours["watch"] = True
            ours["owner"] = owner.name if owner is not None and not owner.closed else None
        result["_meta"] = {"acp_bridge": ours}
        await client.send_wait(dumps(rpc.result(msg["id"], result)))
        # Updates that came in meanwhile were kept, not sent: send them, then switch the live
        # stream over with no await in between (nothing lost, nothing twice).
        while history.last_seq > after:
            entries, caught_up = history.after(after, live_only=skip_prompts)
            complete = complete and caught_up
            if not entries:
                break
            for seq, data in entries:
                if not (hide_tree and _SUBAGENT_UPDATE in data):
                    await client.send_wait(self.stamped(client, seq, data))
                after = seq
                for held in take_held(session, seq):
                    await client.send_wait(held)
        if watch is not None:
            # (Live from here, with no await since the last replayed update.)
            transitions.add_watcher(session, client, approve=watch)
            session.log.info("session_watched", client=client.name, approve=watch)
            if watch:
                await self._approvals.show_watcher(session, client)
        if not complete:
            await self._logs.send_log(
                client,
                "warning",
                "history was trimmed: the replay is missing older updates (resync required)",
                session=session,
                firstSeq=history.first_seq,
            )
        if not watching:
            await self.attach(session, client)

    def _answers_owed(self, session: Session, client: ClientLink) -> list[JsonRpcId]:
        """Ids of requests whose answers will go to ``client`` once it owns the session."""
        return transitions.answers_owed(session, client, self._hub.agents[session.agent].pending)

    @staticmethod
    def stamped(client: ClientLink, seq: int, data: bytes) -> bytes:
        """A history entry as this client gets it (with its seq number if it opted in)."""
        return transitions.stamped(client.want_seq, seq, data)

    async def replay_journal(
        self,
        client: ClientLink,
        msg: JsonObject,
        params: JsonObject,
        session: Session,
        reason: str,
    ) -> None:
        """
        A stored session its agent cannot continue (``reason``), loaded by a client that
        asked for journal replays: the journal's updates, then an answer saying so.

        Raises:
            JsonRpcError: the client did not ask for journal replays (-32002, the reason).
        """
        journal = self._hub.journal
        assert journal is not None
        self._hub.unrestorable[session.bridge_id] = reason
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
        await journal.moved(session.bridge_id)  # (a move aside is in the store)
        entries = await trio.to_thread.run_sync(
            functools.partial(
                journal.store.journal, session.bridge_id, after_seq=start, live_only=catch_up
            )
        )
        expected = start + 1
        complete = session.bridge_id not in journal.gaps
        for entry in entries:
            if entry.seq != expected and entry.live:
                complete = False
            expected = entry.seq + 1
            await client.send_wait(
                transitions.from_journal(client.want_seq, session.bridge_id, entry.seq, entry.data)
            )
        if entries and start and entries[0].seq > start + 1 and not catch_up:
            complete = False
        answer: JsonObject = dict(session.setup)
        answer["_meta"] = {
            "acp_bridge": {
                "restored": False,
                "reason": reason,
                "lastSeq": self._hub.history(session).last_seq,
                "complete": complete,
            }
        }
        await client.send_wait(dumps(rpc.result(msg["id"], answer)))
        await self._logs.send_log(
            client,
            "warning",
            f"session replayed from the bridge's journal; the agent cannot continue it ({reason})",
            session=session,
        )


def _shown_to_a_watcher(entry: Forwarded) -> bool:
    """A parked permission request a live watcher that approves is shown (still attended)."""
    ask = entry.extra
    return isinstance(ask, Ask) and any(not client.closed for client in ask.shown)


def _hold_nothing(session: Session, upto: float) -> list[bytes]:
    """A watcher's replay: the answers held for the owner stay the owner's."""
    return []


__all__ = ["Reattach"]
