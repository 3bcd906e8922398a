"""
The tests of ``tests/attach/test_attach.py`` that start other processes (kept here so that
``pytest tests/attach`` runs in-process only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import trio
import trio.testing

from tests.attach.test_attach import TIMEOUT
from tests.support.fakes import TestClient
from tests.support.serve import start_serve


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
    config = tmp_path / "serve.toml"
    config.write_text(
        f"[agents.demo]\ncommand = {json.dumps(sys.executable)}\n"
        'args = ["-m", "acp_bridge", "demo-agent", "--chunk-delay", "0"]\n'
        '[websocket]\nport = 0\ntoken_file = "token"\n'
    )
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    serve_argv = [sys.executable, "-m", "acp_bridge", "serve", "--config", str(config)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve, url, _ = await start_serve(nursery, serve_argv, env)
            nursery.start_soon(_reap, serve)
            attach_argv = [
                sys.executable, "-m", "acp_bridge", "attach", url,
                "--token-file", str(tmp_path / "token"),
            ]  # fmt: skip
            shim = await trio.lowlevel.open_process(
                attach_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=env,
            )  # fmt: skip
            nursery.start_soon(_reap, shim)
            editor = TestClient(trio.StapledStream(shim.stdin, shim.stdout))
            nursery.start_soon(editor.read_loop)
            await editor.initialize()
            sid = await editor.new_session()
            response = await editor.prompt(sid, "count 3")
            assert response["result"]["stopReason"] == "end_turn"
            assert len(editor.updates(sid)) == 3
            assert all(isinstance(s, int) for s in editor.seqs(sid))
            assert shim.stdin is not None
            await shim.stdin.aclose()
            assert await shim.wait() == 0
            serve.terminate()
            assert await serve.wait() == 0


async def _reap(proc: trio.Process) -> None:
    try:
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
