"""
Sub-agents, the decisions (docs/subagents.md). No trio, no I/O.

A parent session spawns children through the bridge's MCP tools; each child is an ordinary
bridge session with a record here (:class:`Child`) in one :class:`Tree` per bridge: who its
parent is, how deep it sits, whether a turn is running, and the text of its last turn. What a
spawn may do (:func:`spawn_refusal`: depth, fan-out, agent globs; :func:`child_cwd`: inside
the parent's roots), which tools a session is offered (:func:`tools_for`), what a child's
update adds to its turn's text (:func:`message_text`) and how a child is shown to a client
(:func:`subagent_update`, :meth:`Tree.present`) are decided here; ``engine.subagents`` waits.
"""

from __future__ import annotations

import fnmatch
import posixpath
from typing import TYPE_CHECKING, Any, Final

import attrs

from acp_bridge.mcp.tools import ALL_TOOLS, ChildStatus

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from acp_bridge.config.model import SubagentsConfig

__all__ = [
    "MAX_TURN_TEXT",
    "SUBAGENT_UPDATE",
    "Child",
    "Tree",
    "child_cwd",
    "message_text",
    "on_parent_session",
    "spawn_refusal",
    "subagent_update",
    "supports_subagents",
    "tools_for",
]

#: Characters of a child's turn text kept for the parent's tool result; past it the rest is
#: dropped and the text ends with :data:`TRUNCATED` (the child's session keeps it all).
MAX_TURN_TEXT: Final = 1024 * 1024
TRUNCATED: Final = "\n[... truncated by acp-bridge: the child's session has the rest]"
#: The ``sessionUpdate`` that tells a parent's client about a child.
SUBAGENT_UPDATE: Final = "subagent_update"
#: Characters of a first prompt shown as a child's description (``subagent_update``).
DESCRIPTION_CHARS: Final = 200

#: The states of a child (``ChildStatus.state``): a turn in progress, its last turn ended,
#: closed by its parent (or its parent's end), its agent gone.
RUNNING: Final = "running"
IDLE: Final = "idle"
CLOSED: Final = "closed"
ENDED: Final = "ended"


@attrs.define(eq=False)
class Child:
    """One child session as its parent sees it."""

    id: str
    parent: str
    agent: str
    #: 1 for a child of a client's session, 2 for its child, ...
    depth: int
    cwd: str
    state: str = IDLE
    stop_reason: str | None = None
    #: why its last turn failed (its agent died, the agent answered an error), if it did
    error: str | None = None
    #: the agent message text of the current (or last) turn, in order
    parts: list[str] = attrs.field(factory=list)
    chars: int = 0
    truncated: bool = False

    def start_turn(self) -> None:
        self.state = RUNNING
        self.stop_reason = None
        self.error = None
        self.parts = []
        self.chars = 0
        self.truncated = False

    def add_text(self, text: str) -> None:
        """More of the turn's text, kept up to :data:`MAX_TURN_TEXT` characters."""
        room = MAX_TURN_TEXT - self.chars
        if room <= 0:
            self.truncated = True
            return
        if len(text) > room:
            text = text[:room]
            self.truncated = True
        self.parts.append(text)
        self.chars += len(text)

    def end_turn(self, stop_reason: str | None, error: str | None = None) -> None:
        if self.state == RUNNING:
            self.state = IDLE if error is None else ENDED
        self.stop_reason = stop_reason
        self.error = error

    @property
    def text(self) -> str:
        return "".join(self.parts) + (TRUNCATED if self.truncated else "")

    def status(self) -> ChildStatus:
        """What the tools answer for it: the text only once a turn ended (or was cut)."""
        text = None if self.state == RUNNING else self.text
        return ChildStatus(self.id, self.state, self.stop_reason, text)


class Tree:
    """Every open child of one bridge, by id and by parent (in spawn order)."""

    def __init__(self) -> None:
        self.children: dict[str, Child] = {}
        self._by_parent: dict[str, dict[str, Child]] = {}

    def __len__(self) -> int:
        return len(self.children)

    def add(self, child: Child) -> None:
        self.children[child.id] = child
        self._by_parent.setdefault(child.parent, {})[child.id] = child

    def remove(self, child_id: str) -> Child | None:
        child = self.children.pop(child_id, None)
        if child is not None:
            siblings = self._by_parent.get(child.parent)
            if siblings is not None:
                siblings.pop(child_id, None)
                if not siblings:
                    del self._by_parent[child.parent]
        return child

    def of(self, parent: str) -> list[Child]:
        """The open children of ``parent``, in spawn order."""
        return list(self._by_parent.get(parent, {}).values())

    def depth(self, session: str) -> int:
        """How deep ``session`` sits: 0 for a client's own (or any session not a child)."""
        child = self.children.get(session)
        return child.depth if child is not None else 0

    def root(self, session: str) -> str:
        """The client's session at the top of ``session``'s tree (itself if not a child)."""
        seen = 0
        while (child := self.children.get(session)) is not None and seen <= len(self.children):
            session = child.parent
            seen += 1
        return session

    def descendants(self, session: str) -> list[Child]:
        """Every child under ``session``, deepest first (the order to close them in)."""
        out: list[Child] = []
        for child in self.of(session):
            out += self.descendants(child.id)
            out.append(child)
        return out

    def owned(self, caller: str, child: str) -> Child | None:
        """``child`` if it is ``caller``'s own child, else None (another's, or unknown)."""
        found = self.children.get(child)
        return found if found is not None and found.parent == caller else None

    def present(
        self, session: str, capabilities: Mapping[str, Any], params: dict[str, Any]
    ) -> dict[str, Any]:
        """
        A request of ``session``'s agent as a client with these ``capabilities`` is shown it:
        as it is, or, a child's to a client without ``subagents``, on its tree's root.
        """
        child = self.children.get(session)
        if child is None or supports_subagents(capabilities):
            return params
        return on_parent_session(params, child, self.root(child.id))


def tools_for(depth: int, max_depth: int) -> tuple[str, ...]:
    """The tools a session at ``depth`` is offered: no ``spawn_agent`` at ``max_depth``."""
    if depth < max_depth:
        return ALL_TOOLS
    return tuple(t for t in ALL_TOOLS if t not in ("spawn_agent", "list_agents"))


def may_spawn(agent: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(agent, g) for g in globs)


def spawn_refusal(
    config: SubagentsConfig,
    *,
    parent_depth: int,
    open_children: int,
    agent: str,
    agents: Sequence[str],
) -> str | None:
    """Why a session at ``parent_depth`` with ``open_children`` may not spawn ``agent``."""
    if not config.enabled:
        return "sub-agents are disabled ([subagents] enabled = false)"
    if parent_depth >= config.max_depth:
        return (
            f"this session is at depth {parent_depth}, the deepest allowed "
            f"([subagents] max_depth = {config.max_depth}): it may not spawn"
        )
    if open_children >= config.max_children:
        return (
            f"this session has {open_children} children open, the most allowed "
            f"([subagents] max_children = {config.max_children}): close one first"
        )
    if agent not in agents:
        return f"unknown agent {agent[:256]!r}; configured: {', '.join(agents)}"
    if not may_spawn(agent, config.agents):
        return f"agent {agent!r} may not be spawned ([subagents] agents = {list(config.agents)})"
    return None


def child_cwd(cwd: str | None, roots: Sequence[str]) -> str:
    """
    The child's working directory: ``cwd`` (normalized), or the parent's own; it must lie
    inside the parent's roots (compared as written, ``..`` resolved lexically).

    Raises:
        ValueError: outside the roots, or the parent has none.
    """
    if not roots:
        raise ValueError("the parent session has no working directory to put a child in")
    if cwd is None:
        return roots[0]
    path = posixpath.normpath(cwd)
    for root in roots:
        base = posixpath.normpath(root)
        if path == base or path.startswith(base.rstrip("/") + "/"):
            return path
    raise ValueError(f"cwd {cwd[:256]!r} is outside this session's roots ({', '.join(roots)})")


def message_text(update: object) -> str | None:
    """The text an update adds to a turn: an ``agent_message_chunk``'s text content."""
    if type(update) is not dict or update.get("sessionUpdate") != "agent_message_chunk":
        return None
    content = update.get("content")
    if type(content) is dict and content.get("type") == "text":
        text = content.get("text")
        return text if type(text) is str else None
    return None


def supports_subagents(capabilities: Mapping[str, Any]) -> bool:
    """Whether a client advertised ``clientCapabilities.subagents`` (the unstable RFD)."""
    return isinstance(capabilities.get("subagents"), dict)


def subagent_update(
    child: Child, *, prompt: str | None = None, state: str | None = None
) -> dict[str, Any]:
    """
    The ``subagent_update`` (v1 unstable schema) about ``child`` on its parent's session:
    with ``prompt`` it announces the child (title, description, cwd); ``state`` reports its
    work (``running``, or ``idle`` with the stop reason).
    """
    update: dict[str, Any] = {"sessionUpdate": SUBAGENT_UPDATE, "sessionId": child.id}
    if prompt is not None:
        update["title"] = child.agent
        update["description"] = prompt[:DESCRIPTION_CHARS]
        update["cwd"] = child.cwd
        update["_meta"] = {"acp_bridge": {"agent": child.agent, "parent": child.parent}}
    if state is not None:
        snapshot: dict[str, Any] = {"state": state}
        if state == IDLE and child.stop_reason is not None:
            snapshot["stopReason"] = child.stop_reason
        update["state"] = snapshot
    return update


def on_parent_session(params: dict[str, Any], child: Child, root: str) -> dict[str, Any]:
    """
    A child's request as a client without ``subagents`` is shown it: on ``root`` (the session
    it knows), ``_meta.acp_bridge.child`` naming the child and its agent.
    """
    out = dict(params)
    out["sessionId"] = root
    meta = dict(out.get("_meta") or {})
    ours = dict(meta.get("acp_bridge") or {})
    ours["child"] = {"sessionId": child.id, "agent": child.agent, "parent": child.parent}
    meta["acp_bridge"] = ours
    out["_meta"] = meta
    return out
