"""
`acp-bridge attach` in front of an ACP v2 editor (docs/v2.md): the decisions, without I/O, and
the real commands end to end (`serve --experimental-v2` and `attach`, the connection cut
between them by a relay), every message the editor gets checked against the pinned v2 schema.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import trio

from acp_bridge.attach.core import AttachCore, Phase
from acp_bridge.attach.v2 import LOST_TURN
from tests.attach.test_attach import Relay, _reap, bridge_says, drain, feed, mentions
from tests.support.fakes import TestClient, port_of, start_serve
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


class V2Editor:
    """The editor on the shim's stdio: a v2 client that checks all it gets against the schema."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.asked: dict[Any, str] = {}

    async def call(self, method: str, params: Any) -> Any:
        req_id = f"e{len(self.asked) + 1}"
        self.asked[req_id] = method
        response = await self.client.request(method, params, id=req_id)
        assert "result" in response, response
        return response["result"]

    async def state(self, sid: str, state: str, after: int) -> dict[str, Any]:
        """The first ``state_update`` to ``state`` of ``sid`` among messages from ``after`` on."""

        def found() -> dict[str, Any] | None:
            for m in self.client.received[after:]:
                update = m.get("params", {}).get("update", {}) if "method" in m else {}
                if (
                    m.get("method") == "session/update"
                    and m["params"]["sessionId"] == sid
                    and update.get("sessionUpdate") == "state_update"
                    and update.get("state") == state
                ):
                    return dict(update)
            return None

        await self.client.wait_for(lambda _m: found() is not None)
        update = found()
        assert update is not None
        return update

    def texts(self, after: int) -> list[str]:
        return [
            m["params"]["update"]["content"]["text"]
            for m in self.client.received[after:]
            if m.get("method") == "session/update"
            and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
        ]

    def check_all(self) -> None:
        for msg in self.client.received:
            check_to_client(msg, self.asked)


@pytest.mark.e2e
async def test_a_v2_editor_through_attach_keeps_its_session_across_a_cut(tmp_path):
    """`serve --experimental-v2` and `attach` as processes; a relay between them cuts."""
    relay = Relay()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            relay_port = listeners[0].socket.getsockname()[1]
            await nursery.start(trio.serve_listeners, relay.handle, listeners)
            config = tmp_path / "serve.toml"
            config.write_text(
                f"[agents.demo]\ncommand = {json.dumps(sys.executable)}\n"
                'args = ["-m", "acp_bridge", "demo-agent", "--chunk-delay", "0.05"]\n'
                '[websocket]\nport = 0\ntoken_file = "token"\n'
                f'allowed_hosts = ["127.0.0.1:{relay_port}"]\n'
            )
            serve_argv = [
                sys.executable, "-m", "acp_bridge", "serve", "--config", str(config),
                "--experimental-v2",
            ]  # fmt: skip
            serve, url = await start_serve(nursery, serve_argv, env)
            nursery.start_soon(_reap, serve)
            relay.target_port = port_of(url)
            attach_argv = [
                sys.executable, "-m", "acp_bridge", "attach", f"ws://127.0.0.1:{relay_port}/acp",
                "--token-file", str(tmp_path / "token"),
            ]  # fmt: skip
            shim = await trio.lowlevel.open_process(
                attach_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=env,
            )  # fmt: skip
            nursery.start_soon(_reap, shim)
            client = TestClient(trio.StapledStream(shim.stdin, shim.stdout))
            nursery.start_soon(client.read_loop)
            editor = V2Editor(client)

            init = await editor.call("initialize", V2_INIT)
            assert init["protocolVersion"] == 2
            sid = (await editor.call("session/new", {"cwd": str(tmp_path)}))["sessionId"]
            mark = len(client.received)
            ack = await editor.call(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "count 3"}]},
            )
            assert isinstance(ack["messageId"], str)
            assert (await editor.state(sid, "idle", mark))["stopReason"] == "end_turn"
            assert len(editor.texts(mark)) == 3

            # A permission, answered through the shim (the write itself is refused: no fs in v2).
            mark = len(client.received)
            prompt = [{"type": "text", "text": "write notes.txt hello"}]
            await editor.call("session/prompt", {"sessionId": sid, "prompt": prompt})
            ask = await client.wait_for(lambda m: m.get("method") == "session/request_permission")
            assert ask["params"]["subject"]["type"] == "tool_call"
            option = ask["params"]["options"][0]["optionId"]
            outcome = {"outcome": {"outcome": "selected", "optionId": option}}
            await client.send({"jsonrpc": "2.0", "id": ask["id"], "result": outcome})
            assert (await editor.state(sid, "idle", mark))["stopReason"] == "end_turn"

            # Cut mid-turn: the editor is told of the missing updates, the turn goes on (its
            # cancel and its end pass over the new connection), then the session does.
            mark = len(client.received)
            prompt = [{"type": "text", "text": "slow"}]
            await editor.call("session/prompt", {"sessionId": sid, "prompt": prompt})
            await client.wait_for(lambda m: len(editor.texts(mark)) >= 1)
            await relay.cut()
            await client.wait_for(mentions("without replay"))
            await client.notify("session/cancel", {"sessionId": sid})
            ended = await editor.state(sid, "idle", mark)
            assert ended["stopReason"] == "cancelled"
            logs = [
                m["params"]["data"]["message"]
                for m in client.received[mark:]
                if m.get("method") == "_acp_bridge/log"
            ]
            assert any("without replay" in text for text in logs), logs
            assert len(relay.links) == 2

            mark = len(client.received)
            ack = await editor.call(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "count 2"}]},
            )
            assert (await editor.state(sid, "idle", mark))["stopReason"] == "end_turn"
            assert len(editor.texts(mark)) == 2
            assert not [m for m in client.received if "error" in m and "method" not in m]
            editor.check_all()

            assert shim.stdin is not None
            await shim.stdin.aclose()
            assert await shim.wait() == 0
            serve.terminate()
            assert await serve.wait() == 0
            nursery.cancel_scope.cancel()  # the relay
