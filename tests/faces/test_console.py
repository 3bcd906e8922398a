"""The approval console over real loopback sockets (raw HTTP), and its settlement rules.

The browser's side is in test_console_browser.py; these tests speak HTTP themselves, so they
see the exact statuses and headers, and run everywhere.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import trio
import trio.testing

from acp_bridge.faces import console
from acp_bridge.faces.serve import ListenInfo, startup_summary
from acp_bridge.policy.rules import Policy
from tests.faces.test_ws import (
    NEW_SESSION,
    TIMEOUT,
    TOKEN,
    HttpResponse,
    get_request,
    http_exchange,
    open_peer,
    open_server,
)
from tests.support.fakes import FakeAgent, connect, open_bridge

CONSOLE = Policy(unattended="console")


def origin(port: int) -> str:
    return f"http://127.0.0.1:{port}"


async def login(port: int) -> str:
    """The ``Cookie`` header value a browser sends after the login link."""
    response = await http_exchange(port, get_request(port, f"/console?token={TOKEN}"))
    assert response.status == 303
    assert response.headers["location"] == "/console"
    return response.headers["set-cookie"].split(";", 1)[0]


def request(port: int, target: str, *headers: str, method: str = "GET", body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", *headers]
    if method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def page_csrf(port: int, cookie: str) -> str:
    page = await http_exchange(port, request(port, "/console", f"Cookie: {cookie}"))
    assert page.status == 200
    found = re.search(rb'<meta name="csrf-token" content="([^"]+)">', page.body)
    assert found is not None
    return found.group(1).decode()


async def answer(
    port: int, cookie: str, csrf: str | None, body: dict[str, Any], *, from_origin: str | None = ""
) -> HttpResponse:
    headers = [f"Cookie: {cookie}", "Content-Type: application/json"]
    if csrf is not None:
        headers.append(f"X-Console-CSRF: {csrf}")
    if from_origin is not None:
        headers.append(f"Origin: {from_origin or origin(port)}")
    data = json.dumps(body).encode()
    return await http_exchange(
        port, request(port, "/console/answer", *headers, method="POST", body=data)
    )


class Events:
    """A live channel (server-sent events), read one snapshot at a time."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    @classmethod
    async def open(cls, port: int, cookie: str) -> Events:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(request(port, "/console/events", f"Cookie: {cookie}"))
        events = cls(stream)
        head = await events._block()
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert b"Content-Type: text/event-stream" in head
        return events

    async def _block(self) -> bytes:
        while True:
            for sep in (b"\r\n\r\n", b"\n\n"):
                if sep in self.buffer:
                    block, self.buffer = self.buffer.split(sep, 1)
                    return block
            chunk = await self.stream.receive_some(65536)
            assert chunk, "the live channel ended"
            self.buffer += chunk

    async def next(self) -> dict[str, Any]:
        while True:
            block = await self._block()
            if block.startswith(b"data: "):
                snapshot: dict[str, Any] = json.loads(block[6:])
                return snapshot

    async def until(self, predicate: Any) -> dict[str, Any]:
        while True:
            snapshot = await self.next()
            if predicate(snapshot):
                return snapshot


def is_permission(msg: dict[str, Any]) -> bool:
    return msg.get("method") == "session/request_permission"


def resolved(msg: dict[str, Any]) -> bool:
    return msg.get("method") == "_acp_bridge/permission_resolved"


async def test_an_attended_request_appears_live_and_a_console_answer_settles_it():
    """The page's live channel shows a new request without a reload; the console's answer
    reaches the agent, the client is told, a second answer is refused as already settled."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server, trio.open_nursery() as nursery:
            port = server.port
            cookie = await login(port)
            csrf = await page_csrf(port, cookie)
            events = await Events.open(port, cookie)
            assert (await events.next())["pending"] == []
            client = await connect(server.bridge, nursery)
            sid = await client.new_session("a")
            nursery.start_soon(client.prompt, sid, "permission")
            ask = await client.agent_requests.receive()
            snapshot = await events.until(lambda s: s["pending"])
            (pending,) = snapshot["pending"]
            assert pending["tool"]["title"] == "do it"
            assert pending["session"]["id"] == sid
            assert pending["shownTo"] is not None
            assert [o["name"] for o in pending["options"]] == ["Allow", "Reject"]
            assert 0 < pending["timeLeftMs"] <= 60_000

            first = await answer(port, cookie, csrf, {"id": pending["id"], "optionId": "yes"})
            note = await client.wait_for(resolved)
            await client.wait_for(lambda m: "a:outcome:yes" in json.dumps(m))
            late = await answer(port, cookie, csrf, {"id": pending["id"], "optionId": "no"})
            settled = await events.until(lambda s: not s["pending"])
            await events.stream.aclose()
            nursery.cancel_scope.cancel()
    assert first.status == 200
    assert note["params"] == {
        "sessionId": sid,
        "requestId": ask["id"],
        "outcome": {"outcome": "selected", "optionId": "yes"},
        "reason": "console",
    }
    assert late.status == 409
    assert json.loads(late.body)["status"] == "already_settled"
    assert json.loads(late.body)["by"] == "console"
    assert settled["settled"][-1]["by"] == "console"
    assert settled["decisions"][0]["source"] == "console"
    answers = [m for m in agent.received if m.get("id") == 100 and "result" in m]
    assert [a["result"]["outcome"] for a in answers] == [{"outcome": "selected", "optionId": "yes"}]


async def test_a_client_answer_first_makes_the_console_click_late():
    """The first answer wins: after the client's, the console's is told who settled it."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server, trio.open_nursery() as nursery:
            port = server.port
            cookie = await login(port)
            csrf = await page_csrf(port, cookie)
            client = await connect(server.bridge, nursery, name="editor")
            sid = await client.new_session("a")
            nursery.start_soon(client.prompt, sid, "permission")
            ask = await client.agent_requests.receive()
            (entry,) = server.bridge.approvals.desk.waiting()
            console_id = entry.extra.console_id
            await client.send(
                {
                    "jsonrpc": "2.0",
                    "id": ask["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "no"}},
                }
            )
            await client.wait_for(lambda m: "a:outcome:no" in json.dumps(m))
            late = await answer(port, cookie, csrf, {"id": console_id, "optionId": "yes"})
            nursery.cancel_scope.cancel()
    assert late.status == 409
    body = json.loads(late.body)
    assert (body["by"], body["connection"], body["decision"], body["option"]) == (
        "client",
        "editor",
        "deny",
        "Reject",
    )


async def test_no_cookie_is_401_and_a_forged_answer_is_403():
    """Without the session cookie: 401 and nothing of the pending request; a cross-origin
    answer, one without the CSRF value or an unknown Host: 403; the request still waits."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}) as server, trio.open_nursery() as nursery:
            port = server.port
            client = await connect(server.bridge, nursery)
            sid = await client.new_session("a")
            nursery.start_soon(client.prompt, sid, "permission")
            await client.agent_requests.receive()
            (entry,) = server.bridge.approvals.desk.waiting()
            body = {"id": entry.extra.console_id, "optionId": "yes"}
            cookie = await login(port)
            csrf = await page_csrf(port, cookie)
            anonymous = [
                await http_exchange(port, request(port, target))
                for target in ("/console", "/console/events", "/console?token=wrong")
            ]
            forged = [
                await answer(port, cookie, csrf, body, from_origin="http://127.0.0.1:1"),
                await answer(port, cookie, csrf, body, from_origin=None),
                await answer(port, cookie, None, body),
                await answer(port, "x=1", csrf, body),
            ]
            rebinding = await http_exchange(
                port,
                request(port, "/console", f"Cookie: {cookie}").replace(
                    f"Host: 127.0.0.1:{port}".encode(), f"Host: evil.example:{port}".encode()
                ),
            )
            still = len(server.bridge.approvals.desk.waiting())
            nursery.cancel_scope.cancel()
    assert [r.status for r in anonymous] == [401, 401, 401]
    for response in anonymous:
        assert b"do it" not in response.body
        assert sid.encode() not in response.body
    assert [r.status for r in forged] == [403, 403, 403, 401]
    assert rebinding.status == 403
    assert still == 1
    assert not [m for m in agent.received if m.get("id") == 100]


async def test_the_page_and_its_assets_carry_the_csp_and_no_inline_script():
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server:
            port = server.port
            cookie = await login(port)
            page = await http_exchange(port, request(port, "/console", f"Cookie: {cookie}"))
            script = await http_exchange(port, request(port, "/console/app.js"))
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert re.findall(rb"<script[^>]*>", page.body) == [b'<script src="/console/app.js" defer>']
    assert b" on" not in page.body.lower().replace(b" one", b"")  # no inline handlers
    assert script.status == 200
    assert script.headers["content-type"].startswith("text/javascript")


async def test_the_login_cookie_is_httponly_and_samesite_strict():
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server:
            port = server.port
            response = await http_exchange(port, get_request(port, f"/console?token={TOKEN}"))
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"acp_console_{port}=")
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert TOKEN not in cookie


async def test_unattended_console_mode_waits_for_the_console_only():
    """An unattended session's request is never shown to the client; the console answers it."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with (
            open_server({"a": agent}, bridge={"policy": CONSOLE}) as server,
            trio.open_nursery() as nursery,
        ):
            port = server.port
            cookie = await login(port)
            csrf = await page_csrf(port, cookie)
            events = await Events.open(port, cookie)
            client = await connect(server.bridge, nursery)
            meta = {"acp_bridge": {"agent": "a", "unattended": True}}
            sid = await client.new_session(_meta=meta)
            nursery.start_soon(client.prompt, sid, "permission")
            snapshot = await events.until(lambda s: s["pending"])
            (pending,) = snapshot["pending"]
            reply = await answer(port, cookie, csrf, {"id": pending["id"], "optionId": "no"})
            await client.wait_for(lambda m: "a:outcome:no" in json.dumps(m))
            await events.stream.aclose()
            nursery.cancel_scope.cancel()
    assert pending["shownTo"] == "console only"
    assert reply.status == 200
    assert not [m for m in client.received if is_permission(m) or resolved(m)]


async def test_unattended_deny_mode_denies_at_once_and_lists_nothing():
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_bridge({"a": agent}) as (client, bridge):
            sid = await client.new_session(_meta={"acp_bridge": {"agent": "a", "unattended": True}})
            await client.prompt(sid, "permission")
    assert "a:outcome:no" in client.updates(sid)
    assert bridge.approvals.desk.waiting() == []
    assert bridge.hub.audit.recent[-1].source == "unattended"


async def test_a_console_wait_ends_in_a_deny_at_ask_timeout(autojump_clock):
    """A timeout never grants: the console's request is denied at ``ask_timeout``."""
    agent = FakeAgent("a")
    policy = Policy(unattended="console", ask_timeout=30)
    seen: list[Any] = []
    with trio.fail_after(100):  # (virtual seconds: past ask_timeout)
        async with open_bridge({"a": agent}, policy=policy) as (client, bridge):
            changed = bridge.approvals.desk.changed
            changed.subscribe(lambda entry, settlement: seen.append(settlement))
            sid = await client.new_session(_meta={"acp_bridge": {"agent": "a", "unattended": True}})
            start = trio.current_time()
            response = await client.prompt(sid, "permission")
            waited = trio.current_time() - start
    assert response["result"] == {"stopReason": "end_turn"}
    assert "a:outcome:no" in client.updates(sid)
    assert 30 <= waited < 31
    assert [s.source if s else None for s in seen] == [None, "timeout"]
    assert bridge.hub.audit.recent[-1].decision == "deny"


async def test_a_request_of_a_dropped_client_is_answered_from_the_console():
    """Parked for a reattach, it is still the console's to answer (first answer wins)."""
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_bridge({"a": agent}) as (first, bridge), trio.open_nursery() as nursery:
            sid = await first.new_session("a")
            nursery.start_soon(first.prompt, sid, "permission")
            await first.agent_requests.receive()
            await first.disconnect()
            while bridge.hub.sessions.get(sid).client is not None:  # type: ignore[union-attr]
                await trio.testing.wait_all_tasks_blocked()
            (entry,) = bridge.approvals.desk.waiting()
            status = await bridge.approvals.console_answer(entry.extra.console_id, "yes")
            again = await bridge.approvals.console_answer(entry.extra.console_id, "no")
            second = await connect(bridge, nursery)
            await second.call("session/resume", {"sessionId": sid, "cwd": "/w"})
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert (status, again) == ("settled", "unknown")
    assert not [m for m in second.received if is_permission(m)]  # not shown again
    answers = [m for m in agent.received if m.get("id") == 100 and "result" in m]
    assert answers[0]["result"]["outcome"] == {"outcome": "selected", "optionId": "yes"}


async def test_a_console_answer_must_name_an_offered_option():
    agent = FakeAgent("a")
    policy = Policy(unattended="console")
    with trio.fail_after(TIMEOUT):
        async with (
            open_bridge({"a": agent}, policy=policy) as (client, bridge),
            trio.open_nursery() as nursery,
        ):
            sid = await client.new_session(_meta={"acp_bridge": {"agent": "a", "unattended": True}})
            nursery.start_soon(client.prompt, sid, "permission")
            while not bridge.approvals.desk.waiting():
                await trio.testing.wait_all_tasks_blocked()
            (entry,) = bridge.approvals.desk.waiting()
            bad = await bridge.approvals.console_answer(entry.extra.console_id, "invented")
            await client.notify("session/cancel", {"sessionId": sid})
            await client.wait_for(lambda m: m.get("result") == {"stopReason": "cancelled"})
    assert bad == "bad_option"
    assert bridge.approvals.desk.waiting() == []  # session/cancel settled the console's request
    assert bridge.hub.audit.recent[-1].source == "cancel"


def test_serve_prints_the_console_login_link_with_its_token_only_to_a_terminal():
    info = ListenInfo(
        host="127.0.0.1",
        port=8765,
        url="ws://127.0.0.1:8765/acp",
        token_path=None,
        console_login="http://127.0.0.1:8765/console?token=SECRET-TOKEN",
    )
    summary = startup_summary(info, agent="demo", agent_state="ready", show_token=True)
    assert summary.splitlines()[0] == "acp-bridge serve: listening on ws://127.0.0.1:8765/acp"
    assert "  http:    http://127.0.0.1:8765/acp (ACP over HTTP" in summary
    assert "  console: http://127.0.0.1:8765/console?token=SECRET-TOKEN" in summary
    assert "SECRET-TOKEN" not in repr(info)
    for told in (
        startup_summary(info, agent="demo", agent_state="ready"),
        startup_summary(info, agent="demo", agent_state="ready", show_token=False),
    ):
        assert "SECRET-TOKEN" not in told
        assert "  console: http://127.0.0.1:8765/console (approvals; log in with" in told
        assert "websocket.token in the config" in told
    in_file = attrs.evolve(info, token_path="/state/token")
    told = startup_summary(in_file, agent="demo", agent_state="ready")
    assert "SECRET-TOKEN" not in told
    assert "/console?token=TOKEN, the token in /state/token)" in told


async def test_the_session_tree_follows_sessions_without_waiting_for_the_refresh(monkeypatch):
    """A session that starts, gets a watcher, loses its owner: each is a new snapshot on the
    main page's channel without an approval changing, well before the periodic refresh."""
    monkeypatch.setattr(console, "REFRESH", 3600.0)  # (only the tree's own look can tell)
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": FakeAgent("a")}) as server:
            port = server.port
            events = await Events.open(port, await login(port))
            async with events.stream:
                assert tree_sessions(await events.next()) == []
                async with open_peer(port) as owner, open_peer(port) as watcher:
                    reply = await owner.request("session/new", NEW_SESSION)
                    sid = reply["result"]["sessionId"]
                    shown = tree_sessions(await events.until(tree_sessions))
                    assert [(s["id"], s["watchers"]) for s in shown] == [(sid, 0)]
                    watch = {"acp_bridge": {"watch": True}}
                    load = {**NEW_SESSION, "sessionId": sid, "_meta": watch}
                    assert "result" in await watcher.request("session/load", load)
                    await events.until(lambda snap: tree_sessions(snap)[0]["watchers"] == 1)
                gone = await events.until(lambda snap: tree_sessions(snap)[0]["connection"] is None)
                assert tree_sessions(gone)[0]["watchers"] == 0


def tree_sessions(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for agent in snapshot["tree"]["agents"] for s in agent["sessions"]]
