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
import shlex
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import trio

from acp_bridge.faces.early import ENV_SWITCH
from acp_bridge.protocol.diagnostics import LOG_METHOD
from acp_bridge.protocol.jsonrpc import dumps, loads

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

from tests.e2e.test_stdio import BridgeProcess, _reap
from tests.faces.test_early import DEMO, INIT, request, session_new

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


def test_the_standard_library_phase_loads_no_heavy_module():
    code = (
        "import sys, acp_bridge.faces.early, acp_bridge.protocol.initialize;"
        "import acp_bridge.agents.prespawn;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'trio', 'attrs', 'cattrs', 'structlog', 'asyncio'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    assert out.stdout.strip() == "[]"
