"""
`acp-bridge attach` in front of an ACP v2 editor (docs/v2.md): the decisions, without I/O, and
the real commands end to end (`serve --experimental-v2` and `attach`, the connection cut
between them by a relay), every message the editor gets checked against the pinned v2 schema.
"""

from __future__ import annotations

from typing import Any

from acp_bridge.attach.core import AttachCore, Phase
from acp_bridge.attach.v2 import LOST_TURN
from tests.attach.test_attach import bridge_says, drain, feed
from tests.support.v2_schema import check_to_client

V2_INIT = {"protocolVersion": 2, "info": {"name": "v2-editor", "version": "1"}}


def _request(req_id: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}


def _state(sid: str, state: str) -> dict[str, Any]:
    update = {"sessionUpdate": "state_update", "state": state}
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": update},
    }


def _v2_core_with_a_session() -> AttachCore:
    core = AttachCore(nonce="n")
    core.connection_opened()
    feed(core, _request(1, "initialize", V2_INIT))
    mcp = [{"type": "http", "name": "m", "url": "http://127.0.0.1:1/", "headers": []}]
    feed(core, _request(2, "session/new", {"cwd": "/w", "mcpServers": mcp}))
    drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 2}})
    bridge_says(core, {"jsonrpc": "2.0", "id": 2, "result": {"sessionId": "s1"}})
    return core


def test_a_v2_editor_is_taken_back_with_v2_resume_and_told_the_replay_is_missing():
    core = _v2_core_with_a_session()
    assert core.v2 is not None
    core.connection_lost()
    core.connection_opened()
    (reinit,) = drain(core)
    assert reinit["method"] == "initialize"
    assert reinit["params"]["protocolVersion"] == 2  # the face of the new connection is v2 too
    (warning,) = bridge_says(core, {"jsonrpc": "2.0", "id": reinit["id"], "result": {}})
    assert warning["method"] == "_acp_bridge/log"
    assert "without replay" in warning["params"]["data"]["message"]
    assert warning["params"]["sessionId"] == "s1"
    (resume,) = drain(core)
    # v2's own resume (the face has no session/load), no replayFrom, the session's setup.
    assert resume == _request(
        "acp-bridge-attach:n:2",
        "session/resume",
        {
            "sessionId": "s1",
            "cwd": "/w",
            "mcpServers": [
                {"type": "http", "name": "m", "url": "http://127.0.0.1:1/", "headers": []}
            ],
        },
    )
    assert bridge_says(core, {"jsonrpc": "2.0", "id": resume["id"], "result": {}}) == []
    assert core.phase is Phase.LIVE
    assert drain(core) == []


def test_a_v1_editor_is_not_taken_for_a_v2_one():
    core = AttachCore(nonce="n")
    feed(core, _request(1, "initialize", {"protocolVersion": 1}))
    assert core.v2 is None


def _resume_after_a_drop_mid_turn(*, carried_on: bool) -> list[dict[str, Any]]:
    """A turn running, another request waiting, a drop: what the resume answer brings."""
    core = _v2_core_with_a_session()
    feed(core, _request(3, "session/prompt", {"sessionId": "s1", "prompt": []}))
    feed(core, _request(4, "session/set_config_option", {"sessionId": "s1", "configId": "x"}))
    drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": 3, "result": {"messageId": "m-1"}})
    bridge_says(core, _state("s1", "running"))
    core.connection_lost()
    core.connection_opened()
    (reinit,) = drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": reinit["id"], "result": {}})
    (resume,) = drain(core)
    if carried_on:  # the face of the new connection took the turn over
        assert bridge_says(core, _state("s1", "running"))[0]["params"]["sessionId"] == "s1"
    out = bridge_says(core, {"jsonrpc": "2.0", "id": resume["id"], "result": {}})
    assert drain(core) == []
    assert core.statistics().pending_requests == 0
    # Unlike v1, the other request is not answered on the new connection: it fails.
    *out, failed = out
    assert failed["id"] == 4
    assert failed["error"]["code"] == -32603
    return out


def test_a_turn_the_face_carries_on_is_left_running_for_the_v2_editor():
    assert _resume_after_a_drop_mid_turn(carried_on=True) == []


def test_a_turn_whose_end_is_lost_is_ended_for_the_v2_editor_with_an_error():
    log, idle = _resume_after_a_drop_mid_turn(carried_on=False)
    assert log["method"] == "_acp_bridge/log"
    assert idle == {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s1",
            "update": {
                "sessionUpdate": "state_update",
                "state": "idle",
                "stopReason": "error",
                "error": {"code": -32603, "message": LOST_TURN},
            },
        },
    }
    check_to_client(idle, {})


def test_a_turn_that_ended_before_the_drop_is_left_alone():
    core = _v2_core_with_a_session()
    bridge_says(core, _state("s1", "running"))
    bridge_says(core, _state("s1", "requires_action"))
    bridge_says(core, _state("s1", "idle"))
    core.connection_lost()
    core.connection_opened()
    (reinit,) = drain(core)
    bridge_says(core, {"jsonrpc": "2.0", "id": reinit["id"], "result": {}})
    (resume,) = drain(core)
    assert bridge_says(core, {"jsonrpc": "2.0", "id": resume["id"], "result": {}}) == []
    assert drain(core) == []


# -- the real commands ---------------------------------------------------------------------
