"""MCP over ACP's routing core (mcp.acp), without trio: server ids, calls, notifications."""

from __future__ import annotations

import pytest

from acp_bridge.mcp.acp import (
    RESOURCE_LIMIT,
    SERVER_UNAVAILABLE,
    Envelope,
    McpRouter,
    acp_flavour,
    is_acp_server,
    read_envelope,
)
from acp_bridge.protocol.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, JsonRpcError


class Link:
    """An opaque link (compared by identity, as the router compares them)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def envelope(server: str, request: str = "r1", method: str = "tools/call") -> Envelope:
    return Envelope(server, request, method, {"name": "echo"})


def refused(router: McpRouter, agent: Link, caller_id: int, env: Envelope) -> JsonRpcError:
    with pytest.raises(JsonRpcError) as caught:
        router.admit(agent, caller_id, env)
    return caught.value


# --------------------------------------------------------------------------- server ids


def test_a_declaration_keeps_the_clients_id_unless_the_agents_connection_has_it():
    router = McpRouter()
    agent, other = Link("agent"), Link("other")
    c1, c2 = Link("c1"), Link("c2")
    assert router.declare(agent, c1, "tools", session="s1") == "tools"
    # Another client's server of the same id, on the same agent connection: made unique.
    assert router.declare(agent, c2, "tools", session="s2") == "tools~2"
    assert router.declare(agent, c2, "tools", session="s3") == "tools~3"
    # Another agent's connection has its own ids.
    assert router.declare(other, c2, "tools", session="s4") == "tools"
    route = router.route(agent, "tools~2")
    assert route is not None
    assert (route.provider, route.provider_id, route.session) == (c2, "tools", "s2")


def test_the_bridges_own_server_gets_a_minted_id_a_client_cannot_take_from_it():
    router = McpRouter()
    agent, client = Link("agent"), Link("client")
    own = router.declare(agent, None, "", session="s1", grant="token")
    assert own.startswith("acp-bridge:")
    assert router.declare(agent, None, "", session="s2", grant="t2") != own
    # A client that names its server like ours gets another id on this connection.
    assert router.declare(agent, client, own, session="s1") == f"{own}~2"
    route = router.route(agent, own)
    assert route is not None
    assert (route.provider, route.provider_id, route.grant) == (None, own, "token")


def test_an_offers_declarations_bind_to_its_session_or_go_with_it():
    router = McpRouter()
    agent, client = Link("agent"), Link("client")
    opened, failed = object(), object()
    router.declare(agent, client, "a", offer=opened)
    router.declare(agent, client, "b", offer=failed)
    router.bind(agent, opened, "s1", replace=False)
    router.drop_offer(agent, failed)
    assert [(r.server_id, r.session, r.offer) for r in router.routes(agent)] == [("a", "s1", None)]


def test_a_load_replaces_the_sessions_earlier_declarations():
    router = McpRouter()
    agent, client, later = Link("agent"), Link("client"), Link("later")
    router.declare(agent, client, "tools", session="s1")
    router.declare(agent, client, "kept", session="s2")
    offer = object()
    assert router.declare(agent, later, "tools", offer=offer) == "tools~2"
    router.bind(agent, offer, "s1", replace=True)
    routes = {r.server_id: (r.provider, r.session) for r in router.routes(agent)}
    assert routes == {"kept": (client, "s2"), "tools~2": (later, "s1")}


# --------------------------------------------------------------------------- calls


def test_a_call_goes_to_its_provider_and_its_answer_back_to_its_caller():
    router = McpRouter()
    agent, client = Link("agent"), Link("client")
    server = router.declare(agent, client, "tools", session="s1")
    call = router.admit(agent, 7, envelope(server, "r1"))
    assert (call.provider, call.provider_id, call.request_id) == (client, "tools", "r1")
    assert (call.caller, call.caller_id, call.owner) == (agent, 7, "s1")
    router.sent(call, 1001)
    assert router.in_flight("s1") == 1
    assert router.belongs(client, "tools", "r1") is call
    assert router.answered(Link("another client"), 1001) is None
    assert router.answered(client, "1001") is None  # (the bridge's ids are integers)
    assert router.answered(client, 1001) is call
    assert router.answered(client, 1001) is None
    assert router.belongs(client, "tools", "r1") is None
    assert router.in_flight("s1") == 0


def test_two_callers_with_one_inner_id_are_told_apart_at_the_client():
    """
    Two agents (or one agent's two sessions) count from 1 at the same client server: the
    client sees distinct ids; each notification reaches the caller whose request it names,
    under that caller's own ids.
    """
    router = McpRouter()
    a, b, client = Link("a"), Link("b"), Link("client")
    server_a = router.declare(a, client, "tools", session="sa")
    server_b = router.declare(b, client, "tools", session="sb")
    first = router.admit(a, 1, envelope(server_a, "1"))
    second = router.admit(b, 1, envelope(server_b, "1"))
    assert (first.request_id, second.request_id) == ("1", "1~2")
    assert router.belongs(client, "tools", "1~2") is second
    assert (second.caller, second.caller_server_id, second.caller_request_id) == (b, "tools", "1")
    # Once the first ended, its id is free at the client again.
    router.end(first)
    third = router.admit(a, 2, envelope(server_a, "1"))
    assert third.request_id == "1"


def test_a_caller_may_not_repeat_an_id_in_flight():
    router = McpRouter()
    agent, other, client = Link("agent"), Link("other"), Link("client")
    server = router.declare(agent, client, "tools", session="s1")
    other_server = router.declare(other, client, "tools", session="s2")
    router.admit(other, 1, envelope(other_server, "r"))
    router.admit(agent, 1, envelope(server, "r"))  # (rewritten at the client: "r~2")
    assert refused(router, agent, 1, envelope(server, "x")).code == INVALID_REQUEST
    # The same inner request again, while its first (rewritten) is active: refused, not
    # rewritten once more.
    duplicate = refused(router, agent, 2, envelope(server, "r"))
    assert duplicate.code == INVALID_PARAMS
    assert duplicate.data == {"serverId": "tools", "requestId": "r"}


def test_an_unknown_server_is_unavailable():
    router = McpRouter()
    agent, client = Link("agent"), Link("client")
    router.declare(Link("other agent"), client, "tools", session="s1")
    error = refused(router, agent, 1, envelope("tools"))
    assert error.code == SERVER_UNAVAILABLE
    assert error.data == {"serverId": "tools"}


def test_a_sessions_calls_are_bounded_and_counted_from_its_offer_on():
    router = McpRouter(max_per_session=2)
    agent, client = Link("agent"), Link("client")
    offer = object()
    server = router.declare(agent, client, "tools", offer=offer)
    first = router.admit(agent, 1, envelope(server, "1"))
    router.admit(agent, 2, envelope(server, "2"))
    error = refused(router, agent, 3, envelope(server, "3"))
    assert error.code == RESOURCE_LIMIT
    assert error.data == {"serverId": "tools", "limit": 2}
    # Bound to its session: the calls in flight count there now.
    router.bind(agent, offer, "s1", replace=False)
    assert (router.in_flight(offer), router.in_flight("s1")) == (0, 2)
    assert first.owner == "s1"
    router.withdrawn(agent, 1)
    assert router.admit(agent, 3, envelope(server, "3")).owner == "s1"


def test_a_withdrawn_call_ends_once_and_its_notifications_go_nowhere():
    router = McpRouter()
    agent, client = Link("agent"), Link("client")
    server = router.declare(agent, client, "tools", session="s1")
    call = router.admit(agent, 5, envelope(server, "r"))
    router.sent(call, 9)
    assert router.withdrawn(agent, 5) is call
    assert router.withdrawn(agent, 5) is None
    assert router.belongs(client, "tools", "r") is None
    assert router.answered(client, 9) is None  # (the client's late answer: not relayed)
    assert router.end(call) is False


def test_a_call_of_the_bridges_own_server_has_no_provider():
    router = McpRouter()
    agent = Link("agent")
    server = router.declare(agent, None, "", session="s1", grant="token")
    call = router.admit(agent, 1, envelope(server))
    assert (call.provider, call.outer_id, call.request_id) == (None, None, "r1")
    assert router.in_flight("s1") == 1
    assert router.end(call) is True
    assert router.end(call) is False
    assert router.in_flight("s1") == 0


def test_the_bridges_own_calls_at_a_client_get_ids_free_there():
    router = McpRouter()
    agent, client = Link("agent"), Link("client")
    server = router.declare(agent, client, "tools", session="s1")
    mine = router.bridge_call(client, "tools", "s1")
    # An agent that happens to choose the bridge's id is told apart too.
    theirs = router.admit(agent, 1, envelope(server, mine.request_id))
    assert theirs.request_id == f"{mine.request_id}~2"
    assert mine.caller is None
    assert router.bridge_call(client, "tools", "s1").request_id != mine.request_id


# --------------------------------------------------------------------------- endings


def test_a_session_leaving_ends_its_calls_and_its_servers():
    router = McpRouter()
    agent, client = Link("agent"), Link("client")
    gone = router.declare(agent, client, "gone", session="s1")
    kept = router.declare(agent, client, "kept", session="s2")
    ending = router.admit(agent, 1, envelope(gone))
    staying = router.admit(agent, 2, envelope(kept))
    assert router.drop_session("s1") == [ending]
    assert [r.server_id for r in router.routes(agent)] == ["kept"]
    assert router.withdrawn(agent, 1) is None
    assert router.withdrawn(agent, 2) is staying


def test_an_agent_ending_forgets_its_connection():
    router = McpRouter()
    agent, other, client = Link("agent"), Link("other"), Link("client")
    server = router.declare(agent, client, "tools", session="s1")
    other_server = router.declare(other, client, "tools", session="s2")
    mine = router.admit(agent, 1, envelope(server))
    theirs = router.admit(other, 1, envelope(other_server))
    assert router.drop_agent(agent) == [mine]
    assert router.routes(agent) == []
    assert router.belongs(client, "tools", theirs.request_id) is theirs


def test_a_client_leaving_takes_its_servers_from_every_agent():
    router = McpRouter()
    a, b, gone, staying = Link("a"), Link("b"), Link("gone"), Link("staying")
    server_a = router.declare(a, gone, "tools", session="s1")
    router.declare(b, gone, "tools", session="s2")
    kept = router.declare(b, staying, "tools", session="s2")
    call = router.admit(a, 1, envelope(server_a))
    mine = router.bridge_call(gone, "tools", "s2")
    assert set(map(id, router.drop_provider(gone))) == {id(call), id(mine)}
    assert router.routes(a) == []
    assert [r.server_id for r in router.routes(b)] == [kept]


# --------------------------------------------------------------------------- the envelope


def test_an_envelope_is_read_or_refused_with_what_is_wrong():
    params = {"serverId": "s", "requestId": "r", "method": "tools/call", "params": None}
    assert read_envelope(params) == Envelope("s", "r", "tools/call", None)
    with pytest.raises(JsonRpcError) as caught:
        read_envelope({"serverId": 1, "method": "m", "params": []})
    assert caught.value.code == INVALID_PARAMS
    assert "serverId, requestId, params" in caught.value.message


def test_how_an_agent_takes_a_clients_server():
    assert acp_flavour({"mcpCapabilities": {"acp": True, "http": True}}, reaches_loopback=False)
    assert acp_flavour({"mcpCapabilities": {"http": True}}, reaches_loopback=True) == "http"
    assert acp_flavour({"mcpCapabilities": {"http": True}}, reaches_loopback=False) is None
    assert acp_flavour({"mcpCapabilities": "acp"}, reaches_loopback=True) is None
    assert is_acp_server({"type": "acp", "name": "n", "serverId": "s"})
    assert not is_acp_server({"type": "acp", "name": "n"})
    assert not is_acp_server({"type": "http", "name": "n", "serverId": "s"})
