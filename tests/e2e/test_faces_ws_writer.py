"""
The tests of ``tests/faces/test_ws_writer.py`` that start other processes (kept here so that
``pytest tests/faces`` runs in-process only).
"""

from __future__ import annotations

import trio
import trio.testing

from acp_bridge.engine.links import ClientLink
from acp_bridge.runtime import pipes
from tests.faces.test_ws import NEW_SESSION, TIMEOUT, open_peer, open_server
from tests.support.fakes import FakeAgent


async def test_an_answer_to_an_idle_client_is_written_by_the_task_that_read_it(monkeypatch):
    """An agent's answer to a WebSocket client whose writer is idle goes out from the task
    that read it from the agent (no wake-up of the connection's writer task): the task that
    hands the answer to the client link is the one that writes its frame to the socket."""
    handing: list[trio.lowlevel.Task] = []
    writing: dict[bytes, trio.lowlevel.Task] = {}
    send_answer = ClientLink.send_answer
    write_now = pipes.write_now

    async def recording_answer(self: ClientLink, data: bytes, session: object) -> None:
        if b'"id":3' in data:
            handing.append(trio.lowlevel.current_task())
        await send_answer(self, data, session)

    def recording_write(fd: int, data: bytes) -> int:
        if b'"id":3' in data:
            writing[bytes(data)] = trio.lowlevel.current_task()
        return write_now(fd, data)

    monkeypatch.setattr(ClientLink, "send_answer", recording_answer)
    monkeypatch.setattr(pipes, "write_now", recording_write)
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": FakeAgent("a")}, ping_interval=0) as server,
            open_peer(server.port) as peer,
        ):
            new = await peer.request("session/new", NEW_SESSION)  # (id 2)
            sid = new["result"]["sessionId"]
            await trio.testing.wait_all_tasks_blocked()  # (the writer is idle)
            reply = await peer.request("session/set_mode", {"sessionId": sid, "modeId": "m"})
            assert reply["id"] == 3
            assert "result" in reply
    assert len(handing) == 1
    assert list(writing.values()) == handing
