"""
The WebSocket face reads the client's frames itself (issue 23 item 2): a message is handled
in the task that read it from the connection, the frames a client sends with its request
head are not lost, pings are answered, and a message over the cap is refused from its frame
header. Memory streams, the face of ``test_ws.py``.
"""

from __future__ import annotations

import json
import struct

import pytest
import trio
import trio.testing
import trio_websocket
import wsproto.events as ev
from wsproto.frame_protocol import FrameProtocol

from tests.faces.test_ws import (
    AUTH,
    AUTH_HEADERS,
    MEMORY_PORT,
    NEW_SESSION,
    TIMEOUT,
    RawClient,
    WsPeer,
    open_face,
    open_stream,
    read_http,
    upgrade_request,
)
from tests.support.fakes import FakeAgent


class RecordingStream(trio.abc.Stream):
    """A stream that notes which task read from it."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self.readers: set[trio.lowlevel.Task] = set()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self.readers.add(trio.lowlevel.current_task())
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()


async def test_a_message_is_handled_in_the_task_that_read_it():
    """From the socket read to handle_client_line, no task between: the only task that reads
    the connection after the handshake is the one that hands its messages to the bridge."""
    with trio.fail_after(TIMEOUT):
        async with open_face({"a": FakeAgent("a")}, ping_interval=0) as (face, bridge, nursery):
            handlers: set[trio.lowlevel.Task] = set()
            handle = bridge.handle_client_line

            async def recording(client, line):  # type: ignore[no-untyped-def]
                handlers.add(trio.lowlevel.current_task())
                await handle(client, line)

            bridge.handle_client_line = recording  # type: ignore[method-assign]
            client_side, server_side = trio.testing.memory_stream_pair()
            recorded = RecordingStream(server_side)
            nursery.start_soon(face.handle_connection, recorded)
            client = RawClient(client_side)
            await client.handshake()
            recorded.readers.clear()  # (the request head is read before any message)
            await client.call(1, "initialize", {"protocolVersion": 1})
            reply = await client.call(2, "session/new", NEW_SESSION)
            assert "sessionId" in reply["result"]
            assert len(handlers) == 1
            assert recorded.readers == handlers


async def test_frames_sent_with_the_request_head_are_read():
    """A client that sends its first frames in the same write as its upgrade request gets
    them all handled: the bytes read past the head are parsed first."""
    with trio.fail_after(TIMEOUT):
        async with open_face({"a": FakeAgent("a")}, ping_interval=0) as (face, _, nursery):
            stream = open_stream(face, nursery)
            initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize"}
            initialize["params"] = {"protocolVersion": 1}
            frame = FrameProtocol(client=True, extensions=[]).send_data(json.dumps(initialize))
            await stream.send_all(upgrade_request(MEMORY_PORT, extra=[AUTH]) + frame)
            response = await read_http(stream)
            assert response is not None
            assert response.status == 101
            data = response.body  # (what came with the 101, then the answer's frame)
            while len(data) < 4:
                data += await stream.receive_some(65536)
            assert data[:2] == bytes((0x81, 126))  # (an answer of 126 to 65535 bytes)
            end = 4 + struct.unpack("!H", data[2:4])[0]
            while len(data) < end:
                data += await stream.receive_some(65536)
            reply = json.loads(data[4:end])
            assert reply["id"] == 1
            assert "result" in reply


async def test_a_clients_ping_is_answered_with_its_payload():
    with trio.fail_after(TIMEOUT):
        async with open_face({"a": FakeAgent("a")}, ping_interval=0) as (face, _, nursery):
            client = RawClient(open_stream(face, nursery))
            await client.handshake()
            await client.call(1, "initialize", {"protocolVersion": 1})
            await client.write(ev.Ping(payload=b"are you there"))
            pong = await client.next_event()
            assert isinstance(pong, ev.Pong)
            assert pong.payload == b"are you there"


@pytest.mark.parametrize("announced", [1025, 1 << 40])
async def test_a_message_over_the_cap_is_refused_from_its_header(announced, autojump_clock):
    """A frame header announcing more than max_message_bytes closes the connection with
    1009 at once: the bridge does not wait for (or buffer) the payload."""
    async with open_face({"a": FakeAgent("a")}, ping_interval=0, max_message_bytes=1024) as (
        face,
        bridge,
        nursery,
    ):
        stream = open_stream(face, nursery)
        client = RawClient(stream)
        await client.handshake()
        await client.call(1, "initialize", {"protocolVersion": 1})
        if announced < 0x10000:
            header = bytes((0x81, 0x80 | 126)) + struct.pack("!H", announced)
        else:
            header = bytes((0x81, 0x80 | 127)) + struct.pack("!Q", announced)
        start = trio.current_time()
        await stream.send_all(header + b"\x00\x00\x00\x00" + b"{" * 100)
        close = await client.next_event()
        assert isinstance(close, ev.CloseConnection)
        assert close.code == 1009
        assert close.reason == "message over 1024 bytes"
        assert trio.current_time() == start
        assert await client.next_event() is None
        await trio.testing.wait_all_tasks_blocked()
        assert not bridge.hub.clients


async def test_the_idle_timeout_counts_from_the_last_message(autojump_clock):
    """A client that sends a message every 60 s outlives an idle timeout of 100 s; once it
    stops, it is closed 100 s after its last message (the timer is re-armed by each one)."""
    async with open_face({"a": FakeAgent("a")}, ping_interval=0, idle_timeout=100) as (
        face,
        bridge,
        nursery,
    ):
        client_side, server_side = trio.testing.memory_stream_pair()
        nursery.start_soon(face.handle_connection, server_side)
        ws = await trio_websocket.wrap_client_stream(
            nursery, client_side, f"127.0.0.1:{MEMORY_PORT}", "/acp", extra_headers=AUTH_HEADERS
        )
        peer = WsPeer(ws)
        await peer.initialize()
        for _ in range(3):
            await trio.sleep(60)
            reply = await peer.request("session/new", NEW_SESSION)
            assert "sessionId" in reply["result"]
        last = trio.current_time()
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await peer.next()
        assert trio.current_time() == last + 100
        assert closed.value.reason is not None
        assert (closed.value.reason.code, closed.value.reason.reason) == (1000, "idle")
        assert not bridge.hub.clients
