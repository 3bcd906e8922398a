"""The approval console in a real headless Chromium (Debian's), driven by Playwright.

The bridge runs here under trio with the real demo agent (a subprocess); the browser is driven
from one worker thread with Playwright's sync API (Playwright is asyncio-only; its sync objects
belong to the thread that made them), which calls back into trio (``trio.from_thread.run``) to
act as the attended client. Every wait is on a selector or an event, bounded.

Screenshots: each run takes them (in a temporary directory); with ``ACP_BRIDGE_SCREENSHOTS=DIR``
they are written to DIR too (``docs/img`` for docs/console.md).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import pathlib
import shutil
import sys
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from acp_bridge.agents.process import make_subprocess_launcher
from acp_bridge.config.model import AgentConfig, Config, WebSocketConfig
from acp_bridge.engine.bridge import Bridge
from acp_bridge.faces.serve import serve_websocket
from acp_bridge.observe.redact import Redactor
from acp_bridge.observe.trace import open_wire_trace
from acp_bridge.policy.rules import Policy
from tests.support.fakes import TestClient, connect

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from acp_bridge.faces.serve import ListenInfo

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="Playwright is not installed (the test extra: pip install -e .[test])",
)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(
        "Chromium is missing (Debian: apt-get install chromium; ./scripts/test does it as root)",
        allow_module_level=True,
    )

TOKEN = "console-browser-" + "t" * 32
TIMEOUT = 60
#: milliseconds for each browser wait
WAIT_MS = 20_000
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEMO = (sys.executable, "-m", "acp_bridge", "demo-agent")


@attrs.define
class Daemon:
    bridge: Bridge
    info: ListenInfo
    nursery: trio.Nursery
    #: the sessions' cwd: nothing touches it (the client, this test, does the writes)
    cwd: str = "/home/me/project"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.info.port}"

    @property
    def login(self) -> str:
        return f"{self.base}/console?token={TOKEN}"

    async def client(self) -> TestClient:
        return await connect(self.bridge, self.nursery, name="editor")

    async def ask_write(self, client: TestClient, *, unattended: bool = False) -> str:
        """A session of the demo agent, prompted to write a file: it asks permission first."""
        meta = {"acp_bridge": {"agent": "demo", "unattended": unattended}}
        sid = await client.new_session(cwd=self.cwd, _meta=meta)
        self.nursery.start_soon(client.prompt, sid, "write notes.txt hello from the agent")
        return sid


@contextlib.asynccontextmanager
async def open_daemon(
    *, policy: Policy | None = None, trace: bool = False
) -> AsyncIterator[Daemon]:
    """The bridge with the demo agent and its listener; ``trace``: traced (to memory)."""
    config = Config(
        agents={"demo": AgentConfig(name="demo", command=DEMO[0], args=DEMO[1:])},
        websocket=WebSocketConfig(port=0, token=TOKEN),
        policy=policy or Policy(),
    )
    async with (
        open_wire_trace(io.BytesIO() if trace else None, redactor=Redactor()) as tracer,
        trio.open_nursery() as nursery,
    ):
        launcher = make_subprocess_launcher()
        bridge: Bridge = await nursery.start(Bridge(config, launcher, tracer=tracer).run)
        info = await nursery.start(functools.partial(serve_websocket, bridge, config))
        yield Daemon(bridge, info, nursery)
        nursery.cancel_scope.cancel()


async def in_browser(script: Callable[[Any], None]) -> None:
    """Run ``script(browser)`` in one worker thread with a fresh headless Chromium."""

    def run() -> None:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=WAIT_MS
            )
            try:
                script(browser)
            finally:
                browser.close()

    await trio.to_thread.run_sync(run, abandon_on_cancel=True)


def screenshot(page: Any, tmp_path: pathlib.Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("ACP_BRIDGE_SCREENSHOTS")
    if target:
        pathlib.Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, pathlib.Path(target) / name)


def card(page: Any, title: str = "Write notes.txt") -> Any:
    return page.locator("article.request", has=page.get_by_role("heading", name=title))


def is_permission(msg: dict[str, Any]) -> bool:
    return msg.get("method") == "session/request_permission"


def agent_text(client: TestClient, sid: str) -> str:
    return "".join(client.updates(sid))


async def test_an_attended_approval_is_answered_with_a_click(tmp_path):
    """The client's pending approval is on the page with its diff; a click on "Allow once"
    answers it: the client gets permission_resolved, the agent the option (it goes on to write
    through the client)."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon() as daemon:
            client = await daemon.client()
            sid = await daemon.ask_write(client)
            ask = await client.agent_requests.receive()
            assert is_permission(ask)

            def script(browser: Any) -> None:
                page = browser.new_page(viewport={"width": 1100, "height": 760})
                page.goto(daemon.login)
                assert page.url == f"{daemon.base}/console"  # the token left the address
                request = card(page)
                request.wait_for(timeout=WAIT_MS)
                diff = request.locator("pre.diff")
                assert diff.inner_text().strip() == "@@ -0,0 +1 @@\n+hello from the agent"
                assert "also shown to editor" in request.inner_text()
                screenshot(page, tmp_path, "console-pending.png")
                request.get_by_role("button", name="Allow once").click()
                sync_api.expect(request.locator(".outcome")).to_have_text(
                    "Answered here: Allow once", timeout=WAIT_MS
                )

            await in_browser(script)
            note = await client.wait_for(
                lambda m: m.get("method") == "_acp_bridge/permission_resolved"
            )
            write = await client.agent_requests.receive()  # the agent got "allow-once"
            await client.send({"jsonrpc": "2.0", "id": write["id"], "result": None})
            await client.wait_for(lambda m: "Wrote" in agent_text(client, sid))
    assert note["params"]["requestId"] == ask["id"]
    assert note["params"]["outcome"] == {"outcome": "selected", "optionId": "allow-once"}
    assert note["params"]["reason"] == "console"
    assert write["method"] == "fs/write_text_file"


async def test_an_unattended_request_appears_live_and_reject_reaches_the_agent(tmp_path):
    """With unattended = "console", an open page shows the request as it comes (no reload);
    a click on Reject reaches the agent."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon(policy=Policy(unattended="console")) as daemon:
            client = await daemon.client()
            sids: list[str] = []

            async def ask() -> None:
                sids.append(await daemon.ask_write(client, unattended=True))

            def script(browser: Any) -> None:
                page = browser.new_page(viewport={"width": 1100, "height": 700})
                navigations: list[str] = []
                page.on("framenavigated", lambda frame: navigations.append(frame.url))
                page.goto(daemon.login)
                sync_api.expect(page.locator("#status")).to_have_text("live", timeout=WAIT_MS)
                sync_api.expect(page.locator("#empty")).to_be_visible()
                before = len(navigations)
                trio.from_thread.run(ask)
                request = card(page)
                request.wait_for(timeout=WAIT_MS)
                assert "only the console can answer" in request.inner_text()
                assert len(navigations) == before  # it came over the live channel
                screenshot(page, tmp_path, "console-unattended.png")
                request.get_by_role("button", name="Reject").click()
                sync_api.expect(request.locator(".outcome")).to_have_text(
                    "Answered here: Reject", timeout=WAIT_MS
                )

            await in_browser(script)
            (sid,) = sids
            await client.wait_for(lambda m: "Permission denied" in agent_text(client, sid))
    assert not [m for m in client.received if is_permission(m)]


async def test_two_pages_race_on_one_request_one_wins(tmp_path):
    """Both pages click at once: exactly one answer reaches the agent; the other page shows
    the request settled by the console."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon(policy=Policy(unattended="console")) as daemon:
            client = await daemon.client()
            sid = await daemon.ask_write(client, unattended=True)
            outcomes: list[str] = []

            def script(browser: Any) -> None:
                context = browser.new_context()
                pages = [context.new_page(), context.new_page()]
                pages[0].goto(daemon.login)  # (the cookie is the context's: both are logged in)
                pages[1].goto(f"{daemon.base}/console")
                for page in pages:
                    card(page).wait_for(timeout=WAIT_MS)
                # Both clicks leave before either page hears of the other's.
                for page, name in zip(pages, ("Reject", "Allow once"), strict=True):
                    page.evaluate(
                        "(name) => [...document.querySelectorAll('article.request button')]"
                        ".find((b) => b.textContent === name).click()",
                        name,
                    )
                for page in pages:
                    outcome = card(page).locator(".outcome")
                    sync_api.expect(outcome).not_to_be_empty(timeout=WAIT_MS)
                    sync_api.expect(card(page)).to_have_attribute("data-state", "settled")
                    outcomes.append(outcome.inner_text())

            await in_browser(script)
            await client.wait_for(lambda m: agent_text(client, sid).count(".") >= 1)
    winners = [o for o in outcomes if o.startswith("Answered here")]
    assert len(winners) == 1, outcomes
    (loser,) = [o for o in outcomes if o not in winners]
    assert "settled by the console" in loser.lower(), outcomes
    text = agent_text(client, sid)
    if winners[0].endswith("Reject"):
        assert "Permission denied" in text
    else:
        assert "Permission denied" not in text


async def test_a_page_without_the_cookie_gets_401(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with open_daemon() as daemon:
            client = await daemon.client()
            await daemon.ask_write(client)
            await client.agent_requests.receive()
            seen: list[Any] = []

            def script(browser: Any) -> None:
                page = browser.new_page()
                response = page.goto(f"{daemon.base}/console")
                seen.append((response.status, page.content()))
                wrong = page.goto(f"{daemon.base}/console?token=wrong")
                seen.append((wrong.status, page.content()))

            await in_browser(script)
    for status, content in seen:
        assert status == 401
        assert "notes.txt" not in content
        assert "log in" not in content or "login link" in content


async def test_a_forged_cross_origin_answer_gets_403(tmp_path):
    """A page of another origin on the same host (same site: the cookie goes along) posts an
    answer: 403, and the request still waits."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon() as daemon:
            client = await daemon.client()
            await daemon.ask_write(client)
            await client.agent_requests.receive()
            (entry,) = daemon.bridge.approvals.desk.waiting()
            forged = json.dumps({"id": entry.extra.console_id, "optionId": "allow-once"})
            statuses: list[int] = []
            evil = f"http://127.0.0.1:{daemon.info.port + 1}"

            def script(browser: Any) -> None:
                context = browser.new_context()
                page = context.new_page()
                page.goto(daemon.login)  # logged in: the browser holds the session cookie
                card(page).wait_for(timeout=WAIT_MS)
                # The classic forged JSON post: a text/plain form whose one field spells JSON.
                name, value = forged[:-2] + ', "x": "', '"}'
                form = (
                    f'<form method="post" action="{daemon.base}/console/answer" '
                    f"enctype=\"text/plain\"><input name='{name}' value='{value}'></form>"
                )
                context.route(
                    f"{evil}/**",
                    lambda route: route.fulfill(status=200, content_type="text/html", body=form),
                )
                attacker = context.new_page()
                attacker.goto(f"{evil}/")
                with attacker.expect_response(f"{daemon.base}/console/answer") as info:
                    attacker.locator("form").evaluate("(form) => form.submit()")
                statuses.append(info.value.status)
                headers = info.value.request.all_headers()
                statuses.append(1 if headers.get("origin") == evil else 0)
                # Same site: the session cookie went along; only Origin (and CSRF) stop it.
                statuses.append(1 if "acp_console_" in headers.get("cookie", "") else 0)

            await in_browser(script)
            still = len(daemon.bridge.approvals.desk.waiting())
    assert statuses == [403, 1, 1]
    assert still == 1
