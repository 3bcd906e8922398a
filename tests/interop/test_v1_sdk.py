"""
The TypeScript SDK's v1 client (``@agentclientprotocol/sdk`` 2.4.0, run with ``tsx``) as a
stock client (no ``_meta``) of ``acp-bridge stdio`` in front of the official Python SDK's
agent (tests/support/peers/sdk_agent.py): a permission request it never answers is withdrawn
with ``$/cancel_request`` when the bridge's deadline ends it or the agent dies, and it gets
no ``_acp_bridge/*`` message; with ``clientCapabilities.session.notices`` it gets the notices
(the agent's crash, the timed-out permission), without it none. Every line the bridge sends
is checked against the pinned v1 schema (and parsed by the SDK's own schema as it arrives).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.peers.npm import INSTALL, npm_peer_bin, npm_peer_dir
from tests.support.peers.sdk_agent import CRASH_EXIT_STATUS
from tests.support.v1_schema import check_to_client

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "peers" / "v1_client.mts"
SDK_AGENT = ROOT / "tests" / "support" / "peers" / "sdk_agent.py"
#: the bridge's deadline for an answer (short: the test waits it out)
ASK_TIMEOUT = 1.0


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "bridge.toml"
    config.write_text(
        f"[agents.A]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(SDK_AGENT))}, '--name', 'A']\n"
        f"[policy]\nask_timeout = {ASK_TIMEOUT}\n"
    )
    return config


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _drive(tmp_path: Path, scenario: str, notices: bool) -> tuple[dict[str, Any], list[Any]]:
    """Run the script; (its report, every message the bridge sent it, each checked)."""
    npm_peer_dir("@agentclientprotocol/sdk")
    tsx = npm_peer_bin("tsx")
    traffic = tmp_path / "traffic"
    bridge = [sys.executable, "-m", "acp_bridge", "stdio", "--config", str(_config(tmp_path))]
    argv = [
        str(tsx),
        str(SCRIPT),
        str(INSTALL / "node_modules"),
        str(traffic),
        scenario,
        "notices" if notices else "none",
        "--",
        *bridge,
    ]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with trio.fail_after(90):
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, env=env, cwd=tmp_path, check=False
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    asked = {m["id"]: m["method"] for m in _lines(Path(f"{traffic}.out.ndjson")) if "method" in m}
    sent = _lines(Path(f"{traffic}.in.ndjson"))
    assert sent
    for msg in sent:
        check_to_client(msg, asked)
    # A stock client: nothing of the bridge's own extensions, ever.
    assert not [m for m in sent if str(m.get("method", "")).startswith("_")]
    return report, sent


def _withdrawn(sent: list[Any]) -> list[Any]:
    return [m["params"]["requestId"] for m in sent if m.get("method") == "$/cancel_request"]


@pytest.mark.parametrize("notices", [False, True], ids=["stock", "notices"])
async def test_a_permission_nobody_answers_is_withdrawn_at_the_deadline(tmp_path, notices):
    report, sent = await _drive(tmp_path, "timeout", notices)
    [sid] = report["sessions"]
    [asked] = report["permissions"]
    assert asked["sessionId"] == sid
    assert _withdrawn(sent) == [asked["requestId"]]
    assert report["withdrawn"] == [asked["requestId"]]  # (the SDK aborted its handler)
    [prompt] = report["prompts"]
    assert prompt["result"]["stopReason"] == "end_turn"
    assert report["texts"][sid][-1] == "A:outcome:reject"  # a timeout never grants
    if notices:
        assert report["notices"] == {
            sid: [
                {
                    "sessionUpdate": "notice",
                    "severity": "warning",
                    "title": "Permission denied: Do the thing",
                    "description": f"Nobody answered in time (no answer within {ASK_TIMEOUT:g}s).",
                }
            ]
        }
    else:
        assert report["notices"] == {}


@pytest.mark.parametrize("notices", [False, True], ids=["stock", "notices"])
async def test_a_permission_is_withdrawn_when_its_agent_crashes(tmp_path, notices):
    report, sent = await _drive(tmp_path, "crash", notices)
    waiting, crashing = report["sessions"]
    [asked] = report["permissions"]
    assert asked["sessionId"] == waiting
    assert _withdrawn(sent) == [asked["requestId"]]
    assert report["withdrawn"] == [asked["requestId"]]
    assert all("error" in prompt for prompt in report["prompts"]), report["prompts"]
    if notices:
        title = f"Agent 'A' exited (status {CRASH_EXIT_STATUS}); restarting when needed"
        for sid in (waiting, crashing):
            [notice] = report["notices"][sid]
            assert notice["severity"] == "error"
            assert notice["title"] == title
    else:
        assert report["notices"] == {}
