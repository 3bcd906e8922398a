"""
The bridge's MCP server on trio (_mcp_server) and ``acp-bridge mcp`` (_mcp_relay), against a
fake :class:`SubagentHost`: exchanges on memory streams (deadlines with the autojump clock),
then the official MCP clients (the Python ``mcp`` SDK, the TypeScript
``@modelcontextprotocol/sdk``) over HTTP and over stdio through ``acp-bridge mcp``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

from acp_bridge.mcp.server import MCP_LIMITS, TOKEN_ENV, McpEndpoint
from acp_bridge.mcp.tools import ALL_TOOLS, AgentInfo, ChildStatus, ToolError
from acp_bridge.protocol.framing import LineDecoder
from tests.support.peers.npm import INSTALL, npm_peer_dir

PORT = 4321
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeHost:
    """A SubagentHost that records its calls: agent ``demo`` echoes, ``slow`` never answers
    (until cancelled), ``boom`` raises, any other is refused."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.children: dict[str, str] = {}  # child -> the session that spawned it
        self.started = trio.Event()
        self.cancelled = trio.Event()

    async def list_agents(self, caller: str) -> list[AgentInfo]:
        self.calls.append((caller, "list_agents"))
        return [AgentInfo("demo", "running"), AgentInfo("slow")]

    async def spawn(
        self, caller: str, agent: str, prompt: str, cwd: str | None, wait: bool
    ) -> ChildStatus:
        self.calls.append((caller, "spawn", agent, prompt, cwd, wait))
        if agent == "slow":
            self.started.set()
            try:
                await trio.sleep_forever()
            finally:
                self.cancelled.set()
        if agent == "boom":
            raise RuntimeError("a bug in the host")
        if agent != "demo":
            raise ToolError(f"no agent {agent!r} (see list_agents)")
        child = f"{caller}/c{len(self.children) + 1}"
        self.children[child] = caller
        if not wait:
            return ChildStatus(child, "running")
        return ChildStatus(child, "idle", "end_turn", f"echo: {prompt}")

    def _own(self, caller: str, child: str) -> None:
        if self.children.get(child) != caller:
            raise ToolError(f"no child {child!r} of this session")

    async def prompt(self, caller: str, child: str, prompt: str, wait: bool) -> ChildStatus:
        self.calls.append((caller, "prompt", child, prompt, wait))
        self._own(caller, child)
        return ChildStatus(child, "idle", "end_turn", f"echo: {prompt}")

    async def wait(
        self, caller: str, children: list[str] | None, timeout_ms: int | None
    ) -> list[ChildStatus]:
        self.calls.append((caller, "wait", children, timeout_ms))
        mine = [c for c, owner in self.children.items() if owner == caller]
        for child in children or []:
            self._own(caller, child)
        return [ChildStatus(c, "idle", "end_turn") for c in children or mine]

    async def cancel(self, caller: str, child: str) -> ChildStatus:
        self.calls.append((caller, "cancel", child))
        self._own(caller, child)
        return ChildStatus(child, "idle", "cancelled")

    async def close(self, caller: str, child: str) -> ChildStatus:
        self.calls.append((caller, "close", child))
        self._own(caller, child)
        del self.children[child]
        return ChildStatus(child, "closed")


# --------------------------------------------------------------------------- raw HTTP


def request(
    token: str | None,
    payload: object = None,
    *,
    session: str | None = None,
    method: str = "POST",
    port: int = PORT,
) -> bytes:
    body = b"" if payload is None else orjson.dumps(payload)
    lines = [f"{method} /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if session is not None:
        lines.append(f"Mcp-Session-Id: {session}")
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def rpc(method: str, id: object = 1, **params: object) -> dict[str, object]:
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id is not None:
        message["id"] = id
    return message


class Response:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines[0] else 0
        self.headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
        }

    def json(self) -> Any:
        return json.loads(self.body)


class Conn:
    """One client connection on a memory stream to ``endpoint.handle_connection``."""

    def __init__(self, endpoint: McpEndpoint, nursery: trio.Nursery) -> None:
        self.client, server = trio.testing.memory_stream_pair()
        nursery.start_soon(lambda: endpoint.handle_connection(server, port=PORT))

    async def send(self, data: bytes) -> None:
        await self.client.send_all(data)

    async def response(self) -> Response:
        raw = bytearray()
        while chunk := await self.client.receive_some(65536):
            raw += chunk
        return Response(bytes(raw))


async def exchange(endpoint: McpEndpoint, nursery: trio.Nursery, data: bytes) -> Response:
    conn = Conn(endpoint, nursery)
    await conn.send(data)
    return await conn.response()


async def open_session(endpoint: McpEndpoint, nursery: trio.Nursery, token: str) -> str:
    answer = await exchange(
        endpoint, nursery, request(token, rpc("initialize", protocolVersion="2025-11-25"))
    )
    assert answer.status == 200, answer.body
    return answer.headers["mcp-session-id"]


def bound(endpoint: McpEndpoint, session: str) -> str:
    token = endpoint.mint()
    endpoint.bind(token, session)
    return token


def bounded(test: Any) -> Any:
    """Run a memory-stream test under the autojump clock's virtual time, within a bound past
    every deadline of the server's: a test that would hang fails at once instead."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        with trio.fail_after(2 * 3600):
            await test(*args, **kwargs)

    return run


SLOW = rpc("tools/call", id=9, name="spawn_agent", arguments={"agent": "slow", "prompt": "x"})


# --------------------------------------------------------------------------- memory streams


@bounded
async def test_a_call_runs_on_the_host_as_the_tokens_session(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host)
    token = bound(endpoint, "parent-1")
    sid = await open_session(endpoint, nursery, token)
    call = rpc("tools/call", name="spawn_agent", arguments={"agent": "demo", "prompt": "hi"})
    answer = await exchange(endpoint, nursery, request(token, call, session=sid))
    assert answer.status == 200
    result = answer.json()["result"]
    expected = {
        "child": "parent-1/c1",
        "state": "idle",
        "stopReason": "end_turn",
        "text": "echo: hi",
    }
    assert result["structuredContent"] == expected
    assert json.loads(result["content"][0]["text"]) == expected
    assert "isError" not in result
    assert host.calls == [("parent-1", "spawn", "demo", "hi", None, True)]


@bounded
async def test_host_refusals_and_failures_are_tool_errors_not_crashes(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host)
    token = bound(endpoint, "p")
    sid = await open_session(endpoint, nursery, token)
    for agent, text in [
        ("nope", "spawn_agent: no agent 'nope' (see list_agents)"),
        ("boom", "spawn_agent: internal error in the bridge (see its log)"),
    ]:
        call = rpc("tools/call", name="spawn_agent", arguments={"agent": agent, "prompt": "x"})
        answer = await exchange(endpoint, nursery, request(token, call, session=sid))
        result = answer.json()["result"]
        assert result["isError"] is True
        assert result["content"][0]["text"] == text
    # and the server still serves
    ping = await exchange(endpoint, nursery, request(token, rpc("ping"), session=sid))
    assert ping.json()["result"] == {}


@bounded
async def test_a_slow_call_is_abandoned_at_its_deadline(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host, call_timeout=30)
    token = bound(endpoint, "p")
    sid = await open_session(endpoint, nursery, token)
    start = trio.current_time()
    answer = await exchange(endpoint, nursery, request(token, SLOW, session=sid))
    assert trio.current_time() - start == pytest.approx(30, abs=1)
    result = answer.json()["result"]
    assert result["isError"] is True
    assert "no answer within 30 s" in result["content"][0]["text"]
    assert host.cancelled.is_set()


@bounded
async def test_a_cancelled_call_stops_and_its_post_gets_no_answer(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host)
    token = bound(endpoint, "p")
    sid = await open_session(endpoint, nursery, token)
    slow = Conn(endpoint, nursery)
    await slow.send(request(token, SLOW, session=sid))
    await host.started.wait()
    cancel = rpc("notifications/cancelled", id=None, requestId=9, reason="user")
    start = trio.current_time()
    assert (await exchange(endpoint, nursery, request(token, cancel, session=sid))).status == 202
    answer = await slow.response()
    assert trio.current_time() - start < 1  # at once, not at the call's deadline
    assert answer.status == 202  # MCP: no response to a cancelled request
    assert answer.body == b""
    assert host.cancelled.is_set()


@bounded
async def test_a_call_whose_client_hangs_up_is_cancelled(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host)
    token = bound(endpoint, "p")
    sid = await open_session(endpoint, nursery, token)
    slow = Conn(endpoint, nursery)
    await slow.send(request(token, SLOW, session=sid))
    await host.started.wait()
    await slow.client.aclose()
    with trio.fail_after(5):
        await host.cancelled.wait()


@bounded
async def test_revoking_a_token_ends_its_calls_and_refuses_it(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host)
    token = bound(endpoint, "p")
    other = bound(endpoint, "q")
    sid = await open_session(endpoint, nursery, token)
    slow = Conn(endpoint, nursery)
    await slow.send(request(token, SLOW, session=sid))
    await host.started.wait()
    start = trio.current_time()
    endpoint.revoke_session("p")
    result = (await slow.response()).json()["result"]
    assert trio.current_time() - start < 1
    assert result["isError"] is True
    assert "the calling session has ended" in result["content"][0]["text"]
    assert host.cancelled.is_set()
    refused = await exchange(endpoint, nursery, request(token, rpc("ping"), session=sid))
    assert refused.status == 401
    assert await open_session(endpoint, nursery, other)  # others are untouched


@bounded
async def test_a_token_of_one_session_is_refused_for_another(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host)
    a, b = bound(endpoint, "A"), bound(endpoint, "B")
    sid_a = await open_session(endpoint, nursery, a)
    sid_b = await open_session(endpoint, nursery, b)
    # B's token with A's MCP session: as unknown as a made-up one
    stolen = await exchange(endpoint, nursery, request(b, rpc("tools/list"), session=sid_a))
    assert stolen.status == 404
    # each call runs as the token's own session, whatever it names
    spawn = rpc("tools/call", name="spawn_agent", arguments={"agent": "demo", "prompt": "x"})
    child = (await exchange(endpoint, nursery, request(a, spawn, session=sid_a))).json()
    child_id = child["result"]["structuredContent"]["child"]
    close = rpc("tools/call", name="close_agent", arguments={"child": child_id})
    result = (await exchange(endpoint, nursery, request(b, close, session=sid_b))).json()["result"]
    assert result["isError"] is True
    assert host.calls[-1] == ("B", "close", child_id)
    # a token bound to A cannot be bound to B
    with pytest.raises(ValueError, match="already bound"):
        endpoint.bind(a, "B")


@bounded
async def test_delete_ends_the_mcp_session_and_its_calls(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host)
    token = bound(endpoint, "p")
    sid = await open_session(endpoint, nursery, token)
    slow = Conn(endpoint, nursery)
    await slow.send(request(token, SLOW, session=sid))
    await host.started.wait()
    start = trio.current_time()
    gone = await exchange(endpoint, nursery, request(token, session=sid, method="DELETE"))
    assert gone.status == 200
    assert (await slow.response()).status == 202
    assert trio.current_time() - start < 1
    assert host.cancelled.is_set()
    after = await exchange(endpoint, nursery, request(token, rpc("ping"), session=sid))
    assert after.status == 404


@bounded
async def test_slow_or_oversized_requests_are_bounded(nursery, autojump_clock):
    endpoint = McpEndpoint(FakeHost())
    token = bound(endpoint, "p")
    # a head that never ends: the connection is closed, unanswered, after head_timeout
    start = trio.current_time()
    stalled = Conn(endpoint, nursery)
    await stalled.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:4321\r\n")
    assert (await stalled.response()).status == 0
    assert trio.current_time() - start == pytest.approx(10, abs=1)
    # a body that never ends: 408 after body_timeout
    slow_body = Conn(endpoint, nursery)
    await slow_body.send(request(token, rpc("ping"))[:-5])
    assert (await slow_body.response()).status == 408
    # a body over the cap, with a lying Content-Length: 413 (chunked, so no length up front)
    big = Conn(endpoint, nursery)
    head = request(token, rpc("ping")).split(b"Content-Length")[0]
    await big.send(head + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    async with trio.open_nursery() as inner:

        async def feed() -> None:
            for _ in range(70):
                await big.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))

        inner.start_soon(feed)
        assert (await big.response()).status == 413
        inner.cancel_scope.cancel()


@bounded
async def test_connections_at_once_are_bounded(nursery, autojump_clock):
    host = FakeHost()
    endpoint = McpEndpoint(host, limits=attrs.evolve(MCP_LIMITS, max_connections=2))
    token = bound(endpoint, "p")
    sid = await open_session(endpoint, nursery, token)
    slow = Conn(endpoint, nursery)
    await slow.send(request(token, SLOW, session=sid))
    await host.started.wait()
    idle = Conn(endpoint, nursery)
    await trio.testing.wait_all_tasks_blocked()
    assert (await exchange(endpoint, nursery, request(token, rpc("ping")))).status == 503
    await idle.client.aclose()
    await slow.client.aclose()


# --------------------------------------------------------------------------- official clients


def _python_sdk() -> Any:
    return pytest.importorskip("mcp.client", reason="the official `mcp` SDK (test extra)")


async def _python_client_session(client: Any, host: FakeHost) -> None:
    """What every Python-SDK test checks: tools listed, a call, bad arguments, a cancel."""
    tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == list(ALL_TOOLS)
    assert tools[1].input_schema["required"] == ["agent", "prompt"]
    result = await client.call_tool("spawn_agent", {"agent": "demo", "prompt": "hi"})
    assert not result.is_error
    assert result.structured_content == {
        "child": "S/c1",
        "state": "idle",
        "stopReason": "end_turn",
        "text": "echo: hi",
    }
    assert json.loads(result.content[0].text) == result.structured_content
    waited = await client.call_tool("wait_agents", {"timeout_ms": 0})
    assert waited.structured_content == {
        "children": [{"child": "S/c1", "state": "idle", "stopReason": "end_turn"}]
    }
    bad = await client.call_tool("prompt_agent", {"child": 3})
    assert bad.is_error
    assert bad.content[0].text == (
        "prompt_agent: prompt: missing (required); child: expected a string, got a number"
    )
    with trio.move_on_after(60):
        async with trio.open_nursery() as nursery:

            async def cancel_when_started() -> None:
                await host.started.wait()
                nursery.cancel_scope.cancel()  # the SDK sends notifications/cancelled

            nursery.start_soon(cancel_when_started)
            await client.call_tool("spawn_agent", {"agent": "slow", "prompt": "x"})
    with trio.fail_after(10):
        await host.cancelled.wait()
    after = await client.call_tool("list_agents", {})
    assert after.structured_content == {
        "agents": [{"name": "demo", "state": "running"}, {"name": "slow"}]
    }


async def test_the_python_sdk_lists_and_calls_the_tools_over_http(nursery):
    _python_sdk()
    import httpx2
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    host = FakeHost()
    endpoint = McpEndpoint(host)
    url = await endpoint.start(nursery)
    token = bound(endpoint, "S")
    with trio.fail_after(60):
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            assert client.protocol_version == "2025-11-25"
            assert client.server_info.name == "acp-bridge"
            await _python_client_session(client, host)


async def test_the_python_sdk_lists_and_calls_the_tools_over_stdio(nursery):
    _python_sdk()
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    host = FakeHost()
    endpoint = McpEndpoint(host)
    await endpoint.start(nursery)
    token = bound(endpoint, "S")
    entry = endpoint.server_entry(token, http=False, command=[sys.executable, "-m", "acp_bridge"])
    assert entry["args"][-3:] == ["mcp", "--url", endpoint.url]
    params = StdioServerParameters(
        command=entry["command"],
        args=entry["args"],
        env={e["name"]: e["value"] for e in entry["env"]},
    )
    with trio.fail_after(60):
        async with Client(params) as client:
            assert client.protocol_version == "2025-11-25"
            await _python_client_session(client, host)


async def test_the_listener_starts_once_and_its_url_names_it(nursery):
    endpoint = McpEndpoint(FakeHost())
    with pytest.raises(RuntimeError, match="not listening"):
        endpoint.server_entry("t", http=True)
    async with trio.open_nursery() as starters:
        urls: list[str] = []

        async def start() -> None:
            urls.append(await endpoint.start(nursery))

        starters.start_soon(start)
        starters.start_soon(start)
    assert urls[0] == urls[1] == f"http://127.0.0.1:{endpoint.port}/mcp"
    entry = endpoint.server_entry("t", http=True)
    assert entry == {
        "type": "http",
        "name": "acp-bridge",
        "url": urls[0],
        "headers": [{"name": "Authorization", "value": "Bearer t"}],
    }


async def test_a_listener_that_cannot_start_fails_every_caller_instead_of_hanging(
    nursery, monkeypatch
):
    async def no_port(*args: Any, **kwargs: Any) -> Any:
        await trio.lowlevel.checkpoint()
        raise OSError("no port for you")

    monkeypatch.setattr(trio, "open_tcp_listeners", no_port)
    endpoint = McpEndpoint(FakeHost())
    failures: list[str] = []

    async def start() -> None:
        try:
            await endpoint.start(nursery)
        except (OSError, RuntimeError) as exc:
            failures.append(type(exc).__name__)

    with trio.fail_after(10):
        async with trio.open_nursery() as starters:
            starters.start_soon(start)
            starters.start_soon(start)
    assert sorted(failures) == ["OSError", "RuntimeError"]


async def test_acp_bridge_mcp_refuses_to_start_without_a_token_or_on_a_remote_url():
    for env, url, said in [
        ({}, "http://127.0.0.1:1/mcp", "ACP_BRIDGE_MCP_TOKEN: empty"),
        ({TOKEN_ENV: "t"}, "http://example.com:1/mcp", "not a loopback address"),
    ]:
        with trio.fail_after(30):
            done = await trio.run_process(
                [sys.executable, "-m", "acp_bridge", "mcp", "--url", url],
                env={k: v for k, v in os.environ.items() if k != TOKEN_ENV} | env,
                stdin=b"",
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert done.returncode == 2
        assert said in done.stderr.decode()
        assert done.stdout == b""


async def _run_ts_client(argv: list[str], env: dict[str, str], host: FakeHost) -> dict[str, Any]:
    """Run tests/support/peers/mcp_client.mjs: its steps by name (it aborts its slow call)."""
    steps: dict[str, Any] = {}
    with trio.fail_after(90):
        process = await trio.lowlevel.open_process(argv, stdin=-1, stdout=-1, env=env, cwd=ROOT)
        try:
            assert process.stdout is not None
            assert process.stdin is not None
            decoder = LineDecoder()
            while chunk := await process.stdout.receive_some(65536):
                for line in decoder.feed(chunk):
                    assert isinstance(line, bytes)
                    step = json.loads(line)
                    steps[step["step"]] = step["value"]
                    if step["step"] == "slow_started":
                        await host.started.wait()
                        await process.stdin.send_all(b"go\n")
            await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
        assert process.returncode == 0, steps
    return steps


def _check_ts_steps(steps: dict[str, Any], host: FakeHost) -> None:
    assert steps["version"]["name"] == "acp-bridge"
    assert [t["name"] for t in steps["tools"]] == list(ALL_TOOLS)
    spawned = steps["spawn"]
    assert spawned["structuredContent"]["child"] == "S/c1"
    assert json.loads(spawned["content"][0]["text"]) == spawned["structuredContent"]
    assert steps["bad"]["isError"] is True
    assert steps["bad"]["content"][0]["text"] == (
        "spawn_agent: extra: unknown argument (the arguments are: agent, prompt, cwd, wait); "
        "prompt: missing (required); agent: expected a string, got a number"
    )
    assert "error" in steps["slow"]  # aborted
    assert host.cancelled.is_set()
    assert steps["after"]["structuredContent"]["agents"][0]["name"] == "demo"


def _ts_client() -> list[str]:
    npm_peer_dir("@modelcontextprotocol/sdk")  # skips with the reason if not installed
    node = shutil.which("node")
    assert node is not None
    return [
        node,
        os.path.join(ROOT, "tests", "support", "peers", "mcp_client.mjs"),
        str(INSTALL / "node_modules"),
    ]


async def test_the_typescript_sdk_lists_and_calls_the_tools_over_http(nursery):
    argv = _ts_client()
    host = FakeHost()
    endpoint = McpEndpoint(host)
    url = await endpoint.start(nursery)
    token = bound(endpoint, "S")
    env = dict(os.environ) | {TOKEN_ENV: token}
    steps = await _run_ts_client([*argv, "http", url], env, host)
    _check_ts_steps(steps, host)


async def test_the_typescript_sdk_lists_and_calls_the_tools_over_stdio(nursery):
    argv = _ts_client()
    host = FakeHost()
    endpoint = McpEndpoint(host)
    await endpoint.start(nursery)
    token = bound(endpoint, "S")
    entry = endpoint.server_entry(token, http=False, command=[sys.executable, "-m", "acp_bridge"])
    env = dict(os.environ) | {e["name"]: e["value"] for e in entry["env"]}
    steps = await _run_ts_client([*argv, "stdio", entry["command"], *entry["args"]], env, host)
    _check_ts_steps(steps, host)
