"""
Agent processes: how an agent is started, stopped and watched.

A *launcher* is an async function ``launcher(config, *, task_status)`` run with
``nursery.start``: it starts the agent, reports an :class:`AgentTransport` through
``task_status.started``, and returns the exit status when the agent ends. Cancelling it stops
the agent (stdin EOF → SIGTERM → SIGKILL to its process group for a real process). The bridge
uses :func:`launch_subprocess`; tests inject in-process fake agents with :func:`launch_in_process`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import structlog
import trio

from acp_bridge.agents.prespawn import spawn_settings, start_error
from acp_bridge.runtime import pipes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from acp_bridge.agents.prespawn import Prespawned
    from acp_bridge.config.model import AgentConfig

logger = structlog.get_logger("acp_bridge.agent")


@attrs.define
class AgentTransport:
    """The byte streams of a running agent."""

    #: the agent's stdin
    send: trio.abc.SendStream
    #: the agent's stdout (protocol)
    receive: trio.abc.ReceiveStream
    #: the agent's stderr (diagnostics), when it has one
    stderr: trio.abc.ReceiveStream | None = None
    pid: int | None = None
    #: kill the agent at once (SIGKILL to its process group), not gracefully: for an agent
    #: that broke the protocol or stopped reading; its exit then takes the usual path
    kill: Callable[[], None] | None = None
    #: the agent's ``initialize`` result when it was initialized before the bridge ran
    #: (``faces.early``): the supervisor skips its handshake
    initialized: dict[str, Any] | None = None
    #: when it was sent an ``initialize`` before the bridge ran that it has not answered as
    #: the early answer needs (``time.monotonic()``; ``Prespawned.initialize_sent``): the
    #: supervisor's handshake waits for that one's answer (the link's first id)
    initialize_sent: float | None = None


class Launcher(Protocol):
    def __call__(
        self, config: AgentConfig, *, task_status: trio.TaskStatus[AgentTransport]
    ) -> Awaitable[int | None]: ...


class StderrRing:
    """
    An agent's stderr cut into lines, and the most recent ones kept.

    :meth:`feed` returns each finished line whole up to ``max_line_bytes`` (64 KiB); a longer
    one is cut there, the rest discarded as it arrives (``…[N bytes cut]`` marks it), so a
    10 MiB line costs no more memory than a short one. The ring keeps the last ``max_lines``
    lines, each at most ``keep_line_bytes``, to explain a failed start or a crash.
    """

    __slots__ = ("_cut", "_keep", "_lines", "_max_line", "_partial")

    def __init__(
        self, *, max_lines: int = 50, keep_line_bytes: int = 2048, max_line_bytes: int = 65536
    ) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._max_line = max_line_bytes
        self._keep = keep_line_bytes
        self._partial = bytearray()
        self._cut = 0  # bytes of the current line discarded beyond the cap

    def feed(self, data: bytes | bytearray) -> list[str]:
        """Add stderr bytes; return the complete lines they finished (each cut to the cap)."""
        done: list[str] = []
        start = 0
        size = len(data)
        while start < size:
            nl = data.find(b"\n", start)
            end = size if nl < 0 else nl
            room = self._max_line - len(self._partial)
            take = min(end - start, max(room, 0))
            if take:
                self._partial += data[start : start + take]
            self._cut += end - start - take
            if nl < 0:
                break
            done.append(self._finish())
            start = nl + 1
        return done

    def flush(self) -> str | None:
        return self._finish() if self._partial or self._cut else None

    def _finish(self) -> str:
        line = self._partial.decode("utf-8", "replace").rstrip("\r")
        if self._cut:
            line += f" …[{self._cut} bytes cut]"
        self._partial.clear()
        self._cut = 0
        self._lines.append(line[: self._keep])
        return line

    def tail(self, n: int = 20) -> list[str]:
        lines = list(self._lines)
        return lines[-n:]


class Reaper:
    """
    Client side of the reaper watchdog (see ``agents.reaper``): registers agent process groups.

    Resource handling: run :meth:`run` in the bridge's nursery; when the bridge ends normally it
    closes the pipe after every agent was stopped, and the watchdog exits with nothing to do.
    """

    def __init__(self) -> None:
        self._stdin: trio.abc.SendStream | None = None
        self._ready = trio.Event()
        self._lock = trio.Lock()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "acp_bridge.agents.reaper"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            logger.warning("reaper_unavailable", error=str(exc))
            self._ready.set()
            task_status.started()
            return
        self._stdin = proc.stdin
        self._ready.set()
        task_status.started()
        try:
            await proc.wait()
        finally:
            with trio.CancelScope(shield=True):
                if proc.stdin is not None:
                    await proc.stdin.aclose()
                with trio.move_on_after(2):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    async def _write(self, line: bytes) -> None:
        await self._ready.wait()
        if self._stdin is None:
            return
        async with self._lock:
            try:
                await self._stdin.send_all(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._stdin = None

    async def register(self, pgid: int) -> None:
        await self._write(b"+%d\n" % pgid)

    async def unregister(self, pgid: int) -> None:
        await self._write(b"-%d\n" % pgid)


#: after an agent exited by itself, how long its readers may take to reach the end of what it
#: wrote before the pipes are closed regardless
EXIT_DRAIN_WAIT = 0.25
#: what one read of an agent's pipe takes at most
READ_SIZE = 64 * 1024


class _Watched(trio.abc.ReceiveStream):
    """
    An agent's pipe whose reader's end of data is known (``ended``: EOF, broken, closed).

    Reads yield once, after taking what was waiting (:func:`acp_bridge.runtime.pipes.receive_some`).
    """

    def __init__(self, stream: trio.abc.ReceiveStream, first: bytes = b"") -> None:
        self._stream = stream
        self.ended = trio.Event()
        #: bytes read from the pipe before the bridge ran (``faces.early``), returned first
        self._first = first
        #: the last read was short: the next one waits first (``runtime.pipes.read_fd``)
        self._drained = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._first:
            size = max_bytes or READ_SIZE
            first, self._first = self._first[:size], self._first[size:]
            return first
        size = max_bytes or READ_SIZE
        try:
            data = await pipes.receive_some(self._stream, size, drained=self._drained)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.ended.set()
            raise
        self._drained = pipes.drained(data, size)
        if not data:
            self.ended.set()
        return data

    async def aclose(self) -> None:
        self.ended.set()
        await self._stream.aclose()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def make_subprocess_launcher(
    *,
    reaper: Reaper | None = None,
    stop_grace: float = 2.0,
    base_dir: str | None = None,
    adopt: Prespawned | None = None,
) -> Launcher:
    """
    A launcher that runs agents as real processes, each in its own process group.

    Stopping (on cancel): close stdin, wait ``stop_grace``; SIGTERM the group, wait
    ``stop_grace``; SIGKILL the group. Children the agent spawned go with it.

    ``adopt``: an agent process spawned before the bridge started (``agents.prespawn``), taken for
    that agent's first launch instead of spawning one (its failed spawn is that launch's
    error); from there on it is watched, stopped and killed like any other. When it was
    initialized before the bridge ran (``faces.early``), its transport carries that result and
    its reader gets first what was read of its stdout then.
    """

    async def launch_subprocess(
        config: AgentConfig, *, task_status: trio.TaskStatus[AgentTransport]
    ) -> int | None:
        taken = adopt.take(config) if adopt is not None else None
        proc: _Process
        first, initialized, initialize_sent = b"", None, None
        if taken is not None:
            proc = _adopt(taken)
            first, initialized = taken.stdout_rest, taken.initialized
            initialize_sent = taken.initialize_sent
        else:
            argv, env, cwd = spawn_settings(config, base_dir)
            try:
                proc = await trio.lowlevel.open_process(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise AgentStartError(start_error(config.name, argv, exc)) from None
        pid = proc.pid
        if reaper is not None:
            await reaper.register(pid)
        assert proc.stdin is not None
        assert proc.stdout is not None
        stdout = _Watched(proc.stdout, first)
        stderr = _Watched(proc.stderr) if proc.stderr is not None else None
        try:
            task_status.started(
                AgentTransport(
                    send=proc.stdin,
                    receive=stdout,
                    stderr=stderr,
                    pid=pid,
                    kill=functools.partial(_kill_running, proc),
                    initialized=initialized,
                    initialize_sent=initialize_sent,
                )
            )
            status = await proc.wait()
            # It exited by itself: what it wrote last (an answer, a traceback) is still in
            # the pipes. Its group goes now (a grandchild holding a pipe would keep the end
            # of data away), then the readers get a moment to take the rest.
            _signal_group(pid, signal.SIGKILL)
            with trio.move_on_after(EXIT_DRAIN_WAIT):
                await stdout.ended.wait()
                if stderr is not None:
                    await stderr.ended.wait()
            return status
        finally:
            with trio.CancelScope(shield=True):
                await _stop_process(proc, stop_grace)
                # Grandchildren may outlive the agent itself: clear the group either way.
                _signal_group(pid, signal.SIGKILL)
                if reaper is not None:
                    await reaper.unregister(pid)

    return launch_subprocess


class _Process(Protocol):
    """What the launcher uses of a ``trio.Process`` (and of an adopted one, :class:`_Adopted`)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdin(self) -> trio.abc.SendStream | None: ...
    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...
    async def wait(self) -> int: ...


class _Adopted:
    """
    A process spawned before trio ran (``agents.prespawn``), behind the calls the launcher makes of
    a ``trio.Process``: its pipes as non-blocking ``FdStream``s (as ``open_process`` makes
    them), its exit awaited on its pidfd and reaped as trio reaps its own (``Popen.wait``
    once the pidfd is readable; ``returncode`` polls, so a reaped pid is never signalled).
    """

    def __init__(self, popen: subprocess.Popen[bytes], fds: tuple[int, int, int, int]) -> None:
        stdin, stdout, stderr, pidfd = fds
        self._popen = popen
        self.pid = popen.pid
        self.stdin = trio.lowlevel.FdStream(stdin)
        self.stdout = trio.lowlevel.FdStream(stdout)
        self.stderr = trio.lowlevel.FdStream(stderr)
        self._pidfd: int | None = pidfd

    @property
    def returncode(self) -> int | None:
        status = self._popen.poll()
        if status is not None:
            self._close_pidfd()
        return status

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def wait(self) -> int:
        if self.returncode is None:
            assert self._pidfd is not None
            with contextlib.suppress(trio.ClosedResourceError):
                await trio.lowlevel.wait_readable(self._pidfd)
            self._popen.wait()  # (it exited: this only reaps it)
            self._close_pidfd()
        else:
            await trio.lowlevel.checkpoint()
        status = self._popen.returncode
        assert status is not None
        return status


def _adopt(spawned: Prespawned) -> _Adopted:
    """The pre-spawned agent as the launcher's process, or its spawn failure raised."""
    if spawned.popen is None:
        raise AgentStartError(spawned.error or "the agent was not started")
    assert spawned.fds is not None
    return _Adopted(spawned.popen, spawned.fds)


def _kill_running(proc: _Process) -> None:
    """SIGKILL an agent's process group, unless the agent was reaped (its pid may be reused)."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGKILL)


async def _stop_process(proc: _Process, grace: float) -> None:
    if proc.returncode is None:
        if proc.stdin is not None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await proc.stdin.aclose()
        with trio.move_on_after(grace):
            await proc.wait()
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        with trio.move_on_after(grace):
            await proc.wait()
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()


class AgentStartError(Exception):
    """An agent could not be started (spawn failed, or it did not complete initialize)."""

    def __init__(self, message: str, *, data: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.data = dict(data) if data else {}


def make_in_process_launcher(
    agents: Mapping[
        str, Callable[[trio.abc.ReceiveStream, trio.abc.SendStream], Awaitable[object]]
    ],
    *,
    on_start: Callable[[str], object] | None = None,
) -> Launcher:
    """
    A launcher for tests: each agent is an async function speaking NDJSON over memory streams.

    The function gets (its stdin, its stdout); returning ends the "process" with status 0, an
    exception with status 1. Cancelling the launcher (stopping the agent) cancels it.
    """

    async def launch_in_process(
        config: AgentConfig, *, task_status: trio.TaskStatus[AgentTransport]
    ) -> int | None:
        fn = agents[config.name]
        if on_start is not None:
            on_start(config.name)
        # Lockstep toward the agent, like a pipe with no slack: an agent that stops reading
        # blocks the bridge's writer, as a full pipe would.
        import trio.testing  # (not at import: it brings pytest along, dear at start-up)

        to_agent_send, to_agent_recv = trio.testing.lockstep_stream_pair()
        from_agent_send, from_agent_recv = trio.testing.memory_stream_pair()
        # A fake that wants a stderr gets one (an attribute ``stderr`` is set on it).
        stderr_send, stderr_recv = trio.testing.memory_stream_pair()
        wants_stderr = hasattr(fn, "stderr")
        if wants_stderr:
            fn.stderr = stderr_send  # type: ignore[attr-defined]
        status: int | None = 0
        killed = trio.CancelScope()

        def kill() -> None:
            nonlocal status
            status = -signal.SIGKILL
            killed.cancel()

        async with trio.open_nursery() as nursery:

            async def run() -> None:
                nonlocal status
                try:
                    with killed:  # (its own scope: a crash at the moment of the kill is a crash)
                        await fn(to_agent_recv, from_agent_send)
                except Exception:
                    if not killed.cancel_called:
                        status = 1
                finally:
                    with trio.CancelScope(shield=True):
                        await from_agent_send.aclose()
                        await stderr_send.aclose()

            nursery.start_soon(run)
            task_status.started(
                AgentTransport(
                    send=to_agent_send,
                    receive=from_agent_recv,
                    stderr=stderr_recv if wants_stderr else None,
                    kill=kill,
                )
            )
        return status

    return launch_in_process
