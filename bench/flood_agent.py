"""
A minimal ACP v1 agent that floods: stdlib only, synchronous, no SDK.

- ``initialize`` → protocol 1, no optional capabilities;
- ``session/new`` → ``{PREFIX}s{n}`` (``--prefix`` lets several agents use distinct ids, or
  the same ids on purpose to make the bridge rewrite them);
- ``session/prompt`` whose text is ``flood N`` → N ``agent_message_chunk`` updates (their
  texts cycling through ``CHUNK_POOL`` varied ones), then ``end_turn`` (any other text: no
  update);
- ``session/set_mode`` → ``{}`` at once; ``session/cancel`` ends the session's turn.

With ``--stamp`` each chunk's text is the ``time.monotonic()`` of its write (one clock for
every process of the machine): a client reads from it how long the update took to reach it.

Turns of several sessions run at the same time: each pass writes one batch of every active
turn (round robin) in one big write, and reads whatever input arrived in between, so a
``set_mode`` is answered between two batches, never after a whole turn.

Run as a script (``python bench/flood_agent.py``) or a module (``python -m bench.flood_agent``);
it imports nothing from the project, so it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from collections import deque

#: A turn's chunks cycle through this many distinct texts (words of a small vocabulary,
#: 20 characters on average, as an agent's streamed text): what the bridge relays, records
#: and elides is not the same line over and over, which would flatter every compression.
CHUNK_POOL = 509
_TEXT = (
    "the fix is in the relay so each read of the pipe is scanned once and a run of "
    "updates of one session goes to the client in one write while the journal keeps "
    "what was sent with the index in sqlite and the bytes in segment files"
)
_WORDS = _TEXT.split(" ")


def chunk_texts(count: int) -> list[str]:
    """``count`` chunk texts, deterministic and nearly all distinct (8 to 34 characters)."""
    texts = []
    state = 12345
    for _ in range(count):
        words = []
        while True:
            state = (state * 1103515245 + 12345) % 2**31
            words.append(_WORDS[state % len(_WORDS)])
            size = sum(map(len, words)) + len(words)
            if size >= 8 + state % 25:
                break
        texts.append(" " + " ".join(words))
    return texts


_TEXTS = chunk_texts(CHUNK_POOL)
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _line(msg: object) -> bytes:
    return (_dumps(msg) + "\n").encode()


def _result(req_id: object, value: object) -> bytes:
    return _line({"jsonrpc": "2.0", "id": req_id, "result": value})


def _error(req_id: object, code: int, message: str) -> bytes:
    return _line({"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}})


def chunk_line(session_id: str, text: str) -> bytes:
    """One ``agent_message_chunk`` update, as the agent writes it (newline included)."""
    return _line(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": session_id,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": text},
                },
            },
        }
    )


class Turn:
    """A prompt turn under way: ``remaining`` updates still to write."""

    __slots__ = ("ends", "next", "pool", "remaining", "req_id", "session_id")

    def __init__(self, session_id: str, req_id: object, remaining: int) -> None:
        self.session_id = session_id
        self.req_id = req_id
        self.remaining = remaining
        lines = [chunk_line(session_id, text) for text in _TEXTS]
        #: the pool's lines in one block; where each line ends in it; the next line's index
        self.pool = b"".join(lines)
        self.ends = [0]
        for line in lines:
            self.ends.append(self.ends[-1] + len(line))
        self.next = 0

    def take(self, k: int) -> bytes:
        """The next ``k`` chunk lines of the turn (the pool, cycled)."""
        start = self.next
        whole, rest = divmod(start + k, CHUNK_POOL)
        self.next = rest
        ends = self.ends
        if whole == 0:
            return self.pool[ends[start] : ends[rest]]
        cycles = self.pool * (whole - 1) if whole > 1 else b""
        return self.pool[ends[start] :] + cycles + self.pool[: ends[rest]]


def _flood_count(params: dict[str, object]) -> int:
    prompt = params.get("prompt")
    text = ""
    if isinstance(prompt, list):
        text = " ".join(str(block.get("text", "")) for block in prompt if isinstance(block, dict))
    words = text.split()
    if len(words) == 2 and words[0] == "flood" and words[1].isdigit():
        return int(words[1])
    return 0


class FloodAgent:
    def __init__(self, *, prefix: str, batch: int, stamp: bool = False) -> None:
        self.prefix = prefix
        self.batch = batch
        self.stamp = stamp
        self.sessions: set[str] = set()
        self.count = 0
        self.turns: deque[Turn] = deque()
        self.out: list[bytes] = []

    def handle(self, msg: dict[str, object]) -> None:
        method = msg.get("method")
        req_id = msg.get("id")
        raw = msg.get("params")
        params: dict[str, object] = raw if isinstance(raw, dict) else {}
        if method is None:
            return  # a response (the bridge never asks this agent anything)
        out = self.out
        if method == "initialize":
            out.append(
                _result(
                    req_id,
                    {
                        "protocolVersion": 1,
                        "agentCapabilities": {"loadSession": False},
                        "authMethods": [],
                        "agentInfo": {"name": "flood-agent", "version": "1"},
                    },
                )
            )
        elif method == "session/new":
            self.count += 1
            new_sid = f"{self.prefix}s{self.count}"
            self.sessions.add(new_sid)
            modes = {
                "currentModeId": "a",
                "availableModes": [{"id": "a", "name": "A"}, {"id": "b", "name": "B"}],
            }
            out.append(_result(req_id, {"sessionId": new_sid, "modes": modes}))
        elif method == "session/set_mode":
            out.append(_result(req_id, {}))
        elif method == "session/prompt":
            sid = params.get("sessionId")
            if sid not in self.sessions:
                out.append(_error(req_id, -32002, f"unknown session {sid!r}"))
                return
            n = _flood_count(params)
            if n > 0:
                self.turns.append(Turn(str(sid), req_id, n))
            else:
                out.append(_result(req_id, {"stopReason": "end_turn"}))
        elif method == "session/cancel":
            for turn in self.turns:
                if turn.session_id == params.get("sessionId"):
                    turn.remaining = -1
        elif req_id is not None:
            out.append(_error(req_id, -32601, f"Method not found: {method}"))

    def step(self) -> None:
        """One round robin pass: a batch of every active turn; finished turns answered."""
        out = self.out
        for _ in range(len(self.turns)):
            turn = self.turns.popleft()
            if turn.remaining < 0:
                out.append(_result(turn.req_id, {"stopReason": "cancelled"}))
                continue
            k = min(turn.remaining, self.batch)
            if self.stamp:
                out.append(chunk_line(turn.session_id, f"{time.monotonic():.6f}") * k)
            else:
                out.append(turn.take(k))
            turn.remaining -= k
            if turn.remaining:
                self.turns.append(turn)
            else:
                out.append(_result(turn.req_id, {"stopReason": "end_turn"}))

    def flush(self) -> None:
        if self.out:
            _write_all(b"".join(self.out))
            self.out.clear()


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--prefix", default="", help="prefix of the session ids")
    parser.add_argument("--batch", type=int, default=256, help="updates per write per turn")
    parser.add_argument("--stamp", action="store_true", help="chunk text: time of the write")
    args = parser.parse_args(argv)
    agent = FloodAgent(prefix=args.prefix, batch=max(1, args.batch), stamp=args.stamp)
    pending = b""
    while True:
        if agent.turns:
            readable, _, _ = select.select([0], [], [], 0)
            if not readable:
                agent.step()
                agent.flush()
                continue
        data = os.read(0, 1 << 16)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                agent.handle(msg)
        agent.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
