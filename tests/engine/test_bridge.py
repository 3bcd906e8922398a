"""Bridge behaviour over in-process fake agents and a client on memory streams."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.engine.links import AgentState
from tests.support.fakes import FakeAgent, connect, open_bridge


async def test_initialize_waits_for_default_agent_and_answers_v1(autojump_clock):
    """The bridge's initialize answer means "ready": the default agent has completed its own."""
    agent = FakeAgent("a", init_delay=3)
    async with open_bridge({"a": agent}, initialize=False) as (client, bridge):
        result = await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert trio.current_time() == 3
        assert result["protocolVersion"] == 1
        assert result["agentCapabilities"]["loadSession"] is True
        assert bridge.hub.agents["a"].state is AgentState.READY
        assert agent.received[0]["method"] == "initialize"


async def test_initialize_newer_version_is_answered_with_1():
    async with open_bridge({"a": FakeAgent("a")}, initialize=False) as (client, _):
        result = await client.call("initialize", {"protocolVersion": 7})
        assert result["protocolVersion"] == 1


async def test_initialize_with_a_version_the_bridge_lacks_is_answered_with_its_own():
    """The spec: the requested version when supported, else the latest supported (1)."""
    async with open_bridge({"a": FakeAgent("a")}, initialize=False) as (client, _):
        for requested in (0, -1):
            result = await client.call("initialize", {"protocolVersion": requested})
            assert result["protocolVersion"] == 1


@pytest.mark.parametrize("version", ["1", 1.5, True, None, [1]])
async def test_initialize_with_a_version_that_is_no_integer_is_invalid_params(version):
    async with open_bridge({"a": FakeAgent("a")}, initialize=False) as (client, _):
        params = {} if version is None else {"protocolVersion": version}
        response = await client.request("initialize", params)
        assert response["error"]["code"] == -32602
        assert "protocolVersion" in response["error"]["message"]
        # Not initialized by it.
        refused = await client.request("session/new", {"cwd": "/w", "mcpServers": []})
        assert refused["error"]["code"] == -32600


async def test_requests_before_initialize_are_refused():
    async with open_bridge({"a": FakeAgent("a")}, initialize=False) as (client, _):
        response = await client.request("session/new", {"cwd": "/w", "mcpServers": []})
        assert response["error"]["code"] == -32600


async def test_default_agent_failing_to_start_fails_initialize_with_its_story():
    agent = FakeAgent("a", fail_initialize=True)
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        response = await client.request("initialize", {"protocolVersion": 1})
        assert response["error"]["code"] == -32603
        assert "exited during initialize" in response["error"]["message"]
        assert response["error"]["data"]["agent"] == "a"


async def test_agent_that_never_answers_initialize_times_out(autojump_clock):
    agent = FakeAgent("a", init_delay=1000)
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        response = await client.request("initialize", {"protocolVersion": 1})
        assert trio.current_time() == 5  # the agent's start_timeout in fakes.make_config
        assert "did not answer initialize within 5s" in response["error"]["message"]


async def test_malformed_client_input_gets_the_right_errors_and_nothing_else_breaks():
    async with open_bridge({"a": FakeAgent("a")}) as (client, _):
        await client.send_raw(b"this is not json\n")
        err = await client.wait_for(lambda m: m.get("error", {}).get("code") == -32700)
        assert err["id"] is None
        await client.send_raw(b'{"jsonrpc":"2.0","id":7}\n')
        err = await client.wait_for(lambda m: m.get("id") == 7)
        assert err["error"]["code"] == -32600
        await client.send_raw(b'[{"jsonrpc":"2.0","id":8,"method":"session/new"}]\n')
        err = await client.wait_for(lambda m: "batches" in str(m.get("error")))
        assert err["error"]["code"] == -32600
        response = await client.request("no/such/method", {})
        assert response["error"]["code"] == -32601
        response = await client.request("_vendor/thing", {})  # no sessionId: nowhere to go
        assert response["error"]["code"] == -32601
        await client.notify("no/such/notification", {})
        sid = await client.new_session()
        assert (await client.prompt(sid, "count 2"))["result"]["stopReason"] == "end_turn"


async def test_oversize_client_line_is_refused_without_disturbing_the_next():
    async with open_bridge({"a": FakeAgent("a")}, max_line_bytes=1000) as (client, _):
        await client.send_raw(b"x" * 5000 + b"\n")
        err = await client.wait_for(lambda m: "error" in m)
        assert err["error"]["code"] == -32600
        assert "5000 bytes" in err["error"]["data"]["detail"]
        sid = await client.new_session()
        assert sid == "s1"


async def test_colliding_agent_session_ids_get_distinct_bridge_ids_and_route_right():
    """Two agents both mint "s1": the client sees two ids; each agent sees its own "s1"."""
    a, b = FakeAgent("a"), FakeAgent("b")
    async with open_bridge({"a": a, "b": b}) as (client, _):
        sid_a = await client.new_session("a")
        sid_b = await client.new_session("b")
        assert sid_a == "s1"
        assert sid_b != sid_a
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.prompt, sid_a, "count 50")
            nursery.start_soon(client.prompt, sid_b, "count 50")
        assert client.updates(sid_a) == [f"a:s1:{i}" for i in range(50)]
        assert client.updates(sid_b) == [f"b:s1:{i}" for i in range(50)]
        prompts_b = [m for m in b.received if m.get("method") == "session/prompt"]
        assert prompts_b[0]["params"]["sessionId"] == "s1"


async def test_request_ids_keep_their_type_and_never_meet_across_agents():
    a, b = FakeAgent("a"), FakeAgent("b")
    async with open_bridge({"a": a, "b": b}) as (client, _):
        sid_a = await client.new_session("a")
        sid_b = await client.new_session("b")
        params_a = {"sessionId": sid_a, "prompt": [{"type": "text", "text": "count 1"}]}
        params_b = {"sessionId": sid_b, "prompt": [{"type": "text", "text": "count 1"}]}
        results = {}

        async def run(req_id, params):
            results[req_id] = await client.request("session/prompt", params, id=req_id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "1", params_a)
            nursery.start_soon(run, 1, params_b)
        assert results["1"]["id"] == "1"
        assert results[1]["id"] == 1
        assert type(results[1]["id"]) is int
        # Each agent saw ids minted by the bridge for its own link.
        assert all(type(m["id"]) is int for m in a.received if "method" in m and "id" in m)


async def test_meta_and_unknown_fields_reach_the_agent_untouched():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        result = await client.call(
            "_vendor/ping",
            {"sessionId": sid, "x": [1, {"y": None}], "_meta": {"traceparent": "00-abc"}},
        )
        assert result["params"] == {
            "sessionId": sid,
            "x": [1, {"y": None}],
            "_meta": {"traceparent": "00-abc"},
        }


async def test_permission_request_crosses_both_ways_with_the_outcome_honoured():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.prompt, sid, "permission")
            req = await client.agent_requests.receive()
            assert req["method"] == "session/request_permission"
            assert req["params"]["sessionId"] == sid
            await client.send(
                {
                    "jsonrpc": "2.0",
                    "id": req["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            )
        assert client.updates(sid) == ["a:outcome:yes"]
        answer = [m for m in a.received if "result" in m and "outcome" in m["result"]]
        assert answer[0]["id"] == 100  # the agent's own request id came back


async def test_cancel_settles_pending_permissions_at_once_and_refuses_late_answers():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (client, bridge):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:

            async def prompt():
                response = await client.prompt(sid, "permission")
                assert response["result"]["stopReason"] == "cancelled"

            nursery.start_soon(prompt)
            req = await client.agent_requests.receive()
            await client.notify("session/cancel", {"sessionId": sid})
            resolved = await client.wait_for(
                lambda m: m.get("method") == "_acp_bridge/permission_resolved"
            )
            assert resolved["params"]["requestId"] == req["id"]
            assert resolved["params"]["outcome"] == {"outcome": "cancelled"}
        # A late answer from the client goes nowhere: the agent got exactly one outcome.
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": req["id"],
                "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
            }
        )
        await client.call("session/set_mode", {"sessionId": sid, "modeId": "x"})
        outcomes = [m for m in a.received if "result" in m and "outcome" in m["result"]]
        assert outcomes == [
            {"jsonrpc": "2.0", "id": 100, "result": {"outcome": {"outcome": "cancelled"}}}
        ]
        assert a.cancelled == {"s1"}
        assert client.updates(sid) == ["a:outcome:{'outcome': 'cancelled'}"]
        assert not bridge.hub.sessions.get(sid).pending_permissions


async def test_cancel_is_forwarded_and_ends_the_turn():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:

            async def prompt():
                response = await client.prompt(sid, "wait")
                assert response["result"]["stopReason"] == "cancelled"

            nursery.start_soon(prompt)
            await client.wait_for(lambda m: "waiting" in str(m))
            await client.notify("session/cancel", {"sessionId": sid})


async def _hanging_prompt(client, sid, nursery):
    """A prompt the agent will not end on cancel (``hang``); a receive channel for its answer."""
    send, receive = trio.open_memory_channel(1)

    async def prompt():
        send.send_nowait(await client.prompt(sid, "hang"))

    nursery.start_soon(prompt)
    await client.wait_for(lambda m: "hanging" in str(m))
    return receive


async def test_a_turn_the_agent_does_not_end_after_cancel_is_ended_at_cancel_grace(
    autojump_clock,
):
    a = FakeAgent("a")
    async with (
        open_bridge({"a": a}, cancel_grace=10) as (client, bridge),
        trio.open_nursery() as nursery,
    ):
        sid = await client.new_session()
        answer = await _hanging_prompt(client, sid, nursery)
        start = trio.current_time()
        await client.notify("session/cancel", {"sessionId": sid})
        await trio.sleep(5)
        await client.notify("session/cancel", {"sessionId": sid})  # (does not push it back)
        with trio.fail_after(60):
            response = await answer.receive()
        assert trio.current_time() - start == 10
        assert response["result"] == {
            "stopReason": "cancelled",
            "_meta": {"acp_bridge": {"cancelGraceExpired": 10}},
        }
        [warning] = [m for m in client.received if m.get("method") == "_acp_bridge/log"]
        assert "did not end the cancelled turn within 10s" in warning["params"]["data"]["message"]
        # The agent's own answer, when it comes at last, is dropped: one answer per request.
        a.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert [m for m in client.received if m.get("id") == response["id"]] == [response]
        assert not bridge.hub.agents["a"].pending
        assert (await client.prompt(sid, "count 1"))["result"] == {"stopReason": "end_turn"}
        nursery.cancel_scope.cancel()


async def test_a_turn_the_agent_ends_on_cancel_is_its_own_answer(autojump_clock):
    a = FakeAgent("a")
    async with open_bridge({"a": a}, cancel_grace=10) as (client, bridge):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:

            async def prompt():
                response = await client.prompt(sid, "wait")
                assert response["result"] == {"stopReason": "cancelled"}

            nursery.start_soon(prompt)
            await client.wait_for(lambda m: "waiting" in str(m))
            await client.notify("session/cancel", {"sessionId": sid})
        await trio.sleep(60)
        assert not [m for m in client.received if m.get("method") == "_acp_bridge/log"]
        assert not bridge.hub.deadlines


async def test_cancel_grace_0_waits_for_the_agent_forever(autojump_clock):
    a = FakeAgent("a")
    async with (
        open_bridge({"a": a}, cancel_grace=0) as (client, _),
        trio.open_nursery() as nursery,
    ):
        sid = await client.new_session()
        answer = await _hanging_prompt(client, sid, nursery)
        await client.notify("session/cancel", {"sessionId": sid})
        await trio.sleep(3600)
        with pytest.raises(trio.WouldBlock):
            answer.receive_nowait()
        a.release.set()
        response = await answer.receive()
        assert response["result"] == {"stopReason": "end_turn"}
        nursery.cancel_scope.cancel()


async def test_fs_calls_cross_to_the_client_and_back():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.prompt, sid, "read /w/f.txt")
            req = await client.agent_requests.receive()
            assert req["method"] == "fs/read_text_file"
            assert req["params"] == {"sessionId": sid, "path": "/w/f.txt"}
            await client.send({"jsonrpc": "2.0", "id": req["id"], "result": {"content": "hi"}})
        assert client.updates(sid) == ["a:fs:{'content': 'hi'}"]


async def test_fs_calls_are_refused_when_the_client_did_not_advertise_them():
    a = FakeAgent("a")
    async with open_bridge({"a": a}, initialize=False) as (client, _):
        await client.initialize()  # no fs capability
        sid = await client.new_session()
        await client.prompt(sid, "write /w/f.txt hello")
        [update] = client.updates(sid)
        assert "-32601" in update
        assert a.client_capabilities == {}


async def test_cancel_request_is_translated_to_the_agent_link_id():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
            nursery.start_soon(
                functools.partial(client.request, "session/prompt", params, id="p-1")
            )
            await client.wait_for(lambda m: "waiting" in str(m))
            await client.notify("$/cancel_request", {"requestId": "p-1"})
            await trio.testing.wait_all_tasks_blocked()
            [cancel] = [m for m in a.received if m.get("method") == "$/cancel_request"]
            [prompt] = [m for m in a.received if m.get("method") == "session/prompt"]
            assert cancel["params"]["requestId"] == prompt["id"]
            await client.notify("session/cancel", {"sessionId": sid})


async def test_agent_crash_mid_prompt_fails_the_prompt_and_spares_other_agents():
    a, b = FakeAgent("a"), FakeAgent("b")
    async with open_bridge({"a": a, "b": b}) as (client, bridge):
        sid_a = await client.new_session("a")
        sid_b = await client.new_session("b")
        response = await client.prompt(sid_a, "crash")
        assert response["error"]["code"] == -32603
        assert response["error"]["data"]["agent"] == "a"
        assert response["error"]["data"]["exitStatus"] == 1
        assert client.updates(sid_a) == ["a:s1:about-to-crash"]
        assert bridge.hub.agents["a"].state is AgentState.DEAD
        # Its session has ended; the other agent is untouched.
        ended = await client.prompt(sid_a, "count 1")
        assert "ended" in ended["error"]["message"]
        assert (await client.prompt(sid_b, "count 3"))["result"]["stopReason"] == "end_turn"
        # The next session/new restarts it.
        sid_a2 = await client.new_session("a")
        assert a.starts == 2
        assert (await client.prompt(sid_a2, "count 1"))["result"]["stopReason"] == "end_turn"


async def test_restarts_back_off_and_a_crash_loop_gives_up(autojump_clock):
    a = FakeAgent("a")
    b = FakeAgent("b")
    limits = {"restart_backoff_initial": 1.0, "crash_loop_limit": 3, "crash_loop_window": 60.0}
    async with open_bridge({"b": b, "a": a}, **limits) as (client, _):
        started_at = []
        for _ in range(3):
            sid = await client.new_session("a")
            started_at.append(trio.current_time())
            response = await client.prompt(sid, "crash")
            assert response["error"]["code"] == -32603
        # First start immediate, then 1 s, then 2 s of backoff (exact virtual time).
        assert [round(t - started_at[0], 6) for t in started_at] == [0.0, 1.0, 3.0]
        response = await client.request(
            "session/new", {"cwd": "/w", "mcpServers": [], "_meta": {"acp_bridge": {"agent": "a"}}}
        )
        assert "crashed 3 times" in response["error"]["message"]
        assert a.starts == 3
        # Once the window has passed, it may start again.
        await trio.sleep(61)
        sid = await client.new_session("a")
        assert a.starts == 4


async def test_stalled_agent_never_blocks_other_sessions():
    """An agent that stops reading its stdin: its queue fills, its requests fail fast."""
    stuck = FakeAgent("stuck")
    fine = FakeAgent("fine")
    async with open_bridge({"fine": fine, "stuck": stuck}, agent_queue=4) as (client, _):
        sid_fine = await client.new_session("fine")
        sid_stuck = await client.new_session("stuck")
        assert (await client.prompt(sid_stuck, "stall"))["result"]["stopReason"] == "end_turn"
        errors = []

        async def prompt_stuck():
            response = await client.prompt(sid_stuck, "count 1")
            errors.append(response["error"]["code"])

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(prompt_stuck)
            await trio.testing.wait_all_tasks_blocked()
            # Waiting, at most: the chunk the agent read before it stalled (1), one write
            # batch in the writer's hands (at most a full queue: 4) and the queue (4). The
            # rest failed at once, and the other agent's session is unaffected.
            assert len(errors) >= 12 - (1 + 4 + 4)
            assert set(errors) == {-32603}
            assert (await client.prompt(sid_fine, "count 2"))["result"]["stopReason"] == "end_turn"
            nursery.cancel_scope.cancel()


async def test_a_notification_its_agent_cannot_take_is_reported_to_the_client():
    """A client's notification that finds its agent's queue full cannot be answered: a client
    that asked for logs gets an ``_acp_bridge/log`` warning naming it; one that did not, none."""
    stuck = FakeAgent("stuck")
    async with (
        open_bridge({"stuck": stuck}, agent_queue=1) as (client, bridge),
        trio.open_nursery() as nursery,
    ):
        quiet = await connect(bridge, nursery, log=None, name="quiet")
        quiet_sid = await quiet.new_session()
        sid = await client.new_session()
        assert (await client.prompt(sid, "stall"))["result"]["stopReason"] == "end_turn"
        for n in range(12):  # more than the agent, its writer and its queue take
            await client.notify("_x/ping", {"sessionId": sid, "n": n})
            await quiet.notify("_x/ping", {"sessionId": quiet_sid, "n": n})
        await trio.testing.wait_all_tasks_blocked()
        warnings = [m["params"] for m in client.received if m.get("method") == "_acp_bridge/log"]
        assert warnings, client.received
        assert all(
            w
            == {
                "level": "warning",
                "logger": "acp_bridge",
                "sessionId": sid,
                "data": {
                    "message": "_x/ping not delivered: agent 'stuck' has a full queue",
                    "agent": "stuck",
                },
            }
            for w in warnings
        ), warnings
        assert not [m for m in quiet.received if m.get("method") == "_acp_bridge/log"]
        nursery.cancel_scope.cancel()


async def test_updates_sent_before_the_session_new_response_arrive_before_it():
    a = FakeAgent("a", early_update=True)
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        kinds = [
            "update" if m.get("method") == "session/update" else "response"
            for m in client.received
            if m.get("method") == "session/update" or "sessionId" in str(m.get("result"))
        ]
        assert kinds == ["update", "response"]
        assert client.updates(sid) == ["a:s1:early"]


async def test_session_list_merges_agents_behind_one_opaque_cursor():
    a = FakeAgent("a", list_pages=2)
    b = FakeAgent("b", list_pages=1)
    async with open_bridge({"a": a, "b": b}) as (client, _):
        await client.new_session("b")  # b is started on demand
        seen = []
        cursor = None
        for _ in range(10):
            params = {} if cursor is None else {"cursor": cursor}
            page = await client.call("session/list", params)
            seen += [s["sessionId"] for s in page["sessions"]]
            cursor = page.get("nextCursor")
            if cursor is None:
                break
        assert seen == ["sp0", "sp1", "sp0~b"]
        response = await client.request("session/list", {"cursor": "garbage!"})
        assert response["error"]["code"] == -32602


async def test_listed_session_of_a_second_agent_loads_from_that_agent_with_replay_first():
    """A session the bridge only knows from session/list is loaded by its own agent."""
    a = FakeAgent("a")
    b = FakeAgent("b", prefix="b")
    b.sessions.append("old1")
    async with open_bridge({"a": a, "b": b}) as (client, _):
        await client.new_session("b")  # starts b
        listed = await client.call("session/list", {})
        assert "old1" in [s["sessionId"] for s in listed["sessions"]]
        response = await client.request(
            "session/load", {"sessionId": "old1", "cwd": "/w", "mcpServers": []}
        )
        assert "result" in response
        assert [m for m in b.received if m.get("method") == "session/load"]
        # The replayed update came before the response.
        index = client.received.index(response)
        assert client.received[index - 1]["params"]["update"]["content"]["text"] == "b:old1:replay"


async def test_methods_the_agent_did_not_advertise_are_refused_with_method_not_found():
    a = FakeAgent("a", capabilities={})
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        response = await client.request(
            "session/fork", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
        )
        assert response["error"]["code"] == -32601
        response = await client.request(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "image", "data": "", "mimeType": "image/png"}]},
        )
        assert response["error"]["code"] == -32602


async def test_additional_directories_and_http_mcp_are_stripped_for_agents_without_them():
    a = FakeAgent("a", capabilities={})
    async with open_bridge({"a": a}) as (client, _):
        await client.new_session(
            additionalDirectories=["/x"],
            mcpServers=[{"type": "http", "name": "h", "url": "http://127.0.0.1:1", "headers": []}],
        )
        [new] = [m for m in a.received if m.get("method") == "session/new"]
        assert "additionalDirectories" not in new["params"]
        # The client's http server is stripped; the bridge's own is offered over stdio.
        [ours] = new["params"]["mcpServers"]
        assert ours["name"] == "acp-bridge"
        assert "type" not in ours
        assert ours["args"][-3:-1] == ["mcp", "--url"]


async def test_unknown_session_is_resource_not_found():
    async with open_bridge({"a": FakeAgent("a")}) as (client, _):
        response = await client.prompt("nope", "hi")
        assert response["error"]["code"] == -32002


async def test_agents_request_lists_states_and_capabilities():
    async with open_bridge({"a": FakeAgent("a"), "b": FakeAgent("b")}) as (client, _):
        result = await client.call("_acp_bridge/agents", {})
        assert result["default"] == "a"
        states = {agent["name"]: agent["state"] for agent in result["agents"]}
        assert states == {"a": "ready", "b": "stopped"}


async def test_daemon_capabilities_for_agents_are_still_gated_per_client():
    """Agents may be told fs is there (a daemon serves many clients); a client without it
    still never gets the call: the agent gets -32601."""
    a = FakeAgent("a")
    fixed = {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True}
    async with open_bridge({"a": a}, initialize=False, agent_client_capabilities=fixed) as (
        client,
        _,
    ):
        await client.initialize()  # this client has no fs
        assert a.client_capabilities == fixed
        sid = await client.new_session()
        await client.prompt(sid, "read /w/x")
        [update] = client.updates(sid)
        assert "-32601" in update
        assert not client.agent_requests.statistics().current_buffer_used


@settings(max_examples=30, deadline=None)
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),  # the session's agent (all mint s1, s2, ...)
            st.one_of(st.integers(1, 4), st.just("permission")),  # what its prompt does
            st.booleans(),  # the prompt's request id as a number (True) or a string
        ),
        min_size=1,
        max_size=8,
    )
)
async def test_property_colliding_ids_never_misroute(plan):
    """Concurrent prompts on sessions whose agent ids collide, request ids 1 and "1" side by
    side, agents' own request ids all equal: every response keeps its id and type, every
    session gets exactly its own updates in order, every permission answer reaches the agent
    that asked."""
    agents = {name: FakeAgent(name) for name in ("a", "b", "c")}
    async with open_bridge(agents) as (client, _):
        sids = [await client.new_session(agent) for agent, _, _ in plan]
        assert len(set(sids)) == len(sids)
        responses = {}

        async def run(index, action, numeric):
            text = "permission" if action == "permission" else f"count {action}"
            params = {"sessionId": sids[index], "prompt": [{"type": "text", "text": text}]}
            req_id = index if numeric else str(index)
            responses[index] = await client.request("session/prompt", params, id=req_id)

        async def answer_permissions():
            async for req in client.agent_requests:
                index = sids.index(req["params"]["sessionId"])
                choice = "yes" if index % 2 == 0 else "no"
                await client.send(
                    {
                        "jsonrpc": "2.0",
                        "id": req["id"],
                        "result": {"outcome": {"outcome": "selected", "optionId": choice}},
                    }
                )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_permissions)
            async with trio.open_nursery() as prompts:
                for index, (_, action, numeric) in enumerate(plan):
                    prompts.start_soon(run, index, action, numeric)
            nursery.cancel_scope.cancel()
        for index, (agent, action, numeric) in enumerate(plan):
            response = responses[index]
            assert response["id"] == (index if numeric else str(index))
            assert type(response["id"]) is (int if numeric else str)
            assert response["result"]["stopReason"] == "end_turn"
            agent_sid = _agent_sid(agents[agent], index, sids, plan)
            if action == "permission":
                expected = [f"{agent}:outcome:{'yes' if index % 2 == 0 else 'no'}"]
            else:
                expected = [f"{agent}:{agent_sid}:{i}" for i in range(action)]
            assert client.updates(sids[index]) == expected


def _agent_sid(agent, index, sids, plan):
    """The id the agent itself gave session ``index`` (its n-th session: s<n>)."""
    nth = sum(1 for other, _, _ in plan[: index + 1] if other == agent.name)
    return f"s{nth}"


async def test_elicitation_complete_goes_only_to_the_connection_shown_the_elicitation():
    a = FakeAgent("a")
    caps = {"elicitation": {"url": {}}}
    async with open_bridge({"a": a}, initialize=False) as (client, bridge):
        await client.initialize(**caps)
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            other = await connect(bridge, nursery)
            nursery.start_soon(
                a.call,
                "elicitation/create",
                {
                    "sessionId": "s1",
                    "mode": "url",
                    "elicitationId": "e1",
                    "url": "https://example.invalid/x",
                    "message": "sign in",
                },
            )
            shown = await client.agent_requests.receive()
            assert shown["params"]["sessionId"] == sid
            await a.write(
                {
                    "jsonrpc": "2.0",
                    "method": "elicitation/complete",
                    "params": {"elicitationId": "e1"},
                }
            )
            done = await client.wait_for(lambda m: m.get("method") == "elicitation/complete")
            assert done["params"] == {"elicitationId": "e1"}
            assert not [m for m in other.received if m.get("method") == "elicitation/complete"]
            nursery.cancel_scope.cancel()


#: sessionCapabilities of the v1 unstable session methods (SDK 2.4.0 schema)
UNSTABLE_SESSION_CAPS = {"title": {}, "status": {}, "archive": {}}
UNSTABLE_SESSION_METHODS = (
    ("session/set_title", {"title": "t"}),
    ("session/status", {}),
    ("session/archive", {}),
    ("session/unarchive", {}),
)


async def test_session_methods_the_bridge_does_not_handle_reach_the_sessions_agent():
    """v1 unstable session methods, other methods and extensions on a known session: routed
    to its agent (its own id there), answered under the client's own id."""
    caps = {"sessionCapabilities": UNSTABLE_SESSION_CAPS}
    answers = frozenset(m for m, _ in UNSTABLE_SESSION_METHODS)
    a = FakeAgent("a", capabilities=caps)
    b = FakeAgent("b", capabilities=caps, serves=answers)  # also mints "s1"
    async with open_bridge({"a": a, "b": b}) as (client, _):
        await client.new_session()
        sid = await client.new_session("b")
        assert sid != "s1"  # rewritten: the bridge must map it back
        for n, (method, extra) in enumerate(UNSTABLE_SESSION_METHODS):
            response = await client.request(method, {"sessionId": sid, **extra}, id=f"c-{n}")
            assert response["id"] == f"c-{n}"
            assert response["result"]["agent"] == "b"
            assert response["result"]["params"] == {"sessionId": "s1", **extra}
        ext = await client.request("_foo/bar", {"sessionId": sid, "x": 1}, id=7)
        assert ext == {
            "jsonrpc": "2.0",
            "id": 7,
            "result": {"method": "_foo/bar", "params": {"sessionId": "s1", "x": 1}},
        }
        # A method neither the bridge nor the agent knows: the agent's own -32601.
        unknown = await client.request("foo/bar", {"sessionId": sid}, id="u")
        assert unknown["id"] == "u"
        assert unknown["error"] == {"code": -32601, "message": "no"}
        assert [m["method"] for m in b.received if m.get("method") == "foo/bar"] == ["foo/bar"]
        assert not [m for m in a.received if m.get("method") in ("foo/bar", "_foo/bar")]
        # An unknown session: -32002 for the session methods, -32601 for the rest.
        lost = await client.request("session/set_title", {"sessionId": "zz", "title": "t"})
        assert lost["error"]["code"] == -32002
        nowhere = await client.request("foo/bar", {"sessionId": "zz"})
        assert nowhere["error"]["code"] == -32601


async def test_unstable_session_methods_are_gated_on_the_agents_capabilities():
    """Advertised but not implemented: the agent's -32601; not advertised: the bridge's."""
    answers = frozenset(m for m, _ in UNSTABLE_SESSION_METHODS)
    a = FakeAgent("a", capabilities={"sessionCapabilities": {"title": {}}})
    b = FakeAgent("b", capabilities={}, serves=answers)
    async with open_bridge({"a": a, "b": b}) as (client, _):
        sid_a = await client.new_session()
        sid_b = await client.new_session("b")
        own = await client.request("session/set_title", {"sessionId": sid_a, "title": "t"})
        assert own["error"] == {"code": -32601, "message": "no"}  # the agent's answer
        for method, extra in UNSTABLE_SESSION_METHODS:
            gated = await client.request(method, {"sessionId": sid_b, **extra})
            assert gated["error"]["code"] == -32601
            assert "does not support" in gated["error"]["message"]
        assert not [m for m in b.received if m.get("method") in answers]


async def test_session_status_looks_without_taking_the_session():
    caps = {"sessionCapabilities": UNSTABLE_SESSION_CAPS}
    a = FakeAgent("a", capabilities=caps, serves=frozenset({"session/status"}))
    async with open_bridge({"a": a}) as (client, bridge), trio.open_nursery() as nursery:
        sid = await client.new_session()
        other = await connect(bridge, nursery, name="other")
        # Only the owner acts on a session (issue 17 point 8): looking included.
        for method in ("session/status", "session/archive"):
            refused = await other.request(method, {"sessionId": sid})
            assert refused["error"]["code"] == -32002, method
        assert bridge.hub.sessions.get(sid).client.name == "stdio"
        # Detached, a look does not take the session.
        await bridge.close_client(bridge.hub.sessions.get(sid).client, "gone")
        status = await other.request("session/status", {"sessionId": sid})
        assert status["result"]["method"] == "session/status"
        assert bridge.hub.sessions.get(sid).client is None
        nursery.cancel_scope.cancel()


async def test_an_archived_session_is_no_longer_live_but_stays_routable():
    caps = {"loadSession": True, "sessionCapabilities": UNSTABLE_SESSION_CAPS}
    answers = frozenset({"session/archive", "session/unarchive"})
    a = FakeAgent("a", capabilities=caps, serves=answers)
    async with open_bridge({"a": a}) as (client, bridge):
        sid = await client.new_session()
        await client.call("session/archive", {"sessionId": sid})
        session = bridge.hub.sessions.get(sid)
        assert session.state.value == "listed"
        assert session.client is None
        unarchived = await client.call("session/unarchive", {"sessionId": sid})
        assert unarchived["params"] == {"sessionId": "s1"}
        # A load goes to the agent again (the bridge does not replay it as live).
        await client.call("session/load", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
        assert [m["method"] for m in a.received if m.get("method") == "session/load"] == [
            "session/load"
        ]


async def test_connection_scoped_methods_go_to_the_default_or_the_named_agent():
    both = frozenset({"logout", "auth/status", "providers/list"})
    caps = {"auth": {"logout": {}, "status": {}}, "providers": {}}
    a = FakeAgent("a", capabilities=caps, serves=both)
    b = FakeAgent("b", capabilities=caps, serves=both)
    c = FakeAgent("c", capabilities={}, serves=both)
    async with open_bridge({"a": a, "b": b, "c": c}) as (client, bridge):
        assert (await client.call("logout", {}))["agent"] == "a"
        assert bridge.hub.agents["b"].state is AgentState.STOPPED
        named = {"_meta": {"acp_bridge": {"agent": "b"}}}
        for method in ("logout", "auth/status", "providers/list"):
            response = await client.request(method, named, id=f"{method}-1")
            assert response["id"] == f"{method}-1"
            assert response["result"]["agent"] == "b"  # started for it
        gated = await client.request("logout", {"_meta": {"acp_bridge": {"agent": "c"}}})
        assert gated["error"]["code"] == -32601
        assert not [m for m in c.received if m.get("method") == "logout"]
        unknown = await client.request("logout", {"_meta": {"acp_bridge": {"agent": "zz"}}})
        assert unknown["error"]["code"] == -32602
