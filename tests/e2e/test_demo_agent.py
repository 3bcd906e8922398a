"""
The tests of ``tests/demo/test_agent.py`` that start other processes (kept here so that
``pytest tests/demo`` runs in-process only).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import trio
import trio.testing


def sdk_script(cwd: str) -> Any:
    """An asyncio coroutine: the official ACP SDK client drives a spawned demo agent through a
    session. The SDK validates what it receives with pydantic, so finishing proves the shapes."""
    import acp
    from acp.schema import (
        AllowedOutcome,
        ClientCapabilities,
        FileSystemCapabilities,
        ReadTextFileResponse,
        RequestPermissionResponse,
        WriteTextFileResponse,
    )

    class RecordingClient:
        def __init__(self) -> None:
            self.updates: list[Any] = []
            self.written: dict[str, str] = {}
            self.asked: list[str] = []

        async def request_permission(self, options, session_id, tool_call, **kwargs):
            self.asked.append(tool_call.title)
            allow = next(o for o in options if o.kind == "allow_once")
            return RequestPermissionResponse(
                outcome=AllowedOutcome(option_id=allow.option_id, outcome="selected")
            )

        async def session_update(self, session_id, update, **kwargs):
            self.updates.append(update)

        async def write_text_file(self, content, path, session_id, **kwargs):
            self.written[path] = content
            return WriteTextFileResponse()

        async def read_text_file(self, path, session_id, limit=None, line=None, **kwargs):
            return ReadTextFileResponse(content=self.written[path])

    def kinds(client: RecordingClient) -> list[str]:
        kinds = [type(u).__name__ for u in client.updates]
        client.updates.clear()
        return kinds

    async def main() -> None:
        client = RecordingClient()
        code = (
            "import sys; from acp_bridge.demo.agent import run_demo_agent_stdio; "
            "raise SystemExit(run_demo_agent_stdio(sys.argv[1:]))"
        )
        async with acp.spawn_agent_process(
            client, sys.executable, "-c", code, "--chunk-delay", "0"
        ) as (conn, _process):
            caps = ClientCapabilities(
                fs=FileSystemCapabilities(read_text_file=True, write_text_file=True)
            )
            init = await conn.initialize(protocol_version=1, client_capabilities=caps)
            assert init.protocol_version == 1
            assert init.agent_capabilities.load_session is True
            session = await conn.new_session(cwd=cwd)
            assert session.config_options is not None
            text = acp.text_block
            reply = await conn.prompt(session_id=session.session_id, prompt=[text("hello world")])
            assert reply.stop_reason == "end_turn"
            # The commands update follows new_session's response, before this turn's updates.
            assert kinds(client) == [
                "AvailableCommandsUpdate",
                "AgentPlanUpdate",
                *["AgentMessageChunk"] * 4,
                "AgentPlanUpdate",
            ]
            reply = await conn.prompt(
                session_id=session.session_id, prompt=[text("write notes.txt hi there")]
            )
            assert reply.stop_reason == "end_turn"
            assert client.asked == ["Write notes.txt"]
            assert client.written == {os.path.join(cwd, "notes.txt"): "hi there"}
            assert kinds(client)[:3] == ["ToolCallStart", "ToolCallProgress", "ToolCallProgress"]
            reply = await conn.prompt(
                session_id=session.session_id, prompt=[text("read notes.txt")]
            )
            assert reply.stop_reason == "end_turn"
            assert (
                "".join(
                    u.content.text
                    for u in client.updates
                    if type(u).__name__ == "AgentMessageChunk"
                )
                == "notes.txt:\nhi there"
            )
            kinds(client)
            await conn.set_session_mode(session_id=session.session_id, mode_id="code")
            options = await conn.set_config_option(
                config_id="style", session_id=session.session_id, value="fancy"
            )
            assert options.config_options[0].current_value == "fancy"
            listed = await conn.list_sessions()
            assert [s.session_id for s in listed.sessions] == [session.session_id]
            loaded = await conn.load_session(cwd=cwd, session_id=session.session_id)
            assert loaded.modes is not None
            assert loaded.modes.current_mode_id == "code"
            replay = kinds(client)
            assert replay[0] == "CurrentModeUpdate"
            assert replay[1:] == ["UserMessageChunk", "AgentMessageChunk"] * 3
            await conn.close_session(session_id=session.session_id)

    return main()


async def test_sdk_client_completes_turns_against_a_spawned_demo_agent(tmp_path):
    """The official SDK client initializes, prompts, writes, reads, sets mode and config, lists,
    loads and closes against the demo agent run over real stdio."""
    with trio.fail_after(20):
        await trio.to_thread.run_sync(asyncio.run, sdk_script(str(tmp_path)))
