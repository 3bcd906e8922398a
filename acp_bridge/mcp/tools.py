"""
The sub-agent tools of the bridge's ``acp-bridge`` MCP server (docs/subagents.md). No trio.

What each tool takes (:data:`TOOLS`: JSON Schemas, the one source of truth: the arguments are
checked against them by :func:`check_arguments`, whose messages say what is wrong), what it
returns (:func:`tool_result`: ``structuredContent`` and the same JSON as text), and the
:class:`SubagentHost` the tools are delegated to: the bridge implements it, and each call names
the calling session (the one the bearer token was bound to), so a host never has to guess.

Results: ``spawn_agent``, ``prompt_agent``, ``cancel_agent`` and ``close_agent`` answer one
:class:`ChildStatus` ``{child, state, stopReason?, text?}``; ``wait_agents`` answers
``{children: [ChildStatus...]}`` and ``list_agents`` ``{agents: [{name, ...}]}`` (MCP's
``structuredContent`` is an object, never a list).
"""

from __future__ import annotations

import math
import posixpath
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import orjson

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "MAX_CHILDREN_WAITED",
    "MAX_NAME_CHARS",
    "MAX_PATH_CHARS",
    "MAX_PROMPT_CHARS",
    "AgentInfo",
    "ChildStatus",
    "Invocation",
    "SubagentHost",
    "ToolError",
    "check_arguments",
    "error_result",
    "invoke",
    "tool_definitions",
    "tool_result",
]

#: The longest prompt a tool takes, in characters (the HTTP body cap is larger: JSON escapes).
MAX_PROMPT_CHARS: Final = 256 * 1024
#: The longest agent name or child id.
MAX_NAME_CHARS: Final = 256
#: The longest ``cwd`` (Linux's PATH_MAX).
MAX_PATH_CHARS: Final = 4096
#: The most children one ``wait_agents`` names.
MAX_CHILDREN_WAITED: Final = 256

ALL_TOOLS: Final = (
    "list_agents",
    "spawn_agent",
    "prompt_agent",
    "wait_agents",
    "cancel_agent",
    "close_agent",
)

# ----------------------------------------------------------------------------- the host


class ToolError(Exception):
    """A refusal the calling agent should read (unknown child, limit reached...): ``isError``."""


@attrs.frozen
class ChildStatus:
    """
    Where a child session stands.

    Attributes:
        child: the child's session id.
        state: ``"running"`` (a turn in progress), ``"idle"`` (its last turn ended),
            ``"closed"``, or another word the host documents.
        stop_reason: the ACP stop reason of the turn that ended (``end_turn``, ``cancelled``...).
        text: the child's agent message text of that turn, in order.
    """

    child: str
    state: str
    stop_reason: str | None = None
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"child": self.child, "state": self.state}
        if self.stop_reason is not None:
            out["stopReason"] = self.stop_reason
        if self.text is not None:
            out["text"] = self.text
        return out


@attrs.frozen
class AgentInfo:
    """
    An agent the caller may spawn.

    Attributes:
        name: its name in the configuration.
        state: the bridge's word for its process (``"running"``, ``"stopped"``...), if known.
    """

    name: str
    state: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.state is not None:
            out["state"] = self.state
        return out


class SubagentHost(Protocol):
    """
    What the tools do, implemented by the bridge. ``caller`` is the bridge's id of the session
    whose token the request carried. Raise :class:`ToolError` to refuse with a message; any
    other exception is logged and answered as an internal error. A call may be cancelled (the
    MCP client cancelled it, its connection dropped, the call deadline passed, the session
    ended): that stops the waiting, and must leave the child as it is.
    """

    async def list_agents(self, caller: str) -> Sequence[AgentInfo]: ...

    async def spawn(
        self, caller: str, agent: str, prompt: str, cwd: str | None, wait: bool
    ) -> ChildStatus: ...

    async def prompt(self, caller: str, child: str, prompt: str, wait: bool) -> ChildStatus: ...

    async def wait(
        self, caller: str, children: Sequence[str] | None, timeout_ms: int | None
    ) -> Sequence[ChildStatus]: ...

    async def cancel(self, caller: str, child: str) -> ChildStatus: ...

    async def close(self, caller: str, child: str) -> ChildStatus: ...


# ----------------------------------------------------------------------------- schemas

_STATUS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "child": {"type": "string"},
        "state": {"type": "string"},
        "stopReason": {"type": "string"},
        "text": {"type": "string"},
    },
    "required": ["child", "state"],
}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _name(what: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS, "description": what}


_PROMPT: Final = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_PROMPT_CHARS,
    "description": "the text of the prompt (one user message)",
}
_WAIT: Final = {
    "type": "boolean",
    "default": True,
    "description": "true: answer when the turn ends; false: answer at once, state running",
}
_CHILD: Final = _name("the child's id, as spawn_agent answered it")


def tool_definitions(max_wait_ms: int) -> dict[str, dict[str, Any]]:
    """
    The MCP ``Tool`` objects by name. ``max_wait_ms`` bounds ``wait_agents``' ``timeout_ms``
    (the server's call deadline: a longer wait would be cut short anyway).
    """
    return {
        "list_agents": {
            "name": "list_agents",
            "description": "The agents this session may start as sub-agents.",
            "inputSchema": _object({}, []),
            "outputSchema": {
                "type": "object",
                "properties": {
                    "agents": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "state": {"type": "string"}},
                            "required": ["name"],
                        },
                    }
                },
                "required": ["agents"],
            },
        },
        "spawn_agent": {
            "name": "spawn_agent",
            "description": (
                "Start a sub-agent: a new session on a configured agent, given a first prompt. "
                "With wait (the default) the answer comes when that turn ends, with the "
                "child's reply text; without, at once."
            ),
            "inputSchema": _object(
                {
                    "agent": _name("the agent to start (see list_agents)"),
                    "prompt": _PROMPT,
                    "cwd": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_PATH_CHARS,
                        "description": "absolute working directory (default: this session's)",
                    },
                    "wait": _WAIT,
                },
                ["agent", "prompt"],
            ),
            "outputSchema": _STATUS_SCHEMA,
        },
        "prompt_agent": {
            "name": "prompt_agent",
            "description": "Send another prompt to a sub-agent whose last turn ended.",
            "inputSchema": _object(
                {"child": _CHILD, "prompt": _PROMPT, "wait": _WAIT}, ["child", "prompt"]
            ),
            "outputSchema": _STATUS_SCHEMA,
        },
        "wait_agents": {
            "name": "wait_agents",
            "description": (
                "Wait until one of the named sub-agents (default: all of this session's) is "
                "not running, or timeout_ms passes; answers where each stands."
            ),
            "inputSchema": _object(
                {
                    "children": {
                        "type": "array",
                        "items": _CHILD,
                        "maxItems": MAX_CHILDREN_WAITED,
                        "description": "the children to wait for (default: all of them)",
                    },
                    "timeout_ms": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": max_wait_ms,
                        "description": "give up waiting after this long; 0: answer at once",
                    },
                },
                [],
            ),
            "outputSchema": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": _STATUS_SCHEMA}},
                "required": ["children"],
            },
        },
        "cancel_agent": {
            "name": "cancel_agent",
            "description": "Cancel a sub-agent's running turn (it stays open for more prompts).",
            "inputSchema": _object({"child": _CHILD}, ["child"]),
            "outputSchema": _STATUS_SCHEMA,
        },
        "close_agent": {
            "name": "close_agent",
            "description": "Close a sub-agent: its turn is cancelled and its session ends.",
            "inputSchema": _object({"child": _CHILD}, ["child"]),
            "outputSchema": _STATUS_SCHEMA,
        },
    }


# ----------------------------------------------------------------------------- checking

_TYPES: Final[dict[str, Callable[[object], bool]]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    # JSON has one number type: 3.0 is an integer, True is not
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    ),
}


def _check(value: object, schema: Mapping[str, Any], where: str) -> list[str]:
    """Every way ``value`` breaks ``schema`` (the subset :func:`tool_definitions` uses)."""
    kind = schema["type"]
    if not _TYPES[kind](value):
        article = "an" if kind[0] in "aeiou" else "a"
        return [f"{where}: expected {article} {kind}, got {_kind(value)}"]
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return [f"{where}: must not be empty"]
        if len(value) > schema.get("maxLength", len(value)):
            return [f"{where}: longer than {schema['maxLength']} characters"]
    elif kind == "integer":
        assert isinstance(value, int | float)
        if value < schema.get("minimum", value):
            return [f"{where}: must be at least {schema['minimum']}"]
        if value > schema.get("maximum", value):
            return [f"{where}: must be at most {schema['maximum']}"]
    elif isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            return [f"{where}: more than {schema['maxItems']} items"]
        return [
            p
            for i, item in enumerate(value)
            for p in _check(item, schema["items"], f"{where}[{i}]")
        ]
    elif isinstance(value, dict):
        properties: Mapping[str, Any] = schema["properties"]
        known = ", ".join(properties) or "none"
        problems = [
            f"{_join(where, key)}: unknown argument (the arguments are: {known})"
            for key in value
            if key not in properties
        ]
        problems += [
            f"{_join(where, key)}: missing (required)"
            for key in schema["required"]
            if key not in value
        ]
        for key, item in value.items():
            if key in properties:
                problems += _check(item, properties[key], _join(where, key))
        return problems
    return []


def _join(where: str, key: str) -> str:
    return key if not where else f"{where}.{key}"


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


@attrs.frozen
class Invocation:
    """A tool call whose arguments passed their schema: what :func:`invoke` runs."""

    tool: str
    arguments: Mapping[str, Any]


def check_arguments(
    definitions: Mapping[str, Mapping[str, Any]], tool: str, arguments: object
) -> Invocation | str:
    """
    The call, or what is wrong with its arguments (the message of an ``isError`` result).

    ``arguments`` absent (None) is an empty object, as MCP allows. Beyond the schema: ``cwd``
    must be an absolute path, ``children`` must not repeat a child.
    """
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f"{tool}: arguments: expected an object, got {_kind(arguments)}"
    problems = _check(arguments, definitions[tool]["inputSchema"], "")
    if problems:
        return f"{tool}: {'; '.join(problems[:10])}"
    cwd = arguments.get("cwd")
    if cwd is not None and not posixpath.isabs(cwd):
        return f"{tool}: cwd: must be an absolute path, got {cwd[:200]!r}"
    if "\x00" in (cwd or ""):
        return f"{tool}: cwd: contains a NUL character"
    children = arguments.get("children")
    if children is not None and len(set(children)) != len(children):
        return f"{tool}: children: names a child twice"
    return Invocation(tool, arguments)


async def invoke(host: SubagentHost, caller: str, call: Invocation) -> dict[str, Any]:
    """
    Run a checked call on ``host`` for ``caller``: the JSON of its result (not yet shaped as an
    MCP ``CallToolResult``: see :func:`tool_result`). :class:`ToolError` passes through.
    """
    args = call.arguments
    if call.tool == "list_agents":
        agents = await host.list_agents(caller)
        return {"agents": [a.to_json() for a in agents]}
    if call.tool == "spawn_agent":
        status = await host.spawn(
            caller, args["agent"], args["prompt"], args.get("cwd"), args.get("wait", True)
        )
    elif call.tool == "prompt_agent":
        status = await host.prompt(caller, args["child"], args["prompt"], args.get("wait", True))
    elif call.tool == "wait_agents":
        timeout = args.get("timeout_ms")
        statuses = await host.wait(
            caller, args.get("children"), None if timeout is None else int(timeout)
        )
        return {"children": [s.to_json() for s in statuses]}
    elif call.tool == "cancel_agent":
        status = await host.cancel(caller, args["child"])
    elif call.tool == "close_agent":
        status = await host.close(caller, args["child"])
    else:
        raise AssertionError(f"no such tool {call.tool}")
    return status.to_json()


def tool_result(data: Mapping[str, Any]) -> dict[str, Any]:
    """An MCP ``CallToolResult``: ``structuredContent`` and the same JSON as text."""
    text = orjson.dumps(data).decode()
    return {"content": [{"type": "text", "text": text}], "structuredContent": dict(data)}


def error_result(message: str) -> dict[str, Any]:
    """An MCP ``CallToolResult`` with ``isError``: what the calling model reads."""
    return {"content": [{"type": "text", "text": message}], "isError": True}
