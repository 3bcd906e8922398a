"""
`acp-bridge trace show FILE --html` on a real trace: `acp-bridge stdio --trace FILE` with the
demo agent behind it, driven by a client that answers the agent's requests (a permission, a
file write), then the trace rendered by the command, every message in the page in order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import trio

from tests.e2e.test_stdio import BridgeProcess, _reap
from tests.observe.test_sequence import TraceHtml
from tests.observe.test_trace import read_records

if TYPE_CHECKING:
    from pathlib import Path

TIMEOUT = 30
DEMO = f"{sys.executable} -m acp_bridge demo-agent --chunk-delay 0"
PROMPT = "write notes.txt hello <b>from</b> the agent"
#: The session's cwd: nothing touches it (this client answers the write without writing).
CWD = "/home/me/project"


async def record_demo_trace(trace: Path) -> list[dict[str, Any]]:
    """
    A traced `acp-bridge stdio` session of the demo agent: initialize, session/new, a prompt
    that writes a file (the agent asks permission, this client allows it once, then answers
    the write). The bridge exits when its stdin closes; returns the trace's records.
    """
    argv = [sys.executable, "-m", "acp_bridge", "stdio", "--agent", f"demo={DEMO}"]
    argv += ["--trace", str(trace)]
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            nursery.start_soon(_reap, proc)
            bridge = BridgeProcess(proc)
            capabilities = {"fs": {"readTextFile": True, "writeTextFile": True}}
            await bridge.call(
                "initialize", {"protocolVersion": 1, "clientCapabilities": capabilities}
            )
            new = await bridge.call("session/new", {"cwd": CWD, "mcpServers": []})
            sid = new["result"]["sessionId"]
            prompt = [{"type": "text", "text": PROMPT}]
            await bridge.send(
                {
                    "jsonrpc": "2.0",
                    "id": "turn-1",
                    "method": "session/prompt",
                    "params": {"sessionId": sid, "prompt": prompt},
                }
            )
            while True:
                msg = await bridge.next_message()
                if msg.get("id") == "turn-1" and "method" not in msg:
                    break
                if msg.get("method") == "session/request_permission":
                    chosen = {"outcome": "selected", "optionId": "allow-once"}
                    answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {"outcome": chosen}}
                    await bridge.send(answer)
                elif msg.get("method") == "fs/write_text_file":
                    assert msg["params"]["content"] == "hello <b>from</b> the agent"
                    await bridge.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            assert msg["result"]["stopReason"] == "end_turn"
            assert proc.stdin is not None
            await proc.stdin.aclose()  # the bridge ends, its trace written and closed
            await proc.wait()
    return read_records(trace)


def expected_labels(records: list[dict[str, Any]]) -> list[str]:
    """What each record's arrow should say: its method, or result / error."""
    labels = []
    for record in records:
        msg = record["msg"]
        labels.append(msg.get("method") or ("error" if "error" in msg else "result"))
    return labels


async def test_a_real_trace_renders_every_message_in_order(tmp_path):
    trace, page = tmp_path / "trace.jsonl", tmp_path / "trace.html"
    records = await record_demo_trace(trace)
    methods = {r["msg"].get("method") for r in records}
    assert {"session/request_permission", "fs/write_text_file", "session/update"} <= methods
    argv = [sys.executable, "-m", "acp_bridge", "trace", "show", str(trace), "--html"]
    with trio.fail_after(TIMEOUT):
        done = await trio.run_process(
            [*argv, "--output", str(page)], capture_stdout=True, capture_stderr=True
        )
    assert done.stdout == b""
    assert f"({len(records)} messages)" in done.stderr.decode()
    view = TraceHtml(page.read_text(encoding="utf-8"))
    assert view.labels == expected_labels(records)
    assert [row["id"] for row in view.rows] == [f"m{i}" for i in range(1, len(records) + 1)]
    for row, record in zip(view.rows, records, strict=True):
        assert json.loads(row["json"]) == record["msg"]  # the whole message, on demand
    asks = [row for row in view.rows if row["label"] == "session/request_permission"]
    assert len(asks) == 2  # agent → bridge, bridge → client
    for ask in asks:
        assert '"Write notes.txt" (edit) [Allow once / ' in ask["text"]
        answer = next(row for row in view.rows if row["id"] == ask["data-partner"])
        assert answer["label"] == "result"
        assert "outcome selected allow-once" in answer["text"]
    prompts = [row for row in view.rows if row["label"] == "session/prompt"]
    assert [json.dumps(PROMPT)[1:-1] in row["text"] for row in prompts] == [True, True]

    # The same, bounded: the first 5 messages and a note on the rest.
    with trio.fail_after(TIMEOUT):
        done = await trio.run_process([*argv, "--limit", "5"], capture_stdout=True)
    bounded = done.stdout.decode()
    assert TraceHtml(bounded).labels == expected_labels(records)[:5]
    assert f"Showing the first 5 of {len(records)} messages" in bounded
