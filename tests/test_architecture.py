"""
The package's shape, read from its source with ``ast``: the subpackages, which way imports
flow, what must stay pure, how the services are wired, how big modules and classes grow.

Modules are named by their path under ``acp_bridge`` (``engine.bridge``; a package's own
``__init__`` is ``engine.__init__``). Every import counts for purity: at module level, under
``TYPE_CHECKING`` and inside functions, because each is a dependency someone reading or moving
the code must follow. Cycles are counted over runtime imports (type-only ones may close a loop
between services that hold each other, as trio's ``_core`` does); between subpackages, every
import counts. Importing a submodule runs its packages' ``__init__`` files, which are in the
graph like any module.
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib
import re
import sys

import pytest

PACKAGE = "acp_bridge"
REPO = pathlib.Path(__file__).resolve().parent.parent
ROOT = REPO / PACKAGE

#: The modules that decide and never wait: none may reach trio, even through other modules.
#: Whole subpackages, and the pure halves of the others (``*core``).
PURE_GLOBS: tuple[str, ...] = (
    "protocol.*",
    "sessions.*",
    "policy.*",
    "config.*",
    "store.*",
    "attach.*",
    "v2.*",
    "http.wire",
    "mcp.acp",
    "mcp.core",
    "mcp.modern",
    "mcp.tools",
    "observe.summary",
    "observe.sequence*",
    "*core",
)

#: Third-party packages a pure module may import (besides the standard library).
PURE_THIRD_PARTY = frozenset({"attrs", "cattrs", "orjson", "structlog"})

#: The order of the subpackages: each may import only those before it (and itself).
LAYERS: tuple[str, ...] = (
    "protocol",
    "observe",
    "policy",
    "config",
    "store",
    "runtime",
    "http",
    "mcp",
    "sessions",
    "agents",
    "v2",
    "attach",
    "engine",
    "faces",
    "demo",
    "cli",
)

#: The floor under the share of the package's lines in modules that reach no trio.
PURE_SHARE_FLOOR = 0.40
MAX_MODULE_LINES = 900
MAX_CLASS_LINES = 500
#: Constructors take the services they use, typed: few parameters, and few callables.
MAX_CONSTRUCTOR_PARAMS = 10
MAX_CALLABLE_PARAMS = 12
#: Modules directly in acp_bridge/ (``__init__``, ``__main__``, ...).
MAX_TOP_MODULES = 4
MIN_SUBPACKAGES = 6
MIN_TEST_FOLDERS = 4
MAX_README_LINES = 300
MAX_PERFORMANCE_LINES = 400

TRIO = frozenset({"trio", "trio_websocket"})


def _name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _modules() -> dict[str, pathlib.Path]:
    """Module name (``engine.bridge``, ``__init__``, ``engine.__init__``) → its file."""
    return {_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _package_of(name: str) -> str:
    """The package a module's relative imports resolve against (``engine`` for ``engine.x``)."""
    parts = name.split(".")
    return ".".join(parts[:-1])


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """The ids of every node under an ``if TYPE_CHECKING:`` block."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                found.update(id(n) for n in ast.walk(inner))
    return found


def _imports(path: pathlib.Path, *, runtime_only: bool = False) -> tuple[set[str], set[str]]:
    """The package modules and the top-level outside packages that ``path`` imports."""
    names = _modules()
    inside: set[str] = set()
    outside: set[str] = set()

    def add_inside(dotted: str) -> None:
        # importing a.b.c runs __init__, a.__init__, a.b.__init__, then a.b.c
        parts = dotted.split(".") if dotted else []
        inside.add("__init__")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if f"{prefix}.__init__" in names:
                inside.add(f"{prefix}.__init__")
            elif prefix in names:
                inside.add(prefix)

    def add(dotted: str, aliases: list[str]) -> None:
        parts = dotted.split(".")
        if parts[0] != PACKAGE:
            outside.add(parts[0])
            return
        base = ".".join(parts[1:])
        add_inside(base)
        for alias in aliases:  # `from acp_bridge.engine import bridge`: a submodule, or a name
            sub = f"{base}.{alias}" if base else alias
            if sub in names or f"{sub}.__init__" in names:
                add_inside(sub)

    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _type_only_nodes(tree) if runtime_only else set()
    own = _name(path)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, [])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = own if own.endswith("__init__") else _package_of(own)
                package = package.removesuffix(".__init__").removesuffix("__init__")
                base_parts = package.split(".") if package else []
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                if node.module:
                    base_parts.append(node.module)
                base = ".".join([PACKAGE, *base_parts])
            else:
                assert node.module is not None
                base = node.module
            add(base, [alias.name for alias in node.names])
    inside.discard(own)
    return inside, outside


Graph = dict[str, tuple[set[str], set[str]]]


def _graph(*, runtime_only: bool = False) -> Graph:
    return {name: _imports(path, runtime_only=runtime_only) for name, path in _modules().items()}


def _closure(graph: Graph, start: str) -> set[str]:
    """The package modules ``start`` reaches, itself included."""
    seen = {start}
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()][0]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _reaches_trio(graph: Graph, start: str) -> bool:
    return any(graph[m][1] & TRIO for m in _closure(graph, start))


def _cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one node (Tarjan), as sorted tuples."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _subpackage(module: str) -> str | None:
    return module.split(".")[0] if "." in module else None


def _subpackages() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def pure_modules() -> list[str]:
    """The modules the fence holds (``PURE_GLOBS``)."""
    return sorted(
        name
        for name in _modules()
        if not name.endswith("__init__")
        and any(fnmatch.fnmatchcase(name, glob) for glob in PURE_GLOBS)
    )


def pure_share() -> tuple[float, list[str]]:
    """The share of the package's lines in modules that reach no trio, and those modules."""
    graph = _graph()
    modules = _modules()
    pure = sorted(name for name in modules if not _reaches_trio(graph, name))
    total = sum(_lines(path) for path in modules.values())
    return sum(_lines(modules[name]) for name in pure) / total, pure


def _classes() -> list[tuple[int, str]]:
    out = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                out.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
    return out


def _constructors() -> list[tuple[str, ast.FunctionDef]]:
    """Every class's ``__init__`` (attrs classes have none written: their fields are data)."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        found.append((f"{name}.{node.name}", item))
    return found


def _parameters(func: ast.FunctionDef) -> list[ast.arg]:
    args = func.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return [a for a in every if a.arg != "self"]


def _is_callable(annotation: ast.expr | None) -> bool:
    return annotation is not None and "Callable" in ast.unparse(annotation)


# --------------------------------------------------------------------------- the plan


def test_the_package_is_a_few_subpackages_and_almost_nothing_beside_them():
    top = sorted(p.stem for p in ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"modules directly in {PACKAGE}/: {top}"
    assert len(_subpackages()) >= MIN_SUBPACKAGES


def test_every_subpackage_is_in_the_layer_order():
    assert sorted(LAYERS) == _subpackages()


def test_a_subpackage_init_is_empty():
    """Empty ``__init__`` files: importing one module never imports its neighbours."""
    for path in ROOT.glob("*/__init__.py"):
        assert path.read_text(encoding="utf-8").strip() == "", f"{path.parent.name}/__init__.py"


def test_modules_in_subpackages_drop_the_leading_underscore():
    private = sorted(n for n in _modules() if "." in n and n.split(".")[-1].startswith("_"))
    assert [n for n in private if not n.endswith("__init__")] == []


# --------------------------------------------------------------------------- imports


def test_no_runtime_import_cycle_between_modules():
    edges = {name: inside for name, (inside, _) in _graph(runtime_only=True).items()}
    assert _cycles(edges) == set()


def test_no_import_cycle_between_subpackages_type_only_included():
    edges: dict[str, set[str]] = {}
    for name, (inside, _) in _graph().items():
        source = _subpackage(name)
        if source is None:
            continue
        for target in inside:
            other = _subpackage(target)
            if other is not None and other != source:
                edges.setdefault(source, set()).add(other)
    assert _cycles(edges) == set()


def test_subpackages_import_only_those_below_them():
    rank = {name: i for i, name in enumerate(LAYERS)}
    wrong = []
    for name, (inside, _) in _graph().items():
        source = _subpackage(name)
        if source is None:
            continue
        for target in sorted(inside):
            other = _subpackage(target)
            if other is not None and rank[other] > rank[source]:
                wrong.append(f"{name} -> {target}")
    assert wrong == [], "an import against the layer order (LAYERS)"


# --------------------------------------------------------------------------- the pure core


def test_the_fence_holds_modules():
    """Each glob holds at least one module: a renamed part must bring its glob along."""
    names = [n for n in _modules() if not n.endswith("__init__")]
    for glob in PURE_GLOBS:
        assert any(fnmatch.fnmatchcase(n, glob) for n in names), glob


@pytest.mark.parametrize("module", pure_modules())
def test_a_pure_module_reaches_no_trio_even_through_others(module):
    """A pure module's import closure (TYPE_CHECKING included) has no trio or trio_websocket."""
    graph = _graph()
    offenders = sorted(m for m in _closure(graph, module) if graph[m][1] & TRIO)
    assert offenders == [], f"{module} reaches trio through {offenders}"


@pytest.mark.parametrize("module", pure_modules())
def test_a_pure_module_imports_only_the_stdlib_and_the_plain_data_libraries(module):
    """Pure modules use the standard library, attrs, cattrs, orjson and structlog, no more."""
    graph = _graph()
    used = set().union(*(graph[m][1] for m in _closure(graph, module)))
    foreign = sorted(used - set(sys.stdlib_module_names) - PURE_THIRD_PARTY - {PACKAGE})
    assert foreign == [], f"{module} reaches {foreign}"


def test_the_share_of_pure_lines_does_not_fall():
    """At least PURE_SHARE_FLOOR of the package's lines are in modules that reach no trio."""
    share, pure = pure_share()
    print(f"pure share: {share:.1%} in {pure}")
    assert share >= PURE_SHARE_FLOOR


# --------------------------------------------------------------------------- sizes and wiring


def test_no_module_grows_past_the_limit():
    over = sorted(n for n, path in _modules().items() if _lines(path) > MAX_MODULE_LINES)
    assert over == [], "split it: a module over the limit"


def test_no_class_grows_past_the_limit():
    """No class over MAX_CLASS_LINES lines: a class that big does more than one job."""
    over = sorted(c for c in _classes() if c[0] > MAX_CLASS_LINES)
    assert over == [], f"split it: {over}"
    assert max(_classes())[0] > MAX_CLASS_LINES // 4  # (the scan sees the package's classes)


def test_constructors_take_few_parameters():
    """A service takes the services it uses, not a dozen loose parts of them."""
    wide = sorted(
        (len(_parameters(func)), name)
        for name, func in _constructors()
        if len(_parameters(func)) > MAX_CONSTRUCTOR_PARAMS
    )
    assert wide == []


def test_few_constructor_parameters_are_callables():
    """Services hold each other by type: a callable parameter is for a real plug-in point."""
    loose = sorted(
        f"{name}({arg.arg})"
        for name, func in _constructors()
        for arg in _parameters(func)
        if _is_callable(arg.annotation)
    )
    print(f"{len(loose)} callable constructor parameters: {loose}")
    assert len(loose) <= MAX_CALLABLE_PARAMS, loose
    assert len(_constructors()) > 20  # (the scan sees the package's constructors)


def test_no_issue_numbers_in_the_code():
    """History (issue numbers, before/after) belongs in commit messages and docs/."""
    pattern = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+|#\d+\.\d+")
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted(ROOT.rglob("*"))
        if path.suffix in {".py", ".c", ".pyi", ".js", ".html", ".css"}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


# --------------------------------------------------------------------------- docs and tests


def test_the_readme_and_the_performance_page_stay_short():
    assert _lines(REPO / "README.md") <= MAX_README_LINES
    assert _lines(REPO / "docs" / "performance.md") <= MAX_PERFORMANCE_LINES


def test_tests_mirror_the_code():
    folders = sorted(p.parent.name for p in (REPO / "tests").glob("*/__init__.py"))
    assert len(folders) >= MIN_TEST_FOLDERS
    assert {"e2e", "interop", "fuzz", "support"} <= set(folders)
    # every unit folder is a subpackage's
    unit = set(folders) - {"e2e", "interop", "fuzz", "support"}
    assert unit <= set(_subpackages()), unit - set(_subpackages())


#: What starting another process looks like in a test (or in a helper it calls).
SPAWNS = re.compile(
    r"open_process|run_process|subprocess\.|start_serve|BridgeProcess|make_subprocess_launcher"
    r"|Popen"
)


def test_unit_folders_start_no_process_and_set_no_marker():
    """Markers come from the folder: tests/<subpackage>/ runs in-process, in seconds."""
    found = []
    for path in sorted((REPO / "tests").glob("*/test_*.py")):
        if path.parent.name in {"e2e", "interop", "fuzz", "support"}:
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(REPO)}: {m}" for m in sorted(set(SPAWNS.findall(text)))]
        if "mark.e2e" in text:
            found.append(f"{path.relative_to(REPO)}: an e2e marker")
    assert found == []


# --------------------------------------------------------------------------- the scan itself


def test_the_graph_sees_every_kind_of_import(tmp_path, monkeypatch):
    """Type-only, function-local, relative and `from package import module` imports count."""
    fake = tmp_path / PACKAGE
    (fake / "engine").mkdir(parents=True)
    (fake / "runtime").mkdir()
    for path in ("__init__.py", "engine/__init__.py", "runtime/__init__.py"):
        (fake / path).write_text("")
    for path in ("runtime/pipes.py", "engine/hub.py", "engine/bridge.py"):
        (fake / path).write_text("")
    probe = fake / "engine" / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "from acp_bridge.runtime import pipes as p\n"
        "from . import hub\n"
        "if TYPE_CHECKING:\n"
        "    from acp_bridge.engine.bridge import Bridge\n"
        "def f():\n"
        "    import trio.testing\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    inside, outside = _imports(probe)
    assert inside == {
        "__init__",
        "engine.__init__",
        "runtime.__init__",
        "runtime.pipes",
        "engine.hub",
        "engine.bridge",
    }
    assert outside == {"typing", "trio"}
    inside, _ = _imports(probe, runtime_only=True)
    assert "engine.bridge" not in inside


def test_cycles_are_found_through_several_modules():
    """A cycle of three is one component; a module importing itself is none."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == {("a", "b", "c")}
