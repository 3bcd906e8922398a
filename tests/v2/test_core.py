"""The ACP v2 face's pure translation (``v2.core``, ``v2.shapes``): no trio, no bridge."""

from __future__ import annotations

from typing import Any

import pytest

from acp_bridge.protocol.jsonrpc import dumps
from acp_bridge.v2 import shapes
from acp_bridge.v2.core import MAX_HELD, V2Connection
from tests.support.v2_schema import SCHEMA_PATH, check_to_client


def _open(conn: V2Connection, sid: str = "s1") -> None:
    step = conn.from_client(
        {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/w"}}
    )
    (new,) = step.to_bridge
    conn.from_bridge({"jsonrpc": "2.0", "id": new["id"], "result": {"sessionId": sid}})


def _chunk(sid: str, kind: str, text: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": sid,
            "update": {"sessionUpdate": kind, "content": {"type": "text", "text": text}},
        },
    }


def _prompt(conn: V2Connection, id_: Any, text: str = "hi", sid: str = "s1") -> Any:
    params = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    return conn.from_client(
        {"jsonrpc": "2.0", "id": id_, "method": "session/prompt", "params": params}
    )


def test_a_run_of_chunks_is_one_message_and_any_other_update_ends_it():
    conn = V2Connection("t")
    _open(conn)
    out = []
    for msg in (
        _chunk("s1", "agent_message_chunk", "a"),
        _chunk("s1", "agent_message_chunk", "b"),
        _chunk("s1", "agent_thought_chunk", "c"),
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "s1",
                "update": {"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x"},
            },
        },
        _chunk("s1", "agent_message_chunk", "d"),
    ):
        out += conn.from_bridge(msg).to_client
    ids = [m["params"]["update"].get("messageId") for m in out]
    assert ids[0] == ids[1]
    assert len({ids[0], ids[2], ids[4]}) == 3
    assert out[3]["params"]["update"]["sessionUpdate"] == "tool_call_update"
    for m in out:
        check_to_client(m, {})


def test_the_schema_check_refuses_a_chunk_without_message_id():
    bad = _chunk("s1", "agent_message_chunk", "a")
    with pytest.raises(Exception, match="messageId"):
        check_to_client(bad, {})


def test_a_prompt_is_acknowledged_at_once_and_its_answer_is_the_idle_state():
    conn = V2Connection("t")
    _open(conn)
    step = _prompt(conn, 7)
    ack, user, running = step.to_client
    assert ack["result"]["messageId"] == user["params"]["update"]["messageId"]
    assert running["params"]["update"] == {"sessionUpdate": "state_update", "state": "running"}
    (v1,) = step.to_bridge
    assert v1["method"] == "session/prompt"
    assert v1["id"] != 7
    (idle,) = conn.from_bridge(
        {"jsonrpc": "2.0", "id": v1["id"], "result": {"stopReason": "cancelled"}}
    ).to_client
    assert idle["params"]["update"] == {
        "sessionUpdate": "state_update",
        "state": "idle",
        "stopReason": "cancelled",
    }
    for m in (ack, user, running, idle):
        check_to_client(m, {7: "session/prompt"})


def test_a_prompt_during_a_turn_is_held_then_let_in_and_cancel_withdraws_the_rest():
    conn = V2Connection("t")
    _open(conn)
    first = _prompt(conn, 1).to_bridge[0]
    assert _prompt(conn, 2).to_client == []  # held: not acknowledged yet
    assert _prompt(conn, 3).to_client == []
    step = conn.from_bridge(
        {"jsonrpc": "2.0", "id": first["id"], "result": {"stopReason": "end_turn"}}
    )
    assert [m.get("id") for m in step.to_client if "result" in m] == [2]
    assert [m["method"] for m in step.to_bridge] == ["session/prompt"]
    cancel = conn.from_client(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}}
    )
    assert [(m["id"], m["error"]["code"]) for m in cancel.to_client] == [(3, -32800)]


def test_held_prompts_are_bounded_per_connection():
    conn = V2Connection("t")
    _open(conn)
    _prompt(conn, 0)
    for i in range(MAX_HELD):
        assert _prompt(conn, i + 1).to_client == []
    (refused,) = _prompt(conn, "over").to_client
    assert refused["error"]["code"] == -32600


def test_a_permission_is_reshaped_and_the_turn_requires_action_until_answered():
    conn = V2Connection("t")
    _open(conn)
    _prompt(conn, 1)
    ask = {
        "jsonrpc": "2.0",
        "id": 40,
        "method": "session/request_permission",
        "params": {
            "sessionId": "s1",
            "toolCall": {
                "toolCallId": "t1",
                "title": "Edit a file",
                "content": [{"type": "diff", "path": "/w/f", "oldText": "a\n", "newText": "b\n"}],
            },
            "options": [{"optionId": "y", "name": "Yes", "kind": "allow_once"}],
        },
    }
    state, request = conn.from_bridge(ask).to_client
    assert state["params"]["update"]["state"] == "requires_action"
    assert request["params"]["title"] == "Edit a file"
    diff = request["params"]["subject"]["toolCall"]["content"][0]
    assert diff["changes"] == [{"operation": "modify", "path": "/w/f"}]
    assert "-a\n+b\n" in diff["patch"]["text"]
    check_to_client(request, {})
    answer = {
        "jsonrpc": "2.0",
        "id": 40,
        "result": {"outcome": {"outcome": "selected", "optionId": "y"}},
    }
    step = conn.from_client(answer)
    assert step.to_bridge == [answer]
    assert step.to_client[0]["params"]["update"]["state"] == "running"


def test_a_replay_from_the_start_gathers_runs_into_whole_messages():
    conn = V2Connection("t")
    step = conn.from_client(
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "session/resume",
            "params": {"sessionId": "s9", "cwd": "/w", "replayFrom": {"type": "start"}},
        }
    )
    (load,) = step.to_bridge
    assert load["method"] == "session/load"
    assert load["params"]["_meta"]["acp_bridge"]["journal_replay"] is True
    out = []
    for msg in (
        _chunk("s9", "user_message_chunk", "q"),
        _chunk("s9", "agent_message_chunk", "a"),
        _chunk("s9", "agent_message_chunk", "b"),
    ):
        out += conn.from_bridge(msg).to_client
    out += conn.from_bridge({"jsonrpc": "2.0", "id": load["id"], "result": {}}).to_client
    updates = [m["params"]["update"] for m in out if m.get("method")]
    assert [(u["sessionUpdate"], [c["text"] for c in u["content"]]) for u in updates] == [
        ("user_message", ["q"]),
        ("agent_message", ["a", "b"]),
    ]
    assert out[-1] == {"jsonrpc": "2.0", "id": 5, "result": {}}
    for m in out:
        check_to_client(m, {5: "session/resume"})


def test_an_unknown_replay_cursor_is_invalid_params():
    conn = V2Connection("t")
    step = conn.from_client(
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "session/resume",
            "params": {"sessionId": "s", "cwd": "/w", "replayFrom": {"type": "seq", "after": 3}},
        }
    )
    assert step.to_bridge == []
    assert step.to_client[0]["error"]["code"] == -32602


def test_initialize_shapes_both_ways():
    v1 = shapes.initialize_to_v1({"protocolVersion": 2, "info": {"name": "c", "version": "1"}})
    assert v1["clientCapabilities"] == {}
    assert v1["clientInfo"]["name"] == "c"
    answer = shapes.initialize_to_v2(
        {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": True, "audio": False},
                "mcpCapabilities": {"http": True, "sse": True},
            },
            "authMethods": [{"id": "login", "name": "Log in"}],
            "agentInfo": {"name": "acp-bridge", "version": "1.0"},
        }
    )
    assert answer["capabilities"]["session"]["prompt"] == {"image": {}}
    assert answer["capabilities"]["session"]["mcp"] == {"stdio": {}, "http": {}}
    assert answer["authMethods"] == [{"type": "agent", "methodId": "login", "name": "Log in"}]
    check_to_client({"jsonrpc": "2.0", "id": 0, "result": answer}, {0: "initialize"})


def test_mcp_servers_gain_what_v1_requires_and_other_transports_are_refused():
    assert shapes.mcp_servers_to_v1([{"type": "stdio", "name": "n", "command": "/x"}]) == [
        {"name": "n", "command": "/x", "args": [], "env": []}
    ]
    with pytest.raises(Exception, match="sse"):
        shapes.mcp_servers_to_v1([{"type": "sse", "name": "n", "url": "http://h"}])


def test_modes_become_a_config_option_and_a_mode_change_reports_it():
    conn = V2Connection("t")
    step = conn.from_client(
        {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/w"}}
    )
    modes = {
        "currentModeId": "ask",
        "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}],
    }
    (answer,) = conn.from_bridge(
        {
            "jsonrpc": "2.0",
            "id": step.to_bridge[0]["id"],
            "result": {"sessionId": "s1", "modes": modes},
        }
    ).to_client
    (option,) = answer["result"]["configOptions"]
    assert option["configId"] == "mode"
    assert option["currentValue"] == "ask"
    check_to_client(answer, {1: "session/new"})
    set_mode = conn.from_client(
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/set_config_option",
            "params": {"sessionId": "s1", "configId": "mode", "type": "id", "value": "code"},
        }
    )
    assert set_mode.to_bridge[0]["method"] == "session/set_mode"
    (done,) = conn.from_bridge(
        {"jsonrpc": "2.0", "id": set_mode.to_bridge[0]["id"], "result": {}}
    ).to_client
    assert done["result"]["configOptions"][0]["currentValue"] == "code"
    check_to_client(done, {2: "session/set_config_option"})


def test_fs_requests_of_an_agent_are_refused_not_shown():
    step = V2Connection("t").from_bridge(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "fs/read_text_file",
            "params": {"sessionId": "s", "path": "/x"},
        }
    )
    assert step.to_client == []
    assert step.to_bridge[0]["error"]["code"] == -32601


def test_only_a_v2_initialize_makes_a_connection_v2():
    assert shapes.wants_v2(
        dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 2}})
    )
    assert not shapes.wants_v2(
        dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
    )
    assert not shapes.wants_v2(b"not json")


def test_the_committed_schema_is_the_sdks():
    from tests.support.peers.npm import INSTALL, STAMP, pins_digest

    bundled = (
        INSTALL / "node_modules" / "@agentclientprotocol" / "sdk" / "schema" / "v2" / "schema.json"
    )
    if not STAMP.is_file() or STAMP.read_text().strip() != pins_digest():
        pytest.skip("the npm test peers are not installed (run ./scripts/test)")
    assert bundled.read_bytes() == SCHEMA_PATH.read_bytes()
