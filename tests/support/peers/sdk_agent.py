"""A deterministic ACP agent built on the official Python SDK (``acp``), for interop tests.

Run it as a script::

    python tests/support/peers/sdk_agent.py --name A --session-prefix s

Session ids are ``f"{prefix}{n}"`` counting from 1, so two instances with the same prefix
mint colliding ids on purpose. A prompt is one command (the text of its text blocks):

- ``count N``          N ``agent_message_chunk`` updates ``f"{name}:{sessionId}:{i}"``, i = 1..N
- ``permission``       asks ``session/request_permission`` (allow_once / reject_once) and
                       reports ``f"{name}:outcome:{optionId or 'cancelled'}"``
- ``write PATH TEXT``  asks permission, then ``fs/write_text_file``; reports
                       ``f"{name}:wrote:{PATH}"`` (or ``f"{name}:write:{reason}"``)
- ``read PATH``        ``fs/read_text_file``; reports ``f"{name}:read:{content}"``
- ``wait``             reports ``f"{name}:{sessionId}:waiting"``, then blocks until
                       ``session/cancel``; stop reason ``cancelled``
- ``crash``            a line on stderr, then ``os._exit(3)`` in the middle of the turn
- ``stderr``           noise on stderr (text, JSON-looking lines, a long line), then
                       ``f"{name}:{sessionId}:stderr-done"``

Every turn not cancelled ends with ``end_turn``. The agent also writes noise on stderr at
startup: none of it may ever reach a client's stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import acp
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    ClientCapabilities,
    Implementation,
    PermissionOption,
    ToolCallUpdate,
)

CRASH_EXIT_STATUS = 3

_PERMISSION_OPTIONS = [
    PermissionOption(option_id="allow", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject once", kind="reject_once"),
]


def _eprint(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _stderr_noise(name: str, session_id: str | None) -> None:
    """Lines that would corrupt or confuse a client if they leaked onto its stdout."""
    _eprint(f"{name}: this is stderr noise, not protocol")
    # Shaped like a JSON-RPC notification of an unknown method: a leak is logged by the SDK.
    _eprint(json.dumps({"jsonrpc": "2.0", "method": "stderr/leak", "params": {"agent": name}}))
    if session_id is not None:
        # Shaped like a real update for the live session: a leak shows up as an extra chunk.
        leak = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": session_id,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"{name}:LEAKED-FROM-STDERR"},
                },
            },
        }
        _eprint(json.dumps(leak))
    _eprint("{not json at all")
    _eprint(f"{name}: long line " + "x" * 20_000)


@dataclass
class _Session:
    id: str
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class SdkAgent:
    """The agent; every handler takes ``**kwargs`` so ``_meta`` entries are accepted."""

    def __init__(self, name: str, session_prefix: str) -> None:
        self._name = name
        self._prefix = session_prefix
        self._conn: Any = None
        self._sessions: dict[str, _Session] = {}
        self._minted = 0
        self._client_caps = ClientCapabilities()

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> acp.InitializeResponse:
        if client_capabilities is not None:
            self._client_caps = client_capabilities
        return acp.InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=False),
            agent_info=Implementation(name=self._name, version="0.0.0"),
        )

    async def new_session(
        self,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: list[Any] | None = None,
        **kwargs: Any,
    ) -> acp.NewSessionResponse:
        self._minted += 1
        session = _Session(id=f"{self._prefix}{self._minted}")
        self._sessions[session.id] = session
        return acp.NewSessionResponse(session_id=session.id)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.cancelled.set()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> acp.PromptResponse:
        session = self._sessions.get(session_id)
        if session is None:
            raise acp.RequestError.invalid_params({"sessionId": session_id, "reason": "unknown"})
        session.cancelled = asyncio.Event()
        text = " ".join(block.text for block in prompt if getattr(block, "type", None) == "text")
        command, _, rest = text.strip().partition(" ")
        handler = {
            "count": self._count,
            "permission": self._permission,
            "write": self._write,
            "read": self._read,
            "wait": self._wait,
            "crash": self._crash,
            "stderr": self._stderr,
        }.get(command, self._unknown)
        stop_reason = await handler(session, rest)
        return acp.PromptResponse(stop_reason=stop_reason)

    async def _say(self, session: _Session, text: str) -> None:
        await self._conn.session_update(session.id, acp.update_agent_message_text(text))

    async def _count(self, session: _Session, rest: str) -> str:
        for i in range(1, int(rest) + 1):
            if session.cancelled.is_set():
                return "cancelled"
            await self._say(session, f"{self._name}:{session.id}:{i}")
        return "end_turn"

    async def _ask(self, session: _Session, tool_call_id: str, title: str) -> str | None:
        """Ask permission for a tool call; the chosen option id, or None when cancelled."""
        await self._conn.session_update(
            session.id, acp.start_tool_call(tool_call_id, title, kind="edit", status="pending")
        )
        response = await self._conn.request_permission(
            session_id=session.id,
            tool_call=ToolCallUpdate(tool_call_id=tool_call_id, title=title, kind="edit"),
            options=_PERMISSION_OPTIONS,
        )
        outcome = response.outcome
        return outcome.option_id if isinstance(outcome, AllowedOutcome) else None

    async def _permission(self, session: _Session, rest: str) -> str:
        option_id = await self._ask(session, "perm-1", "Do the thing")
        await self._say(session, f"{self._name}:outcome:{option_id or 'cancelled'}")
        return "end_turn"

    async def _write(self, session: _Session, rest: str) -> str:
        path, _, content = rest.partition(" ")
        fs = self._client_caps.fs
        if fs is None or not fs.write_text_file:
            await self._say(session, f"{self._name}:write:unsupported")
            return "end_turn"
        option_id = await self._ask(session, "write-1", f"Write {path}")
        if option_id != "allow":
            await self._say(session, f"{self._name}:write:denied")
            return "end_turn"
        await self._conn.write_text_file(session_id=session.id, path=path, content=content)
        await self._conn.session_update(
            session.id, acp.update_tool_call("write-1", status="completed")
        )
        await self._say(session, f"{self._name}:wrote:{path}")
        return "end_turn"

    async def _read(self, session: _Session, rest: str) -> str:
        fs = self._client_caps.fs
        if fs is None or not fs.read_text_file:
            await self._say(session, f"{self._name}:read:unsupported")
            return "end_turn"
        response = await self._conn.read_text_file(session_id=session.id, path=rest)
        await self._say(session, f"{self._name}:read:{response.content}")
        return "end_turn"

    async def _wait(self, session: _Session, rest: str) -> str:
        await self._say(session, f"{self._name}:{session.id}:waiting")
        await session.cancelled.wait()
        return "cancelled"

    async def _crash(self, session: _Session, rest: str) -> str:
        await self._say(session, f"{self._name}:{session.id}:crashing")
        _eprint(f"{self._name}: crashing on purpose with status {CRASH_EXIT_STATUS}")
        os._exit(CRASH_EXIT_STATUS)

    async def _stderr(self, session: _Session, rest: str) -> str:
        _stderr_noise(self._name, session.id)
        await self._say(session, f"{self._name}:{session.id}:stderr-done")
        return "end_turn"

    async def _unknown(self, session: _Session, rest: str) -> str:
        await self._say(session, f"{self._name}:{session.id}:unknown")
        return "end_turn"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="agentInfo.name and the tag of every chunk")
    parser.add_argument("--session-prefix", default="s", help="session ids are PREFIX1, PREFIX2...")
    args = parser.parse_args(argv)
    _stderr_noise(args.name, None)
    asyncio.run(acp.run_agent(SdkAgent(args.name, args.session_prefix)))


if __name__ == "__main__":
    main()
