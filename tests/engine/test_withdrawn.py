"""
Withdrawn approvals: a permission request shown to a client and then settled without that
client's answer is withdrawn from it with ``$/cancel_request`` (its own id for it), whatever
the client, a stock one included; ``_acp_bridge/permission_resolved`` goes only to a client
that opted into the bridge's extensions. A late answer is dropped quietly, and audited.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from acp_bridge.policy.rules import parse_policy
from tests.support.fakes import FakeAgent, TestClient, connect, open_bridge
from tests.support.v1_schema import check_all

ALLOW = {"outcome": {"outcome": "selected", "optionId": "yes"}}


def policy(**table: Any) -> Any:
    parsed, problems = parse_policy(table)
    assert problems == []
    return parsed


def withdrawals(client: TestClient) -> list[Any]:
    return [
        m["params"]["requestId"] for m in client.received if m.get("method") == "$/cancel_request"
    ]


def extension_methods(client: TestClient) -> list[str]:
    return [m["method"] for m in client.received if m.get("method", "").startswith("_")]


async def prompt_in_background(
    client: TestClient, sid: str, text: str, nursery: trio.Nursery
) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = []

    async def run() -> None:
        answers.append(await client.prompt(sid, text))

    nursery.start_soon(run)
    return answers


async def late_answer_is_dropped_and_audited(
    client: TestClient, bridge: Any, shown_id: int
) -> None:
    """The client answers the withdrawn request after all: nothing reaches the agent, the
    client gets nothing back, and the audit says so."""
    before = len(client.received)
    await client.send({"jsonrpc": "2.0", "id": shown_id, "result": ALLOW})
    await client.call("_acp_bridge/agents", {})  # a round trip: the answer was handled
    [round_trip] = client.received[before:]
    assert "agents" in round_trip["result"]
    assert bridge.hub.audit.recent[-1].source == "late_answer"


@pytest.mark.parametrize("extensions", [False, True], ids=["stock", "extensions"])
async def test_a_request_that_times_out_is_withdrawn(autojump_clock, extensions):
    agent = FakeAgent("a")
    log = "info" if extensions else None
    async with open_bridge({"a": agent}, log=log, policy=policy(ask_timeout=30)) as (
        client,
        bridge,
    ):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            answers = await prompt_in_background(client, sid, "permission", nursery)
            shown = await client.agent_requests.receive()
        assert trio.current_time() == 30
        assert answers[0]["result"] == {"stopReason": "end_turn"}
        assert client.updates(sid)[-1] == "a:outcome:no"
        await trio.testing.wait_all_tasks_blocked()
        assert withdrawals(client) == [shown["id"]]
        if extensions:
            assert "_acp_bridge/permission_resolved" in extension_methods(client)
            [cancel_at] = [
                i for i, m in enumerate(client.received) if m.get("method") == "$/cancel_request"
            ]
            resolved = client.received[cancel_at + 1]
            assert resolved["method"] == "_acp_bridge/permission_resolved"
            assert resolved["params"]["requestId"] == shown["id"]
        else:
            assert extension_methods(client) == []
        await late_answer_is_dropped_and_audited(client, bridge, shown["id"])
        check_all(client.received, client.asked)


async def test_a_stock_client_is_withdrawn_the_request_when_the_agent_dies():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (client, bridge):
        sid = await client.new_session()
        other = await client.new_session()
        async with trio.open_nursery() as nursery:
            answers = await prompt_in_background(client, sid, "permission", nursery)
            shown = await client.agent_requests.receive()
            crashed = await client.prompt(other, "crash")
            assert "error" in crashed
        assert "error" in answers[0]
        assert withdrawals(client) == [shown["id"]]
        assert extension_methods(client) == []
        assert bridge.hub.audit.recent[-1].source == "agent_exit"
        await late_answer_is_dropped_and_audited(client, bridge, shown["id"])
        check_all(client.received, client.asked)


async def test_a_request_the_agent_withdraws_is_withdrawn_from_the_client_once():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (client, bridge):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            answers = await prompt_in_background(client, sid, "permission", nursery)
            shown = await client.agent_requests.receive()
            await agent.write(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 100}}
            )
        assert answers[0]["result"] == {"stopReason": "cancelled"}
        assert withdrawals(client) == [shown["id"]]
        assert extension_methods(client) == []
        assert bridge.hub.audit.recent[-1].source == "agent_cancel"
        check_all(client.received, client.asked)


async def test_a_cancelled_turn_withdraws_its_requests():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (client, bridge):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            answers = await prompt_in_background(client, sid, "permission", nursery)
            shown = await client.agent_requests.receive()
            await client.notify("session/cancel", {"sessionId": sid})
        assert answers[0]["result"] == {"stopReason": "cancelled"}
        assert withdrawals(client) == [shown["id"]]
        assert extension_methods(client) == []
        assert bridge.hub.audit.recent[-1].source == "cancel"
        await late_answer_is_dropped_and_audited(client, bridge, shown["id"])
        check_all(client.received, client.asked)


async def test_a_console_answer_withdraws_the_request_from_the_client():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (client, bridge):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            answers = await prompt_in_background(client, sid, "permission", nursery)
            shown = await client.agent_requests.receive()
            (entry,) = bridge.approvals.desk.waiting()
            assert await bridge.approvals.console_answer(entry.extra.console_id, "yes") == "settled"
        assert client.updates(sid)[-1] == "a:outcome:yes"
        assert answers[0]["result"] == {"stopReason": "end_turn"}
        assert withdrawals(client) == [shown["id"]]
        assert extension_methods(client) == []
        await late_answer_is_dropped_and_audited(client, bridge, shown["id"])
        check_all(client.received, client.asked)


async def test_a_connection_that_takes_the_session_over_gets_the_request_and_the_old_one_loses_it():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log=None) as (first, bridge), trio.open_nursery() as n:
        sid = await first.new_session()
        answers = await prompt_in_background(first, sid, "permission", n)
        shown = await first.agent_requests.receive()
        second = await connect(bridge, n, log=None, name="second")
        resumed = await second.call("session/resume", {"sessionId": sid, "cwd": "/w"})
        assert resumed["_meta"]["acp_bridge"]["pending"]
        again = await second.agent_requests.receive()
        assert again["params"]["toolCall"]["toolCallId"] == "t1"
        await trio.testing.wait_all_tasks_blocked()
        assert withdrawals(first) == [shown["id"]]
        assert extension_methods(first) == []
        assert withdrawals(second) == []
        # The old connection's late answer changes nothing; the new one's is delivered.
        await first.send({"jsonrpc": "2.0", "id": shown["id"], "result": ALLOW})
        await first.call("_acp_bridge/agents", {})
        assert bridge.hub.audit.recent[-1].source == "late_answer"
        no = {"outcome": {"outcome": "selected", "optionId": "no"}}
        await second.send({"jsonrpc": "2.0", "id": again["id"], "result": no})
        answer = await second.wait_for(lambda m: "stopReason" in (m.get("result") or {}))
        assert answer["result"] == {"stopReason": "end_turn"}
        assert second.updates(sid)[-1] == "a:outcome:no"
        # (the old connection's prompt was answered "taken over"; the turn is the new one's)
        assert answers[0]["error"]["code"] == -32800
        check_all(first.received, first.asked)
        # (the prompt first asked is answered to second, which took its session over)
        check_all(second.received, {**first.asked, **second.asked})
        n.cancel_scope.cancel()


async def test_the_client_that_answers_is_not_withdrawn_anything():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, log="info") as (client, _):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            await prompt_in_background(client, sid, "permission", nursery)
            shown = await client.agent_requests.receive()
            await client.send({"jsonrpc": "2.0", "id": shown["id"], "result": ALLOW})
        assert withdrawals(client) == []
        assert "_acp_bridge/permission_resolved" not in extension_methods(client)
