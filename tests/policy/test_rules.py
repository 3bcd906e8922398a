"""The approval policy: decide(), choose_option(), the [policy] table, globs. Pure, no trio."""

from __future__ import annotations

import itertools
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from acp_bridge.policy.rules import (
    DEFAULT_DENY_PATHS,
    Action,
    AgentPolicy,
    Decision,
    Option,
    PermissionRequest,
    Policy,
    Rule,
    choose_option,
    compile_glob,
    decide,
    parse_policy,
    reject_option,
    unknown_agents,
)

ALLOW, DENY, ASK = Action.ALLOW, Action.DENY, Action.ASK


def req(kind=None, title=None, paths=()):
    return PermissionRequest(tool_call_id="call_1", title=title, kind=kind, paths=tuple(paths))


def rule(rule_id, action, **criteria):
    if isinstance(criteria.get("kind"), str):
        criteria["kind"] = (criteria["kind"],)
    elif "kind" in criteria:
        criteria["kind"] = tuple(criteria["kind"])
    return Rule(id=rule_id, action=action, **criteria)


def policy(*rules, default=ASK, agents=None):
    return Policy(default=default, rules=rules, agents=agents or {})


# ----------------------------------------------------------------------------- decide()

READ = req(kind="read", title="Read /p/a.txt", paths=["/p/a.txt"])

DECIDE_CASES = [
    # (id, policy, request, agent, expected decision)
    ("no-rules-default-ask", policy(), READ, "demo", Decision(ASK, None)),
    ("global-default-deny", policy(default=DENY), READ, "demo", Decision(DENY, None)),
    ("global-default-allow", policy(default=ALLOW), READ, "demo", Decision(ALLOW, None)),
    # kinds
    ("kind-single", policy(rule("r", ALLOW, kind="read")), READ, "demo", Decision(ALLOW, "r")),
    (
        "kind-list",
        policy(rule("r", ALLOW, kind=["search", "read"])),
        READ,
        "demo",
        Decision(ALLOW, "r"),
    ),
    ("kind-other", policy(rule("r", ALLOW, kind="edit")), READ, "demo", Decision(ASK, None)),
    ("kind-missing", policy(rule("r", DENY, kind="read")), req(), "demo", Decision(ASK, None)),
    (
        "kind-open-enum",
        policy(rule("r", DENY, kind="teleport")),
        req(kind="teleport"),
        "demo",
        Decision(DENY, "r"),
    ),
    (
        "kind-case-sensitive",
        policy(rule("r", DENY, kind="Read")),
        READ,
        "demo",
        Decision(ASK, None),
    ),
    # titles: fnmatchcase, where * crosses "/"
    ("title-glob", policy(rule("r", ALLOW, title="Read *")), READ, "demo", Decision(ALLOW, "r")),
    (
        "title-glob-miss",
        policy(rule("r", ALLOW, title="Write *")),
        READ,
        "demo",
        Decision(ASK, None),
    ),
    ("title-case", policy(rule("r", ALLOW, title="read *")), READ, "demo", Decision(ASK, None)),
    (
        "title-missing",
        policy(rule("r", DENY, title="*")),
        req(kind="read"),
        "demo",
        Decision(ASK, None),
    ),
    (
        "title-question-mark",
        policy(rule("r", DENY, title="Run rm -rf ?")),
        req(title="Run rm -rf /"),
        "demo",
        Decision(DENY, "r"),
    ),
    # agent globs
    ("agent-glob", policy(rule("r", ALLOW, agent="dem*")), READ, "demo", Decision(ALLOW, "r")),
    ("agent-glob-miss", policy(rule("r", ALLOW, agent="dem*")), READ, "other", Decision(ASK, None)),
    ("agent-exact", policy(rule("r", DENY, agent="demo")), READ, "demo2", Decision(ASK, None)),
    # all criteria must match
    (
        "all-criteria-match",
        policy(rule("r", ALLOW, agent="demo", kind="read", title="Read *", path="/p/*")),
        READ,
        "demo",
        Decision(ALLOW, "r"),
    ),
    (
        "one-criterion-fails",
        policy(rule("r", ALLOW, agent="demo", kind="read", title="Write *", path="/p/*")),
        READ,
        "demo",
        Decision(ASK, None),
    ),
    # precedence: deny > ask > allow, whatever the order
    (
        "deny-after-allow",
        policy(rule("a", ALLOW, kind="read"), rule("d", DENY, path="/p/**")),
        READ,
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "deny-before-allow",
        policy(rule("d", DENY, path="/p/**"), rule("a", ALLOW, kind="read")),
        READ,
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "ask-beats-allow",
        policy(rule("a", ALLOW, kind="read"), rule("q", ASK, title="Read *")),
        READ,
        "demo",
        Decision(ASK, "q"),
    ),
    (
        "deny-beats-ask",
        policy(rule("q", ASK, kind="read"), rule("d", DENY, agent="*")),
        READ,
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "deny-beats-remembered-allow",
        policy(rule("a", ALLOW, kind="read", remember=True), rule("d", DENY, kind="read")),
        READ,
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "rule-beats-default-deny",
        policy(rule("a", ALLOW, kind="read"), default=DENY),
        READ,
        "demo",
        Decision(ALLOW, "a"),
    ),
    # the first matching rule with the winning action is reported
    (
        "first-deny-reported",
        policy(
            rule("a", ALLOW, kind="read"),
            rule("d1", DENY, title="Read *"),
            rule("d2", DENY, kind="read"),
        ),
        READ,
        "demo",
        Decision(DENY, "d1"),
    ),
    (
        "first-allow-reported",
        policy(
            rule("x", ALLOW, kind="edit"),
            rule("a1", ALLOW, kind="read"),
            rule("a2", ALLOW, agent="*"),
        ),
        READ,
        "demo",
        Decision(ALLOW, "a1"),
    ),
    (
        "first-ask-reported",
        policy(
            rule("q1", ASK, kind="read"), rule("a", ALLOW, kind="read"), rule("q2", ASK, agent="*")
        ),
        READ,
        "demo",
        Decision(ASK, "q1"),
    ),
    # remember
    (
        "remember-carried",
        policy(rule("a", ALLOW, kind="read", remember=True)),
        READ,
        "demo",
        Decision(ALLOW, "a", remember=True),
    ),
    (
        "remember-of-reported-rule",
        policy(rule("d1", DENY, kind="read"), rule("d2", DENY, agent="*", remember=True)),
        READ,
        "demo",
        Decision(DENY, "d1", remember=False),
    ),
    (
        "default-never-remembers",
        policy(rule("a", ALLOW, kind="edit", remember=True), default=ALLOW),
        READ,
        "demo",
        Decision(ALLOW, None, remember=False),
    ),
    # paths: allow needs every path, deny/ask any
    (
        "allow-all-paths",
        policy(rule("a", ALLOW, path="/p/**")),
        req(paths=["/p/a", "/p/b/c"]),
        "demo",
        Decision(ALLOW, "a"),
    ),
    (
        "allow-one-path-outside",
        policy(rule("a", ALLOW, path="/p/**")),
        req(paths=["/p/a", "/etc/passwd"]),
        "demo",
        Decision(ASK, None),
    ),
    (
        "deny-any-path",
        policy(rule("d", DENY, path="**/*.pem")),
        req(paths=["/p/a", "/p/key.pem"]),
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "ask-any-path",
        policy(rule("q", ASK, path="/etc/**"), default=ALLOW),
        req(paths=["/p/a", "/etc/hosts"]),
        "demo",
        Decision(ASK, "q"),
    ),
    ("allow-no-paths", policy(rule("a", ALLOW, path="/**")), req(), "demo", Decision(ASK, None)),
    (
        "deny-no-paths",
        policy(rule("d", DENY, path="/**"), default=ALLOW),
        req(),
        "demo",
        Decision(ALLOW, None),
    ),
    # ** crosses "/", * and ? do not
    (
        "star-one-level",
        policy(rule("a", ALLOW, path="/p/*")),
        req(paths=["/p/a"]),
        "demo",
        Decision(ALLOW, "a"),
    ),
    (
        "star-not-deeper",
        policy(rule("a", ALLOW, path="/p/*")),
        req(paths=["/p/a/b"]),
        "demo",
        Decision(ASK, None),
    ),
    (
        "doublestar-deeper",
        policy(rule("a", ALLOW, path="/p/**")),
        req(paths=["/p/a/b/c"]),
        "demo",
        Decision(ALLOW, "a"),
    ),
    (
        "doublestar-slash-zero-dirs",
        policy(rule("d", DENY, path="/p/**/secret")),
        req(paths=["/p/secret"]),
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "question-not-slash",
        policy(rule("a", ALLOW, path="/p?x")),
        req(paths=["/p/x"]),
        "demo",
        Decision(ASK, None),
    ),
    (
        "prefix-is-not-a-dir",
        policy(rule("a", ALLOW, path="/p/**")),
        req(paths=["/p2/a"]),
        "demo",
        Decision(ASK, None),
    ),
    # conservative path matching: allow is strict, deny is generous
    (
        "allow-dotdot-never-matches",
        policy(rule("a", ALLOW, path="/p/**")),
        req(paths=["/p/../etc/passwd"]),
        "demo",
        Decision(ASK, None),
    ),
    (
        "allow-relative-never-matches",
        policy(rule("a", ALLOW, path="**")),
        req(paths=["a.txt"]),
        "demo",
        Decision(ASK, None),
    ),
    (
        "allow-double-slash-cleaned",
        policy(rule("a", ALLOW, path="/p/*")),
        req(paths=["//p//./a"]),
        "demo",
        Decision(ALLOW, "a"),
    ),
    (
        "allow-case-sensitive",
        policy(rule("a", ALLOW, path="/p/**")),
        req(paths=["/P/a"]),
        "demo",
        Decision(ASK, None),
    ),
    (
        "deny-dotdot-folded",
        policy(rule("d", DENY, path="/etc/**"), default=ALLOW),
        req(paths=["/p/../etc/passwd"]),
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "deny-dotdot-as-written",
        policy(rule("d", DENY, path="/p/**"), default=ALLOW),
        req(paths=["/p/../etc/passwd"]),
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "deny-ignores-case",
        policy(rule("d", DENY, path="**/*.pem"), default=ALLOW),
        req(paths=["/p/KEY.PEM"]),
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "deny-relative-path",
        policy(rule("d", DENY, path="**/*.pem"), default=ALLOW),
        req(paths=["key.pem"]),
        "demo",
        Decision(DENY, "d"),
    ),
    # per-agent defaults and rules
    (
        "agent-default",
        policy(agents={"demo": AgentPolicy(default=DENY)}),
        READ,
        "demo",
        Decision(DENY, None),
    ),
    (
        "other-agent-global-default",
        policy(agents={"demo": AgentPolicy(default=DENY)}, default=ALLOW),
        READ,
        "other",
        Decision(ALLOW, None),
    ),
    (
        "agent-without-default",
        policy(agents={"demo": AgentPolicy(rules=(rule("x", DENY, kind="edit"),))}, default=ALLOW),
        READ,
        "demo",
        Decision(ALLOW, None),
    ),
    (
        "agent-rule",
        policy(agents={"demo": AgentPolicy(rules=(rule("demo/r", ALLOW, kind="read"),))}),
        READ,
        "demo",
        Decision(ALLOW, "demo/r"),
    ),
    (
        "agent-rule-not-for-others",
        policy(agents={"demo": AgentPolicy(rules=(rule("demo/r", ALLOW, kind="read"),))}),
        READ,
        "other",
        Decision(ASK, None),
    ),
    (
        "agent-deny-beats-global-allow",
        policy(
            rule("a", ALLOW, kind="read"),
            agents={"demo": AgentPolicy(rules=(rule("demo/d", DENY, kind="read"),))},
        ),
        READ,
        "demo",
        Decision(DENY, "demo/d"),
    ),
    (
        "global-deny-beats-agent-allow",
        policy(
            rule("d", DENY, path="/p/**"),
            agents={"demo": AgentPolicy(rules=(rule("demo/a", ALLOW, kind="read"),))},
        ),
        READ,
        "demo",
        Decision(DENY, "d"),
    ),
    (
        "global-before-agent-same-action",
        policy(
            rule("g", ASK, kind="read"),
            agents={"demo": AgentPolicy(rules=(rule("demo/q", ASK, kind="read"),))},
        ),
        READ,
        "demo",
        Decision(ASK, "g"),
    ),
    (
        "agent-rule-beats-agent-default",
        policy(
            agents={"demo": AgentPolicy(default=DENY, rules=(rule("demo/a", ALLOW, kind="read"),))}
        ),
        READ,
        "demo",
        Decision(ALLOW, "demo/a"),
    ),
    (
        "global-rule-beats-agent-default",
        policy(rule("a", ALLOW, kind="read"), agents={"demo": AgentPolicy(default=DENY)}),
        READ,
        "demo",
        Decision(ALLOW, "a"),
    ),
]


@pytest.mark.parametrize(
    ("pol", "request_", "agent", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in DECIDE_CASES],
)
def test_decide(pol, request_, agent, expected):
    assert decide(request_, pol, agent) == expected


# ----------------------------------------------------------------------------- choose_option()

KINDS = ("allow_once", "allow_always", "reject_once", "reject_always")
OFFERS = [
    tuple(Option(f"opt-{kind}", kind, kind) for kind in subset)
    for n in range(len(KINDS) + 1)
    for subset in itertools.combinations(KINDS, n)
]
DECISIONS = [
    Decision(action, "r", remember) for action in (ALLOW, DENY, ASK) for remember in (False, True)
]


def expected_kind(decision, offered):
    """The rule, stated once more by hand."""
    if decision.action is ASK:
        return None
    verb = "allow" if decision.action is ALLOW else "reject"
    if decision.remember and f"{verb}_always" in offered:
        return f"{verb}_always"
    if f"{verb}_once" in offered:
        return f"{verb}_once"
    return None


@pytest.mark.parametrize("offer", OFFERS, ids=lambda o: "+".join(x.kind for x in o) or "none")
@pytest.mark.parametrize(
    "decision", DECISIONS, ids=lambda d: d.action.value + ("-remember" if d.remember else "")
)
def test_choose_option_every_combination(decision, offer):
    """Only the agent's own options; *_always only with remember; None when not offered."""
    chosen = choose_option(decision, offer)
    kind = expected_kind(decision, {option.kind for option in offer})
    if kind is None:
        assert chosen is None
    else:
        assert chosen is not None
        assert chosen.kind == kind
        assert any(chosen is option for option in offer)
    if chosen is not None and not decision.remember:
        assert not chosen.kind.endswith("_always")


def test_choose_option_takes_the_first_of_a_kind_and_ignores_unknown_kinds():
    options = [
        Option("weird", "allow_sometimes", "?"),
        Option("first", "allow_once", "Allow"),
        Option("second", "allow_once", "Allow again"),
    ]
    assert choose_option(Decision(ALLOW, None), options) == options[1]
    assert choose_option(Decision(DENY, None), options) is None


@pytest.mark.parametrize("offer", OFFERS, ids=lambda o: "+".join(x.kind for x in o) or "none")
def test_reject_option(offer):
    """The unattended answer: a reject_once option or nothing, never reject_always."""
    chosen = reject_option(offer)
    if any(option.kind == "reject_once" for option in offer):
        assert chosen is not None
        assert chosen.kind == "reject_once"
    else:
        assert chosen is None


AMBIGUOUS = [
    pytest.param(
        [Option("x", "allow_once", "Allow"), Option("x", "reject_once", "Reject")],
        [(DENY, False, None), (ALLOW, False, None)],
        id="one-id-allow-and-reject",
    ),
    pytest.param(
        [Option("x", "allow_once", "Once"), Option("x", "allow_always", "Always")],
        [(ALLOW, False, None), (ALLOW, True, None)],
        id="one-id-two-allow-kinds",
    ),
    pytest.param(
        [
            Option("a", "allow_once", "Allow"),
            Option("r", "reject_once", "Reject"),
            Option("r", "allow_always", "Always"),
        ],
        [(DENY, False, None), (ALLOW, False, "a"), (ALLOW, True, "a")],
        id="the-reject-id-is-also-an-allow-id",
    ),
    pytest.param(
        [
            Option("x", "reject_once", "Reject"),
            Option("x", "allow_once", "Allow"),
            Option("no", "reject_once", "No"),
        ],
        [(DENY, False, "no"), (ALLOW, False, None)],
        id="an-unambiguous-reject-further-on",
    ),
]


@pytest.mark.parametrize(("options", "expected"), AMBIGUOUS)
def test_an_id_that_several_kinds_share_is_never_the_answer(options, expected):
    """The answer names only the id: one that means two things is never sent."""
    for action, remember, option_id in expected:
        chosen = choose_option(Decision(action, "r", remember), options)
        assert (chosen.option_id if chosen else None) == option_id, (action, remember)
    deny = choose_option(Decision(DENY, "r"), options)
    assert (reject_option(options) or None) == deny


# ----------------------------------------------------------------------------- from_params()


def test_from_params_reads_the_fields_the_policy_uses():
    params = {
        "sessionId": "s",
        "toolCall": {
            "toolCallId": "call_7",
            "title": "Edit a.py",
            "kind": "edit",
            "locations": [{"path": "/p/a.py", "line": 3}, {"path": "/p/b.py"}, {"line": 1}],
            "content": [
                {"type": "diff", "path": "/p/c.py", "oldText": "x", "newText": "y"},
                {"type": "diff", "path": "/p/a.py", "newText": "z"},
                {"type": "content", "content": {"type": "text", "text": "/p/not-a-path"}},
            ],
            "rawInput": {"path": "/ignored"},
        },
        "options": [
            {"optionId": "yes", "name": "Yes", "kind": "allow_once"},
            {"optionId": "no", "name": "No", "kind": "reject_once", "_meta": {}},
            {"name": "no id", "kind": "allow_always"},
            {"optionId": "odd", "kind": 5},
        ],
    }
    assert PermissionRequest.from_params(params) == PermissionRequest(
        tool_call_id="call_7",
        title="Edit a.py",
        kind="edit",
        paths=("/p/a.py", "/p/b.py", "/p/c.py"),
        options=(
            Option("yes", "allow_once", "Yes"),
            Option("no", "reject_once", "No"),
            Option("odd", "", ""),
        ),
    )


@pytest.mark.parametrize(
    "params",
    [
        None,
        5,
        "x",
        [],
        {},
        {"toolCall": None, "options": None},
        {"toolCall": 5, "options": "allow_once"},
        {"toolCall": [], "options": [None, 5, "x", []]},
        {"toolCall": {"toolCallId": 5, "title": [], "kind": {}, "locations": 5, "content": "x"}},
        {"toolCall": {"locations": [None, 5, {"path": 5}], "content": [None, {"type": "diff"}]}},
        {"options": [{"optionId": None}, {"optionId": 5}]},
    ],
)
def test_from_params_tolerates_garbage(params):
    assert PermissionRequest.from_params(params) == PermissionRequest()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["toolCall", "options", "locations", "content", "path", "type", "kind"])
            | st.text(max_size=5),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@given(JSON)
def test_from_params_never_raises(params):
    request = PermissionRequest.from_params(params)
    assert all(isinstance(path, str) for path in request.paths)
    assert all(isinstance(option.option_id, str) for option in request.options)


# ----------------------------------------------------------------------------- globs


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/p/*", "/p/a", True),
        ("/p/*", "/p/a/b", False),
        ("/p/*", "/p/", True),
        ("/p/**", "/p/a/b", True),
        ("/p/**", "/p", False),
        ("/p/**/x", "/p/x", True),
        ("/p/**/x", "/p/a/b/x", True),
        ("/p/**/x", "/p/ax", False),
        ("/p/a**", "/p/ab/c", True),
        ("**/*.pem", "/a/b/k.pem", True),
        ("**/*.pem", "k.pem", True),
        ("**/*.pem", "/a/k.pem/x", False),
        ("/p/?", "/p/a", True),
        ("/p/?", "/p/ab", False),
        ("/p?a", "/p/a", False),
        ("/p/[ab]", "/p/b", True),
        ("/p/[ab]", "/p/c", False),
        ("/p/[a-c]x", "/p/bx", True),
        ("/p/[!a]", "/p/b", True),
        ("/p/[!a]", "/p/a", False),
        ("/p[!a]x", "/p/x", False),
        ("/p[/]x", "/p/x", False),
        ("/p/[]]", "/p/]", True),
        ("/p/[", "/p/[", True),
        ("/p/[^]", "/p/^", True),
        ("/p/a.b", "/p/aXb", False),
        ("/p/(x)+", "/p/(x)+", True),
        ("/p/a", "/p/a\n", False),
        ("/p/*", "/p/a\nb", True),
    ],
)
def test_compile_glob(pattern, path, matches):
    assert (compile_glob(pattern).match(path) is not None) is matches


def test_compile_glob_ignore_case():
    assert compile_glob("**/*.PEM", ignore_case=True).match("/a/k.pem")
    assert not compile_glob("**/*.PEM").match("/a/k.pem")


# ----------------------------------------------------------------------------- parse_policy()


def parse(text: str) -> tuple[Policy, list[str]]:
    return parse_policy(tomllib.loads(text).get("policy", {}))


def test_parse_defaults():
    """No [policy] table: ask, 60 s, the default deny-list, no rules."""
    assert parse_policy({}) == (Policy(), [])
    assert Policy() == Policy(
        default=ASK, ask_timeout=60.0, deny_paths=DEFAULT_DENY_PATHS, rules=(), agents={}
    )
    assert DEFAULT_DENY_PATHS == (".env*", "*.pem", "*.key", ".git/config")


EXAMPLE = """
[policy]
default = "deny"
ask_timeout = 30
deny_paths = [".env*", "secrets"]

[[policy.rules]]
id = "reads"
agent = "demo*"
kind = ["read", "search"]
title = "Read *"
path = "/home/me/proj/**"
action = "allow"
remember = true

[[policy.rules]]
kind = "execute"
action = "ask"

[policy.agents.demo]
default = "ask"
[[policy.agents.demo.rules]]
kind = "edit"
action = "deny"
[[policy.agents.demo.rules]]
id = "demo-fetch"
kind = "fetch"
action = "allow"

[policy.agents."my.agent"]
"""


def test_parse_full_example():
    pol, problems = parse(EXAMPLE)
    assert problems == []
    assert pol == Policy(
        default=DENY,
        ask_timeout=30.0,
        deny_paths=(".env*", "secrets"),
        rules=(
            Rule(
                id="reads",
                action=ALLOW,
                agent="demo*",
                kind=("read", "search"),
                title="Read *",
                path="/home/me/proj/**",
                remember=True,
            ),
            Rule(id="rule-2", action=ASK, kind=("execute",)),
        ),
        agents={
            "demo": AgentPolicy(
                default=ASK,
                rules=(
                    Rule(id="demo/rule-1", action=DENY, kind=("edit",)),
                    Rule(id="demo-fetch", action=ALLOW, kind=("fetch",)),
                ),
            ),
            "my.agent": AgentPolicy(),
        },
    )
    assert isinstance(pol.ask_timeout, float)


def test_parsed_policy_is_frozen():
    pol, _ = parse(EXAMPLE)
    with pytest.raises(TypeError):
        pol.agents["x"] = AgentPolicy()  # type: ignore[index]


def test_deny_paths_can_be_emptied():
    assert parse("[policy]\ndeny_paths = []\n") == (Policy(deny_paths=()), [])


OK_RULE = '[[policy.rules]]\nkind = "read"\naction = "allow"\n'

PROBLEM_CASES = [
    # unknown keys, at every level
    ("[policy]\ndefualt = 'ask'\n", "unknown key 'policy.defualt' (did you mean 'default'?)"),
    ("[policy]\nzzz = 1\n", "unknown key 'policy.zzz'"),
    (OK_RULE + "acton = 'deny'\n", "unknown key 'policy.rules[0].acton' (did you mean 'action'?)"),
    (OK_RULE + "paths = '/x'\n", "unknown key 'policy.rules[0].paths' (did you mean 'path'?)"),
    (
        "[policy.agents.demo]\ndefault = 'deny'\nrule = []\n",
        "unknown key 'policy.agents.demo.rule' (did you mean 'rules'?)",
    ),
    (
        "[[policy.agents.demo.rules]]\nkind = 'read'\naction = 'allow'\nremmber = true\n",
        "unknown key 'policy.agents.demo.rules[0].remmber' (did you mean 'remember'?)",
    ),
    (
        "[[policy.agents.demo.rules]]\nkind = 'read'\naction = 'allow'\nagent = 'x'\n",
        "unknown key 'policy.agents.demo.rules[0].agent' "
        "(a rule here applies to agent 'demo' only)",
    ),
    (
        '[policy.agents."my.agent"]\nx = 1\n',
        "unknown key 'policy.agents.\"my.agent\".x'",
    ),
    # wrong types
    ("[policy]\ndefault = 1\n", "policy.default: expected one of 'allow', 'deny', 'ask'"),
    ("[policy]\ndefault = 'maybe'\n", "policy.default: expected one of 'allow', 'deny', 'ask'"),
    ("[policy]\ndefault = 'Allow'\n", "policy.default: expected one of 'allow', 'deny', 'ask'"),
    ("[policy]\nask_timeout = '60'\n", "policy.ask_timeout: expected a number"),
    ("[policy]\nask_timeout = true\n", "policy.ask_timeout: expected a number"),
    ("[policy]\nask_timeout = 0\n", "policy.ask_timeout: must be positive"),
    ("[policy]\nask_timeout = -1.5\n", "policy.ask_timeout: must be positive"),
    ("[policy]\nask_timeout = nan\n", "policy.ask_timeout: must be positive"),
    (
        "[policy]\nask_timeout = inf\n",
        "policy.ask_timeout: must be finite (a request never waits forever)",
    ),
    ("[policy]\ndeny_paths = '.env'\n", "policy.deny_paths: expected an array of strings"),
    ("[policy]\ndeny_paths = ['.env', 5]\n", "policy.deny_paths[1]: expected a string"),
    ("[policy]\ndeny_paths = ['']\n", "policy.deny_paths[0]: must not be empty"),
    (
        "[policy]\ndeny_paths = ['/etc/shadow']\n",
        "policy.deny_paths[0]: must be relative to the session roots (no leading '/')",
    ),
    (
        "[policy]\ndeny_paths = ['[z-a]']\n",
        "policy.deny_paths[0]: invalid glob (bad character range z-a)",
    ),
    ("[policy]\nrules = 5\n", "policy.rules: expected an array of tables, e.g. [[policy.rules]]"),
    ("[policy]\nrules = [5]\n", "policy.rules[0]: expected a table"),
    (
        "[policy]\nagents = 5\n",
        "policy.agents: expected a table of agents, e.g. [policy.agents.NAME]",
    ),
    ("[policy.agents]\ndemo = 5\n", "policy.agents.demo: expected a table"),
    (
        "[policy.agents.demo]\nrules = {}\n",
        "policy.agents.demo.rules: expected an array of tables, e.g. [[policy.agents.demo.rules]]",
    ),
    (
        "[policy.agents.demo]\ndefault = 'never'\n",
        "policy.agents.demo.default: expected one of 'allow', 'deny', 'ask'",
    ),
    # rules: action, criteria, ids
    ("[[policy.rules]]\nkind = 'read'\n", "policy.rules[0].action: required key missing"),
    (
        "[[policy.rules]]\nkind = 'read'\naction = 'yes'\n",
        "policy.rules[0].action: expected one of 'allow', 'deny', 'ask'",
    ),
    (
        "[[policy.rules]]\nkind = 'read'\naction = ['allow']\n",
        "policy.rules[0].action: expected one of 'allow', 'deny', 'ask'",
    ),
    (
        "[[policy.rules]]\naction = 'allow'\n",
        "policy.rules[0]: matches every request: give at least one of agent, parent, kind, title, "
        "path (or set policy.default instead)",
    ),
    (
        "[[policy.agents.demo.rules]]\naction = 'deny'\n",
        "policy.agents.demo.rules[0]: matches every request of agent 'demo': give at least one "
        "of parent, kind, title, path (or set policy.agents.demo.default instead)",
    ),
    (
        "[[policy.rules]]\nkind = 5\naction = 'allow'\n",
        "policy.rules[0].kind: expected a string or an array of strings",
    ),
    (
        "[[policy.rules]]\nkind = []\naction = 'allow'\n",
        "policy.rules[0].kind: must not be empty (leave kind out to match any kind)",
    ),
    (
        "[[policy.rules]]\nkind = ['read', 5]\naction = 'allow'\n",
        "policy.rules[0].kind[1]: expected a string",
    ),
    ("[[policy.rules]]\nkind = ''\naction = 'allow'\n", "policy.rules[0].kind: must not be empty"),
    ("[[policy.rules]]\ntitle = 5\naction = 'allow'\n", "policy.rules[0].title: expected a string"),
    (
        "[[policy.rules]]\nagent = ''\naction = 'allow'\n",
        "policy.rules[0].agent: must not be empty",
    ),
    (
        "[[policy.rules]]\npath = 'src/**'\naction = 'allow'\n",
        "policy.rules[0].path: expected an absolute glob (starting with '/' or '**'), "
        "e.g. '/home/me/project/**' or '**/*.pem'",
    ),
    (
        "[[policy.rules]]\npath = '/p/[z-a]'\naction = 'allow'\n",
        "policy.rules[0].path: invalid glob (bad character range z-a)",
    ),
    (
        OK_RULE + "remember = 'yes'\n",
        "policy.rules[0].remember: expected true or false",
    ),
    (
        "[[policy.rules]]\nkind = 'read'\naction = 'ask'\nremember = true\n",
        "policy.rules[0].remember: applies to allow and deny rules only",
    ),
    (OK_RULE + "id = 5\n", "policy.rules[0].id: expected a string"),
    (OK_RULE + "id = ''\n", "policy.rules[0].id: must not be empty"),
    (
        OK_RULE + "id = 'x'\n" + OK_RULE + "id = 'x'\n",
        "policy.rules[1].id: duplicate rule id 'x' (also policy.rules[0])",
    ),
    (
        OK_RULE + OK_RULE + "id = 'rule-1'\n",
        "policy.rules[1].id: duplicate rule id 'rule-1' (also policy.rules[0])",
    ),
    (
        OK_RULE + "id = 'demo/rule-1'\n"
        "[[policy.agents.demo.rules]]\nkind = 'edit'\naction = 'deny'\n",
        "policy.agents.demo.rules[0].id: duplicate rule id 'demo/rule-1' (also policy.rules[0])",
    ),
]


@pytest.mark.parametrize(("text", "problem"), PROBLEM_CASES)
def test_parse_problem(text, problem):
    """Each mistake is reported once, naming its key path."""
    _, problems = parse(text)
    assert problems == [problem]


def test_parse_reports_every_problem_unknown_keys_first():
    _, problems = parse(
        "[policy]\ndefault = 'x'\nask_timeout = 0\nzzz = 1\n"
        "[[policy.rules]]\nkind = 'read'\naction = 'y'\n"
    )
    assert problems == [
        "unknown key 'policy.zzz'",
        "policy.default: expected one of 'allow', 'deny', 'ask'",
        "policy.ask_timeout: must be positive",
        "policy.rules[0].action: expected one of 'allow', 'deny', 'ask'",
    ]


@pytest.mark.parametrize("data", [None, 5, "ask", []])
def test_parse_policy_that_is_not_a_table(data):
    assert parse_policy(data) == (Policy(), ["policy: expected a table"])


def test_unknown_agents():
    pol, _ = parse(EXAMPLE)
    assert unknown_agents(pol, ["demo", "my.agent"]) == []
    assert unknown_agents(pol, ["demo"]) == [
        "policy.agents.\"my.agent\": unknown agent 'my.agent' (configured: demo)"
    ]
    assert unknown_agents(pol, []) == [
        "policy.agents.demo: unknown agent 'demo' (configured: none)",
        "policy.agents.\"my.agent\": unknown agent 'my.agent' (configured: none)",
    ]


# ----------------------------------------------------------------------------- properties

RULES = st.builds(
    Rule,
    id=st.sampled_from(["r1", "r2", "r3", "r4"]),
    action=st.sampled_from(list(Action)),
    agent=st.sampled_from([None, "demo", "dem*", "other"]),
    kind=st.sampled_from([None, ("read",), ("edit", "execute"), ("read", "edit")]),
    title=st.sampled_from([None, "Read *", "*", "Run *"]),
    path=st.sampled_from([None, "/p/**", "/p/*", "**/*.pem", "/etc/**"]),
    remember=st.booleans(),
).filter(lambda r: (r.agent, r.kind, r.title, r.path) != (None, None, None, None))

POLICIES = st.builds(
    Policy,
    default=st.sampled_from(list(Action)),
    rules=st.lists(RULES, max_size=5).map(tuple),
    agents=st.dictionaries(
        st.sampled_from(["demo", "other"]),
        st.builds(
            AgentPolicy,
            default=st.sampled_from([None, *Action]),
            rules=st.lists(RULES, max_size=3).map(tuple),
        ),
        max_size=2,
    ),
)

REQUESTS = st.builds(
    PermissionRequest,
    tool_call_id=st.just("call_1"),
    title=st.sampled_from([None, "Read a", "Run ls", "Edit /p/x"]),
    kind=st.sampled_from([None, "read", "edit", "execute", "other"]),
    paths=st.lists(
        st.sampled_from(["/p/a", "/p/a/b", "/p/k.pem", "/etc/x", "/p/../etc/x", "rel", "//p/a"]),
        max_size=3,
    ).map(tuple),
    options=st.lists(
        st.builds(
            Option,
            option_id=st.sampled_from(["o1", "o2"]),
            kind=st.sampled_from(KINDS),
            name=st.just("n"),
        ),
        max_size=4,
    ).map(tuple),
)


@given(REQUESTS, POLICIES, st.sampled_from(["demo", "demo2", "other"]))
def test_decisions_never_grant_what_they_should_not(request_, pol, agent):
    """Deterministic; a deny never picks an allow option; no *_always without remember."""
    decision = decide(request_, pol, agent)
    assert decide(request_, pol, agent) == decision
    chosen = choose_option(decision, request_.options)
    if chosen is not None:
        assert chosen in request_.options
        # Its id means only its kind: no other option carries it with another kind.
        assert {o.kind for o in request_.options if o.option_id == chosen.option_id} == {
            chosen.kind
        }
        assert decision.action is not ASK
        if decision.action is DENY:
            assert not chosen.kind.startswith("allow")
        if decision.action is ALLOW:
            assert not chosen.kind.startswith("reject")
        if not decision.remember:
            assert not chosen.kind.endswith("_always")
    if decision.rule is None:
        assert not decision.remember


@given(REQUESTS, POLICIES, st.randoms(use_true_random=False))
def test_rule_order_never_changes_the_action(request_, pol, rnd):
    """The strongest matching action wins, so shuffling the rules keeps the action."""
    rules = list(pol.rules)
    rnd.shuffle(rules)
    shuffled = Policy(default=pol.default, rules=tuple(rules), agents=pol.agents)
    assert decide(request_, shuffled, "demo").action is decide(request_, pol, "demo").action


@given(REQUESTS, POLICIES)
def test_a_matching_deny_anywhere_beats_any_allow(request_, pol):
    """Adding a deny rule that matches turns any decision into a deny."""
    deny = Rule(id="deny-all", action=DENY, agent="*")
    for extended in (
        Policy(default=pol.default, rules=(*pol.rules, deny), agents=pol.agents),
        Policy(
            default=pol.default,
            rules=pol.rules,
            agents={**pol.agents, "demo": AgentPolicy(rules=(deny,))},
        ),
    ):
        assert decide(request_, extended, "demo").action is DENY
