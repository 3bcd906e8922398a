"""
The configuration's cattrs converter, and its errors as one line per problem.

Imported only when the quick structuring in :mod:`acp_bridge.config.model` (``_quick_config``)
leaves a document to it: a document with a mistake, or with a part the quick structuring does
not take (``ssh``, ``launcher``, anything but a table, string, number, boolean or array of
strings). cattrs builds its structuring code at run time, and importing it and building that
code is work ``acp-bridge stdio`` would do before it could answer ``initialize``. Every message
comes from here.
"""

from __future__ import annotations

import ast
import difflib
import re
import types
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override
from cattrs.v import format_exception

from acp_bridge.policy.rules import render_key_path


class Schema(NamedTuple):
    """
    What the converter structures, as :mod:`acp_bridge.config.model` defines it (this module is
    imported from there, at the first document that needs it, so it does not import it).
    """

    config: type  # Config
    agent: type  # AgentConfig
    agent_name: re.Pattern[str]  # what an agent name may look like
    bad_name: str  # the message for one that does not
    no_agents: str  # the message for no [agents] at all


class Problems(Exception):
    """The document's problems, one line each (``config.model`` raises them as a ConfigError)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems)
        self.problems = problems


# --- the converter -------------------------------------------------------------------------


class _Invalid(ValueError):
    """A value of the wrong type or shape; the message is shown as is."""


def _structure_str(obj: object, _: object) -> str:
    if not isinstance(obj, str):
        raise _Invalid("expected a string")
    return obj


def _structure_int(obj: object, _: object) -> int:
    # bool is an int subclass, but `port = true` is a mistake, not 1.
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise _Invalid("expected an integer")
    return obj


def _structure_float(obj: object, _: object) -> float:
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        raise _Invalid("expected a number")
    return float(obj)


def _structure_bool(obj: object, _: object) -> bool:
    if not isinstance(obj, bool):
        raise _Invalid("expected true or false")
    return obj


def _noted(exc: Exception, index: int | str, type_: object) -> Exception:
    """Tag ``exc`` with the key or index it happened at, the way cattrs does."""
    exc.add_note(IterableValidationNote(f"Structuring item @ {index!r}", index, type_))
    return exc


def _structure_str_tuple(obj: object, type_: Any) -> tuple[str, ...]:
    # A bare string is iterable too; without this check "x y" would become ('x', ' ', 'y').
    if not isinstance(obj, list | tuple):
        raise _Invalid("expected an array of strings")
    errors = [
        _noted(_Invalid("expected a string"), i, str)
        for i, item in enumerate(obj)
        if not isinstance(item, str)
    ]
    if errors:
        raise IterableValidationError("expected strings", errors, type_)
    return tuple(obj)


def _structure_str_map(obj: object, type_: Any) -> Mapping[str, str]:
    if not isinstance(obj, Mapping):
        raise _Invalid("expected a table of strings")
    errors = [
        _noted(_Invalid("expected a string"), key, str)
        for key, value in obj.items()
        if not isinstance(value, str)
    ]
    if errors:
        raise IterableValidationError("expected strings", errors, type_)
    return types.MappingProxyType(dict(obj))


def _agents_hook(converter: cattrs.Converter, schema: Schema) -> Callable[[object, Any], Any]:
    """
    Structure ``[agents]``: a table keyed by name whose values lack the ``name`` field.

    Each value is structured as an :class:`AgentConfig` with its key injected as ``name``;
    errors are gathered per agent and tagged with its name, so the paths read
    ``agents.NAME.KEY``.
    """

    agent_config = schema.agent

    def structure(obj: object, type_: Any) -> Mapping[str, Any]:
        if not isinstance(obj, Mapping):
            raise _Invalid("expected a table of agents, e.g. [agents.NAME]")
        agents: dict[str, Any] = {}
        errors: list[Exception] = []
        for name, table in obj.items():
            if not isinstance(name, str) or not schema.agent_name.fullmatch(name):
                errors.append(_noted(_Invalid(schema.bad_name), name, agent_config))
            elif not isinstance(table, Mapping):
                errors.append(_noted(_Invalid("expected a table"), name, agent_config))
            elif "name" in table:
                # The name is the table key; a `name` inside would contradict or repeat it.
                extra = ForbiddenExtraKeysError("", agent_config, {"name"})
                errors.append(_noted(extra, name, agent_config))
            else:
                try:
                    agents[name] = converter.structure({**table, "name": name}, agent_config)
                except Exception as exc:  # a cattrs validation group: say whose it is
                    errors.append(_noted(exc, name, agent_config))
        if errors:
            raise IterableValidationError("While structuring agents", errors, type_)
        return types.MappingProxyType(agents)

    return structure


def _table_hook_factory(
    cl: Any, converter: cattrs.Converter, schema: Schema
) -> Callable[[object, Any], Any]:
    """Structure an attrs class from a TOML table, saying "expected a table" for anything else."""
    inner: Callable[[Any, Any], Any]
    if cl is schema.config:  # `source` records where the data came from; it is not a TOML key
        inner = make_dict_structure_fn(cl, converter, source=override(omit=True))
    else:
        inner = make_dict_structure_fn(cl, converter)

    def structure(obj: object, _: Any) -> Any:
        if not isinstance(obj, Mapping):
            raise _Invalid("expected a table")
        return inner(obj, cl)

    return structure


def _is(expected: object) -> Callable[[object], bool]:
    return lambda type_: type_ == expected


def make_converter(schema: Schema) -> cattrs.Converter:
    """
    Build the config converter: strict scalars, forbidden extra keys, tables checked.

    A new, private converter each call; never the global one.
    """
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(bool, _structure_bool)
    # Generic aliases are not classes, so they are matched by equality, not dispatch.
    converter.register_structure_hook_func(_is(tuple[str, ...]), _structure_str_tuple)
    converter.register_structure_hook_func(_is(Mapping[str, str]), _structure_str_map)
    converter.register_structure_hook_func(
        _is(Mapping[str, schema.agent]),  # type: ignore[name-defined]
        _agents_hook(converter, schema),
    )
    converter.register_structure_hook_factory(
        attrs.has, lambda cl, conv: _table_hook_factory(cl, conv, schema)
    )
    return converter


#: the converter of each schema (one: config.model's), made at its first document
_CONVERTERS: dict[Schema, cattrs.Converter] = {}


# --- error messages ------------------------------------------------------------------------


_KeyPath = tuple[str | int, ...]

# One step of a cattrs path as rendered by transform_error: `.attr`, `[0]` or `['key']`.
_PATH_STEP: Final = re.compile(
    r"""\.(?P<attr>[A-Za-z_][A-Za-z0-9_]*)"""
    r"""|\[(?P<index>-?[0-9]+|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]"""
)


def _parse_path(text: str) -> _KeyPath:
    """Turn a transform_error path (without its root) back into keys and indices."""
    steps: list[str | int] = []
    pos = 0
    while pos < len(text):
        m = _PATH_STEP.match(text, pos)
        if m is None:  # not a shape cattrs produces; keep the text rather than lose it
            return (*steps, text[pos:])
        if m["attr"] is not None:
            steps.append(m["attr"])
        else:
            key = ast.literal_eval(m["index"])
            steps.append(key if isinstance(key, int) else str(key))
        pos = m.end()
    return tuple(steps)


def _at(path: _KeyPath, message: str) -> str:
    return f"{render_key_path(path)}: {message}" if path else message


def _unknown_key(path: _KeyPath, key: str, cl: type) -> str:
    known = [f.name for f in attrs.fields(cl) if f.name not in ("name", "source")]
    hint = difflib.get_close_matches(key, known, n=1)
    suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown key {render_key_path((*path, key))!r}{suffix}"


def _describe(exc: BaseException, type_: Any, path: _KeyPath, no_agents: str) -> list[str]:
    if isinstance(exc, ForbiddenExtraKeysError):
        return [_unknown_key(path, key, exc.cl) for key in sorted(exc.extra_fields)]
    if isinstance(exc, _Invalid):
        return [_at(path, str(exc))]
    if isinstance(exc, KeyError):
        return [no_agents if path == ("agents",) else _at(path, "required key missing")]
    return [_at(path, format_exception(exc, type_))]


def _validation_problems(exc: ClassValidationError, no_agents: str) -> list[str]:
    """
    Flatten a cattrs error group into one message per problem, unknown keys first.

    ``transform_error`` walks the group and renders each leaf as ``"{message} @ {path}"``;
    the formatter it calls only records the leaf and returns its index, so the path can be
    split off without guessing at what a message or a key might contain.
    """
    leaves: list[tuple[BaseException, Any]] = []

    def record(leaf: BaseException, type_: Any) -> str:
        leaves.append((leaf, type_))
        return str(len(leaves) - 1)

    problems: list[str] = []
    for line in cattrs.transform_error(exc, path="", format_exception=record):
        index, _, path = line.partition(" @ ")
        leaf, type_ = leaves[int(index)]
        problems.extend(_describe(leaf, type_, _parse_path(path), no_agents))
    problems.sort(key=lambda p: not p.startswith("unknown key"))
    return problems


def structure(data: object, schema: Schema) -> Any:
    """
    Structure ``data`` (the document without ``[policy]``) as ``schema.config``.

    Raises:
        Problems: every problem found, one line each.
    """
    converter = _CONVERTERS.get(schema)
    if converter is None:
        converter = _CONVERTERS[schema] = make_converter(schema)
    try:
        return converter.structure(data, schema.config)
    except ClassValidationError as exc:
        raise Problems(_validation_problems(exc, schema.no_agents)) from None
    except _Invalid as exc:  # the document itself is not a table
        raise Problems([str(exc)]) from None
