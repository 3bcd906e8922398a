"""
Approvals: every ``session/request_permission`` passes one policy, and ends exactly once.

``[policy] deny_paths`` come first: a request naming a denied file is denied, whatever the
rules say. Then the rules decide (``policy.rules.decide``, pure). What they leave to a human is
shown to the client attached to the session, under a deadline; nobody attached (or a session
declared unattended) means deny. Whatever settles a request (the client, a rule,
``session/cancel``, the deadline, the end of a detach grace period, the agent's exit or its
withdrawal, the console), :meth:`Approvals.settle` is the only way out: it answers the agent
once, withdraws the request from every client that was shown it and did not answer it
(``$/cancel_request``, standard ACP; ``_acp_bridge/permission_resolved`` too for a client that
knows the bridge's extensions), and writes one audit record. A late or second answer is
refused and audited. **A timeout never grants.**

Every request put to a human is also listed for the approval console (:class:`Desk`: what
waits, and a topic as each starts and ends) and may be answered from there
(:meth:`Approvals.console_answer`), through the same settlement: the first answer wins. With
``[policy] unattended = "console"``, a request no attached client can answer waits for the
console (up to ``ask_timeout``) instead of being denied at once.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import json
import time
from typing import TYPE_CHECKING, Any, Final

import attrs
import structlog
import trio

from acp_bridge.policy.containment import PathRefused, contain, denied
from acp_bridge.policy.rules import Action, Decision, PermissionRequest, choose_option, decide
from acp_bridge.policy.rules import reject_option as _reject_option
from acp_bridge.protocol.jsonrpc import dumps, notification, request, result
from acp_bridge.protocol.notices import policy_notice
from acp_bridge.sessions import transitions
from acp_bridge.sessions.table import Forwarded
from acp_bridge.sessions.topic import Topic
from acp_bridge.store.db import AuditRecord

if TYPE_CHECKING:
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.engine.log_channel import LogChannel
    from acp_bridge.policy.rules import Option, Policy
    from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcId
    from acp_bridge.sessions.table import Session

logger = structlog.get_logger("acp_bridge.approvals")

PERMISSION: Final = "session/request_permission"
#: answers remembered per client to tell a late answer from an unknown one
SETTLED_REMEMBERED: Final = 4096
#: bytes of a file hashed to notice that it changed under a pending edit approval
DIGEST_MAX_BYTES: Final = 64 * 1024 * 1024

_ALLOW_KINDS: Final = frozenset({"allow_once", "allow_always"})
_REJECT_KINDS: Final = frozenset({"reject_once", "reject_always"})


@attrs.define(eq=False)
class Ask:
    """The state of one permission request the bridge put to a human."""

    request: PermissionRequest
    #: file digests taken when the request came, for an edit (path → sha256, None: missing)
    digests: dict[str, str | None] | None = None
    #: the clients it is shown to now, each with its own id for it (empty: parked, waiting
    #: for a client); a set of them, not one: whatever settles it withdraws it from each
    shown: dict[ClientLink, int] = attrs.field(factory=dict)
    reasked: bool = False
    settled: bool = False
    #: its key in the store's pending approvals (None: not recorded)
    key: str | None = None
    #: its id on the approval console
    console_id: str = ""
    #: when it is denied (trio clock), and when it came (wall clock)
    deadline: float = 0.0
    asked_at: float = attrs.field(factory=time.time)
    #: nobody attached may answer it (an unattended session): only the console, never shown
    console_only: bool = False
    #: why it is asked again (a file changed), for whoever sees it
    note: str | None = None


@attrs.frozen
class Settlement:
    """
    How a request the console listed ended (what :attr:`Desk.changed` tells).

    Attributes:
        decision: ``allow``, ``deny``, ``cancelled``, ``error`` or ``other``.
        source: who settled it: ``client``, ``console``, ``timeout``, a rule...
        option_id: the option answered, if any.
        connection: the client connection that answered, if one did.
    """

    decision: str
    source: str
    option_id: str | None = None
    connection: str | None = None


def _selected(option: Option | None) -> JsonObject:
    if option is None:
        return {"outcome": "cancelled"}
    return {"outcome": "selected", "optionId": option.option_id}


def _verdict(outcome: JsonObject, request: PermissionRequest) -> tuple[str, str | None]:
    """
    (decision, option id) of an outcome: allow, deny, cancelled, or other.

    An id that several options carry (only a client's answer can name one: the bridge never
    does) reads as the agent may read it: allow if any of its kinds allows, so neither the
    audit nor the stale-file check takes for a deny what the agent may take for an allow.
    """
    if outcome.get("outcome") != "selected":
        return "cancelled", None
    option_id = outcome.get("optionId")
    kinds = {o.kind for o in request.options if o.option_id == option_id}
    if kinds & _ALLOW_KINDS:
        return "allow", option_id if isinstance(option_id, str) else None
    if kinds & _REJECT_KINDS:
        return "deny", option_id if isinstance(option_id, str) else None
    return "other", option_id if isinstance(option_id, str) else None


def _hash_files(paths: list[str]) -> dict[str, str | None]:
    digests: dict[str, str | None] = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                h = hashlib.sha256()
                remaining = DIGEST_MAX_BYTES
                while remaining > 0 and (chunk := f.read(min(1 << 20, remaining))):
                    h.update(chunk)
                    remaining -= len(chunk)
                if remaining <= 0:
                    h.update(str(f.seek(0, 2)).encode())  # beyond the cap: its size counts
                digests[path] = h.hexdigest()
        except OSError:
            digests[path] = None
    return digests


async def _changed(ask: Ask) -> tuple[dict[str, str | None], str] | None:
    """For an edit asked with its files' digests: the digests now and the files that changed
    since (None: none did, or no digests were taken)."""
    if not ask.digests:
        return None
    now = await trio.to_thread.run_sync(_hash_files, list(ask.digests))
    if now == ask.digests:
        return None
    return now, ", ".join(sorted(p for p in now if now[p] != ask.digests.get(p)))


class Desk:
    """
    Every permission request waiting on a human now (shown, parked or only the console's), by
    console id, oldest first; :attr:`changed` tells the console as each starts and ends.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, Forwarded] = {}
        self._ids = itertools.count(1)
        #: each request as it starts waiting (None), is asked again (None), ends (its Settlement)
        self.changed: Topic[[Forwarded, Settlement | None]] = Topic()

    def waiting(self) -> list[Forwarded]:
        return list(self._waiting.values())

    def get(self, console_id: str) -> Forwarded | None:
        return self._waiting.get(console_id)

    def add(self, entry: Forwarded, deadline: float) -> None:
        ask: Ask = entry.extra
        ask.console_id = str(next(self._ids))
        ask.deadline = deadline
        self._waiting[ask.console_id] = entry
        self.changed.publish(entry, None)

    def remove(self, ask: Ask) -> None:
        self._waiting.pop(ask.console_id, None)


def rule_on(
    policy: Policy,
    req: PermissionRequest,
    session: Session,
    agent: str,
    *,
    parent: str | None,
    attended: bool,
) -> tuple[JsonObject, str, str | None] | None:
    """
    What the bridge answers a permission request without a human, as (outcome, audit source,
    detail), or None: a human must be asked (the attached client, or the console). ``parent``:
    the agent of the session that spawned this one (a sub-agent's), for rules that match it.
    """
    hit = _deny_paths_hit(req, session, policy.deny_paths)
    if hit is not None:
        # Before the rules: no rule, and no human, grants a tool call on a denied file
        # (the agent may open it itself, past the bridge's file containment).
        return _selected(_reject_option(req.options)), "deny_paths", hit
    nobody = (not attended or session.unattended) and policy.unattended != "console"
    decision = decide(req, policy, agent, parent)
    if decision.action is not Action.ASK:
        option = choose_option(decision, req.options)
        if option is not None:
            return _selected(option), decision.rule or "default", None
        if nobody:
            detail = (
                f"the rule says {decision.action.value}, but no such option is offered "
                "under an id of its own"
            )
            return _selected(None), decision.rule or "default", detail
    if nobody:
        reason = "session is unattended" if attended else "no client attached"
        return _selected(_reject_option(req.options)), "unattended", reason
    return None


class Approvals:
    """
    The approval policy at work for one bridge: the hub's session table, timers and journal
    (pending approvals; None: memory only), and the log channel to tell a client why its
    session's request was denied.
    """

    def __init__(self, hub: Hub, logs: LogChannel) -> None:
        self._hub = hub
        self.policy = hub.config.policy
        self.audit = hub.audit
        #: a child's request may be shown on its root's session (``Tree.present``)
        self._tree = hub.tree
        self._logs = logs
        #: per client: ids of permission requests already settled (late answers are refused)
        self._settled: dict[ClientLink, collections.OrderedDict[int, None]] = {}
        #: decisions by "<decision>:<source>" (for metrics)
        self.counts: collections.Counter[str] = collections.Counter()
        #: every request waiting on a human, for the approval console
        self.desk = Desk()

    # ------------------------------------------------------------------ a request arrives

    async def permission_request(
        self, agent: AgentLink, msg: JsonObject, params: JsonObject, session: Session
    ) -> None:
        """An agent asks: decide by rule, deny when unattended, or ask the attached human."""
        agent_id = msg["id"]
        req = PermissionRequest.from_params(params)
        parent = self._hub.sessions.get(session.parent) if session.parent is not None else None
        client = session.client if session.client is not None else None
        if client is not None and client.closed:
            client = None
        ruling = rule_on(
            self.policy,
            req,
            session,
            agent.name,
            parent=parent.agent if parent else None,
            # (a watcher that approves attends the session as its owner does)
            attended=client is not None or bool(transitions.approvers(session)),
        )
        if ruling is not None:
            outcome, source, detail = ruling
            await self._answer(agent, agent_id, outcome, req, session, source=source, detail=detail)
            self._told(session, req, outcome, source, detail)
            if source == "unattended" and client is not None:
                await self._logs.send_log(
                    client,
                    "warning",
                    f"permission request denied: {detail}",
                    session=session,
                    toolCallId=req.tool_call_id,
                )
            return
        life = agent.starts
        digests = await _digests(session, req) if req.kind == "edit" and req.paths else None
        entry = Forwarded(agent, agent_id, PERMISSION, session, params, Ask(req, digests))
        # Reading the digests took a round through a thread: the process that asked may have
        # died, and the client may have gone (or another taken the session) meanwhile.
        if not agent.running or agent.starts != life:
            await self.agent_gone(entry)
            return
        journal = self._hub.journal
        if journal is not None:
            ask = entry.extra
            ask.key = f"{session.bridge_id}:{agent.name}:{agent_id}:{id(entry)}"
            journal.pending_added(ask.key, session.bridge_id, agent.name, json.dumps(params))
        deadline = trio.current_time() + self.policy.ask_timeout
        timeout = functools.partial(self.timed_out, entry)
        self._hub.deadlines.schedule(("ask", entry), deadline, timeout)
        self.desk.add(entry, deadline)
        if self._hub.sessions.get(session.bridge_id) is not session:
            await self.unattended(entry, "session_closed")  # closed or deleted meanwhile
            return
        owner = session.client
        if session.unattended:
            # Only the console answers it (console mode); parked, so that whatever ends the
            # session's requests (cancel, grace, the agent's exit or withdrawal) ends it too.
            entry.extra.console_only = True
            session.parked.append(entry)
            return
        if owner is None or owner.closed:
            session.parked.append(entry)  # shown to whoever takes the session back
        else:
            await self.show(entry, owner)
        for watcher in transitions.approvers(session):
            await self.show(entry, watcher)

    async def show_watcher(self, session: Session, client: ClientLink) -> None:
        """A watcher that approves joined: the session's requests waiting on a human."""
        for entry in self.desk.waiting():
            ask: Ask = entry.extra
            if entry.session is session and not ask.console_only and client not in ask.shown:
                await self.show(entry, client)

    def watcher_gone(self, client: ClientLink, client_id: int, entry: Forwarded) -> bool:
        """
        A watcher that was shown a request went away: the request waits on the others (True),
        unless it was the only one who could answer it (False: it ends as any would).
        """
        ask = entry.extra
        session = entry.session
        if not isinstance(ask, Ask) or session is None or session.client is client:
            return False
        if transitions.watcher_of(session, client) is None:
            return False
        ask.shown.pop(client, None)
        session.pending_permissions.discard(client_id)
        return bool(ask.shown) or entry in session.parked

    async def over_limit(
        self, agent: AgentLink, msg: JsonObject, params: JsonObject, session: Session, why: str
    ) -> None:
        """Too many of the agent's requests wait already (``max_agent_requests``): cancelled."""
        req = PermissionRequest.from_params(params)
        cancelled, source = _selected(None), "max_agent_requests"
        await self._answer(agent, msg["id"], cancelled, req, session, source=source, detail=why)
        self._told(session, req, cancelled, source, why)

    async def show(self, entry: Forwarded, client: ClientLink, *, note: str | None = None) -> None:
        """Put a request to a client (first time, after a reattach, or asked again)."""
        ask: Ask = entry.extra
        session = entry.session
        assert session is not None
        if ask.console_only:
            session.parked.append(entry)  # a client takes the session back: still not its own
            return
        agent = entry.origin
        client_id = client.pending.add(entry)
        ask.shown[client] = client_id
        if client is session.client or entry.origin_id not in agent.inflight:
            # (The owner's id is the one an agent's withdrawal finds; settling withdraws
            # it from every client shown it, watchers included.)
            agent.inflight[entry.origin_id] = (client, client_id)
        session.pending_permissions.add(client_id)
        params = dict(entry.context)
        params["sessionId"] = session.bridge_id
        params = self._tree.present(session.bridge_id, client.capabilities, params)
        if note is not None:
            meta = dict(params.get("_meta") or {})
            meta["acp_bridge"] = {**(meta.get("acp_bridge") or {}), "note": note}
            params["_meta"] = meta
        await client.send(dumps(request(client_id, PERMISSION, params)))

    # ------------------------------------------------------------------ ways it ends

    async def client_answer(
        self, client: ClientLink, client_id: int, entry: Forwarded, msg: JsonObject
    ) -> None:
        """The client answered a request it was shown (the entry is already off its table)."""
        ask: Ask = entry.extra
        session = entry.session
        assert session is not None
        session.pending_permissions.discard(client_id)
        ask.shown.pop(client, None)
        if "error" in msg:
            # Not an outcome: the agent learns of the failure as it is.
            await self.settle(
                entry,
                None,
                source="client",
                connection=client,
                error=msg["error"],
                detail="the client answered with an error",
            )
            return
        res = msg.get("result")
        outcome = res.get("outcome") if isinstance(res, dict) else None
        if not isinstance(outcome, dict):
            outcome = {"outcome": "cancelled"}
        verdict, _ = _verdict(outcome, ask.request)
        stale = await _changed(ask) if verdict == "allow" else None
        if stale is not None:
            now, changed = stale
            if not ask.reasked and not client.closed:
                ask.reasked = True
                ask.digests = now
                detail = f"changed since asked: {changed}; asked again"
                await self._record(entry, "stale", "client", connection=client, detail=detail)
                note = f"the file(s) changed since this was asked: {changed}"
                await self.show(entry, client, note=note)
                return
            await self.settle(
                entry,
                _selected(_reject_option(ask.request.options)),
                source="stale",
                connection=client,
                detail=f"changed since asked: {changed}",
            )
            return
        await self.settle(entry, outcome, source="client", connection=client)

    async def timed_out(self, entry: Forwarded) -> None:
        """Nobody answered in time: deny. A timeout never grants."""
        ask: Ask = entry.extra
        outcome = _selected(_reject_option(ask.request.options))
        detail = f"no answer within {self.policy.ask_timeout:g}s"
        if await self.settle(entry, outcome, source="timeout", detail=detail):
            assert entry.session is not None
            self._told(entry.session, ask.request, outcome, "timeout", detail)

    async def settle_session(self, session: Session, source: str) -> None:
        """``session/cancel`` (or close): every pending request of the session → cancelled."""
        client = session.client
        entries = []
        if client is not None:
            for client_id in sorted(session.pending_permissions):
                entry = client.pending.get(client_id)
                if entry is not None and isinstance(entry.extra, Ask):
                    entries.append(entry)
        entries += [e for e in session.parked if isinstance(e.extra, Ask)]
        for entry in entries:
            await self.settle(entry, {"outcome": "cancelled"}, source=source)

    async def unattended(self, entry: Forwarded, reason: str) -> None:
        """A parked or orphaned request: deny (the grace period ended, the client is gone)."""
        ask: Ask = entry.extra
        await self.settle(
            entry, _selected(_reject_option(ask.request.options)), source=reason, detail=reason
        )

    async def agent_gone(self, entry: Forwarded) -> None:
        """The agent that asked exited: settled without an answer (nobody to give it to)."""
        await self.settle(entry, None, source="agent_exit", answer_agent=False)

    async def settle(
        self,
        entry: Forwarded,
        outcome: JsonObject | None,
        *,
        source: str,
        connection: ClientLink | None = None,
        detail: str | None = None,
        error: Any = None,
        answer_agent: bool = True,
    ) -> bool:
        """
        End a shown (or parked) permission request: exactly once. Returns False if it had
        already ended.
        """
        ask: Ask = entry.extra
        if ask.settled:
            return False
        ask.settled = True
        self._hub.deadlines.cancel(("ask", entry))
        self.desk.remove(ask)
        if ask.key is not None and self._hub.journal is not None:
            self._hub.journal.pending_removed(ask.key)
        session = entry.session
        assert session is not None
        agent: AgentLink = entry.origin
        agent.inflight.pop(entry.origin_id, None)
        if entry in session.parked:
            session.parked.remove(entry)
        shown, ask.shown = ask.shown, {}
        for client, client_id in shown.items():
            client.pending.pop(client_id)
            session.pending_permissions.discard(client_id)
            self._remember_settled(client, client_id)
            if client is connection:
                continue  # (its own answer settled it)
            await self._withdraw_from(client, client_id)
            # (Only to a client that knows the bridge's extensions: a stock one reports
            # every unknown notification as an error.)
            if client.extensions:
                await client.send(
                    dumps(
                        notification(
                            "_acp_bridge/permission_resolved",
                            {
                                "sessionId": session.bridge_id,
                                "requestId": client_id,
                                "outcome": outcome or {"outcome": "cancelled"},
                                "reason": source,
                            },
                        )
                    )
                )
        if answer_agent:
            if error is not None:
                agent.answer(dumps({"jsonrpc": "2.0", "id": entry.origin_id, "error": error}))
            else:
                agent.answer(
                    dumps(result(entry.origin_id, {"outcome": outcome or {"outcome": "cancelled"}}))
                )
        verdict, option_id = _verdict(outcome or {}, ask.request)
        if error is not None:
            verdict = "error"
        elif outcome is None:
            verdict = "cancelled"
        await self._record(
            entry, verdict, source, option_id=option_id, connection=connection, detail=detail
        )
        name = connection.name if connection is not None else None
        done = Settlement(verdict, source, option_id, name)
        self.desk.changed.publish(entry, done)
        return True

    async def withdraw(self, entry: Forwarded, client: ClientLink, client_id: int) -> None:
        """
        A request ``client`` was shown under ``client_id`` and may no longer answer, though it
        is not settled (another connection took the session, and is shown it instead):
        withdrawn from it. Its late answer is refused (a permission's audited, as after a
        settlement).
        """
        if isinstance(entry.extra, Ask):
            self._remember_settled(client, client_id)
        await self._withdraw_from(client, client_id)

    @staticmethod
    async def _withdraw_from(client: ClientLink, client_id: int) -> None:
        """
        ``$/cancel_request`` for the request ``client`` knows as ``client_id``: ACP's own way
        to take a request back, so every client closes its dialog, a stock one included.
        """
        await client.send(dumps(notification("$/cancel_request", {"requestId": client_id})))

    async def late_answer(self, client: ClientLink, client_id: JsonRpcId) -> bool:
        """An answer to a request that already ended: refused and audited. False: unknown id."""
        settled = self._settled.get(client)
        if type(client_id) is not int or settled is None or client_id not in settled:
            return False
        logger.info("late_answer_refused", client=client.name, request=client_id)
        await self.audit.record(
            AuditRecord(
                session=None,
                agent=None,
                decision="refused",
                source="late_answer",
                connection=client.name,
                detail=f"answer to request {client_id} after it was settled",
            )
        )
        return True

    # ------------------------------------------------------------------ the console

    async def console_answer(self, console_id: str, option_id: str) -> str:
        """
        An answer from the approval console: one of the request's own options, settled as any
        other answer (the first wins; a client that was shown it is told). Returns
        ``"settled"``, ``"unknown"`` (no such request waits: settled already, or never was),
        ``"bad_option"`` or ``"asked_again"`` (an allow for an edit whose file changed since:
        not delivered, the request waits again with a note; a second change denies).
        """
        entry = self.desk.get(console_id)
        if entry is None:
            return "unknown"
        ask: Ask = entry.extra
        option = next((o for o in ask.request.options if o.option_id == option_id), None)
        if option is None:
            return "bad_option"
        outcome = _selected(option)
        stale = await _changed(ask) if _verdict(outcome, ask.request)[0] == "allow" else None
        if ask.settled:
            return "unknown"  # answered elsewhere while the files were read
        if stale is not None:
            now, changed = stale
            if not ask.reasked:
                ask.reasked = True
                ask.digests = now
                ask.note = f"the file(s) changed since this was asked: {changed}"
                detail = f"changed since asked: {changed}"
                await self._record(entry, "stale", "console", detail=detail)
                self.desk.changed.publish(entry, None)
                return "asked_again"
            outcome = _selected(_reject_option(ask.request.options))
            await self.settle(entry, outcome, source="stale", detail=f"changed: {changed}")
            return "settled"
        settled = await self.settle(entry, outcome, source="console", detail="the console")
        return "settled" if settled else "unknown"

    def forget_client(self, client: ClientLink) -> None:
        self._settled.pop(client, None)

    def _remember_settled(self, client: ClientLink, client_id: int) -> None:
        settled = self._settled.setdefault(client, collections.OrderedDict())
        settled[client_id] = None
        if len(settled) > SETTLED_REMEMBERED:
            settled.popitem(last=False)

    def _told(
        self,
        session: Session,
        req: PermissionRequest,
        outcome: JsonObject,
        source: str,
        detail: str | None,
    ) -> None:
        """
        A request the policy answered without a human, other than an allow: the session's
        client is told why (a notice, if it takes them). An allow by a rule is what the user
        configured and the tool call then shows itself: a notice for each would drown the
        rest.
        """
        verdict, _ = _verdict(outcome, req)
        if verdict != "allow":
            self._logs.notice(session, policy_notice(req.title, verdict, source, detail))

    # ------------------------------------------------------------------ audit

    async def _answer(
        self,
        agent: AgentLink,
        agent_id: JsonRpcId,
        outcome: JsonObject,
        req: PermissionRequest,
        session: Session,
        *,
        source: str,
        detail: str | None = None,
    ) -> None:
        """Answer the agent at once (rule or unattended): nothing is shown to anyone."""
        agent.answer(dumps(result(agent_id, {"outcome": outcome})))
        verdict, option_id = _verdict(outcome, req)
        self.counts[f"{verdict}:{source}"] += 1
        await self.audit.record(
            _record_for(session, agent.name, req, verdict, source, option_id, None, detail)
        )

    async def _record(
        self,
        entry: Forwarded,
        verdict: str,
        source: str,
        *,
        option_id: str | None = None,
        connection: ClientLink | None = None,
        detail: str | None = None,
    ) -> None:
        ask: Ask = entry.extra
        session = entry.session
        assert session is not None
        self.counts[f"{verdict}:{source}"] += 1
        await self.audit.record(
            _record_for(
                session,
                session.agent,
                ask.request,
                verdict,
                source,
                option_id,
                connection.name if connection is not None else None,
                detail,
            )
        )


def _deny_paths_hit(
    req: PermissionRequest, session: Session, deny_paths: tuple[str, ...]
) -> str | None:
    """What of ``req``'s locations hits ``[policy] deny_paths``, said for the audit."""
    cwd = session.roots[0] if session.roots else None
    for path in req.paths:
        pattern = denied(path, deny_paths, cwd)
        if pattern is not None:
            return f"{path!r} matches the deny_paths pattern {pattern!r}"
    return None


async def _digests(session: Session, req: PermissionRequest) -> dict[str, str | None]:
    """The digests of the files an edit names, inside the session's roots (off the loop)."""
    paths = []
    for path in req.paths:
        try:
            paths.append(contain(path, session.roots, ()))
        except PathRefused:
            continue  # not ours to read; the edit itself will be refused if attempted
    if not paths:
        return {}
    return await trio.to_thread.run_sync(_hash_files, paths)


def _record_for(
    session: Session,
    agent: str,
    req: PermissionRequest,
    verdict: str,
    source: str,
    option_id: str | None,
    connection: str | None,
    detail: str | None,
) -> AuditRecord:
    return AuditRecord(
        session=session.bridge_id,
        agent=agent,
        decision=verdict,
        source=source,
        tool_call_id=req.tool_call_id,
        title=req.title,
        kind=req.kind,
        options=tuple(o.option_id for o in req.options),
        option_id=option_id,
        connection=connection,
        detail=detail,
    )


def park(entry: Forwarded, client: ClientLink) -> None:
    """A request waiting on ``client``, which went away (or lost the session), waits for the
    session's next owner."""
    if isinstance(entry.extra, Ask):
        entry.extra.shown.pop(client, None)
    if entry.session is not None:
        entry.session.parked.append(entry)


__all__ = ["Approvals", "Ask", "Decision", "Desk", "Settlement", "park"]
