"""The approval console's pure decisions: login, cookie, CSRF, Origin, and the request's view."""

from __future__ import annotations

import json

import pytest

from acp_bridge.config.model import WebSocketConfig
from acp_bridge.faces.console_core import (
    CSP,
    MAX_DIFF_LINES,
    SESSION_TTL,
    ConsoleKeys,
    Login,
    diff_lines,
    parse_answer,
    pending_view,
    render_page,
    sequence_source,
    session_param,
    session_tree,
    session_view,
)
from acp_bridge.faces.listener_core import HANDLERS, ListenerPolicy, listener_site
from acp_bridge.http.wire import Admitted, RequestHead, Response, plain
from acp_bridge.policy.rules import parse_policy
from acp_bridge.protocol.jsonrpc import SETUP_UPDATES
from acp_bridge.sessions.table import Session, track_setup

TOKEN = b"console-token-" + b"x" * 30
PORT = 8765
NOW = 1_800_000_000.0
ORIGIN = f"http://127.0.0.1:{PORT}"


def policy(**ws) -> ListenerPolicy:
    return ListenerPolicy.build(WebSocketConfig(**ws), token=TOKEN, port=PORT, tls=False)


KEYS = ConsoleKeys.build(TOKEN, port=PORT, tls=False)
#: what the listener admits to the console: the handler's name, and what was proved
LIVE = Admitted("console.events")
ASSET = Admitted("console.asset")
ANSWER = Admitted("console.answer")


def judge_console(
    head: RequestHead, policy: ListenerPolicy, keys: ConsoleKeys, *, now: float
) -> Response | Admitted[str]:
    """The listener's verdict on a console request (handlers named as in HANDLERS)."""
    return listener_site(policy, keys, {name: name for name in HANDLERS}).judge(head, now=now)


def head(target: str, *, method: str = "GET", **headers: str) -> RequestHead:
    pairs = [("host", f"127.0.0.1:{PORT}")]
    pairs += [(name.replace("_", "-"), value) for name, value in headers.items()]
    return RequestHead(method, target, "1.1", tuple(pairs))


def session_cookie(now: float = NOW) -> str:
    return KEYS.mint_session(now=now, nonce=b"n" * 18)


def with_cookie(value: str) -> str:
    return f"other=1; {KEYS.cookie_name}={value}"


def test_the_listener_sends_console_paths_to_the_console():
    """/console and below are the console's (after the Host check); /consoles is not."""
    for target in ("/console", "/console/events"):
        # (without a cookie: refused by the console's own rules, not as an unknown path)
        verdict = judge_console(head(target), policy(), KEYS, now=NOW)
        assert isinstance(verdict, Response)
        assert verdict.status == 401
        assert "Content-Security-Policy" in dict(verdict.headers)
    assert judge_console(head("/consoles"), policy(), KEYS, now=NOW) == plain(404, "not found")
    wrong_host = RequestHead("GET", "/console", "1.1", (("host", "evil.example:8765"),))
    assert judge_console(wrong_host, policy(), KEYS, now=NOW).status == 403  # type: ignore[union-attr]


def test_the_token_once_logs_in_and_a_wrong_one_is_401():
    assert judge_console(head("/console?token=" + TOKEN.decode()), policy(), KEYS, now=NOW) == (
        Admitted("console.page", Login())
    )
    for target in ("/console?token=nope", "/console?token=a&token=b", "/console?x=1"):
        verdict = judge_console(head(target), policy(), KEYS, now=NOW)
        assert isinstance(verdict, Response)
        assert verdict.status == 401


def test_without_a_valid_cookie_every_console_path_with_data_is_401():
    """Page, live channel and answers need the session; a forged, foreign or expired cookie
    counts as none."""
    other = ConsoleKeys.build(b"another-token", port=PORT, tls=False)
    good = session_cookie()
    bad = [
        None,
        "garbage",
        good[:-2] + "xx",  # MAC broken
        other.mint_session(now=NOW, nonce=b"n" * 18),  # another daemon's token
        session_cookie(now=NOW - SESSION_TTL - 1),  # expired
    ]
    for cookie in bad:
        for target, method in (("/console", "GET"), ("/console/events", "GET")):
            extra = {"cookie": with_cookie(cookie)} if cookie else {}
            verdict = judge_console(head(target, method=method, **extra), policy(), KEYS, now=NOW)
            assert isinstance(verdict, Response), (cookie, target)
            assert verdict.status == 401
            assert "Content-Security-Policy" in dict(verdict.headers)


def test_a_valid_cookie_opens_the_page_and_its_live_channel():
    cookie = with_cookie(session_cookie())
    page = judge_console(head("/console", cookie=cookie), policy(), KEYS, now=NOW)
    assert isinstance(page, Admitted)
    assert page.handler == "console.page"
    assert KEYS.check_session(session_cookie(), now=NOW) == page.principal
    live = judge_console(head("/console/events", cookie=cookie), policy(), KEYS, now=NOW)
    assert live == Admitted(LIVE.handler, page.principal)


def test_static_assets_need_no_session_but_a_right_origin():
    assert judge_console(head("/console/app.js"), policy(), KEYS, now=NOW) == ASSET
    assert judge_console(head("/console/app.css"), policy(), KEYS, now=NOW) == ASSET
    evil = head("/console/app.js", origin="http://evil.example")
    assert judge_console(evil, policy(), KEYS, now=NOW).status == 403  # type: ignore[union-attr]


def test_answers_need_an_own_origin_and_the_page_csrf_value():
    session = KEYS.check_session(session_cookie(), now=NOW)
    assert session is not None
    csrf = KEYS.mint_csrf(session, nonce=b"p" * 18)
    cookie = with_cookie(session_cookie())

    def answer(**headers: str):
        return judge_console(
            head("/console/answer", method="POST", cookie=cookie, **headers),
            policy(allowed_origins=["https://tool.example"]),
            KEYS,
            now=NOW,
        )

    assert answer(origin=ORIGIN, x_console_csrf=csrf) == Admitted(ANSWER.handler, session)
    assert answer(origin="https://tool.example", x_console_csrf=csrf) == Admitted(
        ANSWER.handler, session
    )
    statuses = [
        answer(x_console_csrf=csrf),  # no Origin at all
        answer(origin="http://127.0.0.1:9999", x_console_csrf=csrf),  # another port: same site
        answer(origin="null", x_console_csrf=csrf),
        answer(origin=ORIGIN),  # no CSRF value
        answer(origin=ORIGIN, x_console_csrf=csrf[:-3] + "abc"),
        answer(origin=ORIGIN, x_console_csrf=KEYS.mint_csrf("another-session", nonce=b"p" * 18)),
    ]
    assert [v.status for v in statuses] == [403] * 6  # type: ignore[union-attr]


def test_methods_and_unknown_paths():
    cookie = with_cookie(session_cookie())
    get_answer = judge_console(head("/console/answer", cookie=cookie), policy(), KEYS, now=NOW)
    post_page = judge_console(head("/console", method="POST"), policy(), KEYS, now=NOW)
    unknown = judge_console(head("/console/secret"), policy(), KEYS, now=NOW)
    assert (get_answer.status, post_page.status, unknown.status) == (405, 405, 404)  # type: ignore[union-attr]


def test_the_cookie_is_httponly_samesite_strict_per_port_and_secure_under_tls():
    header = KEYS.set_cookie("v")
    assert header.startswith(f"acp_console_{PORT}=v; Path=/console;")
    assert "; HttpOnly" in header
    assert "; SameSite=Strict" in header
    assert "Secure" not in header
    assert "; Secure" in ConsoleKeys.build(TOKEN, port=PORT, tls=True).set_cookie("v")


def test_the_csp_forbids_inline_script():
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'none'"
    assert "unsafe" not in CSP


def test_an_answer_body_is_an_id_and_an_option():
    assert parse_answer(b'{"id": "3", "optionId": "allow"}') == ("3", "allow")
    for body in (b"", b"[]", b'{"id": 3, "optionId": "a"}', b'{"id": "3"}', b"\xff"):
        assert parse_answer(body) is None


def test_the_view_of_an_edit_shows_its_diff_locations_and_options():
    params = {
        "sessionId": "s1",
        "toolCall": {
            "toolCallId": "call_1",
            "title": "Write notes.txt",
            "kind": "edit",
            "locations": [{"path": "/p/notes.txt"}],
            "content": [
                {"type": "diff", "path": "/p/notes.txt", "oldText": "a\nb\n", "newText": "a\nc\n"}
            ],
        },
        "options": [
            {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
            {"name": "no id: not an option"},
        ],
    }
    view = pending_view(
        request_id="7",
        agent="demo",
        session_id="s1",
        cwd="/p",
        title="Notes",
        params=params,
        time_left=41.5,
        asked_at=NOW,
        shown_to="ws:1234",
        note=None,
    )
    assert view["tool"] == {"title": "Write notes.txt", "kind": "edit", "toolCallId": "call_1"}
    assert view["session"] == {"id": "s1", "cwd": "/p", "title": "Notes"}
    assert view["locations"] == ["/p/notes.txt"]
    hunk = [["@", "@@ -1,2 +1,2 @@"], [" ", "a"], ["-", "b"], ["+", "c"]]
    assert view["diffs"][0]["lines"] == hunk
    assert [o["name"] for o in view["options"]] == ["Allow once", "Reject"]
    assert view["timeLeftMs"] == 41500
    assert view["command"] is None


def test_the_view_of_a_command_and_of_a_new_file():
    params = {
        "toolCall": {"title": "Run", "kind": "execute", "rawInput": {"command": ["rm", "-rf", "x"]}}
    }
    view = pending_view(
        request_id="1",
        agent="a",
        session_id="s",
        cwd=None,
        title=None,
        params=params,
        time_left=-3,
        asked_at=NOW,
        shown_to=None,
        note=None,
    )
    assert view["command"] == "rm -rf x"
    assert view["timeLeftMs"] == 0
    lines, cut = diff_lines(None, "one\ntwo\n")
    assert [op for op, _ in lines] == ["@", "+", "+"]
    assert not cut


def test_a_long_diff_is_cut():
    lines, cut = diff_lines(None, "x\n" * (MAX_DIFF_LINES * 2))
    assert len(lines) == MAX_DIFF_LINES
    assert cut


def test_policy_unattended_is_deny_or_console():
    assert parse_policy({})[0].unattended == "deny"
    assert parse_policy({"unattended": "console"})[0].unattended == "console"
    _, problems = parse_policy({"unattended": "allow"})
    assert problems == ["policy.unattended: expected one of 'deny', 'console'"]


@pytest.mark.parametrize("title", ["Fix the parser", None])
def test_a_session_title_follows_session_info_updates(title):
    assert "session_info_update" in SETUP_UPDATES  # (the relay tracks only these)
    session = Session("s1", "demo", "s1")
    track_setup(session, {"sessionUpdate": "session_info_update", "title": "Old"})
    track_setup(session, {"sessionUpdate": "session_info_update", "title": title})
    assert session.title == title
    assert session.setup == {}


def _row(sid: str, agent: str = "demo", parent: str | None = None, **extra) -> dict:
    return {
        "sessionId": sid,
        "agent": agent,
        "state": "active",
        "parent": parent,
        "connection": "ws:1",
        "watchers": 0,
        "pendingApprovals": 0,
        **extra,
    }


def test_the_session_tree_puts_sub_agents_under_their_parents():
    agents = [{"name": "demo", "state": "ready"}, {"name": "other", "state": "down"}]
    rows = [
        _row("a", watchers=2, pendingApprovals=1),
        _row("b", agent="other", connection=None),
        _row("a1", parent="a"),
        _row("a1x", parent="a1"),
    ]
    tree = session_tree(agents, rows)
    assert (tree["total"], tree["omitted"]) == (4, 0)
    demo, other = tree["agents"]
    assert (demo["name"], demo["state"]) == ("demo", "ready")
    [a] = demo["sessions"]
    assert (a["id"], a["watchers"], a["pending"], a["connection"]) == ("a", 2, 1, "ws:1")
    assert [c["id"] for c in a["children"]] == ["a1"]
    assert [c["id"] for c in a["children"][0]["children"]] == ["a1x"]
    assert [s["id"] for s in other["sessions"]] == ["b"]
    assert other["sessions"][0]["connection"] is None


def test_the_session_tree_is_bounded_and_shows_orphans_and_gone_agents():
    rows = [_row(f"s{i}") for i in range(5)]
    tree = session_tree([{"name": "demo", "state": "ready"}], rows, limit=3)
    assert [s["id"] for s in tree["agents"][0]["sessions"]] == ["s0", "s1", "s2"]
    assert (tree["total"], tree["omitted"]) == (5, 2)
    # a parent not listed (or listed after: no cycle hides a session): at the top, an orphan
    tree = session_tree(
        [], [_row("x", parent="y", agent="gone"), _row("y", parent="x", agent="gone")]
    )
    [gone] = tree["agents"]
    assert (gone["name"], gone["state"]) == ("gone", None)
    assert [(s["id"], s["orphan"]) for s in gone["sessions"]] == [("x", True)]
    assert [c["id"] for c in gone["sessions"][0]["children"]] == ["y"]


def _update(seq: int, update: dict) -> tuple[int, bytes]:
    message = {"jsonrpc": "2.0", "method": "session/update", "params": {"update": update}}
    return seq, json.dumps(message).encode()


def _chunk(kind: str, text: str) -> dict:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def test_the_session_view_joins_chunks_and_folds_tool_call_updates():
    diff = {"type": "diff", "path": "/p/a.txt", "oldText": None, "newText": "hi\n"}
    entries = [
        _update(1, _chunk("user_message_chunk", "write a.txt")),
        _update(2, _chunk("agent_message_chunk", "Sure, ")),
        _update(3, _chunk("agent_message_chunk", "writing.")),
        _update(4, {"sessionUpdate": "plan", "entries": [{"content": "w", "status": "pending"}]}),
        _update(5, {"sessionUpdate": "plan", "entries": [{"content": "w", "status": "done"}]}),
        _update(
            6,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "t1",
                "title": "Write a.txt",
                "kind": "edit",
                "status": "pending",
                "content": [diff],
            },
        ),
        (7, b"not json"),
        _update(
            8, {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}
        ),
        _update(9, _chunk("agent_message_chunk", "Wrote.")),
    ]
    view = session_view(entries, complete=True)
    assert view["cut"] is False
    kinds = [(i["kind"], i.get("text")) for i in view["items"]]
    assert kinds == [
        ("user", "write a.txt"),
        ("agent", "Sure, writing."),
        ("plan", None),
        ("tool", None),
        ("agent", "Wrote."),
    ]
    plan, tool = view["items"][2], view["items"][3]
    assert plan["entries"] == [{"content": "w", "status": "done"}]
    assert (tool["title"], tool["toolKind"], tool["status"]) == ("Write a.txt", "edit", "completed")
    assert tool["diffs"][0]["lines"] == [["@", "@@ -0,0 +1 @@"], ["+", "hi"]]


def test_the_session_view_keeps_the_latest_items_and_says_when_cut():
    entries = [
        _update(n, _chunk("user_message_chunk" if n % 2 else "agent_message_chunk", str(n)))
        for n in range(1, 11)
    ]
    view = session_view(entries, complete=True, limit=3)
    assert [i["text"] for i in view["items"]] == ["8", "9", "10"]
    assert view["cut"] is True
    assert session_view(entries[:2], complete=False)["cut"] is True  # the history trimmed some


def test_a_session_page_escapes_its_session_id():
    page = render_page('<meta content="{{session}}">{{csrf}}', "c", 'a"><script>')
    assert page == b'<meta content="a&quot;&gt;&lt;script&gt;">c'
    assert session_param("id=demo-1") == "demo-1"
    assert session_param("id=a&id=b") is None
    assert session_param("x=1") is None


def test_a_page_is_filled_in_one_pass_and_its_query_session_is_quoted():
    template = "{{session}}|{{session_q}}|{{view}}|{{csrf}}|{{other}}"
    page = render_page(template, "c", "a b&{{csrf}}", view="<ol>{{csrf}}</ol>")
    # What goes in is never taken for a placeholder; an unknown one is left as it is.
    assert page == (b"a b&amp;{{csrf}}|a%20b%26%7B%7Bcsrf%7D%7D|<ol>{{csrf}}</ol>|c|{{other}}")


def test_the_sequence_page_says_where_its_messages_come_from():
    traced = sequence_source(traced=True, kept=4096, cut=False)
    assert "wire trace" in traced
    assert "4,096" in traced
    history = sequence_source(traced=False, kept=12, cut=True)
    assert "history (12 entries)" in history.replace("&#x27;", "'")
    assert "--trace FILE" in history
    assert "Older entries are left out." in history
    assert "left out" not in sequence_source(traced=False, kept=12, cut=False)
