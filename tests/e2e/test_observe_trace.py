"""
The tests of ``tests/observe/test_trace.py`` that start other processes (kept here so that
``pytest tests/observe`` runs in-process only).
"""

from __future__ import annotations

import json
import subprocess
import sys

import trio
import trio.testing

from tests.observe.test_trace import DEMO, TIMEOUT, read_records


async def test_stdio_trace_flag_records_the_session_and_keeps_stdout_clean(tmp_path):
    """`stdio --trace FILE` writes the trace; stdout still carries protocol lines only."""
    path = tmp_path / "trace.jsonl"
    lines = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}},
        },
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/new",
            "params": {"cwd": str(tmp_path), "mcpServers": []},
        },
    ]
    argv = [
        sys.executable,
        "-m",
        "acp_bridge",
        "stdio",
        "--agent",
        f"demo={DEMO}",
        "--trace",
        str(path),
    ]
    stdin = "".join(json.dumps(m) + "\n" for m in lines).encode()
    with trio.fail_after(30):
        result = await trio.run_process(argv, stdin=stdin, capture_stdout=True, capture_stderr=True)
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [m.get("id") for m in out if "id" in m] == [1, 2]
    records = read_records(path)
    assert {(r["link"], r["dir"]) for r in records} == {
        ("client:stdio", "in"),
        ("client:stdio", "out"),
        ("agent:demo", "in"),
        ("agent:demo", "out"),
    }
    sid = next(m for m in out if m.get("id") == 2)["result"]["sessionId"]
    assert any(r["msg"].get("result", {}).get("sessionId") == sid for r in records)


def test_trace_to_an_unwritable_path_is_a_usage_error(tmp_path):
    """A --trace FILE that cannot be created stops start-up with exit 2 and a message."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "acp_bridge",
            "stdio",
            "--agent",
            "a=true",
            "--trace",
            str(tmp_path / "no" / "such" / "dir"),
        ],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 2
    assert b"--trace" in result.stderr
    assert result.stdout == b""
