"""
Checks messages the bridge's v2 face sends against the pinned ACP v2 schema: the draft the
TypeScript SDK 2.4.0 bundles (``schema/v2/schema.json`` in ``@agentclientprotocol/sdk``),
committed as ``tests/support/schema/acp-v2-sdk-2.4.0.json`` (docs/v2.md).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "acp-v2-sdk-2.4.0.json"


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
def _agent_message_validator() -> jsonschema.protocols.Validator:
    # The root's first branch: any message an agent sends (request, response, notification).
    branch = _schema()["anyOf"][0]
    assert branch["title"] == "Agent"
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


def check_to_client(msg: dict[str, Any], asked: dict[Any, str]) -> None:
    """
    Fail unless ``msg``, sent by the bridge to a v2 client, is valid v2: as an agent's
    message, and its params (or its result, ``asked`` mapping the client's request ids to
    their methods) as the schema's definition for that method.
    """
    _agent_message_validator().validate(msg)
    method = msg.get("method")
    received, results = _by_method()
    if isinstance(method, str):
        if not method.startswith("_"):
            assert method in received, f"not a method a v2 client receives: {method}"
            _def_validator(received[method]).validate(msg.get("params"))
        return
    if "error" in msg:
        _def_validator("Error").validate(msg["error"])
        return
    asked_method = asked.get(msg.get("id"))
    assert asked_method is not None, f"an answer to no request of the client's: {msg}"
    if not asked_method.startswith("_"):
        _def_validator(results[asked_method]).validate(msg["result"])
