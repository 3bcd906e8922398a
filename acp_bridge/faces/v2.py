"""
The ACP v2 face (experimental, ``--experimental-v2``): one connection's adapter between a v2
client and the bridge's v1 (docs/v2.md).

With the flag on, a transport (stdio, a WebSocket connection) hands its lines to a
:class:`V2Gate` instead of the bridge. The connection's first line decides: an
``initialize`` asking for protocol 2 or later makes it a v2 connection, anything else leaves
it v1, served exactly as without the flag. On a v2 connection the client's lines become v1
requests on the connection's own :class:`ClientLink` (``Bridge.handle_client_line``), and
what the bridge queues on that link is translated to v2 as the transport writes it
(:meth:`V2Gate.outbound`). The decisions are :class:`acp_bridge.v2.core.V2Connection`'s.

What the face itself says to the client (a prompt's acknowledgement, its ``user_message``
and ``running`` state, refusals) is queued on the same link, marked with a leading ``RAW``
byte so the translation passes it as it is: the client gets everything in one order.
"""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING, Final

import structlog
import trio

from acp_bridge.protocol.framing import Oversize
from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps, loads
from acp_bridge.runtime import pipes
from acp_bridge.v2.core import V2Connection
from acp_bridge.v2.shapes import wants_v2

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from acp_bridge.engine.links import ClientLink
    from acp_bridge.protocol.jsonrpc import JsonObject

    Handle = Callable[[ClientLink, bytes | Oversize], Awaitable[None]]

logger = structlog.get_logger("acp_bridge.v2")

#: marks a line on the link that is v2 already (the face's own); never the first byte of
#: the bridge's JSON
RAW: Final = b"\x1e"


class V2Gate:
    """One connection: v1 or v2 (its first line says), and the v2 translation when v2."""

    def __init__(self, client: ClientLink, handle: Handle) -> None:
        self._client = client
        self._handle = handle
        self._decided = False
        #: the translation, once the connection is v2
        self.v2: V2Connection | None = None
        # Requests the translation of the bridge's output causes (a held prompt let in, a
        # refusal of a v1-only agent request): sent by :meth:`feed`, not by the writer,
        # which must never wait on the bridge. Bounded by the held prompts (MAX_HELD) and
        # the agent requests the bridge sends at once (max_agent_requests).
        self._later_send, self._later = trio.open_memory_channel[bytes](math.inf)

    async def line(self, client: ClientLink, line: bytes | Oversize) -> None:
        """One line of the client (the transport's ``handle_client_line``)."""
        if not self._decided:
            self._decided = True
            if isinstance(line, bytes) and wants_v2(line):
                self.v2 = V2Connection(secrets.token_hex(4))
                client.log.info("v2_connection")
        v2 = self.v2
        if v2 is None or isinstance(line, Oversize):
            await self._handle(client, line)
            return
        try:
            msg = loads(line)
        except JsonRpcError:
            msg = None
        if not isinstance(msg, dict):
            # (The bridge answers what is not JSON-RPC: errors are alike in v1 and v2.)
            await self._handle(client, line)
            return
        step = v2.from_client(msg)
        for out in step.to_client:
            await client.send(RAW + dumps(out))
        for out in step.to_bridge:
            await self._handle(client, dumps(out))

    def outbound(self, batch: list[bytes]) -> list[bytes]:
        """What the bridge queued for the client, as the client gets it (v2 when v2)."""
        v2 = self.v2
        if v2 is None:
            return batch
        out: list[bytes] = []
        for data in batch:
            if data[:1] == RAW:
                out.append(data[1:])
                continue
            try:
                msg: JsonObject = loads(data)
            except JsonRpcError:
                continue  # (the bridge writes JSON: never happens)
            step = v2.from_bridge(msg)
            out.extend(dumps(m) for m in step.to_client)
            for m in step.to_bridge:
                self._later_send.send_nowait(dumps(m))
        return out

    async def feed(self) -> None:
        """Send the bridge what :meth:`outbound` put aside (run for the connection's life)."""
        async for data in self._later:
            await self._handle(self._client, data)

    async def pump(self, stream: trio.abc.SendStream) -> None:
        """:meth:`ClientLink.pump` through :meth:`outbound` (stdio with the flag on)."""

        async def send(batch: list[bytes]) -> None:
            lines = self.outbound(batch)
            if lines:
                await pipes.send_all(stream, b"".join(lines))

        await self._client.pump_batches(send)


__all__ = ["RAW", "V2Gate"]
