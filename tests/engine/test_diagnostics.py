"""Diagnostics off stdout: agent stderr and stray stdout as _acp_bridge/log, redaction."""

from __future__ import annotations

import io
import json

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.config.model import AgentConfig
from acp_bridge.engine.bridge import Bridge
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.observe.log import configure_logging
from acp_bridge.observe.redact import Redactor
from acp_bridge.protocol.diagnostics import LOG_BURST, LOG_RATE, LogBudget, guess_level, log_params
from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.protocol.jsonrpc import Kind, classify, loads
from tests.support.fakes import FakeAgent, connect, make_config, open_bridge


def logs(client):
    return [m["params"] for m in client.received if m.get("method") == "_acp_bridge/log"]


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("ERROR: boom", "error"),
        ("2026-01-01T00:00:00Z WARN disk", "warning"),
        ("[debug] x", "debug"),
        ("<warn> y", "warning"),
        ('{"level": "error", "msg": "x"}', "error"),
        ("level=info started", "info"),
        ("FATAL out of memory", "critical"),
        ("TRACE deep", "debug"),
        ("just talking about errors", "info"),
        ("Error handling is fine", "info"),
        ("", "info"),
    ],
)
def test_guess_level(line, level):
    assert guess_level(line) == level


def test_log_params_of_the_bridge_about_a_session():
    """The bridge's own event: logger acp_bridge, the session, the message before the data."""
    params = log_params(
        "warning", "denied", session_id="b1", data={"toolCallId": "t", "agent": "a"}
    )
    assert params == {
        "level": "warning",
        "logger": "acp_bridge",
        "sessionId": "b1",
        "data": {"message": "denied", "toolCallId": "t", "agent": "a"},
    }
    assert list(params) == ["level", "logger", "sessionId", "data"]
    assert list(params["data"]) == ["message", "toolCallId", "agent"]


def test_log_params_of_an_agent_without_a_session():
    """An agent's output: its own logger, no sessionId key at all, and nothing but the message
    when there is no data."""
    params = log_params("error", "boom", logger="agent.a", data={"agent": "a", "stream": "stderr"})
    assert params == {
        "level": "error",
        "logger": "agent.a",
        "data": {"message": "boom", "agent": "a", "stream": "stderr"},
    }
    assert log_params("info", "hi") == {
        "level": "info",
        "logger": "acp_bridge",
        "data": {"message": "hi"},
    }


def test_a_log_budget_lets_its_burst_through_then_counts_what_it_holds_back():
    budget = LogBudget()
    assert [budget.take(100.0) for _ in range(int(LOG_BURST))] == [True] * int(LOG_BURST)
    assert not budget.take(100.0)
    assert not budget.take(100.0)
    assert budget.suppressed == 2
    assert budget.take_suppressed() == 2
    assert budget.take_suppressed() == 0  # counted once


def test_a_log_budget_refills_at_its_rate_up_to_its_burst():
    budget = LogBudget(rate=4.0, burst=3.0)
    assert [budget.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not budget.take(0.125)  # half a token so far
    assert budget.take(0.25)  # one token: one line
    assert not budget.take(0.25)
    # A long silence refills to the burst, no more.
    assert [budget.take(1000.0) for _ in range(4)] == [True, True, True, False]
    assert budget.suppressed == 4  # one at each False above
    assert LogBudget().rate == LOG_RATE


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.floats(min_value=0.0, max_value=0.5), max_size=300))
def test_property_a_log_budget_never_lets_more_than_burst_plus_rate_times_time(gaps):
    """Whatever the timing: what passes is at most the burst plus what the rate refilled, and
    every line either passes or is counted."""
    budget = LogBudget(rate=20.0, burst=5.0)
    now = 0.0
    passed = 0
    for gap in gaps:
        now += gap
        passed += budget.take(now)
    assert passed <= 5.0 + 20.0 * now + 1e-9  # (the sums of floats may round either way)
    assert passed + budget.suppressed == len(gaps)


async def test_stderr_and_stray_stdout_become_log_notifications_and_the_session_lives():
    agent = FakeAgent("a")
    agent.stderr = None  # ask the launcher for a stderr
    async with open_bridge({"a": agent}) as (client, _):
        sid = await client.new_session()
        answer = await client.prompt(sid, "noise")
        assert answer["result"]["stopReason"] == "end_turn"
        assert client.updates(sid) == ["a:s1:still-fine"]
        await client.call("_acp_bridge/agents", {})  # a round trip: stderr was read by now
        await trio.testing.wait_all_tasks_blocked()
        seen = {(p["data"].get("stream"), p["data"]["message"]): p for p in logs(client)}
        assert seen[("stderr", "ERROR: something broke")]["level"] == "error"
        assert seen[("stderr", "WARN low disk")]["level"] == "warning"
        assert seen[("stderr", "just talking")]["level"] == "info"
        assert ("stderr", "[debug] details") not in seen  # below the client's level (info)
        stray = seen[("stdout", "this is not json (a stray print)")]
        assert stray["level"] == "warning"
        assert stray["sessionId"] == sid
        assert stray["data"]["agent"] == "a"


async def test_set_log_level_lets_debug_through_and_refuses_nonsense():
    agent = FakeAgent("a")
    agent.stderr = None
    async with open_bridge({"a": agent}) as (client, _):
        sid = await client.new_session()
        assert await client.call("_acp_bridge/set_log_level", {"level": "debug"}) == {}
        await client.prompt(sid, "stderr [debug] now visible")
        await client.wait_for(lambda m: "now visible" in str(m))
        bad = await client.request("_acp_bridge/set_log_level", {"level": "loud"})
        assert bad["error"]["code"] == -32602


def bridge_notifications(client):
    return [m for m in client.received if str(m.get("method", "")).startswith("_acp_bridge/")]


@pytest.mark.parametrize("log", [None, "info"])
async def test_a_stock_client_gets_no_bridge_notifications_while_the_agent_talks(log):
    """No opt-in on initialize: agent stderr, a stray stdout line, a settled permission and a
    session taken over reach it as nothing but standard ACP (real clients print an error per
    unknown notification). The same story told to a client that asked: all of it."""
    agent = FakeAgent("a")
    agent.stderr = None
    async with open_bridge({"a": agent}, log=log) as (client, bridge):
        sid = await client.new_session()
        answer = await client.prompt(sid, "noise")
        assert answer["result"]["stopReason"] == "end_turn"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.prompt, sid, "permission")
            await client.agent_requests.receive()
            await client.notify("session/cancel", {"sessionId": sid})  # settles it
        # Another connection takes the session over.
        async with trio.open_nursery() as nursery:
            other = await connect(bridge, nursery, log=None, name="other")
            await other.call("session/resume", {"sessionId": sid, "cwd": "/w"})
            nursery.cancel_scope.cancel()
        await client.call("_acp_bridge/agents", {})  # a round trip: stderr was read by now
        await trio.testing.wait_all_tasks_blocked()
        assert client.updates(sid)[0] == "a:s1:still-fine"
        told = [
            (m["method"], m["params"].get("data", {}).get("message"))
            for m in bridge_notifications(client)
        ]
        if log is None:
            assert told == []
        else:
            assert ("_acp_bridge/log", "ERROR: something broke") in told
            assert ("_acp_bridge/permission_resolved", None) in told
            assert told[-1][1].startswith("session taken over by another connection")


async def test_an_opted_in_client_gets_logs_from_its_level_up():
    agent = FakeAgent("a")
    agent.stderr = None
    async with open_bridge({"a": agent}, log="warning") as (client, _):
        sid = await client.new_session()
        await client.prompt(sid, "noise")
        await client.call("_acp_bridge/agents", {})
        await trio.testing.wait_all_tasks_blocked()
        seen = {p["data"]["message"]: p["level"] for p in logs(client)}
        assert seen == {
            "ERROR: something broke": "error",
            "WARN low disk": "warning",
            "this is not json (a stray print)": "warning",
        }


async def test_set_log_level_opts_a_stock_client_in():
    agent = FakeAgent("a")
    agent.stderr = None
    async with open_bridge({"a": agent}, log=None) as (client, _):
        sid = await client.new_session()
        await client.prompt(sid, "stderr before asking")
        assert await client.call("_acp_bridge/set_log_level", {"level": "info"}) == {}
        await client.prompt(sid, "stderr after asking")
        await client.wait_for(lambda m: "after asking" in str(m))
        assert [p["data"]["message"] for p in logs(client)] == ["after asking"]


@pytest.mark.parametrize("level", ["loud", 3, True, ["info"]])
async def test_initialize_refuses_a_log_level_that_is_none(level):
    async with open_bridge({"a": FakeAgent("a")}, initialize=False) as (client, _):
        params = {"protocolVersion": 1, "_meta": {"acp_bridge": {"log": level}}}
        response = await client.request("initialize", params)
        assert response["error"]["code"] == -32602
        assert "_meta.acp_bridge.log" in response["error"]["message"]


async def test_a_stderr_flood_is_rate_limited_and_summarized(autojump_clock):
    agent = FakeAgent("a")
    agent.stderr = None
    async with open_bridge({"a": agent}) as (client, _):
        sid = await client.new_session()
        await client.prompt(sid, "flood 10000")
        summary = await client.wait_for(lambda m: "suppressed" in str(m))
        relayed = [p for p in logs(client) if p["data"].get("stream") == "stderr"]
        assert len(relayed) == 200  # the burst
        count = int(summary["params"]["data"]["message"].split()[0])
        assert count == 10000 - 200
        assert summary["params"]["level"] == "warning"


async def test_secrets_never_reach_notifications_errors_or_logs():
    """An agent's env secret and an MCP header secret: masked in every diagnostic."""
    env_secret = "sk-env-secret-1234567890"
    header_secret = "hdr-secret-abcdef123456"
    agent = FakeAgent("a", capabilities={"mcpCapabilities": {"http": True}})
    agent.stderr = None
    out = io.StringIO()
    redactor = Redactor()  # the bridge's, given to logging as the commands do
    configure_logging(level="debug", fmt="json", stream=out, redactor=redactor)
    config = make_config({"a": agent})
    config = attrs.evolve(
        config,
        agents={"a": AgentConfig(name="a", command="x", env={"OPENAI_API_KEY": env_secret})},
    )
    async with trio.open_nursery() as nursery:
        bridge = await nursery.start(
            Bridge(config, make_in_process_launcher({"a": agent}), redactor=redactor).run
        )
        client_side, bridge_side = trio.testing.memory_stream_pair()
        nursery.start_soon(serve_client_stream, bridge, bridge_side, bridge_side)
        from tests.support.fakes import TestClient

        client = TestClient(client_side)
        nursery.start_soon(client.read_loop)
        await client.initialize()
        mcp = [
            {
                "type": "http",
                "name": "m",
                "url": "http://127.0.0.1:9",
                "headers": [{"name": "Authorization", "value": f"Bearer {header_secret}"}],
            }
        ]
        sid = await client.new_session(mcpServers=mcp)
        await client.prompt(sid, f"stderr leaking {env_secret} and {header_secret}")
        await client.wait_for(lambda m: "leaking" in str(m))
        await client.prompt(sid, "crash")
        nursery.cancel_scope.cancel()
    everything = json.dumps(client.received) + out.getvalue()
    assert "leaking *** and ***" in everything
    assert env_secret not in everything
    assert header_secret not in everything
    # The agent itself got its MCP header untouched (the protocol is not altered).
    [new] = [m for m in agent.received if m.get("method") == "session/new"]
    assert header_secret in json.dumps(new)


def test_redactor_masks_longest_first_and_ignores_short_values():
    r = Redactor()
    r.add("abc")  # too short to hide
    r.add("secret-value")
    r.add("secret-value-longer")
    assert r.redact("x secret-value-longer y secret-value abc") == "x *** y *** abc"
    assert r.redact_json({"a": ["secret-value", 1]}) == {"a": ["***", 1]}


def test_each_bridge_has_its_own_secrets():
    """Two bridges in one process: one's agent env secret is not masked by (nor known to)
    the other; a redactor given to a bridge is the one it fills."""
    secret = "sk-only-in-the-first-bridge"
    first = attrs.evolve(
        make_config({"a": FakeAgent("a")}),
        agents={"a": AgentConfig(name="a", command="x", env={"API_KEY": secret})},
    )
    given = Redactor()
    one = Bridge(first, make_in_process_launcher({}), redactor=given)
    other = Bridge(make_config({"a": FakeAgent("a")}), make_in_process_launcher({}))
    assert one.hub.redactor is given
    assert given.redact(f"x {secret} y") == "x *** y"
    assert other.hub.redactor.redact(f"x {secret} y") == f"x {secret} y"
    assert len(other.hub.redactor) == 0


CLIENT_INPUT = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from(
            [
                b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}',
                b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/w",'
                b'"mcpServers":[]}}',
                b'{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s1",'
                b'"prompt":[{"type":"text","text":"noise"}]}}',
                b'{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":"s1",'
                b'"prompt":[{"type":"text","text":"crash"}]}}',
                b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s1"}}',
                b'{"jsonrpc":"2.0","id":5}',
                b"[1,2]",
                b'{"jsonrpc":"2.0","id":{"x":1},"method":"m"}',
                b"\xff\xfe\x00",
                b"",
            ]
        ),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(inputs=CLIENT_INPUT, crash_at_start=st.booleans())
async def test_property_every_line_to_the_client_is_json_rpc(inputs, crash_at_start):
    """Whatever the client sends and whatever the agent does (noise, stray stdout, crash,
    even failing at start), every line the bridge writes to the client is a JSON-RPC
    message."""
    agent = FakeAgent("a", fail_initialize=crash_at_start)
    agent.stderr = None
    config = make_config({"a": agent})
    written = bytearray()
    async with trio.open_nursery() as nursery:
        bridge = await nursery.start(Bridge(config, make_in_process_launcher({"a": agent})).run)
        client_side, bridge_side = trio.testing.memory_stream_pair()
        nursery.start_soon(serve_client_stream, bridge, bridge_side, bridge_side)

        async def collect():
            while data := await client_side.receive_some(65536):
                written.extend(data)

        nursery.start_soon(collect)
        for line in inputs:
            await client_side.send_all(line + b"\n")
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    decoder = LineDecoder()
    for line in decoder.feed(bytes(written)):
        assert isinstance(line, bytes)
        assert classify(loads(line)) is not Kind.INVALID
    assert decoder.feed_eof() is None


async def test_prompt_shows_the_diagnostics_it_asked_for_readably():
    """`acp-bridge prompt` asks for `_acp_bridge/log` at its --log-level and prints each one
    as a line for a person (its own JSON log lines start at warning: see test_e2e)."""
    from acp_bridge.cli.prompt import _MiniClient

    err = io.StringIO()
    client_side, _ = trio.testing.memory_stream_pair()
    mini = _MiniClient(client_side, client_side, out=io.StringIO(), err=err, approve=False)
    line = {"message": "ERROR: boom", "agent": "demo", "stream": "stderr"}
    await mini._handle(
        {
            "jsonrpc": "2.0",
            "method": "_acp_bridge/log",
            "params": {"level": "error", "logger": "agent.demo", "data": line},
        }
    )
    assert err.getvalue() == "[error] agent demo: ERROR: boom\n"
