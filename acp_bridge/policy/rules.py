"""
Approval policy: ``[policy]`` rules as data, and a pure :func:`decide`.

Pure: no I/O, no clock, no trio. The adapter that answers ``session/request_permission``
builds a :class:`PermissionRequest` from the raw params (which it forwards unchanged), asks
:func:`decide`, then :func:`choose_option` for one of the agent's own options, and logs and
audits the outcome; nothing here logs.

Matching is conservative both ways: a rule that *grants* must match for sure, a rule that
*withholds* matches whenever it might. So an ``allow`` rule with a ``path`` glob needs every
path of the request to match it, case-sensitively, after only the safe lexical clean-ups
(``//`` and ``/./``; a path with ``..`` or a relative one never matches). A ``deny`` or
``ask`` rule needs one path to match, ignoring case (case-insensitive file systems exist),
as written or with ``..`` folded away.

Globs on paths (and in the containment deny-list) are translated here by
:func:`compile_glob`: ``*`` and ``?`` stay within one path component, ``**`` crosses ``/``,
``**/`` also matches no directory at all (``/p/**/x`` matches ``/p/x``), ``[...]`` is a
character class (``[!...]`` negated) that never matches ``/``. Globs on agent names and
titles are :func:`fnmatch.fnmatchcase` globs, where ``*`` matches anything.
"""

from __future__ import annotations

import difflib
import enum
import fnmatch
import functools
import json
import math
import posixpath
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

__all__ = [
    "DEFAULT_DENY_PATHS",
    "Action",
    "AgentPolicy",
    "Decision",
    "Option",
    "PermissionRequest",
    "Policy",
    "Rule",
    "choose_option",
    "compile_glob",
    "decide",
    "parse_policy",
    "reject_option",
    "unknown_agents",
]

#: Files agents may not read or write, nor be granted permissions on, unless configured.
DEFAULT_DENY_PATHS: Final = (".env*", "*.pem", "*.key", ".git/config")


class Action(enum.Enum):
    """What a rule, or the default, says to do with a permission request."""

    ALLOW = "allow"
    DENY = "deny"
    #: show the request to a human (a client), who has ``ask_timeout`` seconds
    ASK = "ask"


#: Which action wins when several rules match: deny beats ask beats allow.
_STRENGTH: Final = {Action.ALLOW: 0, Action.ASK: 1, Action.DENY: 2}


def _frozen_map(value: Mapping[str, AgentPolicy]) -> Mapping[str, AgentPolicy]:
    """Copy into a read-only mapping, so a frozen policy stays frozen all the way down."""
    return types.MappingProxyType(dict(value))


@attrs.frozen
class Rule:
    """
    One ``[[policy.rules]]`` (or ``[[policy.agents.NAME.rules]]``) entry.

    A rule matches a request when every criterion it gives matches; it gives at least one.

    Attributes:
        id: names the rule in decisions and the audit log.
        action: what to do when it matches.
        agent: fnmatch glob on the agent name.
        parent: fnmatch glob on the agent name of the session's parent (a sub-agent's
            request); a session without a parent never matches.
        kind: the ACP tool kinds it applies to; a request without a kind never matches.
        title: fnmatch glob on the tool call title; a request without a title never matches.
        path: path glob (see the module docs) on the tool call's locations; a request
            without paths never matches.
        remember: answer with ``allow_always`` / ``reject_always`` when the agent offers it.
    """

    id: str
    action: Action
    agent: str | None = None
    parent: str | None = None
    kind: tuple[str, ...] | None = None
    title: str | None = None
    path: str | None = None
    remember: bool = False


@attrs.frozen
class AgentPolicy:
    """
    One ``[policy.agents.NAME]`` table.

    Attributes:
        default: replaces the global default for this agent; ``None`` keeps it.
        rules: extra rules for this agent only, tried after the global ones.
    """

    default: Action | None = None
    rules: tuple[Rule, ...] = ()


@attrs.frozen
class Policy:
    """
    The ``[policy]`` table.

    Attributes:
        default: the action when no rule matches.
        ask_timeout: seconds a human has to answer; then the request is denied.
        deny_paths: globs of files agents may not touch through the client, and that no
            permission request naming them is granted for, whatever the rules say (see
            :mod:`acp_bridge.policy.containment`).
        rules: the global rules, in file order.
        agents: per-agent overrides, by agent name.
        unattended: what "ask" means when no attached client can answer: ``"deny"`` at
            once, or ``"console"``: wait for an answer from the approval console, up to
            ``ask_timeout``, then deny.
    """

    default: Action = Action.ASK
    ask_timeout: float = 60.0
    deny_paths: tuple[str, ...] = DEFAULT_DENY_PATHS
    rules: tuple[Rule, ...] = ()
    agents: Mapping[str, AgentPolicy] = attrs.field(factory=dict, converter=_frozen_map)
    unattended: str = "deny"


# --- the request ---------------------------------------------------------------------------


@attrs.frozen
class Option:
    """
    One ``PermissionOption`` the agent offered.

    Attributes:
        option_id: what the answer must name.
        kind: ``allow_once``, ``allow_always``, ``reject_once``, ``reject_always`` (or
            whatever a newer agent sends; ``""`` when missing).
        name: the label a human sees (``""`` when missing).
    """

    option_id: str
    kind: str
    name: str


@attrs.frozen
class PermissionRequest:
    """
    What the policy looks at in a ``session/request_permission``; the rest is forwarded as is.

    Attributes:
        tool_call_id: ``toolCall.toolCallId``.
        title: ``toolCall.title``.
        kind: ``toolCall.kind`` (an open enum: any string).
        paths: ``toolCall.locations[].path`` then the ``path`` of ``toolCall.content[]``
            diffs, without repeats, in that order.
        options: the options offered that carry a string ``optionId``.
    """

    tool_call_id: str | None = None
    title: str | None = None
    kind: str | None = None
    paths: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> PermissionRequest:
        """
        Read the request out of raw ``session/request_permission`` params.

        Tolerant: a missing or mistyped field reads as ``None`` or empty; never raises.
        """
        params = _map(params)  # the declared type is a hope, not a check
        call = _map(params.get("toolCall"))
        paths: dict[str, None] = {}  # ordered set
        for location in _list(call.get("locations")):
            if isinstance(location, Mapping) and isinstance(location.get("path"), str):
                paths[location["path"]] = None
        for item in _list(call.get("content")):
            if (
                isinstance(item, Mapping)
                and item.get("type") == "diff"
                and isinstance(item.get("path"), str)
            ):
                paths[item["path"]] = None
        options = tuple(
            Option(
                option["optionId"], _str(option.get("kind")) or "", _str(option.get("name")) or ""
            )
            for option in _list(params.get("options"))
            if isinstance(option, Mapping) and isinstance(option.get("optionId"), str)
        )
        return cls(
            tool_call_id=_str(call.get("toolCallId")),
            title=_str(call.get("title")),
            kind=_str(call.get("kind")),
            paths=tuple(paths),
            options=options,
        )


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


# --- deciding ------------------------------------------------------------------------------


@attrs.frozen
class Decision:
    """
    The policy's verdict on one request.

    Attributes:
        action: allow, deny, or ask a human.
        rule: the id of the rule that decided, ``None`` for the default.
        remember: prefer the ``*_always`` option (the rule says so).
    """

    action: Action
    rule: str | None
    remember: bool = False


def decide(
    request: PermissionRequest, policy: Policy, agent: str, parent: str | None = None
) -> Decision:
    """
    Settle ``request`` from ``agent`` by ``policy``: no I/O, no clock, same answer every time.

    Every matching rule counts, the global ones then the agent's: the strongest action wins
    (deny, then ask, then allow), reported with the first matching rule that has it. With no
    match: the agent's default if it has one, else the global default. ``parent``: the agent
    of the session's parent, for a sub-agent's session.
    """
    overrides = policy.agents.get(agent)
    best: Rule | None = None
    for rule in (*policy.rules, *(overrides.rules if overrides else ())):
        if (best is None or _STRENGTH[rule.action] > _STRENGTH[best.action]) and _matches(
            rule, request, agent, parent
        ):
            best = rule
            if rule.action is Action.DENY:  # nothing beats it, and this one was first
                break
    if best is not None:
        return Decision(best.action, best.id, best.remember)
    if overrides is not None and overrides.default is not None:
        return Decision(overrides.default, None)
    return Decision(policy.default, None)


def _matches(rule: Rule, request: PermissionRequest, agent: str, parent: str | None) -> bool:
    if rule.agent is not None and not fnmatch.fnmatchcase(agent, rule.agent):
        return False
    if rule.parent is not None and (parent is None or not fnmatch.fnmatchcase(parent, rule.parent)):
        return False
    if rule.kind is not None and request.kind not in rule.kind:
        return False
    if rule.title is not None and (
        request.title is None or not fnmatch.fnmatchcase(request.title, rule.title)
    ):
        return False
    if rule.path is not None:
        if not request.paths:
            return False
        if rule.action is Action.ALLOW:
            pattern = compile_glob(rule.path)
            return all(
                (clean := _clean(path)) is not None and pattern.match(clean) is not None
                for path in request.paths
            )
        pattern = compile_glob(rule.path, ignore_case=True)
        return any(
            pattern.match(candidate) is not None
            for path in request.paths
            for candidate in (path, posixpath.normpath(path))
        )
    return True


def _clean(path: str) -> str | None:
    """An absolute path with ``//`` and ``/./`` removed; ``None`` if relative or with ``..``."""
    if not path.startswith("/"):
        return None
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        return None
    return "/" + "/".join(parts)


# --- answering -----------------------------------------------------------------------------


def choose_option(decision: Decision, options: Sequence[Option]) -> Option | None:
    """
    The agent's own option that carries out ``decision``, or ``None``.

    Allow picks an ``allow_once`` option, deny a ``reject_once`` one; with ``remember`` the
    ``*_always`` kind is preferred and the ``*_once`` kind is the fallback. Never an
    ``*_always`` option without ``remember``, never an invented one, never an ambiguous one
    (:func:`_unambiguous`). ``None`` for ask, and when the needed kind is not offered under an
    id of its own: the caller then asks a client if one is attached, and otherwise answers
    ``cancelled``.
    """
    match decision.action:
        case Action.ALLOW:
            kinds = ("allow_always", "allow_once") if decision.remember else ("allow_once",)
        case Action.DENY:
            kinds = ("reject_always", "reject_once") if decision.remember else ("reject_once",)
        case Action.ASK:
            return None
    for kind in kinds:
        for option in options:
            if option.kind == kind and _unambiguous(option, options):
                return option
    return None


def reject_option(options: Sequence[Option]) -> Option | None:
    """
    The first unambiguous ``reject_once`` option, for denying an unattended request; else
    ``None`` (the caller answers ``cancelled``).
    """
    return next((o for o in options if o.kind == "reject_once" and _unambiguous(o, options)), None)


def _unambiguous(option: Option, options: Sequence[Option]) -> bool:
    """
    Whether ``option``'s id says one thing: every option that carries it has its kind.

    The answer names only the id, and an agent that offered ``x`` as both ``allow_once`` and
    ``reject_once`` may read ``x`` either way (the first match, most likely): a deny sent as
    ``x`` could grant, an ``allow_once`` could be read as ``allow_always``.
    """
    return all(o.kind == option.kind for o in options if o.option_id == option.option_id)


# --- globs ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def compile_glob(pattern: str, *, ignore_case: bool = False) -> re.Pattern[str]:
    """
    Compile a path glob (see the module docs) into a regex that must match the whole path.

    Cached: patterns come from the configuration, so there are few of them.

    Raises:
        re.error: a malformed character class, such as ``[z-a]``.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            if j - i == 1:
                out.append("[^/]*")
            elif j < n and pattern[j] == "/" and (i == 0 or pattern[i - 1] == "/"):
                out.append("(?:.*/)?")  # a whole `**/` component: any directories, or none
                j += 1
            else:
                out.append(".*")
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            i = _translate_class(pattern, i, out)
        else:
            out.append(re.escape(c))
            i += 1
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.compile("".join(out) + r"\Z", flags)


def _translate_class(pattern: str, start: int, out: list[str]) -> int:
    """Translate the ``[...]`` at ``start``; a ``[`` without its ``]`` is literal."""
    j = start + 1
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    end = pattern.find("]", j)
    if end < 0:
        out.append(re.escape("["))
        return start + 1
    body = pattern[start + 1 : end]
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    # Escape what a regex class treats specially, but keep `-` ranges.
    body = re.sub(r"([\\\[\]^&~|])", r"\\\1", body)
    out.append(f"[^/{body}]" if negate else f"(?!/)[{body}]")
    return end + 1


# --- the [policy] table --------------------------------------------------------------------

_ACTIONS: Final = tuple(action.value for action in Action)
_BAD_ACTION: Final = f"expected one of {', '.join(map(repr, _ACTIONS))}"
_POLICY_KEYS: Final = ("default", "ask_timeout", "deny_paths", "rules", "agents", "unattended")
#: the values of ``[policy] unattended``
UNATTENDED_MODES: Final = ("deny", "console")
_AGENT_KEYS: Final = ("default", "rules")
_RULE_KEYS: Final = ("id", "agent", "parent", "kind", "title", "path", "action", "remember")
_CRITERIA: Final = ("agent", "parent", "kind", "title", "path")
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")

_KeyPath = tuple[str | int, ...]


def render_key_path(path: Sequence[str | int]) -> str:
    """A key path the way TOML spells it: ``policy.agents."my.agent".rules[2]``."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        else:
            key = step if _BARE_KEY.fullmatch(step) else json.dumps(step, ensure_ascii=False)
            out += f".{key}" if out else key
    return out


class _Problems:
    """Collects problem lines, each naming its key path."""

    def __init__(self) -> None:
        self.unknown: list[str] = []
        self.other: list[str] = []

    def at(self, path: _KeyPath, message: str) -> None:
        self.other.append(f"{render_key_path(path)}: {message}")

    def table(self, value: object, path: _KeyPath, known: Sequence[str], note: str = "") -> bool:
        """Check ``value`` is a table with only ``known`` keys (reporting the others)."""
        if not isinstance(value, Mapping):
            self.at(path, "expected a table")
            return False
        for key in value:
            if key not in known:
                hint = difflib.get_close_matches(str(key), known, n=1)
                # (``agent`` in a per-agent rule is no typo of ``parent``: the note says why)
                suffix = f" (did you mean {hint[0]!r}?)" if hint and key != "agent" else note
                self.unknown.append(f"unknown key {render_key_path((*path, str(key)))!r}{suffix}")
        return True

    def string(self, value: object, path: _KeyPath) -> str | None:
        if not isinstance(value, str):
            self.at(path, "expected a string")
            return None
        if not value:
            self.at(path, "must not be empty")
            return None
        return value

    def action(self, value: object, path: _KeyPath) -> Action | None:
        if isinstance(value, str) and value in _ACTIONS:
            return Action(value)
        self.at(path, _BAD_ACTION)
        return None

    def strings(self, value: object, path: _KeyPath) -> list[tuple[int, str]] | None:
        """Each good item of an array of non-empty strings, with its index."""
        if not isinstance(value, list | tuple):
            self.at(path, "expected an array of strings")
            return None
        items = [(i, self.string(item, (*path, i))) for i, item in enumerate(value)]
        return [(i, item) for i, item in items if item is not None]


def parse_policy(data: Mapping[str, object]) -> tuple[Policy, list[str]]:
    """
    Structure and check a ``[policy]`` table (``{}`` when the file has none).

    Returns:
        The policy, and one line per problem naming its key path (unknown keys first), e.g.
        ``policy.rules[2].action: expected one of 'allow', 'deny', 'ask'``. The policy is
        only meaningful when there are no problems (bad parts are left out of it).
    """
    problems = _Problems()
    policy = _parse(data, problems)
    return policy, problems.unknown + problems.other


def _parse(data: object, problems: _Problems) -> Policy:
    root: _KeyPath = ("policy",)
    if not problems.table(data, root, _POLICY_KEYS):
        return Policy()
    assert isinstance(data, Mapping)  # for mypy: checked just above
    fields: dict[str, Any] = {}
    if "default" in data:
        fields["default"] = problems.action(data["default"], (*root, "default"))
    if "ask_timeout" in data:
        fields["ask_timeout"] = _timeout(data["ask_timeout"], (*root, "ask_timeout"), problems)
    if "deny_paths" in data:
        fields["deny_paths"] = _deny_paths(data["deny_paths"], (*root, "deny_paths"), problems)
    seen: dict[str, str] = {}
    if "rules" in data:
        fields["rules"] = _rules(data["rules"], (*root, "rules"), None, seen, problems)
    if "agents" in data:
        fields["agents"] = _agents(data["agents"], (*root, "agents"), seen, problems)
    if "unattended" in data:
        mode = data["unattended"]
        if mode in UNATTENDED_MODES:
            fields["unattended"] = mode
        else:
            choices = ", ".join(repr(m) for m in UNATTENDED_MODES)
            problems.at((*root, "unattended"), f"expected one of {choices}")
    return Policy(**{key: value for key, value in fields.items() if value is not None})


def _timeout(value: object, path: _KeyPath, problems: _Problems) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.at(path, "expected a number")
    elif math.isinf(value):
        problems.at(path, "must be finite (a request never waits forever)")
    elif not value > 0:  # also catches NaN
        problems.at(path, "must be positive")
    else:
        return float(value)
    return None


def _deny_paths(value: object, path: _KeyPath, problems: _Problems) -> tuple[str, ...] | None:
    if not isinstance(value, list | tuple):
        problems.at(path, "expected an array of strings")
        return None
    good: list[str] = []
    for i, item in enumerate(value):
        pattern = problems.string(item, (*path, i))
        if pattern is None:
            continue
        if pattern.startswith("/"):
            problems.at((*path, i), "must be relative to the session roots (no leading '/')")
        elif (error := _glob_error(pattern)) is not None:
            problems.at((*path, i), error)
        else:
            good.append(pattern)
    return tuple(good)


def _glob_error(pattern: str) -> str | None:
    try:
        compile_glob(pattern)
    except re.error as exc:
        return f"invalid glob ({exc.msg})"
    return None


def _rules(
    value: object, path: _KeyPath, agent: str | None, seen: dict[str, str], problems: _Problems
) -> tuple[Rule, ...] | None:
    if not isinstance(value, list | tuple):
        problems.at(path, f"expected an array of tables, e.g. [[{render_key_path(path)}]]")
        return None
    rules = (
        _rule(table, (*path, i), i + 1, agent, seen, problems) for i, table in enumerate(value)
    )
    return tuple(rule for rule in rules if rule is not None)


def _rule(
    table: object,
    path: _KeyPath,
    number: int,
    agent: str | None,
    seen: dict[str, str],
    problems: _Problems,
) -> Rule | None:
    """One rule; ``agent`` is the owner of a per-agent rule, which has no ``agent`` key."""
    known = _RULE_KEYS if agent is None else tuple(k for k in _RULE_KEYS if k != "agent")
    note = "" if agent is None else f" (a rule here applies to agent {agent!r} only)"
    if not problems.table(table, path, known, note):
        return None
    assert isinstance(table, Mapping)  # for mypy: checked just above
    before = len(problems.other)
    default_id = f"rule-{number}" if agent is None else f"{agent}/rule-{number}"
    rule_id = problems.string(table["id"], (*path, "id")) if "id" in table else default_id
    if "action" in table:
        action = problems.action(table["action"], (*path, "action"))
    else:
        problems.at((*path, "action"), "required key missing")
        action = None
    fields: dict[str, Any] = {}
    for key in ("agent", "parent", "title", "path"):
        if key in table and key in known:
            fields[key] = problems.string(table[key], (*path, key))
    if "kind" in table:
        fields["kind"] = _kinds(table["kind"], (*path, "kind"), problems)
    pattern = fields.get("path")
    if pattern is not None:
        if not pattern.startswith(("/", "**")):
            problems.at(
                (*path, "path"),
                "expected an absolute glob (starting with '/' or '**'), "
                "e.g. '/home/me/project/**' or '**/*.pem'",
            )
        elif (error := _glob_error(pattern)) is not None:
            problems.at((*path, "path"), error)
    if "remember" in table:
        remember = table["remember"]
        if not isinstance(remember, bool):
            problems.at((*path, "remember"), "expected true or false")
        elif remember and action is Action.ASK:
            problems.at((*path, "remember"), "applies to allow and deny rules only")
        fields["remember"] = remember
    criteria = [key for key in _CRITERIA if key in known]
    if not any(key in table for key in criteria):
        if agent is None:
            whose, instead = "", "policy.default"
        else:
            whose = f" of agent {agent!r}"
            instead = render_key_path(("policy", "agents", agent, "default"))
        problems.at(
            path,
            f"matches every request{whose}: give at least one of {', '.join(criteria)} "
            f"(or set {instead} instead)",
        )
    if rule_id is not None:
        if rule_id in seen:
            problems.at((*path, "id"), f"duplicate rule id {rule_id!r} (also {seen[rule_id]})")
        else:
            seen[rule_id] = render_key_path(path)
    if len(problems.other) > before or rule_id is None or action is None:
        return None
    return Rule(id=rule_id, action=action, **fields)


def _kinds(value: object, path: _KeyPath, problems: _Problems) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (value,) if problems.string(value, path) is not None else None
    if not isinstance(value, list | tuple):
        problems.at(path, "expected a string or an array of strings")
        return None
    if not value:
        problems.at(path, "must not be empty (leave kind out to match any kind)")
        return None
    items = problems.strings(value, path)
    return None if items is None else tuple(item for _, item in items)


def _agents(
    value: object, path: _KeyPath, seen: dict[str, str], problems: _Problems
) -> dict[str, AgentPolicy] | None:
    if not isinstance(value, Mapping):
        problems.at(path, f"expected a table of agents, e.g. [{render_key_path(path)}.NAME]")
        return None
    agents: dict[str, AgentPolicy] = {}
    for name, table in value.items():
        where = (*path, str(name))
        if not problems.table(table, where, _AGENT_KEYS):
            continue
        assert isinstance(table, Mapping)  # for mypy: checked just above
        default = (
            problems.action(table["default"], (*where, "default")) if "default" in table else None
        )
        rules = (
            _rules(table["rules"], (*where, "rules"), str(name), seen, problems)
            if "rules" in table
            else ()
        )
        agents[str(name)] = AgentPolicy(default=default, rules=rules or ())
    return agents


def unknown_agents(policy: Policy, agents: Sequence[str]) -> list[str]:
    """
    Problems for ``[policy.agents.NAME]`` tables that name no configured agent.

    For the config loader, which knows the agents; a misspelt name would otherwise leave
    that agent under the global rules without a word.
    """
    known = ", ".join(agents) or "none"
    return [
        f"{render_key_path(('policy', 'agents', name))}: unknown agent {name!r} "
        f"(configured: {known})"
        for name in policy.agents
        if name not in agents
    ]
