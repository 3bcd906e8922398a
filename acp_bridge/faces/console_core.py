"""
The approval console's decisions, pure: who may see and answer, and what a request looks like.

The console (``GET /console`` on ``serve``'s listener; the trio side is ``faces.console``)
has the listener's security (``Host`` checked for every path by ``http.wire``; loopback by
default), plus what a browser needs (:func:`console_routes`):

- **Login**: ``GET /console?token=TOKEN`` (the daemon's token, compared in constant time) sets
  a session cookie and redirects (303) to ``/console``, so the token leaves the address bar and
  the history. The cookie is ``HttpOnly; SameSite=Strict; Path=/console`` (``Secure`` under
  TLS), named after the port (cookies ignore ports: two daemons on one host must not overwrite
  each other's), valid :data:`SESSION_TTL` seconds. It is stateless: an expiry and a nonce,
  MACed with a key derived from the token (a new token ends every session).
- Without a valid cookie (or the token): **401**, with no session data.
- ``Origin``: when present it must be the console's own origin or an ``allowed_origins`` entry,
  on the page, its live channel and every answer (**403**); an answer must carry one (browsers
  always send it on a POST).
- **CSRF**: each page gets its own value (a nonce MACed with the session's nonce), which every
  answer must carry in the ``X-Console-CSRF`` header (**403**). A custom header also means a
  cross-origin page cannot send it without a CORS preflight, which the console never grants.
- A **Content-Security-Policy** with no inline script (:data:`CSP`), and the headers that keep
  the page out of frames and its address out of referrers.

Then :func:`pending_view`, :func:`decision_view` and :func:`session_tree` shape what the page
shows (bounded: :data:`MAX_DIFF_LINES`, :data:`MAX_TEXT`, :data:`MAX_TREE_SESSIONS`).

Pure: no trio, no socket, no clock (the caller passes ``now`` and random bytes).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import hmac
import html
import http.cookies
import json
import re
import urllib.parse
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs

from acp_bridge.http.wire import OriginRule, RequestHead, Response, Route, plain

if TYPE_CHECKING:
    from collections.abc import Mapping

    from acp_bridge.store.db import AuditRecord

H = TypeVar("H")

__all__ = [
    "ANSWER_MAX_BYTES",
    "CSP",
    "MAX_DIFF_LINES",
    "MAX_TREE_SESSIONS",
    "SECURITY_HEADERS",
    "SESSION_TTL",
    "ConsoleKeys",
    "ConsoleSession",
    "Login",
    "console_routes",
    "decision_view",
    "diff_lines",
    "parse_answer",
    "pending_view",
    "render_page",
    "session_tree",
    "session_view",
]

#: Seconds a console session (its cookie) lasts; then the login link is needed again.
SESSION_TTL: Final = 12 * 3600
#: Lines of one diff shown; the rest is cut (the view says so).
MAX_DIFF_LINES: Final = 400
#: Characters of one side of a diff (or a command) considered; longer texts are cut first
#: (difflib's cost grows with the square of the lines in the worst case).
MAX_TEXT: Final = 64 * 1024
#: Sessions the session tree lists at most (the rest are counted, not listed).
MAX_TREE_SESSIONS: Final = 200
#: Items (messages, tool calls, plans) a session page shows at most: the latest ones.
MAX_SESSION_ITEMS: Final = 300
#: The largest answer body read (an id and an option id).
ANSWER_MAX_BYTES: Final = 4096
#: Paths of the console, and the file each asset is.
ROOT: Final = "/console"
ASSETS: Final = {
    "/console/app.js": "app.js",
    "/console/app.css": "app.css",
    "/console/sequence.js": "sequence.js",
    "/console/sequence.css": "sequence.css",
}
#: The longest session id a session page accepts.
MAX_SESSION_ID: Final = 1024
EVENTS: Final = "/console/events"
SESSION: Final = "/console/session"
SESSION_EVENTS: Final = "/console/session/events"
SEQUENCE: Final = "/console/sequence"
ANSWER: Final = "/console/answer"
CSRF_HEADER: Final = "x-console-csrf"

#: No inline script or style, nothing from elsewhere, no frames, no forms.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
)

_UNAUTHORIZED: Final = plain(
    401,
    "unauthorized: open the console with the login link `acp-bridge serve` printed",
    SECURITY_HEADERS,
)
_BAD_CSRF: Final = plain(403, "forbidden: missing or wrong CSRF value", SECURITY_HEADERS)


@attrs.frozen
class ConsoleKeys:
    """
    The console's secrets and names, derived from the daemon's token.

    Attributes:
        key: the MAC key of cookies and CSRF values.
        cookie_name: the session cookie's name (per port).
        secure: mark the cookie ``Secure`` (TLS).
        scheme: ``http`` or ``https``, for the console's own origin.
    """

    key: bytes = attrs.field(repr=False)
    cookie_name: str
    secure: bool
    scheme: str

    @classmethod
    def build(cls, token: bytes, *, port: int, tls: bool) -> ConsoleKeys:
        key = hmac.new(token, b"acp-bridge console session v1", hashlib.sha256).digest()
        return cls(key, f"acp_console_{port}", tls, "https" if tls else "http")

    def _mac(self, text: str) -> str:
        digest = hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def mint_session(self, *, now: float, nonce: bytes) -> str:
        """A new session cookie's value: ``EXPIRY.NONCE.MAC``."""
        body = f"{int(now) + SESSION_TTL}.{base64.urlsafe_b64encode(nonce).decode().rstrip('=')}"
        return f"{body}.{self._mac('session.' + body)}"

    def check_session(self, value: str | None, *, now: float) -> str | None:
        """The session's nonce when ``value`` is a valid, unexpired cookie; else None."""
        if value is None:
            return None
        expiry, _, rest = value.partition(".")
        nonce, _, mac = rest.partition(".")
        if not (expiry.isascii() and expiry.isdigit() and nonce and mac):
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(f"session.{expiry}.{nonce}").encode()):
            return None
        return nonce if now < int(expiry) else None

    def set_cookie(self, value: str) -> str:
        """The ``Set-Cookie`` header's value for a session cookie."""
        secure = "; Secure" if self.secure else ""
        return (
            f"{self.cookie_name}={value}; Path={ROOT}; Max-Age={SESSION_TTL}; HttpOnly; "
            f"SameSite=Strict{secure}"
        )

    def mint_csrf(self, session: str, *, nonce: bytes) -> str:
        """A page's CSRF value, bound to its session."""
        page = base64.urlsafe_b64encode(nonce).decode().rstrip("=")
        return f"{page}.{self._mac(f'csrf.{session}.{page}')}"

    def check_csrf(self, session: str, value: str | None) -> bool:
        if not value:
            return False
        page, _, mac = value.partition(".")
        expected = self._mac(f"csrf.{session}.{page}")
        return bool(page) and hmac.compare_digest(mac.encode(), expected.encode())


@attrs.frozen
class Login:
    """The token was right: set a session cookie and redirect to the console."""


@attrs.frozen
class ConsoleSession:
    """
    The console's credential: the session cookie (the principal is its nonce), or on the
    page, the login token (the principal is :class:`Login`); with ``csrf``, the page's CSRF
    value too (an answer).
    """

    keys: ConsoleKeys
    token: bytes = attrs.field(repr=False)
    login: bool = False
    csrf: bool = False

    def authenticate(self, head: RequestHead, *, now: float) -> Response | Login | str:
        if self.login and head.query:
            tokens = urllib.parse.parse_qs(head.query, keep_blank_values=True).get("token", [])
            if len(tokens) == 1 and hmac.compare_digest(
                tokens[0].encode("utf-8", "surrogateescape"), self.token
            ):
                return Login()
            return _UNAUTHORIZED
        session = self.keys.check_session(_cookie(head, self.keys.cookie_name), now=now)
        if session is None:
            return _UNAUTHORIZED
        if self.csrf:
            csrf = head.values(CSRF_HEADER)
            if len(csrf) != 1 or not self.keys.check_csrf(session, csrf[0]):
                return _BAD_CSRF
        return session


#: The paths a GET with the session cookie reads, and their handlers' names.
_COOKIE_PAGES: Final = (
    (EVENTS, "console.events"),
    (SESSION, "console.session"),
    (SESSION_EVENTS, "console.session_events"),
    (SEQUENCE, "console.sequence"),
)


def console_routes(
    keys: ConsoleKeys, *, token: bytes, origins: frozenset[str], handlers: Mapping[str, H]
) -> dict[str, Route[H]]:
    """
    The console's paths, with the handlers ``console.page``, ``console.answer``,
    ``console.asset`` and those of :data:`_COOKIE_PAGES` of ``handlers``. Each checks, in
    order: method (405), ``Origin`` (403: the console's own or one of ``origins``, required
    on the POST), then the login or the cookie (401) and an answer's CSRF value (403); the
    static assets need no session.
    """
    origin = OriginRule(
        origins,
        plain(403, "forbidden: Origin not allowed", SECURITY_HEADERS),
        own_scheme=keys.scheme,
        required_for=frozenset({"POST"}),
    )
    routes: dict[str, Route[H]] = {
        ROOT: Route(
            {"GET": handlers["console.page"]},
            origin=origin,
            credential=ConsoleSession(keys, token, login=True),
        ),
        ANSWER: Route(
            {"POST": handlers["console.answer"]},
            origin=origin,
            credential=ConsoleSession(keys, token, csrf=True),
        ),
    }
    cookie = ConsoleSession(keys, token)
    for path, name in _COOKIE_PAGES:
        routes[path] = Route({"GET": handlers[name]}, origin=origin, credential=cookie)
    for path in ASSETS:
        routes[path] = Route({"GET": handlers["console.asset"]}, origin=origin)
    return routes


def _cookie(head: RequestHead, name: str) -> str | None:
    found = None
    for value in head.values("cookie"):
        jar = http.cookies.SimpleCookie()
        try:
            jar.load(value)
        except http.cookies.CookieError:
            continue
        if name in jar:
            found = jar[name].value
    return found


def render_page(template: str, csrf: str, session: str = "", **parts: str) -> bytes:
    """
    The page with its CSRF value (and the session a session page follows, escaped) in
    ``<meta>`` tags (read by the script: no inline code). ``{{session_q}}`` is the session
    for a query string; ``parts`` are HTML, already escaped, for ``{{NAME}}``. One pass: what
    is put in is never taken for a placeholder.
    """
    values = {
        "csrf": csrf,
        "session": html.escape(session, quote=True),
        "session_q": html.escape(urllib.parse.quote(session, safe=""), quote=True),
        **parts,
    }
    return _PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), template).encode()


_PLACEHOLDER: Final = re.compile(r"\{\{([a-z_]+)\}\}")


def sequence_source(*, traced: bool, kept: int, cut: bool) -> str:
    """What a sequence view's page says of where its messages come from (HTML)."""
    if traced:
        return html.escape(
            f"From the wire trace: every message both ways, with times, among the latest "
            f"{kept:,} the bridge traced (of all sessions; the trace file has them all)."
        )
    older = " Older entries are left out." if cut else ""
    return html.escape(
        f"From the session's history ({kept:,} entries): what the bridge sends its clients "
        "(the agent's updates, the user's prompts), as a replay sends them, without times. "
        f"Run the daemon with --trace FILE to see every message both ways.{older}"
    )


def session_param(query: str) -> str | None:
    """The ``id`` of a session page's query (one, non-empty, at most MAX_SESSION_ID)."""
    ids = urllib.parse.parse_qs(query, keep_blank_values=True).get("id", [])
    if len(ids) == 1 and 0 < len(ids[0]) <= MAX_SESSION_ID and ids[0].isprintable():
        return ids[0]
    return None


def parse_answer(body: bytes) -> tuple[str, str] | None:
    """``{"id": ..., "optionId": ...}`` → (id, option id); None when malformed."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    request_id, option_id = data.get("id"), data.get("optionId")
    if isinstance(request_id, str) and isinstance(option_id, str):
        return request_id, option_id
    return None


# --------------------------------------------------------------------------- the view


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def diff_lines(old: str | None, new: str) -> tuple[list[list[str]], bool]:
    """
    A line diff of a file edit: ``[[op, line], ...]`` with op ``" "``, ``"+"``, ``"-"`` or
    ``"@"`` (a hunk header), and whether it was cut at :data:`MAX_DIFF_LINES`.
    """
    old_lines = (old or "")[:MAX_TEXT].splitlines()
    new_lines = new[:MAX_TEXT].splitlines()
    out: list[list[str]] = []
    for line in difflib.unified_diff(old_lines, new_lines, lineterm="", n=3):
        if line.startswith(("---", "+++")):
            continue
        op = "@" if line.startswith("@@") else line[:1]
        out.append([op, line if op == "@" else line[1:]])
        if len(out) >= MAX_DIFF_LINES:
            return out, True
    return out, False


def _command(call: Mapping[str, Any]) -> str | None:
    """The command an ``execute`` tool call runs, when its raw input says it."""
    raw = _map(call.get("rawInput"))
    command = raw.get("command")
    if isinstance(command, list) and all(isinstance(c, str) for c in command):
        command = " ".join(command)
    text = _text(command)
    if text is None:
        return None
    args = raw.get("args")
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        text = " ".join([text, *args])[:MAX_TEXT]
    return text


def pending_view(
    *,
    request_id: str,
    agent: str,
    session_id: str,
    cwd: str | None,
    title: str | None,
    params: Mapping[str, Any],
    time_left: float,
    asked_at: float,
    shown_to: str | None,
    note: str | None,
) -> dict[str, Any]:
    """What the page shows of one pending permission request (JSON-ready). Pure."""
    call = _map(params.get("toolCall"))
    locations = [
        loc["path"]
        for loc in call.get("locations") or []
        if isinstance(loc, dict) and isinstance(loc.get("path"), str)
    ]
    diffs = []
    for item in call.get("content") or []:
        if (
            isinstance(item, dict)
            and item.get("type") == "diff"
            and isinstance(item.get("path"), str)
        ):
            lines, cut = diff_lines(_text(item.get("oldText")), _text(item.get("newText")) or "")
            diffs.append({"path": item["path"], "lines": lines, "truncated": cut})
    options = [
        {
            "optionId": o["optionId"],
            "name": _text(o.get("name")) or o["optionId"],
            "kind": o.get("kind"),
        }
        for o in params.get("options") or []
        if isinstance(o, dict) and isinstance(o.get("optionId"), str)
    ]
    return {
        "id": request_id,
        "agent": agent,
        "session": {"id": session_id, "cwd": cwd, "title": title},
        "tool": {
            "title": _text(call.get("title")),
            "kind": _text(call.get("kind")),
            "toolCallId": _text(call.get("toolCallId")),
        },
        "locations": locations,
        "diffs": diffs,
        "command": _command(call),
        "options": options,
        "timeLeftMs": max(0, int(time_left * 1000)),
        "askedAt": asked_at,
        "shownTo": shown_to,
        "note": note,
    }


def decision_view(record: AuditRecord) -> dict[str, Any]:
    """One audit record as the page lists it under "latest decisions"."""
    return {
        "time": record.time,
        "session": record.session,
        "agent": record.agent,
        "title": record.title,
        "kind": record.kind,
        "decision": record.decision,
        "option": record.option_id,
        "source": record.source,
        "connection": record.connection,
    }


def session_tree(
    agents: list[Mapping[str, Any]],
    sessions: list[Mapping[str, Any]],
    *,
    limit: int = MAX_TREE_SESSIONS,
) -> dict[str, Any]:
    """
    The session tree the page shows beside the approvals, from the status snapshot's
    ``agents`` and ``sessions`` rows: each agent with its top-level sessions, each session
    with its sub-agents' sessions (``children``) under it, its owner ``connection``, its
    ``watchers`` count, its ``state`` and its pending approvals.

    At most ``limit`` sessions are listed (the status order, which is the table's: oldest
    first, a parent before its children); ``omitted`` counts the rest. A session whose parent
    is not listed (ended, or past the limit) is shown at its agent's top level, marked
    ``orphan``.
    """
    listed = sessions[:limit]
    nodes: dict[str, dict[str, Any]] = {}
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for row in listed:
        sid = row.get("sessionId")
        if not isinstance(sid, str) or sid in nodes:
            continue
        parent = row.get("parent")
        node: dict[str, Any] = {
            "id": sid,
            "agent": row.get("agent"),
            "state": row.get("state"),
            "connection": row.get("connection"),
            "watchers": row.get("watchers") or 0,
            "pending": row.get("pendingApprovals") or 0,
            "parent": parent,
            "orphan": False,
            "children": [],
        }
        nodes[sid] = node
        # only under a parent listed before it: no cycle can hide a session
        if isinstance(parent, str) and parent in nodes and parent != sid:
            nodes[parent]["children"].append(node)
        else:
            node["orphan"] = parent is not None
            by_agent.setdefault(str(node["agent"]), []).append(node)
    tree = [
        {
            "name": a.get("name"),
            "state": a.get("state"),
            "sessions": by_agent.pop(str(a.get("name")), []),
        }
        for a in agents
    ]
    # sessions of agents the snapshot does not list (gone since): under their own names
    tree.extend({"name": name, "state": None, "sessions": rows} for name, rows in by_agent.items())
    return {
        "agents": tree,
        "total": len(sessions),
        "omitted": max(0, len(sessions) - len(listed)),
    }


_MESSAGES: Final = {
    "user_message_chunk": "user",
    "agent_message_chunk": "agent",
    "agent_thought_chunk": "thought",
}


def _content_text(content: object) -> str:
    item = _map(content)
    if item.get("type") == "text":
        return _text(item.get("text")) or ""
    kind = item.get("type")
    return f"[{kind}]" if isinstance(kind, str) else ""


def _tool_diffs(content: object) -> list[dict[str, Any]]:
    diffs = []
    for item in content if isinstance(content, list) else []:
        if isinstance(item, dict) and item.get("type") == "diff":
            path = item.get("path")
            if isinstance(path, str):
                lines, cut = diff_lines(
                    _text(item.get("oldText")), _text(item.get("newText")) or ""
                )
                diffs.append({"path": path, "lines": lines, "truncated": cut})
    return diffs


def session_view(
    entries: list[tuple[int, bytes]], *, complete: bool, limit: int = MAX_SESSION_ITEMS
) -> dict[str, Any]:
    """
    A session's history (its relayed ``session/update`` lines, numbered) as the session page
    shows it: messages (``user``, ``agent``, ``thought``; consecutive chunks joined), tool
    calls (their later updates folded in: status, diffs) and plans (consecutive ones: the
    latest). The latest ``limit`` items; ``cut`` when older ones are left out, by the limit
    or because the history no longer holds them (``complete`` False).
    """
    items: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    for seq, line in entries:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        update = _map(_map(_map(message).get("params")).get("update"))
        kind = update.get("sessionUpdate")
        last = items[-1] if items else None
        if kind in _MESSAGES:
            role = _MESSAGES[kind]
            text = _content_text(update.get("content"))
            if last is not None and last["kind"] == role:
                last["text"] = (last["text"] + text)[:MAX_TEXT]
                last["seq"] = seq
            else:
                items.append({"kind": role, "seq": seq, "text": text})
        elif kind in ("tool_call", "tool_call_update"):
            call_id = _text(update.get("toolCallId")) or ""
            tool = tools.get(call_id)
            if tool is None:
                tool = {
                    "kind": "tool",
                    "seq": seq,
                    "id": call_id,
                    "title": None,
                    "toolKind": None,
                    "status": None,
                    "diffs": [],
                }
                tools[call_id] = tool
                items.append(tool)
            for key, field in (("title", "title"), ("toolKind", "kind"), ("status", "status")):
                if isinstance(update.get(field), str):
                    tool[key] = _text(update[field])
            diffs = _tool_diffs(update.get("content"))
            if diffs:
                tool["diffs"] = diffs
        elif kind == "plan":
            entries_ = [
                {"content": _text(e.get("content")) or "", "status": e.get("status")}
                for e in update.get("entries") or []
                if isinstance(e, dict)
            ]
            plan = {"kind": "plan", "seq": seq, "entries": entries_[:MAX_DIFF_LINES]}
            if last is not None and last["kind"] == "plan":
                items[-1] = plan
            else:
                items.append(plan)
    shown = items[-limit:]
    return {"items": shown, "cut": len(shown) < len(items) or not complete}
