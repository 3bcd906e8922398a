"""
MCP 2026-07-28 (mcp.modern), without trio: the bridge's own server over ACP (through
``McpCore.acp_message``) and the checks and answers of a client's server re-exported over HTTP.
"""

from __future__ import annotations

import base64

import orjson
import pytest

from acp_bridge.http.wire import RequestHead, Response
from acp_bridge.mcp import modern
from acp_bridge.mcp.core import McpCore, Run, TokenRegistry
from acp_bridge.mcp.tools import ALL_TOOLS, tool_definitions

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def core_and_grant(*, bound: bool = True, tools: tuple[str, ...] = ALL_TOOLS) -> tuple:
    tokens = TokenRegistry()
    core = McpCore(tokens, tool_definitions(max_wait_ms=1000), server_version="9")
    token = tokens.mint(tools)
    if bound:
        tokens.bind(token, "s1")
    grant = tokens.check(token)
    assert grant is not None
    return core, grant


# --------------------------------------------------------------------------- over ACP


def test_discover_and_list_answer_as_the_revision_has_them():
    core, grant = core_and_grant(tools=("list_agents", "wait_agents"))
    discover = core.acp_message(grant, "server/discover", {"_meta": META})
    assert discover == {
        "result": {
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {"listChanged": False}},
            "cacheScope": "private",
            "ttlMs": 0,
            "resultType": "complete",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "acp-bridge", "version": "9"}},
        }
    }
    listed = core.acp_message(grant, "tools/list", {"_meta": META})
    assert isinstance(listed, dict)
    assert [t["name"] for t in listed["result"]["tools"]] == ["list_agents", "wait_agents"]
    assert listed["result"]["resultType"] == "complete"


@pytest.mark.parametrize(
    ("meta", "code"),
    [
        (None, -32602),
        ({"io.modelcontextprotocol/clientCapabilities": {}}, -32602),
        ({**META, "io.modelcontextprotocol/protocolVersion": "2025-11-25"}, -32022),
        ({"io.modelcontextprotocol/protocolVersion": "2026-07-28"}, -32602),
    ],
)
def test_a_request_without_the_revisions_envelope_is_an_inner_error(meta, code):
    core, grant = core_and_grant()
    params = {} if meta is None else {"_meta": meta}
    outcome = core.acp_message(grant, "tools/list", params)
    assert isinstance(outcome, dict)
    assert outcome["error"]["code"] == code
    if code == -32022:
        assert outcome["error"]["data"] == {"supported": ["2026-07-28"], "requested": "2025-11-25"}


def test_a_tool_call_runs_as_the_grants_session_or_is_refused():
    core, grant = core_and_grant()
    run = core.acp_message(grant, "tools/call", {"name": "list_agents", "_meta": META})
    assert isinstance(run, Run)
    assert (run.session, run.caller, run.call.tool) == (None, "s1", "list_agents")
    bad = core.acp_message(grant, "tools/call", {"name": "spawn_agent", "arguments": {}})
    assert isinstance(bad, dict)
    assert bad["error"]["code"] == -32602  # (no envelope: before anything else)
    bad = core.acp_message(
        grant, "tools/call", {"name": "spawn_agent", "arguments": {}, "_meta": META}
    )
    assert isinstance(bad, dict)
    assert bad["result"]["isError"] is True
    assert bad["result"]["resultType"] == "complete"
    unknown = core.acp_message(grant, "tools/call", {"name": "nope", "_meta": META})
    assert unknown == {"error": {"code": -32602, "message": "unknown tool: 'nope'"}}
    other = core.acp_message(grant, "ping", {"_meta": META})
    assert isinstance(other, dict)
    assert other["error"]["code"] == -32601


def test_a_call_under_a_token_still_pending_is_told_to_try_again():
    core, grant = core_and_grant(bound=False)
    outcome = core.acp_message(grant, "tools/call", {"name": "list_agents", "_meta": META})
    assert isinstance(outcome, dict)
    assert "still being set up" in outcome["result"]["content"][0]["text"]


# --------------------------------------------------------------------------- re-export: heads


def export_head(**extra: str) -> RequestHead:
    headers = {
        "host": "127.0.0.1:1",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "content-length": "2",
        **{k.replace("_", "-"): v for k, v in extra.items()},
    }
    return RequestHead("POST", "/mcp/client", "1.1", tuple(headers.items()))


def refusal(response: Response | None) -> tuple[int, int]:
    assert isinstance(response, Response)
    return response.status, orjson.loads(response.body)["error"]["code"]


def test_a_re_exported_post_must_take_json_and_events_and_send_json():
    assert modern.export_head(export_head()) is None
    assert refusal(modern.export_head(export_head(accept="application/json"))) == (406, -32600)
    assert refusal(modern.export_head(export_head(content_type="text/plain"))) == (415, -32600)
    twice = export_head()
    twice = RequestHead(
        "POST", "/", "1.1", (*twice.headers, ("mcp-method", "a"), ("mcp-method", "b"))
    )
    assert refusal(modern.export_head(twice)) == (400, -32020)


# --------------------------------------------------------------------------- re-export: bodies


def post(method: str = "tools/call", *, id: object = 1, **params: object) -> bytes:
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id is not None:
        message["id"] = id
    return orjson.dumps(message)


def routed(method: str = "tools/call", name: str | None = "echo", **extra: str) -> RequestHead:
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    if name is not None:
        headers["mcp-name"] = name
    return export_head(**{**headers, **extra})


def test_a_request_of_the_revision_passes():
    request = modern.export_request(post(name="echo", _meta=META), routed())
    assert request == modern.ExportRequest(1, "tools/call", {"name": "echo", "_meta": META})
    # A name may be mirrored in the base64 form.
    b64 = "=?base64?" + base64.b64encode(b"echo").decode() + "?="
    assert isinstance(
        modern.export_request(post(name="echo", _meta=META), routed(name=b64)), modern.ExportRequest
    )


@pytest.mark.parametrize(
    ("body", "head", "expected"),
    [
        (b"{", routed(), (400, -32700)),
        (b"[]", routed(), (400, -32600)),
        (post(id=None, _meta=META), routed(), (400, -32600)),
        (b'{"jsonrpc":"2.0","id":1,"result":{}}', routed(), (400, -32600)),
        (post(name="echo"), routed(), (400, -32602)),
        (
            post(name="echo", _meta=META),
            routed(**{"mcp-protocol-version": "2025-11-25"}),
            (400, -32020),
        ),
        (
            post(
                name="echo", _meta={**META, "io.modelcontextprotocol/protocolVersion": "2025-11-25"}
            ),
            routed(**{"mcp-protocol-version": "2025-11-25"}),
            (400, -32022),
        ),
        (post(name="echo", _meta=META), routed(**{"mcp-method": "tools/list"}), (400, -32020)),
        (post(name="echo", _meta=META), routed(name="other"), (400, -32020)),
        (post(name="echo", _meta=META), routed(name="=?base64?!!?="), (400, -32020)),
        (post(_meta=META), routed(name=None), (400, -32602)),
        (post(name="echo", _meta=META), routed(**{"mcp-param-text": "x"}), (400, -32020)),
    ],
)
def test_a_request_the_re_export_refuses(body, head, expected):
    assert refusal(modern.export_request(body, head)) == expected


# --------------------------------------------------------------------------- re-export: answers


def test_an_outcome_is_answered_with_the_http_clients_id():
    request = modern.ExportRequest("h1", "tools/list", {})
    schema = {
        "type": "object",
        "x-mcp-header": "X",
        "properties": {"a": {"type": "string", "x-mcp-header": "A"}},
        "items": [{"x-mcp-header": "B"}],
    }
    outcome = {
        "result": {"tools": [{"name": "t", "inputSchema": schema}], "resultType": "complete"}
    }
    status, message = modern.answer(request, "acp-bridge:1", outcome)
    assert status == 200
    assert message["id"] == "h1"
    assert message["result"]["tools"][0]["inputSchema"] == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "items": [{}],
    }
    error = {"error": {"code": -32602, "message": "bad"}}
    assert modern.answer(request, "r", error) == (
        400,
        {"jsonrpc": "2.0", "id": "h1", "error": {"code": -32602, "message": "bad"}},
    )


def test_a_subscription_named_by_the_inner_id_is_named_by_the_http_id():
    request = modern.ExportRequest(7, "subscriptions/listen", {})
    meta = {"io.modelcontextprotocol/subscriptionId": "acp-bridge:3", "other": 1}
    _, message = modern.answer(request, "acp-bridge:3", {"result": {"_meta": meta}})
    assert message["result"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": 7, "other": 1}
    assert modern.rewrite_notification({"_meta": meta}, "acp-bridge:3", 7) == {
        "_meta": {"io.modelcontextprotocol/subscriptionId": 7, "other": 1}
    }


def test_a_binding_failure_keeps_only_the_bindings_codes():
    request = modern.ExportRequest(1, "tools/call", {})
    assert modern.binding_error(request, -33001, "gone") == (
        200,
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -33001, "message": "gone"}},
    )
    assert modern.binding_error(request, -32603, "x")[1]["error"]["code"] == -33002
    assert modern.sse({"a": 1}) == b'event: message\ndata: {"a":1}\n\n'


# --------------------------------------------------------------------------- earlier revisions


def handshake(method: str = "tools/call", *, version: str | None = "2025-06-18") -> RequestHead:
    extra = {} if version is None else {"mcp-protocol-version": version}
    return export_head(**extra)


def test_an_initialize_of_an_earlier_revision_is_answered_from_the_servers_discovery():
    caps = {"roots": {}}
    init = modern.export_request(
        post("initialize", protocolVersion="2025-03-26", capabilities=caps), handshake(version=None)
    )
    assert init == modern.Initialize(1, "2025-03-26", caps)
    unknown = modern.export_request(post("initialize", protocolVersion="1999-01-01"), handshake())
    assert isinstance(unknown, modern.Initialize)
    assert unknown.version == "2025-11-25"
    discovered = {
        "result": modern.discover_result({"tools": {}}, {"name": "tools", "version": "2"}, "hi")
    }
    assert modern.handshake_answer(init, discovered, "fallback") == (
        200,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {
                "protocolVersion": "2025-03-26",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "tools", "version": "2"},
                "instructions": "hi",
            },
        },
    )
    failed = modern.handshake_answer(init, {"error": {"code": -32601, "message": "no"}}, "f")
    assert failed == (200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no"}})


def test_a_request_of_an_earlier_revision_gets_the_envelope_and_its_initializes_capabilities():
    request = modern.export_request(
        post(name="echo", _meta={"progressToken": 3}), handshake(), capabilities={"roots": {}}
    )
    assert request == modern.ExportRequest(
        1,
        "tools/call",
        {
            "name": "echo",
            "_meta": {
                "progressToken": 3,
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"roots": {}},
            },
        },
        handshake=True,
    )
    # What only the revision has is left out of its answer; errors are HTTP 200.
    outcome = {
        "result": {"tools": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
    }
    listed = modern.ExportRequest(2, "tools/list", {}, handshake=True)
    assert modern.answer(listed, "r", outcome) == (
        200,
        {"jsonrpc": "2.0", "id": 2, "result": {"tools": []}},
    )
    error = {"error": {"code": -32602, "message": "bad"}}
    assert modern.answer(listed, "r", error)[0] == 200
    assert modern.binding_error(listed, -33001, "gone")[0] == 200
    # A result asking for more input cannot be carried back.
    asking = {"result": {"resultType": "input_required", "inputRequests": {}}}
    status, message = modern.answer(listed, "r", asking)
    assert (status, message["error"]["code"]) == (200, -32603)


def test_ping_and_notifications_of_an_earlier_revision_are_answered_by_the_re_export():
    pong = modern.export_request(post("ping"), handshake())
    assert isinstance(pong, Response)
    assert orjson.loads(pong.body) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    initialized = modern.export_request(post("notifications/initialized", id=None), handshake())
    assert isinstance(initialized, Response)
    assert initialized.status == 202
    cancelled = modern.export_request(
        post("notifications/cancelled", id=None, requestId=5), handshake()
    )
    assert cancelled == modern.Cancelled(5)
    answer = modern.export_request(b'{"jsonrpc":"2.0","id":1,"result":{}}', handshake())
    assert isinstance(answer, Response)
    assert answer.status == 202
