"""
``Last-Event-ID``: a session's stream cut anywhere in a 10,000-update flood (mid-event
included) and resumed after the last event the client has delivers every update exactly once,
in order. Through the real face and bridge, in process, over memory streams.
"""

from __future__ import annotations

import functools
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acp_bridge.observe.log import configure_logging
from acp_bridge.protocol.jsonrpc import dumps
from tests.faces.test_http_acp import client_of, new_session, prompt, texts
from tests.faces.test_ws import open_face
from tests.support.fakes import FakeAgent, chunk_update

FLOOD = 10_000
#: the bytes of the flood's stream, about (an event is ~200 bytes): where cuts may fall
FLOOD_BYTES = FLOOD * 200
#: updates the agent writes at once (as a real agent's pipe carries many per read)
BURST = 250


class BurstAgent(FakeAgent):
    """``count N`` written in bursts of :data:`BURST` updates, one write each."""

    async def _prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = params["sessionId"]
        n = int(params["prompt"][0]["text"].split()[1])
        for start in range(0, n, BURST):
            lines = (
                dumps(chunk_update(sid, f"{self.name}:{sid}:{i}"))
                for i in range(start, min(n, start + BURST))
            )
            async with self._lock:
                assert self._send is not None
                await self._send.send_all(b"".join(lines))
        return {"stopReason": "end_turn"}


async def flood_cut_at(cuts: list[int]) -> None:
    """A flood on a session's stream, cut after each of ``cuts`` bytes (of that reader's
    stream) and resumed from the last event the client has, read to its end."""
    agent = BurstAgent("a")
    with trio.fail_after(60):
        async with open_face({"a": agent}) as (face, _, nursery):
            client = client_of(face, nursery)
            await client.initialize()
            conn_events = await client.events()
            sid = await new_session(client, conn_events)
            reader = await client.events(session=sid)
            msg = prompt(client, sid, f"count {FLOOD}")
            await client.post(msg, session=sid)
            seen = []
            for cut in cuts:
                seen += await reader.cut(cut)
                last = seen[-1].id if seen else "0"  # (0: before the first event)
                reader = await client.events(session=sid, last_event_id=last)
                assert reader.status == 200, reader.body
            seen += await reader.until(lambda m: m.get("id") == msg["id"])
            await reader.close()
            await conn_events.close()
    assert texts(seen) == [f"a:s1:{i}" for i in range(FLOOD)]
    ids = [tuple(map(int, (e.id or "").split("."))) for e in seen]
    assert ids == sorted(set(ids))  # each once, in order
    assert seen[-1].msg["result"] == {"stopReason": "end_turn"}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(cuts=st.lists(st.integers(0, FLOOD_BYTES // 2), min_size=1, max_size=3))
def test_a_flood_cut_anywhere_and_resumed_loses_and_repeats_nothing(cuts):
    configure_logging(level="warning", fmt="json")
    trio.run(functools.partial(flood_cut_at, cuts))
