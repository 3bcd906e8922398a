"""
Notices: a client that advertises ``clientCapabilities.session.notices`` gets the bridge's
session-scoped diagnostics as ``notice`` session updates (an agent's exit and restart, an
error on its stderr, a permission the policy answered on its own, setup the agent could not
take), redacted and bounded; agents' own notices are relayed unchanged to such a client;
none of it is history; a client without the capability gets none.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from acp_bridge.faces.serve import DAEMON_AGENT_CAPABILITIES
from acp_bridge.policy.rules import parse_policy
from acp_bridge.protocol.notices import NOTICE_BURST, NOTICE_SUMMARY_DELAY
from tests.support.fakes import FakeAgent, TestClient, connect, open_bridge
from tests.support.v1_schema import check_all

NOTICES = {"notices": {}}
FS = {"readTextFile": True, "writeTextFile": True}


def policy(**table: Any) -> Any:
    parsed, problems = parse_policy(table)
    assert problems == []
    return parsed


def notices(client: TestClient, sid: str | None = None) -> list[dict[str, Any]]:
    """The notice updates a client got (of one session), as their ``update``s."""
    return [
        m["params"]["update"]
        for m in client.received
        if m.get("method") == "session/update"
        and m["params"]["update"].get("sessionUpdate") == "notice"
        and (sid is None or m["params"]["sessionId"] == sid)
    ]


async def with_notices(client: TestClient, *, log: str | None = None) -> None:
    await client.initialize(log=log, fs=FS, session=NOTICES)


async def second_client(bridge: Any, nursery: trio.Nursery, *, notices: bool) -> TestClient:
    client = await connect(bridge, nursery, log=None, name="other")
    caps: dict[str, Any] = {"fs": FS}
    if notices:
        caps["session"] = NOTICES
    # (initialized again, with these capabilities: a client may re-initialize)
    await client.initialize(log=None, **caps)
    return client


async def test_a_crash_is_an_error_notice_on_each_session_that_ended_with_it():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, bridge):
        await with_notices(client)
        sid = await client.new_session()
        other = await client.new_session()
        async with trio.open_nursery() as nursery:
            stock = await second_client(bridge, nursery, notices=False)
            await stock.new_session()
            assert "error" in await client.prompt(sid, "crash")
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        for session in (sid, other):
            [notice] = notices(client, session)
            assert notice["severity"] == "error"
            assert notice["title"] == "Agent 'a' exited (status 1); restarting when needed"
            assert "sessions ended" in notice["description"]
        assert notices(stock) == []
        check_all(client.received, client.asked)
        check_all(stock.received, stock.asked)


async def test_a_crash_loop_says_the_agent_is_not_restarted():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False, crash_loop_limit=1) as (client, _):
        await with_notices(client)
        sid = await client.new_session()
        await client.prompt(sid, "crash")
        await trio.testing.wait_all_tasks_blocked()
        [notice] = notices(client, sid)
        assert notice["title"] == "Agent 'a' exited (status 1); not restarting"
        assert "1 times in 60s" in notice["description"]


async def test_the_sessions_that_ended_are_told_the_agent_restarts(autojump_clock):
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await with_notices(client)
        sid = await client.new_session()
        await client.prompt(sid, "crash")
        loaded = await client.request(
            "session/load", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
        )
        assert "result" in loaded
        restart = notices(client, sid)[-1]
        assert restart == {
            "sessionUpdate": "notice",
            "severity": "info",
            "title": "Agent 'a' restarting",
            "description": "It starts again in 0.5s (backoff after recent exits).",
        }
        assert agent.starts == 2
        check_all(client.received, client.asked)


async def test_an_error_on_the_agents_stderr_is_a_notice_redacted():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, bridge):
        bridge.hub.redactor.add("hunter2-secret")
        await with_notices(client)
        sid = await client.new_session()
        await client.prompt(sid, "stderr ERROR: login failed with hunter2-secret")
        await client.prompt(sid, "stderr just talking about the weather")
        await client.prompt(sid, "stderr WARN disk is filling up")
        await trio.testing.wait_all_tasks_blocked()
        [notice] = notices(client, sid)
        assert notice == {
            "sessionUpdate": "notice",
            "severity": "error",
            "title": "Agent 'a' reported an error",
            "description": "ERROR: login failed with ***",
        }
        check_all(client.received, client.asked)


async def test_a_permission_the_policy_denied_says_why_and_an_allow_says_nothing(autojump_clock):
    rules = [
        {"id": "no-deletes", "kind": "delete", "action": "deny"},
        {"id": "reads", "kind": "read", "action": "allow"},
    ]
    agent = FakeAgent("a")
    async with open_bridge(
        {"a": agent}, initialize=False, policy=policy(rules=rules, ask_timeout=30)
    ) as (client, _):
        await with_notices(client)
        sid = await client.new_session()
        call = {
            "sessionId": sid,
            "options": [
                {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                {"optionId": "no", "name": "Reject", "kind": "reject_once"},
            ],
        }
        tool = {"toolCallId": "t1", "title": "rm -rf build", "kind": "delete"}
        await agent.call("session/request_permission", {**call, "toolCall": tool})
        read = {"toolCallId": "t2", "title": "cat notes", "kind": "read"}
        await agent.call("session/request_permission", {**call, "toolCall": read})
        edit = {"toolCallId": "t3", "title": "edit main.py", "kind": "edit"}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.call, "session/request_permission", {**call, "toolCall": edit})
            await client.agent_requests.receive()  # shown; nobody answers
        await trio.testing.wait_all_tasks_blocked()
        assert [(n["severity"], n["title"], n["description"]) for n in notices(client, sid)] == [
            ("warning", "Permission denied: rm -rf build", "The approval rule 'no-deletes'."),
            (
                "warning",
                "Permission denied: edit main.py",
                "Nobody answered in time (no answer within 30s).",
            ),
        ]
        check_all(client.received, client.asked)


async def test_an_unattended_sessions_denial_is_told_to_its_client():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await with_notices(client)
        sid = await client.new_session(_meta={"acp_bridge": {"unattended": True}})
        tool = {"toolCallId": "t1", "title": "edit it", "kind": "edit"}
        options = [{"optionId": "no", "name": "Reject", "kind": "reject_once"}]
        params = {"sessionId": sid, "toolCall": tool, "options": options}
        await agent.call("session/request_permission", params)
        await trio.testing.wait_all_tasks_blocked()
        [notice] = notices(client, sid)
        assert notice["description"] == "Nobody can answer it: session is unattended."


async def test_setup_the_agent_cannot_take_is_told_after_the_session_is_open():
    agent = FakeAgent("a")
    http = {"type": "http", "name": "docs", "url": "https://mcp.test", "headers": []}
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await with_notices(client)
        sid = await client.new_session(mcpServers=[http])
        await trio.testing.wait_all_tasks_blocked()
        [notice] = notices(client, sid)
        assert notice["severity"] == "warning"
        assert notice["title"] == "Agent 'a' cannot take all of this session's setup"
        assert notice["description"] == "Left out: mcpServers: http server 'docs'."
        answered = next(i for i, m in enumerate(client.received) if m.get("id") == 2)
        told = next(i for i, m in enumerate(client.received) if m.get("method") == "session/update")
        assert answered < told  # (the session's id is not the client's before the answer)
        check_all(client.received, client.asked)


async def test_an_agents_own_notice_is_relayed_unchanged_and_is_not_history():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, bridge):
        await with_notices(client)
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            stock = await second_client(bridge, nursery, notices=False)
            stock_sid = await stock.new_session()
            for target in (sid, stock_sid):
                update = {
                    "sessionUpdate": "notice",
                    "severity": "_custom",
                    "title": "Indexing",
                    "description": "Indexing 1,204 files",
                    "_meta": {"x": 1},
                }
                await agent.write(
                    {
                        "jsonrpc": "2.0",
                        "method": "session/update",
                        "params": {"sessionId": target, "update": update},
                    }
                )
            await client.prompt(sid, "count 1")
            await stock.prompt(stock_sid, "count 1")
            assert notices(client, sid) == [update]
            assert notices(stock) == []
            # Not history: a load the bridge serves replays the chunks, not the notice.
            before = len(client.received)
            await client.call("session/load", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            replayed = [m["params"]["update"] for m in client.received[before:] if "params" in m]
            assert replayed
            assert not [u for u in replayed if u["sessionUpdate"] == "notice"]
            history = bridge.hub.sessions.get(sid).history
            assert b"notice" not in b"".join(data for _, data in history.after(0)[0])
            nursery.cancel_scope.cancel()
        check_all(client.received, client.asked)


async def test_notices_are_bounded_and_what_the_bound_held_back_is_counted(autojump_clock):
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await with_notices(client)
        sid = await client.new_session()
        assert agent.stderr is not None
        await agent.stderr.send_all(b"".join(b"ERROR: failure %d\n" % i for i in range(40)))
        await trio.testing.wait_all_tasks_blocked()
        shown = notices(client, sid)
        assert len(shown) == NOTICE_BURST
        await trio.sleep(NOTICE_SUMMARY_DELAY)
        await trio.testing.wait_all_tasks_blocked()
        summary = notices(client, sid)[-1]
        assert len(notices(client, sid)) == NOTICE_BURST + 1
        assert summary["severity"] == "warning"
        assert summary["title"].endswith("more notices not shown")
        # (all 40 came at one instant: the bucket had not refilled)
        assert summary["title"] == f"{40 - NOTICE_BURST:g} more notices not shown"
        check_all(client.received, client.asked)


async def test_session_notices_reach_an_agent_only_when_its_client_advertised_them():
    # stdio: the agent is initialized with the client's capabilities
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await with_notices(client)
        assert agent.client_capabilities["session"] == NOTICES
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await client.initialize(log=None, fs=FS)
        assert "session" not in agent.client_capabilities
    # the daemon: fixed capabilities, without notices (its clients differ)
    agent = FakeAgent("a")
    async with open_bridge(
        {"a": agent}, initialize=False, agent_client_capabilities=DAEMON_AGENT_CAPABILITIES
    ) as (client, _):
        await with_notices(client)
        assert "session" not in agent.client_capabilities
