"""
A notification ACP defines (``session/cancel``, ``$/cancel_request``) sent as a request, with
an ``id``: it takes effect as the notification, then it is answered ``null``, exactly once.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from tests.support.fakes import FakeAgent, TestClient, open_bridge
from tests.support.v1_schema import check_all


def answers_to(client: TestClient, req_id: Any) -> list[dict[str, Any]]:
    return [m for m in client.received if "method" not in m and m.get("id") == req_id]


async def test_a_session_cancel_sent_as_a_request_cancels_the_turn_and_is_answered_null():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (client, _):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            turn: list[dict[str, Any]] = []

            async def prompt() -> None:
                turn.append(await client.prompt(sid, "permission"))

            nursery.start_soon(prompt)
            shown = await client.agent_requests.receive()
            answer = await client.request("session/cancel", {"sessionId": sid}, id="c1")
            assert answer == {"jsonrpc": "2.0", "id": "c1", "result": None}
        # It took effect: the permission was settled cancelled, the turn ended cancelled.
        assert turn[0]["result"] == {"stopReason": "cancelled"}
        assert agent.cancelled == {"s1"}
        [forwarded] = [m for m in agent.received if m.get("method") == "session/cancel"]
        assert "id" not in forwarded
        await trio.testing.wait_all_tasks_blocked()
        assert len(answers_to(client, "c1")) == 1
        withdrawn = [m for m in client.received if m.get("method") == "$/cancel_request"]
        assert [m["params"]["requestId"] for m in withdrawn] == [shown["id"]]
        check_all(client.received, client.asked)


async def test_a_cancel_request_sent_as_a_request_reaches_the_agent_as_the_notification():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (client, _):
        sid = await client.new_session()
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": "p",
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hang"}]},
            }
        )
        await client.wait_for(lambda m: "hanging" in str(m))
        answer = await client.request("$/cancel_request", {"requestId": "p"}, id=7)
        assert answer == {"jsonrpc": "2.0", "id": 7, "result": None}
        [prompt] = [m for m in agent.received if m.get("method") == "session/prompt"]
        [cancel] = [m for m in agent.received if m.get("method") == "$/cancel_request"]
        assert cancel == {
            "jsonrpc": "2.0",
            "method": "$/cancel_request",
            "params": {"requestId": prompt["id"]},
        }


async def test_unknown_or_foreign_targets_still_get_their_one_answer():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (client, _):
        for req_id, (method, params) in enumerate(
            [
                ("session/cancel", {"sessionId": "nope"}),
                ("session/cancel", None),
                ("$/cancel_request", {"requestId": 12345}),
                ("$/cancel_request", {"requestId": [1]}),
            ],
            start=100,
        ):
            answer = await client.request(method, params, id=req_id)
            assert answer["result"] is None
        await trio.testing.wait_all_tasks_blocked()
        for req_id in range(100, 104):
            assert len(answers_to(client, req_id)) == 1


async def test_before_initialize_it_is_refused_like_any_request():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        answer = await client.request("session/cancel", {"sessionId": "s1"}, id=1)
        assert answer["error"]["code"] == -32600
