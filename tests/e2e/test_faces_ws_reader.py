"""
The tests of ``tests/faces/test_ws_reader.py`` that start other processes (kept here so that
``pytest tests/faces`` runs in-process only).
"""

from __future__ import annotations

import json
import socket
import threading

import trio
import trio.testing
from wsproto.frame_protocol import FrameProtocol

from tests.faces.test_ws import (
    AUTH,
    NEW_SESSION,
    TIMEOUT,
    open_peer,
    open_server,
    upgrade_request,
)
from tests.support.fakes import FakeAgent


def flood(port: int, flooding: threading.Event, stop: threading.Event) -> int:
    """A client in a thread (blocking socket, its own pace): upgrade, initialize, then
    notifications as fast as the socket takes them (``flooding`` set after the first burst)
    until ``stop``; the frames sent."""
    frame = FrameProtocol(client=True, extensions=[])
    notification = json.dumps({"jsonrpc": "2.0", "method": "flood/ignored", "params": {}})
    burst = b"".join(frame.send_data(notification) for _ in range(500))
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(upgrade_request(port, extra=[AUTH]))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 101 "), head
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize"}
        initialize["params"] = {"protocolVersion": 1}
        sock.sendall(frame.send_data(json.dumps(initialize)))
        while not stop.is_set():
            sock.sendall(burst)
            sent += 500
            flooding.set()
    return sent


async def test_a_flooding_client_does_not_starve_another():
    """A client whose socket always has data (a thread writes as fast as it is read) does not
    keep the event loop: the reader yields between reads, and another client is served.
    (Without that yield this test hangs: a starved loop cannot even fire its fail_after.)"""
    flooding, stop = threading.Event(), threading.Event()
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}, ping_interval=0) as server:
            async with trio.open_nursery() as nursery:
                flooded: list[int] = []

                async def run_flood() -> None:
                    flooded.append(
                        await trio.to_thread.run_sync(flood, server.port, flooding, stop)
                    )

                nursery.start_soon(run_flood)
                try:
                    await trio.to_thread.run_sync(flooding.wait, abandon_on_cancel=True)
                    async with open_peer(server.port) as other:
                        for _ in range(20):
                            reply = await other.request("session/new", NEW_SESSION)
                            assert "sessionId" in reply["result"]
                finally:
                    stop.set()
            assert flooded[0] > 0


async def test_a_message_that_came_while_the_reader_waited_costs_it_no_extra_yield(monkeypatch):
    """The reader yields once per read: in the wait when it had to wait for the message, so
    no further scheduler round of its own (a cancel-shielded checkpoint) comes between the
    socket and the bridge; a read that finds data at once yields after it (see the flood
    test above)."""
    yields: list[trio.lowlevel.Task] = []
    shielded = trio.lowlevel.cancel_shielded_checkpoint

    async def counting() -> None:
        yields.append(trio.lowlevel.current_task())
        await shielded()

    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}, ping_interval=0) as server:
            handlers: set[trio.lowlevel.Task] = set()
            handle = server.bridge.handle_client_line

            async def recording(client, line):  # type: ignore[no-untyped-def]
                handlers.add(trio.lowlevel.current_task())
                await handle(client, line)

            server.bridge.handle_client_line = recording  # type: ignore[method-assign]
            async with open_peer(server.port) as peer:
                await trio.testing.wait_all_tasks_blocked()  # (the reader waits)
                monkeypatch.setattr(trio.lowlevel, "cancel_shielded_checkpoint", counting)
                reply = await peer.request("session/new", NEW_SESSION)
                assert "sessionId" in reply["result"]
                await trio.testing.wait_all_tasks_blocked()
                monkeypatch.undo()
            (reader,) = handlers
            assert reader not in yields
