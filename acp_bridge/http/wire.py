"""
HTTP/1.1 for every endpoint of the daemon, pure: what a request is, who may make it, what is
answered, and how a body is framed. ``http.server`` reads and writes; this decides.

A listener is a :class:`Site`: the ``Host`` values it answers to (:class:`Hosts`, DNS
rebinding), optionally an ``Origin`` rule for every path, and its :class:`Route` objects by
path, each with its methods' handlers, an optional check of the request's own form, an
``Origin`` rule and a :class:`Credential`. :meth:`Site.judge` checks a request head in this
order and answers the first failure:

1. ``Host``: exactly one, allowed (**403**);
2. the site's ``Origin`` rule, when it has one (**403**);
3. the target is a path (**400**), a route has it (**404**), the method is one of the route's
   (**405** with ``Allow``);
4. the route's own check (the WebSocket upgrade's form: **426**, **400**);
5. the route's ``Origin`` rule (**403**), then its credential (**401**; the console's CSRF:
   **403**).

What passes is :class:`Admitted`: the handler, and what the credential proved (the
principal). Every answer is a :class:`Response`, rendered here; a body is framed by
:func:`body_framing` (``Content-Length`` or chunked) and chunked bodies are decoded by
:class:`ChunkedDecoder`.

Pure: no trio, no socket, no clock (fenced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import hmac
import http
import ipaddress
import json
import urllib.parse
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from collections.abc import Set as AbstractSet

__all__ = [
    "LOOPBACK_NAMES",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "Admitted",
    "BearerToken",
    "BodyError",
    "Chunked",
    "ChunkedDecoder",
    "Credential",
    "Hosts",
    "Length",
    "OriginRule",
    "RequestHead",
    "Response",
    "Route",
    "Site",
    "body_framing",
    "bracketed",
    "has_body",
    "head_refusal",
    "host_key",
    "json_response",
    "origin_key",
    "plain",
    "presented_bearer",
    "too_large",
]

#: The largest request head (request line and headers); one byte more: 431.
MAX_HEAD_BYTES: Final = 16 * 1024
#: Header fields in one request head; one more: 431 (each costs a parse and a lookup).
MAX_HEADERS: Final = 100
#: A chunk-size line (the size and any extensions); longer: the body is malformed.
MAX_CHUNK_LINE: Final = 1024
#: The trailer fields after the last chunk, all together; more: the body is malformed.
MAX_TRAILER_BYTES: Final = 16 * 1024

LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")

H = TypeVar("H")


# --------------------------------------------------------------------------- requests


@attrs.frozen
class RequestHead:
    """
    A parsed HTTP request head.

    Attributes:
        method: e.g. ``"GET"``.
        target: the request target as sent (path and query).
        http_version: e.g. ``"1.1"``.
        headers: (lower-case name, value) pairs in arrival order, values decoded as Latin-1.
    """

    method: str
    target: str
    http_version: str
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        """Every value of header ``name`` (lower case)."""
        return [value for key, value in self.headers if key == name]

    def tokens(self, name: str) -> set[str]:
        """The comma-separated tokens of header ``name``, lower-cased (``Connection``...)."""
        return {
            token.strip().lower()
            for value in self.values(name)
            for token in value.split(",")
            if token.strip()
        }

    @property
    def path(self) -> str:
        return urllib.parse.urlsplit(self.target).path

    @property
    def query(self) -> str:
        return urllib.parse.urlsplit(self.target).query

    @property
    def keep_alive(self) -> bool:
        """Whether the client lets the connection carry another request after this one."""
        connection = self.tokens("connection")
        if self.http_version == "1.1":
            return "close" not in connection
        return "keep-alive" in connection


def head_refusal(status_hint: int) -> Response:
    """The answer to a head the parser refused (its status hint: 431 for size, else 400)."""
    if status_hint == 431:
        return plain(431, "request head too large")
    return plain(status_hint if 400 <= status_hint < 600 else 400, "bad request")


# --------------------------------------------------------------------------- responses


@attrs.frozen
class Response:
    """
    An HTTP response.

    Attributes:
        status: the status code.
        body: the whole body (of a streamed response, its first bytes: see
            :meth:`render_streamed`).
        headers: extra response headers.
        content_type: the ``Content-Type``; None for none (an empty answer).
        close: end the connection after it (``Connection: close``); False lets the client
            send another request on it.
    """

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    close: bool = True

    def render(self) -> bytes:
        """The whole response, head and body."""
        return self._head([f"Content-Length: {len(self.body)}"]) + self.body

    def render_streamed(self) -> bytes:
        """The head of a response whose body is written over time (server-sent events), and
        the body's first bytes: no length, so the body ends when the connection does."""
        return attrs.evolve(self, close=True)._head([]) + self.body

    def _head(self, length: list[str]) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {http.HTTPStatus(self.status).phrase}"]
        if self.content_type is not None:
            lines.append(f"Content-Type: {self.content_type}")
        lines += [*length, "Cache-Control: no-store"]
        if self.close:
            lines.append("Connection: close")
        lines += [f"{name}: {value}" for name, value in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    @property
    def why(self) -> str:
        """What a plain-text answer says (for the log); empty for any other."""
        if self.content_type is None or not self.content_type.startswith("text/plain"):
            return ""
        return self.body[:200].decode("utf-8", "replace").strip()


def plain(status: int, why: str, headers: Iterable[tuple[str, str]] = ()) -> Response:
    """A short plain-text answer: ``why`` is fixed text, never an echo of the request."""
    return Response(status, why.encode() + b"\n", tuple(headers), "text/plain; charset=utf-8")


def json_response(status: int, data: Any, headers: Iterable[tuple[str, str]] = ()) -> Response:
    return Response(status, json.dumps(data).encode(), tuple(headers), "application/json")


# --------------------------------------------------------------------------- bodies


@attrs.frozen
class Length:
    """A body of exactly ``length`` bytes (``Content-Length``; 0 without one)."""

    length: int


@attrs.frozen
class Chunked:
    """A chunked body (``Transfer-Encoding: chunked``): decode with :class:`ChunkedDecoder`."""


def body_framing(
    head: RequestHead, *, max_bytes: int, length_required: bool = False
) -> Length | Chunked | Response:
    """
    How the request's body is delimited, or why it is refused before a byte of it is read:
    both ``Content-Length`` and ``Transfer-Encoding`` (a smuggling attempt), a coding other
    than chunked or a malformed length (**400**), a length over ``max_bytes`` (**413**), none
    of the two when ``length_required`` (**411**).
    """
    codings = [c.strip().lower() for v in head.values("transfer-encoding") for c in v.split(",")]
    lengths = {v.strip() for v in head.values("content-length")}
    if codings and lengths:
        return plain(400, "bad request: both Content-Length and Transfer-Encoding")
    if codings:
        return Chunked() if codings == ["chunked"] else plain(400, "bad request: unknown coding")
    if not lengths:
        return plain(411, "length required") if length_required else Length(0)
    text = lengths.pop() if len(lengths) == 1 else ""
    if not (text.isascii() and text.isdigit()):
        return plain(400, "bad request: malformed Content-Length")
    if int(text) > max_bytes:
        return too_large(max_bytes)
    return Length(int(text))


def has_body(head: RequestHead) -> bool:
    """Whether the request says it carries a body (chunked, or a length other than 0)."""
    lengths = {v.strip() for v in head.values("content-length")}
    return bool(head.values("transfer-encoding")) or bool(lengths - {"0"})


def too_large(max_bytes: int) -> Response:
    return plain(413, f"request body over {max_bytes} bytes")


class BodyError(Exception):
    """A chunked body that breaks the format (the message: fixed text, for the answer)."""


class ChunkedDecoder:
    """
    A chunked body, decoded as its bytes arrive (RFC 9112 §7.1): :meth:`feed` returns the
    payload in what it was given; :attr:`done` once the last chunk and the trailers are in,
    and :attr:`rest` is then what followed them (the next request's bytes).

    Bounds: it holds at most a chunk-size line (:data:`MAX_CHUNK_LINE`) or the trailers
    (:data:`MAX_TRAILER_BYTES`) besides what it is fed; more is :class:`BodyError`. The
    payload's own cap is the caller's (it sees each piece).
    """

    def __init__(self) -> None:
        self._line = bytearray()
        self._left = 0  # payload bytes of the current chunk still to come
        self._state = "size"  # size, data, data-end, trailers
        self._trailers = 0
        self.done = False
        self.rest = b""

    def feed(self, data: bytes) -> bytes:
        """The payload in ``data``. Raises :class:`BodyError` for a malformed body."""
        out = bytearray()
        i, n = 0, len(data)
        while i < n and not self.done:
            if self._state == "data":
                take = min(self._left, n - i)
                out += data[i : i + take]
                i += take
                self._left -= take
                if not self._left:
                    self._state = "data-end"
                continue
            end = data.find(b"\n", i)
            stop = n if end < 0 else end + 1
            self._line += data[i:stop]
            i = stop
            limit = MAX_TRAILER_BYTES - self._trailers if self._state == "trailers" else 0
            if len(self._line) > max(limit, MAX_CHUNK_LINE):
                raise BodyError("malformed chunked body")
            if end >= 0:
                line, self._line = bytes(self._line), bytearray()
                if not line.endswith(b"\r\n"):
                    raise BodyError("malformed chunked body")
                self._take_line(line[:-2])
        if self.done:
            self.rest = data[i:]
        return bytes(out)

    def _take_line(self, line: bytes) -> None:
        if self._state == "data-end":
            if line:
                raise BodyError("malformed chunked body")
            self._state = "size"
        elif self._state == "size":
            size = line.split(b";", 1)[0].strip()
            if not size or len(size) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size):
                raise BodyError("malformed chunked body")
            self._left = int(size, 16)
            self._state = "data" if self._left else "trailers"
        else:  # trailers: read, counted and dropped, up to the empty line
            self._trailers += len(line) + 2
            if self._trailers > MAX_TRAILER_BYTES:
                raise BodyError("malformed chunked body")
            if not line:
                self.done = True


# --------------------------------------------------------------------------- Host, Origin


def bracketed(host: str) -> str:
    """An IPv6 literal in URL/Host form (``[::1]``); anything else unchanged."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def host_key(value: str, *, default_port: int) -> str | None:
    """Normalize a ``Host`` value to ``name:port``; None if it is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    else:
        name, sep, port_text = value.partition(":")
        if ":" in port_text or (sep and not port_text):
            return None
    if not name or any(c.isspace() or c in "/@\\" for c in name):
        return None
    if not port_text:
        return f"{name}:{default_port}"
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return f"{name}:{int(port_text)}"


@attrs.frozen
class Hosts:
    """
    The ``Host`` values a listener answers to; any other is a DNS-rebinding attempt or a
    mistake.

    Attributes:
        names: accepted values, normalized ``name:port``.
        any_ip_port: accept any IP-literal ``Host`` with this port (a wildcard bind: the
            daemon cannot know all its addresses, and an IP literal cannot be rebound).
        default_port: the port a ``Host`` without one means (80, or 443 with TLS).
    """

    names: frozenset[str]
    any_ip_port: int | None = None
    default_port: int = 80

    @classmethod
    def loopback(cls, ports: AbstractSet[int], *extra: str) -> Hosts:
        """The loopback names (and ``extra`` names) with each of ``ports``."""
        names = [*LOOPBACK_NAMES, *extra]
        return cls(frozenset(f"{name.lower()}:{port}" for port in ports for name in names))

    def allows(self, value: str) -> bool:
        key = host_key(value, default_port=self.default_port)
        if key is None:
            return False
        if key in self.names:
            return True
        if self.any_ip_port is None:
            return False
        name, _, port = key.rpartition(":")
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return False
        return int(port) == self.any_ip_port


def origin_key(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


@attrs.frozen
class OriginRule:
    """
    Which ``Origin`` a request may carry (browsers send one; other clients, mostly none).

    Without one, a request passes unless its method is in ``required_for``; with one, it must
    be a single value, in ``allowed`` or (with ``own_scheme``) the listener's own origin,
    ``own_scheme://Host``. An empty ``allowed`` without ``own_scheme``: no web page at all.

    Attributes:
        refusal: the answer to any other (403).
    """

    allowed: frozenset[str]
    refusal: Response
    own_scheme: str | None = None
    required_for: frozenset[str] = frozenset()

    def check(self, head: RequestHead) -> Response | None:
        origins = head.values("origin")
        if not origins and head.method not in self.required_for:
            return None
        if len(origins) != 1:
            return self.refusal
        key = origin_key(origins[0])
        if key in self.allowed:
            return None
        hosts = head.values("host")
        own = f"{self.own_scheme}://{hosts[0].strip().lower()}" if len(hosts) == 1 else None
        return None if self.own_scheme is not None and key == own else self.refusal


# --------------------------------------------------------------------------- credentials


class Credential(Protocol):
    """Who a request is: a principal the handler may use, or the refusal (401, 403)."""

    def authenticate(self, head: RequestHead, *, now: float) -> object:
        """The principal, or a :class:`Response` refusing the request. Pure."""
        ...


def presented_bearer(head: RequestHead, *, query: bool) -> str | None:
    """
    The bearer token of ``Authorization: Bearer TOKEN`` (exactly one such header, the scheme
    in any case), else (``query``) of a single ``token`` query parameter; None otherwise.
    """
    auth = head.values("authorization")
    if len(auth) > 1:
        return None
    if auth:
        scheme, _, credentials = auth[0].strip().partition(" ")
        return credentials.strip() if scheme.lower() == "bearer" and credentials else None
    if not query:
        return None
    values = urllib.parse.parse_qs(head.query, keep_blank_values=True).get("token", [])
    return values[0] if len(values) == 1 else None


BEARER_CHALLENGE: Final = (("WWW-Authenticate", 'Bearer realm="acp-bridge"'),)
BAD_TOKEN_CHALLENGE: Final = (
    ("WWW-Authenticate", 'Bearer realm="acp-bridge", error="invalid_token"'),
)
_NO_TOKEN: Final = plain(401, "unauthorized: a bearer token is required", BEARER_CHALLENGE)
_WRONG_TOKEN: Final = plain(401, "unauthorized: wrong token", BAD_TOKEN_CHALLENGE)


@attrs.frozen
class BearerToken:
    """One token, in ``Authorization: Bearer`` or ``?token=``, compared in constant time;
    the principal is True."""

    token: bytes = attrs.field(repr=False)
    missing: Response = _NO_TOKEN
    wrong: Response = _WRONG_TOKEN

    def authenticate(self, head: RequestHead, *, now: float) -> Response | bool:
        given = presented_bearer(head, query=True)
        if given is None:
            return self.missing
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token):
            return self.wrong
        return True


# --------------------------------------------------------------------------- routes


@attrs.frozen
class Route(Generic[H]):
    """
    One path of a site.

    Attributes:
        methods: each method served, and its handler (the ``Allow`` list, in this order).
        check: the request's own form, checked before ``Origin`` and credential (a WebSocket
            upgrade's headers); its refusal, or None.
        origin: the ``Origin`` rule; None: any (or none).
        credential: who may call; None: anyone.
        wrong_method: the 405's text.
    """

    methods: Mapping[str, H]
    check: Callable[[RequestHead], Response | None] | None = None
    origin: OriginRule | None = None
    credential: Credential | None = None
    wrong_method: str = "method not allowed"


@attrs.frozen
class Admitted(Generic[H]):
    """A request that passed every check: its handler, and what its credential proved."""

    handler: H
    principal: object = None


@attrs.frozen
class Site(Generic[H]):
    """
    A listener's rules: see the module's docstring for the order of the checks.

    Attributes:
        hosts: the accepted ``Host`` values (a connection may be judged against others:
            :meth:`judge`'s ``hosts``).
        routes: by path (no query).
        origin: the ``Origin`` rule of every path, checked right after ``Host``.
    """

    hosts: Hosts
    routes: Mapping[str, Route[H]]
    origin: OriginRule | None = None

    def judge(
        self, head: RequestHead, *, now: float, hosts: Hosts | None = None
    ) -> Response | Admitted[H]:
        """What to do with a request head, before any of its body is read. Pure."""
        host = head.values("host")
        if len(host) != 1 or not (hosts or self.hosts).allows(host[0]):
            return plain(403, "forbidden: unknown Host")
        if self.origin is not None and (refusal := self.origin.check(head)) is not None:
            return refusal
        if not head.target.startswith("/"):
            return plain(400, "bad request target")
        route = self.routes.get(head.path)
        if route is None:
            return plain(404, "not found")
        handler = route.methods.get(head.method)
        if handler is None:
            return plain(405, route.wrong_method, (("Allow", ", ".join(route.methods)),))
        for check in (route.check, route.origin.check if route.origin else None):
            if check is not None and (refusal := check(head)) is not None:
                return refusal
        if route.credential is None:
            return Admitted(handler)
        principal = route.credential.authenticate(head, now=now)
        if isinstance(principal, Response):
            return principal
        return Admitted(handler, principal)
