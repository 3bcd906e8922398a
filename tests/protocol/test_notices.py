"""What the bridge's notices say, and who takes them (pure: no trio)."""

from __future__ import annotations

import pytest

from acp_bridge.protocol.diagnostics import LogBudget
from acp_bridge.protocol.notices import (
    DESCRIPTION_MAX,
    NOTICE_BURST,
    NOTICE_RATE,
    TITLE_MAX,
    Notice,
    exit_notice,
    is_notice,
    notice_params,
    policy_notice,
    restart_notice,
    setup_notice,
    stderr_notice,
    suppressed_notice,
    wants_notices,
)
from tests.support.v1_schema import check_to_client


@pytest.mark.parametrize(
    ("caps", "wanted"),
    [
        ({"session": {"notices": {}}}, True),
        ({"session": {"notices": {"_meta": {}}}}, True),
        ({"session": {"notices": None}}, False),
        ({"session": {"notices": True}}, False),
        ({"session": {}}, False),
        ({"session": None}, False),
        ({}, False),
    ],
)
def test_only_an_object_at_session_notices_advertises_them(caps, wanted):
    assert wants_notices(caps) is wanted


def test_a_notice_is_told_by_its_kind():
    assert is_notice({"sessionUpdate": "notice", "severity": "info", "title": "x"})
    assert not is_notice({"sessionUpdate": "agent_message_chunk"})
    assert not is_notice(["notice"])
    assert not is_notice(None)


def every_notice() -> list[Notice]:
    return [
        exit_notice("codex", 1, "exited", None),
        exit_notice("codex", None, "was stopped: it stopped reading its input", None),
        exit_notice("codex", 3, "exited", (5, 60.0)),
        restart_notice("codex", 2.0),
        restart_notice("codex", 0.0),
        stderr_notice("codex", "ERROR: boom"),
        policy_notice("rm -rf build", "deny", "no-deletes", None),
        policy_notice(None, "cancelled", "default", "no such option is offered"),
        policy_notice("edit x", "deny", "timeout", "no answer within 60s"),
        policy_notice("edit x", "deny", "unattended", "no client attached"),
        policy_notice("read .env", "deny", "deny_paths", "'.env' matches '.env*'"),
        policy_notice("edit x", "cancelled", "max_agent_requests", "64 wait"),
        setup_notice("codex", ["additionalDirectories", "mcpServers: http server 'docs'"]),
        suppressed_notice(1),
        suppressed_notice(30),
    ]


@pytest.mark.parametrize("notice", every_notice(), ids=lambda n: n.title)
def test_every_notice_is_a_valid_session_update(notice):
    assert notice.severity in ("info", "warning", "error")
    assert 0 < len(notice.title) <= TITLE_MAX
    msg = {"jsonrpc": "2.0", "method": "session/update", "params": notice_params("s1", notice)}
    check_to_client(msg)


def test_titles_are_short_and_plain():
    assert exit_notice("codex", 1, "exited", None).title == (
        "Agent 'codex' exited (status 1); restarting when needed"
    )
    assert exit_notice("codex", 1, "exited", (5, 60.0)).title == (
        "Agent 'codex' exited (status 1); not restarting"
    )
    assert "5 times in 60s" in (exit_notice("codex", 1, "exited", (5, 60.0)).description or "")
    assert exit_notice("codex", -9, "was stopped: it stalled", None).title.startswith(
        "Agent 'codex' was stopped (status -9)"
    )
    assert policy_notice("rm x", "deny", "no-deletes", None) == Notice(
        "warning", "Permission denied: rm x", "The approval rule 'no-deletes'."
    )
    assert policy_notice("rm x", "cancelled", "timeout", "no answer within 60s") == Notice(
        "warning",
        "Permission request cancelled: rm x",
        "Nobody answered in time (no answer within 60s).",
    )


def test_long_texts_are_cut_and_an_empty_title_is_never_sent():
    params = notice_params("s1", Notice("error", "t" * 500, "d" * 50_000))
    update = params["update"]
    assert len(update["title"]) == TITLE_MAX
    assert update["title"].endswith("…")
    assert len(update["description"]) == DESCRIPTION_MAX
    assert notice_params("s1", Notice("info", ""))["update"] == {
        "sessionUpdate": "notice",
        "severity": "info",
        "title": "Notice",
    }


def test_the_bound_lets_a_burst_through_then_one_a_second():
    budget = LogBudget(rate=NOTICE_RATE, burst=NOTICE_BURST)
    assert sum(budget.take(0.0) for _ in range(50)) == NOTICE_BURST
    assert budget.suppressed == 50 - NOTICE_BURST
    assert budget.take(1.0)
    assert not budget.take(1.0)
    assert budget.take_suppressed() == 50 - NOTICE_BURST + 1
