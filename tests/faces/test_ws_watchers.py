"""Watchers: connections that follow a session they do not own (``_meta.acp_bridge.watch``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from acp_bridge.engine.watchers import WATCHER_TOO_SLOW
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.protocol.jsonrpc import dumps, loads
from tests.faces.test_ws import NEW_SESSION, WsPeer, open_peer, open_server
from tests.support.fakes import FakeAgent, TestClient, connect, open_bridge

if TYPE_CHECKING:
    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.engine.links import ClientLink

TIMEOUT = 20


def texts(peer: WsPeer, sid: str) -> list[str]:
    return [
        m["params"]["update"]["content"]["text"]
        for m in peer.received
        if m.get("method") == "session/update"
        and m["params"]["sessionId"] == sid
        and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]


def watch(sid: str, **ours: Any) -> dict[str, Any]:
    return {**NEW_SESSION, "sessionId": sid, "_meta": {"acp_bridge": {"watch": True, **ours}}}


async def extended(peer: WsPeer, **ours: Any) -> None:
    """Initialize as a client that knows the bridge's extensions."""
    init = {"protocolVersion": 1, "_meta": {"acp_bridge": {"log": "info", **ours}}}
    assert "result" in await peer.request("initialize", init)


async def withdrawn_then_resolved(owner: WsPeer, request_id: Any) -> None:
    """The owner is told its permission request is withdrawn, then why (another client
    answered it first); then its turn (request id ``turn``) is answered."""
    withdrawn = await owner.next()
    assert withdrawn == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": request_id},
    }
    resolved = await owner.next()
    assert resolved["method"] == "_acp_bridge/permission_resolved"
    while not any(m.get("id") == "turn" for m in owner.received):
        await owner.next()


async def read_until(peer: WsPeer, sid: str, count: int) -> None:
    while len(texts(peer, sid)) < count:
        await peer.next()


async def test_an_owner_and_two_watchers_get_every_update_in_the_same_order():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}) as server,
            open_peer(server.port) as owner,
            open_peer(server.port, initialize=False) as first,
            open_peer(server.port, initialize=False) as second,
        ):
            await extended(first)
            await extended(second)
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            await owner.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "count 3"}]},
            )
            # The first watches from the start (load: the history replayed), the second from
            # now on (resume: no replay).
            reply = await first.request("session/load", watch(sid))
            ours = reply["result"]["_meta"]["acp_bridge"]
            assert ours["watch"] is True
            assert ours["owner"] == owner_name(server, sid)
            assert texts(first, sid) == ["a:s1:0", "a:s1:1", "a:s1:2"]
            assert "result" in await second.request("session/resume", watch(sid))
            assert texts(second, sid) == []
            reply = await owner.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "count 200"}]},
            )
            assert reply["result"]["stopReason"] == "end_turn"
            await read_until(first, sid, 203)
            await read_until(second, sid, 200)
            live = [f"a:s1:{i}" for i in range(200)]
            assert texts(owner, sid)[3:] == live
            assert texts(first, sid)[3:] == live
            assert texts(second, sid) == live
            # The owner keeps the session; status and the list name it and count the watchers.
            session = server.bridge.hub.sessions.get(sid)
            assert session is not None
            assert session.client is not None
            status = server.bridge.status()
            [row] = [s for s in status["sessions"] if s["sessionId"] == sid]
            assert row["connection"] == session.client.name
            assert row["watchers"] == 2
            listed = (await first.request("session/list", {}))["result"]["sessions"]
            [entry] = [s for s in listed if s["sessionId"] == sid]
            assert entry["_meta"]["acp_bridge"]["owner"] == session.client.name
            assert entry["_meta"]["acp_bridge"]["watchers"] == 2
            # A stock client's list is what it was.
            stock = (await owner.request("session/list", {}))["result"]["sessions"]
            assert all("_meta" not in s for s in stock)


def owner_name(server: Any, sid: str) -> str:
    session = server.bridge.hub.sessions.get(sid)
    assert session is not None
    assert session.client is not None
    return str(session.client.name)


async def test_a_watcher_is_refused_what_only_the_owner_may_do_with_the_take_over_hint():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}) as server,
            open_peer(server.port) as owner,
            open_peer(server.port, initialize=False) as watcher,
        ):
            await extended(watcher)
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            assert "result" in await watcher.request("session/load", watch(sid))
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "count 1"}]}
            for method, params in (
                ("session/prompt", prompt),
                ("session/set_mode", {"sessionId": sid, "modeId": "x"}),
                ("session/close", {"sessionId": sid}),
            ):
                refused = await watcher.request(method, params)
                message = refused["error"]["message"]
                assert "without _meta.acp_bridge.watch to take it over" in message, method
            await watcher.send(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
            )
            told = await watcher.next()
            assert told["method"] == "_acp_bridge/log"
            assert "take it over" in told["params"]["data"]["message"]
            assert sid not in agent.cancelled
            assert not [m for m in agent.received if m.get("method") == "session/prompt"]
            # The owner is untouched; then the watcher takes the session over.
            assert (await owner.request("session/prompt", prompt))["result"]
            reply = await watcher.request("session/load", {**NEW_SESSION, "sessionId": sid})
            assert "result" in reply
            session = server.bridge.hub.sessions.get(sid)
            assert session is not None
            assert session.watchers is None
            assert (await watcher.request("session/prompt", prompt))["result"]


async def test_one_watcher_more_than_max_watchers_is_refused():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}, bridge={"max_watchers": 1}) as server,
            open_peer(server.port) as owner,
            open_peer(server.port) as first,
            open_peer(server.port) as second,
        ):
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            assert "result" in await first.request("session/resume", watch(sid))
            refused = await second.request("session/resume", watch(sid))
            assert "max_watchers 1" in refused["error"]["message"]
            # The owner cannot watch its own session.
            refused = await owner.request("session/resume", watch(sid))
            assert "owns" in refused["error"]["message"]


async def test_a_watcher_dropped_mid_stream_comes_back_after_seq_and_misses_nothing():
    agent = FakeAgent("a")
    total = 400
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}, bridge={"client_queue": 16}) as server,
            open_peer(server.port) as owner,
        ):
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            seen: list[tuple[int, str]] = []
            async with open_peer(server.port, initialize=False) as watcher:
                await extended(watcher, seq=True)
                assert "result" in await watcher.request("session/resume", watch(sid))
                prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": f"count {total}"}]}
                await owner.send(
                    {"jsonrpc": "2.0", "id": "turn", "method": "session/prompt", "params": prompt}
                )
                while len(seen) < 20:
                    msg = await watcher.next()
                    if msg.get("method") == "session/update":
                        update = msg["params"]["update"]
                        seq = msg["params"]["_meta"]["acp_bridge"]["seq"]
                        seen.append((seq, update["content"]["text"]))
            while not any(m.get("id") == "turn" for m in owner.received):
                await owner.next()
            await trio.testing.wait_all_tasks_blocked()
            async with open_peer(server.port, initialize=False) as back:
                await extended(back, seq=True)
                reply = await back.request("session/load", watch(sid, after_seq=seen[-1][0]))
                assert reply["result"]["_meta"]["acp_bridge"]["complete"] is True
                replayed = [
                    (
                        m["params"]["_meta"]["acp_bridge"]["seq"],
                        m["params"]["update"]["content"]["text"],
                    )
                    for m in back.received
                    if m.get("method") == "session/update"
                ]
            everything = seen + replayed
            # (seq 1 is the owner's prompt: a watcher gets it live, and in its catch-up)
            assert [s for s, _ in everything] == list(range(1, total + 2))
            assert [t for _, t in everything] == [
                f"count {total}",
                *(f"a:s1:{i}" for i in range(total)),
            ]


async def silent_watcher(
    bridge: Bridge, nursery: trio.Nursery, sid: str, **capabilities: Any
) -> ClientLink:
    """A connection that watches ``sid`` (``capabilities``: its client's), then reads nothing
    (a lockstep stream nobody reads): its link."""
    client_side, bridge_side = trio.testing.lockstep_stream_pair()
    nursery.start_soon(
        functools.partial(serve_client_stream, bridge, bridge_side, bridge_side, name="w", linger=0)
    )
    init = {"protocolVersion": 1, "clientCapabilities": capabilities}
    await client_side.send_all(
        dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        + dumps({"jsonrpc": "2.0", "id": 2, "method": "session/resume", "params": watch(sid)})
    )
    decoder = LineDecoder()
    answered: set[int] = set()
    while answered != {1, 2}:
        for line in decoder.feed(await client_side.receive_some(65536)):
            assert isinstance(line, bytes)
            msg = loads(line)
            assert "error" not in msg, msg
            answered.add(msg["id"])
    [link] = [c for c in bridge.hub.clients if c.name == "w"]
    return link


async def test_a_watcher_that_never_reads_is_cut_off_and_the_owner_runs_at_full_speed():
    """The watcher's connection takes nothing (a lockstep stream nobody reads): its queue
    fills and it is cut off; the owner's turn never waits on it."""
    agent = FakeAgent("a")
    total = 2000
    with trio.fail_after(TIMEOUT):
        async with open_bridge({"a": agent}, client_queue=16) as (owner, bridge):
            sid = await owner.new_session()
            async with trio.open_nursery() as nursery:
                link = await silent_watcher(bridge, nursery, sid)
                reply = await owner.prompt(sid, f"count {total}")
                assert reply["result"]["stopReason"] == "end_turn"
                assert owner.updates(sid) == [f"a:s1:{i}" for i in range(total)]
                assert link.closed
                assert link.close_reason == WATCHER_TOO_SLOW
                nursery.cancel_scope.cancel()


async def test_a_stock_client_sees_no_watcher_extensions():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_bridge({"a": agent}, log=None) as (owner, bridge), trio.open_nursery() as n:
            sid = await owner.new_session()
            other = await connect(bridge, n, log=None, name="other")
            listed = (await other.call("session/list", {}))["sessions"]
            assert all("_meta" not in s for s in listed)
            await owner.prompt(sid, "count 2")
            assert [m for m in owner.received if "_meta" in (m.get("params") or {})] == []
            n.cancel_scope.cancel()


async def test_a_watcher_that_approves_answers_first_and_the_owner_is_withdrawn():
    agent = FakeAgent("a")
    audit: list[Any] = []
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}) as server,
            open_peer(server.port, initialize=False) as owner,
            open_peer(server.port, initialize=False) as watcher,
        ):
            await extended(owner)
            await extended(watcher)
            server.bridge.approvals.desk.changed.subscribe(lambda entry, done: audit.append(done))
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            reply = await watcher.request("session/resume", watch(sid, approve=True))
            assert "result" in reply
            await owner.send(
                {
                    "jsonrpc": "2.0",
                    "id": "turn",
                    "method": "session/prompt",
                    "params": {
                        "sessionId": sid,
                        "prompt": [{"type": "text", "text": "permission"}],
                    },
                }
            )
            asked_owner = await owner.next()
            prompted = await watcher.next()  # (the owner's prompt, live)
            assert prompted["params"]["update"]["sessionUpdate"] == "user_message_chunk"
            asked_watcher = await watcher.next()
            assert asked_owner["method"] == asked_watcher["method"] == "session/request_permission"
            await watcher.send(
                {
                    "jsonrpc": "2.0",
                    "id": asked_watcher["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            )
            await withdrawn_then_resolved(owner, asked_owner["id"])
            assert "a:outcome:yes" in texts(owner, sid)
            answers = [
                m for m in agent.received if "method" not in m and "outcome" in m.get("result", {})
            ]
            assert len(answers) == 1
            [done] = [d for d in audit if d is not None]
            watcher_link = next(
                c for c in server.bridge.hub.clients if c is not owner_link(server, sid)
            )
            assert done.connection == watcher_link.name
            assert done.source == "client"


def owner_link(server: Any, sid: str) -> Any:
    session = server.bridge.hub.sessions.get(sid)
    assert session is not None
    return session.client


NOTICES = {"notices": {}}


def notice_update(title: str) -> dict[str, Any]:
    return {"sessionUpdate": "notice", "severity": "info", "title": title}


def notices(client: TestClient, sid: str) -> list[str]:
    return [
        m["params"]["update"]["title"]
        for m in client.received
        if m.get("method") == "session/update"
        and m["params"]["sessionId"] == sid
        and m["params"]["update"]["sessionUpdate"] == "notice"
    ]


async def test_notices_reach_the_watchers_that_take_them():
    """An agent's notice and the bridge's own (an error on the agent's stderr)."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_bridge({"a": agent}) as (owner, bridge), trio.open_nursery() as n:
            sid = await owner.new_session()
            taker = await connect(bridge, n, name="taker", session=NOTICES)
            stock = await connect(bridge, n, name="stock")
            await taker.call("session/resume", watch(sid))
            await stock.call("session/resume", watch(sid))
            params = {"sessionId": sid, "update": notice_update("Indexing")}
            await agent.write({"jsonrpc": "2.0", "method": "session/update", "params": params})
            await owner.prompt(sid, "count 1")
            for client in (taker, stock):
                await client.wait_for(
                    lambda m: (
                        m.get("params", {}).get("update", {}).get("content")
                        == {"type": "text", "text": "a:s1:0"}
                    )
                )
            assert notices(taker, sid) == ["Indexing"]
            assert agent.stderr is not None
            await agent.stderr.send_all(b"ERROR: boom\n")
            await taker.wait_for(
                lambda m: (
                    m.get("params", {}).get("update", {}).get("title")
                    == "Agent 'a' reported an error"
                )
            )
            await trio.testing.wait_all_tasks_blocked()
            # Neither the watcher without the capability nor the owner (a client without it).
            assert notices(stock, sid) == []
            assert notices(owner, sid) == []
            n.cancel_scope.cancel()


async def test_a_watcher_without_room_misses_a_notice_and_is_not_cut_off():
    agent = FakeAgent("a")
    limit = 4
    with trio.fail_after(TIMEOUT):
        async with (
            open_bridge({"a": agent}, client_queue=limit) as (owner, bridge),
            trio.open_nursery() as nursery,
        ):
            sid = await owner.new_session()
            link = await silent_watcher(bridge, nursery, sid, session=NOTICES)
            for i in range(3 * limit):
                params = {"sessionId": sid, "update": notice_update(f"n{i}")}
                await agent.write({"jsonrpc": "2.0", "method": "session/update", "params": params})
            await trio.testing.wait_all_tasks_blocked()
            assert not link.has_room()  # (its queue filled with notices: the rest dropped)
            assert not link.closed
            nursery.cancel_scope.cancel()


def stream(client: TestClient, sid: str) -> list[tuple[int, dict[str, Any]]]:
    """The session's updates a client got, with their seq numbers."""
    return [
        (m["params"]["_meta"]["acp_bridge"]["seq"], m["params"]["update"])
        for m in client.received
        if m.get("method") == "session/update" and m["params"]["sessionId"] == sid
    ]


async def test_a_watcher_sees_the_owners_prompts_live_as_a_replay_shows_them():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_bridge({"a": agent}) as (owner, bridge), trio.open_nursery() as n:
            sid = await owner.new_session()
            watcher = await connect(bridge, n, seq=True, name="watcher")
            await watcher.call("session/resume", watch(sid))
            await owner.prompt(sid, "count 2")
            await watcher.wait_for(lambda _: len(stream(watcher, sid)) == 3)
            live = stream(watcher, sid)
            assert [u["sessionUpdate"] for _, u in live] == [
                "user_message_chunk",
                "agent_message_chunk",
                "agent_message_chunk",
            ]
            assert live[0][1]["content"] == {"type": "text", "text": "count 2"}
            # What it saw live is what a load replays.
            fresh = await connect(bridge, n, seq=True, name="fresh")
            await fresh.call("session/load", watch(sid))
            assert stream(fresh, sid) == live
            # The owner sent the prompt: it is not echoed to it.
            assert [u for u in owner.received if "user_message_chunk" in str(u)] == []
            # Gone, and back with after_seq: the prompt sent meanwhile is in its catch-up.
            await watcher.disconnect()
            await owner.prompt(sid, "count 1")
            await fresh.wait_for(lambda _: len(stream(fresh, sid)) == 5)
            back = await connect(bridge, n, seq=True, name="back")
            await back.call("session/load", watch(sid, after_seq=live[-1][0]))
            assert stream(back, sid) == stream(fresh, sid)[3:]
            assert stream(back, sid)[0][1]["sessionUpdate"] == "user_message_chunk"
            n.cancel_scope.cancel()
