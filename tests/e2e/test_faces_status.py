"""
The tests of ``tests/faces/test_status.py`` that start other processes (kept here so that
``pytest tests/faces`` runs in-process only).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import trio

from tests.faces.test_ws import open_peer
from tests.support.serve import serve_process


def test_status_module_imports_no_trio():
    """The rendering and the command are plain Python (checked in a fresh interpreter)."""
    code = "import sys, acp_bridge.faces.status; assert 'trio' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_status_command_shows_a_live_daemon_agent_and_session(tmp_path):
    """`acp-bridge status` against a real `serve`: agent with pid, session, JSON; and its trace."""
    trace = tmp_path / "trace.jsonl"
    with trio.fail_after(30):
        async with serve_process(tmp_path, "--trace", str(trace)) as served:
            port = served.port
            async with open_peer(port, token=served.token) as peer:
                new = await peer.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
                sid = new["result"]["sessionId"]
                url = f"ws://127.0.0.1:{port}/acp"  # the URL `serve` prints works too
                status_argv = [sys.executable, "-m", "acp_bridge", "status"]
                status_argv += ["--config", str(served.config), "--url", url]
                shown = await trio.run_process(
                    status_argv, capture_stdout=True, capture_stderr=True, env=served.env
                )
                text = shown.stdout.decode()
                demo = next(line for line in text.splitlines() if line.strip().startswith("demo "))
                assert re.search(r"demo\s+ready\s+pid \d+\s+restarts 0", demo)
                session = next(line for line in text.splitlines() if sid in line)
                assert re.search(r"agent demo\s+active\s+connection ws:[0-9a-f]{8}", session)
                as_json = await trio.run_process(
                    [*status_argv, "--json"],
                    capture_stdout=True,
                    capture_stderr=True,
                    env=served.env,
                )
                status = json.loads(as_json.stdout)
                assert status["sessions"][0]["sessionId"] == sid
                assert status["agents"][0]["pid"] > 0
            served.proc.send_signal(signal.SIGTERM)
            assert await served.proc.wait() == 0
        # `serve --trace`: the session on both links, written out by the time it exited.
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        links = {(r["link"].split(":")[0], r["dir"]) for r in records}
        assert links == {("client", "in"), ("client", "out"), ("agent", "in"), ("agent", "out")}
        assert any(r["msg"].get("result", {}).get("sessionId") == sid for r in records)
