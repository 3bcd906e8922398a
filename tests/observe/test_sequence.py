"""The sequence view of a trace: lanes, arrows in order, pairs, sessions, the bound, escaping.

Pure (no trio): records in, a model and HTML out. `TraceHtml` reads the HTML back the way a
person's browser would (the e2e and interop tests use it too).
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import json
import os
import re

import pytest

from acp_bridge.cli.main import main
from acp_bridge.observe.sequence import (
    HISTORY_LINK,
    MAX_LANES,
    Gap,
    build_sequence,
    history_records,
    read_records,
)
from acp_bridge.observe.sequence_html import (
    MAX_JSON_CHARS,
    render_sequence_body,
    render_sequence_page,
    render_view,
)
from acp_bridge.observe.summary import request_summary
from tests.observe.test_trace import TRACE, update

#: What the view's HTML is made of; anything else would be content that escaped.
ALLOWED_TAGS = {
    "section",
    "div",
    "p",
    "span",
    "small",
    "b",
    "ol",
    "li",
    "a",
    "details",
    "summary",
    "pre",
    "label",
    "select",
    "option",
    "button",
}


class TraceHtml(html.parser.HTMLParser):
    """The rows of a rendered view: each message's id, classes, arrow label and text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: list[dict[str, str]] = []
        #: (what the text goes to, the tag that ends it)
        self._in: tuple[str, str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        classes = (attributes.get("class") or "").split()
        if tag == "li" and "msg" in classes:
            row = {"id": attributes["id"], "classes": classes, "label": "", "text": "", "json": ""}
            row |= {k: v for k, v in attributes.items() if k.startswith("data-")}
            self.rows.append(row)
        elif self.rows and self._in is None:
            if tag == "span" and "label" in classes:
                self._in = ("label", tag)
            elif tag in ("summary", "pre"):
                self._in = ("text" if tag == "summary" else "json", tag)

    def handle_endtag(self, tag):
        if self._in is not None and self._in[1] == tag:
            self._in = None

    def handle_data(self, data):
        if self._in is not None:
            self.rows[-1][self._in[0]] += data

    @property
    def labels(self) -> list[str]:
        return [str(row["label"]) for row in self.rows]


def records(lines):
    return list(read_records(lines))


def msg_rec(t, link, direction, msg):
    return {"t": t, "link": link, "dir": direction, "msg": msg}


def request(id_, method, **params):
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def result(id_, value):
    return {"jsonrpc": "2.0", "id": id_, "result": value}


# -- the model -------------------------------------------------------------------------------


def test_lanes_are_clients_then_the_bridge_then_agents_in_the_order_they_appear():
    recs = [
        msg_rec(1.0, "client:ws-2", "in", request(1, "initialize")),
        msg_rec(1.1, "agent:zed", "out", request(1, "initialize")),
        msg_rec(1.2, "client:ws-1", "in", request(1, "initialize")),
        msg_rec(1.3, "agent:alpha", "out", request(2, "initialize")),
    ]
    view = build_sequence(recs)
    assert [(lane.kind, lane.name) for lane in view.lanes] == [
        ("client", "ws-2"),
        ("client", "ws-1"),
        ("bridge", "bridge"),
        ("agent", "zed"),
        ("agent", "alpha"),
    ]
    arrows = view.arrows
    assert [view.ends(a) for a in arrows] == [(0, 2), (2, 3), (1, 2), (2, 4)]


def test_every_message_is_one_arrow_in_the_trace_order_pointing_the_way_it_went():
    """`in` points at the bridge, `out` away from it, on the client's side and the agent's."""
    view = build_sequence(records(TRACE))
    arrows = view.arrows
    messages = [json.loads(line) for line in TRACE if line.startswith("{")]
    messages = [m for m in messages if "msg" in m]
    assert len(arrows) == len(messages) == 17
    assert [a.number for a in arrows] == sorted(a.number for a in arrows)
    assert [(a.link, a.direction) for a in arrows] == [(m["link"], m["dir"]) for m in messages]
    lanes = {lane.key: i for i, lane in enumerate(view.lanes)}
    bridge = lanes["bridge"]
    for arrow in arrows:
        peer = lanes[arrow.link]
        assert view.ends(arrow) == ((peer, bridge) if arrow.direction == "in" else (bridge, peer))
    assert [a.label for a in arrows[:6]] == [
        "initialize",
        "result",
        "session/new",
        "session/new",
        "result",
        "result",
    ]
    assert arrows[-1].kind == "raw"
    assert arrows[-1].summary == "not json at all"


def test_answers_pair_with_their_request_on_the_same_link_by_id():
    """Ids are per link: id 7 on the agent's link is not id 7 on the client's."""
    recs = [
        msg_rec(0.0, "client:c", "in", request(7, "session/prompt", sessionId="s")),
        msg_rec(0.1, "agent:a", "out", request(7, "session/prompt", sessionId="s")),
        msg_rec(0.2, "agent:a", "in", request(7, "session/request_permission", sessionId="s")),
        msg_rec(0.3, "client:c", "out", request(1, "session/request_permission", sessionId="s")),
        msg_rec(0.4, "client:c", "in", result(1, {"outcome": {"outcome": "cancelled"}})),
        msg_rec(0.5, "agent:a", "out", result(7, {"outcome": {"outcome": "cancelled"}})),
        msg_rec(0.6, "agent:a", "in", result(7, {"stopReason": "cancelled"})),
        msg_rec(0.7, "client:c", "out", {"jsonrpc": "2.0", "id": 7, "error": {"code": -1}}),
        msg_rec(0.8, "client:c", "out", result(99, {})),
    ]
    arrows = build_sequence(recs).arrows
    partners = {a.number: a.partner for a in arrows}
    assert partners == {1: 8, 2: 7, 3: 6, 4: 5, 5: 4, 6: 3, 7: 2, 8: 1, 9: None}
    assert [a.method for a in arrows[4:8]] == [
        "session/request_permission",
        "session/request_permission",
        "session/prompt",
        "session/prompt",
    ]
    assert arrows[7].kind == "error"
    assert arrows[6].latency == pytest.approx(0.5)
    pairs = [a.pair for a in arrows]
    assert pairs[:8] == [0, 1, 2, 3, 3, 2, 1, 0]  # one colour per pair, both ends
    assert pairs[8] is None  # an answer to nothing in the trace
    assert arrows[5].summary == "outcome cancelled"


def test_session_new_joins_the_session_its_answer_names_and_a_filter_keeps_one_session():
    view = build_sequence(records(TRACE))
    new = [a for a in view.arrows if a.method == "session/new"]
    assert [a.session for a in new] == ["s1~b", "s1", "s1", "s1~b"]
    assert view.sessions == ("s1~b", "nope")  # the agent's own id under the bridge's
    assert {a.group for a in new} == {"s1~b"}

    one = build_sequence(records(TRACE), session="s1~b")
    labels = [a.label for a in one.arrows]
    assert "initialize" not in labels  # no session: the connection's
    assert labels[:4] == ["session/new", "session/new", "result", "result"]
    assert {a.session for a in one.arrows} == {"s1", "s1~b"}  # the agent's own id folded in
    assert one.messages == len(one.arrows) == 12
    assert build_sequence(records(TRACE), session="zzz").arrows == []


def test_drop_marks_and_lines_that_are_no_records_are_counted():
    view = build_sequence(records(TRACE))
    gaps = [item for item in view.items if isinstance(item, Gap)]
    assert [(g.dropped, g.t) for g in gaps] == [(4, pytest.approx(1.65))]
    assert view.dropped == 4
    assert view.bad == 1  # "this line is no record"
    body = render_view(view)
    assert "The tracer dropped 4 messages" in body
    assert "4 messages not recorded here" in body
    assert "1 line of the trace was not a trace record" in body


def test_the_bound_keeps_the_first_messages_and_says_how_many_are_left_out():
    recs = [msg_rec(i / 10, "client:c", "in", request(i, "ping", n=i)) for i in range(25)]
    recs.insert(20, {"t": 2.0, "dropped": 3})  # past the bound: its mark is not shown either
    recs.append(msg_rec(3.0, "client:c", "out", result(2, {})))  # answers a kept request
    view = build_sequence(recs, limit=10)
    assert [a.number for a in view.arrows] == list(range(1, 11))
    assert (view.messages, view.omitted, view.dropped) == (26, 16, 3)
    assert view.arrows[2].partner == 27  # noted, though not shown
    body = render_view(view, more="Raise it with --limit N.")
    assert "Showing the first 10 of 26 messages: the other 16 are left out. Raise it" in body
    assert "answered in #27, past the limit" in body
    assert len(TraceHtml(body).rows) == 10
    assert "not recorded here" not in body
    everything = build_sequence(recs, limit=None)
    assert (len(everything.arrows), everything.omitted) == (26, 0)


def test_a_request_decided_late_by_its_answer_still_counts_in_order_against_the_bound():
    """With a filter, session/new waits for its answer; it then goes before later messages."""
    recs = [
        msg_rec(0.0, "client:c", "in", request(1, "session/new", cwd="/")),
        msg_rec(0.1, "client:c", "in", request(2, "session/prompt", sessionId="s")),
        msg_rec(0.2, "client:c", "out", result(1, {"sessionId": "s"})),
        msg_rec(0.3, "client:c", "out", result(2, {"stopReason": "end_turn"})),
    ]
    view = build_sequence(recs, session="s", limit=2)
    assert [a.number for a in view.arrows] == [1, 2]
    assert (view.messages, view.omitted) == (4, 2)


def test_peers_past_the_lane_limit_share_a_lane():
    recs = [msg_rec(i, f"agent:a{i}", "out", request(1, "initialize")) for i in range(30)]
    recs += [msg_rec(40, "client:c", "in", request(1, "initialize"))]
    view = build_sequence(recs)
    assert len(view.lanes) == MAX_LANES
    assert view.lanes[-1].name == f"{30 - (MAX_LANES - 3)} more agents"
    assert view.ends(view.arrows[29]) == (1, MAX_LANES - 1)
    assert view.ends(view.arrows[0]) == (1, 2)


def test_summaries_say_what_a_message_carries():
    permission = {
        "sessionId": "s",
        "toolCall": {"title": "Write notes.txt", "kind": "edit"},
        "options": [
            {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
            {"optionId": "reject-once", "kind": "reject_once"},
        ],
    }
    assert (
        request_summary("session/request_permission", permission)
        == '"Write notes.txt" (edit) [Allow once / reject-once]'
    )
    view = build_sequence(
        [
            msg_rec(0, "client:c", "in", request(1, "session/prompt", prompt=[{"text": "hi"}])),
            msg_rec(0, "agent:a", "in", update("s", "agent_message_chunk", content={"text": "y"})),
        ]
    )
    assert [a.summary for a in view.arrows] == ['"hi"', 'agent_message_chunk "y"']


# -- the HTML --------------------------------------------------------------------------------


def test_rows_carry_the_label_session_summary_pair_links_and_the_whole_json():
    body = render_sequence_body(records(TRACE))
    page = TraceHtml(body)
    view = build_sequence(records(TRACE))
    assert page.labels == [a.label for a in view.arrows]
    assert [row["id"] for row in page.rows] == [f"m{a.number}" for a in view.arrows]
    prompt = next(r for r in page.rows if r["label"] == "session/prompt")
    assert "s1~b" in prompt["text"]
    assert '"hi⏎there"' in prompt["text"]
    assert json.loads(prompt["json"])["params"]["prompt"][0]["text"] == "hi\nthere"
    answer = next(r for r in page.rows if r["id"] == f"m{prompt['data-partner'][1:]}")
    assert answer["data-partner"] == prompt["id"]
    colour = [c for c in prompt["classes"] if c.startswith("pair-")]
    assert colour
    assert colour[0] in answer["classes"]
    assert f'href="#{answer["id"]}"' in body
    assert f'href="#{prompt["id"]}"' in body
    assert "stopReason end_turn" in answer["text"]


HOSTILE = [
    "<script>window.pwned = 1</script>",
    '"><img src=x onerror="window.pwned=1">',
    "</details></summary></pre></li></ol><iframe src=javascript:alert(1)>",
    "' onmouseover='window.pwned=1",
    "&lt;escaped already&gt; &amp;",
]


def hostile_records():
    out = []
    for i, bad in enumerate(HOSTILE):
        out += [
            msg_rec(i, f"client:{bad}", "in", request(bad, bad, sessionId=bad, prompt=[bad])),
            msg_rec(
                i,
                f"agent:{bad}",
                "out",
                request(i, "session/prompt", sessionId=bad, prompt=[{"type": "text", "text": bad}]),
            ),
            msg_rec(
                i,
                f"agent:{bad}",
                "in",
                update(bad, "agent_message_chunk", content={"type": "text", "text": bad}),
            ),
            msg_rec(
                i,
                f"agent:{bad}",
                "in",
                request(
                    i,
                    "session/request_permission",
                    sessionId=bad,
                    toolCall={"title": bad, "kind": bad},
                    options=[{"name": bad, "optionId": bad}],
                ),
            ),
            msg_rec(
                i,
                f"client:{bad}",
                "out",
                {"jsonrpc": "2.0", "id": bad, "error": {"code": bad, "message": bad}},
            ),
            msg_rec(i, f"client:{bad}", "in", {"raw": bad}),
            msg_rec(i, f"client:{bad}", "in", {bad: bad}),
        ]
    return out


def test_hostile_content_is_text_never_markup():
    """Whatever a trace holds (methods, ids, sessions, texts, link names, raw lines, keys), the
    HTML has only the view's own elements and attributes, and the content reads back as text."""
    body = render_sequence_body(hostile_records(), anchor="x")
    page = TraceHtml(body)
    assert {tag for tag, _ in page.tags} <= ALLOWED_TAGS
    for tag, attributes in page.tags:
        for name, value in attributes.items():
            assert not name.startswith("on"), (tag, name)
            assert name in {
                "id",
                "class",
                "href",
                "title",
                "value",
                "type",
                "hidden",
                "role",
                "aria-label",
                "aria-hidden",
            } or name.startswith("data-"), (tag, name)
            if name == "href":
                assert re.fullmatch(r"#x\d+", value or "")
            if name in ("id", "class"):
                assert re.fullmatch(r"[\w -]+", value or ""), (tag, name, value)
    assert not re.search(r"<(script|img|iframe)", body)
    text = "".join(str(r["text"]) + str(r["json"]) for r in page.rows)
    for bad in HOSTILE:
        assert bad in text or json.dumps(bad, ensure_ascii=False)[1:-1] in text
    assert len(page.rows) == len(hostile_records())
    sessions = {row.get("data-session") for row in page.rows} - {None}
    assert set(HOSTILE) <= sessions  # attribute values come back exactly
    with pytest.raises(ValueError, match="id prefix"):
        render_sequence_body([], anchor='"><script>')


def test_a_lone_surrogate_or_a_deep_message_does_not_break_the_page():
    deep: object = "x"
    for _ in range(5000):
        deep = [deep]
    body = render_sequence_body(
        [
            msg_rec(0, "client:c", "in", request(1, "session/prompt", prompt=[{"text": "\ud800"}])),
            msg_rec(1, "client:c", "in", request(2, "deep", deep=deep)),
        ]
    )
    body.encode("utf-8")  # no lone surrogate left
    assert len(TraceHtml(body).rows) == 2


def test_a_huge_message_is_cut_in_its_json_only():
    text = "y" * (MAX_JSON_CHARS * 3)
    body = render_sequence_body(
        [msg_rec(0, "client:c", "in", request(1, "session/prompt", prompt=[{"text": text}]))]
    )
    row = TraceHtml(body).rows[0]
    assert len(row["json"]) < MAX_JSON_CHARS + 200
    assert "more characters (the whole message is in the trace)" in row["json"]
    assert len(row["text"]) < 200


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_the_page_is_self_contained_and_runs_only_its_own_style_and_script():
    body = render_sequence_body(records(TRACE))
    page = render_sequence_page(body, title="trace <1>")
    assert page.startswith("<!doctype html>")
    assert "<title>trace &lt;1&gt;</title>" in page
    assert not re.search(r"https?://|<link|\bsrc=|@import|url\(", page)
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    script = re.search(r"<script>(.*?)</script>", page, re.S)
    assert style
    assert script
    assert page.count("<style>") == page.count("<script>") == 1
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp
    policy = csp.group(1).replace("&#x27;", "'")
    assert policy.startswith("default-src 'none';")
    assert f"style-src '{_hash(style.group(1))}'" in policy
    assert f"script-src '{_hash(script.group(1))}'" in policy
    assert " style=" not in body  # positions are classes: a strict policy allows the body


def test_an_empty_trace_says_so():
    body = render_sequence_body([])
    assert "No messages in this trace." in body
    assert TraceHtml(body).rows == []
    assert "No messages of session s in this trace." in render_sequence_body([], session="s")


# -- the command line ------------------------------------------------------------------------


def test_trace_show_html_writes_the_page_owner_only(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(TRACE) + "\n")
    out = tmp_path / "trace.html"
    assert main(["trace", "show", str(path), "--html", "--output", str(out)]) == 0
    assert os.stat(out).st_mode & 0o077 == 0  # prompts inside
    assert "wrote" in capsys.readouterr().err
    page = out.read_text()
    assert len(TraceHtml(page).rows) == 17
    assert "<title>acp-bridge trace · trace.jsonl</title>" in page

    assert main(["trace", "show", str(path), "--html", "--limit", "3", "--session", "s1~b"]) == 0
    printed = capsys.readouterr().out
    assert len(TraceHtml(printed).rows) == 3
    assert "Showing the first 3 of 12 messages of session s1~b" in printed
    assert "--limit N (0: no bound)" in printed
    assert main(["trace", "show", str(path), "--html", "--limit", "0"]) == 0
    assert "Showing the first" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--output", "x.html"],
        ["--limit", "3"],
        ["--html", "--limit", "-1"],
        ["--html", "--limit", "x"],
    ],
)
def test_trace_show_html_options_are_checked(tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["trace", "show", str(tmp_path / "t"), *argv])
    assert exit_.value.code == 2
    assert "--" in capsys.readouterr().err


def test_trace_show_html_of_a_missing_file_or_to_an_unwritable_place(tmp_path, capsys):
    assert main(["trace", "show", str(tmp_path / "missing"), "--html"]) == 1
    assert "missing" in capsys.readouterr().err
    path = tmp_path / "trace.jsonl"
    path.write_text("")
    out = tmp_path / "no" / "dir" / "x.html"
    assert main(["trace", "show", str(path), "--html", "--output", str(out)]) == 1
    assert "x.html" in capsys.readouterr().err


def test_a_sessions_history_is_drawn_as_what_the_bridge_sends_its_clients_without_times():
    """``history_records``: each entry a message from the bridge to the session's clients,
    in the history's order; a line that is not JSON is kept as text."""
    entries = [
        (
            1,
            json.dumps(
                update("s1", "user_message_chunk", content={"type": "text", "text": "hi"})
            ).encode(),
        ),
        (
            2,
            json.dumps(
                update("s1", "agent_message_chunk", content={"type": "text", "text": "hello"})
            ).encode(),
        ),
        (3, b"not json\n"),
    ]
    view = build_sequence(history_records(entries), session=None, limit=None)
    assert [lane.name for lane in view.lanes] == ["its clients", "bridge"]
    arrows = view.arrows
    assert [(a.link, a.direction, a.t) for a in arrows] == [(HISTORY_LINK, "out", 0.0)] * 3
    assert [a.kind for a in arrows] == ["notification", "notification", "raw"]
    assert "hi" in arrows[0].summary
    assert "hello" in arrows[1].summary
    body = render_view(view, times=False)
    assert '<span class="t"></span>' in body
    assert "+0.000s" not in body
    assert " UTC over " not in body
