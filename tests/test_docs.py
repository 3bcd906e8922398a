"""
The documentation stays true: README.md and docs/*.md against the code.

Their TOML parses with the project's own parsers; every relative link resolves; every command,
option and config key the code accepts is documented somewhere; the README's wire-extension
table lists every extension the code implements; every module and function a ``| module |
function |`` table names exists (the architecture walk cannot rot).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import pathlib
import re
import tomllib

import attrs
import pytest

from acp_bridge.cli.main import build_parser
from acp_bridge.config import model as config
from acp_bridge.config.model import parse_config, parse_policy
from acp_bridge.policy import rules as policy

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 300

_FENCED = re.compile(r"^```.*?^```", flags=re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def _text(page: pathlib.Path) -> str:
    return page.read_text(encoding="utf-8")


def _prose(page: pathlib.Path) -> str:
    """The page without its fenced code blocks."""
    return _FENCED.sub("", _text(page))


def _all_text() -> str:
    return "\n".join(_text(p) for p in PAGES)


def _toml_blocks() -> list[tuple[str, str]]:
    return [
        (f"{_name(page)}#{i}", block)
        for page in PAGES
        for i, block in enumerate(re.findall(r"```toml\n(.*?)```", _text(page), flags=re.S))
    ]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", _prose(page), flags=re.M)
    return {_slug(h) for h in headings}


def _tables(page: pathlib.Path) -> list[tuple[list[str], list[list[str]]]]:
    """Each markdown table of a page: its header cells and its rows' cells."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    lines = _prose(page).splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            header = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    # (An escaped pipe, as in `[a \| b]`, stays inside its cell.)
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip() for p in parts]


def _code(cell: str) -> str:
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match is not None, f"expected one `code` span, got {cell!r}"
    return match.group(1)


def _section(page: pathlib.Path, heading: str) -> str:
    """The text under a ``## heading`` up to the next heading of that level or above."""
    match = re.search(
        rf"^## {re.escape(heading)}\n(.*?)(?=^#{{1,2}} |\Z)", _text(page), flags=re.S | re.M
    )
    assert match is not None, f"{_name(page)} has no '## {heading}'"
    return match.group(1)


# --- examples ------------------------------------------------------------------------------


def test_there_are_toml_examples():
    assert any(name.startswith("README.md#") for name, _ in _toml_blocks())
    assert len(_toml_blocks()) >= 2


@pytest.mark.parametrize(("where", "block"), _toml_blocks(), ids=[n for n, _ in _toml_blocks()])
def test_toml_examples_parse(where, block):
    data = tomllib.loads(block)
    if "agents" in data:
        parse_config(data, source=where)
    if "policy" in data:
        _, problems = parse_policy(data["policy"])
        assert problems == []


# --- shape and links -----------------------------------------------------------------------


def test_readme_is_short():
    lines = len(_text(README).splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; detail goes to docs/"


def test_readme_links_every_docs_page():
    linked = {
        (README.parent / target.split("#")[0]).resolve()
        for target in _LINK.findall(_prose(README))
        if target.startswith("docs/")
    }
    for target in linked:
        assert target.is_file(), f"README.md links {target.relative_to(ROOT)}, which is missing"
    unlinked = [_name(p) for p in DOCS if p.resolve() not in linked]
    assert not unlinked, f"not linked from README.md: {unlinked}"
    assert DOCS, "docs/ holds no page"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page):
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{_name(page)}: broken links: {broken}"


# --- the code's surface is documented ------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_command_is_in_the_readme_table():
    table = _section(README, "Command line")
    commands = _subcommands(build_parser())
    assert {"stdio", "serve", "attach", "demo-agent"} <= set(commands)
    missing = [name for name in commands if f"`acp-bridge {name}" not in table]
    assert not missing, f"commands missing from README's command table: {missing}"
    documented = set(re.findall(r"`acp-bridge ([a-z-]+)", table))
    assert documented <= set(commands), f"not commands: {documented - set(commands)}"


def test_every_option_is_documented():
    text = _all_text()
    missing = []
    for name, sub in _subcommands(build_parser()).items():
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and option not in text:
                    missing.append(f"{name} {option}")
    assert not missing, f"options documented nowhere in README.md or docs/: {missing}"


def _config_keys() -> list[str]:
    keys = []
    for table, cls in (
        ("bridge", config.BridgeConfig),
        ("websocket", config.WebSocketConfig),
        ("store", config.StoreConfig),
        ("agents.NAME", config.AgentConfig),
        ("subagents", config.SubagentsConfig),
    ):
        keys += [f"{table}.{f.name}" for f in attrs.fields(cls) if f.name != "name"]
    keys += [f"policy.{k}" for k in policy._POLICY_KEYS]
    keys += [f"policy.rules.{k}" for k in policy._RULE_KEYS]
    return keys


def _documented_key(key: str, text: str, toml: str) -> bool:
    leaf = key.rsplit(".", 1)[1]
    return (
        f"`{leaf}`" in text
        or re.search(rf"^{leaf}\s*=", toml, flags=re.M) is not None
        or re.search(rf"^\[+policy\.{leaf}\b", toml, flags=re.M) is not None
    )


def test_every_config_key_is_documented():
    text = _all_text()
    toml = "\n".join(block for _, block in _toml_blocks())
    keys = _config_keys()
    assert "bridge.max_line_bytes" in keys
    assert "policy.deny_paths" in keys
    missing = [k for k in keys if not _documented_key(k, text, toml)]
    assert not missing, f"config keys documented nowhere in README.md or docs/: {missing}"


# --- wire extensions -----------------------------------------------------------------------


def _code_extensions() -> tuple[set[str], set[str]]:
    """
    What the code implements: the ``_acp_bridge/...`` methods it names, and the
    ``_meta.acp_bridge`` keys it reads (through ``bridge_meta(...).get(KEY)``) or writes
    (in a dict stored under ``"acp_bridge"``).
    """
    methods: set[str] = set()
    keys: set[str] = set()
    for source in sorted((ROOT / "acp_bridge").rglob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                methods.update(re.findall(r"^_acp_bridge/\w+$", node.value))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and isinstance(node.func.value, ast.Call)
                and isinstance(node.func.value.func, ast.Name)
                and node.func.value.func.id in ("bridge_meta", "_bridge_meta")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                keys.add(node.args[0].value)
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "acp_bridge":
                        keys |= _dict_keys(v)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if (
                        isinstance(target, ast.Subscript)
                        and isinstance(target.slice, ast.Constant)
                        and target.slice.value == "acp_bridge"
                    ):
                        keys |= _dict_keys(node.value)
    return methods, keys


def _dict_keys(value: ast.expr) -> set[str]:
    return {
        k.value
        for node in ast.walk(value)
        if isinstance(node, ast.Dict)
        for k in node.keys
        if isinstance(k, ast.Constant) and isinstance(k.value, str)
    }


def test_wire_extension_table_lists_what_the_code_implements():
    methods, keys = _code_extensions()
    # (If these are not found, the scan above no longer sees the code: fix the scan.)
    assert {"_acp_bridge/log", "_acp_bridge/agents", "_acp_bridge/permission_resolved"} <= methods
    assert {"agent", "unattended", "seq", "after_seq", "lastSeq", "complete"} <= keys
    table = _section(README, "Wire extensions")
    spans = re.findall(r"`([^`]+)`", table)
    words = {w for span in spans for w in re.split(r"[^\w/$]+", span)}
    missing = sorted(m for m in methods if m not in words)
    missing += sorted(f"_meta.acp_bridge.{k}" for k in keys if k not in words)
    assert not missing, f"README's wire-extension table lacks: {missing}"


# --- the architecture walk -----------------------------------------------------------------


def _named_functions() -> list[tuple[str, str, str]]:
    """(page, module, function) of every row of every ``| ... | module | function |`` table."""
    named = []
    for page in PAGES:
        for header, rows in _tables(page):
            if header[-2:] == ["module", "function"]:
                named += [(_name(page), _code(row[-2]), _code(row[-1])) for row in rows]
    return named


@pytest.mark.parametrize(
    ("page", "module", "function"), _named_functions(), ids=lambda v: str(v).strip("`")
)
def test_named_function_exists(page, module, function):
    mod = importlib.import_module(f"acp_bridge.{module}")
    obj: object = mod
    for part in function.split("."):
        assert hasattr(obj, part), f"{page}: acp_bridge.{module} has no {function}"
        obj = getattr(obj, part)
    assert callable(obj), f"{page}: acp_bridge.{module}.{function} is not a function"


def test_architecture_walks_the_four_paths():
    page = ROOT / "docs" / "architecture.md"
    text = _text(page)
    for heading in (
        "A client's prompt reaches an agent",
        "An agent's update reaches the client",
        "A permission is decided",
        "An agent's death is handled",
    ):
        match = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^#|\Z)", text, flags=re.S | re.M)
        assert match is not None, f"docs/architecture.md has no '### {heading}'"
        rows = [line for line in match.group(1).splitlines() if line.startswith("| ")]
        assert len(rows) >= 3, f"'{heading}': expected a step | module | function table"
    pages = {p for p, _, _ in _named_functions()}
    assert {"README.md", "docs/architecture.md"} <= pages
