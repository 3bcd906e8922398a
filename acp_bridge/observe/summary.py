"""
One line about an ACP message, for a person: what ``acp-bridge trace show`` prints after the
method, and what the sequence view (``observe.sequence``) writes beside each arrow. Pure.

Texts taken from a message (prompt text, update text, titles, error messages) are excerpts:
quoted as JSON strings, so that where one ends is never in doubt, new lines shown as ``⏎`` and
cut to a width.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from acp_bridge.protocol.jsonrpc import JsonObject

__all__ = [
    "EXCERPT",
    "excerpt",
    "request_summary",
    "response_summary",
    "session_of",
    "text_of",
]

#: Text excerpts, at most (characters).
EXCERPT: Final = 60
#: Permission options named in a summary, at most (the rest are counted).
_OPTIONS: Final = 4


def request_summary(method: str, params: JsonObject, *, width: int = EXCERPT) -> str:
    """What a request or notification says, in one line ("" when its method says it all)."""
    if method == "session/update":
        update = params.get("update")
        if not isinstance(update, dict):
            return ""
        kind = str(update.get("sessionUpdate", "?"))
        detail = text_of(update.get("content"))
        if detail is None and kind == "tool_call_update":
            detail = " ".join(str(update[k]) for k in ("toolCallId", "status") if k in update)
        if detail is None:
            detail = update.get("title")
        if detail is None and isinstance(update.get("entries"), list):
            detail = f"{len(update['entries'])} entries"
        return f"{kind} {excerpt(detail, width)}" if detail is not None else kind
    if method == "session/prompt":
        prompt = params.get("prompt")
        texts = [text_of(block) for block in prompt] if isinstance(prompt, list) else []
        return excerpt(" ".join(t for t in texts if t), width)
    if method == "session/request_permission":
        call = params.get("toolCall")
        call = call if isinstance(call, dict) else {}
        summary = f"{excerpt(call.get('title'), width)} ({call.get('kind', '?')})"
        options = _options(params.get("options"))
        return f"{summary} [{options}]" if options else summary
    if method == "_acp_bridge/log":
        data = params.get("data")
        message = data.get("message") if isinstance(data, dict) else None
        return f"{params.get('level', '?')} {excerpt(message, width)}"
    if method in ("fs/read_text_file", "fs/write_text_file"):
        return str(params.get("path", ""))
    if method == "session/new":
        return f"cwd {params.get('cwd', '?')}"
    return ""


def response_summary(method: str, msg: JsonObject, *, width: int = EXCERPT) -> str:
    """What an answer says, in one line; ``method`` is its request's ("" when unknown)."""
    error = msg.get("error")
    if isinstance(error, dict):
        return f"error {error.get('code')}: {excerpt(error.get('message'), width)}"
    result = msg.get("result")
    if not isinstance(result, dict):
        return "ok"
    outcome = result.get("outcome")
    if method == "session/request_permission" or isinstance(outcome, dict):
        if isinstance(outcome, dict):
            chosen = outcome.get("optionId")
            return f"outcome {outcome.get('outcome', '?')}" + (f" {chosen}" if chosen else "")
        return "outcome ?"
    if "stopReason" in result:
        return f"stopReason {result['stopReason']}"
    if isinstance(result.get("sessionId"), str):
        return f"sessionId {result['sessionId']}"
    return "ok"


def _options(options: object) -> str:
    """The names a permission request offers, `` / ``-separated (its ids when unnamed)."""
    if not isinstance(options, list):
        return ""
    names = []
    for option in options[:_OPTIONS]:
        if isinstance(option, dict):
            name = option.get("name") or option.get("optionId") or "?"
            names.append(str(name)[:30])
    if len(options) > _OPTIONS:
        names.append(f"+{len(options) - _OPTIONS} more")
    return " / ".join(names)


def text_of(block: object) -> str | None:
    """The text of a content block (None when it has none)."""
    if isinstance(block, dict) and isinstance(block.get("text"), str):
        return str(block["text"])
    return None


def session_of(params: JsonObject) -> str | None:
    """``params.sessionId`` (or ``result.sessionId``), when it is a string."""
    sid = params.get("sessionId")
    return sid if isinstance(sid, str) else None


def excerpt(value: object, width: int = EXCERPT) -> str:
    """``value`` as a quoted one-line excerpt of at most ``width`` characters ("" for None)."""
    if value is None:
        return ""
    text = str(value).replace("\n", "⏎")
    if len(text) > width:
        text = text[: width - 1] + "…"
    return json.dumps(text, ensure_ascii=False)
