"""
Wire traces: every message crossing the bridge as JSON lines, and a readable rendering.

``--trace FILE`` (``stdio``, ``serve``) writes one record per message::

    {"t": 1718000000.123456, "link": "client:stdio", "dir": "in", "msg": {...}}

``t`` is Unix time; ``link`` is ``client:<name>`` or ``agent:<name>``; ``dir`` is ``in``
(arrived at the bridge) or ``out`` (queued for that peer); ``msg`` is the message as parsed
JSON, or ``{"raw": TEXT}`` when the line is not JSON. Records that could not be queued are
counted, and ``{"t": ..., "dropped": N}`` stands where they went missing. Secrets the
redactor knows (agents' secret env values, MCP server secrets, the daemon's token) are
replaced with ``***``.

:class:`WireTrace` is the tracer the bridge calls for every message: it never blocks and
never raises. :func:`render_trace` (pure) is ``acp-bridge trace show``; its one-line
summaries of messages are ``observe.summary``'s, shared with the sequence view
(``trace show --html``: ``observe.sequence``, ``observe.sequence_html``).

Backpressure:
    None towards the bridge, by design: records wait in a queue of at most
    :data:`MAX_RECORDS` records and :data:`MAX_QUEUED_BYTES` bytes; past either, records are
    dropped and counted. One writer task takes them in batches and formats, redacts and
    writes each batch in a worker thread, flushing after every batch.

Recent records:
    The writer keeps the latest records it wrote, as written (redacted JSON lines), at most
    :data:`RECENT_RECORDS` records and :data:`RECENT_BYTES` bytes, the oldest let go first:
    :meth:`WireTrace.recent` (the console's sequence view of a session). They cost the hot
    path nothing: the writer formats every record anyway.

Resource handling:
    :func:`open_wire_trace` runs the writer for the duration of its block; on the way out
    what is queued is written (shielded: at most the queue's bounds), then the file closed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Final, NamedTuple

import attrs
import structlog
import trio

from acp_bridge.observe.summary import excerpt, request_summary, response_summary, session_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator

    from acp_bridge.observe.redact import Redactor
    from acp_bridge.protocol.jsonrpc import JsonObject

__all__ = [
    "MAX_QUEUED_BYTES",
    "MAX_RECORDS",
    "RECENT_BYTES",
    "RECENT_RECORDS",
    "TraceStatistics",
    "WireTrace",
    "format_record",
    "main_trace",
    "open_trace_file",
    "open_wire_trace",
    "render_trace",
]

logger = structlog.get_logger("acp_bridge.trace")

#: Records waiting to be written, at most; more are dropped (and counted).
MAX_RECORDS: Final = 100_000
#: Bytes of messages waiting to be written, at most (a single message always fits).
MAX_QUEUED_BYTES: Final = 64 * 1024 * 1024
#: A batch handed to the writer thread: at most this many records, or about this many bytes.
BATCH_RECORDS: Final = 1024
BATCH_BYTES: Final = 1024 * 1024
#: Written records kept in memory for :meth:`WireTrace.recent`, at most (by count, by bytes).
RECENT_RECORDS: Final = 4096
RECENT_BYTES: Final = 4 * 1024 * 1024

_SETUP_KEY: Final = b'"mcpServers"'


class _Message(NamedTuple):
    t: float
    link: str
    direction: str
    data: bytes


class _Dropped(NamedTuple):
    t: float
    n: int


_Record = _Message | _Dropped


@attrs.frozen
class TraceStatistics:
    """
    Attributes:
        queued: records waiting to be written.
        queued_bytes: bytes of those records' messages.
        written: records written (drop markers included).
        dropped: messages not recorded (queue full, or the file failed).
    """

    queued: int
    queued_bytes: int
    written: int
    dropped: int


def open_trace_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """
    Open (create or truncate) a trace file, readable by its owner only: traces hold prompts.

    Blocking; call it before the event loop, so a bad path fails at start-up.

    Raises:
        OSError: the file cannot be created or written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
    return os.fdopen(fd, "wb")


def format_record(record: _Record, redactor: Redactor | None) -> bytes:
    """One JSON line for a queued record, redacted. Pure (called in the writer thread)."""
    if isinstance(record, _Dropped):
        out: JsonObject = {"t": round(record.t, 6), "dropped": record.n}
    else:
        text = record.data.decode("utf-8", "replace").rstrip("\r\n")
        msg: Any
        try:
            msg = json.loads(text)
            if redactor is not None:
                msg = redactor.redact_json(msg)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to walk
            msg = {"raw": text}
        out = {"t": round(record.t, 6), "link": record.link, "dir": record.direction, "msg": msg}
    try:
        data = _dump_line(out, redactor, ascii_only=False)
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): keep it escaped
        data = _dump_line(out, redactor, ascii_only=True)
    except RecursionError:  # nested deeper than the encoder goes: kept as text
        assert isinstance(record, _Message)  # a count of dropped records is flat
        raw = record.data.decode("utf-8", "replace").rstrip("\r\n")
        data = _dump_line({**out, "msg": {"raw": raw}}, redactor, ascii_only=True)
    return data + b"\n"


def _dump_line(out: JsonObject, redactor: Redactor | None, *, ascii_only: bool) -> bytes:
    line = json.dumps(out, ensure_ascii=ascii_only, separators=(",", ":"))
    if redactor is not None:
        # Again on the whole line: a secret in a key, or split by JSON escaping differently.
        line = redactor.redact(line)
    return line.encode()


class WireTrace:
    """
    The bridge's tracer: ``trace(link, direction, data)`` queues a record, never waits.

    Run :meth:`run` (or use :func:`open_wire_trace`) to write what is queued.

    Args:
        file: where the JSON lines go (binary, opened for writing); closed by :meth:`run`.
        redactor: hides known secrets (the bridge's); None records messages as they are.
        max_records: the queue's bound in records.
        max_bytes: the queue's bound in message bytes.
        clock: the time of each record (Unix time).
    """

    def __init__(
        self,
        file: IO[bytes],
        *,
        redactor: Redactor | None,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_QUEUED_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._file = file
        self._redactor = redactor
        self._max_bytes = max_bytes
        self._clock = clock
        self._send, self._receive = trio.open_memory_channel[_Record](max_records)
        self._queued_bytes = 0
        #: drops since the last record that made it into the queue (owed a marker)
        self._owed = 0
        self._dropped = 0
        self._written = 0
        self._failed = False
        #: records taken into the queue, and records written or given up since: for wait_flushed
        self._accepted = 0
        self._settled = 0
        self._finished = False
        self._progress = trio.Event()
        #: the latest records written, as written (:meth:`recent`)
        self._recent: collections.deque[bytes] = collections.deque(maxlen=RECENT_RECORDS)
        self._recent_bytes = 0

    def __call__(self, link: str, direction: str, data: bytes) -> None:
        """Queue one message; when there is no room, count it. Never blocks or raises."""
        t = self._clock()
        size = len(data)
        try:
            if self._queued_bytes and self._queued_bytes + size > self._max_bytes:
                raise trio.WouldBlock
            if self._owed:
                self._send.send_nowait(_Dropped(t, self._owed))
                self._owed = 0
                self._accepted += 1
            self._send.send_nowait(_Message(t, link, direction, data))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self._owed += 1
            self._dropped += 1
            return
        self._accepted += 1
        self._queued_bytes += size

    def statistics(self) -> TraceStatistics:
        return TraceStatistics(
            queued=self._send.statistics().current_buffer_used,
            queued_bytes=self._queued_bytes,
            written=self._written,
            dropped=self._dropped,
        )

    def recent(self) -> list[bytes]:
        """The latest records written (JSON lines, redacted, oldest first): at most
        :data:`RECENT_RECORDS` of them and about :data:`RECENT_BYTES` bytes."""
        return list(self._recent)

    def _keep(self, lines: list[bytes]) -> None:
        recent = self._recent
        for line in lines[-RECENT_RECORDS:]:
            if len(recent) == RECENT_RECORDS:
                self._recent_bytes -= len(recent[0])  # (the deque lets it go on append)
            recent.append(line)
            self._recent_bytes += len(line)
        while self._recent_bytes > RECENT_BYTES and len(recent) > 1:
            self._recent_bytes -= len(recent.popleft())

    def close(self) -> None:
        """No more records: :meth:`run` writes what is queued, then ends."""
        self._send.close()

    async def wait_flushed(self) -> None:
        """Wait until every record queued so far is written (or given up: the file failed)."""
        target = self._accepted
        while self._settled < target and not self._finished:
            await self._progress.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """
        Write queued records until :meth:`close`, then close the file.

        A file that cannot be written is logged once; tracing stops there (later messages
        count as dropped) and the bridge goes on.

        Cancellation: what is already queued is still written, shielded (the queue's bounds
        bound it), and the file closed.
        """
        task_status.started()
        try:
            async for first in self._receive:
                batch = self._batch(first)
                if not await self._write(batch):
                    return
        finally:
            with trio.CancelScope(shield=True):
                rest = self._drain()
                if self._owed:
                    rest.append(_Dropped(self._clock(), self._owed))
                    self._owed = 0
                if rest and not self._failed:
                    await self._write(rest)
                await trio.to_thread.run_sync(self._file.close)
                self._finished = True
                self._progress.set()
                stats = self.statistics()
                log = logger.warning if stats.dropped else logger.info
                log("trace_closed", written=stats.written, dropped=stats.dropped)

    def _batch(self, first: _Record) -> list[_Record]:
        batch = [first]
        size = self._took(first)
        while len(batch) < BATCH_RECORDS and size < BATCH_BYTES:
            try:
                record = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            batch.append(record)
            size += self._took(record)
        return batch

    def _drain(self) -> list[_Record]:
        rest: list[_Record] = []
        while True:
            try:
                record = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return rest
            self._took(record)
            rest.append(record)

    def _took(self, record: _Record) -> int:
        size = len(record.data) if isinstance(record, _Message) else 0
        self._queued_bytes -= size
        return size

    async def _write(self, batch: list[_Record]) -> bool:
        self._learn_secrets(batch)
        try:
            # Shielded: a batch taken from the queue is written even when cancelled (or lost).
            with trio.CancelScope(shield=True):
                lines = await trio.to_thread.run_sync(self._write_sync, batch)
        except OSError as exc:
            self._failed = True
            logger.error("trace_write_failed", error=str(exc))
            lost = batch + self._drain()
            self._dropped += sum(isinstance(record, _Message) for record in lost)
            self._receive.close()  # from now on the tracer counts drops only
            self._settle(len(lost))
            return False
        self._written += len(batch)
        self._keep(lines)
        self._settle(len(batch))
        return True

    def _settle(self, count: int) -> None:
        self._settled += count
        self._progress.set()
        self._progress = trio.Event()

    def _write_sync(self, batch: list[_Record]) -> list[bytes]:
        redactor = self._redactor
        lines = [format_record(record, redactor) for record in batch]
        self._file.write(b"".join(lines))
        self._file.flush()
        return lines

    def _learn_secrets(self, batch: list[_Record]) -> None:
        """
        Register the MCP servers' secrets of session set-up messages before formatting:
        the bridge registers them when it forwards the request, which may be later than
        this batch is written (while the agent is still starting).
        """
        if self._redactor is None:
            return
        for record in batch:
            if isinstance(record, _Message) and _SETUP_KEY in record.data:
                with contextlib.suppress(ValueError, RecursionError):
                    msg = json.loads(record.data)
                    params = msg.get("params") if isinstance(msg, dict) else None
                    if isinstance(params, dict):
                        self._redactor.add_mcp_servers(params.get("mcpServers"))


@contextlib.asynccontextmanager
async def open_wire_trace(
    file: IO[bytes] | None, **options: Any
) -> AsyncIterator[WireTrace | None]:
    """
    A :class:`WireTrace` writing to ``file`` for the duration of the block (None: no trace).

    Pass it to the bridge as its ``tracer``. ``options`` go to :class:`WireTrace`.
    """
    if file is None:
        yield None
        return
    trace = WireTrace(file, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(trace.run)
        try:
            yield trace
        finally:
            trace.close()


# --- trace show: the pure rendering ------------------------------------------------------------

_CONNECTION: Final = "connection"


@attrs.define
class _Group:
    key: str
    first: float
    agents: set[str] = attrs.field(factory=set)
    lines: list[tuple[float, int, str]] = attrs.field(factory=list)


def render_trace(lines: Iterable[str], *, session: str | None = None) -> Iterator[str]:
    """
    Render trace records readably, grouped per session, one line per message. Pure.

    Memory: one short rendered line per message is held until the end (to group them).

    A message's session is its ``params.sessionId`` or ``result.sessionId``, or that of the
    request it answers; messages without one form the ``connection`` group. An agent's own
    id for a session the bridge renamed (``ID~agent``) is shown under the bridge's name.

    Args:
        lines: the trace file's lines.
        session: only this session's group.
    """
    start: float | None = None
    dropped = 0
    bad = 0
    order = 0
    #: (link, direction the request travelled, id) → (its session, method, entry index)
    requests: dict[tuple[str, str, str], tuple[str | None, str, int]] = {}
    entries: list[tuple[str, str | None, float, int, str]] = []
    client_sessions: set[str] = set()
    for text in lines:
        if not text.strip():
            continue
        try:
            record = json.loads(text)
            t = float(record["t"])
        except (ValueError, TypeError, KeyError):
            bad += 1
            continue
        if not isinstance(record, dict):
            bad += 1
            continue
        if start is None:
            start = t
        order += 1
        if "dropped" in record:
            dropped += _int(record["dropped"])
            line = f"{_stamp(t - start)}  !! {record['dropped']} messages not recorded (dropped)"
            entries.append(("", None, t, order, line))
            continue
        link, direction, msg = str(record.get("link")), str(record.get("dir")), record.get("msg")
        sid, line = _describe(link, direction, msg, requests, len(entries), entries)
        if sid is not None and link.startswith("client:"):
            client_sessions.add(sid)
        arrow = "→" if direction == "in" else "←"
        entries.append((link, sid, t, order, f"{_stamp(t - start)}  {link:<18} {arrow} {line}"))

    groups: dict[str, _Group] = {}
    for link, sid, t, n, line in entries:
        key = _group_key(link, sid, client_sessions)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(key, t)
        if link.startswith("agent:"):
            group.agents.add(link.removeprefix("agent:"))
        group.lines.append((t, n, line))

    if session is not None:
        groups = {k: g for k, g in groups.items() if k == session}
        if not groups:
            yield f"no messages of session {session} in this trace"
    for group in sorted(groups.values(), key=lambda g: (g.key != _CONNECTION, g.first)):
        if group.key == _CONNECTION:
            yield "== connection (messages without a session)"
        else:
            agents = ", ".join(sorted(group.agents)) or "?"
            yield f"== session {group.key} (agent {agents})"
        for _, _, line in sorted(group.lines):
            yield "  " + line
        yield ""
    if dropped:
        yield f"!! {dropped} messages were dropped while tracing (the writer fell behind)"
    if bad:
        yield f"!! {bad} lines were not trace records"


def _group_key(link: str, sid: str | None, client_sessions: set[str]) -> str:
    if sid is None:
        return _CONNECTION
    if link.startswith("agent:"):
        renamed = f"{sid}~{link.removeprefix('agent:')}"
        if renamed in client_sessions:
            return renamed
    return sid


def _describe(
    link: str,
    direction: str,
    msg: object,
    requests: dict[tuple[str, str, str], tuple[str | None, str, int]],
    index: int,
    entries: list[tuple[str, str | None, float, int, str]],
) -> tuple[str | None, str]:
    """
    (the message's session, its one-line description). A response that names the session
    its request did not (``session/new``) moves the request into that session too.
    """
    if not isinstance(msg, dict):
        return None, f"(not an object) {excerpt(json.dumps(msg))}"
    if set(msg) == {"raw"}:
        return None, f"(not JSON) {excerpt(str(msg['raw']))}"
    params = msg.get("params")
    params = params if isinstance(params, dict) else {}
    method = msg.get("method")
    if isinstance(method, str):
        sid = session_of(params)
        if "id" in msg:
            requests[(link, direction, _key(msg["id"]))] = (sid, method, index)
        summary = request_summary(method, params)
        return sid, f"{method}  {summary}".rstrip()
    asked = requests.pop((link, "out" if direction == "in" else "in", _key(msg.get("id"))), None)
    sid, method, asked_at = asked if asked is not None else (None, "", -1)
    result = msg.get("result")
    if isinstance(result, dict) and session_of(result) is not None:
        sid = session_of(result)
        if asked_at >= 0 and entries[asked_at][1] is None:
            request = entries[asked_at]
            entries[asked_at] = (request[0], sid, *request[2:])
    head = f"response id {json.dumps(msg.get('id'))}" + (f" ({method})" if method else "")
    return sid, f"{head}  {response_summary(method, msg)}".rstrip()


def _key(id_: object) -> str:
    return json.dumps(id_)


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _stamp(seconds: float) -> str:
    return f"+{seconds:.3f}s".rjust(9)


def main_trace(path: str, *, session: str | None = None) -> int:
    """``acp-bridge trace show FILE [--session ID]``: print the rendering; 1 if unreadable."""
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 (a with below)
    except OSError as exc:
        print(f"acp-bridge trace: {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        with f:
            for line in render_trace(f, session=session):
                print(line)
            sys.stdout.flush()
    except BrokenPipeError:  # `trace show FILE | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
