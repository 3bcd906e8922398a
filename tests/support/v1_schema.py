"""
Checks messages the bridge sends a v1 client against the pinned ACP v1 schema: the stable
schema the TypeScript SDK 2.4.0 bundles (``schema/v1/schema.json`` in
``@agentclientprotocol/sdk``), committed as ``tests/support/schema/acp-v1-sdk-2.4.0.json``.

A message to a client is what an agent sends (the schema's ``Agent`` branch) or a
protocol-level notification (``$/cancel_request``, its ``ProtocolLevel`` branch); its params
(or its result) are then checked against the schema's own definition for that method.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "acp-v1-sdk-2.4.0.json"
#: What ACP defines as notifications a client sends: the bridge answers one sent as a
#: request with ``null`` (docs/protocol.md)
CLIENT_NOTIFICATIONS = frozenset({"session/cancel", "$/cancel_request"})


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
def _by_method() -> tuple[dict[str, str], dict[str, str]]:
    """(method → params def of what a client receives, method → result def of its requests)."""
    received: dict[str, str] = {}
    results: dict[str, str] = {}
    for name, spec in _schema()["$defs"].items():
        method = spec.get("x-method")
        if method is None:
            continue
        if spec.get("x-side") in ("client", "protocol") and not name.endswith("Response"):
            received[method] = name
        if spec.get("x-side") == "agent" and name.endswith("Response"):
            results[method] = name
    return received, results


def check_to_client(msg: dict[str, Any], asked: dict[Any, str] | None = None) -> None:
    """
    Fail unless ``msg``, sent by the bridge to a v1 client, is valid v1: as an agent's (or a
    protocol-level) message, and its params as the schema's definition for its method; a
    result as the definition of the result of the method it answers (``asked`` maps the
    client's request ids to their methods; None: results are checked as any agent's).
    """
    method = msg.get("method")
    if method == "$/cancel_request":
        _branch_validator("ProtocolLevel").validate(msg)
    else:
        _branch_validator("Agent").validate(msg)
    received, results = _by_method()
    if isinstance(method, str):
        if not method.startswith("_"):
            assert method in received, f"not a method a v1 client receives: {method}"
            _def_validator(received[method]).validate(msg.get("params"))
        return
    if "error" in msg:
        _def_validator("Error").validate(msg["error"])
        return
    if asked is None:
        return
    asked_method = asked.get(msg.get("id"))
    assert asked_method is not None, f"an answer to no request of the client's: {msg}"
    if asked_method in CLIENT_NOTIFICATIONS:
        assert msg["result"] is None, msg
    elif not asked_method.startswith("_"):
        _def_validator(results[asked_method]).validate(msg["result"])


def check_all(messages: list[dict[str, Any]], asked: dict[Any, str] | None = None) -> None:
    """:func:`check_to_client` for each of ``messages``."""
    for msg in messages:
        check_to_client(msg, asked)


__all__ = ["CLIENT_NOTIFICATIONS", "SCHEMA_PATH", "check_all", "check_to_client"]
