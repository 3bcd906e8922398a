"""
The bench's report: the targets judged from the results, and the table printed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.targets import NOT_MEASURED

if TYPE_CHECKING:
    from collections.abc import Callable

# --- targets ---------------------------------------------------------------------------


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
    # start-up and the peers
    o = results["startup"].get("overhead_ms")
    add("start-up: initialize overhead <= 150 ms", o, lambda v: v <= 150, f"{o or 0:+.0f} ms")
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
                "" if added50 is None else f"{added50:+.0f} us",
            )
        )
        rows.append(
            (
                name,
                v["label"],
                "p99 us",
                _num(v["p99_us"], "{:.0f}"),
                "" if added99 is None else f"{added99:+.0f} us",
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
            f"{st['overhead_ms']:+.0f} ms",
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
