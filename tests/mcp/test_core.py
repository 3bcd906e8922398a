"""The MCP server's decisions (_mcp_core, _mcp_tools): tokens, heads, messages, arguments."""

from __future__ import annotations

import functools
import json

import orjson
import pytest

from acp_bridge.http.wire import RequestHead, Response
from acp_bridge.mcp.core import (
    MAX_BODY_BYTES,
    MAX_CALLS_PER_SESSION,
    MAX_SESSIONS_PER_TOKEN,
    Admit,
    Cancel,
    McpCore,
    Run,
    TokenRegistry,
)
from acp_bridge.mcp.tools import ALL_TOOLS, check_arguments, tool_definitions

PORT = 4321
TOOLS = tool_definitions(max_wait_ms=60_000)


def head(token: str | None = None, **extra: str) -> list[tuple[str, str]]:
    headers = [("host", f"127.0.0.1:{PORT}"), ("content-type", "application/json")]
    if token is not None:
        headers.append(("authorization", f"Bearer {token}"))
    headers += [(k.replace("_", "-").lower(), v) for k, v in extra.items()]
    return headers


def body(method: str, id: object = 1, **params: object) -> bytes:
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id is not None:
        message["id"] = id
    return orjson.dumps(message)


def judge(
    core: McpCore, method: str, target: str, headers: list[tuple[str, str]], *, port: int | set[int]
) -> Admit | Response:
    """A head as the endpoint judges it: the site's checks (Host, Origin, path, method, token),
    then the endpoint's own (content type, length)."""
    head = RequestHead(method, target, "1.1", tuple(headers))
    hosts = core.hosts({port} if isinstance(port, int) else port)
    verdict = core.site("post", "delete", "export").judge(head, now=0.0, hosts=hosts)
    if isinstance(verdict, Response):
        return verdict
    return core.admit(head, verdict.principal)  # type: ignore[arg-type]


class Harness:
    def __init__(self) -> None:
        self.tokens = TokenRegistry()
        self.core = McpCore(self.tokens, TOOLS, server_version="0")

    def admit(self, token: str, session_id: str | None = None, **extra: str) -> Admit:
        if session_id is not None:
            extra["mcp_session_id"] = session_id
        verdict = judge(self.core, "POST", "/mcp", head(token, **extra), port=PORT)
        assert isinstance(verdict, Admit), verdict
        return verdict

    def initialize(self, token: str) -> str:
        answer = self.core.post(self.admit(token), body("initialize", protocolVersion="2025-06-18"))
        assert isinstance(answer, Response)
        assert answer.status == 200
        assert json.loads(answer.body)["result"]["protocolVersion"] == "2025-06-18"
        return dict(answer.headers)["Mcp-Session-Id"]

    def post(self, token: str, session_id: str | None, data: bytes) -> Response | Run | Cancel:
        return self.core.post(self.admit(token, session_id), data)


def rpc(answer: object) -> dict[str, object]:
    assert isinstance(answer, Response)
    return json.loads(answer.body)


# --------------------------------------------------------------------------- tokens


def test_a_token_is_pending_until_bound_then_names_its_session_until_revoked():
    tokens = TokenRegistry()
    token = tokens.mint()
    grant = tokens.check(token)
    assert grant is not None
    assert grant.session is None
    tokens.bind(token, "s1")
    assert tokens.check(token) is grant
    assert grant.session == "s1"
    with pytest.raises(ValueError, match="already bound"):
        tokens.bind(token, "s2")  # never moved to another session
    assert tokens.revoke(token) is grant
    assert tokens.check(token) is None
    with pytest.raises(KeyError):
        tokens.bind(token, "s1")


def test_tokens_are_distinct_long_and_checked_whole():
    tokens = TokenRegistry()
    a, b = tokens.mint(), tokens.mint()
    assert a != b
    assert len(a) >= 43  # 256 bits, URL-safe
    assert tokens.check(a[:-1]) is None
    assert tokens.check(a + "x") is None
    assert tokens.check("") is None


def test_revoking_a_session_revokes_only_its_tokens():
    tokens = TokenRegistry()
    a, b, c = tokens.mint(), tokens.mint(), tokens.mint()
    tokens.bind(a, "s1")
    tokens.bind(b, "s1")
    tokens.bind(c, "s2")
    assert len(tokens.revoke_session("s1")) == 2
    assert tokens.check(a) is None
    assert tokens.check(b) is None
    assert tokens.check(c) is not None


def test_minting_is_bounded_and_names_only_known_tools():
    tokens = TokenRegistry(max_tokens=2)
    tokens.mint()
    tokens.mint(["list_agents"])
    with pytest.raises(OverflowError):
        tokens.mint()
    with pytest.raises(ValueError, match="unknown tools"):
        TokenRegistry().mint(["rm_rf"])


# --------------------------------------------------------------------------- heads


@pytest.mark.parametrize(
    ("method", "target", "headers", "status"),
    [
        ("POST", "/mcp", [("host", "evil.example:4321")], 403),
        ("POST", "/mcp", [("host", "127.0.0.1:1")], 403),
        ("POST", "/mcp", [("origin", "http://127.0.0.1:4321")], 403),
        ("POST", "/other", [], 404),
        ("GET", "/mcp", [], 405),
        ("POST", "/mcp", [("authorization", None)], 401),
        ("POST", "/mcp", [("authorization", "Bearer nope")], 401),
        ("POST", "/mcp", [("authorization", "Basic TOKEN")], 401),
        ("POST", "/mcp", [("content-type", "text/plain")], 415),
        ("POST", "/mcp", [("content-length", str(MAX_BODY_BYTES + 1))], 413),
    ],
)
def test_a_head_is_refused_with_the_reason(method, target, headers, status):
    harness = Harness()
    token = harness.tokens.mint()
    base = dict(head(token))
    for name, value in headers:
        if value is None:
            base.pop(name)
        else:
            base[name] = value.replace("TOKEN", token)
    verdict = judge(harness.core, method, target, list(base.items()), port=PORT)
    assert isinstance(verdict, Response)
    assert verdict.status == status
    if status == 401:
        assert "WWW-Authenticate" in dict(verdict.headers)


def test_a_good_head_is_admitted_with_its_grant():
    harness = Harness()
    token = harness.tokens.mint()
    for host in (f"localhost:{PORT}", f"[::1]:{PORT}", f"127.0.0.1:{PORT}"):
        headers = [("host", host), *head(token)[1:]]
        verdict = judge(harness.core, "POST", "/mcp?x=1", headers, port=PORT)
        assert isinstance(verdict, Admit)
        assert verdict.grant is harness.tokens.check(token)


def test_host_may_name_any_port_of_the_allowed_set_and_no_other():
    """ssh agents reach the listener through forwarded ports: each is a Host the judge takes."""
    harness = Harness()
    token = harness.tokens.mint()
    allowed = {PORT, 61234, 65000}
    for port in sorted(allowed):
        for name in ("127.0.0.1", "localhost", "[::1]"):
            headers = [("host", f"{name}:{port}"), *head(token)[1:]]
            verdict = judge(harness.core, "POST", "/mcp", headers, port=allowed)
            assert isinstance(verdict, Admit), (name, port)
    for host in ("127.0.0.1:61235", "127.0.0.1", "evil.example:61234", "127.0.0.1:61234x"):
        headers = [("host", host), *head(token)[1:]]
        verdict = judge(harness.core, "POST", "/mcp", headers, port=allowed)
        assert isinstance(verdict, Response), host
        assert verdict.status == 403
    # A single port is the set of one: a forwarded port is not taken unless given.
    headers = [("host", "127.0.0.1:61234"), *head(token)[1:]]
    assert isinstance(judge(harness.core, "POST", "/mcp", headers, port=PORT), Response)


# --------------------------------------------------------------------------- messages


def test_initialize_answers_a_known_version_or_our_newest_and_a_session_id():
    harness = Harness()
    token = harness.tokens.mint()
    sid = harness.initialize(token)
    assert len(sid) == 32
    answer = harness.core.post(
        harness.admit(token), body("initialize", protocolVersion="1999-01-01")
    )
    result = rpc(answer)["result"]
    assert result["protocolVersion"] == "2025-11-25"
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "acp-bridge"


def test_a_request_needs_the_session_of_its_own_token():
    harness = Harness()
    mine, theirs = harness.tokens.mint(), harness.tokens.mint()
    sid = harness.initialize(mine)
    missing = harness.post(mine, None, body("tools/list"))
    assert isinstance(missing, Response)
    assert missing.status == 400
    assert "Mcp-Session-Id" in rpc(missing)["error"]["message"]
    stolen = harness.post(theirs, sid, body("tools/list"))  # another token's session
    assert isinstance(stolen, Response)
    assert stolen.status == 404
    made_up = harness.post(mine, "0" * 32, body("tools/list"))
    assert isinstance(made_up, Response)
    assert made_up.status == 404
    assert "tools" in rpc(harness.post(mine, sid, body("tools/list")))["result"]


def test_unknown_methods_and_bad_messages_are_json_rpc_errors():
    harness = Harness()
    token = harness.tokens.mint()
    sid = harness.initialize(token)
    # the 2026 clients' probe, before any session: -32601 tells them to initialize
    assert rpc(harness.post(token, None, body("server/discover")))["error"]["code"] == -32601
    assert rpc(harness.post(token, sid, b"{not json"))["error"]["code"] == -32700
    batch = harness.post(token, sid, b"[" + body("ping") + b"]")
    assert rpc(batch)["error"]["message"] == "batches are not supported"
    assert rpc(harness.post(token, sid, body("ping", id=True)))["error"]["code"] == -32600
    assert rpc(harness.post(token, sid, body("ping", id=1.5)))["error"]["code"] == -32600
    assert rpc(harness.post(token, sid, body("ping")))["result"] == {}
    bad_version = harness.post(token, sid, body("ping"))
    assert rpc(bad_version)["result"] == {}
    answer = harness.core.post(
        harness.admit(token, sid, mcp_protocol_version="1999-01-01"), body("ping")
    )
    assert isinstance(answer, Response)
    assert answer.status == 400
    note = harness.post(token, sid, body("notifications/initialized", id=None))
    assert note == Response(202)


def test_tools_list_offers_the_tokens_tools_with_schemas():
    harness = Harness()
    full = harness.tokens.mint()
    leaf = harness.tokens.mint([t for t in ALL_TOOLS if t != "spawn_agent"])  # at max depth
    listed = rpc(harness.post(full, harness.initialize(full), body("tools/list")))["result"]
    assert [t["name"] for t in listed["tools"]] == list(ALL_TOOLS)
    for tool in listed["tools"]:
        assert tool["inputSchema"]["type"] == "object"
        assert tool["description"]
    listed = rpc(harness.post(leaf, harness.initialize(leaf), body("tools/list")))["result"]
    assert "spawn_agent" not in [t["name"] for t in listed["tools"]]
    call = harness.post(
        leaf, harness.initialize(leaf), body("tools/call", name="spawn_agent", arguments={})
    )
    assert rpc(call)["error"]["code"] == -32602


def test_a_call_runs_as_the_bound_session_and_is_refused_while_pending():
    harness = Harness()
    token = harness.tokens.mint()
    sid = harness.initialize(token)  # an agent may initialize before session/new answers
    args = {"agent": "demo", "prompt": "hi"}
    pending = rpc(harness.post(token, sid, body("tools/call", name="spawn_agent", arguments=args)))
    assert pending["result"]["isError"] is True
    assert "still being set up" in pending["result"]["content"][0]["text"]
    harness.tokens.bind(token, "parent-1")
    run = harness.post(token, sid, body("tools/call", id=7, name="spawn_agent", arguments=args))
    assert isinstance(run, Run)
    assert run.caller == "parent-1"
    assert run.call.arguments == args
    again = harness.post(token, sid, body("tools/call", id=7, name="spawn_agent", arguments=args))
    assert rpc(again)["error"]["message"] == "a call with this id is in flight"
    cancel = harness.post(token, sid, body("notifications/cancelled", id=None, requestId=7))
    assert cancel == Cancel(run.session, 7)
    answer = harness.core.finish(run, {"content": [], "structuredContent": {}})
    assert rpc(answer)["id"] == 7
    assert run.session.in_flight == set()


def test_calls_in_flight_per_session_are_bounded():
    harness = Harness()
    token = harness.tokens.mint()
    harness.tokens.bind(token, "s")
    sid = harness.initialize(token)
    for i in range(MAX_CALLS_PER_SESSION):
        assert isinstance(
            harness.post(token, sid, body("tools/call", id=i, name="list_agents")), Run
        )
    over = rpc(harness.post(token, sid, body("tools/call", id=-1, name="list_agents")))
    assert over["result"]["isError"] is True
    assert "in flight" in over["result"]["content"][0]["text"]


def test_mcp_sessions_per_token_are_bounded_dropping_the_least_recent_idle_one():
    harness = Harness()
    token = harness.tokens.mint()
    harness.tokens.bind(token, "s")
    sids = [harness.initialize(token) for _ in range(MAX_SESSIONS_PER_TOKEN)]
    busy = harness.post(token, sids[0], body("tools/call", name="list_agents"))
    assert isinstance(busy, Run)
    harness.post(token, sids[1], body("ping"))  # used: sids[2] is now the least recent
    harness.initialize(token)
    assert harness.core.session_count == MAX_SESSIONS_PER_TOKEN
    assert harness.post(token, sids[2], body("ping")) == harness.post(token, "gone", body("ping"))
    assert rpc(harness.post(token, sids[0], body("ping")))["result"] == {}


def test_delete_ends_a_session_of_its_own_token_only():
    harness = Harness()
    mine, theirs = harness.tokens.mint(), harness.tokens.mint()
    sid = harness.initialize(mine)
    head_of = functools.partial(judge, harness.core)
    other = head_of("DELETE", "/mcp", head(theirs, mcp_session_id=sid), port=PORT)
    assert isinstance(other, Admit)
    assert harness.core.delete(other)[0].status == 404
    own = head_of("DELETE", "/mcp", head(mine, mcp_session_id=sid), port=PORT)
    assert isinstance(own, Admit)
    answer, session = harness.core.delete(own)
    assert answer.status == 200
    assert session is not None
    assert harness.post(mine, sid, body("ping")).status == 404  # type: ignore[union-attr]


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("spawn_agent", {}, "spawn_agent: agent: missing (required); prompt: missing (required)"),
        ("spawn_agent", {"agent": 3, "prompt": "x"}, "agent: expected a string, got a number"),
        ("spawn_agent", {"agent": "a", "prompt": ""}, "prompt: must not be empty"),
        ("spawn_agent", {"agent": "a", "prompt": "x", "wait": "yes"}, "wait: expected a boolean"),
        (
            "spawn_agent",
            {"agent": "a", "prompt": "x", "cwd": "rel/dir"},
            "cwd: must be an absolute",
        ),
        ("spawn_agent", {"agent": "a", "prompt": "x", "model": "m"}, "model: unknown argument"),
        ("spawn_agent", {"agent": "a" * 257, "prompt": "x"}, "agent: longer than 256 characters"),
        ("spawn_agent", ["a"], "spawn_agent: arguments: expected an object, got an array"),
        ("prompt_agent", {"child": None, "prompt": "x"}, "child: expected a string, got null"),
        ("wait_agents", {"timeout_ms": -1}, "timeout_ms: must be at least 0"),
        ("wait_agents", {"timeout_ms": 60_001}, "timeout_ms: must be at most 60000"),
        ("wait_agents", {"timeout_ms": 1.5}, "timeout_ms: expected an integer, got a number"),
        ("wait_agents", {"timeout_ms": True}, "timeout_ms: expected an integer, got a boolean"),
        ("wait_agents", {"children": "c1"}, "children: expected an array, got a string"),
        ("wait_agents", {"children": ["c1", 2]}, "children[1]: expected a string"),
        ("wait_agents", {"children": ["c1", "c1"]}, "children: names a child twice"),
        ("wait_agents", {"children": ["c"] * 257}, "children: more than 256 items"),
        ("cancel_agent", {"child": ""}, "child: must not be empty"),
        ("close_agent", {"child": "c", "force": 1}, "force: unknown argument"),
    ],
)
def test_bad_arguments_say_what_is_wrong(tool, arguments, message):
    checked = check_arguments(TOOLS, tool, arguments)
    assert isinstance(checked, str)
    assert message in checked
    assert checked.startswith(f"{tool}: ")


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("list_agents", None),
        ("list_agents", {}),
        ("spawn_agent", {"agent": "a", "prompt": "x", "cwd": "/w", "wait": False}),
        ("prompt_agent", {"child": "c", "prompt": "x"}),
        ("wait_agents", {"children": ["a", "b"], "timeout_ms": 3.0}),
        ("wait_agents", {"timeout_ms": 0}),
        ("cancel_agent", {"child": "c"}),
        ("close_agent", {"child": "c"}),
    ],
)
def test_good_arguments_pass(tool, arguments):
    checked = check_arguments(TOOLS, tool, arguments)
    assert not isinstance(checked, str), checked
    assert checked.tool == tool


def test_every_schema_forbids_unknown_arguments_and_requires_what_the_docs_require():
    required = {
        "list_agents": [],
        "spawn_agent": ["agent", "prompt"],
        "prompt_agent": ["child", "prompt"],
        "wait_agents": [],
        "cancel_agent": ["child"],
        "close_agent": ["child"],
    }
    assert list(TOOLS) == list(ALL_TOOLS)
    for name, tool in TOOLS.items():
        assert tool["inputSchema"]["additionalProperties"] is False
        assert tool["inputSchema"]["required"] == required[name]
        assert tool["outputSchema"]["type"] == "object"
