"""Wire traces: every message on both links, redacted, bounded; `trace show` per session."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import secrets
import sys

import trio
import trio.testing

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.cli.main import main
from acp_bridge.config.model import AgentConfig, BridgeConfig, Config
from acp_bridge.engine.bridge import Bridge
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.observe.redact import Redactor
from acp_bridge.observe.trace import (
    RECENT_BYTES,
    RECENT_RECORDS,
    WireTrace,
    format_record,
    open_trace_file,
    open_wire_trace,
    render_trace,
)
from tests.support.fakes import FakeAgent, TestClient

TIMEOUT = 15
DEMO = f"{sys.executable} -m acp_bridge demo-agent"


def read_records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@contextlib.asynccontextmanager
async def traced_bridge(path, agents, *, env=None, **trace_options):
    """A bridge over fake agents with one client, traced to ``path`` (closed on the way out)."""
    config = Config(
        agents={
            name: AgentConfig(name=name, command="fake", start_timeout=5, env=env or {})
            for name in agents
        },
        bridge=BridgeConfig(),
    )
    redactor = Redactor()  # the bridge's, given to its trace as the commands do
    async with (
        open_wire_trace(open_trace_file(path), redactor=redactor, **trace_options) as trace,
        trio.open_nursery() as nursery,
    ):
        bridge = Bridge(
            config, make_in_process_launcher(dict(agents)), tracer=trace, redactor=redactor
        )
        await nursery.start(bridge.run)
        client_side, bridge_side = trio.testing.memory_stream_pair()
        nursery.start_soon(
            functools.partial(serve_client_stream, bridge, bridge_side, bridge_side, linger=0)
        )
        client = TestClient(client_side)
        nursery.start_soon(client.read_loop)
        await client.initialize()
        yield client, trace
        nursery.cancel_scope.cancel()


async def test_trace_records_every_message_on_both_links_in_both_directions(tmp_path):
    """Client and agent links, in and out, each message parsed, times non-decreasing."""
    path = tmp_path / "trace.jsonl"
    with trio.fail_after(TIMEOUT):
        async with traced_bridge(path, {"a": FakeAgent("a")}) as (client, trace):
            sid = await client.new_session()
            reply = await client.prompt(sid, "count 2")
            assert reply["result"]["stopReason"] == "end_turn"
        assert trace.statistics().dropped == 0
    records = read_records(path)
    assert {(r["link"], r["dir"]) for r in records} == {
        ("client:stdio", "in"),
        ("client:stdio", "out"),
        ("agent:a", "in"),
        ("agent:a", "out"),
    }
    assert all(set(r) == {"t", "link", "dir", "msg"} for r in records)
    times = [r["t"] for r in records]
    assert times == sorted(times)
    updates = [
        r["msg"]["params"]["update"]["content"]["text"]
        for r in records
        if r["link"] == "client:stdio" and r["msg"].get("method") == "session/update"
    ]
    assert updates == [f"a:{sid}:0", f"a:{sid}:1"]
    prompts = [r for r in records if r["msg"].get("method") == "session/prompt"]
    assert [(r["link"], r["dir"]) for r in prompts] == [("client:stdio", "in"), ("agent:a", "out")]
    assert os.stat(path).st_mode & 0o077 == 0  # prompts inside: the owner's only


async def test_secrets_of_agent_env_and_mcp_headers_never_reach_the_trace(tmp_path):
    """An env secret and an MCP header are masked in every record, whichever link carried them."""
    env_secret = "envsecret-" + secrets.token_hex(8)
    header_secret = "hdrsecret-" + secrets.token_hex(8)
    path = tmp_path / "trace.jsonl"
    mcp = [
        {
            "name": "m",
            "type": "http",
            "url": "http://localhost:1/mcp",
            "headers": [{"name": "Authorization", "value": f"Bearer {header_secret}"}],
        }
    ]
    agent = FakeAgent("a", capabilities={"mcpCapabilities": {"http": True}})
    with trio.fail_after(TIMEOUT):
        async with traced_bridge(path, {"a": agent}, env={"API_KEY": env_secret}) as (client, _):
            sid = await client.new_session(mcpServers=mcp)
            await client.prompt(sid, f"echo {env_secret} and {header_secret}")
    text = path.read_text()
    assert env_secret not in text
    assert header_secret not in text
    assert "***" in text
    # The agent still got the header: only the trace is redacted.
    new = next(m for m in agent.received if m.get("method") == "session/new")
    assert header_secret in json.dumps(new)
    assert any(
        r["link"] == "agent:a" and "mcpServers" in json.dumps(r["msg"]) for r in read_records(path)
    )


def test_format_record_redacts_and_keeps_lines_that_are_not_json():
    """A record is one JSON line; not-JSON lines are kept as raw text; secrets become ***."""
    from acp_bridge.observe.trace import _Dropped, _Message

    redactor = Redactor()
    redactor.add("hunter2-secret")
    line = format_record(_Message(1.5, "agent:a", "in", b"oops hunter2-secret\n"), redactor)
    assert json.loads(line) == {
        "t": 1.5,
        "link": "agent:a",
        "dir": "in",
        "msg": {"raw": "oops ***"},
    }
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    msg = b'{"jsonrpc":"2.0","method":"x","params":{"k":"a\\"b hunter2-secret"}}'
    assert b"hunter2" not in format_record(_Message(2.0, "client:c", "out", msg), redactor)
    assert json.loads(format_record(_Dropped(3.0, 7), None)) == {"t": 3.0, "dropped": 7}
    surrogate = format_record(_Message(4.0, "client:c", "in", b'{"s":"\\ud800"}'), None)
    assert json.loads(surrogate)["msg"] == {"s": "\ud800"}


async def test_overflow_counts_drops_and_marks_where_they_went_missing(tmp_path):
    """Past the record bound nothing blocks: drops are counted and a marker takes their place."""
    path = tmp_path / "trace.jsonl"
    trace = WireTrace(
        open_trace_file(path), redactor=None, max_records=3, clock=iter(range(100)).__next__
    )
    for i in range(5):  # no writer yet: 3 fit, 2 are dropped
        trace("client:c", "in", b'{"n":%d}' % i)
    assert trace.statistics().dropped == 2
    assert trace.statistics().queued == 3
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(trace.run)
            await trace.wait_flushed()
            assert trace.statistics().written == 3
            trace("client:c", "in", b'{"n":5}')  # room again: the marker goes first
            trace.close()
            trace("client:c", "in", b'{"n":6}')  # after close: counted, never raised
    assert [r.get("msg", r) for r in read_records(path)] == [
        {"n": 0},
        {"n": 1},
        {"n": 2},
        {"t": 5, "dropped": 2},
        {"n": 5},
        {"t": 7, "dropped": 1},  # the one after close, owed at the end
    ]
    stats = trace.statistics()
    assert (stats.written, stats.dropped, stats.queued, stats.queued_bytes) == (6, 3, 0, 0)


async def test_byte_bound_drops_what_does_not_fit(tmp_path):
    """The queue is bounded in bytes too; a single message always fits an empty queue."""
    path = tmp_path / "trace.jsonl"
    trace = WireTrace(open_trace_file(path), redactor=None, max_bytes=20)
    trace("agent:a", "out", b'{"big":"' + b"x" * 100 + b'"}')  # alone: fits
    trace("agent:a", "out", b'{"n":1}')  # over the byte bound: dropped
    assert trace.statistics().dropped == 1
    assert trace.statistics().queued_bytes == 110
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trace.run)
            trace.close()
    records = read_records(path)
    assert records[-1]["dropped"] == 1  # owed at the end: still reported
    assert len(records) == 2


class _FullDisk:
    def write(self, data):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass

    def close(self):
        pass


async def test_the_latest_records_written_are_kept_redacted_within_both_bounds():
    """``recent()``: what was written, as written (secrets hidden), the latest
    RECENT_RECORDS of them and about RECENT_BYTES at most, oldest first."""
    redactor = Redactor()
    redactor.add("sekrit-value-1234")
    trace = WireTrace(io.BytesIO(), redactor=redactor)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(trace.run)
            trace("client:c", "in", b'{"secret":"sekrit-value-1234"}')
            await trace.wait_flushed()
            (first,) = trace.recent()
            assert b"sekrit" not in first
            assert json.loads(first)["msg"] == {"secret": "***"}
            for i in range(RECENT_RECORDS + 10):
                trace("agent:a", "out", b'{"n":%d}' % i)
            await trace.wait_flushed()
            recent = trace.recent()
            assert len(recent) == RECENT_RECORDS
            assert [json.loads(r)["msg"]["n"] for r in recent[:1] + recent[-1:]] == [
                10,
                RECENT_RECORDS + 9,
            ]
            big = b'{"big":"' + b"x" * (RECENT_BYTES // 3) + b'"}'
            for _ in range(4):
                trace("agent:a", "in", big)
                await trace.wait_flushed()
            recent = trace.recent()
            assert sum(map(len, recent)) <= RECENT_BYTES
            assert len(recent) == 2  # the last two big ones
            trace.close()


async def test_a_file_that_fails_stops_the_trace_not_the_bridge():
    """A write error is logged once; later messages are counted as dropped; nothing raises."""
    trace = WireTrace(_FullDisk(), redactor=None)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(trace.run)
            trace("client:c", "in", b"{}")
            await trace.wait_flushed()
            trace("client:c", "in", b"{}")
            trace.close()
    stats = trace.statistics()
    assert (stats.written, stats.dropped) == (0, 2)


async def test_cancelled_writer_still_writes_what_was_queued(tmp_path):
    """Cancellation (a signal ending the daemon) does not lose queued records."""
    path = tmp_path / "trace.jsonl"
    trace = WireTrace(open_trace_file(path), redactor=None)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(trace.run)
            for i in range(3):
                trace("client:c", "out", b'{"n":%d}' % i)
            nursery.cancel_scope.cancel()
    assert [r["msg"]["n"] for r in read_records(path)] == [0, 1, 2]


# -- trace show --------------------------------------------------------------------------------


def rec(t, link, direction, msg):
    return json.dumps({"t": t, "link": link, "dir": direction, "msg": msg})


def update(sid, kind, **fields):
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": {"sessionUpdate": kind, **fields}},
    }


TRACE = [
    rec(100.0, "client:stdio", "in", {"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
    rec(100.1, "client:stdio", "out", {"jsonrpc": "2.0", "id": 1, "result": {}}),
    rec(
        100.2,
        "client:stdio",
        "in",
        {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/w"}},
    ),
    rec(
        100.3,
        "agent:b",
        "out",
        {"jsonrpc": "2.0", "id": 7, "method": "session/new", "params": {"cwd": "/w"}},
    ),
    rec(100.4, "agent:b", "in", {"jsonrpc": "2.0", "id": 7, "result": {"sessionId": "s1"}}),
    rec(100.5, "client:stdio", "out", {"jsonrpc": "2.0", "id": 2, "result": {"sessionId": "s1~b"}}),
    rec(
        101.0,
        "client:stdio",
        "in",
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "session/prompt",
            "params": {"sessionId": "s1~b", "prompt": [{"type": "text", "text": "hi\nthere"}]},
        },
    ),
    rec(
        101.1,
        "agent:b",
        "in",
        update("s1", "agent_message_chunk", content={"type": "text", "text": "x" * 200}),
    ),
    rec(101.2, "agent:b", "in", update("s1", "tool_call", toolCallId="t1", title="Edit notes")),
    rec(
        101.3,
        "agent:b",
        "in",
        {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "session/request_permission",
            "params": {"sessionId": "s1", "toolCall": {"title": "Edit notes", "kind": "edit"}},
        },
    ),
    rec(
        101.4,
        "client:stdio",
        "out",
        {
            "jsonrpc": "2.0",
            "id": 40,
            "method": "session/request_permission",
            "params": {"sessionId": "s1~b", "toolCall": {"title": "Edit notes", "kind": "edit"}},
        },
    ),
    rec(
        101.5,
        "client:stdio",
        "in",
        {
            "jsonrpc": "2.0",
            "id": 40,
            "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
        },
    ),
    rec(
        101.6,
        "agent:b",
        "out",
        {
            "jsonrpc": "2.0",
            "id": 9,
            "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
        },
    ),
    json.dumps({"t": 101.65, "dropped": 4}),
    rec(
        101.7,
        "client:stdio",
        "out",
        {"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}},
    ),
    rec(
        102.0,
        "client:stdio",
        "in",
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "session/prompt",
            "params": {"sessionId": "nope", "prompt": []},
        },
    ),
    rec(
        102.1,
        "client:stdio",
        "out",
        {"jsonrpc": "2.0", "id": 4, "error": {"code": -32002, "message": "unknown session"}},
    ),
    rec(102.2, "client:stdio", "in", {"raw": "not json at all"}),
    "this line is no record",
]


def test_trace_show_groups_per_session_with_one_line_per_message():
    """Sessions get their own group (the agent's own id folded in), the rest is 'connection'."""
    out = list(render_trace(TRACE))
    text = "\n".join(out)
    headers = [line for line in out if line.startswith("==")]
    assert headers == [
        "== connection (messages without a session)",
        "== session s1~b (agent b)",
        "== session nope (agent ?)",
    ]
    session = out[
        out.index("== session s1~b (agent b)") + 1 : out.index("== session nope (agent ?)")
    ]
    session = [line for line in session if line]
    assert len(session) == 12  # session/new moved in with its answer, 11 more on both links
    assert session[0] == "    +0.200s  client:stdio       → session/new  cwd /w"
    assert "agent:b            → response id 7 (session/new)  sessionId s1" in text
    assert '→ session/prompt  "hi⏎there"' in text
    assert '→ session/update  agent_message_chunk "' + "x" * 59 + '…"' in text
    assert '→ session/update  tool_call "Edit notes"' in text
    assert '← session/request_permission  "Edit notes" (edit)' in text
    assert "→ response id 40 (session/request_permission)  outcome selected allow" in text
    assert "← response id 9 (session/request_permission)  outcome selected allow" in text
    assert "← response id 3 (session/prompt)  stopReason end_turn" in text
    assert '← response id 4 (session/prompt)  error -32002: "unknown session"' in text
    assert '→ (not JSON) "not json at all"' in text
    assert "!! 4 messages not recorded (dropped)" in text
    assert out[-2:] == [
        "!! 4 messages were dropped while tracing (the writer fell behind)",
        "!! 1 lines were not trace records",
    ]


def test_trace_show_one_session():
    """--session keeps one group; an unknown one says so."""
    out = list(render_trace(TRACE, session="s1~b"))
    assert [line for line in out if line.startswith("==")] == ["== session s1~b (agent b)"]
    assert (
        next(iter(render_trace(TRACE, session="zzz"))) == "no messages of session zzz in this trace"
    )


async def test_trace_show_renders_a_real_trace_per_session(tmp_path, capsys):
    """Two sessions on two agents, traced live, come out as two session groups."""
    path = tmp_path / "trace.jsonl"
    agents = {"a": FakeAgent("a"), "b": FakeAgent("b", prefix="b")}
    with trio.fail_after(TIMEOUT):
        async with traced_bridge(path, agents) as (client, _):
            sid_a = await client.new_session("a")
            sid_b = await client.new_session("b")
            await client.prompt(sid_a, "count 1")
            await client.prompt(sid_b, "count 2")
    assert main(["trace", "show", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("==")] == [
        "== connection (messages without a session)",
        f"== session {sid_a} (agent a)",
        f"== session {sid_b} (agent b)",
    ]
    group_b = out[out.index(f"== session {sid_b} (agent b)") :]
    assert (
        sum("session/update  agent_message_chunk" in line for line in group_b) == 4
    )  # 2 updates, 2 links each
    assert main(["trace", "show", str(path), "--session", sid_a]) == 0
    assert f"== session {sid_b} (agent b)" not in capsys.readouterr().out
    assert main(["trace", "show", str(tmp_path / "missing")]) == 1
    assert "missing" in capsys.readouterr().err


# -- the command line --------------------------------------------------------------------------
