"""
``acp-bridge attach URL``: an editor's stdio on one side, the daemon's WebSocket on the other.

An editor spawns ``attach`` as its agent. Each NDJSON line from the editor goes out as one text
frame; each frame comes back as one line. What the shim adds is continuity: when the socket
drops, it reconnects with backoff, initializes again, takes its sessions back with
``session/load`` after the last update the editor saw (``_meta.acp_bridge.after_seq``), and only
then lets through what the editor sent meanwhile. A network blip costs the editor nothing: its
update stream simply continues, and a prompt that was running is answered under its own id.

:class:`AttachCore` (``attach.core.py``) decides, with no I/O, no trio and no clock;
:func:`attach` runs it with one task per direction and peer: an editor reader and writer, and per
connection a socket reader, a socket writer and a keepalive. Its docstring tells how ids are kept.

Backpressure:
    Toward the bridge, one queue of at most :data:`HELD_MESSAGES` messages and
    :data:`HELD_BYTES` bytes. While connected, an editor that writes faster than the socket
    takes waits for room. While disconnected (or taking sessions back), what does not fit is
    refused: a request gets a -32603 "bridge unreachable" error, a notification or an answer is
    dropped and logged. Toward the editor, a bounded channel: a slow editor slows the socket
    reader, and past its own queue the daemon closes the connection, which this shim repairs
    like any drop.

Giving up:
    A connection that made it to live starts a new window of ``reconnect_for`` seconds (the
    daemon's default grace) when it drops; the first connection gets ``connect_for``. Delays
    double from 0.1 s to 5 s, with jitter. A refusal no retry can change (401 token, 403
    Host/Origin, 404 path, an untrusted certificate) ends it at once. Either way every editor
    request still waiting is answered with a -32603 "bridge unreachable: <why>" error, and
    the exit status is 1.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import ssl
import sys
import urllib.parse
from typing import TYPE_CHECKING, Final

import attrs
import structlog
import trio
import trio_websocket

from acp_bridge.attach.core import AttachCore, Backoff, Phase, ReattachFailed, log_line
from acp_bridge.faces.token import TokenError, is_loopback, resolve_token
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.framing import DEFAULT_MAX_LINE_BYTES, LineDecoder, Oversize
from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps
from acp_bridge.runtime import pipes
from acp_bridge.runtime.nursery import cancel_on_signals, leaves

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from contextlib import AbstractAsyncContextManager

    #: Opens one WebSocket connection to the daemon (and closes it on exit).
    Connect = Callable[[], AbstractAsyncContextManager[trio_websocket.WebSocketConnection]]

__all__ = [
    "AttachCore",
    "Backoff",
    "Phase",
    "attach",
    "check_url",
    "main_attach",
    "run_attach",
    "websocket_connector",
]

logger = structlog.get_logger("acp_bridge.attach")

#: Exit status: the editor ended (or a signal asked us to stop).
EXIT_OK: Final = 0
#: Exit status: the bridge could not be reached, refused us, or stayed away too long.
EXIT_UNREACHABLE: Final = 1
#: Exit status: bad command line (URL, token).
EXIT_USAGE: Final = 2

#: Seconds to keep trying after a drop: the bridge's default detach grace.
RECONNECT_FOR: Final = 300.0
#: Seconds to keep trying to make the first connection.
CONNECT_FOR: Final = 10.0
#: Messages queued for the editor's stdout.
EDITOR_QUEUE: Final = 256
#: Keepalive: a ping this often, and a pong within the timeout, or the connection is dropped.
PING_INTERVAL: Final = 20.0
PING_TIMEOUT: Final = 20.0
#: Seconds for TCP, TLS and the upgrade; seconds for a closing handshake.
CONNECT_TIMEOUT: Final = 10.0
CLOSE_TIMEOUT: Final = 2.0
#: After the editor's end of input: how long answers to its last requests are waited for.
LINGER: Final = 2.0
#: HTTP statuses that no retry will change: bad request, token, origin/host, path, method.
FINAL_STATUSES: Final = frozenset({400, 401, 403, 404, 405, 426})

_WRITE_BATCH: Final = 64 * 1024
_HINTS: Final = {
    401: "the token was refused: check --token-file / --token-env",
    403: "the daemon refused this Host or Origin (see websocket.allowed_hosts)",
    404: "no ACP endpoint at this path (the default is /acp)",
}


# --------------------------------------------------------------------- the trio adapter


@attrs.frozen
class _Ended:
    """How one connection ended: ``reason`` None when we closed it (the editor ended)."""

    reason: str | None
    final: bool = False


class _Link:
    """One connection's tasks: the first failure ends them all, and says why."""

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.reason: str | None = None
        #: we are closing it (the editor ended): what the other tasks see is no failure
        self.closing = False

    def fail(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


@attrs.frozen
class _Keep:
    """How the shim keeps its connection (see :func:`attach` for each)."""

    reconnect_for: float
    connect_for: float
    backoff: Backoff
    ping_interval: float
    ping_timeout: float
    max_line_bytes: int
    jitter: Callable[[], float]


class _Attach:
    def __init__(
        self,
        core: AttachCore,
        editor_in: trio.abc.ReceiveStream,
        editor_out: trio.abc.SendStream,
        connect: Connect,
        keep: _Keep,
    ) -> None:
        self._core = core
        self._editor_in = editor_in
        self._editor_out = editor_out
        self._connect = connect
        self._keep = keep
        self._to_editor, self._editor_queue = trio.open_memory_channel[bytes](EDITOR_QUEUE)
        #: set (and replaced) whenever the core's state moved: queue room, work, phase
        self._changed = trio.Event()
        #: the editor is done (end of input, or its output closed)
        self._ended = trio.Event()
        #: after the editor's end: when to stop delivering what it sent and waiting for answers
        self._stop_at = math.inf
        self._live = False
        #: the connection attempt or the backoff wait under way (the editor's end cuts it)
        self._attempt: trio.CancelScope | None = None
        self._backoff_wait: trio.CancelScope | None = None
        self._log = logger

    def _kick(self) -> None:
        if self._core.phase is Phase.LIVE and not self._live:
            self._live = True
            self._log.info("attach_live", connection=self._core.epoch)
        self._changed.set()
        self._changed = trio.Event()

    def _editor_done(self, why: str, *, at_once: bool = False) -> None:
        """
        The editor ended. What it sent still goes out, and answers to its requests are
        waited for, for up to :data:`LINGER` seconds (a script that pipes its requests in
        gets its answers); with nothing left to deliver, or ``at_once``, it stops now.
        """
        if self._ended.is_set():
            return
        core = self._core
        idle = core.outbound_idle and not core.answers_pending
        now = trio.current_time()
        self._stop_at = now if at_once or idle else now + LINGER
        self._log.info("editor_ended", reason=why, linger=self._stop_at - now)
        self._ended.set()
        self._kick()
        if self._backoff_wait is not None:
            self._backoff_wait.deadline = min(self._backoff_wait.deadline, self._stop_at)
        if self._attempt is not None:
            if core.phase is Phase.OFFLINE:
                # Still connecting: nothing to close properly.
                self._attempt.deadline = self._stop_at
            else:
                # Connected: the socket writer closes it properly by then.
                self._attempt.deadline = self._stop_at + 2 * CLOSE_TIMEOUT

    async def run(self) -> int:
        async with trio.open_nursery() as outer:
            outer.start_soon(self._editor_writer)
            async with trio.open_nursery() as inner:
                inner.start_soon(self._editor_reader)
                status = await self._connection_loop()
                inner.cancel_scope.cancel()
            # What is queued for the editor is written, within reason.
            await self._to_editor.aclose()
            outer.cancel_scope.deadline = trio.current_time() + CLOSE_TIMEOUT
        return status

    # ------------------------------------------------------------------ the editor side

    async def _editor_reader(self) -> None:
        decoder = LineDecoder(max_line_bytes=self._keep.max_line_bytes)
        try:
            while data := await self._editor_in.receive_some(pipes.READ_BUFFER_BYTES):
                for line in decoder.feed(data):
                    await self._from_editor(line)
            rest = decoder.feed_eof()
            if rest is not None:
                await self._from_editor(rest)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._editor_done("end of input")

    async def _from_editor(self, line: bytes | Oversize) -> None:
        if isinstance(line, Oversize):
            err = JsonRpcError.invalid_request(f"message of {line.size} bytes is over the limit")
            await self._to_editor.send(dumps(rpc.error(None, err)))
            return
        while self._core.must_wait(len(line)):
            await self._changed.wait()
        lines = self._core.from_editor(line)
        self._kick()
        for out in lines:
            await self._to_editor.send(out)

    async def _editor_writer(self) -> None:
        """The one writer of the editor's stdout: batches what is queued."""
        queue = self._editor_queue
        try:
            async for data in queue:
                batch = [data]
                size = len(data)
                while size < _WRITE_BATCH:
                    try:
                        more = queue.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    batch.append(more)
                    size += len(more)
                await self._editor_out.send_all(b"".join(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._editor_done("editor closed its input", at_once=True)

    # ------------------------------------------------------------------ connections

    async def _connection_loop(self) -> int:
        window = self._keep.connect_for
        since = trio.current_time()
        attempt = 0
        while trio.current_time() < self._stop_at:
            self._live = False
            ended = _Ended("cancelled")
            with trio.CancelScope() as self._attempt:
                ended = await self._try_connection()
            self._attempt = None
            if self._ended.is_set() and (
                ended.reason is None or trio.current_time() >= self._stop_at
            ):
                break
            assert ended.reason is not None
            self._core.connection_lost()
            self._kick()
            if self._live:
                # It was attached: a new outage starts now, with the full window.
                since = trio.current_time()
                window = self._keep.reconnect_for
                attempt = 0
            if ended.final:
                return await self._give_up(ended.reason)
            elapsed = trio.current_time() - since
            if elapsed >= window:
                return await self._give_up(f"{ended.reason} (gave up after {elapsed:.0f}s)")
            delay = min(self._keep.backoff.delay(attempt, self._keep.jitter()), window - elapsed)
            attempt += 1
            self._log.warning("attach_disconnected", reason=ended.reason, retry_in=delay)
            with trio.move_on_at(min(trio.current_time() + delay, self._stop_at)) as waiting:
                self._backoff_wait = waiting
                await trio.sleep_forever()
            self._backoff_wait = None
        return EXIT_OK

    async def _give_up(self, reason: str) -> int:
        self._log.error("attach_gave_up", reason=reason)
        lines = self._core.give_up(reason)
        lines.append(log_line("error", f"bridge unreachable: {reason}"))
        with trio.move_on_after(CLOSE_TIMEOUT):
            for line in lines:
                await self._to_editor.send(line)
        return EXIT_UNREACHABLE

    async def _try_connection(self) -> _Ended:
        try:
            async with self._connect() as ws:
                return await self._serve_connection(ws)
        except trio_websocket.ConnectionRejected as exc:
            status = exc.status_code
            reason = f"the bridge refused the connection: HTTP {status}"
            hint = _HINTS.get(status)
            if hint is not None:
                reason += f" ({hint})"
            self._log.warning("attach_refused", status=status)
            return _Ended(reason, final=status in FINAL_STATUSES)
        except trio_websocket.HandshakeError as exc:
            cause = exc.__cause__
            if isinstance(cause, ssl.SSLCertVerificationError):
                return _Ended(f"TLS certificate not trusted: {cause.verify_message}", final=True)
            return _Ended(_describe(cause or exc))
        except (trio_websocket.ConnectionClosed, OSError, trio.BrokenResourceError) as exc:
            return _Ended(_describe(exc))

    async def _serve_connection(self, ws: trio_websocket.WebSocketConnection) -> _Ended:
        connection_id = next(
            (
                v.decode("latin-1")
                for k, v in ws.handshake_headers
                if k.lower() == b"acp-connection-id"
            ),
            None,
        )
        self._log.info("attach_connected", connection=self._core.epoch + 1, id=connection_id)
        lines = self._core.connection_opened()
        self._kick()
        if self._attempt is not None and self._stop_at < math.inf:
            # The editor ended while we were connecting: the socket writer closes properly.
            self._attempt.deadline = self._stop_at + 2 * CLOSE_TIMEOUT
        for line in lines:
            await self._to_editor.send(line)
        async with trio.open_nursery() as nursery:
            link = _Link(nursery.cancel_scope)
            nursery.start_soon(self._socket_reader, ws, link)
            nursery.start_soon(self._socket_writer, ws, link)
            if self._keep.ping_interval > 0:
                nursery.start_soon(self._keepalive, ws, link)
        return _Ended(None if link.closing else link.reason or "connection ended")

    async def _socket_reader(self, ws: trio_websocket.WebSocketConnection, link: _Link) -> None:
        try:
            while True:
                message = await ws.get_message()
                if not isinstance(message, str):
                    continue  # binary frames carry no ACP
                lines = self._core.from_bridge(message)
                self._kick()
                for line in lines:
                    await self._to_editor.send(line)
        except trio_websocket.ConnectionClosed as exc:
            link.fail(_closed_text(exc))
        except ReattachFailed as exc:
            link.fail(str(exc))

    async def _socket_writer(self, ws: trio_websocket.WebSocketConnection, link: _Link) -> None:
        core = self._core
        while True:
            out = core.next_for_bridge()
            if out is None:
                if self._ended.is_set() and (
                    (core.outbound_idle and not core.answers_pending)
                    or trio.current_time() >= self._stop_at
                ):
                    break
                with trio.move_on_at(self._stop_at):
                    await self._changed.wait()
                continue
            try:
                await ws.send_message(out.text)
            except trio_websocket.ConnectionClosed as exc:
                core.unsent(out)
                link.fail(_closed_text(exc))
                return
            except BaseException:
                core.unsent(out)
                raise
            core.sent(out)
            self._kick()
        # The editor is done: close the socket properly, then end this connection.
        self._log.info("attach_closing")
        link.closing = True
        with trio.move_on_after(CLOSE_TIMEOUT):
            await ws.aclose()
        link.scope.cancel()

    async def _keepalive(self, ws: trio_websocket.WebSocketConnection, link: _Link) -> None:
        try:
            while True:
                await trio.sleep(self._keep.ping_interval)
                with trio.move_on_after(self._keep.ping_timeout):
                    await ws.ping()
                    continue
                link.fail(f"no pong within {self._keep.ping_timeout:g}s")
                return
        except trio_websocket.ConnectionClosed as exc:
            link.fail(_closed_text(exc))


def _closed_text(exc: trio_websocket.ConnectionClosed) -> str:
    reason = exc.reason
    if reason is None:
        return "connection closed"
    text = f"connection closed ({reason.code} {reason.name})"
    return f"{text}: {reason.reason}" if reason.reason else text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect: {exc.strerror}"
    if isinstance(exc, trio_websocket.ConnectionTimeout):
        return "cannot connect: timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def attach(
    editor_in: trio.abc.ReceiveStream,
    editor_out: trio.abc.SendStream,
    connect: Connect,
    *,
    agent: str | None = None,
    reconnect_for: float = RECONNECT_FOR,
    connect_for: float = CONNECT_FOR,
    backoff: Backoff | None = None,
    ping_interval: float = PING_INTERVAL,
    ping_timeout: float = PING_TIMEOUT,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    jitter: Callable[[], float] = random.random,
    core: AttachCore | None = None,
) -> int:
    """
    Relay the editor's streams to the bridge until the editor ends; repair every drop.

    Args:
        editor_in: what the editor writes (NDJSON).
        editor_out: what the editor reads (NDJSON; protocol only).
        connect: opens one WebSocket connection (see :func:`websocket_connector`).
        agent: the agent of every ``session/new`` (and load/resume) that names none.
        reconnect_for: seconds to keep trying after a drop before giving up.
        connect_for: the same, for the first connection.
        backoff: delays between attempts.
        ping_interval: seconds between keepalive pings (0: none); ``ping_timeout`` for the
            pong.
        max_line_bytes: the longest editor line accepted.
        jitter: a source of numbers in [0, 1) for the backoff.
        core: the decisions (a fresh :class:`AttachCore` by default).

    Returns:
        The exit status: :data:`EXIT_OK` when the editor ended, :data:`EXIT_UNREACHABLE` after
        giving up (every request still waiting was answered with an error first).

    Resource handling:
        Does not close the editor's streams. When the editor's input ends, what it sent still
        goes out and answers still come back for up to :data:`LINGER` seconds (at once if
        nothing is left), then the socket is closed with a closing handshake.

    Cancellation:
        Cancelling it drops the connection without a closing handshake.
    """
    keep = _Keep(
        reconnect_for=reconnect_for,
        connect_for=connect_for,
        backoff=backoff if backoff is not None else Backoff(),
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        max_line_bytes=max_line_bytes,
        jitter=jitter,
    )
    core = core if core is not None else AttachCore(agent=agent)
    runner = _Attach(core, editor_in, editor_out, connect, keep)
    return await runner.run()


def websocket_connector(
    url: str,
    token: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    max_message_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ssl_context: ssl.SSLContext | None = None,
    open_stream: Callable[[], Awaitable[trio.abc.Stream]] | None = None,
) -> Connect:
    """
    How :func:`attach` opens a connection: ``url`` with ``Authorization: Bearer token``.

    ``open_stream`` replaces the TCP (and TLS, for ``wss://``) connection, for tests.

    Resource handling:
        The connector owns the byte stream under each connection and always closes it
        (trio-websocket 0.12 leaves it open when the peer ended the connection).

    Raises (on entering):
        trio_websocket.ConnectionRejected: the daemon answered the upgrade with an HTTP error.
        trio_websocket.HandshakeError: no connection within ``connect_timeout``, or a network
            or TLS error (the cause is chained).
    """
    parts = urllib.parse.urlsplit(url)
    secure = parts.scheme == "wss"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port in (80, 443) else f"{shown}:{port}"
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = [(b"Authorization", b"Bearer " + token.encode("ascii"))]
    if secure and ssl_context is None:
        ssl_context = ssl.create_default_context()

    async def open_default() -> trio.abc.Stream:
        if ssl_context is not None:
            return await trio.open_ssl_over_tcp_stream(
                host, port, ssl_context=ssl_context, https_compatible=True
            )
        return await trio.open_tcp_stream(host, port)

    opener = open_stream if open_stream is not None else open_default

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[trio_websocket.WebSocketConnection]:
        try:
            with trio.fail_after(connect_timeout):
                stream = await opener()
        except trio.TooSlowError:
            raise trio_websocket.ConnectionTimeout from None
        except OSError as exc:
            raise trio_websocket.HandshakeError from exc
        try:
            with _single_error():
                async with trio.open_nursery() as nursery:
                    try:
                        with trio.fail_after(connect_timeout):
                            ws = await trio_websocket.wrap_client_stream(
                                nursery,
                                stream,  # type: ignore[arg-type]  # any stream will do
                                host_header,
                                resource,
                                extra_headers=headers,
                                max_message_size=max_message_bytes,
                            )
                    except trio.TooSlowError:
                        raise trio_websocket.ConnectionTimeout from None
                    try:
                        yield ws
                    finally:
                        with trio.move_on_after(CLOSE_TIMEOUT):
                            await ws.aclose()
                        nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await stream.aclose()

    return connect


@contextlib.contextmanager
def _single_error() -> Iterator[None]:
    """Let the one exception of a nursery through as itself (trio wraps it in a group)."""
    try:
        yield
    except BaseExceptionGroup as group:
        errors = [e for e in leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(errors) == 1 and isinstance(errors[0], Exception):
            raise errors[0] from None
        raise


# --------------------------------------------------------------------- the command


def check_url(url: str) -> str:
    """
    A ``ws://`` or ``wss://`` URL with a host, else :class:`TokenError`.

    A token sent over plain ``ws://`` to another machine travels in clear text: that is
    allowed (an SSH tunnel, a trusted network) but logged.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise TokenError(f"not a WebSocket URL: {url!r} (expected ws://HOST:PORT/acp)")
    if parts.scheme == "ws" and not is_loopback(parts.hostname):
        logger.warning("attach_insecure_url", host=parts.hostname, hint="use wss:// or a tunnel")
    return url


def run_attach(
    url: str,
    *,
    token: str,
    agent: str | None,
    reconnect_for: float,
    protocol_fd: int,
    connect_for: float = CONNECT_FOR,
) -> int:
    """
    ``acp-bridge attach``: relay stdin and ``protocol_fd`` to ``url`` until stdin ends.

    SIGTERM and SIGINT stop it (status 0). Returns the exit status (see :func:`attach`).
    """

    async def main() -> int:
        editor_in = trio.lowlevel.FdStream(os.dup(0))
        editor_out = trio.lowlevel.FdStream(protocol_fd)
        status = EXIT_OK
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_on_signals, nursery.cancel_scope, logger)
                status = await attach(
                    editor_in,
                    editor_out,
                    websocket_connector(url, token),
                    agent=agent,
                    reconnect_for=reconnect_for,
                    connect_for=connect_for,
                )
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await editor_in.aclose()
                await editor_out.aclose()
        return status

    return trio.run(main)


def main_attach(args: argparse.Namespace) -> int:
    """The ``attach`` subcommand, from parsed arguments (see ``cli.main.build_parser``)."""
    from acp_bridge.faces.stdio import claim_stdout
    from acp_bridge.observe.log import configure_logging

    # Before anything can print: from here on fd 1 is stderr, the protocol has its own fd.
    protocol_fd = claim_stdout()
    configure_logging(level=args.log_level, fmt=args.log_format, file=args.log_file)
    try:
        url = check_url(args.url)
        token = resolve_token(args.token_file, args.token_env, url)
    except TokenError as exc:
        print(f"acp-bridge attach: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run_attach(
        url,
        token=token,
        agent=args.agent,
        reconnect_for=args.reconnect_for,
        connect_for=args.connect_for,
        protocol_fd=protocol_fd,
    )
