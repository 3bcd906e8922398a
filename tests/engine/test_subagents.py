"""
Sub-agents in process (docs/subagents.md): fake agents behind a real bridge, the test playing
the parent agent's MCP client against the server entry its ``session/new`` was given (over
real loopback HTTP, through the same relay ``acp-bridge mcp`` runs).
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import TYPE_CHECKING, Any

import pytest
import trio

from acp_bridge.config.model import SubagentsConfig
from acp_bridge.demo.mcp_client import McpClient, McpError, connect, find_entry
from acp_bridge.faces.status import format_status, session_tree
from acp_bridge.policy.rules import Action, Policy, Rule
from tests.support.fakes import FakeAgent, open_bridge
from tests.support.fakes import connect as connect_client

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.support.fakes import TestClient

TIMEOUT = 20
HTTP = {
    "loadSession": True,
    "sessionCapabilities": {"list": {}, "close": {}, "resume": {}},
    "mcpCapabilities": {"http": True},
}


def agents() -> dict[str, FakeAgent]:
    return {
        "a": FakeAgent("a", capabilities=HTTP),
        "b": FakeAgent("b", prefix="c", capabilities=HTTP),
    }


def entry_of(agent: FakeAgent, n: int = -1) -> dict[str, Any]:
    """The acp-bridge entry of the agent's n-th session/new."""
    news = [m for m in agent.received if m.get("method") == "session/new"]
    found = find_entry(news[n]["params"]["mcpServers"])
    assert found is not None
    return dict(found)


@contextlib.asynccontextmanager
async def mcp_of(agent: FakeAgent, n: int = -1) -> AsyncIterator[McpClient]:
    async with connect(entry_of(agent, n)) as client:
        yield client


async def spawn(mcp: McpClient, prompt: str, agent: str = "b", **more: Any) -> dict[str, Any]:
    return await mcp.call_tool("spawn_agent", {"agent": agent, "prompt": prompt, **more})


def error_text(result: dict[str, Any]) -> str:
    assert result.get("isError") is True, result
    text = result["content"][0]["text"]
    assert isinstance(text, str)
    return text


async def answer_next_request(client: TestClient, option: str) -> dict[str, Any]:
    request = await client.agent_requests.receive()
    outcome = {"outcome": "selected", "optionId": option}
    await client.send({"jsonrpc": "2.0", "id": request["id"], "result": {"outcome": outcome}})
    return request


async def test_the_server_is_offered_http_or_stdio_and_a_token_is_bound_to_its_session():
    fakes = {"a": FakeAgent("a", capabilities=HTTP), "p": FakeAgent("p", capabilities={})}
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            planted = {"name": "acp-bridge", "command": "planted", "args": [], "env": []}
            sid_a = await client.new_session(mcpServers=[planted])
            sid_p = await client.new_session(agent="p")
    [http] = next(s for s in fakes["a"].received if s.get("method") == "session/new")["params"][
        "mcpServers"
    ]  # the client's own entry of that name is not passed on: the name is the bridge's
    assert http["type"] == "http"
    assert http["url"].startswith("http://127.0.0.1:")
    [header] = http["headers"]
    token_a = header["value"].removeprefix("Bearer ")
    stdio = entry_of(fakes["p"])
    assert stdio["args"][-3:-1] == ["mcp", "--url"]
    [env] = stdio["env"]
    assert env["name"] == "ACP_BRIDGE_MCP_TOKEN"
    tokens = bridge.subagents.endpoint.tokens
    grant_a, grant_p = tokens.check(token_a), tokens.check(env["value"])
    assert grant_a is not None
    assert grant_p is not None
    assert (grant_a.session, grant_p.session) == (sid_a, sid_p)
    # Nothing of it goes back to the client.
    assert token_a not in repr(client.received)


async def test_a_parent_spawns_a_child_and_gets_its_text_in_order():
    fakes = agents()
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            parent = await client.new_session()
            async with mcp_of(fakes["a"]) as mcp:
                listed = await mcp.call_tool("list_agents", {})
                assert [a["name"] for a in listed["structuredContent"]["agents"]] == ["a", "b"]
                result = await spawn(mcp, "count 4")
            status = result["structuredContent"]
            child = status["child"]
            assert status == {
                "child": child,
                "state": "idle",
                "stopReason": "end_turn",
                "text": "".join(f"b:c1:{i}" for i in range(4)),
            }
            session = bridge.hub.sessions.get(child)
            assert session is not None
            assert session.parent == parent
            assert session.roots == ("/w",)
            # A stock client sees none of the child's traffic.
            assert all(m.get("params", {}).get("sessionId") != child for m in client.received)
            # The child's token is bound to it: it may spawn no further (default max_depth 2
            # allows one more level), and the journal/listing know its parent.
            rows, cursor = [], None
            while True:
                page = await client.call("session/list", {"cursor": cursor} if cursor else {})
                rows += page["sessions"]
                if (cursor := page.get("nextCursor")) is None:
                    break
            [row] = [s for s in rows if s["sessionId"] == child]
            assert row["_meta"]["acp_bridge"]["parent"] == parent


async def test_a_token_of_one_session_is_refused_for_another_sessions_child():
    fakes = agents()
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            first = await client.new_session()
            await client.new_session()
            async with mcp_of(fakes["a"], 0) as mine:
                child = (await spawn(mine, "count 1"))["structuredContent"]["child"]
            async with mcp_of(fakes["a"], 1) as other:
                result = await other.call_tool("prompt_agent", {"child": child, "prompt": "x"})
                assert "not yours" in error_text(result)
                result = await other.call_tool("close_agent", {"child": child})
                assert "not yours" in error_text(result)
            # Its session closed, the first token is revoked: refused outright.
            await client.call("session/close", {"sessionId": first})
            assert bridge.hub.sessions.get(child) is None  # its child closed with it
            with pytest.raises(McpError, match="no longer"):
                async with mcp_of(fakes["a"], 0):
                    pass


async def test_a_childs_permission_reaches_a_stock_client_on_the_parent_session():
    fakes = agents()
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            parent = await client.new_session()
            async with mcp_of(fakes["a"]) as mcp, trio.open_nursery() as nursery:
                results: list[dict[str, Any]] = []

                async def call() -> None:
                    results.append(await spawn(mcp, "permission"))

                nursery.start_soon(call)
                request = await answer_next_request(client, "yes")
            params = request["params"]
            assert params["sessionId"] == parent
            child = params["_meta"]["acp_bridge"]["child"]
            assert child["agent"] == "b"
            assert results[0]["structuredContent"]["text"] == "b:outcome:yes"
            assert child["sessionId"] == results[0]["structuredContent"]["child"]


async def test_a_childs_permission_reaches_a_subagents_client_on_the_childs_session():
    fakes = agents()
    async with open_bridge(fakes, initialize=False) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.initialize(subagents={})
            parent = await client.new_session()
            async with mcp_of(fakes["a"]) as mcp, trio.open_nursery() as nursery:
                results: list[dict[str, Any]] = []

                async def call() -> None:
                    results.append(await spawn(mcp, "permission"))

                nursery.start_soon(call)
                request = await answer_next_request(client, "no")
            child = request["params"]["sessionId"]
            assert child != parent
            assert "child" not in (request["params"].get("_meta") or {}).get("acp_bridge", {})
            assert results[0]["structuredContent"]["text"] == "b:outcome:no"
            # Announced on the parent before any of its traffic; its updates on its own id.
            announced = [
                i
                for i, m in enumerate(client.received)
                if m.get("method") == "session/update"
                and m["params"]["update"].get("sessionUpdate") == "subagent_update"
                and m["params"]["update"].get("sessionId") == child
            ]
            first_own = next(
                i
                for i, m in enumerate(client.received)
                if m.get("params", {}).get("sessionId") == child
            )
            assert announced
            assert announced[0] < first_own
            assert client.received[announced[0]]["params"]["sessionId"] == parent
            assert client.updates(child) == ["b:outcome:no"]


async def test_an_unattended_parents_child_is_denied_and_nothing_is_shown():
    fakes = agents()
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session(_meta={"acp_bridge": {"unattended": True}})
            async with mcp_of(fakes["a"]) as mcp:
                result = await spawn(mcp, "permission")
            assert result["structuredContent"]["text"] == "b:outcome:no"
            assert not [
                m for m in client.received if m.get("method") == "session/request_permission"
            ]


async def test_a_policy_rule_matches_on_the_parent_agent():
    fakes = agents()
    rule = Rule(id="children-of-a", action=Action.ALLOW, parent="a")
    async with open_bridge(fakes, policy=Policy(rules=(rule,))) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session()
            async with mcp_of(fakes["a"]) as mcp:
                result = await spawn(mcp, "permission")
            assert result["structuredContent"]["text"] == "b:outcome:yes"
            # The same request from a session of b's own is not a child's: asked, not allowed.
            sid = await client.new_session(agent="b")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.prompt, sid, "permission")
                request = await answer_next_request(client, "no")
            assert request["params"]["sessionId"] == sid


async def test_the_parents_cancel_cascades_to_its_running_child():
    fakes = agents()
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            parent = await client.new_session()
            async with mcp_of(fakes["a"]) as mcp, trio.open_nursery() as nursery:
                results: list[dict[str, Any]] = []

                async def call() -> None:
                    results.append(await spawn(mcp, "permission"))

                nursery.start_soon(call)
                await client.agent_requests.receive()  # shown, and never answered
                await client.notify("session/cancel", {"sessionId": parent})
            status = results[0]["structuredContent"]
            assert status["stopReason"] == "cancelled"
            assert status["text"] == "b:outcome:{'outcome': 'cancelled'}"
            assert "c1" in fakes["b"].cancelled
            assert bridge.approvals.counts["cancelled:cancel"] == 1


async def test_depth_and_fan_out_caps_refuse_with_a_tool_error():
    fakes = agents()
    caps = SubagentsConfig(max_depth=1, max_children=1, agents=("b",))
    async with open_bridge(fakes, subagents=caps) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session()
            async with mcp_of(fakes["a"]) as mcp:
                assert "may not be spawned" in error_text(await spawn(mcp, "count 1", agent="a"))
                await spawn(mcp, "count 1")
                assert "max_children = 1" in error_text(await spawn(mcp, "count 1"))
            # The child sits at max_depth: it is offered no spawn_agent at all.
            async with mcp_of(fakes["b"]) as deep:
                tools = await deep.request("tools/list", {})
                names = {t["name"] for t in tools["tools"]}
                assert "spawn_agent" not in names
                assert "wait_agents" in names
                with pytest.raises(McpError, match="unknown tool"):
                    await spawn(deep, "count 1")


async def test_a_dead_child_agent_answers_the_parents_call_with_an_error():
    fakes = agents()
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session()
            async with mcp_of(fakes["a"]) as mcp:
                text = error_text(await spawn(mcp, "crash"))
            assert "agent 'b'" in text
            assert "exited" in text


async def test_wait_agents_and_prompt_agent_drive_a_child_without_waiting():
    fakes = agents()
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session()
            async with mcp_of(fakes["a"]) as mcp:
                started = (await spawn(mcp, "count 2", wait=False))["structuredContent"]
                assert started["state"] in ("running", "idle")
                child = started["child"]
                waited = await mcp.call_tool("wait_agents", {"children": [child]})
                [status] = waited["structuredContent"]["children"]
                assert status["text"] == "b:c1:0b:c1:1"
                again = await mcp.call_tool("prompt_agent", {"child": child, "prompt": "count 1"})
                assert again["structuredContent"]["text"] == "b:c1:0"
                closed = await mcp.call_tool("close_agent", {"child": child})
                assert closed["structuredContent"]["state"] == "closed"
            assert "c1" not in fakes["b"].sessions  # closed at its agent


async def test_status_shows_the_tree_of_parents_and_children():
    fakes = agents()
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            parent = await client.new_session()
            async with mcp_of(fakes["a"]) as mcp:
                child = (await spawn(mcp, "count 1"))["structuredContent"]["child"]
            other = await client.new_session()
            status = bridge.status()
    by_id = {s["sessionId"]: s for s in status["sessions"]}
    assert by_id[child]["parent"] == parent
    assert by_id[parent]["parent"] is None
    lines = format_status(status).splitlines()
    start = lines.index("sessions (3):")
    assert [line.split()[0:2] for line in lines[start + 1 : start + 4]] == [
        [parent, "agent"],
        ["└", child],
        [other, "agent"],
    ]


def test_the_sessions_command_lists_children_under_their_parents(capsys):
    from acp_bridge.cli.main import main
    from acp_bridge.config.model import default_state_dir
    from acp_bridge.store.db import SessionRow, open_store

    store = open_store(str(default_state_dir() / "bridge.db"))
    store.write(
        sessions=[
            SessionRow("s1", "demo", "s1", roots=("/w",), created=1.0),
            SessionRow("c1", "helper", "c1", roots=("/w",), created=2.0, parent="g1"),
            SessionRow("s2", "demo", "s2", roots=("/w",), created=3.0),
            SessionRow("g1", "helper", "g1", roots=("/w",), created=4.0, parent="s1"),
        ]
    )
    store.close()
    assert main(["sessions"]) == 0
    out = capsys.readouterr().out.splitlines()
    names = [re.match(r"\s*(└ )?\S+", line)[0] for line in out]  # type: ignore[index]
    assert names == ["s1", "└ g1", "  └ c1", "s2"]
    assert main(["sessions", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["sessionId"], r["parent"]) for r in rows] == [
        ("s1", None),
        ("g1", "s1"),
        ("c1", "g1"),
        ("s2", None),
    ]


def test_a_tree_whose_parents_go_round_loses_no_session():
    rows = [("a", "b"), ("b", "a"), ("c", None)]
    order = session_tree(rows, lambda r: r[0], lambda r: r[1])
    assert sorted(r[0] for _, r in order) == ["a", "b", "c"]


async def test_a_load_the_agent_serves_is_offered_the_server_bound_to_that_session():
    fakes = agents()
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            await client.new_session()
            fakes["a"].sessions.append("s7")  # one the bridge never saw: the agent loads it
            await client.call("session/load", {"sessionId": "s7", "cwd": "/w", "mcpServers": []})
            [load] = [m for m in fakes["a"].received if m.get("method") == "session/load"]
            server = find_entry(load["params"]["mcpServers"])
            assert server is not None
            token = server["headers"][0]["value"].removeprefix("Bearer ")
            grant = bridge.subagents.endpoint.tokens.check(token)
            assert grant is not None
            assert grant.session == "s7"
            # A load the agent refuses leaves no token behind.
            before = len(bridge.subagents.endpoint.tokens)
            answer = await client.request(
                "session/load", {"sessionId": "s8", "cwd": "/w", "mcpServers": []}
            )
            assert "error" in answer
            assert len(bridge.subagents.endpoint.tokens) == before


async def test_a_root_taken_over_takes_its_children_and_their_requests_with_it():
    fakes = agents()
    async with open_bridge(fakes) as (first, bridge), trio.open_nursery() as nursery:
        with trio.fail_after(TIMEOUT):
            parent = await first.new_session()
            async with mcp_of(fakes["a"]) as mcp:
                result = await spawn(mcp, "permission", wait=False)
            child = result["structuredContent"]["child"]
            # A stock client: shown the child's request on its parent's session.
            shown = await first.agent_requests.receive()
            assert shown["params"]["sessionId"] == parent
            assert shown["params"]["_meta"]["acp_bridge"]["child"]["sessionId"] == child
            second = await connect_client(bridge, nursery, name="second", subagents={})
            await second.call("session/load", {"sessionId": parent, "cwd": "/w", "mcpServers": []})
            # The replay has the tree: the child announced, running.
            announced = [
                m["params"]["update"]
                for m in second.received
                if m.get("method") == "session/update"
                and m["params"]["sessionId"] == parent
                and m["params"]["update"].get("sessionUpdate") == "subagent_update"
            ]
            assert [u["sessionId"] for u in announced] == [child, child]
            assert announced[0]["title"] == "b"
            assert announced[1]["state"] == {"state": "running"}
            # The child's request moved: withdrawn from the first, shown to the second.
            again = await second.agent_requests.receive()
            assert again["method"] == "session/request_permission"
            assert again["params"]["sessionId"] == child
            await first.wait_for(
                lambda m: (
                    m.get("method") == "$/cancel_request"
                    and m["params"]["requestId"] == shown["id"]
                )
            )
            session = bridge.hub.sessions.get(child)
            assert session is not None
            client = session.client
            assert client is not None
            assert client.name == "second"
            yes = {"outcome": {"outcome": "selected", "optionId": "yes"}}
            await second.send({"jsonrpc": "2.0", "id": again["id"], "result": yes})
            # Its later updates go to the new owner; its end is announced there (recorded).
            idle = await second.wait_for(
                lambda m: (
                    m.get("method") == "session/update"
                    and m["params"]["update"].get("state", {}).get("state") == "idle"
                )
            )
            assert idle["params"]["sessionId"] == parent
            assert second.updates(child) == ["b:outcome:yes"]
            assert first.updates(child) == []
            assert all(
                m.get("params", {}).get("update", {}).get("sessionUpdate") != "subagent_update"
                for m in first.received
            )
        nursery.cancel_scope.cancel()


def subagent_updates(client: TestClient, sid: str) -> list[dict[str, Any]]:
    return [
        m["params"]["update"]
        for m in client.received
        if m.get("method") == "session/update"
        and m["params"]["sessionId"] == sid
        and m["params"]["update"].get("sessionUpdate") == "subagent_update"
    ]


async def test_a_watcher_gets_subagent_updates_live_only_if_it_asked_for_sub_agents():
    fakes = agents()
    async with open_bridge(fakes) as (owner, bridge), trio.open_nursery() as nursery:
        with trio.fail_after(TIMEOUT):
            parent = await owner.new_session()
            tree = await connect_client(bridge, nursery, name="tree", subagents={})
            stock = await connect_client(bridge, nursery, name="stock")
            watch = {
                "sessionId": parent,
                "cwd": "/w",
                "mcpServers": [],
                "_meta": {"acp_bridge": {"watch": True}},
            }
            await tree.call("session/resume", watch)
            await stock.call("session/resume", watch)
            async with mcp_of(fakes["a"]) as mcp:
                result = await spawn(mcp, "count 2")
            child = result["structuredContent"]["child"]
            await tree.wait_for(
                lambda m: (
                    m.get("method") == "session/update"
                    and m["params"]["update"].get("state", {}).get("state") == "idle"
                )
            )
            states = [u.get("state", {}).get("state") for u in subagent_updates(tree, parent)]
            assert states == [None, "running", "idle"]
            assert {u["sessionId"] for u in subagent_updates(tree, parent)} == {child}
            # The stock watcher got the parent's later updates, and none of the tree.
            await owner.prompt(parent, "count 1")
            await stock.wait_for(
                lambda m: (
                    m.get("method") == "session/update"
                    and m["params"]["update"].get("content", {}).get("text") == "a:s1:0"
                )
            )
            assert subagent_updates(stock, parent) == []
            assert subagent_updates(owner, parent) == []
        nursery.cancel_scope.cancel()
