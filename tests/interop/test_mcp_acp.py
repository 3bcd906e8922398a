"""
MCP over ACP with the official peers (docs/protocol.md, "MCP servers over ACP"): the
TypeScript SDK's ``McpOverAcpProvider`` as the client (tests/support/peers/mcp_acp_client.mts)
in front of ``acp-bridge stdio``, behind it agents on the SDK's agent app calling with its
``McpOverAcpCaller`` (mcp_acp_agent.mts), and an agent that speaks HTTP MCP only, its client the
Python ``mcp`` SDK (mcp_http_agent.py). Every line the bridge sends the client and the agents
is checked against the pinned v1 unstable schema.
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
from tests.support.v1_schema import check_to_agent, check_to_client, requests_of

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "tests" / "support" / "peers"
DEMO = shlex.join([sys.executable, "-m", "acp_bridge", "demo-agent", "--chunk-delay", "0"])


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ts_agent(tsx: Path, name: str, tmp_path: Path) -> str:
    argv = [str(tsx), str(PEERS / "mcp_acp_agent.mts"), str(INSTALL / "node_modules")]
    return f"{name}={shlex.join([*argv, name, str(tmp_path / f'agent-{name}.ndjson')])}"


async def _drive(tmp_path: Path, scenario: str, agents: list[str]) -> dict[str, Any]:
    """Run the client script over ``acp-bridge stdio`` with ``agents``; check every line."""
    npm_peer_dir("@agentclientprotocol/sdk")
    tsx = npm_peer_bin("tsx")
    traffic = tmp_path / "client.ndjson"
    argv = [str(tsx), str(PEERS / "mcp_acp_client.mts"), str(INSTALL / "node_modules")]
    argv += [str(traffic), scenario, "--", sys.executable, "-m", "acp_bridge", "stdio"]
    for agent in agents:
        argv += ["--agent", agent]
    with trio.fail_after(120):
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, env=dict(os.environ), cwd=tmp_path
        )
    assert done.stdout.strip(), done.stderr.decode(errors="replace")[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    report["_to_client"] = _check_traffic(tmp_path, traffic)
    return report


def _check_traffic(tmp_path: Path, traffic: Path) -> list[dict[str, Any]]:
    """Every line the bridge sent the client and each agent, checked; the client's returned."""
    to_client = _lines(traffic)
    assert to_client
    asked = requests_of(_lines(Path(f"{traffic}.sent")))
    for msg in to_client:
        check_to_client(msg, asked, unstable=True)
    checked = 0
    for path in tmp_path.glob("agent-*.ndjson"):
        asked = requests_of(_lines(Path(f"{path}.sent")))
        for msg in _lines(path):
            check_to_agent(msg, asked, unstable=True)
            checked += 1
    assert checked
    return to_client


def _agent_lines(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    return _lines(tmp_path / f"agent-{name}.ndjson")


async def test_two_sdk_agents_call_the_sdk_clients_server_at_once(tmp_path):
    """
    Two sessions on two agents, both given the client's server, call its tool at once with
    the same inner requestId: the client sees two distinct requests in flight together, each
    answered, and each agent gets its own progress notification and answer, under its ids.
    """
    tsx = npm_peer_bin("tsx")
    report = await _drive(
        tmp_path, "relay", [_ts_agent(tsx, "a", tmp_path), _ts_agent(tsx, "b", tmp_path)]
    )
    assert report["mcpCapabilities"]["acp"] is True
    server_id = report["serverId"]
    # Each agent got the declaration (the client's id: unique on its own connection), and the
    # bridge's own server over ACP beside it.
    for name in ("a", "b"):
        tools, own = report["servers"][name]
        assert tools == {"type": "acp", "name": "tools", "serverId": server_id}
        assert own["name"] == "acp-bridge"
        assert own["serverId"] != server_id
    for name, text in (("a", "A"), ("b", "B")):
        call = report["calls"][name]
        outcome = call["outcome"]["result"]
        assert outcome["content"] == [{"type": "text", "text": f"echo:{text}"}]
        # (The SDK's caller may drop a notification its dispatch hands over after the answer
        # it precedes on the wire: what it passed on is the agent's own, if anything.)
        for note in call["notes"]:
            assert note["params"]["message"] == f"working on {text}"
    # The client saw both at once (its handler waited for two), under distinct inner ids;
    # each agent was answered under the one it chose.
    served = report["served"]
    assert sorted(s["text"] for s in served) == ["A", "B"]
    assert {s["serverId"] for s in served} == {server_id}
    assert sorted(s["requestId"] for s in served) == ["fixed-1", "fixed-1~2"]
    for name, text in (("a", "A"), ("b", "B")):
        # On the wire: its own progress notification only, under its own ids, before its answer.
        lines = _agent_lines(tmp_path, name)
        sent = _lines(tmp_path / f"agent-{name}.ndjson.sent")
        [asked] = [m["id"] for m in sent if m.get("method") == "mcp/message"]
        is_answer = {id(m) for m in lines if "method" not in m and m["id"] == asked}
        note, answer = [m for m in lines if m.get("method") == "mcp/message" or id(m) in is_answer]
        assert (note["params"]["serverId"], note["params"]["requestId"]) == (server_id, "fixed-1")
        assert note["params"]["params"]["message"] == f"working on {text}"
        assert answer["result"]["result"]["content"][0]["text"] == f"echo:{text}"


async def test_an_http_only_agent_calls_the_clients_server_through_the_re_export(tmp_path):
    """
    An agent with http MCP and no acp gets the client's server as a loopback HTTP entry with
    a token; the Python ``mcp`` SDK finds MCP 2026-07-28 there (``server/discover``), calls the
    tool, and reads the progress notification the client's server sent. The same SDK as a
    client of the ``initialize`` handshake is served too, translated.
    """
    http_agent = shlex.join(
        [sys.executable, str(PEERS / "mcp_http_agent.py"), "h", str(tmp_path / "agent-h.ndjson")]
    )
    report = await _drive(tmp_path, "http", [f"h={http_agent}"])
    call = report["call"]
    assert call == {
        "text": "echo:H",
        "isError": False,
        "progress": ["working on H"],
        "version": "2026-07-28",
    }
    assert report["legacy"] == {
        "text": "echo:L",
        "isError": False,
        "progress": ["working on L"],
        "version": "2025-11-25",
    }
    [new] = [m for m in _agent_lines(tmp_path, "h") if m.get("method") == "session/new"]
    entry, own = new["params"]["mcpServers"]
    assert own["name"] == "acp-bridge"
    assert entry["type"] == "http"
    assert entry["name"] == "tools"
    assert entry["url"].startswith("http://127.0.0.1:")
    assert entry["url"].endswith("/mcp/client")
    [header] = entry["headers"]
    token = header["value"].removeprefix("Bearer ")
    # (the token is the agent's: the client never sees it)
    assert token not in json.dumps(report["_to_client"])
    assert report["served"][0]["serverId"] == report["serverId"]


async def test_an_sdk_agent_reaches_the_sub_agent_tools_over_acp(tmp_path):
    """
    An agent that advertises ``mcpCapabilities.acp`` gets the bridge's own server as an
    ``acp`` entry (no URL, no token), discovers it, lists its tools and spawns a child with
    them over its own pipe.
    """
    tsx = npm_peer_bin("tsx")
    report = await _drive(tmp_path, "subagents", [_ts_agent(tsx, "a", tmp_path), f"helper={DEMO}"])
    [entry] = report["servers"]
    assert entry["type"] == "acp"
    assert entry["name"] == "acp-bridge"
    assert entry["serverId"].startswith("acp-bridge:")
    discover = report["listed"]["discover"]["result"]
    assert discover["supportedVersions"] == ["2026-07-28"]
    assert discover["resultType"] == "complete"
    tools = [t["name"] for t in report["listed"]["tools"]["result"]["tools"]]
    assert "spawn_agent" in tools
    agents = report["agents"]["outcome"]["result"]["structuredContent"]["agents"]
    assert [a["name"] for a in agents] == ["a", "helper"]
    spawned = report["spawned"]["outcome"]["result"]
    status = spawned["structuredContent"]
    assert status["state"] == "idle"
    assert status["stopReason"] == "end_turn"
    assert "hello" in status["text"]
    assert spawned["resultType"] == "complete"
