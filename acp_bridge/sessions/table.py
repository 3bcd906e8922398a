"""
Routing state: which agent owns which session, and which requests are waiting on whom.

Pure: no I/O, no trio. The hub (``engine.hub``) holds one :class:`SessionTable`, each link one
:class:`PendingTable`; the services ask them where a message goes and perform the answer.

Session ids: the client sees *bridge* session ids. A bridge id equals the agent's own id
whenever that id is not already taken, so most traffic passes without rewriting; when two
agents mint the same id, the later one gets ``"<id>~<agent>"`` (plus a counter if even that is
taken). Request ids: every request the bridge sends on a link carries an integer minted for
that link; the table remembers who asked and with which id, so ids from two agents, or from an
agent and the client, never meet.
"""

from __future__ import annotations

import collections
import enum
import itertools
import time
from typing import TYPE_CHECKING, Any, Final, Generic, TypeAlias, TypeVar

import attrs
import structlog

from acp_bridge.sessions.topic import Topic

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcId


_logger = structlog.get_logger("acp_bridge.bridge")


class SessionState(enum.Enum):
    """Where a session is in its life, as the bridge sees it."""

    #: a ``session/load`` for it is under way; its replayed updates are routed already
    LOADING = "loading"
    #: known from ``session/list``; not attached to any client yet
    LISTED = "listed"
    ACTIVE = "active"
    #: its agent exited; requests for it fail until it is loaded again
    ENDED = "ended"
    #: known from the store (the bridge restarted): its agent session is not live; a
    #: session/load restores it (through the agent, or replayed from the journal)
    STORED = "stored"


#: A piece of a history: the updates numbered ``first`` to ``last``, their whole lines joined
#: in ``data``, all ``live`` or none. One message kept alone is a chunk of one (its line may
#: lack the newline); a run relayed as one slice is one chunk (``History.extend``).
Chunk: TypeAlias = "tuple[int, int, bytes, bool]"


def chunk_lines(chunk: Chunk) -> list[bytes]:
    """The messages of a chunk, each with its line end."""
    first, last, data, _ = chunk
    # (a run holds no CR but at its lines' ends: the scan made sure, see protocol.scan)
    return [data] if first == last else data.splitlines(keepends=True)


def split_chunk(chunk: Chunk, keep_from: int) -> tuple[Chunk, Chunk]:
    """A chunk cut before message number ``keep_from`` (first < keep_from <= last)."""
    first, last, _, live = chunk
    lines = chunk_lines(chunk)
    cut = keep_from - first
    return (
        (first, keep_from - 1, b"".join(lines[:cut]), live),
        (keep_from, last, b"".join(lines[cut:]), live),
    )


class History:
    """
    The updates of one session as the bridge relayed them, numbered, for replay.

    Every entry gets the next sequence number (from 1). Bounded by count and bytes: past
    either bound the oldest entries are trimmed, and :meth:`after` says when what was asked
    for is no longer all there.

    Kept as chunks (:data:`Chunk`): a run of updates relayed as one slice stays one piece of
    bytes, so keeping it, trimming it and handing it to the journal cost no Python per
    update. A chunk is cut into its lines only where a bound falls inside it and for a
    replay.
    """

    __slots__ = (
        "_bytes",
        "_chunks",
        "_count",
        "journaled",
        "last_seq",
        "max_bytes",
        "max_entries",
        "spill",
    )

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        #: oldest first
        self._chunks: collections.deque[Chunk] = collections.deque()
        self._count = 0
        self._bytes = 0
        self.last_seq = 0
        #: the last sequence number handed to the journal (:meth:`take_unjournaled`, ``spill``)
        self.journaled = 0
        #: called with the chunks the bounds trim before the journal took them, oldest first
        #: (the journal keeps them for its next commit); None: no journal
        self.spill: Callable[[list[Chunk]], None] | None = None
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def continue_from(self, seq: int) -> None:
        """Number on from ``seq``, which the journal already has (a session restored)."""
        self.last_seq = self.journaled = seq

    def __len__(self) -> int:
        return self._count

    @property
    def total_bytes(self) -> int:
        """The bytes of the lines kept (bounded by ``max_bytes``)."""
        return self._bytes

    @property
    def first_seq(self) -> int:
        """The oldest sequence number still kept (last_seq + 1 when empty)."""
        return self._chunks[0][0] if self._count else self.last_seq + 1

    def append(self, data: bytes, *, live: bool = True) -> int:
        """
        Keep one message (a whole line); return its sequence number.

        ``live=False`` marks what the live stream never carried (the user's own prompts):
        a full replay includes it, a catch-up replay (:meth:`after` with ``live_only``) not.
        """
        seq = self.last_seq = self.last_seq + 1
        self._chunks.append((seq, seq, data, live))
        self._count += 1
        self._bytes += len(data)
        if self._count > self.max_entries or self._bytes > self.max_bytes:
            self._trim()
        return seq

    def extend(self, data: bytes, count: int) -> int:
        """
        Keep ``count`` live messages at once: whole lines, ``data``, with no CR but at a
        line's end (a run the scan found); return the last one's sequence number.
        """
        first = self.last_seq + 1
        last = self.last_seq = self.last_seq + count
        self._chunks.append((first, last, data, True))
        self._count += count
        self._bytes += len(data)
        if self._count > self.max_entries or self._bytes > self.max_bytes:
            self._trim()
        return last

    def _trim(self) -> None:
        """Drop the oldest entries past the bounds (the journal's are handed to ``spill``)."""
        chunks = self._chunks
        trimmed: list[Chunk] = []
        while self._count > self.max_entries or self._bytes > self.max_bytes:
            chunk = chunks[0]
            first, last, data, _ = chunk
            size = last - first + 1
            drop = max(self._count - self.max_entries, 0)
            excess = self._bytes - self.max_bytes
            if drop < size and excess > 0:
                if excess >= len(data):
                    drop = size
                else:
                    # The byte bound falls inside this chunk: the fewest lines that meet it.
                    sizes = itertools.accumulate(map(len, chunk_lines(chunk)))
                    drop = max(drop, next(n for n, total in enumerate(sizes, 1) if total >= excess))
            if drop >= size:
                trimmed.append(chunks.popleft())
                self._count -= size
                self._bytes -= len(data)
            else:
                gone, chunks[0] = split_chunk(chunk, first + drop)
                trimmed.append(gone)
                self._count -= drop
                self._bytes -= len(gone[2])
        if self.spill is not None and trimmed[-1][1] > self.journaled:
            unjournaled = [c for c in trimmed if c[1] > self.journaled]
            self.journaled = trimmed[-1][1]
            self.spill(unjournaled)

    def take_unjournaled(self) -> tuple[list[Chunk], bool]:
        """
        The chunks the journal has not taken yet, oldest first, now counted as taken; and
        whether that is all of them (False: the bounds trimmed some before the journal came
        for them, with no ``spill`` to hand them to).
        """
        journaled = self.journaled
        taken: list[Chunk] = []
        for chunk in reversed(self._chunks):
            if chunk[1] <= journaled:
                break
            taken.append(chunk)
        taken.reverse()
        if taken and taken[0][0] <= journaled:  # (never in practice: taken whole)
            taken[0] = split_chunk(taken[0], journaled + 1)[1]
        complete = taken[0][0] == journaled + 1 if taken else self.last_seq == journaled
        self.journaled = self.last_seq
        return taken, complete

    def after(self, seq: int, *, live_only: bool = False) -> tuple[list[tuple[int, bytes]], bool]:
        """
        Entries with a sequence number above ``seq``, and whether that is all of them.

        ``complete`` is False when entries after ``seq`` were trimmed already: the caller
        must tell its client to resync instead of pretending nothing is missing.
        """
        complete = seq + 1 >= self.first_seq
        out: list[tuple[int, bytes]] = []
        for chunk in self._chunks:
            first, last, data, live = chunk
            if last <= seq or not (live or not live_only):
                continue
            if first == last:
                out.append((first, data))
            else:
                out += [(n, line) for n, line in enumerate(chunk_lines(chunk), first) if n > seq]
        return out, complete


@attrs.define(eq=False, slots=True)
class Watcher:
    """A connection that follows a session it does not own (``_meta.acp_bridge.watch``)."""

    #: its client link (opaque here)
    link: Any
    #: it is shown the session's permission requests beside the owner (``approve``)
    approve: bool = False


@attrs.define(eq=False, slots=True)
class Session:
    """One session as the bridge routes it."""

    bridge_id: str
    agent: str
    agent_id: str
    state: SessionState = SessionState.ACTIVE
    #: the client link that owns the session (opaque to this module), None when detached
    client: Any = None
    #: True when bridge_id != agent_id: messages need their sessionId rewritten
    rewrite: bool = False
    #: ids (on the client link) of permission requests the client has not answered yet
    pending_permissions: set[int] = attrs.field(factory=set)
    #: what the bridge relayed, for session/load replay (None: not recorded)
    history: History | None = None
    #: modes / configOptions as last reported, to answer load and resume without the agent
    setup: dict[str, Any] = attrs.field(factory=dict)
    #: agent requests that were waiting on a client that went away: shown again on reattach
    parked: list[Any] = attrs.field(factory=list)
    #: answers to requests of a connection that went away: (history position, message)
    held_responses: list[tuple[int, JsonRpcId, bytes]] = attrs.field(factory=list)
    #: when a detached session is closed (clock seconds), None while attached
    detach_deadline: float | None = None
    #: the session's roots: [cwd, *additionalDirectories] (agents' file access stays inside)
    roots: tuple[str, ...] = ()
    #: declared unattended at session/new: nobody will answer its approvals
    unattended: bool = False
    #: when it was created (wall clock, for the store)
    created: float = attrs.field(factory=time.time)
    #: a sub-agent's: the bridge id of the session that spawned it (docs/subagents.md)
    parent: str | None = None
    #: a sub-agent's: sees each of its ``session/update`` params before the relay; returns
    #: whether the client gets the update too (None, the usual: it does)
    watch: Callable[[JsonObject], bool] | None = None
    #: its title, as the agent last reported it (``session_info_update``), for the console
    title: str | None = None
    #: connections that follow it without owning it (``_meta.acp_bridge.watch``), in the
    #: order they came; None (never empty) when there are none: the relay's one check
    watchers: list[Watcher] | None = None
    _log: Any = attrs.field(default=None, init=False, repr=False)

    @property
    def log(self) -> Any:
        """Its logger, bound on first use to its ids (every event about it carries them)."""
        if self._log is None:
            self._log = _logger.bind(session=self.bridge_id, agent=self.agent)
        return self._log


class SessionTable:
    """
    Bridge session id ↔ (agent, agent session id), unique across all agents.

    Lookups are O(1) both ways.

    Sessions only the store has (closed ones, kept for ``sessions export``; those of an agent
    no longer configured) are not in the table but keep their bridge ids from new sessions:
    a new session that gets such an id (an agent counting from 1 again) takes it, and the
    kept session moves to an id of its own (published on :attr:`moved` as ``(old, new)``: its
    store row and journal move with it). One small entry each, as many as the store has rows:
    the store's bound.
    """

    __slots__ = ("_by_agent", "_by_bridge", "_kept", "moved", "removed")

    def __init__(self) -> None:
        self._by_bridge: dict[str, Session] = {}
        self._by_agent: dict[str, dict[str, Session]] = {}
        #: bridge id → (agent, agent session id) of the sessions only the store has
        self._kept: dict[str, tuple[str, str]] = {}
        #: a kept session moved aside: (its old bridge id, its new one)
        self.moved: Topic[[str, str]] = Topic()
        #: each session :meth:`remove` takes out (closed, deleted, expired, failed)
        self.removed: Topic[[Session]] = Topic()

    def __len__(self) -> int:
        return len(self._by_bridge)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_bridge.values()))

    def get(self, bridge_id: str) -> Session | None:
        return self._by_bridge.get(bridge_id)

    def find(self, agent: str, agent_id: str) -> Session | None:
        sessions = self._by_agent.get(agent)
        return sessions.get(agent_id) if sessions is not None else None

    def of_agent(self, agent: str) -> list[Session]:
        return list(self._by_agent.get(agent, {}).values())

    def register(
        self,
        agent: str,
        agent_id: str,
        *,
        client: Any = None,
        state: SessionState = SessionState.ACTIVE,
    ) -> Session:
        """
        Bind an agent's session id, minting a bridge id; an existing binding is reused.

        Returns the session (new or existing); the caller updates client and state.
        """
        existing = self.find(agent, agent_id)
        if existing is not None:
            return existing
        bridge_id = agent_id
        if bridge_id in self._by_bridge:
            bridge_id = self._second_id(agent, agent_id)
        self._move_kept(bridge_id)
        session = Session(
            bridge_id=bridge_id,
            agent=agent,
            agent_id=agent_id,
            state=state,
            client=client,
            rewrite=bridge_id != agent_id,
        )
        self._by_bridge[bridge_id] = session
        self._by_agent.setdefault(agent, {})[agent_id] = session
        return session

    def _second_id(self, agent: str, agent_id: str) -> str:
        """A free bridge id for an agent id that is taken: ``"<id>~<agent>"``, then ``~2``..."""
        bridge_id = f"{agent_id}~{agent}"
        for n in itertools.count(2):
            if bridge_id not in self._by_bridge and bridge_id not in self._kept:
                break
            bridge_id = f"{agent_id}~{agent}~{n}"
        return bridge_id

    def displace(self, session: Session) -> str:
        """
        Move ``session`` to a bridge id of its own (minted as for a second agent with its agent
        id), freeing the one it had for a new session; returns the new bridge id.
        """
        if self._by_bridge.get(session.bridge_id) is session:
            del self._by_bridge[session.bridge_id]
        session.bridge_id = self._second_id(session.agent, session.agent_id)
        session.rewrite = True
        self._by_bridge[session.bridge_id] = session
        return session.bridge_id

    def bind(self, agent: str, agent_id: str, bridge_id: str) -> Session:
        """
        Bind an agent session to a given bridge id (restoring a known mapping).

        Raises:
            ValueError: the bridge id is taken by another agent session.
        """
        taken = self._by_bridge.get(bridge_id)
        if taken is not None:
            if taken.agent == agent and taken.agent_id == agent_id:
                return taken
            raise ValueError(f"bridge session id {bridge_id!r} is taken")
        self._move_kept(bridge_id)
        session = Session(
            bridge_id=bridge_id, agent=agent, agent_id=agent_id, rewrite=bridge_id != agent_id
        )
        self._by_bridge[bridge_id] = session
        self._by_agent.setdefault(agent, {})[agent_id] = session
        return session

    def keep(self, bridge_id: str, agent: str, agent_id: str) -> None:
        """A session only the store has (closed, or not loaded back): its id is not free."""
        if bridge_id not in self._by_bridge:
            self._kept[bridge_id] = (agent, agent_id)

    def _move_kept(self, bridge_id: str) -> None:
        """A session takes ``bridge_id``: a kept session that has it moves aside first."""
        kept = self._kept.pop(bridge_id, None)
        if kept is None:
            return
        new = self._second_id(*kept)
        self._kept[new] = kept
        self.moved.publish(bridge_id, new)

    def owns_agent_id(self, session: Session) -> bool:
        """Whether ``session`` is still the one its agent session id leads to."""
        return self.find(session.agent, session.agent_id) is session

    def release_agent_id(self, session: Session) -> None:
        """
        The agent gave ``session``'s id to another session (it restarted and counts from 1
        again): messages with that id are no longer this session's. It keeps its bridge id,
        so a new session with the same agent id gets a bridge id of its own.
        """
        sessions = self._by_agent.get(session.agent)
        if sessions is not None and sessions.get(session.agent_id) is session:
            del sessions[session.agent_id]

    def remove(self, session: Session) -> None:
        removed = self._by_bridge.get(session.bridge_id) is session
        if removed:
            del self._by_bridge[session.bridge_id]
        sessions = self._by_agent.get(session.agent)
        if sessions is not None and sessions.get(session.agent_id) is session:
            del sessions[session.agent_id]
        if removed:
            self.removed.publish(session)


T = TypeVar("T")


class PendingTable(Generic[T]):
    """
    Requests the bridge sent on one link and is waiting on: minted id → what to do with the answer.

    Ids are integers counted from 1 per link, never reused while the link lives.
    """

    __slots__ = ("_entries", "_ids")

    def __init__(self, ids: Iterator[int] | None = None) -> None:
        #: where ids come from: by default 1, 2, ... for this table; a shared counter makes
        #: ids unique across tables (a stale answer on a new connection then matches nothing)
        self._ids = ids if ids is not None else itertools.count(1)
        self._entries: dict[int, T] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: T) -> int:
        bridge_id = next(self._ids)
        self._entries[bridge_id] = entry
        return bridge_id

    def get(self, bridge_id: JsonRpcId) -> T | None:
        if type(bridge_id) is not int:
            return None
        return self._entries.get(bridge_id)

    def pop(self, bridge_id: JsonRpcId) -> T | None:
        """Remove and return the entry for a response's id; None for an unknown id."""
        if type(bridge_id) is not int:
            return None
        return self._entries.pop(bridge_id, None)

    def find(self, predicate: Callable[[T], bool]) -> list[tuple[int, T]]:
        return [(k, v) for k, v in self._entries.items() if predicate(v)]

    def drain(self) -> list[tuple[int, T]]:
        """Remove and return every entry (the link is gone: each needs a synthesized answer)."""
        entries = list(self._entries.items())
        self._entries.clear()
        return entries


@attrs.define(slots=True, eq=False)
class Forwarded:
    """
    A request the bridge forwarded: who asked, with which id, and for which session.

    ``origin`` is the link the request came from (a client or an agent, opaque here).
    Identity is the object (usable as a key: a timer, a parked request).
    """

    origin: Any
    origin_id: JsonRpcId
    method: str
    session: Session | None = None
    #: extra context the bridge needs when the answer comes (e.g. the agent chosen)
    context: Any = None
    #: the approval state of a permission request the client is asked (see engine.approvals)
    extra: Any = None
    #: what of a session's setup its agent could not take (the client is told with the answer)
    stripped: tuple[str, ...] = ()


#: answers kept for a detached session until a connection takes it back (more are dropped)
HELD_RESPONSES_MAX: Final = 256


@attrs.frozen
class Setup:
    """What a session/new (or fork) asked for that the bridge keeps: roots, unattended."""

    roots: tuple[str, ...]
    unattended: bool


def roots_of(params: JsonObject) -> tuple[str, ...]:
    """A session's roots: [cwd, *additionalDirectories] (absolute strings only)."""
    roots = [params.get("cwd")]
    extra = params.get("additionalDirectories")
    if isinstance(extra, list):
        roots += extra
    return tuple(r for r in roots if isinstance(r, str) and r.startswith("/"))


def track_setup(session: Session, update: JsonObject) -> None:
    """Keep the session's current mode and config options as the agent reports them."""
    if update.get("sessionUpdate") == "current_mode_update":
        modes = session.setup.get("modes")
        if isinstance(modes, dict) and isinstance(update.get("currentModeId"), str):
            session.setup["modes"] = {**modes, "currentModeId": update["currentModeId"]}
    elif update.get("sessionUpdate") == "session_info_update":
        if "title" in update:  # (null clears it)
            title = update["title"]
            session.title = title[:500] if isinstance(title, str) else None
    elif isinstance(update.get("configOptions"), list):
        session.setup["configOptions"] = update["configOptions"]


def capture_setup(session: Session, result: Any) -> None:
    if isinstance(result, dict):
        for key in ("modes", "configOptions"):
            if key in result:
                session.setup[key] = result[key]
