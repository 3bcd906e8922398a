"""Sessions outlive connections: detach, reattach with load or resume, takeover, grace."""

from __future__ import annotations

import functools
import gc
import json
import weakref

import trio
import trio.testing

from acp_bridge.protocol.jsonrpc import dumps
from acp_bridge.sessions.tree import Child
from tests.support.fakes import FakeAgent, chunk_update, connect, open_bridge


def texts(client, sid):
    """Every update of a session as the client saw it: ("user"|"agent", text), in order."""
    out = []
    for m in client.received:
        if m.get("method") == "session/update" and m["params"]["sessionId"] == sid:
            update = m["params"]["update"]
            who = "user" if update["sessionUpdate"] == "user_message_chunk" else "agent"
            out.append((who, update["content"]["text"]))
    return out


async def test_bridge_serves_load_of_a_live_session_from_its_history_then_answers():
    a = FakeAgent("a", capabilities={})  # no loadSession: the bridge serves it anyway
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        await client.prompt(sid, "count 3")
        before = len(client.received)
        response = await client.request(
            "session/load", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
        )
        replay = client.received[before : client.received.index(response)]
        assert [m["params"]["update"]["content"]["text"] for m in replay] == [
            "count 3",
            "a:s1:0",
            "a:s1:1",
            "a:s1:2",
        ]
        assert response["result"]["_meta"]["acp_bridge"] == {
            "lastSeq": 4,
            "complete": True,
            "pending": [],
        }
        assert not [m for m in a.received if m.get("method") == "session/load"]


async def test_disconnect_mid_turn_then_load_gives_every_update_once_in_order():
    """The load replays all, the open prompt's answer reaches the new connection."""
    a = FakeAgent("a")
    async with open_bridge({"a": a}, initialize=False) as (first, bridge):
        await first.initialize(seq=True)
        sid = await first.new_session()
        await first.prompt(sid, "count 2")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                first.request,
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]},
            )
            await first.wait_for(lambda m: "waiting" in str(m))
            seen_by_first = first.seqs(sid)
            await first.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            assert bridge.hub.sessions.get(sid).client is None
            # The agent goes on while nobody is attached.
            await a.update("s1", "while-detached")
            second = await connect(bridge, nursery, seq=True)
            await second.request(
                "session/load",
                {
                    "sessionId": sid,
                    "cwd": "/w",
                    "mcpServers": [],
                    "_meta": {"acp_bridge": {"after_seq": seen_by_first[-1]}},
                },
            )
            await a.update("s1", "live-after")
            await second.notify("session/cancel", {"sessionId": sid})
            # The prompt the first connection sent is answered on the second (same id).
            answer = await second.wait_for(lambda m: m.get("result", {}).get("stopReason"))
            assert answer["result"]["stopReason"] == "cancelled"
            # Strictly increasing: nothing twice. (Numbers the live stream skips belong to
            # the user's prompts, which only a load replays.)
            all_seqs = seen_by_first + second.seqs(sid)
            assert all_seqs == sorted(set(all_seqs))
            assert texts(first, sid) + texts(second, sid) == [
                ("agent", "a:s1:0"),
                ("agent", "a:s1:1"),
                ("agent", "a:s1:waiting"),
                ("agent", "while-detached"),
                ("agent", "live-after"),
            ]
            nursery.cancel_scope.cancel()


async def test_resume_gives_no_replay_and_live_updates_continue():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (first, bridge):
        sid = await first.new_session()
        await first.prompt(sid, "count 2")
        await first.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as nursery:
            second = await connect(bridge, nursery)
            result = await second.call(
                "session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
            )
            assert "sessionId" not in result
            assert texts(second, sid) == []
            await second.prompt(sid, "count 1")
            assert second.updates(sid) == ["a:s1:0"]
            assert not [m for m in a.received if m.get("method") == "session/resume"]
            nursery.cancel_scope.cancel()


async def test_a_detached_session_is_closed_when_the_grace_period_ends(autojump_clock):
    a = FakeAgent("a")
    async with open_bridge({"a": a}, detach_grace=30.0) as (first, bridge):
        sid = await first.new_session()
        await first.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        assert bridge.hub.sessions.get(sid) is not None
        await trio.sleep(29.9)
        assert bridge.hub.sessions.get(sid) is not None
        await trio.sleep(0.2)
        await trio.testing.wait_all_tasks_blocked()
        assert bridge.hub.sessions.get(sid) is None
        closes = [m for m in a.received if m.get("method") == "session/close"]
        assert closes[0]["params"] == {"sessionId": "s1"}
        async with trio.open_nursery() as nursery:
            second = await connect(bridge, nursery)
            response = await second.request(
                "session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
            )
            # Gone from the bridge: resume goes to the agent, which closed it.
            assert response["error"]["code"] == -32002
            nursery.cancel_scope.cancel()


async def test_reattaching_within_grace_keeps_the_session(autojump_clock):
    a = FakeAgent("a")
    async with open_bridge({"a": a}, detach_grace=30.0) as (first, bridge):
        sid = await first.new_session()
        await first.disconnect()
        await trio.sleep(20)
        async with trio.open_nursery() as nursery:
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            await trio.sleep(100)
            assert bridge.hub.sessions.get(sid).client is not None
            assert not [m for m in a.received if m.get("method") == "session/close"]
            nursery.cancel_scope.cancel()


async def test_a_closed_session_is_freed_at_once_after_a_reattach(autojump_clock):
    # The reattach cancels the grace period's timer; a cancelled timer used to keep its
    # session (and the session's whole history) alive until its time would have come
    # (detach_grace: 300 s by default), so every reconnect held closed sessions' histories.
    a = FakeAgent("a")
    async with open_bridge({"a": a}, detach_grace=300.0) as (first, bridge):
        sid = await first.new_session()
        await first.prompt(sid, "count 5")
        await first.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as nursery:
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            session = weakref.ref(bridge.hub.sessions.get(sid))
            assert session() is not None
            await second.call("session/close", {"sessionId": sid})
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            assert session() is None
            nursery.cancel_scope.cancel()


async def test_a_close_answered_after_its_connection_dropped_does_not_close_again(autojump_clock):
    # The owner asks for session/close and drops before the answer: the session is detached
    # (a grace period starts), then the answer closes it. The grace period must end with it,
    # not hold the closed session until it "expires" and closes it a second time.
    a = FakeAgent("a")
    a.close_gate = trio.Event()
    async with open_bridge({"a": a}, detach_grace=30.0) as (first, bridge):
        sid = await first.new_session()
        await first.send(
            {"jsonrpc": "2.0", "id": 99, "method": "session/close", "params": {"sessionId": sid}}
        )
        await trio.testing.wait_all_tasks_blocked()
        await first.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        assert bridge.hub.sessions.get(sid).detach_deadline is not None
        a.close_gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert bridge.hub.sessions.get(sid) is None
        assert len(bridge.hub.deadlines) == 0  # no timer left holding the closed session
        await trio.sleep(60)
        await trio.testing.wait_all_tasks_blocked()
        assert len([m for m in a.received if m.get("method") == "session/close"]) == 1


async def test_second_connection_takes_a_live_session_over():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (first, bridge):
        sid = await first.new_session()
        async with trio.open_nursery() as nursery:
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            told = await first.wait_for(lambda m: m.get("method") == "_acp_bridge/log")
            assert told["params"]["sessionId"] == sid
            assert "taken over" in told["params"]["data"]["message"]
            refused = await first.prompt(sid, "count 1")
            assert "another connection" in refused["error"]["message"]
            await second.prompt(sid, "count 2")
            assert second.updates(sid) == ["a:s1:0", "a:s1:1"]
            assert first.updates(sid) == []
            nursery.cancel_scope.cancel()


async def test_pending_permission_is_shown_again_to_the_connection_that_reattaches():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (first, bridge):
        sid = await first.new_session()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.prompt, sid, "permission")
            await first.agent_requests.receive()
            await first.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            shown = await second.agent_requests.receive()
            assert shown["method"] == "session/request_permission"
            assert shown["params"]["sessionId"] == sid
            await second.send(
                {
                    "jsonrpc": "2.0",
                    "id": shown["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            )
            await second.wait_for(lambda m: "a:outcome:yes" in str(m))
            nursery.cancel_scope.cancel()


async def test_pending_permission_is_denied_when_nobody_comes_back(autojump_clock):
    a = FakeAgent("a")
    async with open_bridge({"a": a}, detach_grace=10.0) as (first, _):
        sid = await first.new_session()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.prompt, sid, "permission")
            await first.agent_requests.receive()
            await first.disconnect()
            nursery.cancel_scope.cancel()
        await trio.sleep(11)
        outcomes = [
            m["result"]["outcome"] for m in a.received if "result" in m and "outcome" in m["result"]
        ]
        # Denied with the agent's own reject option; never allowed.
        assert outcomes == [{"outcome": "selected", "optionId": "no"}]


async def test_close_of_an_agent_without_close_cancels_and_forgets_the_session():
    a = FakeAgent("a", capabilities={})
    async with open_bridge({"a": a}) as (client, bridge):
        sid = await client.new_session()
        assert await client.call("session/close", {"sessionId": sid}) == {}
        assert bridge.hub.sessions.get(sid) is None
        assert a.cancelled == {"s1"}
        response = await client.prompt(sid, "count 1")
        assert response["error"]["code"] == -32002


async def test_bridge_advertises_load_resume_and_close_for_every_agent():
    async with open_bridge({"a": FakeAgent("a", capabilities={})}, initialize=False) as (c, _):
        result = await c.call("initialize", {"protocolVersion": 1})
        caps = result["agentCapabilities"]
        assert caps["loadSession"] is True
        assert caps["sessionCapabilities"]["resume"] == {}
        assert caps["sessionCapabilities"]["close"] == {}


async def test_history_trimmed_load_says_resync_required():
    a = FakeAgent("a")
    async with open_bridge({"a": a}, history_limit=3) as (client, _):
        sid = await client.new_session()
        await client.prompt(sid, "count 5")
        response = await client.request(
            "session/load",
            {
                "sessionId": sid,
                "cwd": "/w",
                "mcpServers": [],
                "_meta": {"acp_bridge": {"after_seq": 1}},
            },
        )
        assert response["result"]["_meta"]["acp_bridge"]["complete"] is False
        warning = await client.wait_for(lambda m: m.get("method") == "_acp_bridge/log")
        assert "resync required" in warning["params"]["data"]["message"]


async def test_an_answer_that_comes_while_detached_is_delivered_on_reattach():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (first, bridge):
        sid = await first.new_session()
        async with trio.open_nursery() as nursery:
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
            nursery.start_soon(functools.partial(first.request, "session/prompt", params, id=7))
            await first.wait_for(lambda m: "waiting" in str(m))
            await first.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            a._cancel_events["s1"].set()  # the turn ends while nobody is attached
            await trio.testing.wait_all_tasks_blocked()
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            answer = await second.wait_for(lambda m: m.get("id") == 7)
            assert answer["result"]["stopReason"] == "cancelled"
            nursery.cancel_scope.cancel()


async def test_takeover_moves_running_requests_and_the_first_gets_cancelled():
    """Exactly one answer each: the old connection is told -32800, the new one gets the turn."""
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (first, bridge):
        sid = await first.new_session()
        async with trio.open_nursery() as nursery:
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
            nursery.start_soon(functools.partial(first.request, "session/prompt", params, id=7))
            await first.wait_for(lambda m: "waiting" in str(m))
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            told = await first.wait_for(lambda m: m.get("id") == 7)
            assert told["error"]["code"] == -32800
            await second.notify("session/cancel", {"sessionId": sid})
            answer = await second.wait_for(lambda m: m.get("id") == 7)
            assert answer["result"]["stopReason"] == "cancelled"
            assert len([m for m in first.received if m.get("id") == 7]) == 1
            nursery.cancel_scope.cancel()


async def test_reattach_says_which_requests_it_still_owes_and_resume_gives_last_seq():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (first, bridge):
        sid = await first.new_session()
        await first.prompt(sid, "count 2")
        async with trio.open_nursery() as nursery:
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
            nursery.start_soon(functools.partial(first.request, "session/prompt", params, id=9))
            await first.wait_for(lambda m: "waiting" in str(m))
            await first.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            second = await connect(bridge, nursery)
            result = await second.call(
                "session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
            )
            ours = result["_meta"]["acp_bridge"]
            assert ours["pending"] == [9]
            assert ours["lastSeq"] == 5  # count 2 (prompt + 2 updates), wait (prompt + 1)
            nursery.cancel_scope.cancel()


async def test_catch_up_replay_leaves_out_the_clients_own_prompts():
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (client, _):
        sid = await client.new_session()
        await client.prompt(sid, "count 2")
        before = len(client.received)
        full = await client.request(
            "session/load", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
        )
        replay = client.received[before : client.received.index(full)]
        assert [m["params"]["update"]["sessionUpdate"] for m in replay] == [
            "user_message_chunk",
            "agent_message_chunk",
            "agent_message_chunk",
        ]
        before = len(client.received)
        caught_up = await client.request(
            "session/load",
            {
                "sessionId": sid,
                "cwd": "/w",
                "mcpServers": [],
                "_meta": {"acp_bridge": {"after_seq": 0}},
            },
        )
        replay = client.received[before : client.received.index(caught_up)]
        assert [m["params"]["update"]["sessionUpdate"] for m in replay] == [
            "agent_message_chunk",
            "agent_message_chunk",
        ]


async def test_answers_to_requests_of_a_dead_connection_never_settle_new_ones():
    """Bridge-wide request ids: a stale answer for request N on a new connection matches
    nothing there."""
    a = FakeAgent("a")
    async with open_bridge({"a": a}) as (first, bridge):
        sid = await first.new_session()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.prompt, sid, "permission")
            old = await first.agent_requests.receive()
            await first.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            shown = await second.agent_requests.receive()
            assert shown["id"] != old["id"]
            nursery.cancel_scope.cancel()


async def test_a_session_whose_creator_left_before_the_answer_expires(autojump_clock):
    a = FakeAgent("a", new_delay=5)
    async with open_bridge({"a": a}, detach_grace=10.0) as (client, bridge):
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "session/new",
                "params": {"cwd": "/w", "mcpServers": []},
            }
        )
        await trio.testing.wait_all_tasks_blocked()
        await client.disconnect()
        await trio.sleep(6)  # the answer comes at t=5, to nobody
        assert bridge.hub.sessions.get("s1") is not None
        assert bridge.hub.sessions.get("s1").client is None
        await trio.sleep(10)
        assert bridge.hub.sessions.get("s1") is None
        assert [m for m in a.received if m.get("method") == "session/close"]


async def test_an_answer_for_a_link_closed_by_overflow_is_held_for_whoever_takes_the_session(
    autojump_clock,
):
    """Regression: a non-blocking link closed because its queue stayed full still owns its
    sessions until the transport lets go of it; an agent's answer arriving in between was
    sent to the closed link and lost. Now it is held and given to the next connection."""
    a = FakeAgent("a")
    async with open_bridge({"a": a}, client_queue=4) as (client, bridge):
        # A connection nobody reads from: its writer never runs, so its queue stays full.
        stuck = bridge.open_client("stuck", blocking=False)

        async def say(id_: int, method: str, params: dict) -> None:
            line = json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
            await bridge.handle_client_line(stuck, line.encode())

        await say(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        await say(2, "session/new", {"cwd": "/w", "mcpServers": []})
        await trio.testing.wait_all_tasks_blocked()
        [session] = [s for s in bridge.hub.sessions if s.client is stuck]
        await say(3, "session/prompt", {"sessionId": session.bridge_id, "prompt": [
            {"type": "text", "text": "count 20"}
        ]})  # fmt: skip
        with trio.fail_after(30):
            await stuck.closed_event.wait()
            assert "queue full" in (stuck.close_reason or "")
            # The agent goes on: the rest of its updates and then its answer come while
            # the closed link still owns the session.
            await trio.testing.wait_all_tasks_blocked()
        assert session.client is stuck
        await bridge.close_client(stuck, "connection lost")
        assert session.client is None
        result = await client.call(
            "session/resume", {"sessionId": session.bridge_id, "cwd": "/w", "mcpServers": []}
        )
        assert result["_meta"]["acp_bridge"]["pending"] == [3]
        answer = await client.wait_for(lambda m: m.get("id") == 3)
        assert answer["result"]["stopReason"] == "end_turn"


async def test_an_agent_that_reuses_a_live_session_id_never_merges_two_clients_sessions():
    """An agent answering every session/new with ``"dup"``: the second client's new session
    is refused with a clear error. The first keeps its session: still its owner, its roots
    and ``unattended`` untouched, its permission requests shown to it alone. (The second
    session used to land on the first: ownership moved silently, the roots and the
    unattended flag were overwritten, and the second client was shown the first's requests.)"""
    a = FakeAgent("a", session_id="dup")
    with trio.fail_after(10):
        async with open_bridge({"a": a}) as (alice, bridge):
            assert await alice.new_session() == "dup"
            async with trio.open_nursery() as nursery:
                bob = await connect(bridge, nursery, name="bob")
                refused = await bob.request(
                    "session/new",
                    {
                        "cwd": "/elsewhere",
                        "mcpServers": [],
                        "_meta": {"acp_bridge": {"unattended": True}},
                    },
                )
                assert refused["error"]["code"] == -32603
                assert "already open" in refused["error"]["message"]
                assert "'dup'" in refused["error"]["message"]
                assert len(bridge.hub.sessions) == 1
                session = bridge.hub.sessions.get("dup")
                assert session.client is not None
                assert session.client.name == "stdio"  # alice
                assert session.roots == ("/w",)
                assert session.unattended is False
                # The agent's permission request goes to alice, the session's owner, only.
                nursery.start_soon(alice.prompt, "dup", "permission")
                shown = await alice.agent_requests.receive()
                assert shown["method"] == "session/request_permission"
                await alice.send(
                    {
                        "jsonrpc": "2.0",
                        "id": shown["id"],
                        "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                    }
                )
                await alice.wait_for(lambda m: "a:outcome:yes" in str(m))
                assert not [m for m in bob.received if m.get("method")]
                told = await bob.prompt("dup", "count 1")
                assert "another connection" in told["error"]["message"]
                nursery.cancel_scope.cancel()


async def test_a_read_of_updates_larger_than_the_clients_queue_arrives_whole_and_in_order():
    """One read of 300 plain updates, relayed as runs, to a client whose queue holds 4: as
    much of a run as fits goes at once, the next line waits for room, and so on. Every
    update arrives once, in order, interleaved rightly with another session's (a run of
    one session never overtakes the other's lines), and the queue never holds more than 4."""
    a = FakeAgent("a")
    with trio.fail_after(20):
        async with open_bridge({"a": a}, client_queue=4) as (client, bridge):
            s1 = await client.new_session()
            s2 = await client.new_session()
            [link] = {s.client for s in bridge.hub.sessions}
            deepest = [0]
            order = [(s1 if i % 50 < 40 else s2, f"u{i}") for i in range(300)]
            chunk = b"".join(dumps(chunk_update(sid, text)) for sid, text in order)
            async with trio.open_nursery() as nursery:

                async def watch_depth() -> None:
                    while True:
                        deepest[0] = max(deepest[0], link.queue_depth())
                        await trio.lowlevel.checkpoint()

                nursery.start_soon(watch_depth)
                assert a._send is not None
                await a._send.send_all(chunk)
                while len(client.updates(s1)) + len(client.updates(s2)) < 300:
                    await trio.lowlevel.checkpoint()
                nursery.cancel_scope.cancel()
            assert client.updates(s1) == [t for sid, t in order if sid == s1]
            assert client.updates(s2) == [t for sid, t in order if sid == s2]
            received = [
                m["params"]["update"]["content"]["text"]
                for m in client.received
                if m.get("method") == "session/update"
            ]
            assert received[-300:] == [t for _, t in order]
            assert deepest[0] <= 4


def watch(sid, **ours):
    """session/resume (or load) params that watch ``sid``."""
    return {
        "sessionId": sid,
        "cwd": "/w",
        "mcpServers": [],
        "_meta": {"acp_bridge": {"watch": True, **ours}},
    }


def closed(agent):
    return [m["params"]["sessionId"] for m in agent.received if m.get("method") == "session/close"]


async def test_a_watched_session_outlives_its_owner_and_closes_grace_after_the_last_watcher(
    autojump_clock,
):
    a = FakeAgent("a")
    with trio.fail_after(60):
        async with open_bridge({"a": a}, detach_grace=10.0) as (owner, bridge):
            sid = await owner.new_session()
            async with trio.open_nursery() as nursery:
                watcher = await connect(bridge, nursery, name="watcher")
                await watcher.call("session/resume", watch(sid))
                await owner.disconnect()
                await trio.sleep(25)  # two grace periods: the watcher keeps it open
                session = bridge.hub.sessions.get(sid)
                assert session is not None
                assert session.client is None
                assert closed(a) == []
                await a.update("s1", "still here")
                await watcher.wait_for(lambda m: "still here" in str(m))
                # The last watcher goes: a whole grace from now (not the deadline's next round).
                await watcher.disconnect()
                await trio.sleep(9)
                assert bridge.hub.sessions.get(sid) is session
                await trio.sleep(2)
                await trio.testing.wait_all_tasks_blocked()
                assert bridge.hub.sessions.get(sid) is None
                assert closed(a) == ["s1"]
                nursery.cancel_scope.cancel()


async def test_without_a_grace_a_watched_session_closes_when_its_last_watcher_goes():
    a = FakeAgent("a")
    with trio.fail_after(60):
        async with open_bridge({"a": a}, detach_grace=0.0) as (owner, bridge):
            sid = await owner.new_session()
            async with trio.open_nursery() as nursery:
                watcher = await connect(bridge, nursery, name="watcher")
                await watcher.call("session/resume", watch(sid))
                await owner.disconnect()
                await trio.testing.wait_all_tasks_blocked()
                assert bridge.hub.sessions.get(sid) is not None
                await watcher.disconnect()
                await trio.testing.wait_all_tasks_blocked()
                assert bridge.hub.sessions.get(sid) is None
                assert closed(a) == ["s1"]
                nursery.cancel_scope.cancel()


async def test_at_the_grace_deadline_a_watched_sessions_requests_are_settled_as_unattended(
    autojump_clock,
):
    """A permission its gone owner was shown is denied at the deadline, the session staying
    open; one a watcher that approves is shown still waits for it."""
    a = FakeAgent("a")
    with trio.fail_after(60):
        async with open_bridge({"a": a}, detach_grace=10.0) as (owner, bridge):
            plain_sid = await owner.new_session()
            approved_sid = await owner.new_session()
            async with trio.open_nursery() as nursery:
                plain = await connect(bridge, nursery, name="plain")
                await plain.call("session/resume", watch(plain_sid))
                approver = await connect(bridge, nursery, name="approver")
                await approver.call("session/resume", watch(approved_sid, approve=True))
                async with trio.open_nursery() as turns:
                    turns.start_soon(owner.prompt, plain_sid, "permission")
                    await owner.agent_requests.receive()
                    turns.start_soon(owner.prompt, approved_sid, "permission")
                    await owner.agent_requests.receive()
                    shown = await approver.agent_requests.receive()
                    await owner.disconnect()
                    turns.cancel_scope.cancel()
                await trio.sleep(11)
                await plain.wait_for(lambda m: "a:outcome:no" in str(m))
                assert bridge.hub.sessions.get(plain_sid) is not None
                assert bridge.hub.sessions.get(approved_sid) is not None
                assert "a:outcome" not in str(approver.received)
                yes = {"outcome": {"outcome": "selected", "optionId": "yes"}}
                await approver.send({"jsonrpc": "2.0", "id": shown["id"], "result": yes})
                await approver.wait_for(lambda m: "a:outcome:yes" in str(m))
                nursery.cancel_scope.cancel()


async def test_a_watched_roots_children_live_with_it(autojump_clock):
    """A child's owner is its root's; the root watched, the child stays open with it."""
    a = FakeAgent("a")
    with trio.fail_after(60):
        async with open_bridge({"a": a}, detach_grace=10.0) as (owner, bridge):
            root = await owner.new_session()
            child = await owner.new_session()
            bridge.hub.sessions.get(child).parent = root
            bridge.hub.tree.add(Child(child, root, "a", 1, "/w"))
            async with trio.open_nursery() as nursery:
                watcher = await connect(bridge, nursery, name="watcher")
                await watcher.call("session/resume", watch(root))
                await owner.disconnect()
                await trio.sleep(25)
                assert bridge.hub.sessions.get(child) is not None
                await watcher.disconnect()
                await trio.sleep(9)
                assert bridge.hub.sessions.get(root) is not None
                assert bridge.hub.sessions.get(child) is not None
                await trio.sleep(2)
                await trio.testing.wait_all_tasks_blocked()
                assert bridge.hub.sessions.get(root) is None
                assert bridge.hub.sessions.get(child) is None
                nursery.cancel_scope.cancel()
