"""
The fan-out scenario of ``bench.run``: one parent agent spawns 20 [quick: 5] children through
the bridge's MCP tools (``bench.fanout_agent``), each a flood agent's session streaming M
updates at once, stamped with the time of their write; a client that advertises
``clientCapabilities.subagents`` (so it is sent the children's updates on their own sessions)
reads them through one ``acp-bridge stdio``. Reported: the update latency the client sees
(write by the child's agent to read by the client: p50, p99), the aggregate rate, and when
the parent's turn ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.client import pipe_client

if TYPE_CHECKING:
    from collections.abc import Callable

FANOUT_AGENT = Path(__file__).with_name("fanout_agent.py")
FLOOD_AGENT = Path(__file__).with_name("flood_agent.py")


def fanout_config(children: int, *, batch: int = 16) -> str:
    """The parent, and the flood agent its children run on (each child a session of it)."""

    def table(name: str, argv: list[str]) -> str:
        args = ", ".join(f'"{a}"' for a in argv[1:])
        return f'[agents.{name}]\ncommand = "{argv[0]}"\nargs = [{args}]\n'

    flood = [sys.executable, str(FLOOD_AGENT), "--stamp", "--batch", str(batch), "--prefix", "c-"]
    return (
        table("parent", [sys.executable, str(FANOUT_AGENT)])
        + table("child", flood)
        + f"[subagents]\nmax_children = {children}\n"
    )


def fanout(
    *,
    children: int,
    chunks: int,
    timeout: float,
    scratch: Path,
    summary: Callable[[list[float]], dict[str, float]],
) -> dict[str, Any]:
    """Run it once; the figures (or ``error``)."""
    out: dict[str, Any] = {"children": children, "chunks_per_child": chunks}
    work = scratch / "fanout"
    work.mkdir(parents=True)
    config = work / "bridge.toml"
    config.write_text(fanout_config(children))
    argv = [sys.executable, "-m", "acp_bridge", "stdio", "--config", str(config)]
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
    with open(work / "stderr.log", "wb") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, cwd=work
        )
    try:
        deadline = time.monotonic() + timeout
        client = pipe_client(proc)
        caps: dict[str, Any] = {"subagents": {}}
        client.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps}, deadline)
        sid = client.new_session(str(work), deadline, agent="parent")
        text = f"fanout {children} child flood {chunks}"
        start = time.monotonic()
        prompt = client.request(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": text}]},
            deadline,
        )
        latencies: list[float] = []
        per_child: dict[str, int] = {}
        last = start
        while True:
            msg = client.next_message(deadline)
            if msg.get("method") == "session/update":
                params = msg["params"]
                update = params["update"]
                if update.get("sessionUpdate") == "agent_message_chunk":
                    now = time.monotonic()
                    latencies.append(now - float(update["content"]["text"]))
                    per_child[params["sessionId"]] = per_child.get(params["sessionId"], 0) + 1
                    last = now
                continue
            if msg.get("id") == prompt and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(f"the parent's prompt failed: {msg['error']}")
                turn_s = time.monotonic() - start
                break
        total = sum(per_child.values())
        if len(per_child) != children or total != children * chunks:
            raise RuntimeError(
                f"got {total} updates from {len(per_child)} children, "
                f"expected {children * chunks} from {children}"
            )
        elapsed = last - start
        out.update(
            {
                "updates": total,
                "elapsed_s": elapsed,
                "aggregate_updates_per_s": total / elapsed,
                "latency": summary(latencies),
                "parent_turn_s": turn_s,
            }
        )
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out
