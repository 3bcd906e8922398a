"""
The bench's processes: what a client talks to (the flood agent alone, a relay, a bridge, a
peer), how each is started, configured and stopped, what it costs (CPU, RSS); and the
statistics the scenarios share. Used by ``bench.run`` and the focused tools beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import peers
from bench.client import http_client, pipe_client, websocket_client

if TYPE_CHECKING:
    from collections.abc import Iterator

    from bench.client import Client

FLOOD_AGENT = Path(__file__).with_name("flood_agent.py")
TOKEN = "bench-token-not-a-secret"
C_RELAY = Path(__file__).with_name("c_relay.c")

#: "Journal on" is the default ([store] journal = true: every relayed update is recorded in
#: the SQLite store, in batches, off the event loop); "off" turns that journal off.
JOURNAL_ON_DEFAULT = ""
JOURNAL_OFF_DEFAULT = "[store]\njournal = false\n"
JOURNAL_NOTE = (
    "journal on = the defaults ([store] journal = true: updates recorded in the SQLite "
    "store); journal off = [store] journal = false (the in-memory history for session/load "
    "stays). Other settings: --journal-on-config / --journal-off-config."
)


# --- processes -------------------------------------------------------------------------


def agent_argv(prefix: str = "", batch: int | None = None) -> list[str]:
    argv = [sys.executable, str(FLOOD_AGENT), "--prefix", prefix]
    if batch is not None:
        argv += ["--batch", str(batch)]
    return argv


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string for our inputs


def config_text(
    agents: dict[str, str],
    *,
    extra: str = "",
    websocket: bool = False,
    policy_rules: int = 0,
    batch: int | None = None,
) -> str:
    """A bridge config: one flood agent per ``name → session id prefix``, then ``extra``."""
    parts = []
    for name, prefix in agents.items():
        argv = agent_argv(prefix, batch)
        parts.append(
            f"[agents.{name}]\ncommand = {toml_str(argv[0])}\n"
            f"args = [{', '.join(toml_str(a) for a in argv[1:])}]\n"
        )
    if websocket:
        parts.append(
            f'[websocket]\nhost = "127.0.0.1"\nport = 0\ntoken = {toml_str(TOKEN)}\n'
            "ping_interval = 0.0\n"
        )
    if policy_rules:
        # Rules that never match the flood (it asks no permission) but are loaded and parsed.
        parts.append('[policy]\ndefault = "ask"\n')
        for i in range(policy_rules):
            action = ("deny", "ask", "allow")[i % 3]
            parts.append(
                f'[[policy.rules]]\nid = "bench-{i}"\nkind = "edit"\n'
                f'path = "/nonexistent/bench-{i}/**"\naction = "{action}"\n'
            )
    parts.append(extra)
    return "\n".join(parts)


def read_cpu(pid: int) -> float:
    """CPU seconds a process used so far, user and system, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_rss(pid: int) -> int:
    """Resident set size of a process, in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def c_relay(directory: Path) -> Path:
    """
    ``bench/c_relay.c`` compiled into ``directory`` (once) with the C compiler the C line
    scanner is built with; :class:`peers.PeerUnavailable` without one.
    """
    binary = directory / "c_relay"
    if binary.exists():
        return binary
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise peers.PeerUnavailable("no C compiler (cc) to build bench/c_relay.c")
    built = subprocess.run(
        [compiler, "-O2", "-o", str(binary), str(C_RELAY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if built.returncode != 0:
        raise peers.PeerUnavailable(f"bench/c_relay.c did not build: {built.stderr[-300:]}")
    return binary


class Target:
    """Something a client talks to: the flood agent itself, or a bridge in front of agents."""

    def __init__(
        self,
        scratch: Path,
        key: str,
        *,
        kind: str,
        config: str = "",
        source: Path | None = None,
    ) -> None:
        self.key = key
        #: run the bridge from this checkout (PYTHONPATH) rather than the installed one
        self.source = source
        #: "direct" | "c_relay" | "plain_relay" | "relay" | "stdio" | "ws" | "http"
        #: | "supergateway" | "conductor" | "acp_server"
        self.kind = kind
        self.dir = scratch / key
        self.dir.mkdir(parents=True)
        self.log_path = self.dir / "stderr.log"
        self.config_path = self.dir / "bridge.toml"
        self.config_path.write_text(config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Client | None = None
        #: the initialize answer's agentInfo.version (which code answered)
        self.version: str | None = None
        self._sock: Any = None
        #: supergateway's WebSocket port (it cannot pick one itself and say which)
        self._port: int | None = None
        #: why a peer cannot run here (then it is reported as not measured)
        self.unavailable: str | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> None:
        try:
            argv = self._argv()
        except peers.PeerUnavailable as exc:
            self.unavailable = str(exc)
            return
        env = dict(os.environ)
        env["XDG_STATE_HOME"] = str(self.dir / "state")
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL if self.websocket else subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=self.dir,
                start_new_session=True,
            )

    @property
    def websocket(self) -> bool:
        """Served over a socket (not the process's pipes): stopped with SIGTERM."""
        return self.kind in ("ws", "http", "supergateway", "acp_server")

    def _argv(self) -> list[str]:
        if self.kind == "direct":
            return agent_argv()
        if self.kind == "relay":
            return [sys.executable, "-m", "bench.naive_relay", *agent_argv()]
        if self.kind == "plain_relay":
            return [sys.executable, "-m", "bench.plain_relay", *agent_argv()]
        if self.kind == "c_relay":
            return [str(c_relay(self.dir)), *agent_argv()]
        if self.kind == "supergateway":
            self._port = peers.free_port()
            return peers.supergateway_argv(agent_argv(), self._port)
        if self.kind == "conductor":
            return peers.conductor_argv(agent_argv())
        if self.kind == "acp_server":
            return peers.acp_server_argv(agent_argv())
        sub = "stdio" if self.kind == "stdio" else "serve"
        argv = [sys.executable, "-m", "acp_bridge", sub, "--config", str(self.config_path)]
        if self.kind in ("ws", "http"):
            argv += ["--port", "0"]
        return argv

    def connect(self, deadline: float) -> Client:
        """Initialize (after the WebSocket handshake for ``ws``)."""
        if self.unavailable is not None:
            raise peers.PeerUnavailable(self.unavailable)
        assert self.proc is not None
        if self.kind == "ws":
            url = self._wait_url(deadline)
            self.client, self._sock = websocket_client(url, TOKEN, deadline)
        elif self.kind in ("http", "acp_server"):
            marker = peers.ACP_SERVER_MARKER if self.kind == "acp_server" else "listening on "
            url = self._wait_url(deadline, marker).replace("ws://", "http://", 1)
            self.client, self._sock = http_client(url, TOKEN)
        elif self.kind == "supergateway":
            assert self._port is not None
            proc = self.proc
            peers.wait_listening(self._port, deadline, lambda: proc.poll() is None)
            url = f"ws://127.0.0.1:{self._port}{peers.SUPERGATEWAY_PATH}"
            self.client, self._sock = websocket_client(url, TOKEN, deadline)
        else:
            self.client = pipe_client(self.proc)
        answer = self.client.initialize(deadline)
        info = answer.get("agentInfo")
        self.version = info.get("version") if isinstance(info, dict) else None
        return self.client

    def _wait_url(self, deadline: float, marker: str = "listening on ") -> str:
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if marker in line:
                    return line.split(marker, 1)[1].split()[0]
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.tail()}")
            time.sleep(0.02)
        raise RuntimeError("serve did not print its URL in time")

    def tail(self, n: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-n:])

    def rss(self) -> int | None:
        return None if self.kind == "direct" else read_rss(self.pid)

    def close(self) -> None:
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if self._sock is not None:
                self._sock.close()
            if proc.stdin is not None:
                proc.stdin.close()
            if self.websocket:
                proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def targets(*items: Target) -> Iterator[None]:
    try:
        for t in items:
            t.spawn()
        yield
    finally:
        for t in items:
            t.close()


#: how a peer that cannot run here is reported (not a failure of the benchmark)
NOT_MEASURED = "not measured: "


def failure(exc: BaseException, target: Target | None = None) -> str:
    if isinstance(exc, peers.PeerUnavailable):
        return f"{NOT_MEASURED}{exc}"
    text = f"{type(exc).__name__}: {exc}".strip()
    if target is not None and target.kind != "direct":
        tail = target.tail(3)
        if tail:
            text += f" [log: {tail[-400:]}]"
    return text


# --- statistics ------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in [0, 1])."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def latency_summary(seconds: list[float]) -> dict[str, float]:
    us = [s * 1e6 for s in seconds]
    return {
        "count": len(us),
        "p50_us": percentile(us, 0.50),
        "p99_us": percentile(us, 0.99),
        "max_us": max(us),
        "mean_us": sum(us) / len(us),
    }
