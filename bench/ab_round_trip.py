"""
A focused A/B of the WebSocket round trip: ``serve`` of this checkout and of another one
(``--compare DIR``: e.g. ``git worktree add DIR REV``), and supergateway, all alive at once,
their ``session/set_mode`` round trips taken in interleaved blocks so that a busy moment of a
shared machine lands on every variant alike.

    python -m bench.ab_round_trip --compare DIR [--blocks 20] [--block 200]

Prints p50/p90/p99 (us) per variant. Run from the repository root after ./scripts/bench has
installed the node peers once.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.targets import Target, config_text, percentile, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--compare", type=Path, required=True, help="the other checkout")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per variant (20)")
    parser.add_argument("--block", type=int, default=200, help="round trips per block (200)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="acp-bridge-ab-") as tmp:
        scratch = Path(tmp)
        ws = config_text({"flood": ""}, websocket=True)
        made = {
            "this checkout": Target(scratch, "this", kind="ws", config=ws),
            "--compare": Target(scratch, "compare", kind="ws", config=ws, source=args.compare),
            "supergateway": Target(scratch, "supergateway", kind="supergateway"),
        }
        latencies: dict[str, list[float]] = {key: [] for key in made}
        with targets(*made.values()):
            sessions = {}
            for key, t in made.items():
                if t.unavailable:
                    raise SystemExit(f"{key}: {t.unavailable}")
                deadline = time.monotonic() + 60
                sessions[key] = t.connect(deadline).new_session(str(scratch), deadline)
                assert t.client is not None
                t.client.set_mode_latencies(sessions[key], args.block, deadline)  # warm-up
            for _ in range(args.blocks):
                for key, t in made.items():
                    assert t.client is not None
                    deadline = time.monotonic() + 120
                    latencies[key] += t.client.set_mode_latencies(
                        sessions[key], args.block, deadline
                    )
        for key, values in latencies.items():
            us = [v * 1e6 for v in values]
            shown = "  ".join(f"p{q} {percentile(us, q / 100):,.0f}" for q in (50, 90, 99))
            print(f"{key:>14}  n={len(values)}  {shown} us")


if __name__ == "__main__":
    main()
