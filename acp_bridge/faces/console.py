"""
The approval console's trio side: the page, its live channel and its answers.

``faces.ws.py`` hands every request for ``/console`` (and below) here, after ``Host`` was checked;
:func:`~acp_bridge.faces.console_core.judge_console` decides the rest (login, cookie, ``Origin``,
CSRF: see ``faces.console_core.py``). What is served:

- ``GET /console``: the page (``acp_bridge/faces/static/index.html``, with its CSRF value), and
  ``/console/app.js``, ``/console/app.css`` (package files, no build step);
- ``GET /console/events``: server-sent events, one ``snapshot`` of every pending request,
  the recent settlements and the latest audit decisions, sent again at each change (bursts
  coalesce) and at least every :data:`REFRESH` seconds (the countdowns, the audit list; a
  peer gone is noticed there). At most :data:`MAX_LIVE` at once (then **503**); a write the
  peer does not take within ``ping_timeout`` ends the stream;
- ``POST /console/answer``: ``{"id", "optionId"}`` (at most ``ANSWER_MAX_BYTES``, with a
  ``Content-Length``), settled through :meth:`Approvals.console_answer`: **200** settled,
  **409** already settled (and by whom) or asked again, **404** unknown, **400** bad input.

Every response but the live stream closes its connection, as the WebSocket face's refusals do.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.resources
import json
import math
import os
import time
from typing import TYPE_CHECKING, Any, Final

import structlog
import trio

from acp_bridge.faces.console_core import (
    ANSWER_MAX_BYTES,
    SECURITY_HEADERS,
    Answer,
    Asset,
    ConsoleKeys,
    Live,
    Login,
    Page,
    decision_view,
    judge_console,
    parse_answer,
    pending_view,
    render_page,
)
from acp_bridge.faces.handshake import Refuse, render_response

if TYPE_CHECKING:
    from acp_bridge.engine.approvals import Approvals, Settlement
    from acp_bridge.engine.audit import AuditLog
    from acp_bridge.faces.handshake import HandshakePolicy, RequestHead
    from acp_bridge.sessions.table import Forwarded

__all__ = ["MAX_LIVE", "REFRESH", "Console", "LiveStream"]

logger = structlog.get_logger("acp_bridge.console")

#: Live channels (open pages) at once; one more is answered 503.
MAX_LIVE: Final = 32
#: Seconds between snapshots when nothing changes.
REFRESH: Final = 5.0
#: Settlements remembered to tell a page (and a late click) who settled a request.
SETTLED_REMEMBERED: Final = 256
#: Settlements and audit decisions sent with each snapshot.
SHOWN_SETTLED: Final = 50
SHOWN_DECISIONS: Final = 20

_CONTENT_TYPES: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}


def _asset(name: str) -> str:
    return (importlib.resources.files("acp_bridge.faces") / "static" / name).read_text("utf-8")


class LiveStream:
    """A live channel accepted by :meth:`Console.respond`: run it after the handshake."""

    def __init__(self, console: Console, stream: trio.abc.Stream) -> None:
        self._console = console
        self._stream = stream

    async def run(self) -> None:
        await self._console.stream_events(self._stream)


class Console:
    """
    The console of one listener.

    Args:
        approvals: the bridge's approvals (listed, watched, answered).
        audit: the audit log (its latest decisions are shown).
        policy: the listener's handshake policy (token, origins).
        tls: the listener speaks TLS (the cookie is then ``Secure``).
        send_timeout: seconds a live page may take to take a write (``ping_timeout``).
    """

    def __init__(
        self,
        approvals: Approvals,
        audit: AuditLog,
        policy: HandshakePolicy,
        *,
        tls: bool,
        send_timeout: float,
    ) -> None:
        self._approvals = approvals
        self._audit = audit
        self._policy = policy
        self.keys = ConsoleKeys.build(policy.token, port=policy.port, tls=tls)
        self._send_timeout = send_timeout
        self._changed = trio.Event()
        #: console id → how it ended, newest last
        self._settled: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self.live = 0
        self._page = _asset("index.html")
        self._assets = {name: _asset(name).encode() for name in _CONTENT_TYPES}
        approvals.desk.changed.subscribe(self._on_change)

    def _on_change(self, entry: Forwarded, settlement: Settlement | None) -> None:
        if settlement is not None:
            ask = entry.extra
            names = {o.option_id: o.name for o in ask.request.options}
            self._settled[ask.console_id] = {
                "id": ask.console_id,
                "by": settlement.source,
                "connection": settlement.connection,
                "decision": settlement.decision,
                "option": names.get(settlement.option_id or "", settlement.option_id),
                "time": time.time(),
            }
            while len(self._settled) > SETTLED_REMEMBERED:
                self._settled.popitem(last=False)
        self._changed.set()
        self._changed = trio.Event()

    # ------------------------------------------------------------------ what is shown

    def snapshot(self) -> dict[str, Any]:
        """Every pending request, the recent settlements and the latest audit decisions."""
        now = trio.current_time()
        pending = []
        for entry in self._approvals.desk.waiting():
            ask = entry.extra
            session = entry.session
            assert session is not None
            shown = ask.shown[0].name if ask.shown is not None else None
            pending.append(
                pending_view(
                    request_id=ask.console_id,
                    agent=entry.origin.name,
                    session_id=session.bridge_id,
                    cwd=session.roots[0] if session.roots else None,
                    title=session.title,
                    params=entry.context,
                    time_left=ask.deadline - now,
                    asked_at=ask.asked_at,
                    shown_to="console only" if ask.console_only else shown,
                    note=ask.note,
                )
            )
        recent = list(self._audit.recent)[-SHOWN_DECISIONS:]
        return {
            "type": "snapshot",
            "pending": pending,
            "settled": list(self._settled.values())[-SHOWN_SETTLED:],
            "decisions": [decision_view(r) for r in reversed(recent)],
        }

    # ------------------------------------------------------------------ requests

    async def respond(
        self, stream: trio.abc.Stream, head: RequestHead, received: bytes
    ) -> Refuse | bytes | LiveStream:
        """
        Answer one console request: a refusal (the face writes and logs it), a whole
        response to write, or a live channel to run once the handshake is over.
        """
        verdict = judge_console(head, self._policy, self.keys, now=time.time())
        if isinstance(verdict, Refuse):
            return verdict
        if isinstance(verdict, Login):
            cookie = self.keys.mint_session(now=time.time(), nonce=os.urandom(18))
            headers = [("Location", "/console"), ("Set-Cookie", self.keys.set_cookie(cookie))]
            return _response(303, b"", "text/plain; charset=utf-8", headers)
        if isinstance(verdict, Page):
            csrf = self.keys.mint_csrf(verdict.session, nonce=os.urandom(18))
            body = render_page(self._page, csrf)
            return _response(200, body, "text/html; charset=utf-8")
        if isinstance(verdict, Asset):
            return _response(200, self._assets[verdict.name], _CONTENT_TYPES[verdict.name])
        if isinstance(verdict, Live):
            if self.live >= MAX_LIVE:
                return Refuse(503, "too many console pages open", (("Retry-After", "5"),))
            return LiveStream(self, stream)
        assert isinstance(verdict, Answer)
        return await self._answer(stream, head, received)

    async def _answer(
        self, stream: trio.abc.Stream, head: RequestHead, received: bytes
    ) -> Refuse | bytes:
        body = await _read_body(stream, head, received)
        if isinstance(body, Refuse):
            return body
        parsed = parse_answer(body)
        if parsed is None:
            return _json(400, {"status": "bad_request"})
        request_id, option_id = parsed
        status = await self._approvals.console_answer(request_id, option_id)
        logger.info("console_answer", request=request_id, option=option_id, status=status)
        if status == "settled":
            return _json(200, {"status": "settled"})
        if status == "asked_again":
            return _json(409, {"status": "asked_again"})
        if status == "bad_option":
            return _json(400, {"status": "bad_option"})
        settled = self._settled.get(request_id)
        if settled is not None:
            return _json(409, {"status": "already_settled", **settled})
        return _json(404, {"status": "unknown"})

    async def stream_events(self, stream: trio.abc.Stream) -> None:
        """Serve one live channel until the peer goes or stops reading."""
        self.live += 1
        try:
            head = render_response(
                200, b"", content_type="text/event-stream", headers=SECURITY_HEADERS
            )
            # A stream: no Content-Length (the body ends when the connection does).
            head = head.replace(b"Content-Length: 0\r\n", b"")
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._write(stream, head + b"retry: 1000\n\n")
                while True:
                    changed = self._changed
                    data = json.dumps(self.snapshot(), separators=(",", ":"))
                    if not await self._write(stream, f"data: {data}\n\n".encode()):
                        return
                    with trio.move_on_after(REFRESH):
                        await changed.wait()
        finally:
            self.live -= 1

    async def _write(self, stream: trio.abc.Stream, data: bytes) -> bool:
        """Write ``data``; False (the stream is dropped) when the peer takes nothing in time."""
        with trio.move_on_after(self._send_timeout if self._send_timeout > 0 else math.inf):
            await stream.send_all(data)
            return True
        logger.info("console_live_stalled")
        return False


def _response(
    status: int, body: bytes, content_type: str, headers: list[tuple[str, str]] | None = None
) -> bytes:
    return render_response(
        status, body, content_type=content_type, headers=[*SECURITY_HEADERS, *(headers or [])]
    )


def _json(status: int, data: dict[str, Any]) -> bytes:
    return _response(status, json.dumps(data).encode(), "application/json")


async def _read_body(stream: trio.abc.Stream, head: RequestHead, received: bytes) -> bytes | Refuse:
    """
    The request's body: exactly ``Content-Length`` bytes, at most ``ANSWER_MAX_BYTES``
    (what came with the head first). Bounded in time by the handshake's deadline.
    """
    if head.values("transfer-encoding"):
        return Refuse(411, "length required")
    lengths = head.values("content-length")
    if len(lengths) != 1 or not lengths[0].strip().isdigit():
        return Refuse(411, "length required")
    length = int(lengths[0])
    if length > ANSWER_MAX_BYTES:
        return Refuse(413, "answer too large")
    end = received.find(b"\r\n\r\n")
    body = bytearray(received[end + 4 :] if end >= 0 else b"")
    while len(body) < length:
        chunk = await stream.receive_some(length - len(body))
        if not chunk:
            return Refuse(400, "incomplete body")
        body += chunk
    return bytes(body[:length])
