"""
The benchmark: the bridge against a direct client-agent pipe, side by side in one run.

    python -m bench.run [--quick] [--json PATH]      (or ./scripts/bench)

Scenarios (full size; ``--quick`` in brackets):

- throughput: one session streams N = 200,000 [20,000] ``agent_message_chunk`` updates through:
  a direct pipe; a relay in C that only copies bytes (``bench/c_relay.c``: the floor for any
  process in the middle) and one in Python on a plain epoll loop (``bench.plain_relay``); a
  naive trio relay that decodes every line (``bench.naive_relay``: the floor for any trio
  process in the middle); ``acp-bridge stdio`` (defaults; with 50 policy rules and the journal
  on, then off; with its session id rewritten); ``acp-bridge serve`` over WebSocket (defaults,
  and with a client_queue large enough for a whole run) and over HTTP (POSTs and server-sent
  events), beside the TypeScript SDK's own Streamable HTTP server (``AcpServer``) in front of
  the same agent. Updates/s, best of 3 [1] runs interleaved across the variants (one run for
  the last two), ratio to direct; and the CPU time (user + system, all threads) of the process
  in the middle per update, the least of its runs: a figure that depends far less on what else
  the machine is doing than the rates do;
- round trip: 2,000 [300] sequential ``session/set_mode``: p50/p99, direct vs the relays
  (C, plain Python epoll, naive trio) vs bridge (stdio, WebSocket and HTTP) vs peers, and the
  latency each adds (over HTTP: the POST answered 202, then the answer on the session's
  stream); in blocks of 100 per variant taken in turn;
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
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from bench import peers
from bench.client import pipe_client, prompt_params
from bench.fanout import fanout
from bench.report import evaluate, machine_info, render_table, render_targets, table_rows
from bench.targets import (
    JOURNAL_NOTE,
    JOURNAL_OFF_DEFAULT,
    JOURNAL_ON_DEFAULT,
    Target,
    config_text,
    failure,
    latency_summary,
    percentile,
    read_cpu,
    read_rss,
    targets,
    toml_str,
)

if TYPE_CHECKING:
    from collections.abc import Callable


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


# --- scenarios -------------------------------------------------------------------------

#: key → (label, runs taken: "main" variants get --reps runs, the others one).
THROUGHPUT_VARIANTS = {
    "direct": ("direct pipe", "main"),
    "c_relay": ("C relay (any process in the middle)", "other"),
    "plain_relay": ("plain epoll relay, Python", "other"),
    "relay": ("naive trio relay (floor)", "main"),
    "stdio": ("bridge stdio", "main"),
    "ws": ("bridge serve, WebSocket", "main"),
    "ws_queue": ("serve, WebSocket, client_queue 2^20", "other"),
    "http": ("bridge serve, HTTP (server-sent events)", "main"),
    "stdio_policy_journal_on": ("stdio, policy rules, journal on", "main"),
    "stdio_policy_journal_off": ("stdio, policy rules, journal off", "main"),
    "stdio_rewrite": ("stdio, sessionId rewritten", "other"),
    "supergateway": (f"{peers.label(peers.SUPERGATEWAY)}, stdio→WebSocket", "main"),
    "conductor": (f"{peers.label(peers.CONDUCTOR)}, stdio", "main"),
    "acp_server": (f"{peers.label(peers.SDK)} AcpServer, HTTP", "main"),
}
ROUND_TRIP_VARIANTS = (
    "direct",
    "c_relay",
    "plain_relay",
    "relay",
    "stdio",
    "ws",
    "http",
    "supergateway",
    "conductor",
    "acp_server",
)
#: round trips are taken in blocks of this many per variant, the variants in turn
ROUND_TRIP_BLOCK = 100
#: peer → the bridge variants it is compared with (the same transport to the client): the
#: WebSocket one with the default client_queue, or the raised one when the default dropped;
#: the first is the one its round trips are compared with
PEER_OF = {
    "supergateway": ("ws", "ws_queue"),
    "conductor": ("stdio", "stdio"),
    "acp_server": ("http", "http"),
}
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
    one = {"flood": ""}
    made = {
        "direct": Target(scratch, "direct", kind="direct"),
        "c_relay": Target(scratch, "c_relay", kind="c_relay"),
        "plain_relay": Target(scratch, "plain_relay", kind="plain_relay"),
        "relay": Target(scratch, "relay", kind="relay"),
        "stdio": Target(scratch, "stdio", kind="stdio", config=config_text(one)),
        "ws": Target(scratch, "ws", kind="ws", config=config_text(one, websocket=True)),
        "ws_queue": Target(
            scratch,
            "ws_queue",
            kind="ws",
            config=config_text(one, websocket=True, extra=WS_BIG_QUEUE),
        ),
        "http": Target(scratch, "http", kind="http", config=config_text(one, websocket=True)),
        "stdio_policy_journal_on": Target(
            scratch,
            "stdio_policy_journal_on",
            kind="stdio",
            config=config_text(one, extra=s.journal_on_config, policy_rules=s.policy_rules),
        ),
        "stdio_policy_journal_off": Target(
            scratch,
            "stdio_policy_journal_off",
            kind="stdio",
            config=config_text(one, extra=s.journal_off_config, policy_rules=s.policy_rules),
        ),
        # Two agents with the same session ids: the second session's id is rewritten.
        "stdio_rewrite": Target(
            scratch, "stdio_rewrite", kind="stdio", config=config_text({"a": "", "b": ""})
        ),
        "supergateway": Target(scratch, "supergateway", kind="supergateway"),
        "conductor": Target(scratch, "conductor", kind="conductor"),
        "acp_server": Target(scratch, "acp_server", kind="acp_server"),
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
    if t.kind not in ("stdio", "ws", "http") or t.client is None:
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
                errors[key] = failure(exc, t)
        latencies, rt_errors = round_trips(s, made, sessions, errors)
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
                errors[key] = failure(exc, t)
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
                    errors[key] = failure(exc, t)

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
    throughput: dict[str, Any] = {
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


def round_trips(
    s: Settings, made: dict[str, Target], sessions: dict[str, str], errors: dict[str, str]
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """
    ``s.round_trips`` sequential ``session/set_mode`` per variant, in blocks of
    ``ROUND_TRIP_BLOCK`` taken in turn (as the throughput runs are interleaved): a busy moment
    of the machine lands on every variant alike, not on the one measured then.
    """
    latencies: dict[str, list[float]] = {}
    rt_errors: dict[str, str] = {}
    live = []
    for key in ROUND_TRIP_VARIANTS:
        if key in errors:
            rt_errors[key] = errors[key]
            continue
        latencies[key] = []
        live.append(key)
    deadline = time.monotonic() + s.timeout
    warm = min(200, s.round_trips // 4)

    def take(key: str, count: int) -> list[float]:
        t = made[key]
        assert t.client is not None
        try:
            return t.client.set_mode_latencies(sessions[key], count, deadline)
        except Exception as exc:
            rt_errors[key] = failure(exc, t)
            del latencies[key]
            live.remove(key)
            return []

    for key in list(live):
        take(key, warm)
    while live:
        for key in list(live):
            taken = take(key, min(ROUND_TRIP_BLOCK, s.round_trips - len(latencies[key])))
            if key in latencies:
                latencies[key] += taken
                if len(latencies[key]) >= s.round_trips:
                    live.remove(key)
    return latencies, rt_errors


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
        rt_bridge = PEER_OF[peer][0]
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
            out["error"] = failure(exc, t)
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
                # heap back (glibc; see acp_bridge/runtime/heap.py) and its journal has caught up.
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
            out["error"] = failure(exc, t)
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
    module from source at each start (a large part of the bridge's start-up), which no
    installed copy does.
    """
    where = scratch / "startup"
    where.mkdir()
    bytecode = _compile_package()
    agent = [sys.executable, "-m", "acp_bridge", "demo-agent"]
    config = where / "bridge.toml"
    config.write_text(
        f"[agents.demo]\ncommand = {toml_str(agent[0])}\n"
        f"args = [{', '.join(toml_str(a) for a in agent[1:])}]\n"
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
        out["error"] = failure(exc) + (f" [log: {tail[-400:]}]" if tail else "")
    return out


# --- main ------------------------------------------------------------------------------


def _warn_unbuilt_scanner(checkout: Path) -> None:
    """A git checkout has the C scanner's source, not the module pip builds from it: say so."""
    # (the scanner's place: protocol/ since the subpackages, the package's root before)
    for where in (checkout / "acp_bridge" / "protocol", checkout / "acp_bridge"):
        sources = list(where.glob("*scanc.c"))
        if sources and not list(where.glob("*scanc*.so")):
            inside = where.relative_to(checkout)
            print(
                f"bench: --compare {checkout}: its C line scanner is not built, so it runs "
                "the pure-Python one; build it there first: pip wheel --no-deps -w W DIR, "
                f"then unzip -j W/*.whl '{inside}/*scanc*' -d DIR/{inside}",
                file=sys.stderr,
            )
            return


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
    if a.compare is not None:
        _warn_unbuilt_scanner(a.compare)
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
                value = {"error": failure(exc)}
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
        text += "\n\nTargets:\n" + render_targets(results["targets"])
    except Exception as exc:  # a scenario failed so badly its section is missing
        traceback.print_exc()
        results.setdefault("errors", []).append(failure(exc))
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
