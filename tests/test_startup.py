"""
``acp-bridge stdio`` loads only what the stdio path uses (issue 23: start-up).

The bridge answers ``initialize`` once its default agent has, and it starts the agent only after
its own imports: every module the stdio path loads but does not use is start-up time added to
every editor's first request. The WebSocket stack, the MCP server, the wire trace and the test
helpers (``trio.testing`` brings pytest along) are loaded where they are used, not before.
"""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import trio

pytestmark = pytest.mark.e2e

#: modules (and packages, with their submodules) the stdio path must not load
NOT_ON_THE_STDIO_PATH = (
    "trio_websocket",
    "h11",
    "wsproto",
    "acp_bridge._ws",
    "acp_bridge._serve",
    "acp_bridge._mcp_server",
    "acp_bridge._trace",
    "trio.testing",
    "pytest",
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
from acp_bridge._cli import main
raise SystemExit(main())
"""


def _loaded_forbidden(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if any(m == bad or m.startswith(bad + ".") for bad in NOT_ON_THE_STDIO_PATH)
    ]


#: what a session brings in on top: the sub-agent MCP server offered to it (docs/subagents.md)
FOR_A_SESSION = ("h11", "acp_bridge._mcp_server")


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
    assert "acp_bridge._bridge" in modules  # (the listing is the bridge's own)
    loaded = _loaded_forbidden(modules)
    if with_session:
        assert "acp_bridge._mcp_server" in loaded  # (offered to the session: the check sees it)
        loaded = [
            m for m in loaded if not any(m == ok or m.startswith(ok + ".") for ok in FOR_A_SESSION)
        ]
    assert loaded == []


def test_the_check_sees_a_forbidden_submodule():
    assert _loaded_forbidden(["trio", "trio.testing._raises_group", "acp_bridge._wsx"]) == [
        "trio.testing._raises_group"
    ]
