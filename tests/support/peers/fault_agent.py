"""
A scriptable ACP agent that misbehaves on demand (stdlib only, threads, no project imports).

Run as ``python tests/support/peers/fault_agent.py [OPTIONS]``. It speaks ACP v1 over stdin/stdout:
``initialize`` (``loadSession``), ``session/new`` (ids ``f1``, ``f2``...), ``session/load``
(any id: it replays ``--replay`` updates, then answers), ``session/set_mode``,
``session/prompt`` and ``session/cancel``. What a prompt does depends on its text:

- ``flood N``: N ``agent_message_chunk`` updates as fast as the pipe takes them (in batches;
  requests arriving meanwhile, such as ``session/set_mode``, are answered between batches);
- ``crash N``: one update, then exit with status N;
- ``stall``: stop reading stdin for good (the prompt is never answered);
- ``garbage``: lines that are not JSON (and not UTF-8) on stdout, one update, then end_turn;
- ``exit-mid-line``: half a JSON line without its newline, then exit 3;
- ``exit-mid-permission``: ``session/request_permission``, then exit 4 without waiting;
- ``permission``: ask, report the outcome as an update, end_turn (cancelled if cancelled);
- ``wait``: one update, then wait for ``session/cancel`` (stopReason cancelled);
- ``answer-then-exit``: answer end_turn, then exit 0 at once;
- ``oversize N``: one ``session/update`` line of N MiB (written 1 MiB at a time), then wait
  for ``session/cancel`` like ``wait``;
- anything else: one update ``hello``, end_turn.

``session/load`` of an id that starts with ``die`` replays ``--replay`` updates, then exits 5
(mid-load). Options make it hostile to being stopped:

- ``--ignore-term``: ignore SIGTERM, and keep running after stdin EOF;
- ``--grandchildren N --pidfile FILE``: start N ``sleep 1000`` children in its own process
  group (they outlive it unless the group is killed); FILE gets this process's pid, then one
  pid per child, one a line, written before ``initialize`` is answered;
- ``--hold-stdout``: the children inherit its stdout (the bridge never sees EOF from a pipe
  they hold);
- ``--crash-at-start N``: exit N before reading anything.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

_dumps = json.JSONEncoder(separators=(",", ":")).encode
_lock = threading.Lock()
_cancelled: dict[str, threading.Event] = {}
_waiting: dict[int, threading.Event] = {}
_answers: dict[int, dict[str, object]] = {}
_ids = iter(range(1000, 1 << 30))
_sessions = iter(range(1, 1 << 30))
FLOOD_BATCH = 64


def _write(data: bytes) -> None:
    with _lock:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


def _line(msg: object) -> bytes:
    return (_dumps(msg) + "\n").encode()


def send(msg: object) -> None:
    _write(_line(msg))


def result(req_id: object, value: object) -> None:
    send({"jsonrpc": "2.0", "id": req_id, "result": value})


def error(req_id: object, code: int, message: str) -> None:
    send({"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}})


def update_line(sid: str, text: str) -> bytes:
    return _line(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": sid,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": text},
                },
            },
        }
    )


def die(status: int) -> None:
    """Exit at once: no cleanup, no flushing of anything (a crash)."""
    os._exit(status)


def ask_permission(sid: str) -> tuple[int, threading.Event]:
    req_id = next(_ids)
    event = threading.Event()
    _waiting[req_id] = event
    send(
        {
            "jsonrpc": "2.0",
            "id": req_id,
            "method": "session/request_permission",
            "params": {
                "sessionId": sid,
                "toolCall": {"toolCallId": f"t{req_id}", "title": "do it", "kind": "edit"},
                "options": [
                    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                ],
            },
        }
    )
    return req_id, event


def prompt(req_id: object, params: dict[str, object]) -> None:
    sid = str(params.get("sessionId"))
    blocks = params.get("prompt")
    text = ""
    if isinstance(blocks, list):
        text = " ".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))
    words = text.split()
    command = words[0] if words else ""
    arg = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    cancel = _cancelled.setdefault(sid, threading.Event())
    cancel.clear()
    if command == "flood":
        done = 0
        while done < arg and not cancel.is_set():
            k = min(FLOOD_BATCH, arg - done)
            _write(b"".join(update_line(sid, f"{sid}:{done + i}") for i in range(k)))
            done += k
        reason = "cancelled" if cancel.is_set() else "end_turn"
        result(req_id, {"stopReason": reason, "_meta": {"sent": done}})
    elif command == "crash":
        _write(update_line(sid, "about to crash"))
        die(arg)
    elif command == "stall":
        _stalled.set()
    elif command == "garbage":
        _write(b'this is not json\n\xff\xfe not utf-8 either\n{"half": \n')
        _write(update_line(sid, "still here"))
        result(req_id, {"stopReason": "end_turn"})
    elif command == "exit-mid-line":
        line = update_line(sid, "never finished")
        _write(line[: len(line) // 2])
        die(3)
    elif command == "exit-mid-permission":
        ask_permission(sid)
        die(4)
    elif command == "permission":
        ask_id, event = ask_permission(sid)
        event.wait()
        answer = _answers.pop(ask_id)
        res = answer.get("result") if isinstance(answer, dict) else None
        outcome = (res.get("outcome") if isinstance(res, dict) else None) or {}
        _write(update_line(sid, f"outcome:{outcome.get('optionId', outcome.get('outcome'))}"))
        stop = "cancelled" if outcome.get("outcome") == "cancelled" else "end_turn"
        result(req_id, {"stopReason": stop})
    elif command == "wait":
        _write(update_line(sid, "waiting"))
        cancel.wait()
        result(req_id, {"stopReason": "cancelled"})
    elif command == "oversize":
        head, tail = update_line(sid, "@").split(b"@")
        chunk = b"x" * (1 << 20)
        with _lock:  # one line, whole: nothing else may come between its pieces
            for piece in (head, *([chunk] * arg), tail):
                view = memoryview(piece)
                while view:
                    view = view[os.write(1, view) :]
        cancel.wait()
        result(req_id, {"stopReason": "cancelled"})
    elif command == "answer-then-exit":
        _write(update_line(sid, "last words"))
        result(req_id, {"stopReason": "end_turn"})
        die(0)
    else:
        _write(update_line(sid, "hello"))
        result(req_id, {"stopReason": "end_turn"})


_stalled = threading.Event()


def handle(msg: dict[str, object], args: argparse.Namespace) -> None:
    method = msg.get("method")
    req_id = msg.get("id")
    raw = msg.get("params")
    params: dict[str, object] = raw if isinstance(raw, dict) else {}
    if method is None:
        if isinstance(req_id, int) and req_id in _waiting:
            _answers[req_id] = msg
            _waiting.pop(req_id).set()
        return
    if method == "initialize":
        result(
            req_id,
            {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True},
                "authMethods": [],
                "agentInfo": {"name": "fault-agent", "version": "1"},
            },
        )
    elif method == "session/new":
        sid = f"f{next(_sessions)}"
        modes = {"currentModeId": "a", "availableModes": [{"id": "a", "name": "A"}]}
        result(req_id, {"sessionId": sid, "modes": modes})
    elif method == "session/load":
        sid = str(params.get("sessionId"))
        _write(b"".join(update_line(sid, f"replay:{i}") for i in range(args.replay)))
        if sid.startswith("die"):
            die(5)
        result(req_id, {})
    elif method == "session/set_mode":
        result(req_id, {})
    elif method == "session/prompt":
        threading.Thread(target=prompt, args=(req_id, params), daemon=True).start()
    elif method == "session/cancel":
        _cancelled.setdefault(str(params.get("sessionId")), threading.Event()).set()
    elif req_id is not None:
        error(req_id, -32601, f"Method not found: {method}")


def start_children(args: argparse.Namespace) -> None:
    pids = [os.getpid()]
    out = None if args.hold_stdout else subprocess.DEVNULL
    for _ in range(args.grandchildren):
        child = subprocess.Popen(
            ["sleep", "1000"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL
        )
        pids.append(child.pid)
    if args.pidfile:
        tmp = args.pidfile + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(f"{pid}\n" for pid in pids))
        os.replace(tmp, args.pidfile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--grandchildren", type=int, default=0)
    parser.add_argument("--pidfile")
    parser.add_argument("--hold-stdout", action="store_true")
    parser.add_argument("--crash-at-start", type=int)
    parser.add_argument("--replay", type=int, default=3)
    args = parser.parse_args(argv)
    if args.crash_at_start is not None:
        die(args.crash_at_start)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.grandchildren or args.pidfile:
        start_children(args)
    pending = b""
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for raw in lines:
            if _stalled.is_set():
                break
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict):
                handle(msg, args)
        if _stalled.is_set():
            while True:  # never reads again: the pipe fills, the bridge's writer waits
                time.sleep(3600)
    if args.ignore_term:
        while True:  # stdin is gone; it stays anyway
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
