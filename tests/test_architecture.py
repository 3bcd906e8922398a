"""
The package's shape, read from its source with ``ast``: what must stay pure, which way imports
flow, how big modules grow.

Every import counts: at module level, under ``TYPE_CHECKING`` and inside functions, because
each is a dependency someone reading or moving the code must follow. Importing a submodule of
``acp_bridge`` also runs the package's ``__init__``, which is in the graph like any module.
The allowlists below may only shrink: each test also fails when an entry is no longer needed,
so the list is kept honest by the next change that fixes one.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

PACKAGE = "acp_bridge"
ROOT = pathlib.Path(__file__).resolve().parent.parent / PACKAGE

#: Modules that decide and never wait: none may reach trio, even through other modules.
PURE: tuple[str, ...] = (
    "_framing",
    "_jsonrpc",
    "_scan",
    "_elide",
    "_routing",
    "_policy",
    "_containment",
    "_config",
    "_redact",
    "_store",
    "_log",
    "_reaper",
    "_attach_core",
    "_attach_sessions",
    "_token",
    "_status",
    "_backoff",
    "_diagnostics",
    "_remote",
    "_capabilities",
    "_wire",
    "_sessions",
    "_handshake",
    "_ws_frames",
    "_demo_script",
    "_mcp_tools",
    "_mcp_core",
    "_console_core",
    "_v2_shapes",
    "_v2_core",
    "_subagent_core",
    "_prespawn",
    "_initialize",
    "_early",
)

#: Third-party packages a pure module may import (besides the standard library).
PURE_THIRD_PARTY = frozenset({"attrs", "cattrs", "orjson", "structlog"})

#: Import cycles still to break (each a sorted tuple of the modules on it). Only shrinks.
KNOWN_CYCLES: frozenset[tuple[str, ...]] = frozenset()

#: The share of the package's lines in modules that reach no trio import: a ratchet, raise it
#: when a change moves more code out of the trio shells.
PURE_SHARE_FLOOR = 0.44

#: Modules above the size limit, still to split. Only shrinks.
MAX_LINES = 800
OVERSIZE: frozenset[str] = frozenset()

TRIO = frozenset({"trio", "trio_websocket"})


def _modules() -> dict[str, pathlib.Path]:
    """Module name (``_bridge``, or ``__init__`` for the package) → its file."""
    return {path.stem: path for path in sorted(ROOT.glob("*.py"))}


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """The package modules and the top-level outside packages that ``path`` imports."""
    names = _modules()
    inside: set[str] = set()
    outside: set[str] = set()

    def add(dotted: str) -> None:
        parts = dotted.split(".")
        if parts[0] != PACKAGE:
            outside.add(parts[0])
            return
        inside.add("__init__")
        if len(parts) > 1 and parts[1] in names:
            inside.add(parts[1])

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package (it is flat)
                base = PACKAGE if node.module is None else f"{PACKAGE}.{node.module}"
            else:
                assert node.module is not None
                base = node.module
            add(base)
            if base == PACKAGE:  # `from acp_bridge import _pipes`: a submodule, or a name
                for alias in node.names:
                    if alias.name in names:
                        inside.add(alias.name)
    inside.discard(path.stem)
    return inside, outside


def _graph() -> dict[str, tuple[set[str], set[str]]]:
    return {name: _imports(path) for name, path in _modules().items()}


def _closure(graph: dict[str, tuple[set[str], set[str]]], start: str) -> set[str]:
    """The package modules ``start`` reaches, itself included."""
    seen = {start}
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()][0]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _reaches_trio(graph: dict[str, tuple[set[str], set[str]]], start: str) -> bool:
    return any(graph[m][1] & TRIO for m in _closure(graph, start))


def _cycles(graph: dict[str, tuple[set[str], set[str]]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), as sorted tuples."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node][0]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def pure_share() -> tuple[float, list[str]]:
    """The share of the package's lines in modules that reach no trio, and those modules."""
    graph = _graph()
    modules = _modules()
    pure = sorted(name for name in modules if not _reaches_trio(graph, name))
    total = sum(_lines(path) for path in modules.values())
    return sum(_lines(modules[name]) for name in pure) / total, pure


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_reaches_no_trio_even_through_others(module):
    """A pure module's import closure (TYPE_CHECKING included) has no trio or trio_websocket."""
    graph = _graph()
    offenders = sorted(m for m in _closure(graph, module) if graph[m][1] & TRIO)
    assert offenders == [], f"{module} reaches trio through {offenders}"


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_only_the_stdlib_and_the_plain_data_libraries(module):
    """Pure modules use the standard library, attrs, cattrs, orjson and structlog, no more."""
    graph = _graph()
    used = set().union(*(graph[m][1] for m in _closure(graph, module)))
    foreign = sorted(used - set(sys.stdlib_module_names) - PURE_THIRD_PARTY - {PACKAGE})
    assert foreign == [], f"{module} reaches {foreign}"


def test_the_fence_lists_only_modules_that_exist():
    """A renamed or removed pure module must leave the list too (else the fence is empty)."""
    assert set(PURE) <= set(_modules())


def test_imports_flow_one_way():
    """No import cycle among the package's modules, but the listed ones still to be broken."""
    cycles = _cycles(_graph())
    assert cycles - KNOWN_CYCLES == set(), "a new import cycle"
    assert KNOWN_CYCLES - cycles == set(), "a listed cycle is gone: remove it from KNOWN_CYCLES"


def test_the_share_of_pure_lines_does_not_fall():
    """At least PURE_SHARE_FLOOR of the package's lines are in modules that reach no trio."""
    share, pure = pure_share()
    print(f"pure share: {share:.1%} in {pure}")
    assert share >= PURE_SHARE_FLOOR


def test_no_module_grows_past_the_limit():
    """No module over MAX_LINES lines, but the listed ones still to be split (and they are)."""
    over = {name for name, path in _modules().items() if _lines(path) > MAX_LINES}
    assert over - OVERSIZE == set(), "split it: a module over the limit"
    assert OVERSIZE - over == set(), "it fits now: remove it from OVERSIZE"


#: The largest class allowed (lines from ``class`` to its last line).
MAX_CLASS_LINES = 400


def _classes() -> list[tuple[int, str]]:
    out = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                out.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
    return out


def test_no_class_grows_past_the_limit():
    """No class over MAX_CLASS_LINES lines: a class that big does more than one job."""
    over = sorted(c for c in _classes() if c[0] > MAX_CLASS_LINES)
    assert over == [], f"split it: {over}"
    assert max(_classes())[0] > MAX_CLASS_LINES // 2  # (the scan sees the package's classes)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """Type-only, function-local, relative and `from package import module` imports count."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from acp_bridge import _pipes as pipes\n"
        "from . import _framing\n"
        "if TYPE_CHECKING:\n"
        "    from acp_bridge._bridge import Bridge\n"
        "def f():\n"
        "    import trio.testing\n"
        "    from acp_bridge._handshake import judge\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    inside, outside = _imports(path)
    assert inside == {"__init__", "_pipes", "_framing", "_bridge", "_handshake"}
    assert outside == {"typing", "trio"}


def test_cycles_are_found_through_several_modules():
    """A cycle of three is one component; a module importing itself is none."""
    graph = {
        "a": ({"b"}, set()),
        "b": ({"c"}, set()),
        "c": ({"a"}, set()),
        "d": ({"a"}, set()),
    }
    assert _cycles(graph) == {("a", "b", "c")}
