"""
The approval console's trio side: the page, its live channel and its answers.

The listener (``faces.ws.py``, through ``http.server``) hands each request for ``/console`` (and
below) to one of the handlers here once it passed the console's checks (``Host``, method,
``Origin``, login or cookie, CSRF: see ``faces.console_core.py``). What is served:

- ``GET /console``: the page (``acp_bridge/faces/static/index.html``, with its CSRF value), and
  ``/console/app.js``, ``/console/app.css`` (package files, no build step);
- ``GET /console/events``: server-sent events, one ``snapshot`` of every pending request,
  the recent settlements, the latest audit decisions and the session tree (agents, their
  sessions, sub-agents under their parents), sent again at each approval change (bursts
  coalesce), when the tree changed (looked at every :data:`TREE_POLL` seconds) and at
  least every :data:`REFRESH` seconds (the countdowns, the audit list; a peer gone is
  noticed there). At most :data:`MAX_LIVE` at once (then **503**); a write the
  peer does not take within ``ping_timeout`` ends the stream;
- ``GET /console/session?id=ID``: a session's page (its conversation and approvals, live through
  ``/console/session/events``);
- ``GET /console/sequence?id=ID``: the sequence view of a session's messages (see
  :meth:`Console.sequence_body`), drawn when asked (the page reloads itself on demand);
- ``POST /console/answer``: ``{"id", "optionId"}`` (at most ``ANSWER_MAX_BYTES``, with a
  ``Content-Length`` or chunked: 411 without either), settled through
  :meth:`Approvals.console_answer`: **200** settled, **409** already settled (and by whom) or
  asked again, **404** unknown, **400** bad input.

Every response closes its connection, as the listener's refusals do.
"""

from __future__ import annotations

import collections
import functools
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
    ASSETS,
    SECURITY_HEADERS,
    ConsoleKeys,
    Login,
    decision_view,
    parse_answer,
    pending_view,
    render_page,
    sequence_source,
    session_param,
    session_tree,
    session_view,
)
from acp_bridge.http.wire import Response, json_response, plain
from acp_bridge.observe.sequence import build_sequence, history_records, read_records
from acp_bridge.observe.sequence_html import render_view, sequence_css, sequence_js

if TYPE_CHECKING:
    from acp_bridge.engine.approvals import Settlement
    from acp_bridge.engine.bridge import Bridge
    from acp_bridge.faces.listener_core import ListenerPolicy
    from acp_bridge.http.server import Exchange, Handler
    from acp_bridge.sessions.table import Forwarded

__all__ = ["MAX_LIVE", "REFRESH", "SESSION_POLL", "TREE_POLL", "Console"]

logger = structlog.get_logger("acp_bridge.console")

#: Live channels (open pages) at once; one more is answered 503.
MAX_LIVE: Final = 32
#: Seconds between snapshots when nothing changes.
REFRESH: Final = 5.0
#: Seconds between two looks at a followed session's history (a session page's channel).
SESSION_POLL: Final = 0.25
#: Seconds between two looks at the session tree (the main page's channel): sessions,
#: owners, watchers, states change without an approval changing.
TREE_POLL: Final = 1.0
#: Settlements remembered to tell a page (and a late click) who settled a request.
PAGE_SETTLED_REMEMBERED: Final = 256
#: Settlements and audit decisions sent with each snapshot.
SHOWN_SETTLED: Final = 50
SHOWN_DECISIONS: Final = 20
#: Entries of a session's history a sequence view draws (without a trace), the latest.
SEQUENCE_HISTORY: Final = 2000

_CONTENT_TYPES: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "sequence.js": "text/javascript; charset=utf-8",
    "sequence.css": "text/css; charset=utf-8",
}


def _asset(name: str) -> str:
    return (importlib.resources.files("acp_bridge.faces") / "static" / name).read_text("utf-8")


class Console:
    """
    The console of one listener.

    Args:
        bridge: the bridge: its approvals (listed, watched, answered), its audit log (the
            latest decisions), its session tree, a session's history (the session page),
            its trace's recent records (the sequence view).
        policy: the listener's policy (token, port).
        tls: the listener speaks TLS (the cookie is then ``Secure``).
        send_timeout: seconds a live page may take to take a write (``ping_timeout``).
    """

    def __init__(
        self,
        bridge: Bridge,
        policy: ListenerPolicy,
        *,
        tls: bool,
        send_timeout: float,
    ) -> None:
        self._bridge = bridge
        self._approvals = approvals = bridge.approvals
        self.keys = ConsoleKeys.build(policy.token, port=policy.port, tls=tls)
        self._send_timeout = send_timeout
        self._changed = trio.Event()
        #: console id → how it ended, newest last
        self._settled: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self.live = 0
        self._page_template = _asset("index.html")
        self._session_template = _asset("session.html")
        self._sequence_template = _asset("sequence.html")
        self._assets = {name: _asset(name).encode() for name in ("app.js", "app.css")}
        self._assets["sequence.js"] = sequence_js().encode()
        self._assets["sequence.css"] = sequence_css().encode()
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
            while len(self._settled) > PAGE_SETTLED_REMEMBERED:
                self._settled.popitem(last=False)
        self._changed.set()
        self._changed = trio.Event()

    # ------------------------------------------------------------------ what is shown

    def tree(self) -> dict[str, Any]:
        """The session tree as the page shows it (at most ``MAX_TREE_SESSIONS`` sessions)."""
        tree = self._bridge.tree()
        return session_tree(list(tree["agents"]), list(tree["sessions"]))

    def snapshot(self) -> dict[str, Any]:
        """Every pending request, the recent settlements, the latest audit decisions and the
        session tree."""
        return {"type": "snapshot", **self._approvals_view(None), "tree": self.tree()}

    def _approvals_view(self, session_id: str | None) -> dict[str, Any]:
        """The pending requests, the recent settlements and the latest audit decisions (the
        requests and decisions of one session only, when ``session_id`` is given)."""
        now = trio.current_time()
        pending = []
        for entry in self._approvals.desk.waiting():
            ask = entry.extra
            session = entry.session
            assert session is not None
            if session_id is not None and session.bridge_id != session_id:
                continue  # (a view costs a diff: only the ones shown are made)
            shown = ", ".join(client.name for client in ask.shown) or None
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
        recent = list(self._bridge.hub.audit.recent)[-SHOWN_DECISIONS:]
        decisions = [decision_view(r) for r in reversed(recent)]
        return {
            "pending": pending,
            "settled": list(self._settled.values())[-SHOWN_SETTLED:],
            "decisions": [d for d in decisions if session_id in (None, d["session"])],
        }

    # ------------------------------------------------------------------ requests

    def handlers(self) -> dict[str, Handler]:
        """The console's handlers, by the names ``faces.console_core.console_routes`` uses."""
        return {
            "console.page": self._page,
            "console.asset": self._asset,
            "console.events": self._events,
            "console.answer": self._answer,
            "console.session": self._session_page,
            "console.session_events": self._session_events,
            "console.sequence": self._sequence_page,
        }

    async def _page(self, exchange: Exchange) -> Response:
        if isinstance(exchange.principal, Login):
            cookie = self.keys.mint_session(now=time.time(), nonce=os.urandom(18))
            headers = [("Location", "/console"), ("Set-Cookie", self.keys.set_cookie(cookie))]
            return _response(303, b"", "text/plain; charset=utf-8", headers)
        assert isinstance(exchange.principal, str)  # (the session's nonce)
        csrf = self.keys.mint_csrf(exchange.principal, nonce=os.urandom(18))
        return _response(200, render_page(self._page_template, csrf), "text/html; charset=utf-8")

    async def _session_page(self, exchange: Exchange) -> Response:
        assert isinstance(exchange.principal, str)  # (the session's nonce)
        session = session_param(exchange.head.query)
        if session is None:
            return plain(400, "bad request: /console/session?id=SESSION", SECURITY_HEADERS)
        csrf = self.keys.mint_csrf(exchange.principal, nonce=os.urandom(18))
        page = render_page(self._session_template, csrf, session)
        return _response(200, page, "text/html; charset=utf-8")

    def session_snapshot(self, session_id: str) -> dict[str, Any] | None:
        """One session's page: its history shaped, its pending requests, the settlements;
        None when the session is gone."""
        log = self._bridge.session_log(session_id, True)
        if log is None:
            return None
        entries, complete, _ = log
        return {
            "type": "snapshot",
            "session": session_id,
            **session_view(entries, complete=complete),
            **self._approvals_view(session_id),
        }

    async def _sequence_page(self, exchange: Exchange) -> Response:
        session = session_param(exchange.head.query)
        if session is None:
            return plain(400, "bad request: /console/sequence?id=SESSION", SECURITY_HEADERS)
        body = await self.sequence_body(session)
        if body is None:
            return plain(404, f"no session {session!r} here", SECURITY_HEADERS)
        source, view = body
        page = render_page(self._sequence_template, "", session, source=source, view=view)
        return _response(200, page, "text/html; charset=utf-8")

    async def sequence_body(self, session: str) -> tuple[str, str] | None:
        """
        The sequence view of a session (what its page says of the source, the view's HTML):
        from the trace's recent records when the bridge traces (``--trace``: every message
        both ways, with times; at most ``RECENT_RECORDS`` of all sessions'), else from the
        session's history (what the bridge relayed to its clients, the latest
        :data:`SEQUENCE_HISTORY` entries). None: not traced, and no such session.

        Drawn in a worker thread: parsing and drawing thousands of messages takes a while.
        """
        trace = self._bridge.trace
        if trace is not None:
            lines = trace.recent()
            source = sequence_source(traced=True, kept=len(lines), cut=False)
            draw = functools.partial(_draw_trace, lines, session)
        else:
            log = self._bridge.session_log(session, True)
            if log is None:
                return None
            entries, complete, _ = log
            cut = not complete or len(entries) > SEQUENCE_HISTORY
            entries = entries[-SEQUENCE_HISTORY:]
            source = sequence_source(traced=False, kept=len(entries), cut=cut)
            draw = functools.partial(_draw_history, entries, session)
        return source, await trio.to_thread.run_sync(draw)

    async def _asset(self, exchange: Exchange) -> Response:
        name = ASSETS[exchange.head.path]
        return _response(200, self._assets[name], _CONTENT_TYPES[name])

    async def _answer(self, exchange: Exchange) -> Response:
        body = await exchange.body(ANSWER_MAX_BYTES, length_required=True)
        if isinstance(body, Response):
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

    async def _events(self, exchange: Exchange) -> Response | None:
        """One live channel, until the peer goes or stops reading (a write it does not take
        within ``send_timeout`` ends it)."""
        return await self._stream(exchange, None)

    async def _session_events(self, exchange: Exchange) -> Response | None:
        """One session page's live channel (counted in MAX_LIVE with the others): sent again
        at each approval change and when the session's history grew (looked at every
        SESSION_POLL seconds); ends (the page says so) when the session is gone."""
        session = session_param(exchange.head.query)
        if session is None:
            return plain(400, "bad request: ?id=SESSION", SECURITY_HEADERS)
        return await self._stream(exchange, session)

    async def _stream(self, exchange: Exchange, session: str | None) -> Response | None:
        if self.live >= MAX_LIVE:
            return plain(503, "too many console pages open", (("Retry-After", "5"),))
        self.live += 1
        try:
            head = Response(200, b"retry: 1000\n\n", SECURITY_HEADERS, "text/event-stream")
            timeout = self._send_timeout if self._send_timeout > 0 else math.inf
            events = await exchange.stream(head, send_timeout=timeout)
            while events is not None:
                changed = self._changed
                if session is None:
                    snapshot = self.snapshot()
                else:
                    snapshot = self.session_snapshot(session) or {
                        "type": "gone",
                        "session": session,
                    }
                data = json.dumps(snapshot, separators=(",", ":"))
                if not await events.send(f"data: {data}\n\n".encode()):
                    if events.stalled:
                        logger.info("console_live_stalled")
                    return None
                if snapshot["type"] == "gone":
                    return None
                with trio.move_on_after(REFRESH):
                    if session is None:
                        await self._tree_changed(snapshot["tree"], changed)
                    else:
                        await self._session_changed(session, changed)
        finally:
            self.live -= 1
        return None

    async def _tree_changed(self, shown: dict[str, Any], changed: trio.Event) -> None:
        """Until an approval changed, or the session tree is not the one ``shown``."""
        while not changed.is_set():
            with trio.move_on_after(TREE_POLL):
                await changed.wait()
            if self.tree() != shown:
                return

    async def _session_changed(self, session: str, changed: trio.Event) -> None:
        """Until an approval changed, the session's history grew, or the session is gone."""
        log = self._bridge.session_log(session, False)
        seen = log[2] if log is not None else -1
        while not changed.is_set():
            with trio.move_on_after(SESSION_POLL):
                await changed.wait()
            log = self._bridge.session_log(session, False)
            if (log[2] if log is not None else -1) != seen:
                return


def _draw_trace(lines: list[bytes], session: str) -> str:
    records = read_records(line.decode("utf-8", "replace") for line in lines)
    return render_view(build_sequence(records, session=session, limit=None))


def _draw_history(entries: list[tuple[int, bytes]], session: str) -> str:
    view = build_sequence(history_records(entries), session=session, limit=None)
    return render_view(view, times=False)


def _response(
    status: int, body: bytes, content_type: str, headers: list[tuple[str, str]] | None = None
) -> Response:
    return Response(status, body, (*SECURITY_HEADERS, *(headers or [])), content_type)


def _json(status: int, data: dict[str, Any]) -> Response:
    return json_response(status, data, SECURITY_HEADERS)
