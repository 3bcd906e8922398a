"""The console's sequence view of a session (``/console/sequence``), over real loopback
sockets: from the trace's recent records when the bridge traces, else from the session's
history. The browser's side is in tests/interop/test_console_sessions.py."""

from __future__ import annotations

import io
import re

import trio

from acp_bridge.observe.trace import open_wire_trace
from tests.faces.test_console import login, request
from tests.faces.test_ws import NEW_SESSION, TIMEOUT, http_exchange, open_peer, open_server
from tests.support.fakes import FakeAgent

#: a row of the view: its arrow's label and the texts of its summary
ROW = re.compile(rb'<li id="m\d+" class="row msg ([^"]*)".*?<span class="label">([^<]*)</span>')


async def run_a_session(port: int) -> str:
    """A session of agent ``a`` with one turn of three updates; its id."""
    async with open_peer(port) as owner:
        sid: str = (await owner.request("session/new", NEW_SESSION))["result"]["sessionId"]
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "count 3"}]}
        assert (await owner.request("session/prompt", prompt))["result"]["stopReason"]
    return sid


def texts_in_order(body: bytes) -> list[bytes]:
    """The agent's texts in the rows' summaries (each is in its JSON too)."""
    return re.findall(rb'<span class="sum">[^<]*?(a:s\d+:\d)', body)


async def test_the_sequence_view_of_a_traced_session_draws_every_message_both_ways_in_order():
    trace = io.BytesIO()
    with trio.fail_after(TIMEOUT):
        async with (
            open_wire_trace(trace, redactor=None) as tracer,
            open_server({"a": FakeAgent("a")}, tracer=tracer) as server,
        ):
            port = server.port
            sid = await run_a_session(port)
            await other_session(port)
            assert tracer is not None
            await tracer.wait_flushed()
            cookie = await login(port)
            page = await http_exchange(
                port, request(port, f"/console/sequence?id={sid}", f"Cookie: {cookie}")
            )
    assert page.status == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert re.findall(rb"<script[^>]*>", page.body) == [
        b'<script src="/console/sequence.js" defer>'
    ]
    assert b"From the wire trace" in page.body
    labels = [label for _, label in ROW.findall(page.body)]
    # Both hops of each message, client side and agent side; the other session is not here.
    assert labels[:4] == [b"session/new"] * 2 + [b"result"] * 2
    assert labels[4:6] == [b"session/prompt"] * 2
    assert labels[-2:] == [b"result"] * 2
    assert labels.count(b"session/update") == 6
    assert texts_in_order(page.body) == [b"a:s1:0"] * 2 + [b"a:s1:1"] * 2 + [b"a:s1:2"] * 2
    assert b"a:s2:" not in page.body


async def other_session(port: int) -> None:
    async with open_peer(port) as other:
        sid = (await other.request("session/new", NEW_SESSION))["result"]["sessionId"]
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "count 1"}]}
        await other.request("session/prompt", prompt)


async def test_without_a_trace_the_view_draws_the_sessions_history_and_says_so():
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server:
            port = server.port
            sid = await run_a_session(port)
            cookie = await login(port)
            page = await http_exchange(
                port, request(port, f"/console/sequence?id={sid}", f"Cookie: {cookie}")
            )
            session = await http_exchange(
                port, request(port, f"/console/session?id={sid}", f"Cookie: {cookie}")
            )
    assert page.status == 200
    assert b"From the session&#x27;s history (4 entries)" in page.body
    assert b"--trace FILE" in page.body
    rows = ROW.findall(page.body)
    assert [label for _, label in rows] == [b"session/update"] * 4
    assert all(b"rtl" in classes for classes, _ in rows)  # bridge → its clients
    assert b"count 3" in page.body.split(b"a:s1:0")[0]  # the prompt first
    assert texts_in_order(page.body) == [b"a:s1:0", b"a:s1:1", b"a:s1:2"]
    assert b'<span class="t"></span>' in page.body  # no times: the history has none
    assert f'href="/console/sequence?id={sid}"'.encode() in session.body


async def test_the_sequence_view_refuses_no_cookie_a_bad_id_and_an_unknown_session():
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server:
            port = server.port
            cookie = await login(port)
            anonymous = await http_exchange(port, request(port, "/console/sequence?id=x"))
            bad = await http_exchange(
                port, request(port, "/console/sequence?id=a&id=b", f"Cookie: {cookie}")
            )
            unknown = await http_exchange(
                port, request(port, "/console/sequence?id=nope", f"Cookie: {cookie}")
            )
            style = await http_exchange(port, request(port, "/console/sequence.css"))
    assert anonymous.status == 401
    assert bad.status == 400
    assert unknown.status == 404
    assert style.status == 200
    assert style.headers["content-type"].startswith("text/css")
    assert b".acp-seq" in style.body
