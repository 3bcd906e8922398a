"""
The ACP v2 face's shapes, pure and stateless: v2 params into the v1 requests the bridge serves,
v1 results and updates into v2 (the draft the TypeScript SDK 2.4.0 bundles; docs/v2.md).

Everything here is a function of its arguments; what depends on a connection's or a session's
past (message ids, states, held prompts, replays) is in :mod:`acp_bridge.v2.core`.
"""

from __future__ import annotations

import difflib
from typing import Any, Final

from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError, loads

#: The protocol version the v2 face answers with.
V2_PROTOCOL_VERSION: Final = 2
#: The v1 protocol version the face speaks to the bridge.
V1_PROTOCOL_VERSION: Final = 1
#: The id of the config option a v1 agent's session modes become.
MODE_CONFIG_ID: Final = "mode"
#: v1 chunk kinds whose runs become v2 messages (and, in a replay, whole-message upserts).
MESSAGE_KINDS: Final = {
    "user_message_chunk": "user_message",
    "agent_message_chunk": "agent_message",
    "agent_thought_chunk": "agent_thought",
}


def wants_v2(line: bytes | str) -> bool:
    """Whether a connection's first line is an ``initialize`` asking for protocol 2 or later."""
    try:
        msg = loads(line)
    except (JsonRpcError, ValueError):
        return False
    if not isinstance(msg, dict) or msg.get("method") != "initialize":
        return False
    params = msg.get("params")
    version = params.get("protocolVersion") if isinstance(params, dict) else None
    return type(version) is int and version >= V2_PROTOCOL_VERSION


def _with_meta(out: JsonObject, source: JsonObject) -> JsonObject:
    meta = source.get("_meta")
    if isinstance(meta, dict):
        out["_meta"] = meta
    return out


def _present(value: object) -> bool:
    """A v1 capability marker that says yes (``true`` or an object)."""
    return value is True or isinstance(value, dict)


# -- initialize ----------------------------------------------------------------------------


def initialize_to_v1(params: JsonObject) -> JsonObject:
    """
    A v2 ``initialize`` as the bridge takes it: no ``fs`` or ``terminal`` capability (v2 has
    neither, so the bridge refuses those agent requests itself), the client's ``info`` as
    ``clientInfo``, and an empty ``_meta.acp_bridge`` (the face follows the bridge's own
    notifications, such as ``permission_resolved``).
    """
    out: JsonObject = {
        "protocolVersion": V1_PROTOCOL_VERSION,
        "clientCapabilities": {},
        "_meta": {"acp_bridge": {}},
    }
    info = params.get("info")
    if isinstance(info, dict):
        out["clientInfo"] = info
    return out


def _implementation(info: object) -> JsonObject:
    if not isinstance(info, dict) or not isinstance(info.get("name"), str):
        return {"name": "acp-bridge", "version": "0"}
    out: JsonObject = {"name": info["name"], "version": str(info.get("version") or "0")}
    if isinstance(info.get("title"), str):
        out["title"] = info["title"]
    return out


def auth_method_to_v2(method: object) -> JsonObject | None:
    """A v1 auth method (``id``) as v2 has it (``methodId`` and a ``type``); None: unusable."""
    if not isinstance(method, dict):
        return None
    method_id, name = method.get("id"), method.get("name")
    if not isinstance(method_id, str) or not isinstance(name, str):
        return None
    kind = method.get("type")
    out: JsonObject = {
        "type": kind if isinstance(kind, str) else "agent",
        "methodId": method_id,
        "name": name,
    }
    if isinstance(method.get("description"), str):
        out["description"] = method["description"]
    if out["type"] == "terminal":
        out = {**method, **out}
        out.pop("id", None)
    return out


def initialize_to_v2(result: JsonObject) -> JsonObject:
    """
    The bridge's v1 ``initialize`` answer as v2: ``agentInfo`` → ``info``; prompt and MCP
    capabilities under ``capabilities.session`` with ``{}`` for ``true``; ``session/delete``
    and ``session/list``/``resume``/``close`` always (the bridge serves them for every
    agent); ``additionalDirectories`` when the agent takes them; auth methods with
    ``methodId``.
    """
    caps = result.get("agentCapabilities")
    caps = caps if isinstance(caps, dict) else {}
    prompt = caps.get("promptCapabilities")
    prompt = prompt if isinstance(prompt, dict) else {}
    mcp = caps.get("mcpCapabilities")
    mcp = mcp if isinstance(mcp, dict) else {}
    session_caps = caps.get("sessionCapabilities")
    session_caps = session_caps if isinstance(session_caps, dict) else {}
    session: JsonObject = {
        "prompt": {k: {} for k in ("image", "audio", "embeddedContext") if _present(prompt.get(k))},
        "mcp": {"stdio": {}, **({"http": {}} if _present(mcp.get("http")) else {})},
        "delete": {},
    }
    if _present(session_caps.get("additionalDirectories")):
        session["additionalDirectories"] = {}
    methods = result.get("authMethods")
    auth = [m for m in map(auth_method_to_v2, methods if isinstance(methods, list) else []) if m]
    out: JsonObject = {
        "protocolVersion": V2_PROTOCOL_VERSION,
        "info": _implementation(result.get("agentInfo")),
        "capabilities": {"session": session},
    }
    if auth:
        out["authMethods"] = auth
    return _with_meta(out, result)


# -- session setup -------------------------------------------------------------------------


def mcp_servers_to_v1(servers: object) -> list[JsonObject]:
    """
    v2 MCP servers as v1 takes them: stdio loses its ``type`` and gets the ``args`` and
    ``env`` v1 requires; http gets ``headers``. Any other transport is refused.

    Raises:
        JsonRpcError: -32602, a server that is not stdio or http, or not an object.
    """
    if servers is None:
        return []
    if not isinstance(servers, list):
        raise JsonRpcError.invalid_params("mcpServers: expected an array")
    out: list[JsonObject] = []
    for server in servers:
        if not isinstance(server, dict):
            raise JsonRpcError.invalid_params("mcpServers: expected objects")
        kind = server.get("type")
        if kind == "stdio":
            v1 = {k: v for k, v in server.items() if k != "type"}
            v1.setdefault("args", [])
            v1.setdefault("env", [])
        elif kind == "http":
            v1 = dict(server)
            v1.setdefault("headers", [])
        else:
            raise JsonRpcError.invalid_params(
                f"mcpServers: transport {kind!r} is not served (stdio and http are)"
            )
        out.append(v1)
    return out


def setup_to_v1(params: JsonObject, *, session_id: str | None = None) -> JsonObject:
    """A v2 ``session/new`` or ``session/resume``'s setup as v1's (cwd, roots, MCP servers)."""
    out: JsonObject = {
        "cwd": params.get("cwd"),
        "mcpServers": mcp_servers_to_v1(params.get("mcpServers")),
    }
    if session_id is not None:
        out["sessionId"] = session_id
    extra = params.get("additionalDirectories")
    if isinstance(extra, list) and extra:
        out["additionalDirectories"] = extra
    return _with_meta(out, params)


def config_option_to_v2(option: object) -> JsonObject | None:
    """A v1 config option (``id``) as v2's (``configId``)."""
    if not isinstance(option, dict):
        return None
    config_id = option.get("configId", option.get("id"))
    if not isinstance(config_id, str) or not isinstance(option.get("name"), str):
        return None
    out = {k: v for k, v in option.items() if k not in ("id", "configId")}
    out["configId"] = config_id
    return out


def modes_to_option(modes: object) -> JsonObject | None:
    """v1 session modes (``currentModeId``, ``availableModes``) as one v2 select option."""
    if not isinstance(modes, dict):
        return None
    available = modes.get("availableModes")
    current = modes.get("currentModeId")
    if not isinstance(available, list) or not isinstance(current, str):
        return None
    options = []
    for mode in available:
        if isinstance(mode, dict) and isinstance(mode.get("id"), str):
            entry: JsonObject = {"value": mode["id"], "name": str(mode.get("name") or mode["id"])}
            if isinstance(mode.get("description"), str):
                entry["description"] = mode["description"]
            options.append(entry)
    if not options:
        return None
    return {
        "configId": MODE_CONFIG_ID,
        "name": "Mode",
        "category": "mode",
        "type": "select",
        "currentValue": current,
        "options": options,
    }


def config_options_to_v2(result: JsonObject) -> list[JsonObject]:
    """A v1 setup answer's config options, its modes folded in as the ``mode`` option."""
    raw = result.get("configOptions")
    options = [o for o in map(config_option_to_v2, raw if isinstance(raw, list) else []) if o]
    if not any(o.get("category") == "mode" for o in options):
        mode = modes_to_option(result.get("modes"))
        if mode is not None:
            options.insert(0, mode)
    return options


def command_to_v2(command: object) -> JsonObject | None:
    """A v1 available command as v2's (``type: "command"``; an input gains ``type: "text"``)."""
    if not isinstance(command, dict) or not isinstance(command.get("name"), str):
        return None
    out = dict(command)
    out["type"] = "command"
    out["description"] = str(command.get("description") or "")
    given = command.get("input")
    if isinstance(given, dict):
        out["input"] = given if "type" in given else {"type": "text", **given}
    return out


def session_info_to_v2(info: object) -> JsonObject | None:
    """One v1 ``session/list`` entry as v2's ``SessionInfo``."""
    if not isinstance(info, dict):
        return None
    if not isinstance(info.get("sessionId"), str) or not isinstance(info.get("cwd"), str):
        return None
    keep = ("sessionId", "cwd", "additionalDirectories", "title", "updatedAt", "_meta")
    return {k: info[k] for k in keep if k in info}


# -- updates -------------------------------------------------------------------------------


def _patch(path: str, old: str | None, new: str) -> str:
    """A git-style patch of one file's change (``old`` None: a new file)."""
    rel = path.lstrip("/")
    head = [f"diff --git a/{rel} b/{rel}\n"]
    if old is None:
        head.append("new file mode 100644\n")
    lines = difflib.unified_diff(
        [] if old is None else old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        "/dev/null" if old is None else f"a/{rel}",
        f"b/{rel}",
    )
    return "".join(head) + "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def tool_content_to_v2(item: object) -> object:
    """v1 tool-call content: a diff becomes ``changes`` plus a ``git_patch``; the rest stays."""
    if not isinstance(item, dict) or item.get("type") != "diff":
        return item
    path, old, new = item.get("path"), item.get("oldText"), item.get("newText")
    if not isinstance(path, str) or not isinstance(new, str):
        return item
    old_text = old if isinstance(old, str) else None
    out: JsonObject = {
        "type": "diff",
        "changes": [{"operation": "add" if old_text is None else "modify", "path": path}],
        "patch": {"format": "git_patch", "text": _patch(path, old_text, new)},
    }
    return _with_meta(out, item)


TOOL_CALL_FIELDS: Final = (
    "toolCallId",
    "title",
    "kind",
    "status",
    "locations",
    "rawInput",
    "rawOutput",
    "_meta",
)


def tool_call_to_v2(call: JsonObject) -> JsonObject:
    """A v1 ``tool_call`` or ``tool_call_update`` (or a permission's tool call) as v2's patch."""
    out: JsonObject = {k: call[k] for k in TOOL_CALL_FIELDS if k in call}
    content = call.get("content")
    if isinstance(content, list):
        out["content"] = [tool_content_to_v2(c) for c in content]
    elif content is None and "content" in call:
        out["content"] = None
    return out


def plain_update_to_v2(update: JsonObject) -> JsonObject:
    """
    A v1 update whose v2 shape depends on nothing but itself (chunks, modes and plans are the
    core's: they need the session's state). Unknown kinds pass unchanged (v2 keeps them).
    """
    kind = update.get("sessionUpdate")
    if kind in ("tool_call", "tool_call_update"):
        return {"sessionUpdate": "tool_call_update", **tool_call_to_v2(update)}
    if kind == "available_commands_update":
        raw = update.get("availableCommands")
        commands = [c for c in map(command_to_v2, raw if isinstance(raw, list) else []) if c]
        return _with_meta({"sessionUpdate": kind, "availableCommands": commands}, update)
    if kind == "config_option_update":
        raw = update.get("configOptions")
        options = [o for o in map(config_option_to_v2, raw if isinstance(raw, list) else []) if o]
        return _with_meta({"sessionUpdate": kind, "configOptions": options}, update)
    return update


def permission_to_v2(params: JsonObject) -> JsonObject:
    """
    A v1 ``session/request_permission`` as v2's: a required ``title`` (the tool call's, else
    a generic one) and the tool call as ``subject``.
    """
    call = params.get("toolCall")
    call = call if isinstance(call, dict) else {}
    title = call.get("title")
    out: JsonObject = {
        "sessionId": params.get("sessionId"),
        "title": title if isinstance(title, str) and title else "Permission requested",
        "options": params.get("options"),
    }
    if isinstance(call.get("toolCallId"), str):
        out["subject"] = {"type": "tool_call", "toolCall": tool_call_to_v2(call)}
    return _with_meta(out, params)


def stop_to_v2(response: JsonObject) -> JsonObject:
    """A v1 prompt's answer (a stop reason, or an error) as the idle ``state_update``."""
    error = response.get("error")
    if isinstance(error, dict):
        shown: JsonObject = {"code": error.get("code"), "message": error.get("message")}
        if "data" in error:
            shown["data"] = error["data"]
        return {
            "sessionUpdate": "state_update",
            "state": "idle",
            "stopReason": "error",
            "error": shown,
        }
    result = response.get("result")
    reason: Any = result.get("stopReason") if isinstance(result, dict) else None
    return {
        "sessionUpdate": "state_update",
        "state": "idle",
        "stopReason": reason if isinstance(reason, str) else "end_turn",
    }


__all__ = [
    "MESSAGE_KINDS",
    "MODE_CONFIG_ID",
    "V2_PROTOCOL_VERSION",
    "config_options_to_v2",
    "initialize_to_v1",
    "initialize_to_v2",
    "mcp_servers_to_v1",
    "modes_to_option",
    "permission_to_v2",
    "plain_update_to_v2",
    "session_info_to_v2",
    "setup_to_v1",
    "stop_to_v2",
    "tool_call_to_v2",
    "wants_v2",
]
