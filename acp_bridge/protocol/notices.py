"""
Notices, pure: ACP's ``notice`` session updates, for clients that advertise
``clientCapabilities.session.notices``; which of the bridge's own diagnostics become one, and
what each says.

A notice is live, not session history (the schema: "information for the user that is not
part of session history"): the bridge sends its own to the session's client (and its
watchers) and relays an agent's, and neither goes into the replay history or the journal.
Only a client that advertised the capability gets any. The bridge's own are bounded per connection
(:data:`NOTICE_RATE`, :data:`NOTICE_BURST`); what the bound holds back is counted and told
in one notice later (:func:`suppressed_notice`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterable

    from acp_bridge.protocol.jsonrpc import JsonObject

#: the ``sessionUpdate`` of a notice
NOTICE: Final = "notice"
#: the bridge's notices to one connection: a token bucket (notices a second, burst)
NOTICE_RATE: Final = 1.0
NOTICE_BURST: Final = 10.0
#: seconds after the first notice the bound held back that the count of them is told
NOTICE_SUMMARY_DELAY: Final = 10.0
#: characters of a title and of a description at most (longer ones are cut, with "…")
TITLE_MAX: Final = 120
DESCRIPTION_MAX: Final = 2000


class Notice(NamedTuple):
    """What one notice says: ``severity`` is ``info``, ``warning`` or ``error``."""

    severity: str
    title: str
    description: str | None = None


def wants_notices(capabilities: JsonObject) -> bool:
    """Whether a client's ``clientCapabilities`` advertise ``session.notices`` (an object)."""
    session = capabilities.get("session")
    return isinstance(session, dict) and isinstance(session.get("notices"), dict)


def is_notice(update: Any) -> bool:
    """Whether a ``session/update``'s ``update`` is a notice."""
    return isinstance(update, dict) and update.get("sessionUpdate") == NOTICE


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def notice_params(session_id: str, notice: Notice) -> JsonObject:
    """The params of the ``session/update`` that carries ``notice`` on a session."""
    update: JsonObject = {
        "sessionUpdate": NOTICE,
        "severity": notice.severity,
        "title": _cut(notice.title, TITLE_MAX) or "Notice",
    }
    if notice.description:
        update["description"] = _cut(notice.description, DESCRIPTION_MAX)
    return {"sessionId": session_id, "update": update}


def exit_notice(
    agent: str, status: int | None, reason: str, crash_loop: tuple[int, float] | None
) -> Notice:
    """
    The agent exited (or was stopped: ``reason``, as the bridge says it); ``crash_loop``:
    (deaths, window) when it will not be restarted for now.
    """
    said = f" (status {status})" if status is not None else ""
    if reason.startswith("was stopped"):
        title = f"Agent {agent!r} was stopped{said}"
    else:
        title = f"Agent {agent!r} exited{said}"
    if crash_loop is not None:
        deaths, window = crash_loop
        return Notice(
            "error",
            f"{title}; not restarting",
            f"It {reason}. It ended {deaths} times in {window:g}s, so it is not started again "
            "until that calms down; its sessions ended.",
        )
    return Notice(
        "error",
        f"{title}; restarting when needed",
        f"It {reason}. Its sessions ended; the next session/new or session/load starts it again.",
    )


def restart_notice(agent: str, delay: float) -> Notice:
    """The agent is being started again, after ``delay`` seconds of backoff."""
    when = f"in {delay:g}s (backoff after recent exits)" if delay > 0 else "now"
    return Notice("info", f"Agent {agent!r} restarting", f"It starts again {when}.")


def stderr_notice(agent: str, line: str) -> Notice:
    """An error-level line on the agent's stderr (redacted by the caller)."""
    return Notice("error", f"Agent {agent!r} reported an error", line)


def policy_notice(tool: str | None, verdict: str, source: str, detail: str | None) -> Notice:
    """
    A permission request the policy answered without a human: ``verdict`` (``deny`` or
    ``cancelled``) by ``source`` (a rule's id, ``default``, ``deny_paths``, ``unattended``,
    ``timeout``, ``max_agent_requests``), ``detail`` saying why.
    """
    what = f": {tool}" if tool else ""
    title = ("Permission denied" if verdict == "deny" else "Permission request cancelled") + what
    if source == "timeout":
        why = f"Nobody answered in time ({detail})" if detail else "Nobody answered in time"
    elif source == "unattended":
        why = f"Nobody can answer it: {detail}" if detail else "Nobody can answer it"
    elif source == "deny_paths":
        why = f"It names a protected file: {detail}" if detail else "It names a protected file"
    elif source == "max_agent_requests":
        why = f"Too many requests wait already: {detail}" if detail else "Too many requests wait"
    elif source == "default":
        why = "The approval policy's default" + (f": {detail}" if detail else "")
    else:
        why = f"The approval rule {source!r}" + (f": {detail}" if detail else "")
    return Notice("warning", title, why + ".")


def setup_notice(agent: str, stripped: Iterable[str]) -> Notice:
    """Parts of a session's setup the agent cannot take, dropped before it got them."""
    return Notice(
        "warning",
        f"Agent {agent!r} cannot take all of this session's setup",
        "Left out: " + "; ".join(stripped) + ".",
    )


def suppressed_notice(count: int) -> Notice:
    """``count`` notices the bound held back."""
    return Notice(
        "warning",
        f"{count} more notice{'s' if count != 1 else ''} not shown",
        f"More than {NOTICE_BURST:g} at once, then {NOTICE_RATE:g} a second, came for this "
        "connection: the rest were dropped. The bridge's log has them all.",
    )


__all__ = [
    "DESCRIPTION_MAX",
    "NOTICE",
    "NOTICE_BURST",
    "NOTICE_RATE",
    "NOTICE_SUMMARY_DELAY",
    "TITLE_MAX",
    "Notice",
    "exit_notice",
    "is_notice",
    "notice_params",
    "policy_notice",
    "restart_notice",
    "setup_notice",
    "stderr_notice",
    "suppressed_notice",
    "wants_notices",
]
