"""
A naive trio relay: the floor for anything written like the bridge, measured beside it.

It spawns the agent given on its command line and copies lines both ways, decoding each
one with the bridge's own codec (a relay must at least look at what it passes on) and
writing whatever one read produced in one write; nothing else: no routing, no ids, no
history, no journal, no policy. The benchmark runs it as another variant, so the table
shows how much of the gap to a direct pipe any trio process in the middle costs on the
machine at hand, and how much the bridge's own work adds to that.

    python -m bench.naive_relay AGENT [ARGS...]
"""

from __future__ import annotations

import os
import subprocess
import sys

import trio

from acp_bridge.protocol.jsonrpc import loads

READ = 64 * 1024


async def _copy(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream) -> None:
    rest = b""
    while data := await source.receive_some(READ):
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            loads(line)
        if lines:
            await sink.send_all(b"\n".join(lines) + b"\n")
    await sink.aclose()


async def main(argv: list[str]) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    proc = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_copy, stdin, proc.stdin)
        await _copy(proc.stdout, stdout)
        nursery.cancel_scope.cancel()
    await proc.wait()


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
