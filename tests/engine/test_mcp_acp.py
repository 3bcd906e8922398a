"""
MCP over ACP in process (docs/protocol.md, "MCP servers over ACP"): fake agents send
``mcp/message`` through a real bridge to a client that serves the server, and to the bridge's
own server; withdrawals, endings and bounds.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import trio

from acp_bridge.mcp.acp import McpRouter
from tests.support.fakes import FakeAgent, connect, open_bridge

if TYPE_CHECKING:
    from tests.support.fakes import TestClient

TIMEOUT = 20
ACP = {"loadSession": True, "mcpCapabilities": {"acp": True}}
HTTP = {"loadSession": True, "mcpCapabilities": {"http": True}}
TOOLS = {"type": "acp", "name": "tools", "serverId": "srv"}
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def servers_of(agent: FakeAgent, n: int = -1) -> list[dict[str, Any]]:
    news = [m for m in agent.received if m.get("method") == "session/new"]
    servers: list[dict[str, Any]] = news[n]["params"]["mcpServers"]
    return servers


def message(server: str, request: str, method: str = "tools/call", **params: Any) -> dict[str, Any]:
    return {"serverId": server, "requestId": request, "method": method, "params": params}


async def serve_one(client: TestClient, *, note: bool = True) -> dict[str, Any]:
    """Answer the next ``mcp/message`` the client is asked: a progress note, then a result."""
    asked = await client.agent_requests.receive()
    assert asked["method"] == "mcp/message"
    params = asked["params"]
    if note:
        progress = message(params["serverId"], params["requestId"], "notifications/progress")
        await client.notify("mcp/message", progress)
    result = {"result": {"content": [{"type": "text", "text": params["requestId"]}]}}
    await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": result})
    return asked


async def test_a_clients_server_is_called_through_the_bridge_under_each_sides_ids():
    fakes = {"a": FakeAgent("a", capabilities=ACP), "b": FakeAgent("b", capabilities=ACP)}
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            await client.new_session(agent="a", mcpServers=[TOOLS])
            await client.new_session(agent="b", mcpServers=[TOOLS])
            tools, own = servers_of(fakes["a"])
            assert tools == TOOLS  # (the client's id: free on a's connection)
            assert own["type"] == "acp"
            assert own["name"] == "acp-bridge"
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_one, client)
                answer = await fakes["a"].call("mcp/message", message("srv", "1"))
            assert answer["result"] == {"result": {"content": [{"type": "text", "text": "1"}]}}
            # Its notification came first, under its own ids; only to it.
            [note] = [m for m in fakes["a"].received if m.get("method") == "mcp/message"]
            assert (note["params"]["serverId"], note["params"]["requestId"]) == ("srv", "1")
            assert not [m for m in fakes["b"].received if m.get("method") == "mcp/message"]
            asked = next(m for m in client.received if m.get("method") == "mcp/message")
            assert asked["id"] != answer["id"]  # (a bridge id toward the client)
            assert bridge.mcp.router.in_flight(bridge.hub.sessions.find("a", "s1").bridge_id) == 0


async def test_a_notification_reaches_only_the_caller_it_names():
    """Two agents ask with the same inner id at once: each gets its own notification."""
    fakes = {"a": FakeAgent("a", capabilities=ACP), "b": FakeAgent("b", capabilities=ACP)}
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session(agent="a", mcpServers=[TOOLS])
            await client.new_session(agent="b", mcpServers=[TOOLS])
            answers: dict[str, Any] = {}

            async def ask(name: str) -> None:
                answers[name] = await fakes[name].call("mcp/message", message("srv", "7"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "a")
                nursery.start_soon(ask, "b")
                first = await client.agent_requests.receive()
                second = await client.agent_requests.receive()
                ids = {first["params"]["requestId"], second["params"]["requestId"]}
                assert ids == {"7", "7~2"}
                # Answered in the other order, a notification for each, each naming its text.
                for asked in (second, first):
                    inner = asked["params"]["requestId"]
                    note = message("srv", inner, "notifications/progress", text=inner)
                    await client.notify("mcp/message", note)
                    result = {"result": {"text": inner}}
                    await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": result})
            for name in ("a", "b"):
                text = answers[name]["result"]["result"]["text"]
                [note] = [m for m in fakes[name].received if m.get("method") == "mcp/message"]
                assert note["params"]["requestId"] == "7"
                assert note["params"]["params"]["text"] == text
            assert {answers[n]["result"]["result"]["text"] for n in ("a", "b")} == {"7", "7~2"}


async def test_a_withdrawn_call_is_answered_at_once_and_cancelled_at_the_client():
    fakes = {"a": FakeAgent("a", capabilities=ACP)}
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session(mcpServers=[TOOLS])
            agent = fakes["a"]
            await agent.write(
                {
                    "jsonrpc": "2.0",
                    "id": 900,
                    "method": "mcp/message",
                    "params": message("srv", "w"),
                }
            )
            asked = await client.agent_requests.receive()
            send, receive = trio.open_memory_channel[dict[str, Any]](1)
            agent._waiting[900] = send
            await agent.write(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 900}}
            )
            withdrawn = await receive.receive()
            assert withdrawn["error"]["code"] == -32800
            cancel = await client.wait_for(lambda m: m.get("method") == "$/cancel_request")
            assert cancel["params"] == {"requestId": asked["id"]}
            # The client's late notification and answer go nowhere; the next call is fine.
            await client.notify("mcp/message", message("srv", "w", "notifications/progress"))
            await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"result": {}}})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_one, client)
                answer = await agent.call("mcp/message", message("srv", "next"))
            assert answer["result"]["result"]["content"][0]["text"] == "next"
            relayed = [m for m in agent.received if m.get("id") == 900 or "method" in m]
            assert [m.get("method") for m in relayed if m.get("method") != "session/new"] == [
                "initialize",
                None,  # (the one answer to 900: the bridge's -32800)
                "mcp/message",  # (the next call's progress note only)
            ]


async def test_what_cannot_be_routed_is_refused_with_the_bindings_codes():
    fakes = {"a": FakeAgent("a", capabilities=ACP)}
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            await client.new_session(mcpServers=[TOOLS])
            agent = fakes["a"]
            unknown = await agent.call("mcp/message", message("nope", "1"))
            assert unknown["error"]["code"] == -33001
            assert unknown["error"]["data"] == {"serverId": "nope"}
            malformed = await agent.call("mcp/message", {"serverId": "srv", "method": "x"})
            assert malformed["error"]["code"] == -32602
            # At the bound, an answer at once: the limit reached.
            bridge.mcp.router = McpRouter(max_per_session=1)
            await client.new_session(mcpServers=[TOOLS])
            [tools] = [s for s in servers_of(agent) if s["name"] == "tools"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent.call, "mcp/message", message(tools["serverId"], "1"))
                await client.agent_requests.receive()  # (the first, in flight)
                over = await agent.call("mcp/message", message(tools["serverId"], "2"))
                assert over["error"]["code"] == -33000
                nursery.cancel_scope.cancel()


async def test_a_client_leaving_fails_the_calls_it_served_and_takes_its_servers():
    fakes = {"a": FakeAgent("a", capabilities=ACP)}
    async with open_bridge(fakes) as (_, bridge):
        with trio.fail_after(TIMEOUT):
            agent = fakes["a"]
            answers: list[dict[str, Any]] = []

            async def ask() -> None:
                answers.append(await agent.call("mcp/message", message("srv", "1")))

            async with trio.open_nursery() as nursery:
                other = await connect(bridge, nursery, name="other")
                await other.new_session(mcpServers=[TOOLS])
                async with trio.open_nursery() as asking:
                    asking.start_soon(ask)
                    await other.agent_requests.receive()
                    await other.disconnect()
                nursery.cancel_scope.cancel()
            [answer] = answers
            assert answer["error"]["code"] == -33002
            gone = await agent.call("mcp/message", message("srv", "2"))
            assert gone["error"]["code"] == -33001


async def test_a_session_closing_ends_the_calls_made_under_its_servers():
    fakes = {"a": FakeAgent("a", capabilities=ACP)}
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            sid = await client.new_session(mcpServers=[TOOLS])
            agent = fakes["a"]
            async with trio.open_nursery() as nursery:
                answers: list[dict[str, Any]] = []

                async def ask() -> None:
                    answers.append(await agent.call("mcp/message", message("srv", "1")))

                nursery.start_soon(ask)
                asked = await client.agent_requests.receive()
                await client.call("session/close", {"sessionId": sid})
            [answer] = answers
            assert answer["error"]["code"] == -32800
            cancel = await client.wait_for(lambda m: m.get("method") == "$/cancel_request")
            assert cancel["params"] == {"requestId": asked["id"]}
            gone = await agent.call("mcp/message", message("srv", "2"))
            assert gone["error"]["code"] == -33001


async def test_an_agent_without_acp_gets_the_server_re_exported_or_not_at_all():
    fakes = {"h": FakeAgent("h", capabilities=HTTP), "p": FakeAgent("p", capabilities={})}
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            init = await client.call("initialize", {"protocolVersion": 1})
            assert init["agentCapabilities"]["mcpCapabilities"] == {"http": True, "acp": True}
            await client.new_session(agent="h", mcpServers=[TOOLS])
            await client.new_session(agent="p", mcpServers=[TOOLS, {"type": "acp", "name": "x"}])
    exported, own = servers_of(fakes["h"])
    assert exported["type"] == "http"
    assert exported["name"] == "tools"
    assert exported["url"].endswith("/mcp/client")
    token = exported["headers"][0]["value"].removeprefix("Bearer ")
    grant = bridge.subagents.endpoint.core.exports.check(token)
    assert grant is not None
    assert grant.session == bridge.hub.sessions.find("h", "s1").bridge_id
    assert own["name"] == "acp-bridge"
    # Neither acp nor http: the client's servers are not passed on (the bridge's own is, stdio).
    [stdio] = servers_of(fakes["p"])
    assert stdio["name"] == "acp-bridge"
    assert "command" in stdio


async def test_the_bridges_own_server_over_acp_runs_the_tools_as_the_session():
    fakes = {"a": FakeAgent("a", capabilities=ACP), "b": FakeAgent("b", prefix="c")}
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            parent = await client.new_session()
            [own] = servers_of(fakes["a"])
            assert set(own) == {"type", "name", "serverId"}  # (no URL, no token)
            agent = fakes["a"]
            listed = await agent.call(
                "mcp/message", message(own["serverId"], "1", "tools/list", _meta=META)
            )
            assert "spawn_agent" in [t["name"] for t in listed["result"]["result"]["tools"]]
            args = {"agent": "b", "prompt": "count 2"}
            spawned = await agent.call(
                "mcp/message",
                message(own["serverId"], "2", name="spawn_agent", arguments=args, _meta=META),
            )
            status = spawned["result"]["result"]["structuredContent"]
            assert status["text"] == "b:c1:0b:c1:1"
            assert bridge.hub.sessions.get(status["child"]).parent == parent
            # A call it withdraws is answered at once and stops waiting (the child runs on).
            args = {"agent": "b", "prompt": "hang"}
            hang = message(own["serverId"], "3", name="spawn_agent", arguments=args, _meta=META)
            receive = await agent.ask(901, "mcp/message", hang)
            await agent.write(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 901}}
            )
            withdrawn = await receive.receive()
            assert withdrawn["error"]["code"] == -32800


# --------------------------------------------------------------------------- the re-export


async def post(entry: dict[str, Any], payload: dict[str, Any], **headers: str) -> trio.SocketStream:
    """POST ``payload`` to a re-exported server's entry; the open connection (to read or drop)."""
    url = entry["url"].removeprefix("http://")
    hostport, _, path = url.partition("/")
    port = int(hostport.rsplit(":", 1)[1])
    body = json.dumps(payload).encode()
    lines = [
        f"POST /{path} HTTP/1.1",
        f"Host: {hostport}",
        f"Authorization: {entry['headers'][0]['value']}",
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        f"Content-Length: {len(body)}",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return stream


async def read_all(stream: trio.SocketStream) -> bytes:
    """Everything the bridge answers on ``stream`` until it closes it; then closed here too."""
    async with stream:
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
        return data


def modern_call(text: str, id: int = 1) -> tuple[dict[str, Any], dict[str, str]]:
    params = {"name": "echo", "arguments": {"text": text}, "_meta": META}
    headers = {"mcp_protocol_version": "2026-07-28", "mcp_method": "tools/call", "mcp_name": "echo"}
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}, headers


async def test_the_re_export_answers_with_events_when_a_notification_comes_first():
    fakes = {"h": FakeAgent("h", capabilities=HTTP)}
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session(mcpServers=[TOOLS])
            entry = servers_of(fakes["h"])[0]
            payload, headers = modern_call("x", id=41)
            stream = await post(entry, payload, **headers)
            asked = await serve_one(client)
            assert asked["params"]["serverId"] == "srv"
            assert asked["params"]["params"]["_meta"] == META
            answer = await read_all(stream)
    head, _, events = answer.partition(b"\r\n\r\n")
    assert b"200 OK" in head
    assert b"text/event-stream" in head
    messages = [json.loads(line[6:]) for line in events.split(b"\n") if line.startswith(b"data: ")]
    note, final = messages
    assert note["method"] == "notifications/progress"
    assert final["id"] == 41
    assert final["result"]["content"][0]["text"] == asked["params"]["requestId"]


async def test_an_http_client_hanging_up_cancels_its_request_at_the_client():
    fakes = {"h": FakeAgent("h", capabilities=HTTP)}
    async with open_bridge(fakes) as (client, bridge):
        with trio.fail_after(TIMEOUT):
            await client.new_session(mcpServers=[TOOLS])
            entry = servers_of(fakes["h"])[0]
            payload, headers = modern_call("y")
            stream = await post(entry, payload, **headers)
            asked = await client.agent_requests.receive()
            await stream.aclose()
            cancel = await client.wait_for(lambda m: m.get("method") == "$/cancel_request")
            assert cancel["params"] == {"requestId": asked["id"]}
            # Its late answer goes nowhere; nothing stays in flight.
            await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"result": {}}})
            session = bridge.hub.sessions.find("h", "s1")
            assert bridge.mcp.router.in_flight(session.bridge_id) == 0


async def test_a_handshake_client_of_the_re_export_is_translated_and_may_cancel():
    fakes = {"h": FakeAgent("h", capabilities=HTTP)}
    async with open_bridge(fakes) as (client, _):
        with trio.fail_after(TIMEOUT):
            await client.new_session(mcpServers=[TOOLS])
            entry = servers_of(fakes["h"])[0]
            init = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {"roots": {}}},
            }
            stream = await post(entry, init)
            discover = await client.agent_requests.receive()
            assert discover["params"]["method"] == "server/discover"
            found = {"capabilities": {"tools": {}}, "supportedVersions": ["2026-07-28"]}
            await client.send({"jsonrpc": "2.0", "id": discover["id"], "result": {"result": found}})
            answer = await read_all(stream)
            result = json.loads(answer.partition(b"\r\n\r\n")[2])["result"]
            assert result["protocolVersion"] == "2025-06-18"
            assert result["capabilities"] == {"tools": {}}
            # A request of its: the envelope added, the capabilities its initialize named.
            call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "echo"}}
            stream = await post(entry, call, mcp_protocol_version="2025-06-18")
            asked = await client.agent_requests.receive()
            meta = asked["params"]["params"]["_meta"]
            assert meta["io.modelcontextprotocol/clientCapabilities"] == {"roots": {}}
            cancelled = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 9},
            }
            accepted = await read_all(
                await post(entry, cancelled, mcp_protocol_version="2025-06-18")
            )
            assert b"202 Accepted" in accepted
            cancel = await client.wait_for(lambda m: m.get("method") == "$/cancel_request")
            assert cancel["params"] == {"requestId": asked["id"]}
            assert b"200 OK" not in await read_all(stream)  # (nothing answers a cancelled one)
