"""
MCP over ACP, sans I/O: which ``acp`` MCP server each agent connection knows, and where each
``mcp/message`` goes (docs/protocol.md, "MCP servers over ACP").

The ACP side of the binding (the v1 unstable schema of SDK 2.4.0): a component that provides
MCP servers declares them in a session's ``mcpServers`` as ``{"type": "acp", "name",
"serverId"}``; the other side calls them with ``mcp/message`` requests (``serverId``, the
caller's ``requestId`` of the inner request, the inner ``method`` and ``params``), each
answered with the inner outcome; the provider's ``mcp/message`` notifications (progress,
subscription events) name the ``serverId`` and ``requestId`` of the request they belong to.
Only a client declares servers there (a session's setup is the client's), so requests go agent
to client and notifications client to agent; the bridge adds one provider of its own, its
sub-agent server, which an agent reaches through the same pipe.

One agent connection sees servers of many clients (and the bridge's own): a ``serverId`` is
unique on the connection that declared it, not on the agent's. :class:`McpRouter` gives each
declaration an id of the agent's connection (the client's, unless taken there: then
``"<id>~<n>"``), and keeps every inner request in flight under the ids each side knows, so
an answer and a notification reach the one caller whose request it is. An inner ``requestId``
is passed on as the caller chose it unless another caller has the same one active at that
client's server (two agents may both count from 1): then the client sees ``"<id>~<n>"``.

Pure: no trio, no I/O. Links are opaque keys (compared by identity).
"""

from __future__ import annotations

import collections
import itertools
import secrets
from typing import TYPE_CHECKING, Final

import attrs

from acp_bridge.protocol.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, JsonRpcError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcId

__all__ = [
    "BACKEND_FAILED",
    "MAX_REQUESTS_PER_SESSION",
    "MCP_MESSAGE",
    "RESOURCE_LIMIT",
    "SERVER_UNAVAILABLE",
    "Call",
    "Envelope",
    "McpRouter",
    "ServerRoute",
    "acp_flavour",
    "is_acp_server",
    "read_envelope",
]

#: The ACP method that carries MCP requests and their notifications.
MCP_MESSAGE: Final = "mcp/message"
#: The binding's outer error codes (never inner MCP codes): a limit reached...
RESOURCE_LIMIT: Final = -33000
#: ... no server of that id on this connection (or its provider is gone) ...
SERVER_UNAVAILABLE: Final = -33001
#: ... the provider failed without an MCP outcome.
BACKEND_FAILED: Final = -33002
#: Inner requests in flight per session (its agent's calls of the servers declared in it),
#: the TypeScript SDK's own default per server: one more is answered ``RESOURCE_LIMIT``.
MAX_REQUESTS_PER_SESSION: Final = 64
#: The prefix of the ids the bridge mints for its own server.
OWN_PREFIX: Final = "acp-bridge:"


def is_acp_server(entry: object) -> bool:
    """An ``mcpServers`` entry declaring a server over ACP (as the SDK tells them)."""
    return (
        isinstance(entry, dict)
        and entry.get("type") == "acp"
        and isinstance(entry.get("name"), str)
        and isinstance(entry.get("serverId"), str)
    )


def acp_flavour(capabilities: JsonObject, *, reaches_loopback: bool) -> str | None:
    """
    How an agent with ``capabilities`` is given an ``acp`` server: ``"acp"`` (it speaks
    ``mcp/message``: the entry passes, its id made the connection's), ``"http"`` (it speaks
    HTTP MCP and reaches the bridge's loopback listener: re-exported there), None (neither:
    the entry is dropped).
    """
    mcp = capabilities.get("mcpCapabilities")
    mcp = mcp if isinstance(mcp, dict) else {}
    if mcp.get("acp") is True:
        return "acp"
    if mcp.get("http") is True and reaches_loopback:
        return "http"
    return None


@attrs.frozen
class Envelope:
    """An ``mcp/message``'s params, read: where it goes, and the inner message."""

    server_id: str
    request_id: str
    method: str
    params: JsonObject | None


def read_envelope(params: JsonObject) -> Envelope:
    """
    The envelope of an ``mcp/message`` (request or notification).

    Raises:
        JsonRpcError: ``-32602``, a malformed envelope (the binding's answer).
    """
    server_id, request_id, method = (params.get(k) for k in ("serverId", "requestId", "method"))
    inner = params.get("params")
    wrong = [
        name
        for name, value in (("serverId", server_id), ("requestId", request_id), ("method", method))
        if not isinstance(value, str)
    ]
    if inner is not None and not isinstance(inner, dict):
        wrong.append("params")
    if wrong:
        raise JsonRpcError.invalid_params(f"mcp/message: malformed {', '.join(wrong)}")
    assert isinstance(server_id, str)
    assert isinstance(request_id, str)
    assert isinstance(method, str)
    return Envelope(server_id, request_id, method, inner)


@attrs.define(eq=False)
class ServerRoute:
    """
    One ``acp`` server as one agent connection knows it.

    Attributes:
        server_id: its id on the agent's connection.
        provider: the client link that serves it; None: the bridge's own server.
        provider_id: the id its provider gave it (the bridge's own: ``server_id``).
        session: the bridge id of the session it was declared in, once that is open.
        offer: what declared it, while its session is being opened (None after).
        grant: what a call of the bridge's own server runs as (its token).
    """

    server_id: str
    provider: object | None
    provider_id: str
    session: str | None = None
    offer: object | None = None
    grant: object | None = None

    @property
    def owner(self) -> object:
        """What its calls count against: the session, or the offer while it opens."""
        return self.session if self.session is not None else self.offer


@attrs.define(eq=False)
class Call:
    """
    One inner MCP request in flight through the bridge.

    Attributes:
        provider: the client link asked; None: the bridge's own server answers it.
        provider_id: the server's id at its provider.
        request_id: the inner request's id as the provider sees it.
        outer_id: the id of the ``mcp/message`` the bridge sent the provider (None: own).
        caller: the agent link that asked; None: the bridge itself (an HTTP re-export).
        caller_id: the caller's id of its ``mcp/message`` (None: the bridge's own call).
        caller_server_id: the server's id on the caller's connection.
        caller_request_id: the inner request's id as the caller chose it.
        owner: what it counts against (a session, or an offer; see :class:`ServerRoute`).
        handle: the trio side's own (what waits for it, how it is cancelled).
    """

    provider: object | None
    provider_id: str
    request_id: str
    outer_id: int | None
    caller: object | None
    caller_id: JsonRpcId
    caller_server_id: str
    caller_request_id: str
    owner: object
    handle: object = None


class McpRouter:
    """
    The ``acp`` servers of every agent connection and the inner requests in flight.

    Args:
        max_per_session: inner requests in flight per session (:meth:`admit` refuses more).
    """

    def __init__(self, *, max_per_session: int = MAX_REQUESTS_PER_SESSION) -> None:
        self._max = max_per_session
        #: agent link -> its connection's server id -> route
        self._servers: dict[object, dict[str, ServerRoute]] = {}
        #: (provider, outer id) -> call: a provider's answer
        self._by_outer: dict[tuple[object, int], Call] = {}
        #: (provider, its server id, request id) -> call: a provider's notification
        self._by_inner: dict[tuple[object, str, str], Call] = {}
        #: (caller, its id) -> call: a caller's withdrawal
        self._by_caller: dict[tuple[object, JsonRpcId], Call] = {}
        #: (caller, its server id, its request id): a caller's duplicate
        self._caller_inner: set[tuple[object, str, str]] = set()
        self._per_owner: collections.Counter[object] = collections.Counter()
        self._bridge_ids = itertools.count(1)

    # ------------------------------------------------------------------ servers

    def declare(
        self,
        agent: object,
        provider: object | None,
        provider_id: str,
        *,
        offer: object | None = None,
        session: str | None = None,
        grant: object | None = None,
    ) -> str:
        """
        A server declared to ``agent`` (a client's, or the bridge's own with ``provider``
        None): its id on the agent's connection, kept from ``provider_id`` when free there
        (the bridge's own: minted).
        """
        table = self._servers.setdefault(agent, {})
        wanted = provider_id if provider is not None else OWN_PREFIX + secrets.token_hex(6)
        server_id = wanted
        for n in itertools.count(2):
            if server_id not in table:
                break
            server_id = f"{wanted}~{n}"
        provided = provider_id if provider is not None else server_id
        table[server_id] = ServerRoute(server_id, provider, provided, session, offer, grant)
        return server_id

    def route(self, agent: object, server_id: str) -> ServerRoute | None:
        return self._servers.get(agent, {}).get(server_id)

    def routes(self, agent: object) -> list[ServerRoute]:
        return list(self._servers.get(agent, {}).values())

    def bind(self, agent: object, offer: object, session: str, *, replace: bool) -> None:
        """
        The session ``offer`` opened is ``session``: its servers are that session's. With
        ``replace`` (a load or resume: the agent took the session up with these servers), the
        session's earlier declarations go.
        """
        table = self._servers.get(agent, {})
        for server_id, route in list(table.items()):
            if route.offer is offer:
                route.offer, route.session = None, session
            elif replace and route.session == session:
                del table[server_id]
        for call in list(self._calls()):
            if call.owner is offer:
                self._move_owner(call, session)

    def drop_offer(self, agent: object, offer: object) -> None:
        """The session ``offer`` was for did not open: its declarations go."""
        table = self._servers.get(agent, {})
        for server_id in [s for s, route in table.items() if route.offer is offer]:
            del table[server_id]

    # ------------------------------------------------------------------ calls

    def admit(self, agent: object, caller_id: JsonRpcId, envelope: Envelope) -> Call:
        """
        An agent's ``mcp/message`` request (its id ``caller_id``): the call in flight, under
        the ids its provider knows (``outer_id`` is the trio side's to set, and
        :meth:`sent`). A call of the bridge's own server has ``provider`` None.

        Raises:
            JsonRpcError: the answer instead: no such server (``SERVER_UNAVAILABLE``), an id
                in flight (``-32600``), the same inner request active (``-32602``), the
                session's calls at the bound (``RESOURCE_LIMIT``).
        """
        route = self.route(agent, envelope.server_id)
        if route is None:
            raise JsonRpcError(
                SERVER_UNAVAILABLE,
                "MCP server registration unavailable",
                {"serverId": envelope.server_id},
            )
        if (agent, caller_id) in self._by_caller:
            raise JsonRpcError(INVALID_REQUEST, f"Invalid request: id {caller_id!r} is in flight")
        if (agent, envelope.server_id, envelope.request_id) in self._caller_inner:
            raise JsonRpcError(
                INVALID_PARAMS,
                "duplicate active MCP request ID",
                {"serverId": envelope.server_id, "requestId": envelope.request_id},
            )
        owner = route.owner
        if self._per_owner[owner] >= self._max:
            raise JsonRpcError(
                RESOURCE_LIMIT,
                f"MCP-over-ACP active request limit exceeded ({self._max} per session)",
                {"serverId": envelope.server_id, "limit": self._max},
            )
        request_id = envelope.request_id
        if route.provider is not None:
            request_id = self._free_request_id(route.provider, route.provider_id, request_id)
        call = Call(
            route.provider,
            route.provider_id,
            request_id,
            None,
            agent,
            caller_id,
            envelope.server_id,
            envelope.request_id,
            owner,
        )
        self._add(call)
        return call

    def bridge_call(self, provider: object, provider_id: str, owner: object) -> Call:
        """A call of the bridge's own at ``provider``'s server (its id minted, free there)."""
        request_id = self._free_request_id(
            provider, provider_id, f"{OWN_PREFIX}{next(self._bridge_ids)}"
        )
        call = Call(provider, provider_id, request_id, None, None, None, provider_id, "", owner)
        self._add(call)
        return call

    def sent(self, call: Call, outer_id: int) -> None:
        """``call`` went to its provider under ``outer_id``."""
        call.outer_id = outer_id
        self._by_outer[(call.provider, outer_id)] = call

    def answered(self, provider: object, outer_id: JsonRpcId) -> Call | None:
        """The call ``provider`` answers (now ended), if ``outer_id`` is one in flight."""
        if type(outer_id) is not int:
            return None
        call = self._by_outer.get((provider, outer_id))
        if call is not None:
            self.end(call)
        return call

    def withdrawn(self, caller: object, caller_id: JsonRpcId) -> Call | None:
        """The call ``caller`` withdrew (now ended), if it is one in flight."""
        call = self._by_caller.get((caller, caller_id))
        if call is not None:
            self.end(call)
        return call

    def belongs(self, provider: object, server_id: str, request_id: str) -> Call | None:
        """The call a provider's notification belongs to, if it is in flight."""
        return self._by_inner.get((provider, server_id, request_id))

    def end(self, call: Call) -> bool:
        """Forget ``call``; False when it had ended already."""
        found = False
        if call.outer_id is not None:
            found = self._by_outer.pop((call.provider, call.outer_id), None) is call
        if self._by_inner.get(self._inner_key(call)) is call:
            del self._by_inner[self._inner_key(call)]
            found = True
        if call.caller is not None and self._by_caller.get((call.caller, call.caller_id)) is call:
            del self._by_caller[(call.caller, call.caller_id)]
            self._caller_inner.discard((call.caller, call.caller_server_id, call.caller_request_id))
            found = True
        if found:
            self._per_owner[call.owner] -= 1
            if self._per_owner[call.owner] <= 0:
                del self._per_owner[call.owner]
        return found

    def in_flight(self, owner: object) -> int:
        return self._per_owner[owner]

    # ------------------------------------------------------------------ endings

    def drop_session(self, session: str) -> list[Call]:
        """``session`` left the bridge: its servers go; its calls are returned, ended."""
        for table in self._servers.values():
            for server_id in [s for s, route in table.items() if route.session == session]:
                del table[server_id]
        return self._end_where(lambda call: call.owner == session)

    def drop_agent(self, agent: object) -> list[Call]:
        """``agent``'s process ended (a new one is a new connection): its calls, ended."""
        self._servers.pop(agent, None)
        return self._end_where(lambda call: call.caller is agent)

    def drop_provider(self, provider: object) -> list[Call]:
        """A client link is gone: its servers go everywhere; its calls are returned, ended."""
        for table in self._servers.values():
            for server_id in [s for s, route in table.items() if route.provider is provider]:
                del table[server_id]
        return self._end_where(lambda call: call.provider is provider)

    # ------------------------------------------------------------------ the tables

    def _add(self, call: Call) -> None:
        if call.provider is not None:
            self._by_inner[self._inner_key(call)] = call
        if call.caller is not None:
            self._by_caller[(call.caller, call.caller_id)] = call
            self._caller_inner.add((call.caller, call.caller_server_id, call.caller_request_id))
        self._per_owner[call.owner] += 1

    @staticmethod
    def _inner_key(call: Call) -> tuple[object, str, str]:
        return (call.provider, call.provider_id, call.request_id)

    def _free_request_id(self, provider: object, provider_id: str, wanted: str) -> str:
        request_id = wanted
        for n in itertools.count(2):
            if (provider, provider_id, request_id) not in self._by_inner:
                break
            request_id = f"{wanted}~{n}"
        return request_id

    def _move_owner(self, call: Call, owner: object) -> None:
        self._per_owner[call.owner] -= 1
        if self._per_owner[call.owner] <= 0:
            del self._per_owner[call.owner]
        call.owner = owner
        self._per_owner[owner] += 1

    def _calls(self) -> Iterator[Call]:
        seen: set[int] = set()
        for table in (self._by_inner, self._by_caller, self._by_outer):
            for call in table.values():
                if id(call) not in seen:
                    seen.add(id(call))
                    yield call

    def _end_where(self, predicate: Callable[[Call], bool]) -> list[Call]:
        ended = [call for call in self._calls() if predicate(call)]
        for call in ended:
            self.end(call)
        return ended
