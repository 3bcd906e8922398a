"""
Both SDKs' Streamable HTTP clients against ``acp-bridge serve`` in front of the demo agent:
the TypeScript SDK's ``createHttpStream`` (``tests/support/peers/http_client.mts``, run with
tsx) and the Python SDK's ``create_http_stream``, each with the daemon's token: initialize,
session/new, a streamed prompt, a permission answered, a cancel; then a new connection loads
the session, sees its history and prompts again. The Python SDK's client also watches a
session another of its connections owns (``_meta.acp_bridge.watch`` on its load).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import acp
import trio
from acp.http import create_http_stream
from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation

from acp_bridge.protocol.wire import TAKE_OVER_HINT
from tests.support.peers.npm import INSTALL, npm_peer_bin, npm_peer_dir
from tests.support.peers.sdk_client import RecordingClient
from tests.support.serve import serve_process

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "peers" / "http_client.mts"
TOKEN = "http-interop-token-" + "t" * 32
#: the demo agent's pace: a cancel lands in the middle of its "slow" turn
CHUNK_DELAY = "0.05"


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[str]:
    """``acp-bridge serve`` with the demo agent; its ACP URL for HTTP clients."""
    delay = ["--chunk-delay", CHUNK_DELAY]
    async with serve_process(tmp_path, demo_args=delay, token=TOKEN) as served:
        yield served.url.replace("ws://", "http://", 1)


async def test_the_typescript_sdks_http_client_through_serve(tmp_path):
    npm_peer_dir("@agentclientprotocol/sdk")
    tsx = npm_peer_bin("tsx")
    work = tmp_path / "w"
    work.mkdir()
    with trio.fail_after(90):
        async with serving(tmp_path) as url:
            done = await trio.run_process(
                [str(tsx), str(SCRIPT), str(INSTALL / "node_modules"), url, TOKEN, str(work)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=tmp_path,
            )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report["loadSession"] is True
    assert report["countStop"] == "end_turn"
    assert report["countTexts"] == ["1 ", "2 ", "3 ", "4 ", "5"]
    assert report["writeStop"] == "end_turn"
    assert report["permissions"] == ["Write notes.txt"]
    assert report["written"] == [f"{work}/notes.txt=hi"]
    assert report["cancelStop"] == "cancelled"
    assert 1 <= report["slowChunks"] < 50
    # The second connection: the whole history (the user's prompts among it), then a turn.
    history = report["history"]
    assert [t for t in history if t not in ("count 5", "write notes.txt hi", "slow")] == report[
        "firstTexts"
    ]
    assert history[0] == "count 5"
    assert "user_message_chunk" in report["historyKinds"]
    assert report["againStop"] == "end_turn"
    assert report["againTexts"] == ["1 ", "2 ", "3"]


# -- the Python SDK -------------------------------------------------------------------------------


CAPABILITIES = ClientCapabilities(
    fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=False
)


async def _python_scenario(url: str, work: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    first = RecordingClient(work)
    transport = create_http_stream(url, headers=headers)
    conn = acp.connect_to_agent(first, transport)
    init = await conn.initialize(
        protocol_version=acp.PROTOCOL_VERSION,
        client_capabilities=CAPABILITIES,
        client_info=Implementation(name="py-http", version="0"),
    )
    report["loadSession"] = init.agent_capabilities.load_session
    sid = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
    counted = await conn.prompt(session_id=sid, prompt=[acp.text_block("count 5")])
    report["count"] = (counted.stop_reason, first.texts(sid))
    wrote = await conn.prompt(session_id=sid, prompt=[acp.text_block("write notes.txt hi")])
    report["write"] = (wrote.stop_reason, [p.tool_call.title for p in first.permissions])
    report["written"] = (work / "notes.txt").read_text()
    before = len(first.texts(sid))
    slow = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[acp.text_block("slow")]))
    await first.wait_until(lambda: len(first.texts(sid)) > before)  # (its first chunk)
    await conn.cancel(session_id=sid)
    report["cancel"] = ((await slow).stop_reason, len(first.texts(sid)) - before)
    report["first"] = first.texts(sid)
    await transport.close()

    second = RecordingClient(work)
    transport = create_http_stream(url, headers=headers)
    conn = acp.connect_to_agent(second, transport)
    await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=CAPABILITIES)
    await conn.load_session(session_id=sid, cwd=str(work), mcp_servers=[])
    # (Written before the load's answer; a client reading two streams may see it a little
    # after.)
    await second.wait_until(lambda: len(second.texts(sid)) >= len(report["first"]))
    report["history"] = second.texts(sid)
    again = await conn.prompt(session_id=sid, prompt=[acp.text_block("count 3")])
    report["again"] = (again.stop_reason, second.texts(sid)[len(report["history"]) :])
    await transport.close()
    return report


def _in_asyncio(
    scenario: Callable[[str, Path], Awaitable[dict[str, Any]]], url: str, work: Path
) -> dict[str, Any]:
    """Run an SDK scenario on its own asyncio loop (in a worker thread), bounded."""

    async def bounded() -> dict[str, Any]:
        async with asyncio.timeout(60):
            return await scenario(url, work)

    return asyncio.run(bounded())


async def test_the_python_sdks_http_client_through_serve(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    with trio.fail_after(90):
        async with serving(tmp_path) as url:
            report = await trio.to_thread.run_sync(
                functools.partial(_in_asyncio, _python_scenario, url, work)
            )
    assert report["loadSession"] is True
    assert report["count"] == ("end_turn", ["1 ", "2 ", "3 ", "4 ", "5"])
    assert report["write"] == ("end_turn", ["Write notes.txt"])
    assert report["written"] == "hi"
    stop, slow_chunks = report["cancel"]
    assert stop == "cancelled"
    assert 1 <= slow_chunks < 50
    assert report["history"] == report["first"]
    assert report["again"] == ("end_turn", ["1 ", "2 ", "3"])


async def _watch_scenario(url: str, work: Path) -> dict[str, Any]:
    """One connection owns a session; another watches it (``load_session`` with the
    bridge's ``_meta``, as the SDK passes extra keyword arguments)."""
    report: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    owner, watcher = RecordingClient(work), RecordingClient(work)
    owner_transport = create_http_stream(url, headers=headers)
    watcher_transport = create_http_stream(url, headers=headers)
    owner_conn = acp.connect_to_agent(owner, owner_transport)
    watcher_conn = acp.connect_to_agent(watcher, watcher_transport)
    for conn in (owner_conn, watcher_conn):
        await conn.initialize(
            protocol_version=acp.PROTOCOL_VERSION, client_capabilities=CAPABILITIES
        )
    sid = (await owner_conn.new_session(cwd=str(work), mcp_servers=[])).session_id
    await owner_conn.prompt(session_id=sid, prompt=[acp.text_block("count 3")])
    loaded = await watcher_conn.load_session(
        session_id=sid, cwd=str(work), mcp_servers=[], acp_bridge={"watch": True}
    )
    report["loaded"] = (loaded.field_meta or {}).get("acp_bridge", {})
    await watcher.wait_until(lambda: len(watcher.texts(sid)) >= 3)
    report["history"] = watcher.texts(sid)
    await owner_conn.prompt(session_id=sid, prompt=[acp.text_block("count 5")])
    await watcher.wait_until(lambda: len(watcher.texts(sid)) >= 8)
    report["watched"] = watcher.texts(sid)
    report["owner"] = owner.texts(sid)
    try:
        await watcher_conn.prompt(session_id=sid, prompt=[acp.text_block("count 1")])
    except acp.RequestError as exc:
        report["refused"] = (exc.code, str(exc))
    await watcher_transport.close()
    await owner_transport.close()
    return report


async def test_the_python_sdks_http_client_watches_a_session_another_connection_owns(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    with trio.fail_after(90):
        async with serving(tmp_path) as url:
            report = await trio.to_thread.run_sync(
                functools.partial(_in_asyncio, _watch_scenario, url, work)
            )
    assert report["loaded"]["watch"] is True
    assert report["loaded"]["owner"].startswith("http:")
    assert report["history"] == ["1 ", "2 ", "3"]
    assert report["watched"] == report["owner"] == ["1 ", "2 ", "3", "1 ", "2 ", "3 ", "4 ", "5"]
    code, message = report["refused"]
    assert code == -32002
    assert TAKE_OVER_HINT in message
