"""Interop with ``acpx``, a headless ACP client on npm (pinned in tests/support/peers/node).

Every scenario runs twice, each side in its own directory (HOME, XDG dirs, working directory):

- ``direct``: ``acpx --agent "<python> -m acp_bridge demo-agent"``;
- ``bridge``: ``acpx --agent "<python> -m acp_bridge stdio --config <demo agent config>"``.

What acpx prints must be the same on both sides. Before comparing, only what must differ is
normalised (:meth:`Acpx.normalise`): the side's own directory (acpx prints the session's cwd
and the paths of written files), the session id printed by ``sessions new`` (the bridge gives
a new session another id when its store already holds the agent's, as it does for the session
of an earlier acpx process) and ISO timestamps (``sessions history``). Nothing else: acpx's
text output carries no timing.

Each acpx process of a persistent session spawns its own bridge; the bridge's store lives
under the side's ``XDG_STATE_HOME``, so those bridges share one store, as a user's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
import trio

from tests.support.peers.npm import npm_peer_bin

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


MODES = ("direct", "bridge")
#: One test: up to five acpx runs per side, each a node process and one or two Pythons.
TEST_TIMEOUT = 90.0
#: Closing a side's sessions at teardown; past it, leftover queue owners are killed.
CLOSE_TIMEOUT = 30.0
#: Seconds an idle acpx queue owner (the detached process that keeps a persistent session's
#: agent running between prompts) lingers. Teardown closes it sooner; this bounds a leak if
#: teardown itself is cut short.
QUEUE_OWNER_TTL = "30"

DEMO_AGENT = [sys.executable, "-m", "acp_bridge", "demo-agent", "--chunk-delay", "0"]
_ISO_TIME = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z\b")


@dataclass(frozen=True)
class Output:
    returncode: int
    stdout: str
    stderr: str


class Acpx:
    """acpx in one side's private directory, talking to one agent command."""

    def __init__(self, exe: Path, mode: str, root: Path) -> None:
        self.exe = exe
        self.root = root
        self.cwd = root / "cwd"
        self.home = root / "home"
        self.cwd.mkdir(parents=True)
        self.home.mkdir()
        if mode == "direct":
            self.agent = DEMO_AGENT
        else:
            config = root / "bridge.toml"
            # JSON strings are valid TOML basic strings.
            config.write_text(
                f"[agents.demo]\ncommand = {json.dumps(DEMO_AGENT[0])}\n"
                f"args = {json.dumps(DEMO_AGENT[1:])}\n"
            )
            self.agent = [sys.executable, "-m", "acp_bridge", "stdio", "--config", str(config)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACPX_")}
        # acpx keeps its sessions, queue locks and config under HOME (~/.acpx); the bridge keeps
        # its store under XDG_STATE_HOME.
        env["HOME"] = str(self.home)
        for name in ("CONFIG", "CACHE", "DATA", "STATE"):
            env[f"XDG_{name}_HOME"] = str(root / f"xdg-{name.lower()}")
        self.env = env
        self.session_id: str | None = None

    async def run(self, *args: str) -> Output:
        """``acpx [global flags] ARGS`` to completion; its output normalised."""
        return self._normalised(await self._run(args))

    async def new_session(self) -> Output:
        """``sessions new``, remembering the id it prints (for :meth:`normalise`)."""
        out = await self._run(("sessions", "new"))
        assert out.returncode == 0, out
        (self.session_id,) = out.stdout.split()
        return self._normalised(out)

    async def _run(self, args: tuple[str, ...]) -> Output:
        argv = [str(self.exe), "--ttl", QUEUE_OWNER_TTL, "--cwd", str(self.cwd)]
        argv += ["--agent", shlex.join(self.agent), *args]
        done = await trio.run_process(
            argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        return Output(done.returncode, done.stdout.decode(), done.stderr.decode())

    def _normalised(self, out: Output) -> Output:
        return Output(out.returncode, self.normalise(out.stdout), self.normalise(out.stderr))

    def normalise(self, text: str) -> str:
        text = text.replace(str(self.root), "<root>")
        if self.session_id is not None:
            text = text.replace(self.session_id, "<session>")
        return _ISO_TIME.sub("<time>", text)

    def _queue_owners(self) -> list[dict[str, object]]:
        owners = []
        for lock in (self.home / ".acpx" / "queues").glob("*.lock"):
            with contextlib.suppress(OSError, ValueError):
                owners.append(json.loads(lock.read_text()))
        return owners

    async def aclose(self) -> None:
        """Stop what outlives acpx's own processes: the queue owners (and their agents)."""
        owners = self._queue_owners()
        if not owners:
            return
        with trio.move_on_after(CLOSE_TIMEOUT):
            await self.run("sessions", "close")
        for owner in owners:
            pid = owner.get("pid")
            if type(pid) is int and _is_queue_owner(pid):
                # A session leader: its group holds the agent it started.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            # acpx puts its sockets in a directory of its own per HOME; gone once empty.
            socket = owner.get("socketPath")
            if type(socket) is str:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(socket))


def _is_queue_owner(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"__queue-owner" in f.read() and os.getpgid(pid) == pid
    except OSError:
        return False


@pytest.fixture
def acpx_exe() -> Path:
    # A sync fixture: a skip raised inside a trio fixture loses its reason.
    return npm_peer_bin("acpx")


@pytest.fixture
async def sides(acpx_exe: Path, tmp_path: Path) -> AsyncIterator[dict[str, Acpx]]:
    made = {mode: Acpx(acpx_exe, mode, tmp_path / mode) for mode in MODES}
    try:
        yield made
    finally:
        with trio.CancelScope(shield=True):
            for side in made.values():
                await side.aclose()


def assert_same(outputs: dict[str, Output]) -> None:
    direct, bridge = outputs["direct"], outputs["bridge"]
    assert bridge.stdout == direct.stdout
    assert bridge.stderr == direct.stderr
    assert bridge.returncode == direct.returncode


def assert_no_bridge_notifications(out: Output) -> None:
    """acpx reports each notification it does not know; the bridge must send it none."""
    assert "_acp_bridge" not in out.stdout + out.stderr, out


# -- a. one-shot exec ----------------------------------------------------------------------------


async def test_exec_prints_the_same_through_the_bridge(sides: dict[str, Acpx]) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        outputs = {mode: await side.run("exec", "hello there") for mode, side in sides.items()}
    assert outputs["direct"].returncode == 0, outputs["direct"]
    assert "You said: hello there" in outputs["direct"].stdout
    assert_no_bridge_notifications(outputs["bridge"])
    assert_same(outputs)


# -- b. a persistent session, prompted from new processes ---------------------------------------


async def test_persistent_session_works_through_the_bridge(sides: dict[str, Acpx]) -> None:
    runs: dict[str, list[Output]] = {}
    with trio.fail_after(TEST_TIMEOUT):
        for mode, side in sides.items():
            runs[mode] = [
                await side.new_session(),
                # A new acpx process: it starts a queue owner, which spawns a new agent (a new
                # bridge, on the same store) and takes the session up again.
                await side.run("prompt", "first"),
                # Another process, served by that queue owner.
                await side.run("prompt", "second"),
                await side.run("sessions", "history"),
            ]
    steps = [dict(zip(MODES, pair, strict=True)) for pair in zip(*runs.values(), strict=True)]
    new, first, second, history = steps
    assert new["direct"].stdout == "<session>\n"
    for step, text in ((first, "first"), (second, "second")):
        assert step["direct"].returncode == 0, step["direct"]
        assert f"You said: {text}" in step["direct"].stdout
    assert "assistant\tYou said: second" in history["direct"].stdout
    for step in steps:
        assert_no_bridge_notifications(step["bridge"])
        assert_same(step)


# -- c. permissions ------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "written"), [("--approve-all", True), ("--deny-all", False)])
async def test_permission_flags_behave_the_same_through_the_bridge(
    sides: dict[str, Acpx], flag: str, written: bool
) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        outputs = {
            mode: await side.run(flag, "exec", "write notes.txt hi there")
            for mode, side in sides.items()
        }
    for mode, side in sides.items():
        notes = side.cwd / "notes.txt"
        if written:
            assert notes.read_text() == "hi there", mode
        else:
            assert not notes.exists(), mode
    assert "session/request_permission" in outputs["direct"].stdout
    assert_no_bridge_notifications(outputs["bridge"])
    assert_same(outputs)
