"""
``initialize``, pure: what a client's asks of the bridge, what the bridge asks its agents and
what it answers.

Shared by the bridge (``engine.from_client``, ``engine.supervisor``) and by ``acp-bridge stdio``'s
standard-library phase (``faces.early``), which answers the first ``initialize`` before trio is
imported: both must send the same bytes, so both build them here. Importable without trio,
attrs, cattrs or structlog (``tests/faces/test_early.py`` checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from acp_bridge import __version__
from acp_bridge.protocol.capabilities import advertised
from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError
from acp_bridge.protocol.wire import LEVEL_RANK, LOG_LEVELS, PROTOCOL_VERSION, bridge_meta

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


class ClientOptions(NamedTuple):
    """What a client's ``initialize`` params say about the client."""

    capabilities: JsonObject
    #: ``_meta.acp_bridge.seq``: a sequence number on every relayed update
    want_seq: bool
    #: ``_meta.acp_bridge.log``: the level of the log channel's notifications, or None
    log_level: str | None
    #: any ``_meta.acp_bridge``: a client written for the bridge
    extensions: bool


def client_options(params: JsonObject) -> ClientOptions:
    """
    A client's ``initialize`` params read (``protocolVersion`` and the bridge's own
    ``_meta.acp_bridge`` options checked).

    Raises:
        JsonRpcError: invalid params, answered under the request's id.
    """
    if type(params.get("protocolVersion")) is not int:
        raise JsonRpcError.invalid_params("protocolVersion: expected an integer")
    ours = bridge_meta(params)
    log_level = ours.get("log")
    if log_level is not None and (not isinstance(log_level, str) or log_level not in LEVEL_RANK):
        raise JsonRpcError.invalid_params(
            f"_meta.acp_bridge.log: expected one of {', '.join(LOG_LEVELS)}"
        )
    caps = params.get("clientCapabilities")
    meta = params.get("_meta")
    return ClientOptions(
        capabilities=caps if isinstance(caps, dict) else {},
        want_seq=ours.get("seq") is True,
        log_level=log_level,
        extensions=isinstance(meta, dict) and isinstance(meta.get("acp_bridge"), dict),
    )


def agent_params(offered: JsonObject) -> JsonObject:
    """The params of the bridge's ``initialize`` to an agent offered ``offered`` capabilities."""
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": offered,
        "clientInfo": {"name": "acp-bridge", "version": __version__},
    }


class AgentFields(NamedTuple):
    """What the bridge keeps of an agent's ``initialize`` result."""

    capabilities: JsonObject
    auth_methods: list[Any]
    agent_info: JsonObject | None


def agent_fields(result: JsonObject) -> AgentFields:
    """An agent's ``initialize`` result (a dict of the bridge's protocol version), as kept."""
    caps = result.get("agentCapabilities")
    methods = result.get("authMethods")
    info = result.get("agentInfo")
    return AgentFields(
        capabilities=caps if isinstance(caps, dict) else {},
        auth_methods=methods if isinstance(methods, list) else [],
        agent_info=info if isinstance(info, dict) else None,
    )


def bridge_answer(
    default_caps: JsonObject,
    all_agents_caps: Iterable[JsonObject],
    auth_methods: list[Any],
    default_agent: str,
    agents: Sequence[str],
) -> JsonObject:
    """
    The bridge's ``initialize`` result: the default agent's capabilities as the bridge
    advertises them (``protocol.capabilities.advertised``), its auth methods, the bridge's own info
    and every agent's name.
    """
    return {
        # The only version the bridge speaks (the spec: the requested one when supported,
        # else the latest supported; 0 is no version at all).
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": advertised(default_caps, all_agents_caps),
        "authMethods": auth_methods,
        "agentInfo": {"name": "acp-bridge", "title": "acp-bridge", "version": __version__},
        "_meta": {"acp_bridge": {"defaultAgent": default_agent, "agents": list(agents)}},
    }


__all__ = [
    "AgentFields",
    "ClientOptions",
    "agent_fields",
    "agent_params",
    "bridge_answer",
    "client_options",
]
