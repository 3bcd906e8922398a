"""
One client over a byte stream pair: stdio, ``acp-bridge prompt``'s in-process client, memory
streams in tests. Lines in through the bridge, the client's queue out to the stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.runtime import pipes
from acp_bridge.runtime.pipes import READ_BUFFER_BYTES as READ_CHUNK

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.engine.links import ClientLink
    from acp_bridge.faces.v2 import V2Gate


async def serve_client_stream(
    bridge: Bridge,
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    *,
    name: str = "stdio",
    linger: float | None = None,
    preread: bytes = b"",
    on_open: Callable[[ClientLink], Awaitable[None]] | None = None,
) -> None:
    """
    Serve one client over a byte stream pair (stdio, or memory streams in tests) until EOF.

    ``preread``: bytes of the client's taken from ``receive`` before (``acp-bridge stdio``'s
    start, ``faces.early``), handled first; ``on_open``: run on the client's link before any of
    its lines (there: the ``initialize`` that start answered, noted).

    At end of input, requests already under way get ``linger`` seconds (default: the
    bridge's ``stop_grace``) to finish and be written: a client that pipes its requests and
    closes its stdin still gets its answers.

    Resource handling: returns when the client closes its side; does not close ``send``.
    Its sessions are detached whatever way the connection ends.
    """
    client = bridge.open_client(name, blocking=True)
    grace = bridge.hub.config.bridge.stop_grace if linger is None else linger
    decoder = LineDecoder(max_line_bytes=bridge.hub.config.bridge.max_line_bytes)
    # --experimental-v2: the first line decides v1 or v2 (docs/v2.md); its code is loaded
    # only then (start-up: an editor's initialize does not wait for it)
    gate = None
    if bridge.hub.config.bridge.experimental_v2:
        from acp_bridge.faces.v2 import V2Gate

        gate = V2Gate(client, bridge.handle_client_line)
    handle = bridge.handle_client_line if gate is None else gate.line
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump_then_cancel, client, send, nursery.cancel_scope, gate)
            if gate is not None:
                nursery.start_soon(gate.feed)
            try:
                if on_open is not None:
                    await on_open(client)
                for line in decoder.feed(preread):
                    await handle(client, line)
                drained = False
                while data := await pipes.receive_some(receive, READ_CHUNK, drained=drained):
                    drained = pipes.drained(data, READ_CHUNK)
                    for line in decoder.feed(data):
                        await handle(client, line)
                rest = decoder.feed_eof()
                if rest is not None:
                    await handle(client, rest)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            with trio.move_on_after(grace):
                await client.wait_idle()
            await bridge.close_client(client, "end of input")
            client.finish()
            # The pump ends the nursery once the queue is written; a client that stopped
            # reading gets the same grace, then is let go.
            nursery.cancel_scope.deadline = trio.current_time() + grace
    finally:
        if client in bridge.hub.clients:
            with trio.CancelScope(shield=True):
                await bridge.close_client(client, "connection lost")


async def _pump_then_cancel(
    client: ClientLink,
    stream: trio.abc.SendStream,
    scope: trio.CancelScope,
    gate: V2Gate | None = None,
) -> None:
    try:
        await (client.pump(stream) if gate is None else gate.pump(stream))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        client.log.info("client_output_closed")
    # Output is finished (written, or the client stopped reading): the connection is over.
    scope.cancel()
