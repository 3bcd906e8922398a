"""
``acp-bridge stdio`` answers the first ``initialize`` before its heavy imports (``faces.early``).

End to end through real processes: the early answer is taken (its debug log line says so),
is byte for byte the answer of the trio path (``ACP_BRIDGE_EARLY_INIT=0``), and what came
around it is not lost (pipelined requests, an agent's stray stdout); what it does not take,
and every way an agent's ``initialize`` fails, ends as it does without it. The pure parts
are tested without processes.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import select
import shlex
import subprocess
import sys
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import trio

from acp_bridge.agents.prespawn import Prespawned, Spawn
from acp_bridge.faces.early import (
    EARLY_ID,
    ENV_SWITCH,
    Background,
    answer_early,
    client_request,
    find_answer,
    v2_asked,
)
from acp_bridge.protocol.diagnostics import LOG_METHOD
from acp_bridge.protocol.jsonrpc import dumps, loads
from tests.e2e.test_stdio import BridgeProcess, _reap

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

DEMO = shlex.join([sys.executable, "-m", "acp_bridge", "demo-agent"])

INIT: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": False}},
        "clientInfo": {"name": "test", "version": "1"},
        "_meta": {"acp_bridge": {"seq": True, "log": "warning"}},
    },
}

# An agent that fails its initialize the way argv[1] says (or never answers: "silent").
FAKE_AGENT = r"""
import json, os, sys
mode = sys.argv[1]
with open(os.path.join(os.path.dirname(__file__), "starts"), "a") as starts:
    starts.write("started\n")  # (one line per start)
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") != "initialize":
        continue
    if mode == "exit":
        sys.stderr.write("cannot find my model\n")
        sys.exit(3)
    if mode == "silent":
        continue
    if mode == "error":
        out = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32000, "message": "log in"}}
    else:
        out = {"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": 2}}
    print(json.dumps(out), flush=True)
"""


class Stdio(BridgeProcess):
    """``acp-bridge stdio`` as a subprocess: its raw stdout lines kept, its log read after."""

    def __init__(self, proc: trio.Process, log: Path) -> None:
        super().__init__(proc)
        self.log = log
        self.raw: list[bytes] = []

    async def next_message(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while not self.lines:
            data = await self.proc.stdout.receive_some(65536)
            assert data, f"the bridge closed stdout; got {self.messages}"
            for line in self.decoder.feed(data):
                assert isinstance(line, bytes)
                self.lines.append(line)
                self.raw.append(line)
        msg = loads(self.lines.pop(0))
        self.messages.append(msg)
        return msg

    async def answer(self, req_id: object) -> dict[str, Any]:
        """The answer to ``req_id`` (read up to it)."""
        while True:
            for msg in self.messages:
                if msg.get("id") == req_id and "method" not in msg:
                    return msg
            await self.next_message()

    def raw_answer(self, req_id: object) -> bytes:
        for line, msg in zip(self.raw, self.messages, strict=False):
            if msg.get("id") == req_id and "method" not in msg:
                return line
        raise AssertionError(f"no answer to {req_id!r}")

    def events(self) -> list[dict[str, Any]]:
        data = self.log.read_bytes()
        return [json.loads(line) for line in data.splitlines() if line.startswith(b"{")]

    def early(self) -> list[str]:
        """The early phase's log lines: answered, skipped or abandoned."""
        return [e["event"] for e in self.events() if e["event"].startswith("early_initialize")]


_runs = itertools.count()


@asynccontextmanager
async def stdio(tmp_path: Path, args: list[str], *, early: bool = True) -> AsyncIterator[Stdio]:
    """The bridge with ``args`` (the early answer on or off); its input closed at the end."""
    env = {**os.environ, ENV_SWITCH: "1" if early else "0"}
    argv = [sys.executable, "-m", "acp_bridge", "stdio", *args]
    argv += ["--log-level", "debug", "--log-format", "json"]
    log = tmp_path / f"bridge-{early}-{next(_runs)}.log"
    with trio.fail_after(60), log.open("wb") as stderr:
        async with trio.open_nursery() as nursery:
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env
            )
            nursery.start_soon(_reap, proc)
            bridge = Stdio(proc, log)
            yield bridge
            assert proc.stdin is not None
            await proc.stdin.aclose()
            assert await proc.wait() == 0


def request(req_id: object, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}


def session_new(req_id: object, cwd: Path) -> dict[str, Any]:
    return request(req_id, "session/new", {"cwd": str(cwd), "mcpServers": []})


def prompt(req_id: object, sid: str) -> dict[str, Any]:
    return request(
        req_id, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
    )


def two_agents(tmp_path: Path, extra: str = "") -> list[str]:
    """A file of two demo agents, the second the default (the answer lists both, in order)."""
    path = tmp_path / "bridge.toml"
    agent = f"command = {json.dumps(sys.executable)}\nargs = ['-m', 'acp_bridge', 'demo-agent']\n"
    path.write_text(
        f"[bridge]\ndefault_agent = 'second'\n{extra}\n"
        f"[agents.first]\n{agent}[agents.second]\n{agent}"
    )
    return ["--config", str(path)]


def fake_agent(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    return ["--agent", "a=" + shlex.join([sys.executable, str(script), mode])]


# ---------------------------------------------------------------- end to end


async def test_initialize_answered_early_then_a_session_and_a_prompt(tmp_path):
    async with stdio(tmp_path, ["--agent", f"a={DEMO}"]) as bridge:
        await bridge.send(INIT)
        assert (await bridge.answer(0))["result"]["protocolVersion"] == 1
        await bridge.send(session_new(1, tmp_path))
        sid = (await bridge.answer(1))["result"]["sessionId"]
        await bridge.send(prompt(2, sid))
        assert (await bridge.answer(2))["result"]["stopReason"] == "end_turn"
        updates = [m for m in bridge.messages if m.get("method") == "session/update"]
        # (want_seq, as the client's initialize asked, is noted on its link)
        assert updates
        assert all("seq" in m["params"]["_meta"]["acp_bridge"] for m in updates)
        # The agent was adopted ready with what it answered early: one start, one initialize.
        await bridge.send(request(3, "_acp_bridge/agents", {}))
        agents = (await bridge.answer(3))["result"]["agents"]
        assert [(a["name"], a["state"], a["starts"]) for a in agents] == [("a", "ready", 1)]
        assert agents[0]["agentInfo"]["name"] == "acp-bridge-demo"
    assert bridge.early() == ["early_initialize_answered"]


async def test_the_early_answer_is_the_trio_paths_byte_for_byte(tmp_path):
    args = two_agents(tmp_path)
    raw = {}
    for early in (True, False):
        async with stdio(tmp_path, args, early=early) as bridge:
            await bridge.send(INIT)
            await bridge.answer(0)
            raw[early] = bridge.raw_answer(0)
        assert bridge.early() == (["early_initialize_answered"] if early else [])
    assert raw[True] == raw[False]
    meta = loads(raw[True])["result"]["_meta"]["acp_bridge"]
    assert meta == {"defaultAgent": "second", "agents": ["first", "second"]}


async def test_requests_in_the_same_write_as_initialize_are_not_lost(tmp_path):
    async with stdio(tmp_path, ["--agent", f"a={DEMO}"]) as bridge:
        assert bridge.proc.stdin is not None
        payload = dumps(INIT) + dumps(session_new(1, tmp_path)) + dumps(session_new(2, tmp_path))
        await bridge.proc.stdin.send_all(payload + b'{"jsonrpc":"2.0","id":3,"method":"session/')
        await bridge.proc.stdin.send_all(b'new","params":{"cwd":"/","mcpServers":[]}}\n')
        for req_id in (0, 1, 2, 3):
            assert "result" in await bridge.answer(req_id), bridge.messages
        order = [m["id"] for m in bridge.messages if "id" in m and "method" not in m]
        assert order == [0, 1, 2, 3]
    assert bridge.early() == ["early_initialize_answered"]


async def test_stray_lines_before_the_agents_answer_are_still_reported(tmp_path):
    script = f"echo 'welcome to my shell'; echo not json either; exec {DEMO}"
    args = ["--agent", "a=" + shlex.join(["sh", "-c", script])]
    async with stdio(tmp_path, args) as bridge:
        await bridge.send(INIT)
        await bridge.answer(0)
        await bridge.send(session_new(1, tmp_path))
        assert "result" in await bridge.answer(1)
        # (the log channel, at warning: INIT asks for it; before session/new's answer)
        strays = [
            m["params"]["data"]["message"]
            for m in bridge.messages
            if m.get("method") == LOG_METHOD and m["params"]["data"].get("stream") == "stdout"
        ]
    assert strays == ["welcome to my shell", "not json either"]
    logged = [e["line"] for e in bridge.events() if e["event"] == "agent_stdout"]
    assert logged == ["welcome to my shell", "not json either"]
    assert bridge.early() == ["early_initialize_answered"]


@pytest.mark.parametrize("mode", ["exit", "error", "v2"])
async def test_an_agent_failing_initialize_gives_the_usual_error(tmp_path, mode):
    errors = {}
    for early in (True, False):
        (tmp_path / "starts").unlink(missing_ok=True)
        async with stdio(tmp_path, fake_agent(tmp_path, mode), early=early) as bridge:
            await bridge.send(INIT)
            errors[early] = (await bridge.answer(0))["error"]
        assert bridge.early() == (["early_initialize_left"] if early else [])
        # (the one agent that got the initialize answers for it: no second start)
        assert (tmp_path / "starts").read_text().count("started") == 1
    assert errors[True] == errors[False]
    assert "a" in errors[True]["message"] or errors[True]["code"] == -32000


async def test_an_agent_silent_past_its_start_timeout_gives_the_usual_error(tmp_path):
    config = tmp_path / "bridge.toml"
    script = tmp_path / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    config.write_text(
        f"[agents.a]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(script))}, 'silent']\nstart_timeout = 0.3\n"
    )
    errors = {}
    for early in (True, False):
        (tmp_path / "starts").unlink(missing_ok=True)
        async with stdio(tmp_path, ["--config", str(config)], early=early) as bridge:
            await bridge.send(INIT)
            errors[early] = (await bridge.answer(0))["error"]
        assert bridge.early() == (["early_initialize_left"] if early else [])
        # One agent, one start_timeout: not a second agent waited for as long again.
        assert (tmp_path / "starts").read_text().count("started") == 1
    assert errors[True] == errors[False]
    assert "did not answer initialize within 0.3s" in errors[True]["message"]


async def test_experimental_v2_and_a_v2_initialize_take_the_usual_path(tmp_path):
    async with stdio(tmp_path, two_agents(tmp_path, "experimental_v2 = true")) as bridge:
        await bridge.send(INIT)
        assert (await bridge.answer(0))["result"]["protocolVersion"] == 1
    assert bridge.early() == ["early_initialize_skipped"]
    v2 = {**INIT, "params": {**INIT["params"], "protocolVersion": 2}}
    async with stdio(tmp_path, ["--agent", f"a={DEMO}"]) as bridge:
        await bridge.send(v2)
        assert (await bridge.answer(0))["result"]["protocolVersion"] == 1
    assert bridge.early() == ["early_initialize_skipped"]


async def test_another_first_request_takes_the_usual_path(tmp_path):
    async with stdio(tmp_path, ["--agent", f"a={DEMO}"]) as bridge:
        await bridge.send(session_new(1, tmp_path))
        assert "initialize" in (await bridge.answer(1))["error"]["message"]
        await bridge.send(INIT)
        assert (await bridge.answer(0))["result"]["protocolVersion"] == 1
    assert bridge.early() == ["early_initialize_skipped"]


# ---------------------------------------------------------------- the pure parts


def test_the_standard_library_phase_loads_no_heavy_module():
    code = (
        "import sys, acp_bridge.faces.early, acp_bridge.protocol.initialize;"
        "import acp_bridge.agents.prespawn;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'trio', 'attrs', 'cattrs', 'structlog', 'asyncio'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    assert out.stdout.strip() == "[]"


def test_which_first_lines_the_early_answer_takes():
    def line(params: object, method: str = "initialize", **extra: object) -> bytes:
        msg = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params, **extra}
        return dumps(msg).rstrip(b"\n")

    assert client_request(line({"protocolVersion": 1})) is not None
    assert client_request(line({"protocolVersion": 0, "_meta": {"acp_bridge": {"log": "info"}}}))
    assert client_request(line({"protocolVersion": 2})) is None  # (v2: the usual path)
    assert client_request(line({"protocolVersion": "1"})) is None  # (the bridge's error)
    assert (
        client_request(line({"protocolVersion": 1, "_meta": {"acp_bridge": {"log": "x"}}})) is None
    )
    assert client_request(line({"protocolVersion": 1}, "session/new")) is None
    assert client_request(b'{"jsonrpc":"2.0","method":"initialize","params":{}}') is None
    assert client_request(b"not json") is None
    assert client_request(line({"protocolVersion": 1, "pad": "x" * 40000})) is None


def test_the_agents_answer_is_found_among_its_other_lines():
    answer = dumps({"jsonrpc": "2.0", "id": EARLY_ID, "result": {"protocolVersion": 1}})
    other = dumps({"jsonrpc": "2.0", "id": 5, "result": {}})
    stray = b'hello "id" there\n'
    data = stray + other + answer + b"partial"
    found = find_answer(data)
    assert found is not None
    msg, start, end = found
    assert msg["result"] == {"protocolVersion": 1}
    assert data[start:end] == answer
    assert data[:start] + data[end:] == stray + other + b"partial"
    assert find_answer(stray + other + answer.rstrip(b"\n")) is None  # (not a whole line yet)


def test_v2_is_asked_by_the_flag_or_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[bridge]\nexperimental_v2 = true\n")
    assert v2_asked(str(path), False)
    assert v2_asked(None, True)
    path.write_text("[bridge]\nexperimental_v2 = false\n")
    assert not v2_asked(str(path), False)
    assert not v2_asked(None, False)
    assert not v2_asked(str(tmp_path / "missing.toml"), False)


def test_imports_done_before_a_whole_line_hand_over_what_was_read():
    """The client sent half a line when the imports ended: nothing answered, nothing lost."""
    half = b'{"jsonrpc":"2.0","id":0,"meth'
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, half)
        background = Background(lambda: None, lambda: None)
        background.start()
        spawned = Prespawned("a", Spawn(["agent"], {}, None))  # (never touched: no popen)
        hand = answer_early(spawned, background, -1, stdin_fd=read_end)
        background.join()
        os.set_blocking(read_end, False)
        try:
            unread = os.read(read_end, 100)
        except BlockingIOError:
            unread = b""
    finally:
        os.close(read_end)
        os.close(write_end)
    # (read before the imports' end was seen, or left in the pipe: either way, all there)
    assert hand.stdin + unread == half
    assert hand.request is None
    assert [event for event, _ in hand.notes] == ["early_initialize_skipped"]


def test_the_early_answer_without_processes_and_without_waiting_for_the_imports():
    """
    The whole exchange over pipes: the agent (played by the configuration's loading, so
    that its answer is read before the configuration is there) gets the supervisor's own
    initialize; the client gets the bridge's answer as soon as both are there, not once the
    imports are done; what was read besides is handed over.
    """
    from acp_bridge.agents.prespawn import spawn_settings
    from acp_bridge.config.model import config_from_agent_specs
    from acp_bridge.protocol.initialize import agent_fields, agent_params, bridge_answer
    from acp_bridge.protocol.jsonrpc import request as rpc_request
    from acp_bridge.protocol.jsonrpc import result as rpc_result

    config = config_from_agent_specs([f"a={DEMO}", f"b={DEMO}"])
    agent_config = config.agents["a"]
    client_in, client_out = os.pipe()
    agent_in_r, agent_in_w = os.pipe()
    agent_out_r, agent_out_w = os.pipe()
    protocol_r, protocol_w = os.pipe()
    caps = {"promptCapabilities": {"image": True}, "sessionCapabilities": {"list": {}}}
    result = {"protocolVersion": 1, "agentCapabilities": caps, "authMethods": [{"id": "x"}]}
    answer_line = dumps({"jsonrpc": "2.0", "id": EARLY_ID, "result": result})
    stray = b"a banner\n"
    seen: list[bytes] = []
    released = threading.Event()
    imports_released: list[bool] = []

    def load() -> Any:
        # The agent: its initialize read, then its stray line and its answer written.
        ready, _, _ = select.select([agent_in_r], [], [], 10)
        assert ready, "no initialize reached the agent"
        seen.append(os.read(agent_in_r, 65536))
        os.write(agent_out_w, stray + answer_line)
        return config

    def imports() -> None:
        imports_released.append(released.wait(10))

    later = dumps(session_new(1, pathlib.Path("/")))
    os.write(client_out, dumps(INIT) + later)
    spawned = Prespawned("a", spawn_settings(agent_config))
    spawned.fds = (agent_in_w, agent_out_r, -1, -1)
    background = Background(load, imports)
    background.start()
    try:
        hand = answer_early(spawned, background, protocol_w, stdin_fd=client_in)
        released.set()
        background.join()
        answer = os.read(protocol_r, 65536)
    finally:
        for fd in (client_in, client_out, agent_in_r, agent_in_w, agent_out_r, agent_out_w):
            os.close(fd)
        os.close(protocol_r)
        os.close(protocol_w)
    assert imports_released == [True]  # (answered while the imports were still going)
    offered = INIT["params"]["clientCapabilities"]
    assert seen == [dumps(rpc_request(EARLY_ID, "initialize", agent_params(offered)))]
    fields = agent_fields(result)
    expected = bridge_answer(caps, [caps, {}], fields.auth_methods, "a", ["a", "b"])
    assert answer == dumps(rpc_result(0, expected))
    assert loads(answer)["result"]["agentCapabilities"]["sessionCapabilities"]["list"] == {}
    assert hand.request == INIT
    assert hand.stdin == later
    assert spawned.initialized == result
    assert spawned.stdout_rest == stray
    assert [event for event, _ in hand.notes] == ["early_initialize_answered"]
