"""The console's session tree (and session pages) in a real headless Chromium: the setup of
``test_console_browser.py`` (a bridge under trio with the demo agent, Playwright in a worker
thread); every wait is on a selector, bounded."""

from __future__ import annotations

from typing import Any

import trio

from tests.interop.test_console_browser import (
    TIMEOUT,
    WAIT_MS,
    in_browser,
    open_daemon,
    screenshot,
    sync_api,
)


async def test_the_session_tree_lists_the_agent_its_session_and_the_owner(tmp_path):
    """A session of the demo agent is on the page under its agent, with its owner connection,
    its watchers and the approval it waits on."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon() as daemon:
            client = await daemon.client()
            sid = await daemon.ask_write(client)
            await client.agent_requests.receive()  # the permission request: it is pending

            def script(browser: Any) -> None:
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                page.goto(daemon.login)
                agent = page.locator('li.agent[data-agent="demo"]')
                node = agent.locator(f'li.session[data-session="{sid}"]')
                sync_api.expect(node).to_contain_text("1 pending", timeout=WAIT_MS)
                text = node.inner_text()
                assert "owner editor" in text
                assert "0 watching" in text
                sync_api.expect(page.locator("#session-count")).to_have_text("1")
                screenshot(page, tmp_path, "console-sessions.png")

            await in_browser(script)
