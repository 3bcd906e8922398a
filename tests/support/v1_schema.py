"""
Checks messages the bridge sends against the pinned ACP v1 schema: the stable and the unstable
schema the TypeScript SDK 2.4.0 bundles (``schema/v1/schema.json`` and ``schema.unstable.json``
in ``@agentclientprotocol/sdk``), committed as ``tests/support/schema/acp-v1-sdk-2.4.0.json``
and ``acp-v1-unstable-sdk-2.4.0.json``. A test of an unstable feature (MCP over ACP) checks
against the unstable one; everything else against the stable one.

The bridge is an agent to its clients and a client to its agents: :func:`check_to_client`
checks what a client receives (as an agent's message), :func:`check_to_agent` what an agent
receives (as a client's); a protocol-level notification (``$/cancel_request``) is checked as
one. Each message is checked as a whole, then its params, or its result, as the schema's
definition for its method. Extension methods (``_``-prefixed) and their answers are checked as
messages only.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parent / "schema"
STABLE = SCHEMAS / "acp-v1-sdk-2.4.0.json"
UNSTABLE = SCHEMAS / "acp-v1-unstable-sdk-2.4.0.json"
#: What ACP defines as notifications a client sends: the bridge answers one sent as a
#: request with ``null`` (docs/protocol.md)
CLIENT_NOTIFICATIONS = frozenset({"session/cancel", "$/cancel_request"})


@functools.cache
def _schema(path: Path) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def _validator(path: Path, ref: dict[str, Any]) -> jsonschema.protocols.Validator:
    root = _schema(path)
    cls = jsonschema.validators.validator_for(root)
    return cls({"$defs": root["$defs"], **ref})


@functools.cache
def _def_validator(path: Path, name: str) -> jsonschema.protocols.Validator:
    return _validator(path, {"$ref": f"#/$defs/{name}"})


@functools.cache
def _branch_validator(path: Path, title: str) -> jsonschema.protocols.Validator:
    [branch] = [b for b in _schema(path)["anyOf"] if b["title"] == title]
    return _validator(path, branch)


@functools.cache
def _by_method(path: Path, side: str) -> tuple[dict[str, str], dict[str, str]]:
    """
    For a peer on ``side`` ("client" or "agent"): (method → params def of what it receives,
    method → result def of the requests it sends).
    """
    other = "agent" if side == "client" else "client"
    received: dict[str, str] = {}
    results: dict[str, str] = {}
    for name, spec in _schema(path)["$defs"].items():
        method = spec.get("x-method")
        if method is None:
            continue
        if spec.get("x-side") in (side, "protocol") and not name.endswith("Response"):
            received[method] = name
        if spec.get("x-side") == other and name.endswith("Response"):
            results[method] = name
    return received, results


def _check(msg: dict[str, Any], asked: dict[Any, str] | None, side: str, *, unstable: bool) -> None:
    path = UNSTABLE if unstable else STABLE
    method = msg.get("method")
    if method == "$/cancel_request":
        branch = "ProtocolLevel"
    else:
        branch = "Agent" if side == "client" else "Client"
    _branch_validator(path, branch).validate(msg)
    received, results = _by_method(path, side)
    if isinstance(method, str):
        if not method.startswith("_"):
            assert method in received, f"not a method a v1 {side} receives: {method}"
            _def_validator(path, received[method]).validate(msg.get("params"))
        return
    if "error" in msg:
        _def_validator(path, "Error").validate(msg["error"])
        return
    if asked is None:
        return
    asked_method = asked.get(msg.get("id"))
    assert asked_method is not None, f"an answer to no request of the {side}'s: {msg}"
    if side == "client" and asked_method in CLIENT_NOTIFICATIONS:
        assert msg["result"] is None, msg
    elif not asked_method.startswith("_"):
        _def_validator(path, results[asked_method]).validate(msg["result"])


def check_to_client(
    msg: dict[str, Any], asked: dict[Any, str] | None = None, *, unstable: bool = False
) -> None:
    """
    Fail unless ``msg``, sent by the bridge to a v1 client, is valid v1: as an agent's (or a
    protocol-level) message, and its params as the schema's definition for its method; a
    result as the definition of the result of the method it answers (``asked`` maps the
    client's request ids to their methods; None: results are checked as any agent's).
    """
    _check(msg, asked, "client", unstable=unstable)


def check_to_agent(
    msg: dict[str, Any], asked: dict[Any, str] | None = None, *, unstable: bool = False
) -> None:
    """:func:`check_to_client` for what the bridge sends an agent (as a client's message)."""
    _check(msg, asked, "agent", unstable=unstable)


def check_all(
    messages: list[dict[str, Any]], asked: dict[Any, str] | None = None, *, unstable: bool = False
) -> None:
    """:func:`check_to_client` for each of ``messages``."""
    for msg in messages:
        check_to_client(msg, asked, unstable=unstable)


def requests_of(lines: list[dict[str, Any]]) -> dict[Any, str]:
    """The ids and methods of the requests among ``lines`` (what a peer asked)."""
    return {m["id"]: m["method"] for m in lines if "method" in m and "id" in m}


__all__ = [
    "CLIENT_NOTIFICATIONS",
    "STABLE",
    "UNSTABLE",
    "check_all",
    "check_to_agent",
    "check_to_client",
    "requests_of",
]
