"""
The TypeScript SDK's experimental v2 client (``@agentclientprotocol/sdk`` 2.4.0, run with
``tsx``) drives ``acp-bridge stdio --experimental-v2`` in front of the demo agent and of the
official Python SDK's agent (tests/support/peers/sdk_agent.py); every line the bridge sends it is
checked against the pinned v2 schema (docs/v2.md).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import trio

from tests.support.peers.npm import INSTALL, npm_peer_bin, npm_peer_dir
from tests.support.v2_schema import check_to_client

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "peers" / "v2_client.mts"
SDK_AGENT = shlex.join(
    [sys.executable, str(ROOT / "tests" / "support" / "peers" / "sdk_agent.py"), "--name", "A"]
)
DEMO = shlex.join([sys.executable, "-m", "acp_bridge", "demo-agent", "--chunk-delay", "0"])
#: the requests the script sends, in order (the SDK numbers them from 0)
ASKED = [
    "initialize",
    "session/new",
    "session/prompt",
    "session/prompt",
    "session/list",
    "session/resume",
    "session/close",
]


async def _drive(tmp_path: Path, agent: str, second_prompt: str) -> dict[str, Any]:
    npm_peer_dir("@agentclientprotocol/sdk")
    tsx = npm_peer_bin("tsx")
    traffic = tmp_path / "traffic.ndjson"
    argv = [
        str(tsx),
        str(SCRIPT),
        str(INSTALL / "node_modules"),
        str(traffic),
        second_prompt,
        "--",
        sys.executable,
        "-m",
        "acp_bridge",
        "stdio",
        "--experimental-v2",
        "--agent",
        agent,
    ]
    with trio.fail_after(90):
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, env=dict(os.environ), cwd=tmp_path
        )
    report: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    asked = dict(enumerate(ASKED))
    lines = [line for line in traffic.read_text().splitlines() if line.strip()]
    assert lines
    for line in lines:
        check_to_client(json.loads(line), asked)
    return report


async def test_the_sdks_v2_client_through_the_bridge_in_front_of_the_python_sdks_agent(tmp_path):
    report = await _drive(tmp_path, f"sdk={SDK_AGENT}", "permission")
    sid = report["sessionId"]
    assert report["protocolVersion"] == 2
    assert isinstance(report["messageId"], str)
    assert report["text"] == "".join(f"A:{sid}:{i}" for i in (1, 2, 3))
    # the permission round trip: the v2 shape, allowed, and the agent saw the choice
    assert report["permissions"] == [{"title": "Do the thing", "subject": "tool_call"}]
    assert report["permissionText"] == "A:outcome:allow"
    assert sid in report["listed"]
    assert report["replayed"] == [
        {
            "kind": "user_message",
            "messageId": report["replayed"][0]["messageId"],
            "text": "count 3",
        },
        {
            "kind": "agent_message",
            "messageId": report["replayed"][1]["messageId"],
            "text": report["text"],
        },
        {
            "kind": "user_message",
            "messageId": report["replayed"][2]["messageId"],
            "text": "permission",
        },
        {
            "kind": "agent_message",
            "messageId": report["replayed"][3]["messageId"],
            "text": "A:outcome:allow",
        },
    ]
    assert len({r["messageId"] for r in report["replayed"]}) == 4
    assert report["close"] == {}


async def test_the_sdks_v2_client_through_the_bridge_in_front_of_the_demo_agent(tmp_path):
    report = await _drive(tmp_path, f"demo={DEMO}", "hello there")
    assert report["text"] == "1 2 3"
    assert report["permissionText"].endswith("hello there")
    modes = [o for o in report["resume"]["configOptions"] if o["configId"] == "mode"]
    assert modes[0]["currentValue"] == "ask"
    kinds = [r["kind"] for r in report["replayed"]]
    assert kinds == ["user_message", "agent_message", "user_message", "agent_message"]
    assert report["close"] == {}
