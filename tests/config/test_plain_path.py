"""
The quick structuring of a configuration (``config.model._quick_config``) is the converter's.

``acp-bridge stdio`` reads its configuration before it can answer ``initialize``; a document
with no mistake and plain values is structured without cattrs (issue 23 item 3). The rule:
when the quick structuring gives a :class:`Config`, the converter gives the same one; when it
gives None, the converter decides (and says what is wrong). Messages are all the converter's
(tests/config/test_model.py).
"""

from __future__ import annotations

import pathlib
import tomllib
import typing
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.config.model import (
    AgentConfig,
    BridgeConfig,
    Config,
    ConfigError,
    StoreConfig,
    SubagentsConfig,
    WebSocketConfig,
    _quick_config,
    _schema,
    parse_config,
)
from acp_bridge.config.structure import Problems, structure

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"

#: The tables of a document, and the class each is structured as.
TABLES = {
    "bridge": BridgeConfig,
    "websocket": WebSocketConfig,
    "store": StoreConfig,
    "subagents": SubagentsConfig,
}

scalars = st.one_of(
    st.text(max_size=4),
    st.integers(-3, 70000),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
)
anything = st.one_of(
    scalars,
    st.lists(st.one_of(st.text(max_size=3), st.integers(0, 3)), max_size=3),
    st.dictionaries(
        st.text(max_size=3), st.one_of(st.text(max_size=3), st.integers(0, 3)), max_size=3
    ),
)
#: Values of the right type for a field (a wrong one among them now and then).
strings = st.lists(st.text(max_size=3), max_size=3)
RIGHT = {
    str: st.text(max_size=4),
    str | None: st.text(max_size=4),
    int: st.integers(-3, 70000),
    float: st.one_of(st.integers(-3, 9), st.floats(-1, 1e6, allow_nan=False)),
    bool: st.booleans(),
    tuple[str, ...]: st.one_of(strings, strings.map(tuple)),
    tuple[str, ...] | None: strings,
    Mapping[str, str]: st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3),
}


#: Near misses: what a field's converter hook refuses (or a value of another type).
NEAR = {
    str: st.one_of(st.integers(0, 3), st.none()),
    int: st.one_of(st.booleans(), st.floats(0, 9)),
    float: st.one_of(st.booleans(), st.text(max_size=2)),
    bool: st.one_of(st.integers(0, 1), st.text(max_size=2)),
    tuple[str, ...]: st.one_of(st.text(max_size=3), st.lists(st.integers(0, 3), min_size=1)),
    Mapping[str, str]: st.one_of(
        st.dictionaries(st.text(max_size=2), st.integers(0, 3), min_size=1), st.text(max_size=2)
    ),
}
#: True once in a while (hypothesis draws the bounds of an integer range often).
rarely = st.sampled_from([False] * 7 + [True])

#: Keys the quick structuring leaves to the converter (a typo, a remote or wrapped agent).
RARE_KEYS = {AgentConfig: ["comand", "name", "ssh", "launcher"]}


@st.composite
def tables(draw: st.DrawFn, cl: type) -> dict[str, object]:
    hints = typing.get_type_hints(cl)
    rare = RARE_KEYS.get(cl, ["nope"])
    plain = [k for k in hints if k not in rare]
    keys = draw(st.lists(st.sampled_from(plain), max_size=6))
    if draw(rarely):
        keys.append(draw(st.sampled_from(rare)))
    table: dict[str, object] = {}
    for key in keys:
        type_ = hints.get(key)
        right = RIGHT.get(type_)  # type: ignore[arg-type]
        if right is None or draw(rarely):
            near = NEAR.get(type_ if type_ != str | None else str)  # type: ignore[arg-type]
            right = anything if near is None or draw(rarely) else near
        table[key] = draw(right)
    return table


@st.composite
def documents(draw: st.DrawFn) -> dict[str, object]:
    """Mostly well-formed documents, with a mistake or an odd value now and then."""
    names = st.sampled_from(["demo", "a-1", "x.y", "demo", "a-1", "x.y", "a b", ""])
    agents: dict[object, object] = {}
    for name in draw(st.lists(names, max_size=3)):
        table = draw(tables(AgentConfig))
        if not draw(rarely):
            table["command"] = draw(st.sampled_from(["acp-bridge", "sh", ""]))
        agents[draw(st.text(max_size=2)) if draw(rarely) else name] = (
            draw(anything) if draw(rarely) else table
        )
    doc: dict[str, object] = {"agents": agents}
    for table_name, cl in TABLES.items():
        if draw(st.booleans()):
            doc[table_name] = draw(tables(cl))
    if draw(rarely):
        doc[draw(st.sampled_from(["source", "policy", "extra", "agents"]))] = draw(anything)
    return doc


def _converter(doc: object) -> Config | str:
    try:
        config: Config = structure(doc, _schema())
    except Problems as exc:
        return "\n".join(exc.problems)
    return config


def _demo(**fields: object) -> dict[str, object]:
    return {"agents": {"demo": {"command": "x", **fields}}}


#: Near misses of every kind of value, each a mistake the converter reports.
NEAR_MISSES = [
    _demo(command=5),
    _demo(args=[1]),
    _demo(args="a b"),
    _demo(env={"K": 1}),
    _demo(path_map=["a"]),
    _demo(client_fs=1),
    _demo(start_timeout=True),
    _demo(start_timeout="5"),
    {**_demo(), "websocket": {"port": True}},
    {**_demo(), "websocket": {"port": 1.5}},
    {**_demo(), "websocket": {"allowed_origins": "x"}},
    {**_demo(), "store": {"journal": 0}},
    {**_demo(), "bridge": {"default_agent": 1}},
]


def test_every_near_miss_is_left_to_the_converter():
    for doc in NEAR_MISSES:
        assert isinstance(_converter(doc), str), doc
        assert _quick_config(doc) is None, doc


@settings(max_examples=600, deadline=None)
@given(documents())
def test_the_quick_structuring_agrees_with_the_converter(doc):
    quick = _quick_config(doc)
    if quick is not None:
        assert _converter(doc) == quick


@given(documents())
def test_parse_config_gives_what_the_converter_would(doc):
    """Through the entry point too: the same config, or the converter's own problems."""
    doc.pop("policy", None)
    try:
        got: Config | str = parse_config(doc, source="x.toml")
    except ConfigError as exc:
        got = "\n".join(exc.problems)
    expected = _converter(doc)
    if isinstance(expected, str):  # (then parse_config said exactly that, or more problems)
        assert isinstance(got, str)
        assert got.startswith(expected)


def test_plain_documents_take_the_quick_path():
    """(Else the agreement above would hold for nothing.) The shipped configs, a full one."""
    for path in sorted(CONFIGS.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        data.pop("policy", None)
        assert _quick_config(data) is not None, path
    full = {
        "agents": {
            "a": {
                "command": "x",
                "args": ["1", "2"],
                "env": {"K": "v"},
                "cwd": "d",
                "start_timeout": 5,
                "client_fs": True,
                "path_map": {"/a": "/b"},
            }
        },
        "bridge": {"default_agent": "a", "stop_grace": 1, "max_line_bytes": 4096},
        "websocket": {"host": "::1", "allowed_origins": ["o"], "ping_interval": 2.5},
        "store": {"path": ":memory:", "journal": False},
        "subagents": {"agents": ["a*"], "max_depth": 1},
    }
    quick = _quick_config(full)
    assert quick is not None
    assert quick == structure(full, _schema())
    assert quick.agents["a"].start_timeout == 5.0
    assert isinstance(quick.agents["a"].start_timeout, float)


def test_a_mistake_or_an_ssh_agent_is_left_to_the_converter():
    base = {"agents": {"a": {"command": "x"}}}
    assert _quick_config(base) is not None
    for doc in (
        {"agents": {"a": {"command": "x", "comand": "y"}}},
        {"agents": {"a": {"command": 5}}},
        {"agents": {"a": {"command": "x", "start_timeout": True}}},
        {"agents": {"a": {"command": "x", "args": "a b"}}},
        {"agents": {"a": {"command": "x", "ssh": {"host": "h"}}}},
        {"agents": {"a": {"command": "x", "launcher": ["docker", "exec"]}}},
        {"agents": {"a": {"args": []}}},
        {"agents": {"a b": {"command": "x"}}},
        {"agents": {"a": {"command": "x", "name": "a"}}},
        {"agents": {}, "source": "s"},
        {**base, "bridge": {"default_agent": None}},
        {**base, "bridge": "x"},
        {**base, "nope": {}},
        {"bridge": {}},
    ):
        assert _quick_config(doc) is None, doc
