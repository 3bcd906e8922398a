"""
A minimal ACP agent (stdlib only) that floods its stderr while it speaks the protocol.

A thread writes FLOOD_MIB MiB to stderr: first a 10 MiB line with no newline until its end,
then 1 KiB lines. Meanwhile ``session/prompt`` with text ``ping N`` streams N updates, 10 ms
apart, each carrying the wall-clock time it was written, so a client can measure how long the
bridge held it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

FLOOD_MIB = int(os.environ.get("NOISY_FLOOD_MIB", "100"))
started = threading.Event()
finished = threading.Event()


def flood() -> None:
    err = sys.stderr.buffer
    started.set()
    big = b"x" * (1 << 20)
    for _ in range(10):  # one 10 MiB line
        err.write(big)
    err.write(b"\n")
    line = b"WARN " + b"y" * 1018 + b"\n"
    block = line * 1024  # 1 MiB
    for _ in range(max(FLOOD_MIB - 10, 0)):
        err.write(block)
    err.flush()
    finished.set()


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main() -> None:
    for raw in sys.stdin:
        msg = json.loads(raw)
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            send(
                {
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "result": {"protocolVersion": 1, "agentCapabilities": {}},
                }
            )
        elif method == "session/new":
            threading.Thread(target=flood, daemon=True).start()
            started.wait()
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {"sessionId": "n1"}})
        elif method == "session/prompt":
            count = int(params["prompt"][0]["text"].split()[1])
            for _ in range(count):
                update = {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": repr(time.time())},
                }
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "session/update",
                        "params": {"sessionId": "n1", "update": update},
                    }
                )
                time.sleep(0.01)
            flood_done = finished.is_set()
            send(
                {
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "result": {"stopReason": "end_turn", "_meta": {"flood_done": flood_done}},
                }
            )
        elif "id" in msg:
            send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no"}})


if __name__ == "__main__":
    main()
