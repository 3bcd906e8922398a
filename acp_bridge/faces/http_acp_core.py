"""
ACP over Streamable HTTP on the daemon's ACP path, pure: what a POST, a GET or a DELETE asks
for and whether it may, which stream each message of the bridge goes on, and how a stream is
resumed. ``faces.http_acp`` waits and writes; this decides.

The wire (the transports RFD, as the TypeScript and Python SDKs' clients speak it):

- ``POST`` carries one client message (``Content-Type: application/json``, else **415**; a
  body that is not a JSON object: **400**, a batch: **501**). ``initialize`` without an
  ``Acp-Connection-Id`` opens a connection: answered **200** with the JSON answer and the
  new ``Acp-Connection-Id``. Anything else needs the header (**400**; unknown: **404**;
  ended: **410**) and is answered **202** at once, its answer coming on a stream.
  ``session/prompt``, ``cancel``, ``set_mode``, ``set_config_option`` and ``close`` need
  ``Acp-Session-Id`` too (**400**), which must name the ``sessionId`` of the params
  (**400**). A message about a session another live connection holds is **409**, except
  ``session/load`` and ``session/resume``, which take it over (as over WebSocket) or, with
  ``_meta.acp_bridge.watch``, watch it; a watcher's messages about it are not refused here
  (the bridge refuses what only the owner may do, ``-32002``).
- ``GET`` with ``Accept: text/event-stream`` (else **406**) and ``Acp-Connection-Id``
  opens the connection's stream; with ``Acp-Session-Id`` too, that session's stream
  (**409** past :attr:`Limits.max_streams`). Not refused for a session another connection
  holds: it carries nothing of it until this connection takes it over or watches it, and the
  TypeScript SDK's client opens a session's stream before it POSTs the load that does so.
  A newer GET for a stream replaces the reader it had.
- ``DELETE`` with ``Acp-Connection-Id`` ends the connection (**202**); its sessions detach.

Routing (:meth:`Connection.route`): a message of a session (its ``params.sessionId``, or for an
answer the session of the request it answers, a request of a previous connection that a load or
resume said is owed here included) goes on that session's stream once the client opened one on
this connection, else on the connection's stream; so does anything else. Answers to
``session/new``, ``session/load`` and ``session/fork`` go on the connection's stream (the RFD:
the client may not have the session's stream yet). Where a session's messages change streams,
the later ones are held until the earlier ones are written (:class:`Event` ``after``), so they
leave in order. A ``$/cancel_request`` (no ``sessionId``) follows the request it withdraws: a
client never sees a request withdrawn before it sees the request (another client answered it
first: a watcher that approves, or the owner).

Resumable streams (beyond the RFD): every event has an ``id:``. On a session's stream it is
the session's update number (``_meta.acp_bridge.seq``, the journal's) for an update, and
``SEQ.N`` for the N-th other message after update SEQ; on the connection's stream, a count.
Events written are kept (:attr:`Limits.retention_bytes` per connection, the oldest dropped
first); a GET with ``Last-Event-ID`` resumes after that event, nothing lost, nothing
repeated. Past what is kept: a session's stream is **409** (reload it: ``session/load`` with
``_meta.acp_bridge.after_seq``), the connection's **410** (the connection ends).

Bounds: events not yet written, :attr:`Limits.buffer_bytes` per connection (past it the
service stops taking the bridge's messages: a client that does not read is cut off as over
WebSocket); streams per connection, :attr:`Limits.max_streams`; answers owed,
:attr:`Limits.max_routes`.

Pure: no trio, no socket, no clock (fenced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import collections
import enum
import itertools
from typing import TYPE_CHECKING, Any, Final, Generic, TypeAlias, TypeVar

import attrs
import orjson

from acp_bridge.http.wire import Response, plain
from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps, loads

if TYPE_CHECKING:
    from acp_bridge.http.wire import RequestHead
    from acp_bridge.protocol.jsonrpc import JsonObject

__all__ = [
    "CONNECTION_HEADER",
    "KEEPALIVE",
    "SESSION_HEADER",
    "Captured",
    "Connection",
    "EventId",
    "Limits",
    "Owner",
    "Posted",
    "StreamAsk",
    "Table",
    "judge_delete",
    "judge_get",
    "judge_post",
    "parse_event_id",
    "render_event_id",
    "session_refusal",
]

CONNECTION_HEADER: Final = "Acp-Connection-Id"
SESSION_HEADER: Final = "Acp-Session-Id"
EVENT_STREAM: Final = "text/event-stream"
#: An SSE comment: keeps proxies from timing a quiet stream out, and finds a dead reader.
KEEPALIVE: Final = b":\n\n"
#: Requests that must carry ``Acp-Session-Id`` (what both SDKs' clients send it with).
SESSION_HEADER_METHODS: Final = frozenset(
    {
        "session/prompt",
        "session/cancel",
        "session/set_mode",
        "session/set_config_option",
        "session/close",
    }
)
#: Requests that may name a session another connection holds: they take it over.
TAKEOVER_METHODS: Final = frozenset({"session/load", "session/resume"})
#: Requests answered on the connection's stream: the client may not have the session's yet.
CONNECTION_ANSWERED: Final = frozenset({"session/new", "session/load", "session/fork"})
#: The bridge withdraws a request it made (another client answered it, the turn ended...).
CANCEL_REQUEST: Final = "$/cancel_request"
#: Bytes an event costs beyond its data (its objects), counted against the bounds.
EVENT_OVERHEAD: Final = 128
#: Connection ids remembered after their connection ended (answered 410, not 404).
REMEMBERED_ENDED: Final = 1024
#: The longest id a header may carry (the TypeScript SDK's server allows as long).
MAX_ID_TEXT: Final = 1024

#: An event's id: (update number, order after it); rendered ``MAJOR`` or ``MAJOR.MINOR``.
EventId: TypeAlias = tuple[int, int]
ZERO: Final[EventId] = (0, 0)
#: A stream: None for the connection's, else the session id.
StreamKey: TypeAlias = "str | None"

T = TypeVar("T")


def render_event_id(event_id: EventId) -> str:
    major, minor = event_id
    return f"{major}.{minor}" if minor else str(major)


def parse_event_id(text: str) -> EventId | None:
    """An id as :func:`render_event_id` writes it; None for anything else."""
    text = text.strip()
    if len(text) > 40:
        return None
    major, dot, minor = text.partition(".")
    if not (major.isascii() and major.isdigit()) or (
        dot and not (minor.isascii() and minor.isdigit())
    ):
        return None
    return int(major), int(minor) if dot else 0


def sse_event(event_id: EventId, line: bytes) -> bytes:
    """One SSE event: its id and one JSON message (a line: no CR or LF inside)."""
    data = line[:-1] if line.endswith(b"\n") else line
    return b"id: " + render_event_id(event_id).encode() + b"\ndata: " + data + b"\n\n"


def _headers(head: RequestHead, *names: str) -> list[str | None] | Response:
    """Headers that may appear once each: their values (None: absent), or 400."""
    out: list[str | None] = []
    for name in names:
        values = head.values(name.lower())
        if len(values) > 1:
            return plain(400, f"bad request: more than one {name}")
        value = values[0].strip() if values else None
        if value is not None and (not value or len(value) > MAX_ID_TEXT):
            return plain(400, f"bad request: malformed {name}")
        out.append(value)
    return out


# --------------------------------------------------------------------------- what is asked


@attrs.frozen
class Posted:
    """
    A POST's message, checked for form.

    Attributes:
        msg: the message.
        line: the message as one line, for the bridge.
        connection_id: the connection it is for; None: an ``initialize`` opening one.
        session: the session it is about (``Acp-Session-Id``, or ``params.sessionId``).
        method: its method; None for an answer.
    """

    msg: JsonObject
    line: bytes
    connection_id: str | None
    session: str | None
    method: str | None


def judge_post(head: RequestHead, body: bytes) -> Posted | Response:
    """The message a POST carries, or why it is refused (see the module's docstring)."""
    kinds = head.values("content-type")
    if len(kinds) != 1 or kinds[0].split(";", 1)[0].strip().lower() != "application/json":
        return plain(415, "unsupported media type: a POST carries application/json")
    try:
        msg = loads(body)
    except JsonRpcError:
        return plain(400, "bad request: the body is not JSON")
    if isinstance(msg, list):
        return plain(501, "not implemented: JSON-RPC batches")
    if not isinstance(msg, dict):
        return plain(400, "bad request: the body is not a JSON-RPC message")
    found = _headers(head, CONNECTION_HEADER, SESSION_HEADER)
    if isinstance(found, Response):
        return found
    connection, session_header = found
    method = msg.get("method")
    method = method if isinstance(method, str) else None
    if method == "initialize" and "id" in msg:
        if connection is not None:
            return plain(400, "bad request: initialize opens a connection: no Acp-Connection-Id")
        if msg["id"] is None:
            return plain(400, "bad request: initialize needs an id")
        connection = None
    elif connection is None:
        return plain(400, "bad request: Acp-Connection-Id is required (initialize first)")
    params = msg.get("params")
    named = params.get("sessionId") if method is not None and isinstance(params, dict) else None
    named = named if isinstance(named, str) else None
    if session_header is not None and named is not None and session_header != named:
        return plain(400, "bad request: Acp-Session-Id is not the params' sessionId")
    if method in SESSION_HEADER_METHODS and session_header is None:
        return plain(400, f"bad request: {method} needs Acp-Session-Id")
    # (One line for the bridge: a body may be pretty-printed; the trace writes lines.)
    line = body if b"\n" not in body and b"\r" not in body else dumps(msg)
    return Posted(msg, line, connection, session_header or named, method)


class Owner(enum.Enum):
    """Who holds a session, as seen from the connection asking about it."""

    #: this connection
    THIS = "this"
    #: nobody who can hear it: detached, stored, unknown, or held by a connection without a
    #: reader (an HTTP connection with no stream open)
    NOBODY = "nobody"
    #: another live connection, and this one watches the session (``_meta.acp_bridge.watch``)
    WATCHING = "watching"
    #: another live connection
    OTHER = "other"


_ELSEWHERE: Final = plain(
    409,
    "conflict: another connection holds this session; take it over with session/load or "
    "session/resume",
)


def session_refusal(posted: Posted, owner: Owner) -> Response | None:
    """
    409 for a message about a session another live connection holds (but a load or resume:
    a takeover, or a watch). A watcher's messages go on: the bridge refuses what only the
    owner may do (-32002, with the take-over hint, as over WebSocket) and takes its answers to
    the permission requests it was shown.
    """
    if owner is Owner.OTHER and posted.method not in TAKEOVER_METHODS:
        return _ELSEWHERE
    return None


@attrs.frozen
class StreamAsk:
    """A GET for a stream: the connection, the session (None: the connection's stream), and
    the last event the client has (``Last-Event-ID``; None: carry on from where it is)."""

    connection_id: str
    session: str | None
    after: EventId | None


def judge_get(head: RequestHead) -> StreamAsk | Response:
    """The stream a GET (not a WebSocket upgrade) asks for, or why it is refused."""
    if EVENT_STREAM not in {t.split(";", 1)[0] for t in head.tokens("accept")}:
        return plain(
            406, "not acceptable: Accept: text/event-stream (or a WebSocket upgrade) is required"
        )
    found = _headers(head, CONNECTION_HEADER, SESSION_HEADER, "Last-Event-ID")
    if isinstance(found, Response):
        return found
    connection, session, last = found
    if connection is None:
        return plain(400, "bad request: Acp-Connection-Id is required")
    after = None
    if last is not None:
        after = parse_event_id(last)
        if after is None:
            return plain(400, "bad request: malformed Last-Event-ID")
    return StreamAsk(connection, session, after)


def judge_delete(head: RequestHead) -> str | Response:
    """The connection a DELETE ends, or why it is refused."""
    found = _headers(head, CONNECTION_HEADER)
    if isinstance(found, Response):
        return found
    connection = found[0]
    if connection is None:
        return plain(400, "bad request: Acp-Connection-Id is required")
    return connection


# --------------------------------------------------------------------------- connections


class Table(Generic[T]):
    """The live connections by id, and the ids of those that ended lately (410, not 404)."""

    def __init__(self) -> None:
        self.live: dict[str, T] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self.live)

    def add(self, connection_id: str, item: T) -> None:
        self.live[connection_id] = item

    def find(self, connection_id: str) -> T | Response:
        item = self.live.get(connection_id)
        if item is not None:
            return item
        why = self._ended.get(connection_id)
        if why is not None:
            return plain(410, f"gone: this connection ended ({why[:120]})")
        return plain(404, "not found: unknown Acp-Connection-Id")

    def end(self, connection_id: str, why: str) -> None:
        if self.live.pop(connection_id, None) is not None:
            self._ended[connection_id] = why
            while len(self._ended) > REMEMBERED_ENDED:
                self._ended.popitem(last=False)


@attrs.frozen
class Limits:
    """
    One HTTP connection's bounds.

    Attributes:
        max_streams: streams open or kept at once, the connection's own included.
        buffer_bytes: events not yet written, all streams together: past it the connection
            takes no more of the bridge's messages.
        retention_bytes: events written, kept for ``Last-Event-ID`` (the oldest go first).
        max_routes: requests whose answers are owed, each way; past it the oldest are
            forgotten (their answers, or their withdrawals, go on the connection's stream).
    """

    max_streams: int = 16
    buffer_bytes: int = 8 * 1024 * 1024
    retention_bytes: int = 8 * 1024 * 1024
    max_routes: int = 4096


class Event:
    """
    One SSE event.

    Attributes:
        id: its id on its stream.
        data: the SSE bytes (id and data lines).
        order: its place among the connection's events (the oldest written are dropped first).
        after: (stream, count): not written before that stream has handed out that many events
            (the session's messages that went elsewhere before).
        cost: what it counts for against the bounds (its bytes and its objects').
    """

    __slots__ = ("after", "cost", "data", "id", "order")

    def __init__(
        self, event_id: EventId, data: bytes, order: int, after: tuple[StreamKey, int] | None
    ) -> None:
        self.id = event_id
        self.data = data
        self.order = order
        self.after = after
        self.cost = len(data) + EVENT_OVERHEAD


class Stream:
    """
    One stream's events: ``kept`` were handed to a reader (held for resumption), ``waiting``
    were not yet. ``handed`` counts the events ever handed out (the kept ones and those
    dropped before them); a resumption moves events back to ``waiting``.
    """

    __slots__ = (
        "after",
        "generation",
        "handed",
        "horizon",
        "kept",
        "key",
        "last",
        "waiting",
    )

    def __init__(self, key: StreamKey, after: tuple[StreamKey, int] | None = None) -> None:
        self.key = key
        self.kept: collections.deque[Event] = collections.deque()
        self.waiting: collections.deque[Event] = collections.deque()
        self.handed = 0
        self.last: EventId = ZERO
        #: the id of the last event dropped from ``kept`` (resumption before it is impossible)
        self.horizon: EventId | None = None
        #: the reader's generation; 0: no reader
        self.generation = 0
        #: nothing of this stream is handed out before that stream handed out that many
        self.after = after

    @property
    def appended(self) -> int:
        return self.handed + len(self.waiting)

    def next_id(self, seq: int) -> EventId:
        major, minor = self.last
        if self.key is None:
            self.last = (major + 1, 0)
        elif seq > major:
            self.last = (seq, 0)
        else:
            self.last = (major, minor + 1)
        return self.last


@attrs.frozen
class Captured:
    """The answer to the connection's ``initialize``: the POST answers it, no stream."""

    line: bytes


@attrs.frozen
class _Route:
    method: str
    session: str | None


def _id_key(value: Any) -> tuple[str, Any] | None:
    """A JSON-RPC id as a dict key (1 and 1.0 and True stay apart); None: not an id."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return type(value).__name__, value


def _update_seq(params: Any) -> int:
    """The bridge's number of a relayed update (``_meta.acp_bridge.seq``); 0: none."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    ours = meta.get("acp_bridge") if isinstance(meta, dict) else None
    seq = ours.get("seq") if isinstance(ours, dict) else None
    return seq if type(seq) is int and seq > 0 else 0


class Connection:
    """
    One HTTP connection's streams: what goes where, what is written and kept, who reads.

    Args:
        connection_id: its ``Acp-Connection-Id``.
        limits: its bounds.
        initialize: the id of the ``initialize`` that opened it (its answer is
            :class:`Captured`).
    """

    def __init__(self, connection_id: str, limits: Limits, *, initialize: object) -> None:
        self.id = connection_id
        self.limits = limits
        self.streams: dict[StreamKey, Stream] = {None: Stream(None)}
        self._routes: collections.OrderedDict[tuple[str, Any], _Route] = collections.OrderedDict()
        #: the bridge's requests about a session not yet answered: their session, by id
        self._asked: collections.OrderedDict[tuple[str, Any], str] = collections.OrderedDict()
        self._initialize = _id_key(initialize)
        self._orders = itertools.count()
        self._generations = itertools.count(1)
        #: bytes of events not yet handed out, and of events handed out and kept
        self.unwritten = 0
        self.retained = 0
        #: streams with a reader now
        self.readers = 0

    @property
    def full(self) -> bool:
        """Events not yet written reach ``buffer_bytes``: take no more messages."""
        return self.unwritten >= self.limits.buffer_bytes

    # ------------------------------------------------------------------ the client's side

    def note_request(self, posted: Posted) -> None:
        """A client request goes to the bridge: its answer will follow its session."""
        key = _id_key(posted.msg.get("id"))
        if key is None:
            return
        if posted.method is None:
            self._asked.pop(key, None)  # (answered: no withdrawal will come)
            return
        self._routes[key] = _Route(posted.method, posted.session)
        self._routes.move_to_end(key)
        while len(self._routes) > self.limits.max_routes:
            self._routes.popitem(last=False)

    # ------------------------------------------------------------------ the bridge's side

    def route(self, line: bytes) -> StreamKey | Captured:
        """Put one message of the bridge on its stream; the stream it went on."""
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            msg = None
        session: str | None = None
        seq = 0
        target: StreamKey = None
        if isinstance(msg, dict) and "method" not in msg:
            key = _id_key(msg.get("id"))
            if key is not None and key == self._initialize:
                self._initialize = None
                return Captured(line)
            route = self._routes.pop(key, None) if key is not None else None
            if route is not None and route.session is not None:
                session = route.session
                if route.method not in CONNECTION_ANSWERED and session in self.streams:
                    target = session
                if route.method in TAKEOVER_METHODS:
                    self._owed(session, msg.get("result"))
        elif isinstance(msg, dict):
            params = msg.get("params")
            sid = params.get("sessionId") if isinstance(params, dict) else None
            method = msg.get("method")
            if method == CANCEL_REQUEST and isinstance(params, dict):
                # (no sessionId: it follows the request it withdraws, and comes after it)
                key = _id_key(params.get("requestId"))
                sid = self._asked.pop(key, None) if key is not None else None
            if isinstance(sid, str):
                session = sid
                target = sid if sid in self.streams else None
                if method == "session/update":
                    seq = _update_seq(params)
                elif "id" in msg:
                    self._ask(msg["id"], sid)
        after = None
        if target is None and session is not None:
            slot = self.streams.get(session)
            if slot is not None and slot.waiting:
                after = (session, slot.appended)
        self._append(target, line, seq, after)
        return target

    def _ask(self, request_id: Any, session: str) -> None:
        """The bridge asks the client something about ``session`` (a permission, a file):
        a ``$/cancel_request`` of it goes where it went."""
        key = _id_key(request_id)
        if key is not None:
            self._asked[key] = session
            self._asked.move_to_end(key)
            while len(self._asked) > self.limits.max_routes:
                self._asked.popitem(last=False)

    def _owed(self, session: str, result: Any) -> None:
        """A load or resume took a session over: the answers still owed to the requests the
        previous connection made about it (``_meta.acp_bridge.pending``) come here now, and
        follow the session."""
        meta = result.get("_meta") if isinstance(result, dict) else None
        ours = meta.get("acp_bridge") if isinstance(meta, dict) else None
        pending = ours.get("pending") if isinstance(ours, dict) else None
        for request_id in pending if isinstance(pending, list) else ():
            key = _id_key(request_id)
            if key is not None:
                self._routes[key] = _Route("session/prompt", session)
        while len(self._routes) > self.limits.max_routes:
            self._routes.popitem(last=False)

    def _append(
        self, key: StreamKey, line: bytes, seq: int, after: tuple[StreamKey, int] | None
    ) -> None:
        stream = self.streams[key]
        event_id = stream.next_id(seq)
        event = Event(event_id, sse_event(event_id, line), next(self._orders), after)
        stream.waiting.append(event)
        self.unwritten += event.cost

    # ------------------------------------------------------------------ readers

    def attach(self, key: StreamKey, after: EventId | None) -> int | Response:
        """
        A reader for stream ``key`` (created if need be), resuming after event ``after``
        (None: from where the stream is); its generation, or the refusal. A reader the stream
        had is replaced (its :meth:`take` says so).
        """
        stream = self.streams.get(key)
        if stream is None:
            if len(self.streams) >= self.limits.max_streams:
                return plain(409, "conflict: too many streams on this connection")
            if after is not None and after != ZERO:
                return _past(key, after)
            conn = self.streams[None]
            # What this session sent on the connection's stream goes first.
            stream = self.streams[key] = Stream(key, (None, conn.appended))
        if after is not None:
            refused = self._resume(stream, after)
            if refused is not None:
                return refused
        if not stream.generation:
            self.readers += 1
        stream.generation = next(self._generations)
        return stream.generation

    def release(self, key: StreamKey, generation: int) -> None:
        """The reader of that generation left (a newer one may have replaced it)."""
        stream = self.streams.get(key)
        if stream is not None and stream.generation == generation:
            stream.generation = 0
            self.readers -= 1

    def _resume(self, stream: Stream, after: EventId) -> Response | None:
        """Make ``after`` the last event handed out, or refuse: not one of ours, or dropped."""
        if stream.horizon is not None and after < stream.horizon:
            return _past(stream.key, after)
        if after > stream.last:
            return plain(400, "bad request: Last-Event-ID is not an event of this stream")
        events = [*stream.kept, *stream.waiting]
        position = next((i for i in range(len(events) - 1, -1, -1) if events[i].id <= after), -1)
        found = events[position].id if position >= 0 else stream.horizon or ZERO
        if found != after:
            return plain(400, "bad request: Last-Event-ID is not an event of this stream")
        kept = position + 1
        while len(stream.kept) > kept:
            event = stream.kept.pop()
            stream.waiting.appendleft(event)
            stream.handed -= 1
            self.retained -= event.cost
            self.unwritten += event.cost
        while len(stream.kept) < kept:
            event = stream.waiting.popleft()
            stream.kept.append(event)
            stream.handed += 1
            self.unwritten -= event.cost
            self.retained += event.cost
        self._trim()
        return None

    def take(self, key: StreamKey, generation: int, max_bytes: int) -> list[bytes] | None:
        """
        The next events of stream ``key`` for its reader (at least one if any may go, up to
        ``max_bytes``), now handed out and kept; [] when none may go now; None when that
        reader was replaced or the stream is gone.
        """
        stream = self.streams.get(key)
        if stream is None or stream.generation != generation:
            return None
        if stream.after is not None:
            if not self._done(stream.after):
                return []
            stream.after = None
        out: list[bytes] = []
        size = 0
        waiting = stream.waiting
        while waiting and size < max_bytes:
            event = waiting[0]
            if event.after is not None and not self._done(event.after):
                break
            waiting.popleft()
            stream.kept.append(event)
            out.append(event.data)
            size += len(event.data)
            cost = event.cost
            self.unwritten -= cost
            self.retained += cost
        stream.handed += len(out)
        if self.retained > self.limits.retention_bytes:
            self._trim()
        return out

    def _done(self, after: tuple[StreamKey, int]) -> bool:
        """Whether that stream handed out that many (or cannot: no reader, or gone)."""
        key, count = after
        stream = self.streams.get(key)
        return stream is None or not stream.generation or stream.handed >= count

    def _trim(self) -> None:
        """Drop the oldest kept events until the kept ones fit ``retention_bytes``."""
        while self.retained > self.limits.retention_bytes:
            oldest: Stream | None = None
            for stream in self.streams.values():
                if stream.kept and (oldest is None or stream.kept[0].order < oldest.kept[0].order):
                    oldest = stream
            if oldest is None:
                return
            event = oldest.kept.popleft()
            oldest.horizon = event.id
            self.retained -= event.cost

    def ready(self, key: StreamKey) -> bool:
        """Whether stream ``key`` has an event its reader may take now."""
        stream = self.streams.get(key)
        if stream is None or not stream.waiting:
            return False
        if stream.after is not None and not self._done(stream.after):
            return False
        after = stream.waiting[0].after
        return after is None or self._done(after)


def _past(key: StreamKey, after: EventId) -> Response:
    """The refusal of a resumption past what is kept."""
    if key is None:
        return plain(
            410,
            f"gone: event {render_event_id(after)} is no longer kept; the connection ends "
            "(open a new one and load its sessions)",
        )
    return plain(
        409,
        f"conflict: event {render_event_id(after)} of this session's stream is no longer kept; "
        f"load the session again (session/load with _meta.acp_bridge.after_seq {after[0]})",
    )
