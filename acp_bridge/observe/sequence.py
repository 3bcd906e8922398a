"""
The sequence view of a wire trace, for a person: lanes (the clients, the bridge, the agents) and
one arrow per message, in the order the bridge saw them. Pure: this is the model;
``observe.sequence_html`` draws it.

Input: trace records as ``--trace FILE`` writes them (``observe.trace``), parsed: ``{"t", "link",
"dir", "msg"}`` for a message, ``{"t", "dropped": N}`` where the tracer dropped some. A record of
``link`` ``client:NAME`` travels between that client and the bridge, one of ``agent:NAME``
between the bridge and that agent; ``dir`` ``in`` points at the bridge, ``out`` away from it.

Pairing: an answer (``result`` or ``error``) belongs to the request of the same link that
travelled the other way with the same id (each link has its own ids: the bridge numbers what it
forwards itself). The pair is linked both ways and shares a colour.

Sessions: a message's session is its ``params.sessionId``, or its request's, or its
``result.sessionId`` (``session/new``: the request joins the session its answer names). With a
session filter, a message whose session is not yet known (a request without one, still
unanswered) waits for its answer to decide.

Bound: the first ``limit`` messages that pass the filter are kept, with their content; past
that, messages are only counted (:attr:`SequenceView.omitted`), and an answer to a kept request
is still noted on the request. Memory: the kept messages, plus the requests still waiting for an
answer.
"""

from __future__ import annotations

import bisect
import json
import math
from typing import TYPE_CHECKING, Final, Literal

import attrs

from acp_bridge.observe.summary import request_summary, response_summary, session_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

__all__ = [
    "DEFAULT_LIMIT",
    "HISTORY_LINK",
    "MAX_LANES",
    "Arrow",
    "Gap",
    "Lane",
    "SequenceView",
    "build_sequence",
    "history_records",
    "read_records",
]

#: Messages kept by default; the rest are counted.
DEFAULT_LIMIT: Final = 10_000
#: Lanes at most, the bridge's included: past it, the last clients (or agents) share one lane.
MAX_LANES: Final = 16
#: Characters of a summary's text excerpts.
SUMMARY_WIDTH: Final = 80

BRIDGE: Final = "bridge"

ArrowKind = Literal["request", "notification", "result", "error", "raw", "other"]
LaneKind = Literal["client", "bridge", "agent"]


@attrs.frozen
class Lane:
    """
    Attributes:
        key: the link it stands for (``client:stdio``, ``agent:demo``), ``bridge``, or
            ``client:*`` / ``agent:*`` for the lane that several share.
        kind: which side of the bridge.
        name: what its header says (the peer's name).
    """

    key: str
    kind: LaneKind
    name: str


@attrs.define
class Arrow:
    """
    One message.

    Attributes:
        number: its place among the input's records, from 1 (a trace file's Nth non-blank line).
        t: seconds since the input's first record.
        link: the trace's ``link``.
        direction: the trace's ``dir``: ``in`` to the bridge, ``out`` from it.
        kind: request, notification, result, error, raw (a line that was not JSON) or other.
        label: what the arrow says: the method, ``result``, ``error``, ``not JSON``, ``?``.
        method: its method, or for an answer its request's ("" when unknown).
        id: a request's or answer's id, as JSON text.
        session: its session, as the message names it (None: none, or unknown).
        group: its session as the client knows it: an agent's own id for a session the bridge
            renamed (``ID~agent``, two agents gave the same id) is shown under the bridge's.
        summary: one line about its content.
        msg: the message itself (for its JSON on demand).
        partner: the number of the answer (of a request) or of the request (of an answer).
        latency: of an answer, seconds since its request.
        pair: requests and answers that are both in the view: the pair's index, in order.
    """

    number: int
    t: float
    link: str
    direction: str
    kind: ArrowKind
    label: str
    method: str
    id: str | None
    session: str | None
    summary: str
    msg: object
    partner: int | None = None
    latency: float | None = None
    pair: int | None = None
    group: str | None = None

    @property
    def toward_bridge(self) -> bool:
        return self.direction == "in"


@attrs.frozen
class Gap:
    """Where the tracer dropped ``dropped`` messages (it fell behind)."""

    number: int
    t: float
    dropped: int


@attrs.frozen
class SequenceView:
    """
    What the view shows.

    Attributes:
        lanes: clients (in the order they appear), the bridge, agents (likewise).
        items: the kept messages and the drop markers among them, in order.
        start: Unix time of the input's first record (None: there was none).
        messages: messages that passed the filter.
        omitted: of those, how many are left out (past ``limit``).
        limit: the bound (None: none).
        dropped: messages the tracer could not record (every marker counted).
        bad: records that were not trace records.
        sessions: the kept messages' sessions (their groups), in the order they appear.
        session: the filter (None: every message).
    """

    lanes: tuple[Lane, ...]
    items: tuple[Arrow | Gap, ...]
    start: float | None
    messages: int
    omitted: int
    limit: int | None
    dropped: int
    bad: int
    sessions: tuple[str, ...]
    session: str | None
    _lane_of: dict[str, int] = attrs.field(alias="lane_of", repr=False)

    @property
    def arrows(self) -> list[Arrow]:
        return [item for item in self.items if isinstance(item, Arrow)]

    def ends(self, arrow: Arrow) -> tuple[int, int]:
        """The lanes an arrow goes from and to (indexes into :attr:`lanes`)."""
        peer = self._lane_of.get(arrow.link)
        if peer is None:  # one of the peers that share a lane
            peer = self._lane_of[_shared(arrow.link)]
        bridge = self._lane_of[BRIDGE]
        return (peer, bridge) if arrow.toward_bridge else (bridge, peer)


def read_records(lines: Iterable[str]) -> Iterator[object]:
    """A trace file's records: each non-blank line parsed (the line itself when not JSON)."""
    for line in lines:
        if line.strip():
            try:
                yield json.loads(line)
            except (ValueError, RecursionError):
                yield line


#: The link of a session's history drawn as a sequence (what the bridge sends its clients).
HISTORY_LINK: Final = "client:its clients"


def history_records(entries: Iterable[tuple[int, bytes]]) -> Iterator[object]:
    """
    A session's history (numbered JSON lines: what the bridge relayed, and the user's prompts
    as ``user_message_chunk`` updates) as trace records: each one a message from the bridge
    to the session's clients, as a replay sends it. The history keeps no times: every record
    is at ``t`` 0.
    """
    for _seq, line in entries:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            msg = {"raw": line.decode("utf-8", "replace").rstrip("\r\n")}
        yield {"t": 0.0, "link": HISTORY_LINK, "dir": "out", "msg": msg}


def build_sequence(
    records: Iterable[object], *, session: str | None = None, limit: int | None = DEFAULT_LIMIT
) -> SequenceView:
    """
    The sequence view of trace records (see the module's notes). Pure.

    Args:
        records: parsed trace records (:func:`read_records`); others count as bad.
        session: only this session's messages (an agent's own id for a session the bridge
            renamed, ``ID~agent``, counts as that session).
        limit: keep the first this many messages (None: all).
    """
    builder = _Builder(session, limit)
    for record in records:
        builder.add(record)
    return builder.finish()


@attrs.define
class _Open:
    """A request waiting for its answer."""

    arrow: Arrow
    #: with a filter, a request whose session is not known yet: decided by its answer
    deferred: bool


@attrs.define
class _Builder:
    session: str | None
    limit: int | None
    start: float | None = None
    number: int = 0
    messages: int = 0
    omitted: int = 0
    dropped: int = 0
    bad: int = 0
    kept: list[Arrow] = attrs.field(factory=list)
    gaps: list[Gap] = attrs.field(factory=list)
    #: (link, the direction the request went, its id) → the request
    open: dict[tuple[str, str, str], _Open] = attrs.field(factory=dict)

    def add(self, record: object) -> None:
        self.number += 1
        if not isinstance(record, dict):
            self.bad += 1
            return
        try:
            t = float(record["t"])
        except (KeyError, TypeError, ValueError):
            self.bad += 1
            return
        if not math.isfinite(t):
            self.bad += 1
            return
        if self.start is None:
            self.start = t
        if "dropped" in record:
            count = record["dropped"]
            count = count if isinstance(count, int) and count > 0 else 0
            self.dropped += count
            self.gaps.append(Gap(self.number, t - self.start, count))
            return
        link, direction = record.get("link"), record.get("dir")
        if not isinstance(link, str) or direction not in ("in", "out"):
            self.bad += 1
            return
        arrow = _arrow(self.number, t - self.start, link, direction, record.get("msg"))
        if arrow.kind in ("result", "error"):
            self._answered(arrow)
        if arrow.kind == "request" and arrow.id is not None:
            deferred = self.session is not None and arrow.session is None
            self.open[(link, direction, arrow.id)] = _Open(arrow, deferred)
            if deferred:
                return
        self._decide(arrow)

    def _answered(self, answer: Arrow) -> None:
        asked = _other(answer.direction)
        request = self.open.pop((answer.link, asked, str(answer.id)), None)
        if request is None:
            return
        ask = request.arrow
        answer.method = ask.method
        answer.summary = _answer_summary(ask.method, answer.msg)
        answer.partner, ask.partner = ask.number, answer.number
        answer.latency = answer.t - ask.t
        if answer.session is None:
            answer.session = ask.session
        elif ask.session is None:
            ask.session = answer.session  # session/new: the request joins the answer's session
        if request.deferred:
            self._decide(ask)

    def _decide(self, arrow: Arrow) -> None:
        if self.session is not None and not self._in_session(arrow):
            return
        self.messages += 1
        if self.limit is None or len(self.kept) < self.limit:
            bisect.insort(self.kept, arrow, key=_number)
        elif self.kept and arrow.number < self.kept[-1].number:
            # (a deferred request decided late: it goes before what it displaces)
            bisect.insort(self.kept, arrow, key=_number)
            self.kept.pop()
            self.omitted += 1
        else:
            self.omitted += 1

    def _in_session(self, arrow: Arrow) -> bool:
        return arrow.session is not None and self.session in (
            arrow.session,
            _renamed(arrow.link, arrow.session),
        )

    def finish(self) -> SequenceView:
        last = self.kept[-1].number if self.omitted and self.kept else math.inf
        gaps = [gap for gap in self.gaps if gap.number < last]
        items: list[Arrow | Gap] = sorted([*self.kept, *gaps], key=_number)
        shown = {arrow.number: arrow for arrow in self.kept}
        pairs = 0
        sessions: dict[str, None] = {}
        client_sessions = {
            arrow.session
            for arrow in self.kept
            if arrow.session is not None and not arrow.link.startswith("agent:")
        }
        for arrow in self.kept:
            arrow.group = _group(arrow, client_sessions)
            if arrow.group is not None:
                sessions.setdefault(arrow.group)
            if arrow.kind == "request" and arrow.partner in shown:
                arrow.pair = pairs
                pairs += 1
            elif arrow.kind in ("result", "error") and arrow.partner in shown:
                arrow.pair = shown[arrow.partner].pair
        lanes, lane_of = _lanes([arrow.link for arrow in self.kept])
        return SequenceView(
            lanes=lanes,
            items=tuple(items),
            start=self.start,
            messages=self.messages,
            omitted=self.omitted,
            limit=self.limit,
            dropped=self.dropped,
            bad=self.bad,
            sessions=tuple(sessions),
            session=self.session,
            lane_of=lane_of,
        )


def _renamed(link: str, sid: str) -> str | None:
    """What the bridge would have renamed an agent's session id to (None: not an agent's)."""
    agent = link.removeprefix("agent:")
    return f"{sid}~{agent}" if agent != link else None


def _group(arrow: Arrow, client_sessions: set[str]) -> str | None:
    if arrow.session is None:
        return None
    renamed = _renamed(arrow.link, arrow.session)
    return renamed if renamed is not None and renamed in client_sessions else arrow.session


def _number(item: Arrow | Gap) -> int:
    return item.number


def _other(direction: str) -> str:
    return "out" if direction == "in" else "in"


def _arrow(number: int, t: float, link: str, direction: str, msg: object) -> Arrow:
    """A message's arrow, as far as the message alone tells (pairing adds the rest)."""
    arrow = Arrow(number, t, link, direction, "other", "?", "", None, None, "", msg)
    if not isinstance(msg, dict):
        arrow.summary = "(not a JSON object)"
        return arrow
    if set(msg) == {"raw"}:
        arrow.kind, arrow.label = "raw", "not JSON"
        arrow.summary = _excerpt(msg["raw"])
        return arrow
    if "id" in msg:
        arrow.id = json.dumps(msg["id"])
    params = msg.get("params")
    params = params if isinstance(params, dict) else {}
    method = msg.get("method")
    if isinstance(method, str):
        arrow.kind = "request" if "id" in msg else "notification"
        arrow.label = arrow.method = method
        arrow.session = session_of(params)
        arrow.summary = request_summary(method, params, width=SUMMARY_WIDTH)
        return arrow
    if "result" in msg or "error" in msg:
        arrow.kind = "error" if "error" in msg else "result"
        arrow.label = arrow.kind
        result = msg.get("result")
        arrow.session = session_of(result) if isinstance(result, dict) else None
        arrow.summary = _answer_summary("", msg)
        if arrow.id is None:
            arrow.id = "null"
    return arrow


def _answer_summary(method: str, msg: object) -> str:
    return response_summary(method, msg, width=SUMMARY_WIDTH) if isinstance(msg, dict) else ""


def _excerpt(value: object) -> str:
    text = str(value).replace("\n", "⏎")
    return text if len(text) <= SUMMARY_WIDTH else text[: SUMMARY_WIDTH - 1] + "…"


def _shared(link: str) -> str:
    """The key of the lane that the peers past :data:`MAX_LANES` share."""
    return "agent:*" if link.startswith("agent:") else "client:*"


def _lanes(links: Iterable[str]) -> tuple[tuple[Lane, ...], dict[str, int]]:
    """
    The lanes of these links: clients left of the bridge, agents right, each side in the order
    they first appear; when there are too many, each side's last lane is shared.
    """
    clients: dict[str, None] = {}
    agents: dict[str, None] = {}
    for link in links:
        (agents if link.startswith("agent:") else clients).setdefault(link)
    room = MAX_LANES - 1
    client_room = min(len(clients), max(room - len(agents), room // 2))
    agent_room = min(len(agents), room - client_room)
    lanes = [
        *_side(list(clients), client_room, "client"),
        Lane(BRIDGE, "bridge", "bridge"),
        *_side(list(agents), agent_room, "agent"),
    ]
    lane_of = {lane.key: i for i, lane in enumerate(lanes)}
    return tuple(lanes), lane_of


def _side(links: list[str], room: int, kind: Literal["client", "agent"]) -> list[Lane]:
    def lane(link: str) -> Lane:
        return Lane(link, kind, link.removeprefix(f"{kind}:"))

    if len(links) <= room:
        return [lane(link) for link in links]
    own = [lane(link) for link in links[: room - 1]]
    rest = len(links) - len(own)
    return [*own, Lane(f"{kind}:*", kind, f"{rest} more {kind}s")]
