"""
ACP over HTTP on the daemon's ACP path, in process: a face over fake agents serving memory
streams (or loopback sockets where a WebSocket client joins in), a raw HTTP client.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from tests.faces.test_ws import MEMORY_PORT, NEW_SESSION, TOKEN, open_face, open_peer, open_server
from tests.support.fakes import FakeAgent
from tests.support.http_acp import Events, HttpAcpClient, memory, opened, tcp

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.faces.ws import WebSocketFace

TIMEOUT = 20
HOST = f"127.0.0.1:{MEMORY_PORT}"


@contextlib.asynccontextmanager
async def http_face(
    agents: dict[str, FakeAgent], *, bridge: dict[str, Any] | None = None, **ws: Any
) -> AsyncIterator[tuple[WebSocketFace, Bridge, trio.Nursery]]:
    async with open_face(agents, bridge=bridge, **ws) as opened_face:
        yield opened_face


def client_of(face: WebSocketFace, nursery: trio.Nursery, **kw: Any) -> HttpAcpClient:
    return HttpAcpClient(memory(face, nursery, **kw), host=HOST, token=TOKEN)


def prompt(client: HttpAcpClient, sid: str, text: str) -> dict[str, Any]:
    return client.request_msg(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    )


async def new_session(client: HttpAcpClient, events: Events) -> str:
    msg = client.request_msg("session/new", NEW_SESSION)
    reply = await client.post(msg)
    assert reply.status == 202, reply
    (*_, answer) = await events.until(lambda m: m.get("id") == msg["id"])
    sid: str = answer.msg["result"]["sessionId"]
    return sid


def texts(events: list[Any]) -> list[str]:
    """The agent's chunks among ``events``."""
    return [
        e.msg["params"]["update"]["content"]["text"]
        for e in events
        if e.msg.get("method") == "session/update"
        and e.msg["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]


# -- the happy path ---------------------------------------------------------------------------


async def test_initialize_then_a_session_streams_its_updates_numbered_on_its_own_stream():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}) as (face, bridge, nursery):
            client = client_of(face, nursery)
            reply = await client.initialize()
            assert reply.headers["content-type"] == "application/json"
            assert reply.json()["id"] == 0
            assert "agentCapabilities" in reply.json()["result"]
            assert reply.headers["set-cookie"].startswith(f"acp_bridge_{MEMORY_PORT}=")
            assert "HttpOnly" in reply.headers["set-cookie"]
            [link] = bridge.hub.clients
            assert link.transport == "http"
            async with opened(client.events()) as conn_events:
                assert conn_events.status == 200
                assert conn_events.headers["content-type"] == "text/event-stream"
                sid = await new_session(client, conn_events)
                async with opened(client.events(session=sid)) as session_events:
                    assert session_events.status == 200
                    msg = prompt(client, sid, "count 5")
                    reply = await client.post(msg, session=sid)
                    assert (reply.status, reply.body) == (202, b"")
                    seen = await session_events.until(lambda m: m.get("id") == msg["id"])
            assert texts(seen) == [f"a:s1:{i}" for i in range(5)]
            # an update's id is its number in the session; the answer comes after it
            seqs = [e.msg["params"]["_meta"]["acp_bridge"]["seq"] for e in seen[:-1]]
            assert [e.id for e in seen[:-1]] == [str(s) for s in seqs]
            assert seqs == sorted(seqs)
            assert seen[-1].id == f"{seqs[-1]}.1"
            assert seen[-1].msg["result"] == {"stopReason": "end_turn"}
            status = bridge.status()
            assert [c["transport"] for c in status["connections"]] == ["http"]
            assert (await client.delete()).status == 202
            assert not bridge.hub.clients
            gone = await client.post(prompt(client, sid, "count 1"), session=sid)
            assert gone.status == 410
            assert bridge.hub.sessions.get(sid).client is None  # detached, not closed


async def test_a_permission_request_goes_on_the_session_stream_and_its_answer_is_posted():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}) as (face, _, nursery):
            client = client_of(face, nursery)
            await client.initialize()
            async with opened(client.events()) as conn_events:
                sid = await new_session(client, conn_events)
                async with opened(client.events(session=sid)) as session_events:
                    msg = prompt(client, sid, "permission")
                    await client.post(msg, session=sid)
                    (*_, asked) = await session_events.until(
                        lambda m: m.get("method") == "session/request_permission"
                    )
                    options = asked.msg["params"]["options"]
                    answer = {
                        "jsonrpc": "2.0",
                        "id": asked.msg["id"],
                        "result": {
                            "outcome": {"outcome": "selected", "optionId": options[0]["optionId"]}
                        },
                    }
                    # (the TypeScript client names the session; the Python one does not)
                    assert (await client.post(answer, session=sid)).status == 202
                    seen = await session_events.until(lambda m: m.get("id") == msg["id"])
            assert texts(seen) == [f"a:outcome:{options[0]['optionId']}"]


async def test_a_session_without_its_stream_gets_its_messages_on_the_connection_stream():
    """As the Python SDK's client does before it sees the session's id: all on one stream."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}) as (face, _, nursery):
            client = client_of(face, nursery)
            await client.initialize()
            async with opened(client.events()) as conn_events:
                sid = await new_session(client, conn_events)
                msg = prompt(client, sid, "count 3")
                await client.post(msg, session=sid)
                seen = await conn_events.until(lambda m: m.get("id") == msg["id"])
            assert texts(seen) == [f"a:s1:{i}" for i in range(3)]
            assert [e.id for e in seen] == ["2", "3", "4", "5"]  # (1: the session/new answer)


# -- refused, and nothing reaches an agent ------------------------------------------------------


async def test_hostile_requests_are_refused_before_anything_reaches_an_agent():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}, max_connections=4) as (face, bridge, nursery):
            owner = client_of(face, nursery)
            await owner.initialize()
            owner_events = await owner.events()
            sid = await new_session(owner, owner_events)
            received = len(agent.received)
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
            nobody = HttpAcpClient(memory(face, nursery), host=HOST, token=None)
            wrong = HttpAcpClient(memory(face, nursery), host=HOST, token="x" * 43)
            assert (await nobody.post(init)).status == 401
            assert (await wrong.post(init)).status == 401
            evil = await owner.post(init, extra=[("Origin", "https://evil.example")])
            assert evil.status == 403
            rebinding = HttpAcpClient(memory(face, nursery), host="evil.example", token=TOKEN)
            assert (await rebinding.post(init)).status == 403
            limit = bridge.hub.config.bridge.max_line_bytes
            huge = await owner.post(b"{" + b" " * limit + b"}")
            assert huge.status == 413
            assert (await owner.post(b'{"jsonrpc": "2.0", "id": 1, "method": ')).status == 400
            assert (await owner.post(b"[]")).status == 501
            plain = await owner.post(prompt(owner, sid, "count 1"), content_type="text/plain")
            assert plain.status == 415
            stranger = client_of(face, nursery)
            stranger.connection_id = "0" * 36
            assert (
                await stranger.post(prompt(stranger, sid, "count 1"), session=sid)
            ).status == 404
            assert (await stranger.events()).status == 404
            # Another connection: the owner's session is refused to it. (Its stream opens, as
            # the TypeScript SDK opens it before a takeover, and carries nothing of it.)
            other = client_of(face, nursery)
            await other.initialize()
            async with opened(other.events()), opened(other.events(session=sid)) as stream:
                assert stream.status == 200
                posted = await other.post(prompt(other, sid, "count 1"), session=sid)
                assert posted.status == 409
                missing = await other.post(prompt(other, sid, "count 1"))
                assert missing.status == 400  # session/prompt without Acp-Session-Id
                mismatch = await other.post(prompt(other, sid, "count 1"), session="s9")
                assert mismatch.status == 400
            assert len(agent.received) == received
            await owner_events.close()


async def test_a_flood_of_connections_gets_503_past_max_connections():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}, max_connections=3) as (face, bridge, nursery):
            clients = [client_of(face, nursery) for _ in range(3)]
            for client in clients:
                await client.initialize()
            received = len(agent.received)
            for _ in range(5):
                refused = await client_of(face, nursery).post(
                    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
                )
                assert refused.status == 503
            assert len(bridge.hub.clients) == 3
            assert len(agent.received) == received
            assert (await clients[0].delete()).status == 202
            await client_of(face, nursery).initialize()  # a place again


async def test_a_client_that_never_reads_its_stream_is_cut_off_and_its_session_detaches(
    autojump_clock,
):
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face(
            {"a": agent}, bridge={"client_queue": 16}, http_buffer_bytes=65536
        ) as (face, bridge, nursery):
            reader = client_of(face, nursery)
            await reader.initialize()
            async with opened(reader.events()) as conn_events:
                sid = await new_session(reader, conn_events)
            # Its session's stream over a lockstep stream: a write waits for a read that
            # never comes.
            stuck = HttpAcpClient(memory(face, nursery, lockstep=True), host=HOST, token=TOKEN)
            stuck.connection_id = reader.connection_id
            never_read = await stuck.events(session=sid)
            assert never_read.status == 200
            [link] = bridge.hub.clients
            await reader.post(prompt(reader, sid, "count 1000"), session=sid)
            await link.closed_event.wait()
            assert link.close_reason.startswith("client is not reading")
            await trio.testing.wait_all_tasks_blocked()
            assert not bridge.hub.clients
            session = bridge.hub.sessions.get(sid)
            assert session is not None
            assert session.client is None  # detached, for another connection to take back
            assert (await reader.post(prompt(reader, sid, "count 1"), session=sid)).status == 410


async def test_a_connection_with_no_stream_open_expires(autojump_clock):
    agent = FakeAgent("a")
    with trio.fail_after(600):  # (the clock's: it jumps)
        async with http_face({"a": agent}, http_stream_timeout=5.0) as (face, bridge, nursery):
            client = client_of(face, nursery)
            await client.initialize()
            await trio.sleep(4.0)
            assert bridge.hub.clients
            async with opened(client.events()):
                await trio.sleep(60.0)  # a stream open: it lives
                assert bridge.hub.clients
            await trio.sleep(5.5)
            assert not bridge.hub.clients
            assert (await client.events()).status == 410


# -- resumption --------------------------------------------------------------------------------


async def test_a_cut_stream_resumes_after_its_last_event_with_nothing_lost_or_repeated():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}) as (face, _, nursery):
            client = client_of(face, nursery)
            await client.initialize()
            async with opened(client.events()) as conn_events:
                sid = await new_session(client, conn_events)
                first = await client.events(session=sid)
                msg = prompt(client, sid, "count 200")
                await client.post(msg, session=sid)
                seen = [await first.next() for _ in range(37)]
                await first.close()  # cut mid-flood
                last = seen[-1].id
                assert last is not None
                async with opened(client.events(session=sid, last_event_id=last)) as second:
                    seen += await second.until(lambda m: m.get("id") == msg["id"])
            assert texts(seen) == [f"a:s1:{i}" for i in range(200)]
            ids = [e.id for e in seen]
            assert len(set(ids)) == len(ids)


async def test_an_unknown_or_dropped_last_event_id_is_refused_never_skipped():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}, http_retention_bytes=4096) as (face, bridge, nursery):
            client = client_of(face, nursery)
            await client.initialize()
            conn_events = await client.events()
            sid = await new_session(client, conn_events)
            async with opened(client.events(session=sid)) as session_events:
                msg = prompt(client, sid, "count 100")
                await client.post(msg, session=sid)
                await session_events.until(lambda m: m.get("id") == msg["id"])
            assert (await client.events(session=sid, last_event_id="nope")).status == 400
            assert (await client.events(session=sid, last_event_id="9999")).status == 400
            old = await client.events(session=sid, last_event_id="3")
            assert old.status == 409
            assert b"after_seq 3" in old.body
            await conn_events.close()
            # The connection's own stream, from before what is kept (its first events were
            # dropped first): 410, and the connection ends.
            gone = await client.events(last_event_id="0")
            assert gone.status == 410
            await trio.testing.wait_all_tasks_blocked()
            assert not bridge.hub.clients
            assert (await client.events()).status == 410


# -- a session moves between WebSocket and HTTP ----------------------------------------------------


async def test_a_session_moves_from_websocket_to_http_and_back_with_nothing_lost():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server:
            async with open_peer(server.port) as ws:
                sid = (await ws.request("session/new", NEW_SESSION))["result"]["sessionId"]
                reply = await ws.request(
                    "session/prompt",
                    {"sessionId": sid, "prompt": [{"type": "text", "text": "count 3"}]},
                )
                assert reply["result"]["stopReason"] == "end_turn"
            await trio.testing.wait_all_tasks_blocked()
            http = HttpAcpClient(tcp(server.port), host=f"127.0.0.1:{server.port}", token=TOKEN)
            await http.initialize()
            async with (
                opened(http.events()) as conn_events,
                opened(http.events(session=sid)) as session_events,
            ):
                load = http.request_msg("session/load", {**NEW_SESSION, "sessionId": sid})
                assert (await http.post(load, session=sid)).status == 202
                await conn_events.until(lambda m: m.get("id") == load["id"])
                replayed = []
                while len(texts(replayed)) < 3:
                    replayed.append(await session_events.next())
                assert texts(replayed) == [f"a:s1:{i}" for i in range(3)]
                msg = prompt(http, sid, "count 2")
                await http.post(msg, session=sid)
                seen = await session_events.until(lambda m: m.get("id") == msg["id"])
                assert texts(seen) == ["a:s1:0", "a:s1:1"]
            assert (await http.delete()).status == 202
            async with open_peer(server.port) as ws:
                reply = await ws.request("session/load", {**NEW_SESSION, "sessionId": sid})
                assert "result" in reply
                history = [
                    m["params"]["update"]["content"]["text"]
                    for m in ws.received
                    if m.get("method") == "session/update"
                    and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                ]
                assert history == [f"a:s1:{i}" for i in range(3)] + ["a:s1:0", "a:s1:1"]


async def test_a_permission_left_unanswered_is_shown_again_to_the_connection_that_loads():
    """The first connection is asked, and goes (DELETE) without answering: the request is
    parked with its session, shown again on the stream of the connection that loads it, and
    its answer reaches the agent."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with http_face({"a": agent}) as (face, _, nursery):
            first = client_of(face, nursery)
            await first.initialize()
            async with opened(first.events()) as conn_events:
                sid = await new_session(first, conn_events)
                async with opened(first.events(session=sid)) as session_events:
                    turn = prompt(first, sid, "permission")
                    await first.post(turn, session=sid)
                    await session_events.until(
                        lambda m: m.get("method") == "session/request_permission"
                    )
            assert (await first.delete()).status == 202
            second = client_of(face, nursery)
            await second.initialize()
            async with (
                opened(second.events()) as conn_events,
                opened(second.events(session=sid)) as session_events,
            ):
                load = second.request_msg("session/load", {**NEW_SESSION, "sessionId": sid})
                assert (await second.post(load, session=sid)).status == 202
                (*_, asked) = await session_events.until(
                    lambda m: m.get("method") == "session/request_permission"
                )
                answer = {
                    "jsonrpc": "2.0",
                    "id": asked.msg["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
                }
                assert (await second.post(answer)).status == 202  # (no Acp-Session-Id: fine)
                # The turn the first connection started ends here, under its own id.
                seen = await session_events.until(lambda m: m.get("id") == turn["id"])
                assert texts(seen)[-1] == "a:outcome:allow"
                await conn_events.until(lambda m: m.get("id") == load["id"])


async def test_http_takes_a_live_websocket_session_over_with_resume():
    """A session a live WebSocket connection holds: a prompt about it is refused (409); its
    stream opens first (as the TypeScript SDK opens it before it POSTs the takeover), then a
    POSTed session/resume takes it over, as over WebSocket, and the WebSocket client hears no
    more."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server, open_peer(server.port) as ws:
            sid = (await ws.request("session/new", NEW_SESSION))["result"]["sessionId"]
            http = HttpAcpClient(tcp(server.port), host=f"127.0.0.1:{server.port}", token=TOKEN)
            await http.initialize()
            async with (
                opened(http.events()),
                opened(http.events(session=sid)) as session_events,
            ):
                assert session_events.status == 200
                refused = await http.post(prompt(http, sid, "count 1"), session=sid)
                assert refused.status == 409
                resume = http.request_msg("session/resume", {**NEW_SESSION, "sessionId": sid})
                assert (await http.post(resume, session=sid)).status == 202
                (answer,) = await session_events.until(lambda m: m.get("id") == resume["id"])
                assert answer.msg["result"]["_meta"]["acp_bridge"]["complete"] is True
                msg = prompt(http, sid, "count 2")
                await http.post(msg, session=sid)
                seen = await session_events.until(lambda m: m.get("id") == msg["id"])
                assert texts(seen) == ["a:s1:0", "a:s1:1"]
            refused = await ws.request(
                "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}
            )
            assert refused["error"]["code"] == -32002


async def test_a_connection_that_posts_nothing_for_idle_timeout_ends(autojump_clock):
    agent = FakeAgent("a")
    with trio.fail_after(600):  # (the clock's: it jumps)
        async with http_face({"a": agent}, idle_timeout=100.0) as (face, bridge, nursery):
            client = client_of(face, nursery)
            await client.initialize()
            async with opened(client.events()) as events:
                sid = await new_session(client, events)
                await trio.sleep(90.0)
                msg = prompt(client, sid, "count 1")
                await client.post(msg, session=sid)  # (the deadline starts again)
                await trio.sleep(90.0)
                assert bridge.hub.clients
                await trio.sleep(20.0)
                assert not bridge.hub.clients
                # its streams end with it
                assert await events.next() is not None  # (what it had: the prompt's)
                while await events.next() is not None:
                    pass


async def test_websocket_and_http_connections_share_max_connections():
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}, max_connections=1) as server:
            http = HttpAcpClient(tcp(server.port), host=f"127.0.0.1:{server.port}", token=TOKEN)
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
            async with open_peer(server.port):
                assert (await http.post(init)).status == 503
            await trio.testing.wait_all_tasks_blocked()
            await http.initialize()
            assert len(server.bridge.hub.clients) == 1
