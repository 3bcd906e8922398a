"""
Sub-agents end to end (docs/subagents.md): `acp-bridge stdio` and `acp-bridge serve` with real
demo agents that delegate to each other through the bridge's MCP server (http and stdio).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests.e2e.test_stdio import DEMO, BridgeProcess, _reap
from tests.faces.test_ws import open_peer
from tests.support.peers import npm
from tests.support.serve import serve_process

if TYPE_CHECKING:
    from pathlib import Path


TIMEOUT = 60
HELPER = f"{DEMO} --name helper --session-prefix helper-"
FS = {"fs": {"readTextFile": True, "writeTextFile": True}}


async def start_stdio(
    nursery: trio.Nursery,
    *agents: str,
    config: Path | None = None,
    caps: dict[str, Any] | None = None,
    trace: Path | None = None,
) -> BridgeProcess:
    argv = [sys.executable, "-m", "acp_bridge", "stdio"]
    if config is not None:
        argv += ["--config", str(config)]
    if trace is not None:
        argv += ["--trace", str(trace)]
    for agent in agents:
        argv += ["--agent", agent]
    proc = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    nursery.start_soon(_reap, proc)
    bridge = BridgeProcess(proc)
    init = await bridge.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps or {}})
    assert init["result"]["protocolVersion"] == 1
    return bridge


async def end(bridge: BridgeProcess) -> None:
    assert bridge.proc.stdin is not None
    await bridge.proc.stdin.aclose()
    assert await bridge.proc.wait() == 0


def prompt_msg(req_id: Any, sid: str, text: str) -> dict[str, Any]:
    params = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    return {"jsonrpc": "2.0", "id": req_id, "method": "session/prompt", "params": params}


def text_of(messages: list[dict[str, Any]], sid: str) -> str:
    return "".join(
        m["params"]["update"]["content"]["text"]
        for m in messages
        if m.get("method") == "session/update"
        and m["params"]["sessionId"] == sid
        and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    )


def session_ids(messages: list[dict[str, Any]]) -> set[str]:
    return {m["params"]["sessionId"] for m in messages if "sessionId" in m.get("params", {})}


async def until_answer(bridge: BridgeProcess, req_id: Any) -> dict[str, Any]:
    """Read until the answer to ``req_id``, answering the bridge's fs/write requests."""
    while True:
        msg = await bridge.next_message()
        if msg.get("id") == req_id and "method" not in msg:
            return msg
        if msg.get("method") == "fs/write_text_file":
            await bridge.send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_parent_delegates_through_stdio_mode_and_gets_the_childs_text_in_order(
    tmp_path, transport
):
    parent = DEMO if transport == "http" else f"{DEMO} --no-mcp-http"
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            bridge = await start_stdio(nursery, f"demo={parent}", f"helper={HELPER}")
            new = {"cwd": str(tmp_path), "mcpServers": []}
            sid = (await bridge.call("session/new", new))["result"]["sessionId"]
            answer = await bridge.call(
                "session/prompt",
                {
                    "sessionId": sid,
                    "prompt": [{"type": "text", "text": "delegate helper: count 5"}],
                },
            )
            assert answer["result"]["stopReason"] == "end_turn"
            text = text_of(bridge.messages, sid)
            assert re.search(r"\[helper \(helper-\w+-1\): 1 2 3 4 5\] \(end_turn\)", text), text
            # A stock client sees only its own session: no child id, no subagent_update.
            assert session_ids(bridge.messages) == {sid}
            await end(bridge)


@pytest.mark.parametrize("subagents", [False, True])
async def test_a_childs_permission_reaches_the_attended_client_and_its_answer_the_child(
    tmp_path, subagents
):
    caps = {**FS, "subagents": {}} if subagents else FS
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            bridge = await start_stdio(nursery, f"demo={DEMO}", f"helper={HELPER}", caps=caps)
            new = {"cwd": str(tmp_path), "mcpServers": []}
            sid = (await bridge.call("session/new", new))["result"]["sessionId"]
            await bridge.send(prompt_msg("p", sid, "delegate helper: write note.txt hello"))
            while (request := await bridge.next_message()).get("method") != (
                "session/request_permission"
            ):
                pass
            params = request["params"]
            if subagents:
                child = params["sessionId"]
                assert child != sid
                announce = next(
                    m
                    for m in bridge.messages
                    if m.get("params", {}).get("update", {}).get("sessionUpdate")
                    == "subagent_update"
                )
                assert announce["params"]["sessionId"] == sid
                assert announce["params"]["update"]["sessionId"] == child
                assert bridge.messages.index(announce) < bridge.messages.index(request)
            else:
                assert params["sessionId"] == sid
                child = params["_meta"]["acp_bridge"]["child"]["sessionId"]
                assert params["_meta"]["acp_bridge"]["child"]["agent"] == "helper"
            outcome = {"outcome": "selected", "optionId": "allow-once"}
            await bridge.send(
                {"jsonrpc": "2.0", "id": request["id"], "result": {"outcome": outcome}}
            )
            answer = await until_answer(bridge, "p")
            assert answer["result"]["stopReason"] == "end_turn"
            assert "Wrote 5 characters to note.txt." in text_of(bridge.messages, sid)
            if not subagents:
                assert session_ids(bridge.messages) == {sid}
            else:
                assert "Wrote 5 characters" in text_of(bridge.messages, child)
            await end(bridge)


async def test_an_unattended_parents_child_is_denied_and_never_shown(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            bridge = await start_stdio(nursery, f"demo={DEMO}", f"helper={HELPER}", caps=FS)
            new = {
                "cwd": str(tmp_path),
                "mcpServers": [],
                "_meta": {"acp_bridge": {"unattended": True}},
            }
            sid = (await bridge.call("session/new", new))["result"]["sessionId"]
            answer = await until_answer(bridge, await _prompt(bridge, sid, "write x.txt hi"))
            assert answer["result"]["stopReason"] == "end_turn"
            assert "Permission denied, so I did not write x.txt." in text_of(bridge.messages, sid)
            assert all(m.get("method") != "session/request_permission" for m in bridge.messages)
            assert not (tmp_path / "x.txt").exists()
            await end(bridge)


async def _prompt(bridge: BridgeProcess, sid: str, task: str) -> str:
    await bridge.send(prompt_msg("p", sid, f"delegate helper: {task}"))
    return "p"


async def test_the_parents_cancel_cascades_to_the_child_before_its_turn_ends(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            bridge = await start_stdio(nursery, f"demo={DEMO}", f"helper={HELPER}", caps=FS)
            new = {"cwd": str(tmp_path), "mcpServers": []}
            sid = (await bridge.call("session/new", new))["result"]["sessionId"]
            await _prompt(bridge, sid, "write y.txt never")
            while (await bridge.next_message()).get("method") != "session/request_permission":
                pass  # shown, and never answered
            await bridge.send(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
            )
            answer = await until_answer(bridge, "p")
            assert answer["result"]["stopReason"] == "cancelled"
            # The child's turn ended cancelled, and the parent's tool call said so first.
            assert text_of(bridge.messages, sid).endswith("] (cancelled)")
            assert not (tmp_path / "y.txt").exists()
            await end(bridge)


async def test_past_max_depth_a_child_is_offered_no_spawn_tool(tmp_path):
    config = tmp_path / "bridge.toml"
    demo = json.dumps(sys.executable)
    config.write_text(
        f'[agents.demo]\ncommand = {demo}\nargs = ["-m", "acp_bridge", "demo-agent"]\n'
        f'[agents.helper]\ncommand = {demo}\nargs = ["-m", "acp_bridge", "demo-agent", '
        '"--name", "helper", "--session-prefix", "helper-"]\n'
        "[subagents]\nmax_depth = 1\n[store]\npath = ':memory:'\n"
    )
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            bridge = await start_stdio(nursery, f"demo={DEMO}", f"helper={HELPER}", config=config)
            new = {"cwd": str(tmp_path), "mcpServers": []}
            sid = (await bridge.call("session/new", new))["result"]["sessionId"]
            answer = await until_answer(
                bridge, await _prompt(bridge, sid, "delegate demo: count 2")
            )
            assert answer["result"]["stopReason"] == "end_turn"
            text = text_of(bridge.messages, sid)
            assert "[delegation failed: tools/call: unknown tool: 'spawn_agent'" in text, text
            await end(bridge)


async def test_a_parent_delegates_through_serve_mode(tmp_path):
    helper = ["-m", "acp_bridge", "demo-agent", "--name", "helper", "--session-prefix", "helper-"]
    more = f"[agents.helper]\ncommand = {json.dumps(sys.executable)}\nargs = {json.dumps(helper)}\n"
    with trio.fail_after(TIMEOUT):
        async with serve_process(tmp_path, more=more) as served:
            sid, messages = await _ws_session(served.port, served.token, tmp_path)
        text = text_of(messages, sid)
        assert re.search(r"\[helper \(helper-\w+-1\): You said: hello\] \(end_turn\)", text)
        assert session_ids(messages) == {sid}


async def _ws_session(port: int, token: str, tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    async with open_peer(port, token=token) as peer:
        new = await peer.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        sid = new["result"]["sessionId"]
        prompt = [{"type": "text", "text": "delegate helper: hello"}]
        answer = await peer.request("session/prompt", {"sessionId": sid, "prompt": prompt})
        assert answer["result"]["stopReason"] == "end_turn"
    return sid, peer.received


def _codex_acp() -> str:
    """The pinned codex-acp's executable, if it can run on this machine (else a skip)."""
    path = npm.npm_peer_bin("@zed-industries/codex-acp", "codex-acp")
    try:
        probe = subprocess.run([str(path), "--help"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"codex-acp {path} cannot run here: {exc}")
    if probe.returncode != 0:
        tail = (probe.stderr or probe.stdout).decode(errors="replace").strip()[-300:]
        pytest.skip(f"codex-acp cannot run here (exit {probe.returncode}): {tail}")
    return str(path)


async def test_codex_acp_takes_the_injected_http_server_in_session_new(tmp_path):
    """A real agent accepts the bridge's server: its session/new answers without error. It
    needs an API key variable to open a session (a fake one: no model is called here)."""
    codex = _codex_acp()
    home = tmp_path / "codex-home"
    home.mkdir()
    config = tmp_path / "bridge.toml"
    env = {"OPENAI_API_KEY": "sk-not-a-real-key-for-tests", "CODEX_HOME": str(home)}
    config.write_text(
        f"[agents.codex]\ncommand = {json.dumps(codex)}\nstart_timeout = 60.0\n"
        f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in env.items())} }}\n"
        "[store]\npath = ':memory:'\n"
    )
    trace = tmp_path / "trace.jsonl"
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            bridge = await start_stdio(nursery, config=config, trace=trace)
            auth = await bridge.call("authenticate", {"methodId": "openai-api-key"})
            assert "result" in auth, auth
            new = {"cwd": str(tmp_path), "mcpServers": []}
            answer = await bridge.call("session/new", new)
            assert "error" not in answer, answer
            assert isinstance(answer["result"]["sessionId"], str)
            await end(bridge)
    sent = [
        record["msg"]
        for record in map(json.loads, trace.read_text().splitlines())
        if record.get("link") == "agent:codex"
        and record.get("dir") == "out"
        and record.get("msg", {}).get("method") == "session/new"
    ]
    [server] = sent[0]["params"]["mcpServers"]
    assert server["type"] == "http"
    assert server["name"] == "acp-bridge"
    assert server["headers"] == [{"name": "Authorization", "value": "***"}]  # (redacted)
