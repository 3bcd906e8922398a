"""
The ACP v2 face over the bridge's v1 (``--experimental-v2``; docs/v2.md): a v2 client on
memory streams in front of fake v1 agents, every message it gets checked against the pinned
v2 schema, and a v1 client beside it served as without the flag.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from tests.support.fakes import FakeAgent, TestClient, connect, open_bridge
from tests.support.v2_schema import check_to_client

V2_INIT = {"protocolVersion": 2, "info": {"name": "v2-test", "version": "1"}}


class V2Client:
    """A :class:`TestClient` speaking v2: remembers what it asked, to check the answers."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.asked: dict[Any, str] = {}

    async def request(self, method: str, params: Any) -> dict[str, Any]:
        req_id = f"c{len(self.asked) + 1}"
        self.asked[req_id] = method
        return await self.client.request(method, params, id=req_id)

    async def call(self, method: str, params: Any) -> Any:
        response = await self.request(method, params)
        assert "result" in response, response
        return response["result"]

    def updates(self, sid: str) -> list[dict[str, Any]]:
        return [
            m["params"]["update"]
            for m in self.client.received
            if m.get("method") == "session/update" and m["params"]["sessionId"] == sid
        ]

    async def wait_update(self, sid: str, predicate: Any) -> dict[str, Any]:
        msg = await self.client.wait_for(
            lambda m: (
                m.get("method") == "session/update"
                and m["params"]["sessionId"] == sid
                and predicate(m["params"]["update"])
            )
        )
        return msg["params"]["update"]

    def check_all(self) -> None:
        for msg in self.client.received:
            check_to_client(msg, self.asked)


def _idle(update: dict[str, Any]) -> bool:
    return update.get("sessionUpdate") == "state_update" and update.get("state") == "idle"


async def test_a_v2_client_is_served_v2_in_front_of_a_v1_agent_and_a_v1_client_is_not_touched():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False, experimental_v2=True) as (raw, bridge):
        v2 = V2Client(raw)
        init = await v2.call("initialize", V2_INIT)
        assert init["protocolVersion"] == 2
        assert init["capabilities"]["session"]["delete"] == {}
        sid = (await v2.call("session/new", {"cwd": "/w"}))["sessionId"]

        ack = await v2.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "count 3"}]}
        )
        assert isinstance(ack["messageId"], str)
        idle = await v2.wait_update(sid, _idle)
        assert idle["stopReason"] == "end_turn"
        updates = v2.updates(sid)
        assert updates[0] == {
            "sessionUpdate": "user_message",
            "messageId": ack["messageId"],
            "content": [{"type": "text", "text": "count 3"}],
        }
        assert updates[1] == {"sessionUpdate": "state_update", "state": "running"}
        chunks = [u for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
        assert [c["content"]["text"] for c in chunks] == [f"a:{sid}:{i}" for i in (0, 1, 2)]
        # one run of chunks: one message, its id minted by the bridge
        assert len({c["messageId"] for c in chunks}) == 1
        assert chunks[0]["messageId"] != ack["messageId"]

        # a v1 client on the same bridge at the same time: v1 as ever
        async with trio.open_nursery() as nursery:
            v1 = await connect(bridge, nursery, log=None)
            v1_sid = await v1.new_session()
            answer = await v1.prompt(v1_sid, "count 2")
            assert answer["result"] == {"stopReason": "end_turn"}
            assert v1.updates(v1_sid) == [f"a:{v1_sid}:0", f"a:{v1_sid}:1"]
            assert all(
                "messageId" not in m.get("params", {}).get("update", {}) for m in v1.received
            )
            nursery.cancel_scope.cancel()

        # a permission round trip: requires_action while it waits, then running, then idle
        ack2 = await v2.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "permission"}]}
        )
        ask = await raw.agent_requests.receive()
        assert ask["method"] == "session/request_permission"
        assert ask["params"]["title"]
        assert ask["params"]["subject"]["type"] == "tool_call"
        await v2.wait_update(sid, lambda u: u.get("state") == "requires_action")
        option = ask["params"]["options"][0]["optionId"]
        await raw.send(
            {
                "jsonrpc": "2.0",
                "id": ask["id"],
                "result": {"outcome": {"outcome": "selected", "optionId": option}},
            }
        )
        seen = len(v2.updates(sid))
        await v2.wait_update(sid, lambda u: _idle(u) and u is not idle)
        after = v2.updates(sid)[seen - 1 :]
        kinds = [(u["sessionUpdate"], u.get("state")) for u in after]
        assert ("state_update", "running") in kinds
        assert any(
            u["sessionUpdate"] == "agent_message_chunk"
            and u["content"]["text"] == f"a:outcome:{option}"
            for u in after
        )
        assert ack2["messageId"] != ack["messageId"]

        listed = await v2.call("session/list", {})
        assert sid in [s["sessionId"] for s in listed["sessions"]]

        # replay from the start: the conversation as whole messages keyed by messageId
        before = len(raw.received)
        assert (
            await v2.call(
                "session/resume", {"sessionId": sid, "cwd": "/w", "replayFrom": {"type": "start"}}
            )
            == {}
        )
        replayed = [
            m["params"]["update"]
            for m in raw.received[before:]
            if m.get("method") == "session/update"
        ]
        messages = [(u["sessionUpdate"], u["content"]) for u in replayed]
        assert messages[0] == ("user_message", [{"type": "text", "text": "count 3"}])
        assert messages[1] == (
            "agent_message",
            [{"type": "text", "text": f"a:{sid}:{i}"} for i in (0, 1, 2)],
        )
        assert messages[2] == ("user_message", [{"type": "text", "text": "permission"}])
        assert len({u["messageId"] for u in replayed}) == len(replayed)

        bad = await v2.request(
            "session/resume", {"sessionId": sid, "cwd": "/w", "replayFrom": {"type": "later"}}
        )
        assert bad["error"]["code"] == -32602

        assert await v2.call("session/close", {"sessionId": sid}) == {}
        gone = await v2.request(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}
        )
        assert gone["error"]["code"] == -32002
        v2.check_all()


async def test_without_the_flag_a_v2_initialize_gets_the_bridges_v1():
    async with open_bridge({"a": FakeAgent("a")}, initialize=False) as (raw, _bridge):
        init = await raw.call("initialize", V2_INIT)
        assert init["protocolVersion"] == 1
        assert "agentCapabilities" in init


async def test_over_websocket_a_v2_and_a_v1_connection_are_each_served_their_own_version():
    from tests.faces.test_ws import TIMEOUT, open_peer, open_server

    prompt = [{"type": "text", "text": "count 2"}]
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": FakeAgent("a")}, bridge={"experimental_v2": True}) as server,
            open_peer(server.port, initialize=False) as v2,
            open_peer(server.port) as v1,
        ):
            init = await v2.request("initialize", V2_INIT)
            assert init["result"]["protocolVersion"] == 2
            sid = (await v2.request("session/new", {"cwd": "/w"}))["result"]["sessionId"]
            ack = await v2.request("session/prompt", {"sessionId": sid, "prompt": prompt})
            while not _idle(v2.received[-1].get("params", {}).get("update", {})):
                await v2.next()
            chunks = [
                m["params"]["update"]
                for m in v2.received
                if m.get("params", {}).get("update", {}).get("sessionUpdate")
                == "agent_message_chunk"
            ]
            assert [c["content"]["text"] for c in chunks] == [f"a:{sid}:0", f"a:{sid}:1"]
            assert isinstance(ack["result"]["messageId"], str)
            asked = {1: "initialize", 2: "session/new", 3: "session/prompt"}
            for msg in v2.received:
                check_to_client(msg, asked)

            v1_sid = (await v1.request("session/new", {"cwd": "/w", "mcpServers": []}))["result"][
                "sessionId"
            ]
            reply = await v1.request("session/prompt", {"sessionId": v1_sid, "prompt": prompt})
            assert reply["result"] == {"stopReason": "end_turn"}
            assert not any("messageId" in str(m) for m in v1.received)


async def test_cancel_request_both_ways_for_a_v2_client():
    """
    ``$/cancel_request`` from the v2 client reaches the agent as the v1 cancel of the bridge's
    id (the request then ends with one response), a held prompt is withdrawn by the face with
    one -32800; the agent's ``$/cancel_request`` of a question reaches the client under the id
    it was shown, and the turn is running again.
    """
    agent = FakeAgent("a")
    agent.close_gate = trio.Event()
    with trio.fail_after(10):
        async with open_bridge({"a": agent}, initialize=False, experimental_v2=True) as (
            raw,
            _bridge,
        ):
            v2 = V2Client(raw)
            await v2.call("initialize", V2_INIT)
            sid = (await v2.call("session/new", {"cwd": "/w"}))["sessionId"]

            # client → agent: a request the agent holds (close), cancelled by the client's id
            async with trio.open_nursery() as nursery:
                closing: list[dict[str, Any]] = []

                async def close() -> None:
                    closing.append(await v2.request("session/close", {"sessionId": sid}))

                nursery.start_soon(close)
                await trio.testing.wait_all_tasks_blocked()
                (held,) = [m for m in agent.received if m.get("method") == "session/close"]
                await raw.notify("$/cancel_request", {"requestId": "c3"})
                await trio.testing.wait_all_tasks_blocked()
                cancels = [m for m in agent.received if m.get("method") == "$/cancel_request"]
                assert cancels == [
                    {
                        "jsonrpc": "2.0",
                        "method": "$/cancel_request",
                        "params": {"requestId": held["id"]},
                    }
                ]
                agent.close_gate.set()
            assert closing == [{"jsonrpc": "2.0", "id": "c3", "result": {}}]
            assert [m for m in raw.received if m.get("id") == "c3"] == closing

            # a held prompt (its session's turn runs) withdrawn by the face: one -32800
            sid = (await v2.call("session/new", {"cwd": "/w"}))["sessionId"]
            wait = {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
            await v2.call("session/prompt", wait)
            async with trio.open_nursery() as nursery:
                withdrawn: list[dict[str, Any]] = []

                async def second() -> None:
                    withdrawn.append(await v2.request("session/prompt", wait))

                nursery.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()
                await raw.notify("$/cancel_request", {"requestId": "c6"})
            assert [w["error"]["code"] for w in withdrawn] == [-32800]
            assert [m for m in raw.received if m.get("id") == "c6"] == withdrawn
            assert [m["method"] for m in agent.received if m.get("method") == "session/prompt"] == [
                "session/prompt"
            ]
            await raw.notify("session/cancel", {"sessionId": sid})
            await v2.wait_update(sid, _idle)

            # agent → client: the question withdrawn reaches the client under its own id
            permission = {"sessionId": sid, "prompt": [{"type": "text", "text": "permission"}]}
            await v2.call("session/prompt", permission)
            ask = await raw.agent_requests.receive()
            await v2.wait_update(sid, lambda u: u.get("state") == "requires_action")
            (agent_side,) = agent._waiting
            seen = len(v2.updates(sid))
            await agent.write(
                {
                    "jsonrpc": "2.0",
                    "method": "$/cancel_request",
                    "params": {"requestId": agent_side},
                }
            )
            withdrawal = await raw.wait_for(lambda m: m.get("method") == "$/cancel_request")
            assert withdrawal["params"] == {"requestId": ask["id"]}
            await v2.wait_update(sid, lambda u: u.get("state") == "running")
            assert {"sessionUpdate": "state_update", "state": "running"} in v2.updates(sid)[seen:]
            v2.check_all()
