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


async def test_the_session_page_follows_a_session_live_and_answers_its_approval(tmp_path):
    """Opened on a session before it is prompted, the page shows the user's prompt, the
    agent's tool call with its diff and the pending approval as they come (no reload); Allow
    once there settles it for the owner too (permission_resolved), and the agent's reply
    after the write appears in order."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon() as daemon:
            client = await daemon.client()
            meta = {"acp_bridge": {"agent": "demo"}}
            sid = await client.new_session(cwd=daemon.cwd, _meta=meta)
            asked: list[dict[str, Any]] = []

            async def answer_the_write() -> None:
                asked.append(await client.agent_requests.receive())  # the permission request
                write = await client.agent_requests.receive()  # then the write itself
                asked.append(write)
                await client.send({"jsonrpc": "2.0", "id": write["id"], "result": None})

            daemon.nursery.start_soon(answer_the_write)

            def prompt() -> None:
                text = "write notes.txt hello from the agent"
                daemon.nursery.start_soon(client.prompt, sid, text)

            def script(browser: Any) -> None:
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                navigations: list[str] = []
                page.goto(daemon.login)
                page.goto(f"{daemon.base}/console/session?id={sid}")
                page.on("framenavigated", lambda frame: navigations.append(frame.url))
                sync_api.expect(page.locator("#status")).to_have_text("live", timeout=WAIT_MS)
                trio.from_thread.run_sync(prompt)
                log = page.locator("#log")
                sync_api.expect(log.locator("li.user")).to_contain_text(
                    "write notes.txt hello from the agent", timeout=WAIT_MS
                )
                tool = log.locator("li.tool")
                sync_api.expect(tool.locator("pre.diff")).to_contain_text(
                    "+hello from the agent", timeout=WAIT_MS
                )
                request = page.locator("article.request")
                request.wait_for(timeout=WAIT_MS)
                screenshot(page, tmp_path, "console-session.png")
                request.get_by_role("button", name="Allow once").click()
                sync_api.expect(request.locator(".outcome")).to_have_text(
                    "Answered here: Allow once", timeout=WAIT_MS
                )
                sync_api.expect(log.locator("li.agent").last).to_contain_text(
                    "Wrote", timeout=WAIT_MS
                )
                kinds = log.locator("> li").evaluate_all(
                    "(items) => items.map(i => i.dataset.kind)"
                )
                assert kinds[0] == "user"
                assert kinds.index("tool") < len(kinds) - 1
                assert kinds[-1] == "agent"
                assert navigations == []  # followed live, never reloaded

            await in_browser(script)
            note = await client.wait_for(
                lambda m: m.get("method") == "_acp_bridge/permission_resolved"
            )
    assert note["params"]["requestId"] == asked[0]["id"]
    assert note["params"]["reason"] == "console"
    assert note["params"]["outcome"] == {"outcome": "selected", "optionId": "allow-once"}
    assert asked[1]["method"] == "fs/write_text_file"


async def test_the_sequence_view_renders_the_sessions_messages_in_order(tmp_path):
    """From the session page, its sequence view: every message of the session on both links
    (the editor's and the agent's), in the order the bridge saw them, request before answer;
    the agent's words in the order it said them; its script opens every message's JSON."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon(trace=True) as daemon:
            client = await daemon.client()
            sid = await client.new_session(cwd=daemon.cwd, _meta={"acp_bridge": {"agent": "demo"}})
            await client.prompt(sid, "hello sequence view")
            await client.prompt(sid, "count 3")
            assert daemon.bridge.trace is not None
            await daemon.bridge.trace.wait_flushed()

            def script(browser: Any) -> None:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(daemon.login)
                page.goto(f"{daemon.base}/console/session?id={sid}")
                page.locator("#sequence-link").click()
                rows = page.locator("ol.seq > li.msg")
                rows.first.wait_for(timeout=WAIT_MS)
                seen = rows.evaluate_all(
                    """(rows) => rows.map(r => ({
                        label: r.querySelector('.label').textContent,
                        dir: r.classList.contains('ltr') ? 'ltr' : 'rtl',
                        sum: r.querySelector('.sum').textContent,
                        n: Number(r.querySelector('a.n').textContent)}))"""
                )
                assert [row["n"] for row in seen] == sorted(row["n"] for row in seen)
                # (The agent's stderr, relayed as _acp_bridge/log, races its stdout: left out.)
                acp = [row for row in seen if row["label"] != "_acp_bridge/log"]
                labels = [row["label"] for row in acp]
                assert labels[:4] == ["session/new", "session/new", "result", "result"]
                prompts = [i for i, label in enumerate(labels) if label == "session/prompt"]
                assert len(prompts) == 4  # two turns, each on both links
                assert labels[-2:] == ["result", "result"]  # the last turn's end, both links
                assert "end_turn" in acp[-1]["sum"]
                assert [row["dir"] for row in acp[-2:]] == ["rtl", "rtl"]
                # The agent's words, once per link, in the order it said them.
                said = [
                    row["sum"]
                    for row in seen
                    if row["label"] == "session/update" and "agent_message_chunk" in row["sum"]
                ]
                words = "".join(s.split('"')[1] for s in said[::2] if '"' in s)
                assert "You said: hello sequence view" in words
                sync_api.expect(page.get_by_role("button", name="Open every JSON")).to_be_visible()
                page.get_by_role("button", name="Open every JSON").click()
                opened = page.locator("ol.seq details[open]")
                sync_api.expect(opened).to_have_count(len(seen))
                page.get_by_role("button", name="Close every JSON").click()
                screenshot(page, tmp_path, "console-sequence.png")

            await in_browser(script)
