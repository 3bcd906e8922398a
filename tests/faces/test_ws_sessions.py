"""Sessions over real WebSocket connections: drop mid-stream, reconnect, load; takeover."""

from __future__ import annotations

import trio
import trio.testing

from tests.faces.test_ws import NEW_SESSION, open_peer, open_server
from tests.support.fakes import FakeAgent

TIMEOUT = 20


def chunk_text(msg):
    update = msg["params"]["update"]
    return update["content"]["text"] if update["sessionUpdate"] == "agent_message_chunk" else None


async def test_drop_mid_stream_then_load_after_seq_gives_every_update_exactly_once_in_order():
    """The first connection drops mid-stream; a new connection loads after the last seq it saw
    and gets exactly the rest, in order, although the replay is far larger than the client
    queue (16 messages)."""
    agent = FakeAgent("a")
    total = 600
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}, bridge={"client_queue": 16}) as server:
            seen: list[tuple[int, str]] = []
            async with open_peer(server.port, initialize=False) as first:
                await first.request(
                    "initialize", {"protocolVersion": 1, "_meta": {"acp_bridge": {"seq": True}}}
                )
                sid = (await first.request("session/new", NEW_SESSION))["result"]["sessionId"]
                await first.send(
                    {
                        "jsonrpc": "2.0",
                        "id": "turn",
                        "method": "session/prompt",
                        "params": {
                            "sessionId": sid,
                            "prompt": [{"type": "text", "text": f"count {total}"}],
                        },
                    }
                )
                while len(seen) < 25:
                    msg = await first.next()
                    if msg.get("method") == "session/update":
                        seq = msg["params"]["_meta"]["acp_bridge"]["seq"]
                        seen.append((seq, chunk_text(msg)))
                # Drop the connection mid-stream (what it had not read yet is lost to it).
            await trio.testing.wait_all_tasks_blocked()
            async with open_peer(server.port, initialize=False) as second:
                await second.request(
                    "initialize", {"protocolVersion": 1, "_meta": {"acp_bridge": {"seq": True}}}
                )
                reply = await second.request(
                    "session/load",
                    {
                        **NEW_SESSION,
                        "sessionId": sid,
                        "_meta": {"acp_bridge": {"after_seq": seen[-1][0]}},
                    },
                )
                assert reply["result"]["_meta"]["acp_bridge"]["complete"] is True
                replayed = [
                    (m["params"]["_meta"]["acp_bridge"]["seq"], chunk_text(m))
                    for m in second.received
                    if m.get("method") == "session/update"
                ]
            everything = seen + replayed
            seqs = [seq for seq, _ in everything]
            assert seqs == sorted(set(seqs))
            assert [text for _, text in everything] == [f"a:s1:{i}" for i in range(total)]


async def test_resume_over_websocket_takes_over_and_the_first_is_told():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}) as server,
            open_peer(server.port, initialize=False) as first,
            open_peer(server.port) as second,
        ):
            # (It asks for the bridge's diagnostics: a stock client is told nothing extra.)
            init = {"protocolVersion": 1, "_meta": {"acp_bridge": {"log": "info"}}}
            assert "result" in await first.request("initialize", init)
            sid = (await first.request("session/new", NEW_SESSION))["result"]["sessionId"]
            reply = await second.request("session/resume", {**NEW_SESSION, "sessionId": sid})
            assert "result" in reply
            told = await first.next()
            assert told["method"] == "_acp_bridge/log"
            assert "taken over" in told["params"]["data"]["message"]
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "count 2"}]}
            reply = await second.request("session/prompt", prompt)
            assert reply["result"]["stopReason"] == "end_turn"
            texts = [chunk_text(m) for m in second.received if m.get("method") == "session/update"]
            assert texts == ["a:s1:0", "a:s1:1"]


async def test_another_connection_cannot_close_or_delete_a_session_it_does_not_own():
    """The bridge serves session/close and session/delete itself for an agent without them:
    from a connection that does not own the session they are refused (-32002), and the
    owner goes on."""
    agent = FakeAgent("a", capabilities={"sessionCapabilities": {"resume": {}}})
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}) as server,
            open_peer(server.port) as owner,
            open_peer(server.port) as other,
        ):
            sid = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
            for method in ("session/close", "session/delete"):
                refused = await other.request(method, {"sessionId": sid})
                assert refused["error"]["code"] == -32002
                assert "attached elsewhere" in refused["error"]["message"]
            assert server.bridge.hub.sessions.get(sid) is not None
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "count 1"}]}
            reply = await owner.request("session/prompt", prompt)
            assert reply["result"]["stopReason"] == "end_turn"
            assert not [m for m in owner.received if m.get("method") == "_acp_bridge/log"]
