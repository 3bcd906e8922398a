"""
The sequence view (``observe.sequence``) as HTML: ``acp-bridge trace show FILE --html``. Pure.

Two parts, so that another page can show a view too (the console's session page):

- :func:`render_sequence_body` (or :func:`render_view`): the view itself, an HTML fragment. It
  has no inline style, script or event handler, so it works under a Content-Security-Policy
  without ``'unsafe-inline'`` when the page serves :func:`sequence_css` and
  :func:`sequence_js` as files (``acp_bridge/observe/static/``). It needs no script: the
  JSON of a message opens with a ``<details>``, pairs link with anchors; the script adds a
  session filter, "open all" and highlights a message's partner.
- :func:`render_sequence_page`: a whole page around a body, CSS and script inline, with a
  Content-Security-Policy that allows those two (by hash) and nothing else: no network.

Escaping: every text from a trace goes through :func:`html.escape` (quotes included) and only
into element text or double-quoted attributes; the CSS and the script are constants.

Bounds: the view's (``limit`` messages), and :data:`MAX_JSON_CHARS` of each message's JSON.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import importlib.resources
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Final

from acp_bridge.observe.sequence import DEFAULT_LIMIT, Arrow, Gap, build_sequence, read_records

if TYPE_CHECKING:
    from collections.abc import Iterable

    from acp_bridge.observe.sequence import SequenceView

__all__ = [
    "MAX_JSON_CHARS",
    "main_trace_html",
    "render_sequence_body",
    "render_sequence_page",
    "render_view",
    "sequence_css",
    "sequence_js",
]

#: Characters of one message's JSON in the page; the rest is cut (the page says so).
MAX_JSON_CHARS: Final = 6_000
#: Colours of request/answer pairs, and of sessions, cycled (classes of sequence.css).
PAIR_COLOURS: Final = 8
SESSION_COLOURS: Final = 6

#: The standalone page's own frame around the view.
_PAGE_CSS: Final = (
    "body { margin: 0; background: #f6f7f9; }\n"
    "header.page { padding: 10px 24px; background: #1d2330; color: #fff; }\n"
    "header.page h1 { margin: 0; font: 600 17px/1.4 system-ui, sans-serif; }\n"
    "main { padding: 0 24px 40px; }\n"
)

_ANCHOR: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def sequence_css() -> str:
    """The view's style sheet (for a page that serves it as a file)."""
    return _asset("sequence.css")


def sequence_js() -> str:
    """The view's script: optional, the view works without it."""
    return _asset("sequence.js")


def _asset(name: str) -> str:
    return (importlib.resources.files("acp_bridge.observe") / "static" / name).read_text("utf-8")


def render_sequence_body(
    records: Iterable[object],
    *,
    session: str | None = None,
    limit: int | None = DEFAULT_LIMIT,
    more: str = "",
    anchor: str = "m",
    times: bool = True,
) -> str:
    """
    The sequence view of trace records, as an HTML fragment (see :func:`render_view`).

    Args:
        records: parsed trace records (``observe.sequence.read_records``).
        session: only this session's messages.
        limit: the first this many messages (None: all).
        more: what the note on messages left out adds (how to see them).
        anchor: prefix of the messages' element ids (``m12``: the 12th record).
        times: show the records' times (False: they have none, ``history_records``).
    """
    view = build_sequence(records, session=session, limit=limit)
    return render_view(view, more=more, anchor=anchor, times=times)


def render_view(
    view: SequenceView, *, more: str = "", anchor: str = "m", times: bool = True
) -> str:
    """A view as an HTML fragment: its notes, its lanes' header, one row per message."""
    if not _ANCHOR.fullmatch(anchor):
        raise ValueError(f"not an id prefix: {anchor!r}")
    out = [
        f'<section class="acp-seq lanes-{len(view.lanes)}" aria-label="ACP messages in sequence">',
        *_head(view, more, times),
        '<div class="row lane-head" aria-hidden="true"><span class="n">#</span>'
        '<span class="t">time</span><div class="dia">',
    ]
    for i, lane in enumerate(view.lanes):
        out.append(
            f'<span class="lane l{i} {lane.kind}"><small>{lane.kind}</small>'
            f"<b>{_e(lane.name)}</b></span>"
        )
    out.append('</div><span class="txt">message</span></div>\n<ol class="seq">\n')
    sessions = {sid: i for i, sid in enumerate(view.sessions)}
    for item in view.items:
        if isinstance(item, Gap):
            out.append(_gap(item, anchor))
        else:
            out.append(_row(view, item, sessions, anchor, times))
    out.append("</ol>\n</section>\n")
    return "".join(out)


def _head(view: SequenceView, more: str, times: bool) -> list[str]:
    arrows = view.arrows
    of_session = f" of session {view.session}" if view.session is not None else ""
    if not arrows:
        stats = f"No messages{of_session} in this trace."
    else:
        links = {a.link for a in arrows}
        clients = sum(not link.startswith("agent:") for link in links)
        agents = len(links) - clients
        stats = (
            f"{_count(view.messages, 'message')}{of_session} · "
            f"{_count(len(view.sessions), 'session')} · {_count(clients, 'client')}, "
            f"{_count(agents, 'agent')}"
        )
        if times:
            start = datetime.datetime.fromtimestamp(view.start or 0, datetime.UTC)
            last = view.items[-1].t
            stats += f" · from {start:%Y-%m-%d %H:%M:%S} UTC over {last:.3f} s"
    out = ['<div class="seq-head">', f'<p class="stats">{_e(stats)}</p>']
    if view.omitted:
        shown = view.messages - view.omitted
        note = (
            f"Showing the first {shown:,} of {view.messages:,} messages{of_session}: "
            f"the other {view.omitted:,} are left out. {more}"
        )
        out.append(f'<p class="note bound" role="note">{_e(note.strip())}</p>')
    if view.dropped:
        note = (
            f"The tracer dropped {view.dropped:,} messages (it fell behind); "
            "the marks in the sequence show where."
        )
        out.append(f'<p class="note dropped" role="note">{_e(note)}</p>')
    if view.bad:
        note = f"{_count(view.bad, 'line')} of the trace {'was' if view.bad == 1 else 'were'} "
        out.append(f'<p class="note bad" role="note">{_e(note)}not a trace record (left out).</p>')
    if len(view.sessions) > 1:
        out.append('<div class="tools" hidden><label>Session <select class="pick-session">')
        out.append('<option value="">all</option>')
        out.extend(f'<option value="{_e(sid)}">{_e(sid)}</option>' for sid in view.sessions)
        out.append("</select></label>")
    else:
        out.append('<div class="tools" hidden>')
    out.append('<button type="button" class="open-all">Open every JSON</button></div></div>\n')
    return out


def _row(
    view: SequenceView, arrow: Arrow, sessions: dict[str, int], anchor: str, times: bool
) -> str:
    source, target = view.ends(arrow)
    left, span = min(source, target), abs(target - source)
    way = "ltr" if target > source else "rtl"
    lanes = view.lanes
    classes = [arrow.kind, way]
    if arrow.pair is not None:
        classes.append(f"pair-{arrow.pair % PAIR_COLOURS}")
    attrs = f' id="{anchor}{arrow.number}" class="row msg {" ".join(classes)}"'
    if arrow.pair is not None:
        attrs += f' data-partner="{anchor}{arrow.partner}"'
    if arrow.group is not None:
        attrs += f' data-session="{_e(arrow.group)}"'
    what = arrow.label + (f" (id {arrow.id})" if arrow.id is not None else "")
    title = f"{lanes[source].name} → {lanes[target].name}: {what}"
    parts = [
        f"<li{attrs}>",
        f'<a class="n" href="#{anchor}{arrow.number}">{arrow.number}</a>',
        f'<span class="t">+{arrow.t:.3f}s</span>' if times else '<span class="t"></span>',
        f'<div class="dia"><span class="arrow l{left} w{span}" title="{_e(title)}">',
        f'<span class="label">{_e(arrow.label)}</span></span></div>',
        '<div class="txt"><details><summary>',
    ]
    if arrow.session is not None:
        colour = sessions.get(arrow.group or "", 0) % SESSION_COLOURS
        parts.append(f'<span class="sid s{colour}" title="session">{_e(arrow.session)}</span> ')
    parts.append(_about(arrow, anchor))
    parts.append(f"</summary><pre>{_e(_json(arrow.msg))}</pre></details></div></li>\n")
    return "".join(parts)


def _about(arrow: Arrow, anchor: str) -> str:
    """The summary line's words: the summary, then what pairs it (link, id, time taken)."""
    out = [f'<span class="sum">{_e(arrow.summary)}</span>']
    if arrow.kind in ("result", "error"):
        asked = f" {arrow.method}" if arrow.method else ""
        if arrow.partner is not None:
            took = f" · {_duration(arrow.latency)}" if arrow.latency is not None else ""
            out.append(
                f' <a class="to" href="#{anchor}{arrow.partner}">↩ #{arrow.partner}</a>'
                f'<span class="ask">{_e(asked)} · id {_e(str(arrow.id))}{took}</span>'
            )
        else:
            out.append(f' <span class="ask">id {_e(str(arrow.id))}: its request is not here</span>')
    elif arrow.id is not None:
        out.append(f' <span class="ask">id {_e(arrow.id)}</span>')
        if arrow.pair is not None:
            out.append(f' <a class="to" href="#{anchor}{arrow.partner}">→ #{arrow.partner}</a>')
        elif arrow.partner is not None:
            out.append(
                f' <span class="to none">answered in #{arrow.partner}, past the limit</span>'
            )
        else:
            out.append(' <span class="to none">no answer in this trace</span>')
    return "".join(out)


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _gap(gap: Gap, anchor: str) -> str:
    text = f"⚠ {_count(gap.dropped, 'message')} not recorded here: the tracer fell behind"
    return (
        f'<li id="{anchor}{gap.number}" class="row gap"><span class="n">{gap.number}</span>'
        f'<span class="t">+{gap.t:.3f}s</span><div class="dia"></div>'
        f'<div class="txt">{_e(text)}</div></li>\n'
    )


def _json(msg: object) -> str:
    try:
        text = json.dumps(msg, indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):  # nested deeper than the encoder goes
        return "(nested too deep to show: see the trace)"
    if len(text) > MAX_JSON_CHARS:
        rest = len(text) - MAX_JSON_CHARS
        cut = f"… {rest:,} more characters (the whole message is in the trace)"
        text = f"{text[:MAX_JSON_CHARS]}\n{cut}"
    return text


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _e(text: str) -> str:
    """Escaped for element text and double-quoted attributes; lone surrogates replaced."""
    return html.escape(text.encode("utf-8", "replace").decode("utf-8"), quote=True)


def render_sequence_page(body: str, *, title: str) -> str:
    """
    A self-contained page around a body: CSS and script inline, nothing fetched. Its
    Content-Security-Policy lets exactly these two run (their hashes) and loads nothing else.
    """
    css, js = _PAGE_CSS + sequence_css(), sequence_js()
    csp = (
        f"default-src 'none'; style-src '{_sha256(css)}'; script-src '{_sha256(js)}'; "
        "base-uri 'none'; form-action 'none'"
    )
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(csp)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{css}</style>\n</head>\n<body>\n"
        f'<header class="page"><h1>{_e(title)}</h1></header>\n<main>\n{body}</main>\n'
        f"<script>{js}</script>\n</body>\n</html>\n"
    )


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def main_trace_html(
    path: str, *, output: str | None, session: str | None, limit: int | None
) -> int:
    """
    ``acp-bridge trace show FILE --html [--output OUT] [--limit N]``: the page to OUT (mode
    0600: it holds the prompts) or stdout; 1 if FILE cannot be read or OUT written.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            view = build_sequence(read_records(f), session=session, limit=limit)
    except OSError as exc:
        print(f"acp-bridge trace: {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    more = "Raise the bound with --limit N (0: no bound), or pick a session with --session ID."
    body = render_view(view, more=more)
    page = render_sequence_page(body, title=f"acp-bridge trace · {os.path.basename(path)}")
    if output is None:
        try:
            sys.stdout.write(page)
            sys.stdout.flush()
        except BrokenPipeError:  # `... --html | head`: the reader has seen enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(page)
    except OSError as exc:
        print(f"acp-bridge trace: {output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    shown = view.messages - view.omitted
    left = f", {view.omitted:,} left out past --limit" if view.omitted else ""
    print(f"acp-bridge trace: wrote {output} ({shown:,} messages{left})", file=sys.stderr)
    return 0
