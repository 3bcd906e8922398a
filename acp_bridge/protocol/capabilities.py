"""
Capabilities, pure: which calls each side may make, given what the other advertised.

Every call the bridge forwards is gated on its target's capabilities (-32601 otherwise), and
what an agent cannot take is stripped or refused before it gets there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError
from acp_bridge.protocol.wire import bridge_meta

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

#: Methods an agent may call on the client, and the client capability each needs.
CLIENT_METHOD_GATES: Final[dict[str, Callable[[JsonObject], bool]]] = {
    "fs/read_text_file": lambda c: bool((c.get("fs") or {}).get("readTextFile")),
    "fs/write_text_file": lambda c: bool((c.get("fs") or {}).get("writeTextFile")),
    "terminal/create": lambda c: bool(c.get("terminal")),
    "terminal/output": lambda c: bool(c.get("terminal")),
    "terminal/wait_for_exit": lambda c: bool(c.get("terminal")),
    "terminal/kill": lambda c: bool(c.get("terminal")),
    "terminal/release": lambda c: bool(c.get("terminal")),
    "elicitation/create": lambda c: isinstance(c.get("elicitation"), dict),
    "session/request_permission": lambda c: True,
}

#: Client → agent session-scoped methods, with the agent capability each needs (None: baseline).
SESSION_METHODS: Final[dict[str, Callable[[JsonObject], bool] | None]] = {
    "session/prompt": None,
    "session/set_mode": None,
    "session/set_config_option": None,
    "session/load": lambda caps: bool(caps.get("loadSession")),
    "session/resume": lambda caps: has_session_cap(caps, "resume"),
    "session/close": lambda caps: has_session_cap(caps, "close"),
    "session/delete": lambda caps: has_session_cap(caps, "delete"),
    "session/fork": lambda caps: has_session_cap(caps, "fork"),
    # v1 unstable (SDK 2.4.0 schema)
    "session/set_title": lambda caps: has_session_cap(caps, "title"),
    "session/status": lambda caps: has_session_cap(caps, "status"),
    "session/archive": lambda caps: has_session_cap(caps, "archive"),
    "session/unarchive": lambda caps: has_session_cap(caps, "archive"),
}

#: Session methods that look at a session without joining it (the spec: ``session/status``
#: does not attach the requesting connection; any listed session may be retitled): they
#: neither take a session nor are refused for one another connection holds.
LOOK_ONLY_METHODS: Final = frozenset({"session/status", "session/set_title"})

#: Client → agent connection-scoped methods (no session): they go to the agent named in
#: ``_meta.acp_bridge.agent``, else the default one, gated on its capability.
CONNECTION_METHODS: Final[dict[str, Callable[[JsonObject], bool]]] = {
    "logout": lambda caps: has_cap(caps, "auth", "logout"),
    "auth/status": lambda caps: has_cap(caps, "auth", "status"),
    "providers/list": lambda caps: caps.get("providers") is not None,
    "providers/set": lambda caps: caps.get("providers") is not None,
    "providers/disable": lambda caps: caps.get("providers") is not None,
}


def has_cap(caps: JsonObject, group: str, name: str) -> bool:
    inner = caps.get(group)
    return isinstance(inner, dict) and inner.get(name) is not None


def has_session_cap(caps: JsonObject, name: str) -> bool:
    session_caps = caps.get("sessionCapabilities")
    return isinstance(session_caps, dict) and session_caps.get(name) is not None


def agent_selector(params: JsonObject) -> str | None:
    agent = bridge_meta(params).get("agent")
    return agent if isinstance(agent, str) else None


CONTAINED_PATHS: Final = {
    "fs/read_text_file": "path",
    "fs/write_text_file": "path",
    "terminal/create": "cwd",
}


def check_prompt_content(agent: str, caps: JsonObject, params: JsonObject) -> None:
    """Refuse content kinds ``agent`` did not advertise in ``caps`` (text, links: always)."""
    prompt = params.get("prompt")
    if not isinstance(prompt, list):
        return
    kinds = caps.get("promptCapabilities")
    kinds = kinds if isinstance(kinds, dict) else {}
    needs = {"image": "image", "audio": "audio", "resource": "embeddedContext"}
    for block in prompt:
        if isinstance(block, dict):
            kind = block.get("type")
            need = needs.get(kind) if isinstance(kind, str) else None
            if need is not None and not kinds.get(need):
                raise JsonRpcError.invalid_params(
                    f"agent {agent!r} does not accept {block.get('type')} content"
                )


def advertised(default_caps: JsonObject, all_agents_caps: Iterable[JsonObject]) -> JsonObject:
    """
    What the bridge advertises: the default agent's capabilities ``default_caps``, as it is up
    now, plus what the bridge serves itself for every agent: ``loadSession`` and
    ``sessionCapabilities.resume``/``close``/``delete`` for live sessions (replay from its own
    history; resume and close without the agent when it lacks them), and ``list`` when any of
    the agents (``all_agents_caps``) lists sessions.

    ``mcpCapabilities.acp`` is advertised when the default agent takes ``acp`` MCP servers or
    ``http`` ones: the bridge relays ``mcp/message`` to the first and re-exports a client's
    server over HTTP to the second (``engine.offers``).

    Other calls on sessions of other agents are gated against their own agent's
    capabilities (-32601 when it lacks one); ``_acp_bridge/agents`` lists each agent's.
    """
    caps = dict(default_caps)
    mcp = caps.get("mcpCapabilities")
    if isinstance(mcp, dict) and mcp.get("acp") is not True and mcp.get("http") is True:
        caps["mcpCapabilities"] = {**mcp, "acp": True}
    caps["loadSession"] = True
    session_caps = dict(caps.get("sessionCapabilities") or {})
    session_caps["resume"] = {}
    session_caps["close"] = {}
    session_caps["delete"] = {}
    if any(has_session_cap(c, "list") for c in all_agents_caps):
        session_caps["list"] = {}
    caps["sessionCapabilities"] = session_caps
    return caps


def strip_unsupported_setup(caps: JsonObject, params: JsonObject) -> list[str]:
    """
    Drop from a session's setup ``params`` what an agent with ``caps`` did not advertise it
    can take: ``additionalDirectories``, ``http`` and ``sse`` MCP servers when it lacks the
    kind. Returns what was dropped, for the caller to log (names only: a server's URL or
    headers may be secret). ``acp`` servers are left to the offer (``engine.offers``): one
    may reach an agent that lacks the kind, re-exported over HTTP.
    """
    stripped: list[str] = []
    if "additionalDirectories" in params and not has_session_cap(caps, "additionalDirectories"):
        del params["additionalDirectories"]
        stripped.append("additionalDirectories")
    servers = params.get("mcpServers")
    if isinstance(servers, list):
        mcp = caps.get("mcpCapabilities")
        mcp = mcp if isinstance(mcp, dict) else {}
        kept = []
        for server in servers:
            kind = server.get("type") if isinstance(server, dict) else None
            if kind in ("http", "sse") and not mcp.get(kind):
                stripped.append(f"mcpServers: {kind} server {server.get('name')!r}")
            else:
                kept.append(server)
        if len(kept) != len(servers):
            params["mcpServers"] = kept
    return stripped


__all__ = [
    "CLIENT_METHOD_GATES",
    "CONNECTION_METHODS",
    "CONTAINED_PATHS",
    "LOOK_ONLY_METHODS",
    "SESSION_METHODS",
    "advertised",
    "agent_selector",
    "check_prompt_content",
    "has_cap",
    "has_session_cap",
    "strip_unsupported_setup",
]
