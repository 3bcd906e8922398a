"""
``acp-bridge stdio`` loads only what the stdio path uses (issue 23: start-up).

The bridge answers ``initialize`` once its default agent has and once its own imports are done:
every module the stdio path loads but does not use is start-up time added to every editor's
first request. The WebSocket stack, the MCP server, the wire trace, the ACP v2
face (without ``--experimental-v2``) and the test helpers (``trio.testing`` brings pytest
along) are loaded where they are used, not before. And the default agent is spawned before
trio, attrs and the bridge are imported (``agents.prespawn``), so that it starts while they load.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest
import trio

from acp_bridge.protocol.diagnostics import LOG_METHOD

#: modules (and packages, with their submodules) the stdio path must not load
NOT_ON_THE_STDIO_PATH = (
    "trio_websocket",
    "h11",
    "wsproto",
    "acp_bridge.faces.ws",
    "acp_bridge.faces.serve",
    "acp_bridge.mcp.server",
    "acp_bridge.http",
    "acp_bridge.observe.trace",
    "acp_bridge.faces.v2",
    "acp_bridge.v2.core",
    "acp_bridge.v2.shapes",
    "trio.testing",
    "pytest",
    # the configuration's converter: a plain configuration is structured without it
    "cattrs",
    "acp_bridge.config.structure",
)

#: Runs the real command line (``acp-bridge stdio ...``) and writes, as it exits, every module
#: it loaded: after a whole session, so imports made inside functions on the way count too.
RUN_AND_LIST_MODULES = """
import atexit, json, sys
out = sys.argv.pop(1)
def dump():
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)
atexit.register(dump)
from acp_bridge.cli.main import main
raise SystemExit(main())
"""


def _loaded_forbidden(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if any(m == bad or m.startswith(bad + ".") for bad in NOT_ON_THE_STDIO_PATH)
    ]


#: what a session brings in on top: the sub-agent MCP server offered to it (docs/subagents.md)
FOR_A_SESSION = ("h11", "acp_bridge.mcp.server", "acp_bridge.http")


@pytest.mark.parametrize("with_session", [False, True], ids=["initialize", "session"])
async def test_stdio_loads_no_websocket_mcp_server_trace_or_test_code(tmp_path, with_session):
    """Up to ``initialize``, nothing but the stdio path; a session adds the MCP server only."""
    listing = tmp_path / "modules.json"
    demo = shlex.join([sys.executable, "-m", "acp_bridge", "demo-agent"])
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/new",
            "params": {"cwd": str(tmp_path), "mcpServers": []},
        },
    ][: 2 if with_session else 1]
    stdin = b"".join(json.dumps(m).encode() + b"\n" for m in lines)
    argv = [sys.executable, "-c", RUN_AND_LIST_MODULES, str(listing)]
    argv += ["stdio", "--agent", f"demo={demo}"]
    with trio.fail_after(60):
        done = await trio.run_process(
            argv, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    # The session really ran: the bridge answered the requests (it started the agent).
    assert [a.get("id") for a in answers if "result" in a] == [m["id"] for m in lines], answers
    modules = json.loads(listing.read_text())
    assert "acp_bridge.engine.bridge" in modules  # (the listing is the bridge's own)
    loaded = _loaded_forbidden(modules)
    if with_session:
        assert "acp_bridge.mcp.server" in loaded  # (offered to the session: the check sees it)
        loaded = [
            m for m in loaded if not any(m == ok or m.startswith(ok + ".") for ok in FOR_A_SESSION)
        ]
    assert loaded == []


def test_the_check_sees_a_forbidden_submodule():
    assert _loaded_forbidden(["trio", "trio.testing._raises_group", "acp_bridge._wsx"]) == [
        "trio.testing._raises_group"
    ]


# --- the default agent spawned before the imports (_prespawn) ---------------------------------

#: Runs the real command line and records every process it spawns (pid, argv, and which of the
#: heavy modules were loaded at that moment) in a JSON file, rewritten at each spawn.
RUN_AND_RECORD_SPAWNS = """
import json, subprocess, sys
out = sys.argv.pop(1)
HEAVY = (
    "trio",
    "attrs",
    "cattrs",
    "structlog",
    "acp_bridge.config.model",
    "acp_bridge.engine.bridge",
)
spawns = []
class Recorded(subprocess.Popen):
    def __init__(self, args, *rest, **kw):
        super().__init__(args, *rest, **kw)
        loaded = [m for m in HEAVY if m in sys.modules]
        spawns.append({"pid": self.pid, "argv": list(args), "loaded": loaded})
        with open(out, "w") as f:
            json.dump(spawns, f)
subprocess.Popen = Recorded
from acp_bridge.cli.main import main
raise SystemExit(main())
"""


def _fifo_agent(tmp_path, marker: str) -> tuple[str, str]:
    """
    An agent (``sh``) that writes its pid to a FIFO (blocking until the test reads it: the
    moment it runs is known without polling), a marker line to its stderr, then becomes the
    demo agent (``exec``: the same pid). Returns (the FIFO, the agent's --agent spec).
    """
    fifo = str(tmp_path / "started")
    os.mkfifo(fifo)
    demo = shlex.join([sys.executable, "-m", "acp_bridge", "demo-agent"])
    script = f"echo $$ > {shlex.quote(fifo)}; echo {shlex.quote(marker)} >&2; exec {demo}"
    return fifo, "a=" + shlex.join(["sh", "-c", script])


async def _started_pid(fifo: str) -> int:
    """The pid the agent writes as it starts (a blocking FIFO read, in a thread)."""

    def read() -> int:
        with open(fifo) as f:
            return int(f.read())

    return await trio.to_thread.run_sync(read, abandon_on_cancel=True)


async def test_the_default_agent_starts_before_the_imports_and_is_adopted(tmp_path):
    """
    ``acp-bridge stdio`` spawns its default agent before trio, attrs or the configuration's
    code are loaded, and before any ``initialize``; the supervisor adopts that very process
    (its pid, one start), which serves the session and whose stderr is captured. Killed, it
    is restarted through the usual launch on the next ``session/new``.
    """
    from tests.e2e.test_stdio import BridgeProcess, _reap, agent_pids, wait_gone

    spawns_file = tmp_path / "spawns.json"
    fifo, agent = _fifo_agent(tmp_path, "prespawned-stderr-marker")
    argv = [sys.executable, "-c", RUN_AND_RECORD_SPAWNS, str(spawns_file)]
    argv += ["stdio", "--agent", agent, "--log-level", "info", "--log-format", "json"]
    log = tmp_path / "bridge.log"
    with trio.fail_after(60), log.open("wb") as stderr:
        async with trio.open_nursery() as nursery:
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
            )
            nursery.start_soon(_reap, proc)
            bridge = BridgeProcess(proc)
            # Started with nothing sent to the bridge yet.
            first = await _started_pid(fifo)
            # (warnings and up as _acp_bridge/log: the agent's exit is one)
            meta = {"_meta": {"acp_bridge": {"log": "warning"}}}
            init = await bridge.call("initialize", {"protocolVersion": 1, **meta})
            assert init["result"]["protocolVersion"] == 1
            spawns = json.loads(spawns_file.read_text())
            assert spawns[0]["pid"] == first
            assert spawns[0]["argv"][0] == "sh"
            assert spawns[0]["loaded"] == []  # before the heavy imports
            assert [s["pid"] for s in spawns].count(first) == 1  # spawned once
            status = (await bridge.call("_acp_bridge/agents", {}))["result"]["agents"]
            assert [(a["pid"], a["starts"]) for a in status] == [(first, 1)]
            new = {"cwd": str(tmp_path), "mcpServers": []}
            sid = (await bridge.call("session/new", new))["result"]["sessionId"]
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}
            reply = await bridge.call("session/prompt", prompt)
            assert reply["result"]["stopReason"] == "end_turn"

            os.kill(first, signal.SIGKILL)
            while True:  # the bridge saw it go (else the next request could reach it first)
                msg = await bridge.next_message()
                if msg.get("method") == LOG_METHOD and "agent exited" in str(msg["params"]):
                    break
            await wait_gone(first)
            # The next session restarts it, through the usual launch (trio is loaded).
            await bridge.send(
                {"jsonrpc": "2.0", "id": "again", "method": "session/new", "params": new}
            )
            second = await _started_pid(fifo)
            while (await bridge.next_message()).get("id") != "again":
                pass
            assert "result" in bridge.messages[-1], bridge.messages[-1]
            assert await agent_pids(bridge) == {"a": second}
            spawns = json.loads(spawns_file.read_text())
            restart = [s for s in spawns if s["pid"] == second]
            assert len(restart) == 1
            assert "trio" in restart[0]["loaded"]

            assert proc.stdin is not None
            await proc.stdin.aclose()
            assert await proc.wait() == 0
            await wait_gone(second)
    events = [json.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]
    captured = [e for e in events if e.get("event") == "agent_stderr"]
    assert [e["line"] for e in captured].count("prespawned-stderr-marker") == 2, captured


async def test_a_default_agent_never_initialized_is_stopped_as_the_bridge_exits(tmp_path):
    """No ``initialize`` ever came: the early agent still goes when the bridge's input ends."""
    from tests.e2e.test_stdio import _reap, alive, wait_gone

    fifo, agent = _fifo_agent(tmp_path, "never initialized")
    argv = [sys.executable, "-m", "acp_bridge", "stdio", "--agent", agent]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            nursery.start_soon(_reap, proc)
            pid = await _started_pid(fifo)
            assert proc.stdin is not None
            await proc.stdin.aclose()
            assert await proc.wait() == 0
            await wait_gone(pid)
            assert not alive(pid)


async def test_an_early_agent_that_dies_at_once_is_reported_at_initialize(tmp_path):
    """Its exit and its last stderr line are in the ``initialize`` error, as for any agent."""
    script = "echo 'cannot find my model' >&2; exit 3"
    argv = [
        sys.executable,
        "-m",
        "acp_bridge",
        "stdio",
        "--agent",
        "a=" + shlex.join(["sh", "-c", script]),
    ]
    request = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    with trio.fail_after(60):
        done = await trio.run_process(argv, stdin=request, capture_stdout=True, capture_stderr=True)
    (answer,) = [json.loads(line) for line in done.stdout.splitlines()]
    error = answer["error"]
    assert "exited during initialize (status 3)" in error["message"], error
    assert error["data"]["exitStatus"] == 3
    assert error["data"]["stderrTail"] == ["cannot find my model"]


#: Runs ``acp-bridge stdio`` and writes, as it exits, how many objects the cyclic garbage
#: collector holds frozen (out of its generations).
RUN_AND_COUNT_FROZEN = """
import atexit, gc, json, sys
out = sys.argv.pop(1)
def dump():
    with open(out, "w") as f:
        json.dump(gc.get_freeze_count(), f)
atexit.register(dump)
from acp_bridge.cli.main import main
raise SystemExit(main())
"""


async def test_what_start_up_made_is_out_of_the_collectors_way(tmp_path):
    """
    The modules, classes and configuration made at start-up are frozen (``gc.freeze``): the
    collector's full passes, which stall the event loop, walk only what the traffic made.
    """
    out = tmp_path / "frozen.json"
    demo = shlex.join([sys.executable, "-m", "acp_bridge", "demo-agent"])
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    argv = [sys.executable, "-c", RUN_AND_COUNT_FROZEN, str(out)]
    argv += ["stdio", "--agent", f"demo={demo}"]
    with trio.fail_after(60):
        done = await trio.run_process(
            argv,
            stdin=json.dumps(init).encode() + b"\n",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert json.loads(done.stdout.splitlines()[0])["id"] == 1
    assert json.loads(out.read_text()) > 10_000  # (trio, attrs, structlog, the bridge...)
