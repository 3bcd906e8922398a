"""
``acp-bridge stdio`` answers the first ``initialize`` before its heavy imports
(``faces.early``): the pure parts, without processes (tests/e2e/test_faces_early.py runs the
real ones).
"""

from __future__ import annotations

import os
import pathlib
import select
import shlex
import sys
import threading
from typing import TYPE_CHECKING, Any

from acp_bridge.agents.prespawn import Prespawned, Spawn
from acp_bridge.faces.early import (
    EARLY_ID,
    Background,
    answer_early,
    client_request,
    find_answer,
    v2_asked,
)
from acp_bridge.protocol.jsonrpc import dumps, loads

if TYPE_CHECKING:
    from pathlib import Path

DEMO = shlex.join([sys.executable, "-m", "acp_bridge", "demo-agent"])

INIT: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": False}},
        "clientInfo": {"name": "test", "version": "1"},
        "_meta": {"acp_bridge": {"seq": True, "log": "warning"}},
    },
}


def request(req_id: object, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}


def session_new(req_id: object, cwd: Path) -> dict[str, Any]:
    return request(req_id, "session/new", {"cwd": str(cwd), "mcpServers": []})


# ---------------------------------------------------------------- end to end


# ---------------------------------------------------------------- the pure parts


def test_which_first_lines_the_early_answer_takes():
    def line(params: object, method: str = "initialize", **extra: object) -> bytes:
        msg = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params, **extra}
        return dumps(msg).rstrip(b"\n")

    assert client_request(line({"protocolVersion": 1})) is not None
    assert client_request(line({"protocolVersion": 0, "_meta": {"acp_bridge": {"log": "info"}}}))
    assert client_request(line({"protocolVersion": 2})) is None  # (v2: the usual path)
    assert client_request(line({"protocolVersion": "1"})) is None  # (the bridge's error)
    assert (
        client_request(line({"protocolVersion": 1, "_meta": {"acp_bridge": {"log": "x"}}})) is None
    )
    assert client_request(line({"protocolVersion": 1}, "session/new")) is None
    assert client_request(b'{"jsonrpc":"2.0","method":"initialize","params":{}}') is None
    assert client_request(b"not json") is None
    assert client_request(line({"protocolVersion": 1, "pad": "x" * 40000})) is None


def test_the_agents_answer_is_found_among_its_other_lines():
    answer = dumps({"jsonrpc": "2.0", "id": EARLY_ID, "result": {"protocolVersion": 1}})
    other = dumps({"jsonrpc": "2.0", "id": 5, "result": {}})
    stray = b'hello "id" there\n'
    data = stray + other + answer + b"partial"
    found = find_answer(data)
    assert found is not None
    msg, start, end = found
    assert msg["result"] == {"protocolVersion": 1}
    assert data[start:end] == answer
    assert data[:start] + data[end:] == stray + other + b"partial"
    assert find_answer(stray + other + answer.rstrip(b"\n")) is None  # (not a whole line yet)


def test_v2_is_asked_by_the_flag_or_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[bridge]\nexperimental_v2 = true\n")
    assert v2_asked(str(path), False)
    assert v2_asked(None, True)
    path.write_text("[bridge]\nexperimental_v2 = false\n")
    assert not v2_asked(str(path), False)
    assert not v2_asked(None, False)
    assert not v2_asked(str(tmp_path / "missing.toml"), False)


def test_imports_done_before_a_whole_line_hand_over_what_was_read():
    """The client sent half a line when the imports ended: nothing answered, nothing lost."""
    half = b'{"jsonrpc":"2.0","id":0,"meth'
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, half)
        background = Background(lambda: None, lambda: None)
        background.start()
        spawned = Prespawned("a", Spawn(["agent"], {}, None))  # (never touched: no popen)
        hand = answer_early(spawned, background, -1, stdin_fd=read_end)
        background.join()
        os.set_blocking(read_end, False)
        try:
            unread = os.read(read_end, 100)
        except BlockingIOError:
            unread = b""
    finally:
        os.close(read_end)
        os.close(write_end)
    # (read before the imports' end was seen, or left in the pipe: either way, all there)
    assert hand.stdin + unread == half
    assert hand.request is None
    assert [event for event, _ in hand.notes] == ["early_initialize_skipped"]


def test_the_early_answer_without_processes_and_without_waiting_for_the_imports():
    """
    The whole exchange over pipes: the agent (played by the configuration's loading, so
    that its answer is read before the configuration is there) gets the supervisor's own
    initialize; the client gets the bridge's answer as soon as both are there, not once the
    imports are done; what was read besides is handed over.
    """
    from acp_bridge.agents.prespawn import spawn_settings
    from acp_bridge.config.model import config_from_agent_specs
    from acp_bridge.protocol.initialize import agent_fields, agent_params, bridge_answer
    from acp_bridge.protocol.jsonrpc import request as rpc_request
    from acp_bridge.protocol.jsonrpc import result as rpc_result

    config = config_from_agent_specs([f"a={DEMO}", f"b={DEMO}"])
    agent_config = config.agents["a"]
    client_in, client_out = os.pipe()
    agent_in_r, agent_in_w = os.pipe()
    agent_out_r, agent_out_w = os.pipe()
    protocol_r, protocol_w = os.pipe()
    caps = {"promptCapabilities": {"image": True}, "sessionCapabilities": {"list": {}}}
    result = {"protocolVersion": 1, "agentCapabilities": caps, "authMethods": [{"id": "x"}]}
    answer_line = dumps({"jsonrpc": "2.0", "id": EARLY_ID, "result": result})
    stray = b"a banner\n"
    seen: list[bytes] = []
    released = threading.Event()
    imports_released: list[bool] = []

    def load() -> Any:
        # The agent: its initialize read, then its stray line and its answer written.
        ready, _, _ = select.select([agent_in_r], [], [], 10)
        assert ready, "no initialize reached the agent"
        seen.append(os.read(agent_in_r, 65536))
        os.write(agent_out_w, stray + answer_line)
        return config

    def imports() -> None:
        imports_released.append(released.wait(10))

    later = dumps(session_new(1, pathlib.Path("/")))
    os.write(client_out, dumps(INIT) + later)
    spawned = Prespawned("a", spawn_settings(agent_config))
    spawned.fds = (agent_in_w, agent_out_r, -1, -1)
    background = Background(load, imports)
    background.start()
    try:
        hand = answer_early(spawned, background, protocol_w, stdin_fd=client_in)
        released.set()
        background.join()
        answer = os.read(protocol_r, 65536)
    finally:
        for fd in (client_in, client_out, agent_in_r, agent_in_w, agent_out_r, agent_out_w):
            os.close(fd)
        os.close(protocol_r)
        os.close(protocol_w)
    assert imports_released == [True]  # (answered while the imports were still going)
    offered = INIT["params"]["clientCapabilities"]
    assert seen == [dumps(rpc_request(EARLY_ID, "initialize", agent_params(offered)))]
    fields = agent_fields(result)
    expected = bridge_answer(caps, [caps, {}], fields.auth_methods, "a", ["a", "b"])
    assert answer == dumps(rpc_result(0, expected))
    assert loads(answer)["result"]["agentCapabilities"]["sessionCapabilities"]["list"] == {}
    assert hand.request == INIT
    assert hand.stdin == later
    assert spawned.initialized == result
    assert spawned.stdout_rest == stray
    assert [event for event, _ in hand.notes] == ["early_initialize_answered"]
