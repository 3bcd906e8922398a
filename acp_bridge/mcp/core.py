"""
The bridge's MCP server, sans I/O: tokens, MCP sessions, and what to answer each HTTP request
of the Streamable HTTP transport. No trio: ``mcp.server`` (through ``http.server``) reads and
writes, this decides.

The subset of MCP served (the official clients need no more; both are tested against it):
``initialize`` (versions :data:`PROTOCOL_VERSIONS`, the client's if we know it, else our
newest), ``notifications/initialized``, ``ping``, ``tools/list``, ``tools/call`` and
``notifications/cancelled``. Every other request is ``-32601``, every other notification is
accepted and ignored. Answers are ``application/json`` (no SSE: nothing is streamed, and the
server never sends requests); ``GET`` is 405, which the spec allows; ``DELETE`` ends an MCP
session. Batches (allowed by 2025-03-26 only, sent by no official client) are refused.

Who may call: each agent session gets its own bearer token (:class:`TokenRegistry`), minted
before ``session/new`` (an agent may list tools before it answers), bound to the session when
the answer comes, revoked when the session ends. A pending token may initialize and list tools,
but a call under it is refused until it is bound. An MCP session (``Mcp-Session-Id``, minted by
``initialize``) belongs to the token that made it: presented with any other, it is unknown.

Bounds: :data:`MAX_TOKENS` tokens, :data:`MAX_SESSIONS_PER_TOKEN` MCP sessions per token (the
least recently used idle one is dropped for a new one; with none idle, ``initialize`` is
refused), :data:`MAX_CALLS_PER_SESSION` calls in flight per MCP session (more: an ``isError``
result that says so).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs
import orjson

from acp_bridge.http.wire import (
    BAD_TOKEN_CHALLENGE,
    BEARER_CHALLENGE,
    Hosts,
    OriginRule,
    RequestHead,
    Response,
    Route,
    Site,
    body_framing,
    plain,
    presented_bearer,
)
from acp_bridge.mcp import modern
from acp_bridge.mcp.tools import ALL_TOOLS, Invocation, check_arguments, error_result
from acp_bridge.protocol.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from collections.abc import Set as AbstractSet

H = TypeVar("H")

__all__ = [
    "MAX_BODY_BYTES",
    "PROTOCOL_VERSIONS",
    "Admit",
    "Cancel",
    "Grant",
    "McpBearer",
    "McpCore",
    "McpSession",
    "Run",
    "TokenRegistry",
]

#: Newest first; ``initialize`` answers the client's version if it is here, else the first.
PROTOCOL_VERSIONS: Final = modern.HANDSHAKE_VERSIONS
#: What a request without ``MCP-Protocol-Version`` speaks (the spec's rule for old clients).
ASSUMED_VERSION: Final = "2025-03-26"
#: Largest request body: a prompt of MAX_PROMPT_CHARS, JSON-escaped, fits. Larger: 413.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
#: Tokens alive at once (one per open agent session): minting more raises.
MAX_TOKENS: Final = 10_000
#: MCP sessions per token (an agent that reconnects without DELETE would pile them up).
MAX_SESSIONS_PER_TOKEN: Final = 8
#: Tool calls in flight per MCP session.
MAX_CALLS_PER_SESSION: Final = 32

_JSON: Final = "application/json"


# ----------------------------------------------------------------------------- tokens


@attrs.define(eq=False)
class Grant:
    """
    One token's rights.

    Attributes:
        token: the bearer token (never logged).
        tools: the tools it is offered (the bridge leaves out ``spawn_agent`` at max depth).
        session: the bridge's id of the session it is bound to; None while pending.
        target: a re-export token's: the client's ``acp`` server it reaches (the trio side's
            own); None for a sub-agent server's.
        in_flight: a re-export token's requests in flight.
        client_capabilities: a re-export token's: what its MCP client's ``initialize`` named
            (a client of a revision before 2026-07-28 says it once, not in each request).
    """

    token: str = attrs.field(repr=False)
    tools: frozenset[str]
    session: str | None = None
    target: object = None
    in_flight: int = 0
    client_capabilities: dict[str, Any] | None = None


class TokenRegistry:
    """
    Per-session bearer tokens: mint, bind once, check, revoke.

    Looked up by their SHA-256 (so the lookup's timing says nothing about the token) and
    compared with :func:`hmac.compare_digest`.
    """

    def __init__(self, *, max_tokens: int = MAX_TOKENS) -> None:
        self._max = max_tokens
        self._by_digest: dict[bytes, Grant] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def mint(self, tools: Sequence[str] = ALL_TOOLS, *, target: object = None) -> str:
        """
        A new pending token (256 random bits, URL-safe) offering ``tools`` (a re-export's:
        none, and the ``target`` it reaches).

        Raises:
            ValueError: an unknown tool name.
            OverflowError: :data:`MAX_TOKENS` are alive (the bridge leaks tokens: a bug).
        """
        unknown = set(tools) - set(ALL_TOOLS)
        if unknown:
            raise ValueError(f"unknown tools {sorted(unknown)}")
        if len(self._by_digest) >= self._max:
            raise OverflowError(f"{self._max} MCP tokens alive: revoke tokens of ended sessions")
        token = secrets.token_urlsafe(32)
        self._by_digest[_digest(token)] = Grant(token, frozenset(tools), target=target)
        return token

    def bind(self, token: str, session: str) -> Grant:
        """
        Bind a pending token to ``session`` (when ``session/new`` answered).

        Raises:
            KeyError: unknown or revoked token.
            ValueError: already bound (to this or another session): a token is never moved.
        """
        grant = self.check(token)
        if grant is None:
            raise KeyError("unknown or revoked MCP token")
        if grant.session is not None:
            raise ValueError(f"MCP token already bound to session {grant.session}")
        grant.session = session
        return grant

    def check(self, presented: str) -> Grant | None:
        """The grant of a presented token; None for an unknown or revoked one."""
        grant = self._by_digest.get(_digest(presented))
        if grant is None or not hmac.compare_digest(grant.token.encode(), presented.encode()):
            return None
        return grant

    def revoke(self, token: str) -> Grant | None:
        """Forget ``token`` (its session ended, or ``session/new`` failed); its grant if known."""
        grant = self.check(token)
        if grant is not None:
            del self._by_digest[_digest(token)]
        return grant

    def revoke_session(self, session: str) -> list[Grant]:
        """Forget every token bound to ``session``."""
        gone = [(d, g) for d, g in self._by_digest.items() if g.session == session]
        for digest, _ in gone:
            del self._by_digest[digest]
        return [g for _, g in gone]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


# ----------------------------------------------------------------------------- verdicts


@attrs.frozen
class McpBearer:
    """The endpoint's credential: ``Authorization: Bearer`` with a live token (the principal
    is its :class:`Grant`)."""

    tokens: TokenRegistry

    def authenticate(self, head: RequestHead, *, now: float) -> Response | Grant:
        if not head.values("authorization"):
            return plain(401, "unauthorized: bearer token required", BEARER_CHALLENGE)
        presented = presented_bearer(head, query=False)
        grant = self.tokens.check(presented) if presented is not None else None
        if grant is None:
            return plain(401, "unauthorized: unknown or revoked token", BAD_TOKEN_CHALLENGE)
        return grant


@attrs.frozen
class Admit:
    """A request head that passed: read the body (POST) and hand it to :meth:`McpCore.post`."""

    method: str
    grant: Grant
    session_id: str | None
    version: str | None


@attrs.define(eq=False)
class McpSession:
    """One ``initialize``'s state: its token, its version, its calls in flight."""

    id: str
    grant: Grant
    version: str
    in_flight: set[object] = attrs.Factory(set)
    last_used: int = 0


@attrs.frozen
class Run:
    """Run a checked tool call, then answer :meth:`McpCore.finish`'s verdict (or, over ACP,
    :meth:`McpCore.acp_outcome`'s: ``session`` None)."""

    session: McpSession | None
    request_id: object
    caller: str
    call: Invocation


@attrs.frozen
class Cancel:
    """Cancel the call ``request_id`` of ``session`` if it is in flight; answer 202."""

    session: McpSession
    request_id: object


def _rpc_error(request_id: object, code: int, message: str) -> bytes:
    return orjson.dumps(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    )


def _error(status: int, request_id: object, code: int, message: str) -> Response:
    return Response(status, _rpc_error(request_id, code, message), content_type=_JSON)


def _result(request_id: object, result: Mapping[str, Any]) -> Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    return Response(200, body, content_type=_JSON)


ACCEPTED: Final = Response(202)


class McpCore:
    """
    The decisions of one MCP endpoint (``http://127.0.0.1:PORT/mcp``): which requests pass,
    which MCP sessions exist, what each message is answered.
    """

    def __init__(
        self,
        tokens: TokenRegistry,
        tools: Mapping[str, Mapping[str, Any]],
        *,
        server_version: str,
        path: str = "/mcp",
        instructions: str | None = None,
    ) -> None:
        self.tokens = tokens
        #: the tokens of the clients' ``acp`` servers re-exported at :attr:`export_path`
        self.exports = TokenRegistry()
        self.tools = tools
        self.path = path
        self.export_path = f"{path}/client"
        self._server_info = {"name": "acp-bridge", "version": server_version}
        self._instructions = instructions
        self._sessions: dict[str, McpSession] = {}
        self._clock = 0

    # ------------------------------------------------------------------ HTTP heads

    def site(self, post: H, delete: H, export: H) -> Site[H]:
        """
        The endpoint's rules, for ``http.server``: ``Host`` (a loopback name with our port, or
        one of a set: ssh agents reach the listener through forwarded ports of theirs; the
        connection's own, see :meth:`hosts`), no ``Origin`` (no browser has business here),
        the path, the method (POST and DELETE: ``GET`` is 405, the spec's answer for a server
        that offers no SSE stream), the bearer token (:class:`McpBearer`). At
        :attr:`export_path`, the clients' re-exported servers: POST only (MCP 2026-07-28 has
        no MCP session to end), each with a token of :attr:`exports`.
        """
        refusal = plain(403, "forbidden: requests from a web page are not accepted")
        route = Route({"POST": post, "DELETE": delete}, credential=McpBearer(self.tokens))
        exported = Route({"POST": export}, credential=McpBearer(self.exports))
        routes = {self.path: route, self.export_path: exported}
        return Site(Hosts(frozenset()), routes, origin=OriginRule(frozenset(), refusal))

    @staticmethod
    def hosts(ports: AbstractSet[int]) -> Hosts:
        """The ``Host`` values a connection may name: the loopback names with ``ports``."""
        return Hosts.loopback(ports)

    def admit(self, head: RequestHead, grant: Grant) -> Admit | Response:
        """
        A request :meth:`site` let through, before its body is read: for POST, the content
        type (415) and the body's length (413, and 400 for a malformed framing).
        """
        if head.method == "POST":
            kind = (head.values("content-type") or [""])[0].split(";")[0].strip().lower()
            if kind != "application/json":
                return plain(415, "unsupported media type: send application/json")
            framing = body_framing(head, max_bytes=MAX_BODY_BYTES)
            if isinstance(framing, Response):
                return framing
        session_ids = head.values("mcp-session-id")
        versions = head.values("mcp-protocol-version")
        return Admit(
            head.method,
            grant,
            session_ids[0].strip() if session_ids else None,
            versions[0].strip() if versions else None,
        )

    # ------------------------------------------------------------------ DELETE

    def delete(self, admit: Admit) -> tuple[Response, McpSession | None]:
        """End the MCP session named in the request: the answer, and the session (to cancel
        its calls)."""
        session = self._session_of(admit)
        if session is None:
            return plain(404 if admit.session_id else 400, "unknown MCP session"), None
        del self._sessions[session.id]
        return Response(200), session

    # ------------------------------------------------------------------ POST

    def post(self, admit: Admit, body: bytes) -> Response | Run | Cancel:
        """The answer to a POSTed JSON-RPC message, or a call or a cancel for the shell."""
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error(400, None, PARSE_ERROR, "parse error: the body is not JSON")
        if isinstance(message, list):
            return _error(400, None, INVALID_REQUEST, "batches are not supported")
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(400, None, INVALID_REQUEST, "not a JSON-RPC 2.0 message")
        method = message.get("method")
        if method is None:
            return ACCEPTED  # a response (we send no requests) or junk: nothing to answer
        request_id = message.get("id")
        is_request = "id" in message
        if is_request and (isinstance(request_id, bool) or not isinstance(request_id, str | int)):
            return _error(400, None, INVALID_REQUEST, "id must be a string or an integer")
        if not isinstance(method, str):
            return _error(400, request_id, INVALID_REQUEST, "method must be a string")
        params = message.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _error(400, request_id, INVALID_PARAMS, "params must be an object")
        if method == "initialize" and is_request:
            return self._initialize(admit, request_id, params)
        if is_request and method not in ("ping", "tools/list", "tools/call"):
            return _error(200, request_id, METHOD_NOT_FOUND, f"method not found: {method[:100]}")
        if admit.version is not None and admit.version not in PROTOCOL_VERSIONS:
            return _error(
                400,
                request_id,
                INVALID_REQUEST,
                f"unsupported MCP-Protocol-Version {admit.version[:40]!r}",
            )
        session = self._session_of(admit)
        if session is None:
            if admit.session_id is None:
                return _error(
                    400, request_id, INVALID_REQUEST, "Mcp-Session-Id required: initialize first"
                )
            return _error(404, request_id, INVALID_REQUEST, "unknown MCP session: initialize again")
        self._clock += 1
        session.last_used = self._clock
        if not is_request:
            if method == "notifications/cancelled":
                return Cancel(session, params.get("requestId"))
            return ACCEPTED
        if method == "ping":
            return _result(request_id, {})
        if method == "tools/list":
            return _result(
                request_id,
                {"tools": [self.tools[n] for n in self.tools if n in session.grant.tools]},
            )
        return self._call(session, request_id, params)

    def _initialize(self, admit: Admit, request_id: object, params: Mapping[str, Any]) -> Response:
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            return _error(200, request_id, INVALID_PARAMS, "initialize: protocolVersion missing")
        mine = [s for s in self._sessions.values() if s.grant is admit.grant]
        if len(mine) >= MAX_SESSIONS_PER_TOKEN:
            idle = [s for s in mine if not s.in_flight]
            if not idle:
                return _error(
                    503, request_id, INVALID_REQUEST, f"{MAX_SESSIONS_PER_TOKEN} MCP sessions busy"
                )
            del self._sessions[min(idle, key=lambda s: s.last_used).id]
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        self._clock += 1
        session = McpSession(secrets.token_hex(16), admit.grant, version, last_used=self._clock)
        self._sessions[session.id] = session
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": self._server_info,
        }
        if self._instructions:
            result["instructions"] = self._instructions
        answer = _result(request_id, result)
        return attrs.evolve(answer, headers=(*answer.headers, ("Mcp-Session-Id", session.id)))

    def _call(
        self, session: McpSession, request_id: object, params: Mapping[str, Any]
    ) -> Response | Run:
        name = params.get("name")
        if not isinstance(name, str) or name not in session.grant.tools:
            shown = name[:100] if isinstance(name, str) else name
            return _error(200, request_id, INVALID_PARAMS, f"unknown tool: {shown!r}")
        checked = check_arguments(self.tools, name, params.get("arguments"))
        if isinstance(checked, str):
            return _result(request_id, error_result(checked))
        caller = session.grant.session
        if caller is None:
            return _result(
                request_id, error_result(f"{name}: this session is still being set up; try again")
            )
        if request_id in session.in_flight:
            return _error(200, request_id, INVALID_REQUEST, "a call with this id is in flight")
        if len(session.in_flight) >= MAX_CALLS_PER_SESSION:
            return _result(
                request_id,
                error_result(f"{name}: {MAX_CALLS_PER_SESSION} calls are in flight; wait for one"),
            )
        session.in_flight.add(request_id)
        return Run(session, request_id, caller, checked)

    def finish(self, run: Run, outcome: Mapping[str, Any]) -> Response:
        """The answer of a call that ran: ``outcome`` is a ``CallToolResult``."""
        self.release(run)
        return _result(run.request_id, outcome)

    def release(self, run: Run) -> None:
        """A call is no longer in flight (answered, cancelled, or its connection is gone)."""
        if run.session is not None:
            run.session.in_flight.discard(run.request_id)

    # ------------------------------------------------------------------ over ACP

    def acp_message(
        self, grant: Grant, method: str, params: Mapping[str, Any] | None
    ) -> dict[str, Any] | Run:
        """
        An ``mcp/message`` request of an agent to the bridge's own server over ACP (MCP
        2026-07-28: no MCP session, each request says its version in ``_meta``): the inner
        outcome to answer (``{"result": ...}`` or ``{"error": ...}``), or a call to run (then
        :meth:`acp_outcome`). The same tools and checks as over HTTP; the calls in flight are
        bounded by the binding (``mcp.acp``), not per MCP session.
        """
        inner = dict(params) if isinstance(params, dict) else {}
        error = modern.envelope_error(inner)
        if error is not None:
            return {"error": error}
        if method == "server/discover":
            capabilities = {"tools": {"listChanged": False}}
            info = modern.discover_result(capabilities, self._server_info, self._instructions)
            return {"result": info}
        if method == "tools/list":
            tools = [self.tools[n] for n in self.tools if n in grant.tools]
            return {
                "result": modern.complete({"tools": tools, "cacheScope": "private", "ttlMs": 0})
            }
        if method != "tools/call":
            return {
                "error": {"code": METHOD_NOT_FOUND, "message": f"Method not found: {method[:100]}"}
            }
        name = inner.get("name")
        if not isinstance(name, str) or name not in grant.tools:
            shown = name[:100] if isinstance(name, str) else name
            return {"error": {"code": INVALID_PARAMS, "message": f"unknown tool: {shown!r}"}}
        checked = check_arguments(self.tools, name, inner.get("arguments"))
        if isinstance(checked, str):
            return self.acp_outcome(error_result(checked))
        if grant.session is None:
            return self.acp_outcome(
                error_result(f"{name}: this session is still being set up; try again")
            )
        return Run(None, None, grant.session, checked)

    def acp_outcome(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """The inner outcome of a tool call over ACP: its ``CallToolResult``."""
        return {"result": modern.complete(dict(result), self._server_info)}

    def drop_grant(self, grant: Grant) -> list[McpSession]:
        """Forget the MCP sessions of a revoked token; they are returned (to cancel calls)."""
        gone = [s for s in self._sessions.values() if s.grant is grant]
        for session in gone:
            del self._sessions[session.id]
        return gone

    def _session_of(self, admit: Admit) -> McpSession | None:
        if admit.session_id is None:
            return None
        session = self._sessions.get(admit.session_id)
        if session is None or session.grant is not admit.grant:
            return None  # another token's session is as unknown as a made-up one
        return session

    @property
    def session_count(self) -> int:
        return len(self._sessions)
