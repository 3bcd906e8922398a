"""
Watchers over ACP over HTTP (``_meta.acp_bridge.watch`` on a POSTed load or resume): an HTTP
connection follows a session a WebSocket or HTTP connection owns, and the other way round.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from acp_bridge.engine.watchers import WATCHER_TOO_SLOW
from acp_bridge.protocol.wire import TAKE_OVER_HINT
from tests.faces.test_http_acp import HOST, client_of, http_face, new_session, prompt, texts
from tests.faces.test_ws import NEW_SESSION, TOKEN, WsPeer, open_peer, open_server
from tests.faces.test_ws_watchers import extended, watch, withdrawn_then_resolved
from tests.faces.test_ws_watchers import texts as ws_texts
from tests.support.fakes import FakeAgent
from tests.support.http_acp import Event, Events, HttpAcpClient, memory, opened, tcp

TIMEOUT = 20


def http_client(port: int) -> HttpAcpClient:
    return HttpAcpClient(tcp(port), host=f"127.0.0.1:{port}", token=TOKEN)


def link_of(bridge: Any, client: HttpAcpClient) -> Any:
    """The bridge's link of an HTTP connection."""
    assert client.connection_id is not None
    [link] = [c for c in bridge.hub.clients if c.name == f"http:{client.connection_id[:8]}"]
    return link


async def answered(client: HttpAcpClient, events: Events, msg: dict[str, Any]) -> Event:
    """POST ``msg`` (a request) and wait for its answer on ``events``."""
    sid = msg["params"].get("sessionId")
    assert (await client.post(msg, session=sid)).status == 202
    (*_, answer) = await events.until(lambda m: m.get("id") == msg["id"] and "method" not in m)
    return answer


async def chunks(events: Events, seen: list[Event], count: int) -> None:
    """Read ``events`` into ``seen`` until it holds ``count`` of the agent's chunks."""
    have = len(texts(seen))
    while have < count:
        event = await events.next()
        assert event is not None, "the stream ended"
        seen.append(event)
        have += len(texts([event]))


def selected(request_id: Any, option: str = "yes") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": {"outcome": {"outcome": "selected", "optionId": option}},
    }


def agent_answers(agent: FakeAgent) -> list[Any]:
    """The permission answers the agent got."""
    return [m for m in agent.received if "method" not in m and "outcome" in m.get("result", {})]


async def ws_turn(peer: WsPeer, sid: str, text: str) -> dict[str, Any]:
    reply = await peer.request(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    )
    return reply


# -- a WebSocket owner, an HTTP watcher ----------------------------------------------------------


async def test_an_http_watcher_gets_the_replay_then_every_live_update_in_the_owners_order():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server, open_peer(server.port) as owner:
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            await ws_turn(owner, sid, "count 3")
            watcher = http_client(server.port)
            await watcher.initialize()
            async with opened(watcher.events()) as conn_events:
                # (the session's stream, opened before the load: the replay goes on it)
                session_events = await watcher.events(session=sid)
                assert session_events.status == 200
                load = watcher.request_msg("session/load", watch(sid))
                answer = await answered(watcher, conn_events, load)
                ours = answer.msg["result"]["_meta"]["acp_bridge"]
                assert ours["watch"] is True
                session = server.bridge.hub.sessions.get(sid)
                assert session is not None
                assert session.client is not None
                assert ours["owner"] == session.client.name
                seen: list[Event] = []
                await chunks(session_events, seen, 3)
                assert texts(seen) == ["a:s1:0", "a:s1:1", "a:s1:2"]
                reply = await ws_turn(owner, sid, "count 200")
                assert reply["result"]["stopReason"] == "end_turn"
                await chunks(session_events, seen, 50)
                # Cut mid-flood: resumed after the last event it had, as an owner's stream is.
                await session_events.close()
                last = seen[-1].id
                assert last is not None
                async with opened(watcher.events(session=sid, last_event_id=last)) as resumed:
                    await chunks(resumed, seen, 203)
            live = [f"a:s1:{i}" for i in range(200)]
            assert ws_texts(owner, sid)[3:] == live
            assert texts(seen)[3:] == live
            # Each update's event id is its number in the session, as for an owner.
            updates = [e for e in seen if e.msg.get("method") == "session/update"]
            seqs = [e.msg["params"]["_meta"]["acp_bridge"]["seq"] for e in updates]
            assert [e.id for e in updates] == [str(s) for s in seqs]
            assert seqs == sorted(set(seqs))
            # The owner keeps the session; the HTTP connection is counted as its watcher.
            assert session.client is not None
            assert session.client.transport == "ws"
            [row] = [s for s in server.bridge.status()["sessions"] if s["sessionId"] == sid]
            assert row["watchers"] == 1


async def test_an_http_watcher_is_refused_what_only_the_owner_may_do_then_takes_it_over():
    """Not 409 (the HTTP refusal of a stranger): the bridge's -32002 with the take-over hint,
    on the watcher's session stream; then a plain load takes the session over."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server, open_peer(server.port) as owner:
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            watcher = http_client(server.port)
            await watcher.initialize()
            async with (
                opened(watcher.events()) as conn_events,
                opened(watcher.events(session=sid)) as session_events,
            ):
                load = watcher.request_msg("session/load", watch(sid))
                await answered(watcher, conn_events, load)
                for method, params in (
                    ("session/prompt", prompt(watcher, sid, "count 1")["params"]),
                    ("session/set_mode", {"sessionId": sid, "modeId": "x"}),
                    ("session/close", {"sessionId": sid}),
                ):
                    refused = await answered(
                        watcher, session_events, watcher.request_msg(method, params)
                    )
                    assert refused.msg["error"]["code"] == -32002, method
                    assert TAKE_OVER_HINT in refused.msg["error"]["message"], method
                assert not [m for m in agent.received if m.get("method") == "session/prompt"]
                # The owner is untouched; then the watcher takes the session over.
                assert "result" in await ws_turn(owner, sid, "count 1")
                load = watcher.request_msg("session/load", {**NEW_SESSION, "sessionId": sid})
                answer = await answered(watcher, conn_events, load)
                assert "watch" not in answer.msg["result"]["_meta"]["acp_bridge"]
                turn = prompt(watcher, sid, "count 2")
                assert (await answered(watcher, session_events, turn)).msg["result"]
            refused = await ws_turn(owner, sid, "count 1")
            assert refused["error"]["code"] == -32002


async def test_an_http_watcher_that_approves_answers_first_and_the_owner_is_withdrawn():
    agent = FakeAgent("a")
    audit: list[Any] = []
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}) as server,
            open_peer(server.port, initialize=False) as owner,
        ):
            await extended(owner)
            server.bridge.approvals.desk.changed.subscribe(lambda entry, done: audit.append(done))
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            watcher = http_client(server.port)
            await watcher.initialize()
            async with (
                opened(watcher.events()),
                opened(watcher.events(session=sid)) as session_events,
            ):
                resume = watcher.request_msg("session/resume", watch(sid, approve=True))
                # (a resume's answer follows the session, unlike a load's)
                await answered(watcher, session_events, resume)
                await owner.send(
                    {
                        "jsonrpc": "2.0",
                        "id": "turn",
                        "method": "session/prompt",
                        "params": prompt(watcher, sid, "permission")["params"],
                    }
                )
                asked_owner = await owner.next()
                assert asked_owner["method"] == "session/request_permission"
                (*_, asked) = await session_events.until(
                    lambda m: m.get("method") == "session/request_permission"
                )
                # (with Acp-Session-Id, as the TypeScript SDK's client posts an answer)
                assert (await watcher.post(selected(asked.msg["id"]), session=sid)).status == 202
                await withdrawn_then_resolved(owner, asked_owner["id"])
                assert "a:outcome:yes" in ws_texts(owner, sid)
                # The watcher follows the turn to its end (its outcome included).
                seen: list[Event] = []
                await chunks(session_events, seen, 1)
                assert texts(seen) == ["a:outcome:yes"]
                assert len(agent_answers(agent)) == 1
                [done] = [d for d in audit if d is not None]
                assert done.connection == link_of(server.bridge, watcher).name
                assert done.source == "client"


# -- an HTTP owner -------------------------------------------------------------------------------


async def test_a_websocket_watcher_of_an_http_owner_gets_the_replay_and_every_update():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server:
            owner = http_client(server.port)
            await owner.initialize()
            async with (
                opened(owner.events()) as conn_events,
                open_peer(server.port, initialize=False) as watcher,
            ):
                sid = await new_session(owner, conn_events)
                async with opened(owner.events(session=sid)) as session_events:
                    await answered(owner, session_events, prompt(owner, sid, "count 3"))
                    await extended(watcher)
                    reply = await watcher.request("session/load", watch(sid))
                    ours = reply["result"]["_meta"]["acp_bridge"]
                    assert ours["watch"] is True
                    assert ours["owner"] == link_of(server.bridge, owner).name
                    assert ws_texts(watcher, sid) == ["a:s1:0", "a:s1:1", "a:s1:2"]
                    turn = prompt(owner, sid, "count 100")
                    assert (await owner.post(turn, session=sid)).status == 202
                    seen = await session_events.until(lambda m: m.get("id") == turn["id"])
                    while len(ws_texts(watcher, sid)) < 103:
                        await watcher.next()
                live = [f"a:s1:{i}" for i in range(100)]
                assert texts(seen) == live
                assert ws_texts(watcher, sid)[3:] == live
                # The watcher may not prompt; the HTTP owner still owns the session.
                refused = await ws_turn(watcher, sid, "count 1")
                assert refused["error"]["code"] == -32002
                session = server.bridge.hub.sessions.get(sid)
                assert session is not None
                assert session.client is link_of(server.bridge, owner)


async def test_two_http_connections_an_owner_and_a_watcher_that_approves():
    """Whoever answers first settles the request (the watcher, then the owner); the other is
    withdrawn with ``$/cancel_request`` on the stream its request went on, after it."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}) as (face, _, nursery):
            owner = client_of(face, nursery)
            watcher = client_of(face, nursery)
            await owner.initialize()
            await watcher.initialize()
            async with opened(owner.events()) as owner_conn, opened(watcher.events()):
                sid = await new_session(owner, owner_conn)
                async with (
                    opened(owner.events(session=sid)) as owner_events,
                    opened(watcher.events(session=sid)) as watch_events,
                ):
                    resume = watcher.request_msg("session/resume", watch(sid, approve=True))
                    await answered(watcher, watch_events, resume)
                    for first, option in ((watcher, "yes"), (owner, "no")):
                        turn = prompt(owner, sid, "permission")
                        assert (await owner.post(turn, session=sid)).status == 202
                        (*_, asked_owner) = await owner_events.until(is_asked)
                        (*_, asked_watcher) = await watch_events.until(is_asked)
                        asked, withdrawn, withdrawn_events = (
                            (asked_watcher, asked_owner, owner_events)
                            if first is watcher
                            else (asked_owner, asked_watcher, watch_events)
                        )
                        reply = await first.post(selected(asked.msg["id"], option), session=sid)
                        assert reply.status == 202
                        (cancel,) = await withdrawn_events.until(is_cancel)
                        assert cancel.msg["params"] == {"requestId": withdrawn.msg["id"]}
                        seen = await owner_events.until(lambda m, t=turn: m.get("id") == t["id"])
                        assert texts(seen) == [f"a:outcome:{option}"]
            assert len(agent_answers(agent)) == 2


def is_asked(msg: dict[str, Any]) -> bool:
    return msg.get("method") == "session/request_permission"


def is_cancel(msg: dict[str, Any]) -> bool:
    return msg.get("method") == "$/cancel_request"


async def test_an_http_watcher_that_does_not_read_is_cut_off_and_the_http_owner_runs_on():
    """The watcher's session stream is never read: its events fill its buffer, then its
    link's queue, and the bridge cuts it off at once; the owner's turn never waits on it, and
    a connection that watches again from before the flood misses nothing."""
    agent = FakeAgent("a")
    total = 2000
    with trio.fail_after(TIMEOUT):
        async with http_face(
            {"a": agent}, bridge={"client_queue": 16}, http_buffer_bytes=65536
        ) as (face, bridge, nursery):
            owner = client_of(face, nursery)
            await owner.initialize()
            async with opened(owner.events()) as owner_conn:
                sid = await new_session(owner, owner_conn)
                async with opened(owner.events(session=sid)) as owner_events:
                    watcher = client_of(face, nursery)
                    await watcher.initialize()
                    async with opened(watcher.events()) as watch_conn:
                        resume = watcher.request_msg("session/resume", watch(sid))
                        answer = await answered(watcher, watch_conn, resume)
                        before = answer.msg["result"]["_meta"]["acp_bridge"]["lastSeq"]
                        # Its session's stream over a lockstep stream: a write waits for a
                        # read that never comes.
                        stuck = HttpAcpClient(
                            memory(face, nursery, lockstep=True), host=HOST, token=TOKEN
                        )
                        stuck.connection_id = watcher.connection_id
                        assert (await stuck.events(session=sid)).status == 200
                        link = link_of(bridge, watcher)
                        turn = prompt(owner, sid, f"count {total}")
                        assert (await owner.post(turn, session=sid)).status == 202
                        seen = await owner_events.until(lambda m: m.get("id") == turn["id"])
                    assert texts(seen) == [f"a:s1:{i}" for i in range(total)]
                    assert link.closed
                    assert link.close_reason == WATCHER_TOO_SLOW
                    await trio.testing.wait_all_tasks_blocked()
                    gone = await watcher.post(prompt(watcher, sid, "count 1"), session=sid)
                    assert gone.status == 410
                    session = bridge.hub.sessions.get(sid)
                    assert session is not None
                    assert session.client is link_of(bridge, owner)
                    assert session.watchers is None
                    # Back, from the last update it had: the whole flood is replayed.
                    back = client_of(face, nursery)
                    await back.initialize()
                    async with (
                        opened(back.events()) as back_conn,
                        opened(back.events(session=sid)) as back_events,
                    ):
                        load = back.request_msg("session/load", watch(sid, after_seq=before))
                        answer = await answered(back, back_conn, load)
                        assert answer.msg["result"]["_meta"]["acp_bridge"]["complete"] is True
                        replayed: list[Event] = []
                        await chunks(back_events, replayed, total)
                    assert texts(replayed) == [f"a:s1:{i}" for i in range(total)]
