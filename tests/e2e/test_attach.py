"""
The tests of ``tests/attach/test_attach.py`` that start other processes (kept here so that
``pytest tests/attach`` runs in-process only).
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from acp_bridge.protocol.wire import TAKE_OVER_HINT
from tests.attach.test_attach import TIMEOUT
from tests.support.fakes import TestClient
from tests.support.serve import serve_process

if TYPE_CHECKING:
    from pathlib import Path


def test_missing_token_file_is_a_usage_error_before_any_connection(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "acp_bridge",
            "attach",
            "ws://127.0.0.1:9/acp",
            "--token-file",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert result.stdout == b""
    assert b"token file" in result.stderr
    assert b"No such file" in result.stderr


async def test_attach_process_runs_a_turn_through_a_serve_process(tmp_path):
    """The real commands: `serve` with the demo agent, `attach` spoken to over its stdio."""
    with trio.fail_after(30):
        async with (
            serve_process(tmp_path, demo_args=["--chunk-delay", "0"]) as served,
            trio.open_nursery() as nursery,
        ):
            editor, shim = await _editor(nursery, served.url, tmp_path, served.env)
            await editor.initialize()
            sid = await editor.new_session()
            response = await editor.prompt(sid, "count 3")
            assert response["result"]["stopReason"] == "end_turn"
            assert len(editor.updates(sid)) == 3
            assert all(isinstance(s, int) for s in editor.seqs(sid))
            assert shim.stdin is not None
            await shim.stdin.aclose()  # the editor goes: the shim ends cleanly
            assert await shim.wait() == 0
            served.proc.terminate()
            assert await served.proc.wait() == 0
            nursery.cancel_scope.cancel()


async def test_an_editor_behind_attach_watches_a_session_another_editor_owns(tmp_path):
    """Two editors, each behind its own `attach` process, one `serve` with the demo agent: the
    second passes ``_meta.acp_bridge.watch`` (and ``approve``) through its shim and follows
    the first one's session: the replay, every later update in the owner's order, its prompt
    refused with the take-over hint, and a permission request it answers first (the owner's
    is withdrawn)."""
    work = tmp_path / "w"
    work.mkdir()
    with trio.fail_after(30):
        async with (
            serve_process(tmp_path, demo_args=["--chunk-delay", "0"]) as served,
            trio.open_nursery() as nursery,
        ):
            owner, _ = await _editor(nursery, served.url, tmp_path, served.env)
            watcher, _ = await _editor(nursery, served.url, tmp_path, served.env)
            await owner.initialize()
            result = await owner.call("session/new", {"cwd": str(work), "mcpServers": []})
            sid = result["sessionId"]
            assert (await owner.prompt(sid, "count 3"))["result"]["stopReason"] == "end_turn"
            await watcher.initialize()
            ours = {"watch": True, "approve": True}
            loaded = await watcher.call(
                "session/load",
                {
                    "sessionId": sid,
                    "cwd": str(work),
                    "mcpServers": [],
                    "_meta": {"acp_bridge": ours},
                },
            )
            assert loaded["_meta"]["acp_bridge"]["watch"] is True
            assert loaded["_meta"]["acp_bridge"]["owner"] is not None
            assert watcher.updates(sid) == owner.updates(sid) != []
            assert (await owner.prompt(sid, "count 4"))["result"]["stopReason"] == "end_turn"
            await watcher.wait_for(lambda _: len(watcher.updates(sid)) == len(owner.updates(sid)))
            assert watcher.updates(sid) == owner.updates(sid)
            refused = await watcher.prompt(sid, "count 1")
            assert refused["error"]["code"] == -32002
            assert TAKE_OVER_HINT in refused["error"]["message"]
            # A permission request, shown to both: the watcher answers first.
            turn = {"sessionId": sid, "prompt": [{"type": "text", "text": "write notes.txt hi"}]}
            await owner.send(
                {"jsonrpc": "2.0", "id": "turn", "method": "session/prompt", "params": turn}
            )
            asked_owner = await owner.agent_requests.receive()
            asked_watcher = await watcher.agent_requests.receive()
            assert asked_owner["method"] == asked_watcher["method"] == "session/request_permission"
            await watcher.send(_selected(asked_watcher["id"], "reject_once"))
            await owner.wait_for(
                lambda m: (
                    m.get("method") == "$/cancel_request"
                    and m["params"]["requestId"] == asked_owner["id"]
                )
            )
            answer = await owner.wait_for(lambda m: m.get("id") == "turn")
            assert answer["result"]["stopReason"] == "end_turn"
            assert "Permission denied" in "".join(owner.updates(sid))
            assert not (work / "notes.txt").exists()
            served.proc.terminate()
            assert await served.proc.wait() == 0
            nursery.cancel_scope.cancel()


def _selected(request_id: Any, option: str) -> dict[str, Any]:
    outcome = {"outcome": "selected", "optionId": option}
    return {"jsonrpc": "2.0", "id": request_id, "result": {"outcome": outcome}}


async def _editor(
    nursery: trio.Nursery, url: str, tmp_path: Path, env: dict[str, str]
) -> tuple[TestClient, trio.Process]:
    """An editor: an `attach` process spoken to over its stdio (and the process)."""
    argv = [
        sys.executable, "-m", "acp_bridge", "attach", url,
        "--token-file", str(tmp_path / "token"),
    ]  # fmt: skip
    shim = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    nursery.start_soon(_reap, shim)
    assert shim.stdin is not None
    assert shim.stdout is not None
    editor = TestClient(trio.StapledStream(shim.stdin, shim.stdout))
    nursery.start_soon(editor.read_loop)
    return editor, shim


async def _reap(proc: trio.Process) -> None:
    try:
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
