"""
The benchmark: the bridge against a direct client-agent pipe, side by side in one run.

    python -m bench.run [--quick] [--json PATH]      (or ./scripts/bench)

Scenarios (full size; ``--quick`` in brackets):

- throughput: one session streams N = 200,000 [20,000] ``agent_message_chunk`` updates
  through: a direct pipe; a naive trio relay that decodes every line (``bench.naive_relay``:
  the floor for any trio process in the middle); ``acp-bridge stdio`` (defaults; with 50
  policy rules and the journal on, then off; with its session id rewritten);
  ``acp-bridge serve`` over WebSocket (defaults, and with a client_queue large enough for a
  whole run). Updates/s, best of 3 [1] runs interleaved across the variants (one run for
  the last two), ratio to direct; and the CPU time (user + system, all threads) of the
  process in the middle per update, the least of its runs: a figure that depends far less
  on what else the machine is doing than the rates do;
- round trip: 2,000 [300] sequential ``session/set_mode``: p50/p99, direct vs bridge (stdio
  and WebSocket), and the latency the bridge adds;
- scale: 50 agents x 10 sessions [5 x 4], 500 updates each, flooding at once through one
  stdio bridge: the aggregate rate, when each session finished, and the round trip of a
  probe session (on an idle agent of its own) measured back to back during the flood;
- fan-out: one parent agent spawns 20 [5] sub-agents through the bridge's MCP tools, each
  streaming 2,000 [200] stamped updates at once to a client that advertises
  ``clientCapabilities.subagents``: the update latency it sees (p50, p99) and the aggregate
  rate (``bench.fanout``);
- memory: bridge RSS with 0 then 1,000 [100] idle sessions (bytes per session), then after
  each of 3 floods of 20,000 [10,000] in one session, at once and 3 s later (settled: the
  bridge gives freed heap back after a burst; flat or not is judged on these); the RSS of the
  stdio throughput bridge after each of its runs, too.

The table goes to stdout, the JSON (with the machine) to ``--json`` (bench-results.json).
A run that fails is reported as such; the benchmark exits 0 unless it cannot run at all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from bench import peers
from bench.client import pipe_client, prompt_params, websocket_client
from bench.fanout import fanout

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from bench.client import Client

FLOOD_AGENT = Path(__file__).with_name("flood_agent.py")
TOKEN = "bench-token-not-a-secret"

#: "Journal on" is the default ([store] journal = true: every relayed update is recorded in
#: the SQLite store, in batches, off the event loop); "off" turns that journal off.
JOURNAL_ON_DEFAULT = ""
JOURNAL_OFF_DEFAULT = "[store]\njournal = false\n"
JOURNAL_NOTE = (
    "journal on = the defaults ([store] journal = true: updates recorded in the SQLite "
    "store); journal off = [store] journal = false (the in-memory history for session/load "
    "stays). Other settings: --journal-on-config / --journal-off-config."
)


@dataclass
class Settings:
    quick: bool
    n: int
    reps: int
    round_trips: int
    scale_agents: int
    scale_sessions: int
    scale_chunks: int
    idle_sessions: int
    flat_runs: int
    flat_n: int
    startup_runs: int
    policy_rules: int
    journal_on_config: str
    journal_off_config: str
    timeout: float
    json_path: Path
    fanout_children: int = 20
    fanout_chunks: int = 2000
    #: another checkout of acp-bridge: its stdio bridge runs beside this one (--compare)
    compare: Path | None = None


# --- processes -------------------------------------------------------------------------


def agent_argv(prefix: str = "", batch: int | None = None) -> list[str]:
    argv = [sys.executable, str(FLOOD_AGENT), "--prefix", prefix]
    if batch is not None:
        argv += ["--batch", str(batch)]
    return argv


def _toml_str(s: str) -> str:
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
            f"[agents.{name}]\ncommand = {_toml_str(argv[0])}\n"
            f"args = [{', '.join(_toml_str(a) for a in argv[1:])}]\n"
        )
    if websocket:
        parts.append(
            f'[websocket]\nhost = "127.0.0.1"\nport = 0\ntoken = {_toml_str(TOKEN)}\n'
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
        self.kind = kind  # "direct" | "relay" | "stdio" | "ws" | "supergateway" | "conductor"
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
        return self.kind in ("ws", "supergateway")

    def _argv(self) -> list[str]:
        if self.kind == "direct":
            return agent_argv()
        if self.kind == "relay":
            return [sys.executable, "-m", "bench.naive_relay", *agent_argv()]
        if self.kind == "supergateway":
            self._port = peers.free_port()
            return peers.supergateway_argv(agent_argv(), self._port)
        if self.kind == "conductor":
            return peers.conductor_argv(agent_argv())
        sub = "stdio" if self.kind == "stdio" else "serve"
        argv = [sys.executable, "-m", "acp_bridge", sub, "--config", str(self.config_path)]
        if self.kind == "ws":
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

    def _wait_url(self, deadline: float) -> str:
        marker = "listening on "
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


def _failure(exc: BaseException, target: Target | None = None) -> str:
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


# --- scenarios -------------------------------------------------------------------------

#: key → (label, runs taken: "main" variants get --reps runs, the others one).
THROUGHPUT_VARIANTS = {
    "direct": ("direct pipe", "main"),
    "relay": ("naive trio relay (floor)", "main"),
    "stdio": ("bridge stdio", "main"),
    "ws": ("bridge serve, WebSocket", "main"),
    "ws_queue": ("serve, WebSocket, client_queue 2^20", "other"),
    "stdio_policy_journal_on": ("stdio, policy rules, journal on", "main"),
    "stdio_policy_journal_off": ("stdio, policy rules, journal off", "main"),
    "stdio_rewrite": ("stdio, sessionId rewritten", "other"),
    "supergateway": (f"{peers.label(peers.SUPERGATEWAY)}, stdio→WebSocket", "main"),
    "conductor": (f"{peers.label(peers.CONDUCTOR)}, stdio", "main"),
}
ROUND_TRIP_VARIANTS = ("direct", "relay", "stdio", "ws", "supergateway", "conductor")
#: peer → the bridge variants it is compared with (the same transport to the client): the
#: WebSocket one with the default client_queue, or the raised one when the default dropped
PEER_OF = {"supergateway": ("ws", "ws_queue"), "conductor": ("stdio", "stdio")}
#: --compare: the same two stdio variants, run from the other checkout
COMPARED = ("stdio_policy_journal_on", "stdio_policy_journal_off")


def variants_of(s: Settings) -> dict[str, tuple[str, str]]:
    """The throughput variants of this run: the fixed ones, and the compared checkout's."""
    out = dict(THROUGHPUT_VARIANTS)
    if s.compare is not None:
        for key in COMPARED:
            label, runs = THROUGHPUT_VARIANTS[key]
            out[f"{key}@compare"] = (f"{label} [--compare]", runs)
    return out


SCALE_BATCH = 16
#: A WebSocket client is dropped when 1024 messages wait for it (default client_queue);
#: a full-speed flood outruns the WebSocket writer, so the second WebSocket variant gives it
#: room for a whole run, to measure the transport rather than the overflow rule.
WS_BIG_QUEUE = "[bridge]\nclient_queue = 1048576\n"


def _make_targets(s: Settings, scratch: Path) -> dict[str, Target]:
    policy = {"policy_rules": s.policy_rules}
    one = {"flood": ""}
    made = {
        "direct": Target(scratch, "direct", kind="direct"),
        "relay": Target(scratch, "relay", kind="relay"),
        "stdio": Target(scratch, "stdio", kind="stdio", config=config_text(one)),
        "ws": Target(scratch, "ws", kind="ws", config=config_text(one, websocket=True)),
        "ws_queue": Target(
            scratch,
            "ws_queue",
            kind="ws",
            config=config_text(one, websocket=True, extra=WS_BIG_QUEUE),
        ),
        "stdio_policy_journal_on": Target(
            scratch,
            "stdio_policy_journal_on",
            kind="stdio",
            config=config_text(one, extra=s.journal_on_config, **policy),
        ),
        "stdio_policy_journal_off": Target(
            scratch,
            "stdio_policy_journal_off",
            kind="stdio",
            config=config_text(one, extra=s.journal_off_config, **policy),
        ),
        # Two agents with the same session ids: the second session's id is rewritten.
        "stdio_rewrite": Target(
            scratch, "stdio_rewrite", kind="stdio", config=config_text({"a": "", "b": ""})
        ),
        "supergateway": Target(scratch, "supergateway", kind="supergateway"),
        "conductor": Target(scratch, "conductor", kind="conductor"),
    }
    if s.compare is not None:
        for key in COMPARED:
            base = made[key]
            made[f"{key}@compare"] = Target(
                scratch,
                f"{key}@compare",
                kind="stdio",
                config=base.config_path.read_text(),
                source=s.compare,
            )
    return made


def settle(t: Target, deadline: float) -> None:
    """
    Wait until a bridge's journal has committed what the flood recorded: its CPU figure then
    includes the journal's whole work, and the next variant's run does not share the machine
    with this one's writer thread.
    """
    if t.kind not in ("stdio", "ws") or t.client is None:
        return
    while True:
        journal = t.client.call("_acp_bridge/status", {}, deadline).get("journal")
        if not journal or not journal["backlog"]:
            return
        time.sleep(0.01)


def throughput_and_round_trip(s: Settings, scratch: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """
    Every variant alive at once. Round trips first (before any flood), then the throughput
    runs, interleaved across the variants so that a busy moment of the machine does not
    land on one variant only.
    """
    made = _make_targets(s, scratch)
    variant_table = variants_of(s)
    runs: dict[str, list[float]] = {k: [] for k in made}
    #: CPU time of the process in the middle (bridge or relay) per update, per run
    cpu_per_update: dict[str, list[float]] = {k: [] for k in made}
    errors: dict[str, str] = {}
    sessions: dict[str, str] = {}
    latencies: dict[str, list[float]] = {}
    rt_errors: dict[str, str] = {}
    rss_after: list[int] = []
    cwd = str(scratch)
    with targets(*made.values()):
        for key, t in made.items():
            try:
                deadline = time.monotonic() + 60
                client = t.connect(deadline)
                sid = client.new_session(cwd, deadline)
                if key == "stdio_rewrite":
                    sid = client.new_session(cwd, deadline, agent="b")
                    if "~" not in sid:
                        raise RuntimeError(f"expected a rewritten session id, got {sid!r}")
                sessions[key] = sid
            except Exception as exc:
                errors[key] = _failure(exc, t)
        for key in ROUND_TRIP_VARIANTS:
            t = made[key]
            if key in errors:
                rt_errors[key] = errors[key]
                continue
            try:
                assert t.client is not None
                deadline = time.monotonic() + s.timeout
                warm = min(200, s.round_trips // 4)
                t.client.set_mode_latencies(sessions[key], warm, deadline)
                latencies[key] = t.client.set_mode_latencies(sessions[key], s.round_trips, deadline)
            except Exception as exc:
                rt_errors[key] = _failure(exc, t)
        warmup = min(s.n, 500)  # below the default client_queue: a warm-up never overflows
        for key, t in made.items():
            if key in errors:
                continue
            try:
                assert t.client is not None
                count, _ = t.client.flood(sessions[key], warmup, time.monotonic() + s.timeout)
                if count != warmup:
                    raise RuntimeError(f"warm-up: {count} updates, expected {warmup}")
            except Exception as exc:
                errors[key] = _failure(exc, t)
        for rep in range(s.reps):
            for key, t in made.items():
                if key in errors or (rep > 0 and variant_table[key][1] != "main"):
                    continue
                try:
                    assert t.client is not None
                    cpu_before = read_cpu(t.pid) if t.kind != "direct" else 0.0
                    count, elapsed = t.client.flood(
                        sessions[key], s.n, time.monotonic() + s.timeout
                    )
                    if count != s.n:
                        raise RuntimeError(f"{count} updates, expected {s.n}")
                    runs[key].append(s.n / elapsed)
                    settle(t, time.monotonic() + s.timeout)
                    if t.kind != "direct":
                        cpu_per_update[key].append((read_cpu(t.pid) - cpu_before) / s.n)
                    if key == "stdio":
                        rss_after.append(read_rss(t.pid))
                except Exception as exc:
                    errors[key] = _failure(exc, t)

    direct_best = max(runs["direct"]) if runs["direct"] else None
    variants: dict[str, Any] = {}
    for key, (label, _) in variant_table.items():
        best = max(runs[key]) if runs[key] else None
        cpu = min(cpu_per_update[key]) if cpu_per_update[key] else None
        variants[key] = {
            "label": label,
            "cpu_us_per_update": None if cpu is None else cpu * 1e6,
            "updates_per_s": best,
            "runs": runs[key],
            "ratio_to_direct": best / direct_best if best and direct_best else None,
            "error": errors.get(key),
        }
    on = variants["stdio_policy_journal_on"]["updates_per_s"]
    off = variants["stdio_policy_journal_off"]["updates_per_s"]
    throughput = {
        "n": s.n,
        "reps": s.reps,
        "reps_note": "best of --reps runs, except one run for the rewrite variant and the "
        "WebSocket one with a raised client_queue",
        "variants": variants,
        "journal_cost": (off - on) / off if on and off else None,
        "policy_rules": s.policy_rules,
        "journal_note": JOURNAL_NOTE,
        "stdio_rss_after_runs_bytes": rss_after,
    }
    if s.compare is not None:
        throughput["compare"] = compare_cpu(variants, s.compare)
        throughput["compare"]["versions"] = {
            key: made[key].version for key in (*COMPARED, *(f"{k}@compare" for k in COMPARED))
        }
    rt: dict[str, Any] = {}
    for key in ROUND_TRIP_VARIANTS:
        label = THROUGHPUT_VARIANTS[key][0]
        if key in latencies:
            rt[key] = {"label": label, **latency_summary(latencies[key])}
        else:
            rt[key] = {"label": label, "error": rt_errors.get(key)}
    base = rt["direct"]
    for key in ROUND_TRIP_VARIANTS[1:]:
        if "p50_us" in rt[key] and "p50_us" in base:
            rt[key]["added_p50_us"] = rt[key]["p50_us"] - base["p50_us"]
            rt[key]["added_p99_us"] = rt[key]["p99_us"] - base["p99_us"]
    throughput["peers"] = peer_ratios(variants, rt)
    return throughput, {"count": s.round_trips, "variants": rt}


def peer_ratios(variants: dict[str, Any], rt: dict[str, Any]) -> dict[str, Any]:
    """
    The bridge against each peer on the same transport: updates/s and CPU per update as
    bridge / peer (throughput above 1 and CPU below 1 favour the bridge), the round trip's
    p50 and p99 as bridge / peer and bridge - peer (below 1, below 0: the bridge is faster).
    """
    out: dict[str, Any] = {}
    for peer, (bridge, fallback) in PEER_OF.items():
        if variants[bridge]["updates_per_s"] is None:
            bridge = fallback
        ours, theirs = variants[bridge], variants[peer]
        row: dict[str, Any] = {
            "bridge": bridge,
            "bridge_label": ours["label"],
            "peer_label": theirs["label"],
            "error": theirs["error"],
        }
        a, b = ours["updates_per_s"], theirs["updates_per_s"]
        row["throughput_ratio"] = a / b if a and b else None
        a, b = ours["cpu_us_per_update"], theirs["cpu_us_per_update"]
        row["cpu_ratio"] = a / b if a and b else None
        rt_bridge = "ws" if peer == "supergateway" else "stdio"
        ours_rt, theirs_rt = rt[rt_bridge], rt[peer]
        row["round_trip_bridge"] = rt_bridge
        for q in ("p50", "p99"):
            a, b = ours_rt.get(f"{q}_us"), theirs_rt.get(f"{q}_us")
            row[f"round_trip_{q}_ratio"] = a / b if a and b else None
            row[f"round_trip_{q}_diff_us"] = a - b if a and b else None
        if theirs_rt.get("error") and not row["error"]:
            row["error"] = theirs_rt["error"]
        out[peer] = row
    return out


def compare_cpu(variants: dict[str, Any], source: Path) -> dict[str, Any]:
    """CPU us per update of this checkout against the --compare one, variant by variant."""
    out: dict[str, Any] = {"source": str(source)}
    for key in COMPARED:
        ours = variants[key]["cpu_us_per_update"]
        theirs = variants[f"{key}@compare"]["cpu_us_per_update"]
        out[key] = {
            "this_us": ours,
            "compare_us": theirs,
            "change": ours / theirs - 1 if ours and theirs else None,
        }
    return out


def scale(s: Settings, scratch: Path) -> dict[str, Any]:
    """Many agents x sessions flooding through one stdio bridge; a probe's round trips."""
    agents = {f"a{i}": f"a{i}-" for i in range(s.scale_agents)}
    agents["probe"] = "p-"
    # Small batches: each agent interleaves its sessions finely, so when a session gets its
    # first update says something about the bridge, not about the agent's round robin.
    t = Target(scratch, "scale", kind="stdio", config=config_text(agents, batch=SCALE_BATCH))
    total_sessions = s.scale_agents * s.scale_sessions
    out: dict[str, Any] = {
        "agents": s.scale_agents,
        "sessions_per_agent": s.scale_sessions,
        "sessions": total_sessions,
        "chunks_per_session": s.scale_chunks,
        "probe": "set_mode round trips, back to back, on a session of its own idle agent",
    }
    cwd = str(scratch)
    with targets(t):
        try:
            deadline = time.monotonic() + 120
            client = t.connect(deadline)
            # Sessions: every session/new sent at once (agents start on their first one).
            want = {}
            for name in agents:
                if name == "probe":
                    continue
                for _ in range(s.scale_sessions):
                    params = {
                        "cwd": cwd,
                        "mcpServers": [],
                        "_meta": {"acp_bridge": {"agent": name}},
                    }
                    want[client.request("session/new", params, deadline)] = name
            sids: list[str] = []
            while want:
                msg = client.next_message(deadline)
                if msg.get("id") in want and "method" not in msg:
                    if "error" in msg:
                        raise RuntimeError(f"session/new failed: {msg['error']}")
                    del want[msg["id"]]
                    sids.append(msg["result"]["sessionId"])
            probe = client.new_session(cwd, deadline, agent="probe")
            client.set_mode_latencies(probe, 50, deadline)  # warm the probe's path
            out["setup_s"] = time.monotonic() - (deadline - 120)

            deadline = time.monotonic() + s.timeout
            probe_params = {"sessionId": probe, "modeId": "b"}
            start = time.perf_counter()
            prompts = {
                client.request("session/prompt", prompt_params(sid, s.scale_chunks), deadline): sid
                for sid in sids
            }
            counts = dict.fromkeys(sids, 0)
            first: dict[str, float] = {}
            finish: dict[str, float] = {}
            probe_latencies: list[float] = []
            probe_id = client.request("session/set_mode", probe_params, deadline)
            probe_sent = time.perf_counter()
            while prompts:
                msg = client.next_message(deadline)
                if msg.get("method") == "session/update":
                    sid = msg["params"]["sessionId"]
                    if sid in counts:
                        counts[sid] += 1
                        if sid not in first:
                            first[sid] = time.perf_counter() - start
                    continue
                mid = msg.get("id")
                if mid == probe_id:
                    now = time.perf_counter()
                    probe_latencies.append(now - probe_sent)
                    probe_id = client.request("session/set_mode", probe_params, deadline)
                    probe_sent = time.perf_counter()
                elif mid in prompts:
                    sid = prompts.pop(mid)
                    if "error" in msg:
                        raise RuntimeError(f"prompt of {sid} failed: {msg['error']}")
                    finish[sid] = time.perf_counter() - start
            elapsed = time.perf_counter() - start
            client.wait_response(probe_id, deadline)
            total = sum(counts.values())
            short = [sid for sid, c in counts.items() if c != s.scale_chunks]
            if short:
                raise RuntimeError(f"{len(short)} sessions got the wrong number of updates")
            done = sorted(finish.values())
            out.update(
                {
                    "updates": total,
                    "elapsed_s": elapsed,
                    "aggregate_updates_per_s": total / elapsed,
                    "probe": {"label": out["probe"], **latency_summary(probe_latencies)},
                    "first_update_max_s": max(first.values()),
                    "finish_min_s": done[0],
                    "finish_median_s": done[len(done) // 2],
                    "finish_max_s": done[-1],
                    "starved_sessions": sum(1 for sid in sids if sid not in finish),
                    "bridge_rss_bytes": t.rss(),
                }
            )
        except Exception as exc:
            out["error"] = _failure(exc, t)
    return out


#: how long the memory scenario waits after each flood before it reads the settled RSS
SETTLE_S: Final = 3.0


def memory(s: Settings, scratch: Path) -> dict[str, Any]:
    """Bridge RSS: 0 sessions, then idle sessions; then after each of repeated floods."""
    t = Target(scratch, "memory", kind="stdio", config=config_text({"flood": ""}))
    out: dict[str, Any] = {
        "idle_sessions": s.idle_sessions,
        "flat_runs": s.flat_runs,
        "n": s.flat_n,
    }
    cwd = str(scratch)
    with targets(t):
        try:
            deadline = time.monotonic() + 120
            client = t.connect(deadline)
            time.sleep(0.2)
            rss0 = t.rss()
            assert rss0 is not None
            made = 0
            while made < s.idle_sessions:
                batch = min(100, s.idle_sessions - made)
                ids = [
                    client.request("session/new", {"cwd": cwd, "mcpServers": []}, deadline)
                    for _ in range(batch)
                ]
                for req_id in ids:
                    client.wait_response(req_id, deadline)
                made += batch
            time.sleep(0.2)
            rss1 = t.rss()
            assert rss1 is not None
            out.update(
                {
                    "rss_0_sessions_bytes": rss0,
                    "rss_idle_sessions_bytes": rss1,
                    "per_session_bytes": (rss1 - rss0) / s.idle_sessions,
                }
            )
            sid = client.new_session(cwd, deadline)
            after: list[int] = []
            settled: list[int] = []
            for _ in range(s.flat_runs):
                count, _ = client.flood(sid, s.flat_n, time.monotonic() + s.timeout)
                if count != s.flat_n:
                    raise RuntimeError(f"{count} updates, expected {s.flat_n}")
                rss = t.rss()
                assert rss is not None
                after.append(rss)
                # Settled: past the bridge's quiet second after a burst, when it gives freed
                # heap back (glibc; see acp_bridge/_heap.py) and its journal has caught up.
                time.sleep(SETTLE_S)
                rss = t.rss()
                assert rss is not None
                settled.append(rss)
            out["rss_after_runs_bytes"] = after
            out["rss_settled_after_runs_bytes"] = settled
            out["settle_s"] = SETTLE_S
            out["growth_first_to_last_bytes"] = settled[-1] - settled[0]
            out["history_note"] = (
                "the runs share one session: its in-memory history keeps the latest updates "
                "(history_limit), so it is full after the first run; with the journal on, the "
                "RSS also holds the journal's uncommitted backlog while SQLite catches up"
            )
        except Exception as exc:
            out["error"] = _failure(exc, t)
    return out


def _time_initialize(argv: list[str], env: dict[str, str], log: Path, deadline: float) -> float:
    """Seconds from spawning ``argv`` to the answer of its ``initialize``."""
    with open(log, "ab") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env
        )
        try:
            pipe_client(proc).initialize(deadline)
            elapsed = time.perf_counter() - start
        finally:
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.close()  # end of input: both stop
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    return elapsed


def _compile_package() -> str:
    """Write the bytecode of the ``acp_bridge`` that ``python -m acp_bridge`` runs; say how."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("acp_bridge")
    if spec is None or not spec.submodule_search_locations:
        return "not compiled: acp_bridge not found"
    where = next(iter(spec.submodule_search_locations))
    ok = compileall.compile_dir(where, quiet=1)
    return "compiled before the runs" if ok else "compiled before the runs (with errors)"


def startup(s: Settings, scratch: Path) -> dict[str, Any]:
    """
    From spawn to the ``initialize`` answer: the demo agent alone (``python -m acp_bridge
    demo-agent``) against ``acp-bridge stdio`` in front of it (which answers once the agent
    has). Alternating runs after one unmeasured run of each (the page cache, the bridge's
    store created); the medians, and what the bridge adds.

    The package's bytecode is compiled first, as ``pip install`` does at install time: an
    editable install run with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile every
    module from source at each start (about 80 ms of CPU for the bridge), which no installed
    copy does.
    """
    where = scratch / "startup"
    where.mkdir()
    bytecode = _compile_package()
    agent = [sys.executable, "-m", "acp_bridge", "demo-agent"]
    config = where / "bridge.toml"
    config.write_text(
        f"[agents.demo]\ncommand = {_toml_str(agent[0])}\n"
        f"args = [{', '.join(_toml_str(a) for a in agent[1:])}]\n"
    )
    bridge = [sys.executable, "-m", "acp_bridge", "stdio", "--config", str(config)]
    env = dict(os.environ, XDG_STATE_HOME=str(where / "state"))
    log = where / "stderr.log"
    out: dict[str, Any] = {
        "runs": s.startup_runs,
        "bytecode": bytecode,
        "load_average_at_start": os.getloadavg(),
    }
    try:
        times: dict[str, list[float]] = {"agent": [], "bridge": []}
        for i in range(s.startup_runs + 1):
            order = ("agent", "bridge") if i % 2 else ("bridge", "agent")
            for key in order:
                argv = agent if key == "agent" else bridge
                took = _time_initialize(argv, env, log, time.monotonic() + s.timeout)
                if i:
                    times[key].append(took * 1000)
        agent_ms = percentile(times["agent"], 0.5)
        bridge_ms = percentile(times["bridge"], 0.5)
        out.update(
            {
                "agent_runs_ms": times["agent"],
                "bridge_runs_ms": times["bridge"],
                "agent_ms": agent_ms,
                "bridge_ms": bridge_ms,
                "overhead_ms": bridge_ms - agent_ms,
            }
        )
    except Exception as exc:
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-3:]) if log.exists() else ""
        out["error"] = _failure(exc) + (f" [log: {tail[-400:]}]" if tail else "")
    return out


# --- targets (from the issue) ----------------------------------------------------------


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    th = results["throughput"]["variants"]
    rt = results["round_trip"]["variants"]
    sc = results["scale"]
    mem = results["memory"]
    rows: list[dict[str, Any]] = []

    def add(name: str, value: Any, met: Callable[[Any], bool], shown: str) -> None:
        rows.append(
            {
                "target": name,
                "value": value,
                "shown": shown if value is not None else "n/a",
                "met": met(value) if value is not None else None,
            }
        )

    r = th["stdio"]["ratio_to_direct"]
    add("stdio throughput >= 0.8x direct", r, lambda v: v >= 0.8, f"{r or 0:.2f}x")
    ws = "ws" if th["ws"]["ratio_to_direct"] is not None else "ws_queue"
    r = th[ws]["ratio_to_direct"]
    name = "WebSocket throughput >= 0.5x direct"
    if ws == "ws_queue":
        name += " (client_queue raised)"
    add(name, r, lambda v: v >= 0.5, f"{r or 0:.2f}x")
    ok = th["ws"]["error"] is None and th["ws"]["updates_per_s"] is not None
    add(
        "WebSocket client kept through a full-speed flood (defaults)",
        ok,
        lambda v: bool(v),
        "kept" if ok else "dropped",
    )
    c = results["throughput"]["journal_cost"]
    add("journal on costs <= 10%", c, lambda v: v <= 0.10, f"{(c or 0) * 100:.1f}%")
    a = rt["stdio"].get("added_p50_us")
    add("added round-trip p50 <= 100 us (stdio)", a, lambda v: v <= 100, f"{a or 0:.0f} us")
    a = rt["stdio"].get("added_p99_us")
    add("added round-trip p99 <= 500 us (stdio)", a, lambda v: v <= 500, f"{a or 0:.0f} us")
    p = sc.get("probe", {}).get("p99_us") if isinstance(sc.get("probe"), dict) else None
    add("scale: probe p99 < 20 ms", p, lambda v: v < 20_000, f"{(p or 0) / 1000:.1f} ms")
    st = sc.get("starved_sessions")
    add("scale: no session starved", st, lambda v: v == 0, f"{st} starved")
    b = mem.get("per_session_bytes")
    add("<= 20 KiB per idle session", b, lambda v: v <= 20 * 1024, f"{(b or 0) / 1024:.1f} KiB")
    g = mem.get("growth_first_to_last_bytes")
    first = (mem.get("rss_settled_after_runs_bytes") or [1])[0]
    add(
        "bridge RSS flat across repeated runs (< 5% growth)",
        g,
        lambda v: v <= 0.05 * first,
        f"{(g or 0) / 2**20:+.1f} MiB",
    )
    # issue 23
    o = results["startup"].get("overhead_ms")
    add("start-up: initialize overhead <= 150 ms", o, lambda v: v <= 150, f"+{o or 0:.0f} ms")
    d = (results["throughput"].get("peers") or {}).get("supergateway", {})
    d = d.get("round_trip_p50_diff_us")
    add(
        "WebSocket round-trip p50 <= supergateway's",
        d,
        lambda v: v <= 0,
        f"{d or 0:+.0f} us",
    )
    return rows


# --- output ----------------------------------------------------------------------------


def _num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _failed(error: str | None) -> str:
    """A failure as the table shows it: short (the JSON has all of it)."""
    text = (error or "unknown error").split(" [log:")[0]
    for own in ("ConnectionEnded: ", "Timeout: "):  # the client's own, self-explanatory
        text = text.removeprefix(own)
    short = text if len(text) <= 130 else text[:127] + "..."
    return short if text.startswith(NOT_MEASURED) else "FAILED: " + short


def _free_text(cell: str) -> bool:
    """A cell that says why there is no figure: not aligned, not counted in the widths."""
    return cell.startswith(("FAILED", NOT_MEASURED))


def table_rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("scenario", "variant", "metric", "value", "vs direct")]
    th = results["throughput"]
    for v in th["variants"].values():
        value = _num(v["updates_per_s"]) if not v["error"] else _failed(v["error"])
        ratio = _num(v["ratio_to_direct"], "{:.2f}x")
        rows.append((f"throughput N={th['n']:,}", v["label"], "updates/s", value, ratio))
    for v in th["variants"].values():
        if v.get("cpu_us_per_update") is not None:
            cpu = _num(v["cpu_us_per_update"], "{:.1f}")
            rows.append(("throughput", v["label"], "CPU us/update", cpu, ""))
    rows.append(("throughput", "journal on vs off", "cost", _num(th["journal_cost"], "{:.1%}"), ""))
    for key, c in (th.get("compare") or {}).items():
        if isinstance(c, dict) and c.get("change") is not None:
            label = th["variants"][key]["label"]
            rows.append(("throughput", label, "CPU vs --compare", f"{c['change']:+.1%}", ""))
    rt = results["round_trip"]
    rows.extend(peer_rows(th.get("peers") or {}, rt["variants"]))
    for v in rt["variants"].values():
        name = f"round trip x{rt['count']:,}"
        if v.get("error") or "p50_us" not in v:
            rows.append((name, v["label"], "set_mode", _failed(v.get("error")), ""))
            continue
        added50 = v.get("added_p50_us")
        added99 = v.get("added_p99_us")
        rows.append(
            (
                name,
                v["label"],
                "p50 us",
                _num(v["p50_us"], "{:.0f}"),
                "" if added50 is None else f"+{added50:.0f} us",
            )
        )
        rows.append(
            (
                name,
                v["label"],
                "p99 us",
                _num(v["p99_us"], "{:.0f}"),
                "" if added99 is None else f"+{added99:.0f} us",
            )
        )
    sc = results["scale"]
    name = f"scale {sc['agents']}x{sc['sessions_per_agent']} sessions"
    if sc.get("error"):
        rows.append((name, "bridge stdio", "", _failed(sc["error"]), ""))
    else:
        rows.append(
            (name, "bridge stdio", "aggregate updates/s", _num(sc["aggregate_updates_per_s"]), "")
        )
        rows.append(
            (
                name,
                "probe set_mode",
                "p50 / p99 ms",
                f"{sc['probe']['p50_us'] / 1000:.2f} / {sc['probe']['p99_us'] / 1000:.2f}",
                f"{sc['probe']['count']} probes",
            )
        )
        rows.append(
            (
                name,
                "sessions",
                "finish min/med/max s",
                f"{sc['finish_min_s']:.2f} / {sc['finish_median_s']:.2f} / "
                f"{sc['finish_max_s']:.2f}",
                f"{sc['starved_sessions']} starved",
            )
        )
        rows.append(
            (name, "sessions", "first update, last s", f"{sc['first_update_max_s']:.2f}", "")
        )
    rss = th.get("stdio_rss_after_runs_bytes") or []
    if len(rss) > 1:
        rows.append(
            (
                "memory",
                f"stdio after {len(rss)} runs of {th['n']:,}",
                "RSS MiB",
                " / ".join(f"{b / 2**20:.1f}" for b in rss),
                "",
            )
        )
    mem = results["memory"]
    name = "memory"
    if "per_session_bytes" in mem:
        rows.append(
            (
                name,
                "bridge stdio",
                "RSS, 0 sessions MiB",
                f"{mem['rss_0_sessions_bytes'] / 2**20:.1f}",
                "",
            )
        )
        rows.append(
            (
                name,
                f"{mem['idle_sessions']:,} idle sessions",
                "bytes/session",
                _num(mem["per_session_bytes"]),
                "",
            )
        )
    if "rss_after_runs_bytes" in mem:
        rows.append(
            (
                name,
                f"after {mem['flat_runs']} floods of {mem['n']:,}",
                "RSS MiB",
                " / ".join(f"{b / 2**20:.1f}" for b in mem["rss_after_runs_bytes"]),
                "at once",
            )
        )
    if "rss_settled_after_runs_bytes" in mem:
        rows.append(
            (
                name,
                f"after {mem['flat_runs']} floods of {mem['n']:,}",
                "RSS MiB",
                " / ".join(f"{b / 2**20:.1f}" for b in mem["rss_settled_after_runs_bytes"]),
                f"{mem['settle_s']:g} s later",
            )
        )
    if mem.get("error"):
        rows.append((name, "bridge stdio", "", _failed(mem["error"]), ""))
    fan = results.get("fanout") or {}
    name = f"fan-out {fan.get('children')} x {fan.get('chunks_per_child', 0):,}"
    if fan.get("error"):
        rows.append((name, "bridge stdio", "", _failed(fan["error"]), ""))
    elif fan:
        rows.append(
            (name, "sub-agents' updates", "updates/s", _num(fan["aggregate_updates_per_s"]), "")
        )
        for q in ("p50", "p99"):
            value = _num(fan["latency"][f"{q}_us"] / 1000, "{:.1f}")
            rows.append((name, "update latency", f"{q} ms", value, "write to read"))
    rows.extend(startup_rows(results["startup"]))
    return rows


def peer_rows(peer: dict[str, Any], rt: dict[str, Any]) -> list[tuple[str, ...]]:
    """The bridge / each peer: updates/s, CPU per update, round trip p50 and p99."""
    rows: list[tuple[str, ...]] = []
    for p in peer.values():
        peer_name = p["peer_label"].split(",")[0]
        if p["error"]:
            rows.append(("vs peer", f"bridge / {peer_name}", "", _failed(p["error"]), ""))
            continue
        pair = f"{p['bridge_label']} / {peer_name}"
        ratio = _num(p["throughput_ratio"], "{:.2f}x")
        rows.append(("vs peer", pair, "updates/s ratio", ratio, ""))
        rows.append(("vs peer", pair, "CPU us/update ratio", _num(p["cpu_ratio"], "{:.2f}x"), ""))
        pair = f"{rt[p['round_trip_bridge']]['label']} / {peer_name}"
        for q in ("p50", "p99"):
            diff = p[f"round_trip_{q}_diff_us"]
            rows.append(
                (
                    "vs peer",
                    pair,
                    f"round trip {q} ratio",
                    _num(p[f"round_trip_{q}_ratio"], "{:.2f}x"),
                    "" if diff is None else f"{diff:+.0f} us",
                )
            )
    return rows


def startup_rows(st: dict[str, Any]) -> list[tuple[str, ...]]:
    name = f"start-up x{st.get('runs', 0)}"
    if st.get("error"):
        return [(name, "initialize", "", _failed(st["error"]), "")]
    return [
        (name, "demo agent alone", "initialize ms, median", f"{st['agent_ms']:.0f}", ""),
        (
            name,
            "bridge stdio + demo agent",
            "initialize ms, median",
            f"{st['bridge_ms']:.0f}",
            f"+{st['overhead_ms']:.0f} ms",
        ),
    ]


def render_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows if not _free_text(r[i])) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        cells = [
            row[0].ljust(widths[0]),
            row[1].ljust(widths[1]),
            row[2].ljust(widths[2]),
            row[3].rjust(widths[3]) if not _free_text(row[3]) else row[3],
            row[4].rjust(widths[4]),
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_targets(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["target"]) for r in rows)
    out = []
    for r in rows:
        status = {True: "met", False: "NOT MET", None: "not measured"}[r["met"]]
        out.append(f"{r['target'].ljust(width)}  {r['shown']:>12}  {status}")
    return "\n".join(out)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "load_average_at_start": os.getloadavg(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0]
        info["memory_bytes"] = int(mem.split()[1]) * 1024
    with contextlib.suppress(ImportError):
        from acp_bridge import __version__

        info["acp_bridge"] = __version__
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        rev = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        if rev.returncode == 0:
            info["git"] = rev.stdout.strip()
    return info


# --- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> Settings:
    p = argparse.ArgumentParser(
        prog="bench", description="acp-bridge benchmark: the bridge vs a direct pipe"
    )
    p.add_argument("--quick", action="store_true", help="small sizes, one run each (seconds)")
    p.add_argument("--json", default="bench-results.json", metavar="PATH", help="JSON output")
    p.add_argument("--n", type=int, help="updates per throughput run (200000; quick 20000)")
    p.add_argument("--reps", type=int, help="throughput runs per variant, best kept (3; quick 1)")
    p.add_argument("--round-trips", type=int, help="sequential set_mode (2000; quick 300)")
    p.add_argument("--agents", type=int, help="scale: agents (50; quick 5)")
    p.add_argument("--sessions", type=int, help="scale: sessions per agent (10; quick 4)")
    p.add_argument("--scale-chunks", type=int, help="scale: updates per session (500)")
    p.add_argument("--idle-sessions", type=int, help="memory: idle sessions (1000; quick 100)")
    p.add_argument(
        "--flat-n", type=int, help="memory: updates per repeated run (20000; quick 10000)"
    )
    p.add_argument(
        "--startup-runs", type=int, help="start-up: runs of each, median kept (10; quick 3)"
    )
    p.add_argument("--policy-rules", type=int, default=50, help="rules loaded (50)")
    p.add_argument(
        "--journal-on-config",
        default=JOURNAL_ON_DEFAULT,
        metavar="TOML",
        help="config text appended for 'journal on' (default: none, the journal is on)",
    )
    p.add_argument(
        "--journal-off-config",
        default=JOURNAL_OFF_DEFAULT,
        metavar="TOML",
        help="config text appended for 'journal off' (default: [store] journal = false)",
    )
    p.add_argument("--timeout", type=float, help="seconds allowed per run (120; quick 30)")
    p.add_argument("--fanout-children", type=int, help="fan-out: sub-agents (20; quick 5)")
    p.add_argument(
        "--fanout-chunks", type=int, help="fan-out: updates per sub-agent (2000; quick 200)"
    )
    p.add_argument(
        "--compare",
        type=Path,
        metavar="DIR",
        help="another checkout of acp-bridge (git worktree add DIR REV): its stdio bridge "
        "(journal on and off) runs beside this one; CPU us/update side by side",
    )
    a = p.parse_args(argv)
    if a.compare is not None and not (a.compare / "acp_bridge" / "__init__.py").is_file():
        p.error(f"--compare {a.compare}: no acp_bridge package there")
    if a.compare is not None and (a.compare / "acp_bridge" / "_scanc.c").is_file():
        built = list((a.compare / "acp_bridge").glob("_scanc*.so"))
        if not built:
            # (a git checkout has the C scanner's source, not the module pip builds from it)
            print(
                f"bench: --compare {a.compare}: its C line scanner is not built, so it runs "
                "the pure-Python one; build it there first: pip wheel --no-deps -w W DIR, "
                "then unzip -j W/*.whl 'acp_bridge/_scanc*' -d DIR/acp_bridge",
                file=sys.stderr,
            )
    q = a.quick

    def pick(value: int | float | None, full: int | float, quick: int | float) -> Any:
        return value if value is not None else (quick if q else full)

    return Settings(
        quick=q,
        n=pick(a.n, 200_000, 20_000),
        reps=pick(a.reps, 3, 1),
        round_trips=pick(a.round_trips, 2000, 300),
        scale_agents=pick(a.agents, 50, 5),
        scale_sessions=pick(a.sessions, 10, 4),
        scale_chunks=pick(a.scale_chunks, 500, 500),
        idle_sessions=pick(a.idle_sessions, 1000, 100),
        flat_runs=3,
        # At least history_limit (10,000 by default): the session's history is full after
        # the first run, so any later growth is a leak, not the history filling up.
        flat_n=pick(a.flat_n, 20_000, 10_000),
        startup_runs=pick(a.startup_runs, 10, 3),
        policy_rules=a.policy_rules,
        journal_on_config=a.journal_on_config,
        journal_off_config=a.journal_off_config,
        timeout=pick(a.timeout, 120.0, 30.0),
        json_path=Path(a.json),
        fanout_children=pick(a.fanout_children, 20, 5),
        fanout_chunks=pick(a.fanout_chunks, 2000, 200),
        compare=None if a.compare is None else a.compare.resolve(),
    )


def run(s: Settings) -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine_info(),
        "quick": s.quick,
        "settings": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(s).items() if k != "json_path"
        },
    }
    with tempfile.TemporaryDirectory(prefix="acp-bridge-bench-") as tmp:
        scratch = Path(tmp)
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("startup", lambda: startup(s, scratch)),
            ("throughput", lambda: throughput_and_round_trip(s, scratch)),
            ("scale", lambda: scale(s, scratch)),
            (
                "fanout",
                lambda: fanout(
                    children=s.fanout_children,
                    chunks=s.fanout_chunks,
                    timeout=s.timeout,
                    scratch=scratch,
                    summary=latency_summary,
                ),
            ),
            ("memory", lambda: memory(s, scratch)),
        ]
        for name, step in steps:
            t0 = time.monotonic()
            print(f"bench: {name}...", file=sys.stderr, flush=True)
            try:
                value = step()
            except Exception as exc:  # a bug in the benchmark itself: report, go on
                traceback.print_exc()
                value = {"error": _failure(exc)}
            if name == "throughput":
                if isinstance(value, tuple):
                    results["throughput"], results["round_trip"] = value
                else:
                    results["throughput"] = results["round_trip"] = value
            else:
                results[name] = value
            print(f"bench: {name} done in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    results["elapsed_s"] = time.monotonic() - started
    return results


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    results = run(s)
    text = ""
    try:
        results["targets"] = evaluate(results)
        text = render_table(table_rows(results))
        text += "\n\nTargets (issues 7 and 23):\n" + render_targets(results["targets"])
    except Exception as exc:  # a scenario failed so badly its section is missing
        traceback.print_exc()
        results.setdefault("errors", []).append(_failure(exc))
    m = results["machine"]
    print(
        f"acp-bridge benchmark{' (quick)' if s.quick else ''}: {m['cpu_count']} CPUs, "
        f"{m.get('cpu_model', m['machine'])}, Python {m['python']}, {m['platform']}"
    )
    print(text)
    print(f"\n{JOURNAL_NOTE}")
    print(f"total {results['elapsed_s']:.1f}s; JSON: {s.json_path}")
    s.json_path.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
