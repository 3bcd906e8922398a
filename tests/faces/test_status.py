"""Status and metrics: /status and /metrics (token, Host), Prometheus text, `acp-bridge status`."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import socket

import attrs
import pytest
import trio

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.cli.main import main
from acp_bridge.config.model import Config, WebSocketConfig
from acp_bridge.engine.bridge import Bridge
from acp_bridge.faces.serve import serve_websocket
from acp_bridge.faces.status import StatusError, format_status, render_metrics, status_url
from acp_bridge.policy.rules import parse_policy
from tests.faces.test_ws import (
    AUTH,
    NEW_SESSION,
    TIMEOUT,
    TOKEN,
    get_request,
    http_exchange,
    open_peer,
    ws_config,
)
from tests.support.fakes import FakeAgent

#: One sample line of the text exposition format: name, optional labels, integer value.
SAMPLE = re.compile(r'^([a-z_]+)(?:\{((?:[a-z_]+="(?:[^"\\]|\\.)*",?)*)\})? (-?\d+)$')
LABEL = re.compile(r'([a-z_]+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
    """Every sample of a Prometheus text exposition; asserts each family has HELP and TYPE."""
    assert text.endswith("\n")
    samples = {}
    described: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# "):
            kind, name, _ = line[2:].split(" ", 2)
            assert kind in ("HELP", "TYPE"), line
            described.setdefault(name, set()).add(kind)
            continue
        match = SAMPLE.match(line)
        assert match is not None, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        assert described.get(name) == {"HELP", "TYPE"}, f"{name} lacks HELP/TYPE"
        key = (name, tuple(LABEL.findall(labels or "")))
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = int(value)
    return samples


def metric(samples, name, **labels):
    return samples.get((name, tuple(labels.items())))


def get_with_token(port: int, target: str, *, host: str | None = None) -> bytes:
    host = host if host is not None else f"127.0.0.1:{port}"
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{AUTH}\r\n\r\n".encode()


@contextlib.asynccontextmanager
async def open_server(agents, *, policy=None):
    """A bridge over fake agents behind the WebSocket face (optionally with a policy)."""
    config = ws_config(agents)
    if policy is not None:
        parsed, problems = parse_policy(policy)
        assert problems == []
        config = attrs.evolve(config, policy=parsed)
    async with trio.open_nursery() as nursery:
        bridge = await nursery.start(Bridge(config, make_in_process_launcher(dict(agents))).run)
        info = await nursery.start(functools.partial(serve_websocket, bridge, config))
        yield bridge, info.port
        nursery.cancel_scope.cancel()


# -- the pure part -----------------------------------------------------------------------------

STATUS = {
    "defaultAgent": "a",
    "agents": [
        {
            "name": "a",
            "state": "ready",
            "pid": 42,
            "starts": 3,
            "restarts": 2,
            "sessions": 1,
            "queueDepth": 5,
            "pendingRequests": 1,
        },
        {
            "name": 'we"ird\\na\nme',
            "state": "dead",
            "pid": None,
            "starts": 1,
            "restarts": 0,
            "sessions": 0,
            "queueDepth": 0,
            "pendingRequests": 0,
        },
    ],
    "sessions": [
        {
            "sessionId": "s1",
            "agent": "a",
            "state": "active",
            "connection": "ws:1234abcd",
            "pendingApprovals": 2,
            "historyLastSeq": 9,
        },
        {
            "sessionId": "s2",
            "agent": "a",
            "state": "active",
            "connection": None,
            "pendingApprovals": 0,
            "historyLastSeq": 0,
        },
    ],
    "connections": [
        {"name": "ws:1234abcd", "transport": "ws", "queueDepth": 3, "pendingRequests": 1},
        {"name": "http:9876fedc", "transport": "http", "queueDepth": 0, "pendingRequests": 0},
    ],
    "counters": {"from_client": 10, "to_agent": 9, "error:-32601": 2, "error:-32003": 1},
    "approvals": {"allow:client": 4, "deny:policy": 1},
    "memory": {
        "rssKiB": 73_728,
        "heapInUseKiB": 18_432,
        "heapFreeKiB": 2_048,
        "pythonBlocks": 512_345,
        "historyEntries": 48_213,
        "historyKiB": 10_240,
    },
}


def test_metrics_text_has_every_family_with_help_type_and_escaped_labels():
    """Each sample parses as `name{labels} value`; label values are escaped; zeros are shown."""
    text = render_metrics(STATUS)
    samples = parse_metrics(text)
    assert metric(samples, "acp_bridge_messages_total", direction="from_client") == 10
    assert metric(samples, "acp_bridge_messages_total", direction="to_client") == 0
    assert metric(samples, "acp_bridge_messages_total", direction="to_agent") == 9
    assert metric(samples, "acp_bridge_errors_total", code="-32601") == 2
    assert metric(samples, "acp_bridge_errors_total", code="-32003") == 1
    assert metric(samples, "acp_bridge_approvals_total", decision="allow", source="client") == 4
    assert metric(samples, "acp_bridge_approvals_total", decision="deny", source="policy") == 1
    assert metric(samples, "acp_bridge_agent_restarts_total", agent="a") == 2
    assert metric(samples, "acp_bridge_agent_up", agent="a") == 1
    assert metric(samples, "acp_bridge_agent_up", agent='we\\"ird\\\\na\\nme') == 0
    assert metric(samples, "acp_bridge_sessions") == 2
    assert metric(samples, "acp_bridge_connections") == 2
    assert metric(samples, "acp_bridge_queue_depth", link="client:ws:1234abcd") == 3
    assert metric(samples, "acp_bridge_queue_depth", link="agent:a") == 5
    assert metric(samples, "acp_bridge_memory_bytes", kind="resident") == 73_728 * 1024
    assert metric(samples, "acp_bridge_memory_bytes", kind="heap_in_use") == 18_432 * 1024
    assert metric(samples, "acp_bridge_memory_bytes", kind="heap_free") == 2_048 * 1024
    assert metric(samples, "acp_bridge_memory_bytes", kind="history") == 10_240 * 1024
    assert metric(samples, "acp_bridge_python_allocated_blocks") == 512_345
    assert "# TYPE acp_bridge_messages_total counter" in text
    assert "# TYPE acp_bridge_agent_up gauge" in text


def test_metrics_of_an_idle_bridge_still_name_every_family():
    """No traffic yet: every family is declared; counters of directions are zero."""
    text = render_metrics({"agents": [], "sessions": [], "connections": [], "counters": {}})
    samples = parse_metrics(text)
    for family in (
        "acp_bridge_messages_total",
        "acp_bridge_errors_total",
        "acp_bridge_approvals_total",
        "acp_bridge_agent_restarts_total",
        "acp_bridge_agent_up",
        "acp_bridge_sessions",
        "acp_bridge_connections",
        "acp_bridge_queue_depth",
    ):
        assert f"# TYPE {family} " in text
    assert metric(samples, "acp_bridge_messages_total", direction="from_agent") == 0
    assert metric(samples, "acp_bridge_sessions") == 0


def test_status_summary_names_agents_sessions_and_queues():
    """The readable summary: pid/state/restarts, session agent/connection/approvals, queues."""
    text = format_status(STATUS, url="http://127.0.0.1:8765")
    lines = text.splitlines()
    assert lines[0] == "acp-bridge http://127.0.0.1:8765  (default agent: a)"
    agent = next(line for line in lines if line.strip().startswith("a "))
    assert re.search(r"ready\s+pid 42\s+restarts 2", agent)
    assert "queue 5" in agent
    s1 = next(line for line in lines if line.strip().startswith("s1"))
    assert re.search(r"agent a\s+active\s+connection ws:1234abcd\s+pending approvals 2", s1)
    s2 = next(line for line in lines if line.strip().startswith("s2"))
    assert "(detached)" in s2
    assert "ws:1234abcd      ws    queue 3" in text
    assert "http:9876fedc    http  queue 0" in text
    assert "errors: -32003=1, -32601=2" in text
    assert "approvals: allow:client=4, deny:policy=1" in text
    assert (
        "memory: resident 72.0 MiB, heap in use 18.0 MiB, heap kept free 2.0 MiB, "
        "histories 10.0 MiB in 48,213 updates"
    ) in lines


def test_memory_figures_a_platform_does_not_tell_are_left_out():
    """Without glibc (no heap figures) the summary and the metrics show what there is."""
    status = {**STATUS, "memory": {"rssKiB": 2048, "pythonBlocks": 7, "historyKiB": 0}}
    assert "memory: resident 2.0 MiB, histories 0.0 MiB in 0 updates" in format_status(status)
    samples = parse_metrics(render_metrics(status))
    assert metric(samples, "acp_bridge_memory_bytes", kind="resident") == 2048 * 1024
    assert metric(samples, "acp_bridge_memory_bytes", kind="heap_in_use") is None
    assert metric(samples, "acp_bridge_memory_bytes", kind="history") == 0
    assert "memory:" not in format_status({**STATUS, "memory": {}})


@pytest.mark.parametrize(
    ("settings", "url", "expected"),
    [
        pytest.param({}, None, "http://127.0.0.1:8765/status", id="default"),
        pytest.param({"host": "0.0.0.0", "port": 9}, None, "http://127.0.0.1:9/status", id="any"),
        pytest.param({"host": "::1", "port": 9}, None, "http://[::1]:9/status", id="ipv6"),
        pytest.param({}, "ws://localhost:7/acp", "http://localhost:7/status", id="ws-url"),
        pytest.param({}, "wss://h.example:7/acp", "https://h.example:7/status", id="wss-url"),
        pytest.param({}, "http://127.0.0.1:7", "http://127.0.0.1:7/status", id="http-base"),
    ],
)
def test_status_url(settings, url, expected):
    """The daemon's address: from [websocket] (wildcards mean loopback), or any URL's host."""
    config = Config(agents={}, websocket=WebSocketConfig(**settings))
    assert status_url(config, url) == expected


def test_status_url_refuses_other_schemes():
    """Only http(s) and ws(s) URLs name a daemon."""
    with pytest.raises(StatusError, match="not a daemon URL"):
        status_url(Config(agents={}), "ftp://x/")


# -- the HTTP routes ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["/status", "/metrics"])
async def test_status_and_metrics_need_the_token_and_the_right_host(target):
    """401 without the token (or a wrong one), 403 for a foreign Host, 405 for POST, else 200."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as (_, port):
            bare = await http_exchange(port, get_request(port, target))
            assert bare.status == 401
            assert bare.headers["www-authenticate"].startswith("Bearer")
            assert b"agent" not in bare.body
            wrong = await http_exchange(
                port,
                f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Authorization: Bearer nope\r\n\r\n".encode(),
            )
            assert wrong.status == 401
            foreign = await http_exchange(port, get_with_token(port, target, host="evil.example"))
            assert foreign.status == 403
            post = await http_exchange(port, get_request(port, target, method="POST"))
            assert post.status == 405
            ok = await http_exchange(port, get_with_token(port, target))
            assert ok.status == 200
            by_query = await http_exchange(port, get_request(port, f"{target}?token={TOKEN}"))
            assert by_query.status == 200


async def test_status_shows_agents_sessions_connections_and_counters():
    """/status is Bridge.status() as JSON: the live session with its agent and connection."""
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as (_, port), open_peer(port) as peer:
            reply = await peer.request("session/new", NEW_SESSION)
            sid = reply["result"]["sessionId"]
            response = await http_exchange(port, get_with_token(port, "/status"))
            assert response.headers["content-type"] == "application/json"
            status = json.loads(response.body)
            assert [a["name"] for a in status["agents"]] == ["a"]
            assert status["agents"][0]["state"] == "ready"
            [session] = status["sessions"]
            assert session["sessionId"] == sid
            assert session["agent"] == "a"
            [connection] = status["connections"]
            assert session["connection"] == connection["name"]
            assert status["counters"]["from_client"] == 2
            memory = status["memory"]
            assert memory["historyEntries"] == 0
            assert memory["rssKiB"] > 1024
            assert memory["pythonBlocks"] > 1000
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}
            await peer.request("session/prompt", prompt)
            response = await http_exchange(port, get_with_token(port, "/status"))
            status = json.loads(response.body)
            # what the prompt turn recorded for replay, nothing trimmed yet
            [session] = status["sessions"]
            assert status["memory"]["historyEntries"] == session["historyLastSeq"] > 0


async def test_metrics_counters_move_after_a_prompt():
    """A prompt turn raises the message counters; an allowed permission counts as an approval."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": FakeAgent("a")}, policy={"default": "allow"}) as (_, port),
            open_peer(port) as peer,
        ):
            sid = (await peer.request("session/new", NEW_SESSION))["result"]["sessionId"]
            before = await http_exchange(port, get_with_token(port, "/metrics"))
            assert before.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            b = parse_metrics(before.body.decode())
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "permission"}]}
            reply = await peer.request("session/prompt", prompt)
            assert reply["result"]["stopReason"] == "end_turn"
            unknown = await peer.request("no/such_method", {})
            assert unknown["error"]["code"] == -32601
            after = parse_metrics(
                (await http_exchange(port, get_with_token(port, "/metrics"))).body.decode()
            )

            def moved(direction):
                name = "acp_bridge_messages_total"
                return metric(after, name, direction=direction) - metric(
                    b, name, direction=direction
                )

            assert moved("from_client") == 2
            assert moved("to_agent") >= 2  # the prompt, the permission answer
            assert moved("from_agent") >= 3  # the permission request, an update, the answer
            assert moved("to_client") >= 3
            assert metric(after, "acp_bridge_errors_total", code="-32601") == 1
            approvals = {
                dict(labels)["decision"]: value
                for (name, labels), value in after.items()
                if name == "acp_bridge_approvals_total"
            }
            assert approvals == {"allow": 1}
            assert metric(after, "acp_bridge_agent_up", agent="a") == 1
            assert metric(after, "acp_bridge_sessions") == 1
            assert metric(after, "acp_bridge_connections") == 1


# -- acp-bridge status -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_without_a_daemon_is_a_clear_error(tmp_path, capsys):
    """Nothing listening: exit 1, and the message says the daemon is not running."""
    config = tmp_path / "c.toml"
    config.write_text(
        f'[agents.a]\ncommand = "x"\n[websocket]\nport = {free_port()}\ntoken = "t"\n'
    )
    assert main(["status", "--config", str(config)]) == 1
    assert "is `acp-bridge serve` running?" in capsys.readouterr().err


def test_status_without_a_token_file_says_where_it_looked(tmp_path, capsys):
    """No token anywhere (the daemon never ran): exit 1 naming the file."""
    assert main(["status", "--url", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "no token file at" in capsys.readouterr().err
