"""Client side of the SDK interop tests: a recording ACP client built on the official SDK.

Everything here is asyncio (the SDK is asyncio-based); the trio tests run it in a worker
thread with ``asyncio.run``. Two ways to reach the scripted agent of ``sdk_agent.py``:

- :func:`open_direct` spawns the agent itself (no bridge): proves the harness is right;
- :func:`open_bridge` spawns ``acp-bridge stdio --agent NAME=COMMAND ...`` in front of it.

Both yield a :class:`Peer` whose connection is initialized (fs capabilities on).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import acp
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    PermissionOption,
    TextContentBlock,
    ToolCallUpdate,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from acp.client.connection import ClientSideConnection

AGENT_SCRIPT = Path(__file__).with_name("sdk_agent.py")

PermissionPolicy = Literal[
    "allow_once", "allow_always", "reject_once", "reject_always", "cancelled"
]

_ACP_PACKAGE_DIR = str(Path(acp.__file__).resolve().parent)
_STDERR_TAIL_LINES = 200
_STDERR_EOF_TIMEOUT = 5.0


def agent_argv(name: str, session_prefix: str = "s") -> list[str]:
    """The command line of one scripted SDK agent."""
    return [sys.executable, str(AGENT_SCRIPT), "--name", name, "--session-prefix", session_prefix]


def bridge_argv(agents: Mapping[str, list[str]]) -> list[str]:
    """``acp-bridge stdio --agent NAME=COMMAND ...``; the first agent is the default."""
    argv = [sys.executable, "-m", "acp_bridge", "stdio"]
    for name, command in agents.items():
        argv += ["--agent", f"{name}={shlex.join(command)}"]
    return argv


@dataclass
class PermissionAsked:
    session_id: str
    tool_call: ToolCallUpdate
    options: list[PermissionOption]


class RecordingClient:
    """An SDK ``Client`` that records what it is sent and answers as configured.

    - every ``session/update`` is kept per session id, in arrival order;
    - ``session/request_permission`` picks the first option of kind ``policy``, or answers
      ``cancelled`` when the policy is ``"cancelled"`` (or no option of that kind exists);
    - ``fs/*`` read and write real files, but only under ``root`` (absolute paths);
    - extension notifications (``_acp_bridge/log``...) are kept in ``ext_notifications``.
    """

    def __init__(self, root: Path, policy: PermissionPolicy = "allow_once") -> None:
        self.root = root.resolve()
        self.policy: PermissionPolicy = policy
        self.updates: dict[str, list[Any]] = collections.defaultdict(list)
        self.permissions: list[PermissionAsked] = []
        self.ext_notifications: list[tuple[str, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    # -- what tests read -------------------------------------------------------------

    def texts(self, session_id: str) -> list[str]:
        """The text of every ``agent_message_chunk`` of a session, in arrival order."""
        return [
            update.content.text
            for update in self.updates.get(session_id, [])
            if isinstance(update, AgentMessageChunk)
            and isinstance(update.content, TextContentBlock)
        ]

    async def wait_for_text(self, session_id: str, text: str) -> None:
        """Return once the session received a chunk with exactly this text."""
        while text not in self.texts(session_id):
            await self._changed.wait()

    async def wait_until(self, check: Callable[[], bool]) -> None:
        """Return once ``check()`` holds (looked at again whenever something arrives)."""
        while not check():
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- the SDK Client interface ----------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates[session_id].append(update)
        self._notify()

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[PermissionOption],
        **kwargs: Any,
    ) -> acp.RequestPermissionResponse:
        self.permissions.append(PermissionAsked(session_id, tool_call, list(options)))
        self._notify()
        chosen = next((o for o in options if o.kind == self.policy), None)
        if chosen is None:
            return acp.RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return acp.RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id)
        )

    def _checked_path(self, path: str) -> Path:
        candidate = Path(path)
        if not candidate.is_absolute():
            raise acp.RequestError.invalid_params({"path": path, "reason": "not absolute"})
        resolved = candidate.resolve()
        if not resolved.is_relative_to(self.root):
            raise acp.RequestError.invalid_params({"path": path, "reason": "outside the root"})
        return resolved

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> acp.WriteTextFileResponse:
        target = self._checked_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return acp.WriteTextFileResponse()

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> acp.ReadTextFileResponse:
        target = self._checked_path(path)
        if not target.is_file():
            raise acp.RequestError.resource_not_found(path)
        content = target.read_text(encoding="utf-8")
        if line is not None or limit is not None:
            lines = content.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            stop = None if limit is None else start + limit
            content = "".join(lines[start:stop])
        return acp.ReadTextFileResponse(content=content)

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise acp.RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        # The SDK strips the leading underscore: `_acp_bridge/log` arrives as `acp_bridge/log`.
        self.ext_notifications.append((method, params))
        self._notify()


class _SdkErrorLog(logging.Handler):
    """Collects the errors the SDK logs instead of raising: unparseable lines on its
    input, unknown methods in notifications, failing handlers..."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.pathname.startswith(_ACP_PACKAGE_DIR):
            self.records.append(record)


@dataclass
class Peer:
    """One initialized client connection, to a bridge or straight to an agent."""

    mode: Literal["direct", "bridge"]
    conn: ClientSideConnection
    client: RecordingClient
    process: asyncio.subprocess.Process
    init: acp.InitializeResponse
    stderr_tail: collections.deque[str]
    sdk_errors: list[logging.LogRecord]

    async def new_session(self, cwd: Path, agent: str | None = None) -> str:
        """``session/new``; ``agent`` goes in ``_meta.acp_bridge.agent``.

        The SDK turns extra keyword arguments into ``_meta`` entries, so this sends
        ``{"cwd": ..., "mcpServers": [], "_meta": {"acp_bridge": {"agent": agent}}}``.
        """
        meta: dict[str, Any] = {} if agent is None else {"acp_bridge": {"agent": agent}}
        response = await self.conn.new_session(cwd=str(cwd), mcp_servers=[], **meta)
        return response.session_id

    async def prompt(self, session_id: str, text: str) -> acp.PromptResponse:
        return await self.conn.prompt(session_id=session_id, prompt=[acp.text_block(text)])

    def assert_clean(self) -> None:
        """Nothing unparseable or unexpected reached the client's protocol stream."""
        messages = [
            record.getMessage() + (f" ({record.exc_info[1]!r})" if record.exc_info else "")
            for record in self.sdk_errors
        ]
        assert not messages, f"the SDK client logged protocol errors: {messages}"


async def _drain(stream: asyncio.StreamReader, tail: collections.deque[str]) -> None:
    """Read a stderr pipe to EOF (an unread pipe would block its writer), keeping a tail."""
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line beyond the reader's limit: skip what was buffered
            continue
        if not line:
            return
        tail.append(line.decode("utf-8", "replace").rstrip("\n"))


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = acp.default_environment()
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@contextlib.asynccontextmanager
async def _open(
    mode: Literal["direct", "bridge"],
    argv: list[str],
    root: Path,
    policy: PermissionPolicy,
    env: Mapping[str, str] | None,
) -> AsyncIterator[Peer]:
    client = RecordingClient(root, policy)
    errors = _SdkErrorLog()
    logging.getLogger().addHandler(errors)
    tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
    drain: asyncio.Task[None] | None = None
    process: asyncio.subprocess.Process | None = None
    try:
        async with acp.spawn_agent_process(
            client, argv[0], *argv[1:], env=_child_env(env), cwd=root
        ) as (conn, process):
            assert process.stderr is not None
            drain = asyncio.create_task(_drain(process.stderr, tail))
            init = await conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(
                    fs=FileSystemCapabilities(read_text_file=True, write_text_file=True),
                    terminal=False,
                ),
                client_info=Implementation(name="sdk-interop-client", version="0.0.0"),
            )
            yield Peer(mode, conn, client, process, init, tail, errors.records)
        # The process has exited: its stderr reaches EOF unless something it started
        # still holds the pipe, i.e. a child outlived it.
        try:
            async with asyncio.timeout(_STDERR_EOF_TIMEOUT):
                await drain
        except TimeoutError:
            raise AssertionError(
                f"{mode} peer exited (status {process.returncode}) but its stderr is still "
                "open: a process it started outlived it"
            ) from None
    except BaseException as exc:
        # Whatever failed (a hang cut by a timeout, most likely), show the peer's stderr.
        if drain is not None and not drain.done():
            try:  # bounded: the process is gone, its stderr ends with it
                async with asyncio.timeout(_STDERR_EOF_TIMEOUT):
                    await asyncio.shield(drain)
            except TimeoutError:
                drain.cancel()
        if drain is not None and drain.cancelled() and process is not None:
            # Something still holds its pipes: close our ends, or the transport leaks.
            process._transport.close()  # type: ignore[attr-defined]
        exc.add_note(f"{mode} peer stderr tail:\n" + "\n".join(tail))
        raise
    finally:
        logging.getLogger().removeHandler(errors)


def open_direct(
    agent: list[str],
    root: Path,
    *,
    policy: PermissionPolicy = "allow_once",
    env: Mapping[str, str] | None = None,
) -> contextlib.AbstractAsyncContextManager[Peer]:
    """Spawn one scripted agent with no bridge in between."""
    return _open("direct", agent, root, policy, env)


def open_bridge(
    agents: Mapping[str, list[str]],
    root: Path,
    *,
    policy: PermissionPolicy = "allow_once",
    env: Mapping[str, str] | None = None,
) -> contextlib.AbstractAsyncContextManager[Peer]:
    """Spawn ``acp-bridge stdio`` with these agents (the first is the default).

    ``root`` is the client's file-system root and the bridge's working directory; the
    bridge's state (``XDG_STATE_HOME``) goes under ``root/.state`` so a test never
    touches the user's.
    """
    merged = {"XDG_STATE_HOME": str(root / ".state"), **(env or {})}
    return _open("bridge", bridge_argv(agents), root, policy, merged)
