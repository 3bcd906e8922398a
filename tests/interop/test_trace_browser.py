"""The trace's sequence view (`acp-bridge trace show FILE --html`) in a real headless Chromium.

A real trace (``acp-bridge stdio --trace`` with the demo agent, tests/e2e/test_observe_sequence.py)
rendered by the command, opened from its file: every message is an arrow, in order, with its
label; each arrow runs between the lanes its record names; the page fetches nothing; the JSON
opens on demand; hostile content stays text. Driven like the console's browser tests (Debian's
Chromium through Playwright, skipped with the reason when missing); the screenshot goes to
docs/img with ``ACP_BRIDGE_SCREENSHOTS=docs/img`` (docs/diagnostics.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from acp_bridge.cli.main import main
from acp_bridge.observe.sequence import read_records
from acp_bridge.observe.sequence_html import render_sequence_body, render_sequence_page
from tests.e2e.test_observe_sequence import expected_labels, record_demo_trace
from tests.interop.test_console_browser import WAIT_MS, in_browser, screenshot, sync_api
from tests.observe.test_sequence import HOSTILE, hostile_records
from tests.observe.test_trace import TRACE

if TYPE_CHECKING:
    import pathlib

TIMEOUT = 60


def _centres(page: Any) -> dict[str, float]:
    """Each lane's centre (x, in pixels), by the lane's name."""
    centres = {}
    for lane in page.locator(".lane").all():
        box = lane.bounding_box()
        centres[lane.locator("b").inner_text()] = box["x"] + box["width"] / 2
    return centres


def _watch_requests(page: Any) -> list[str]:
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    return urls


async def test_every_message_of_a_real_trace_is_an_arrow_in_order_between_its_lanes(tmp_path):
    trace, html = tmp_path / "trace.jsonl", tmp_path / "trace.html"
    records = await record_demo_trace(trace)
    assert main(["trace", "show", str(trace), "--html", "--output", str(html)]) == 0
    labels = expected_labels(records)

    def script(browser: Any) -> None:
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        urls = _watch_requests(page)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.append(message.text))
        page.goto(html.as_uri())
        arrows = page.locator("li.row.msg .arrow")
        assert arrows.count() == len(records)
        assert page.locator("li.row.msg .arrow .label").all_inner_texts() == labels
        ids = page.locator("li.row.msg").evaluate_all("rows => rows.map(row => row.id)")
        assert ids == [f"m{i}" for i in range(1, len(records) + 1)]

        # Each arrow runs from its sender's lane centre to its receiver's, head first.
        centres = _centres(page)
        assert list(centres) == ["stdio", "bridge", "demo"]
        for arrow, record in zip(arrows.all(), records, strict=True):
            peer = centres[record["link"].split(":", 1)[1]]
            ends = sorted((peer, centres["bridge"]))
            box = arrow.bounding_box()
            assert abs(box["x"] - ends[0]) < 2
            assert abs(box["x"] + box["width"] - ends[1]) < 2
            row = arrow.locator("xpath=ancestor::li[1]")
            way = "rtl" if (record["dir"] == "in") == (peer > centres["bridge"]) else "ltr"
            assert way in (row.get_attribute("class") or "").split()

        # The client's answer to the permission request, its JSON opened: what the docs show.
        ask = page.locator("li.row.msg", has=page.locator(".label", has_text="request_permission"))
        answer = page.locator(f"#{ask.last.get_attribute('data-partner')}")
        answer.locator("summary").click(position={"x": 6, "y": 10})
        pre = answer.locator("pre")
        sync_api.expect(pre).to_be_visible(timeout=WAIT_MS)
        assert '"optionId": "allow-once"' in pre.inner_text()
        page.mouse.move(0, 0)
        screenshot(page, tmp_path, "trace-sequence.png")

        # A request's link leads to its answer, and back.
        ask.first.locator("a.to").click()
        partner = ask.first.get_attribute("data-partner")
        assert page.evaluate("document.querySelector(':target').id") == partner
        page.locator(f"#{partner} a.to").click()
        target = page.evaluate("document.querySelector(':target').id")
        assert target == ask.first.get_attribute("id")

        # The script's "open every JSON".
        page.get_by_role("button", name="Open every JSON").click()
        assert page.locator("li.row.msg details[open]").count() == len(records)
        assert errors == []
        assert urls == [html.as_uri()]  # nothing fetched but the page itself

    with trio.fail_after(TIMEOUT):
        await in_browser(script)


async def test_hostile_content_stays_text_in_the_browser(tmp_path: pathlib.Path):
    """Scripts, handlers and frames in a trace's content run nothing and load nothing."""
    html = tmp_path / "hostile.html"
    body = render_sequence_body(hostile_records())
    html.write_text(render_sequence_page(body, title=HOSTILE[0]), encoding="utf-8")

    def script(browser: Any) -> None:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        urls = _watch_requests(page)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(html.as_uri())
        page.get_by_role("button", name="Open every JSON").click()
        for row in page.locator("li.row.msg").all()[:8]:
            row.hover()
        assert page.locator("li.row.msg").count() == len(hostile_records())
        assert page.locator("img, iframe").count() == 0
        assert page.locator("script").count() == 1  # the page's own
        assert page.evaluate("window.pwned") is None
        assert page.title() == HOSTILE[0]
        text = page.locator("ol.seq").inner_text()
        assert HOSTILE[0] in text
        assert dialogs == []
        assert urls == [html.as_uri()]

    with trio.fail_after(TIMEOUT):
        await in_browser(script)


async def test_the_session_picker_hides_the_other_sessions(tmp_path: pathlib.Path):
    """With the script, picking a session leaves its messages (both links) and hides the rest."""
    html = tmp_path / "sessions.html"
    html.write_text(render_sequence_page(render_sequence_body(read_records(TRACE)), title="t"))

    def script(browser: Any) -> None:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(html.as_uri())
        rows = page.locator("li.row.msg")
        total = rows.count()
        page.get_by_label("Session").select_option("nope")
        visible = page.locator("li.row.msg:visible")
        assert visible.count() == 2
        assert visible.locator(".label").all_inner_texts() == ["session/prompt", "error"]
        page.get_by_label("Session").select_option("s1~b")
        labels = visible.locator(".label").all_inner_texts()
        assert labels[:4] == ["session/new", "session/new", "result", "result"]  # both links
        page.get_by_label("Session").select_option("")
        assert visible.count() == total

    with trio.fail_after(TIMEOUT):
        await in_browser(script)
