"""
Where the bridge's time goes during a flood: a py-spy profile of ``acp-bridge stdio`` while
one session streams N ``agent_message_chunk`` updates, summed up by what the code does.

    python -m bench.profile [--updates N] [--journal on|off] [--rate HZ] [--raw FILE]

It starts the bench's flood agent behind a bridge (the bench's config: 50 policy rules, the
journal on or off), warms it up, then records the bridge with ``py-spy record --threads``
(sampling, from outside the process: the bridge runs at full speed) for the length of one
flood. Each sample is put in the first category its stack meets, from the innermost frame
out (:data:`CATEGORIES`); a sample of a thread other than the event loop's counts as that
thread's (the journal's writer, a trim of the heap). It prints the share of each category of
the event loop's busy samples, the other threads' busy samples against the event loop's, and
the functions with the most samples of their own. ``--raw FILE`` keeps py-spy's collapsed
stacks; ``--json FILE`` writes the summary.

py-spy needs to attach to the bridge (ptrace): as root, or with
``kernel.yama.ptrace_scope = 0``. Exit status 2 when it cannot.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.targets import JOURNAL_OFF_DEFAULT, Target, config_text, read_cpu

#: (category, pattern over one ``function (file:line)`` frame), tried in this order on each
#: frame from the innermost out; the first pattern a frame matches names the sample
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        (
            "JSON decode and checks",
            r"^(loads|_fast_loads|_reference_loads|_deeper_than) "
            r".*acp_bridge/protocol/jsonrpc",
        ),
        ("JSON encode", r"^(dumps|_fast_dumps) .*acp_bridge/protocol/jsonrpc"),
        ("line split and scan", r"\(.*acp_bridge/protocol/(framing|scan)\.py|^scan "),
        (
            "pipe read (system call)",
            r"^(\w+\.)?(receive_some|read_now) .*(acp_bridge/runtime/pipes|trio/_unix_pipes)",
        ),
        (
            "pipe write (system call)",
            r"^(\w+\.)?(write_now|send_all) "
            r".*(acp_bridge/runtime/pipes|trio/_unix_pipes)",
        ),
        ("history and journal notes", r"\(.*acp_bridge/(sessions/table|engine/journal)\.py"),
        (
            "relay: routing, client queue",
            r"^(Relay\.(relay_run|_relay_part|relay_update|record_update|reader|_reader_turn) "
            r".*acp_bridge/engine/relay"
            r"|_after_lines .*acp_bridge/engine/relay"
            r"|ClientLink\.(put_run|put_update|_put|_take|pump|has_room|room)"
            r" .*acp_bridge/engine/links)",
        ),
        ("other bridge code", r"\(.*acp_bridge/"),
        ("trio scheduler", r"\(.*trio/"),
    )
)
OTHER = "other (interpreter, standard library)"


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw`` (collapsed stacks): ``outer;...;inner COUNT`` per line."""
    stacks = []
    for line in text.splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def _is_thread_frame(frame: str) -> bool:
    # (with --threads, py-spy starts each stack with "thread (TID): NAME")
    return frame.startswith(("thread (", "process "))


def _is_trio_run(frame: str) -> bool:
    return frame.startswith("run (") and "trio/" in frame


def categorize(frames: list[str]) -> str:
    """The category of one sample, by the innermost frame that matches one."""
    for frame in reversed(frames):
        if _is_thread_frame(frame):
            continue
        for name, pattern in CATEGORIES:
            if pattern.search(frame):
                return name
    return OTHER


def summarize(stacks: list[tuple[list[str], int]]) -> dict[str, Any]:
    """
    The event loop's samples by category, the other threads' samples, and the functions
    with the most samples of their own. The event loop's thread is the main thread (else the
    one whose stacks run trio's ``run``).
    """
    by_thread: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for frames, count in stacks:
        thread = next((f for f in frames[:2] if _is_thread_frame(f)), "thread (?)")
        by_thread[thread].append((frames, count))

    def runs_trio(items: list[tuple[list[str], int]]) -> int:
        return sum(c for frames, c in items if any(_is_trio_run(f) for f in frames))

    main = next(
        (t for t in by_thread if t.endswith(": MainThread")),
        max(by_thread, key=lambda t: runs_trio(by_thread[t]), default=None),
    )
    loop = by_thread.get(main, []) if main is not None else []
    total = sum(c for _, c in loop)
    categories: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for frames, count in loop:
        categories[categorize(frames)] += count
        inner = next((f for f in reversed(frames) if not _is_thread_frame(f)), "?")
        own[inner] += count
    others = {
        thread: sum(c for _, c in items) for thread, items in by_thread.items() if thread != main
    }
    return {
        "event_loop_samples": total,
        "categories": [
            {"category": name, "samples": n, "share": n / total if total else 0.0}
            for name, n in categories.most_common()
        ],
        "other_threads_samples": dict(sorted(others.items(), key=lambda kv: -kv[1])),
        "top_functions": [{"frame": f, "samples": n} for f, n in own.most_common(15)],
    }


def render(summary: dict[str, Any], run: dict[str, Any]) -> str:
    total = summary["event_loop_samples"]
    lines = [
        f"bridge stdio, journal {run['journal']}, {run['updates']:,} updates in "
        f"{run['seconds']:.2f} s ({run['updates_per_s']:,.0f}/s), bridge CPU "
        f"{run['cpu_us_per_update']:.1f} us/update (all threads); py-spy at {run['rate']} Hz",
        "",
        f"event loop thread: {total:,} busy samples",
    ]
    for row in summary["categories"]:
        lines.append(f"  {row['share'] * 100:5.1f}%  {row['category']}")
    for thread, n in summary["other_threads_samples"].items():
        share = n / total * 100 if total else 0.0
        lines.append(f"other thread {thread}: {n:,} busy samples ({share:.1f}% of the loop's)")
    lines += ["", "most samples of their own (event loop thread):"]
    for row in summary["top_functions"]:
        share = row["samples"] / total * 100 if total else 0.0
        lines.append(f"  {share:5.1f}%  {row['frame']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--journal", choices=("on", "off"), default="on")
    parser.add_argument("--rate", type=int, default=997, help="samples per second")
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--json", type=Path, help="write the summary here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("profile: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="acp-bridge-profile-"))
    raw = args.raw or scratch / "profile.txt"
    extra = "" if args.journal == "on" else JOURNAL_OFF_DEFAULT
    target = Target(
        scratch, "stdio", kind="stdio", config=config_text({"a": ""}, extra=extra, policy_rules=50)
    )
    try:
        target.spawn()
        deadline = time.monotonic() + 60
        client = target.connect(deadline)
        sid = client.new_session(str(scratch), deadline)
        client.flood(sid, 500, time.monotonic() + 60)  # warm-up
        record = ["record", "--pid", str(target.pid), "--rate", str(args.rate), "--threads"]
        spy = subprocess.Popen(
            [py_spy, *record, "--format", "raw", "--output", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)  # (py-spy attaches; it says nothing when it has)
        if spy.poll() is not None:
            assert spy.stderr is not None
            why = spy.stderr.read().decode()[-500:]
            print(f"profile: py-spy failed (kept {scratch}): {why}", file=sys.stderr)
            return 2
        cpu = read_cpu(target.pid)
        count, seconds = client.flood(sid, args.updates, time.monotonic() + 300)
        cpu = read_cpu(target.pid) - cpu
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    finally:
        target.close()
    run = {
        "journal": args.journal,
        "updates": count,
        "seconds": seconds,
        "updates_per_s": count / seconds,
        "cpu_us_per_update": cpu / count * 1e6,
        "rate": args.rate,
    }
    summary = summarize(parse_collapsed(raw.read_text()))
    print(render(summary, run))
    if args.json is not None:
        args.json.write_text(json.dumps({"run": run, **summary}, indent=2) + "\n")
    if args.raw is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
