"""
A relay on a plain ``select.epoll`` loop (standard library, no trio): the rung between the C
relay and the naive trio relay in the bench's floors.

It does what ``bench.naive_relay`` does (copies lines both ways, decoding each one with the
bridge's codec, one write per read) on an event loop of a dozen lines: what it adds over
``bench/c_relay.c`` is Python's cost per hop, and what the naive trio relay adds over it is
trio's scheduler (a round of it per hop: the task woken, its registration re-armed).

    python -m bench.plain_relay AGENT [ARGS...]

Output a pipe does not take at once waits in a buffer for that pipe to be writable; input
from that side is not read meanwhile (so a buffer holds at most one read).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

from acp_bridge.protocol.jsonrpc import loads

READ = 64 * 1024


def _write(fd: int, data: bytes) -> bytes:
    """Write what the non-blocking ``fd`` takes now; the rest."""
    try:
        return data[os.write(fd, data) :]
    except BlockingIOError:
        return data


def main(argv: list[str]) -> int:
    agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert agent.stdin is not None
    assert agent.stdout is not None
    agent_in, agent_out = agent.stdin.fileno(), agent.stdout.fileno()
    #: source → sink; what a source's last read left of a line; what a sink has not taken
    sink = {0: agent_in, agent_out: 1}
    partial = {0: b"", agent_out: b""}
    pending = {agent_in: b"", 1: b""}
    for fd in (0, 1, agent_in, agent_out):
        os.set_blocking(fd, False)
    poll = select.epoll()
    for fd in (0, agent_out):
        poll.register(fd, select.EPOLLIN)
    source_of = {agent_in: 0, 1: agent_out}
    while True:
        for fd, _ in poll.poll():
            if fd in pending:  # a sink took the rest: its source is read again
                data = _write(fd, pending[fd])
                pending[fd] = data
                if not data:
                    poll.unregister(fd)
                    poll.register(source_of[fd], select.EPOLLIN)
                continue
            data = os.read(fd, READ)
            if not data:
                os.close(sink[fd])
                if fd == agent_out:
                    return agent.wait()
                poll.unregister(fd)
                continue
            *lines, partial[fd] = (partial[fd] + data).split(b"\n")
            for line in lines:
                loads(line)
            if not lines:
                continue
            out = b"\n".join(lines) + b"\n"
            to = sink[fd]
            out = _write(to, out)
            if out:
                pending[to] = out
                poll.unregister(fd)
                poll.register(to, select.EPOLLOUT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
