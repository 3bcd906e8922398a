"""
Checks messages the bridge sends against the pinned ACP v1 unstable schema: the one the
TypeScript SDK 2.4.0 bundles (``schema/v1/schema.unstable.json`` in
``@agentclientprotocol/sdk``), committed as
``tests/support/schema/acp-v1-unstable-sdk-2.4.0.json``.

The bridge is an agent to its clients and a client to its agents: :func:`check_to_client`
checks what a client receives (as an agent's message), :func:`check_to_agent` what an agent
receives (as a client's). Each message is checked as a whole (the schema's ``Agent`` or
``Client`` branch), then its params, or its result, as the definition for its method.
Extension methods (``_``-prefixed) and their answers are checked as messages only.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "acp-v1-unstable-sdk-2.4.0.json"


@functools.cache
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema


def _validator(ref: dict[str, Any]) -> jsonschema.protocols.Validator:
    root = _schema()
    schema = {"$defs": root["$defs"], **ref}
    cls = jsonschema.validators.validator_for(root)
    return cls(schema)


@functools.cache
def _def_validator(name: str) -> jsonschema.protocols.Validator:
    return _validator({"$ref": f"#/$defs/{name}"})


@functools.cache
def _branch_validator(title: str) -> jsonschema.protocols.Validator:
    [branch] = [b for b in _schema()["anyOf"] if b["title"] == title]
    return _validator(branch)


@functools.cache
def _by_method(side: str) -> tuple[dict[str, str], dict[str, str]]:
    """
    For a peer on ``side`` ("client" or "agent"): (method → params def of what it receives,
    method → result def of the requests it sends).
    """
    other = "agent" if side == "client" else "client"
    received: dict[str, str] = {}
    results: dict[str, str] = {}
    for name, spec in _schema()["$defs"].items():
        method = spec.get("x-method")
        if method is None:
            continue
        if spec.get("x-side") in (side, "protocol") and not name.endswith("Response"):
            received[method] = name
        if spec.get("x-side") == other and name.endswith("Response"):
            results[method] = name
    return received, results


def _check(msg: dict[str, Any], asked: dict[Any, str], branch: str, side: str) -> None:
    _branch_validator(branch).validate(msg)
    method = msg.get("method")
    received, results = _by_method(side)
    if isinstance(method, str):
        if not method.startswith("_"):
            assert method in received, f"not a method a v1 {side} receives: {method}"
            _def_validator(received[method]).validate(msg.get("params"))
        return
    if "error" in msg:
        _def_validator("Error").validate(msg["error"])
        return
    asked_method = asked.get(msg.get("id"))
    assert asked_method is not None, f"an answer to no request of the {side}'s: {msg}"
    if not asked_method.startswith("_"):
        _def_validator(results[asked_method]).validate(msg["result"])


def check_to_client(msg: dict[str, Any], asked: dict[Any, str]) -> None:
    """
    Fail unless ``msg``, sent by the bridge to a v1 client, is valid: as an agent's message,
    and its params (or its result: ``asked`` maps the client's request ids to their methods)
    as the schema's definition for that method.
    """
    _check(msg, asked, "Agent", "client")


def check_to_agent(msg: dict[str, Any], asked: dict[Any, str]) -> None:
    """:func:`check_to_client` for what the bridge sends an agent (as a client's message)."""
    _check(msg, asked, "Client", "agent")


def requests_of(lines: list[dict[str, Any]]) -> dict[Any, str]:
    """The ids and methods of the requests among ``lines`` (what a peer asked)."""
    return {m["id"]: m["method"] for m in lines if "method" in m and "id" in m}
