"""
The tests of ``tests/attach/test_v2.py`` that start other processes (kept here so that
``pytest tests/attach`` runs in-process only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import trio

from tests.attach.test_attach import Relay, mentions
from tests.attach.test_v2 import V2_INIT
from tests.e2e.test_attach import _reap
from tests.support.fakes import TestClient
from tests.support.serve import port_of, start_serve
from tests.support.v2_schema import check_to_client


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
            serve, url, _ = await start_serve(nursery, serve_argv, env)
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
