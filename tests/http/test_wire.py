"""The HTTP layer's pure half: responses, body framing, chunked decoding, and a site's verdicts.

Plain synchronous tests; ``test_server.py`` sends requests through the trio half.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from acp_bridge.http.wire import (
    MAX_CHUNK_LINE,
    MAX_TRAILER_BYTES,
    Admitted,
    BearerToken,
    BodyError,
    Chunked,
    ChunkedDecoder,
    Hosts,
    Length,
    OriginRule,
    RequestHead,
    Response,
    Route,
    Site,
    body_framing,
    has_body,
    head_refusal,
    plain,
    presented_bearer,
)

PORT = 8765
HOST = ("host", f"127.0.0.1:{PORT}")


def head(method: str = "GET", target: str = "/", *headers: tuple[str, str], version: str = "1.1"):
    return RequestHead(method, target, version, (HOST, *headers))


# -- responses -----------------------------------------------------------------------------------


def test_a_response_is_whole_and_closes_by_default():
    """Status line, type, length, no caching, Connection: close, the extra headers, the body."""
    response = Response(401, b"no\n", (("WWW-Authenticate", "Bearer"),), "text/plain")
    assert response.render() == (
        b"HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
        b"Cache-Control: no-store\r\nConnection: close\r\nWWW-Authenticate: Bearer\r\n\r\nno\n"
    )


def test_a_kept_response_says_nothing_of_closing_and_an_empty_one_has_no_type():
    assert Response(202, close=False).render() == (
        b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nCache-Control: no-store\r\n\r\n"
    )


def test_a_streamed_response_has_no_length_always_closes_and_starts_its_body():
    response = Response(200, b"retry: 1000\n\n", content_type="text/event-stream", close=False)
    assert response.render_streamed() == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
        b"Connection: close\r\n\r\nretry: 1000\n\n"
    )


def test_plain_answers_and_what_the_log_reads_of_them():
    answer = plain(403, "forbidden: unknown Host")
    assert (answer.body, answer.content_type) == (
        b"forbidden: unknown Host\n",
        "text/plain; charset=utf-8",
    )
    assert answer.why == "forbidden: unknown Host"
    assert Response(200, b'{"a":1}', content_type="application/json").why == ""
    assert head_refusal(431) == plain(431, "request head too large")
    assert head_refusal(501) == plain(501, "bad request")
    assert head_refusal(0).status == 400


# -- body framing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param((), Length(0), id="none"),
        pytest.param((("content-length", "12"),), Length(12), id="length"),
        pytest.param((("content-length", "100"),), Length(100), id="length-at-the-cap"),
        pytest.param((("transfer-encoding", "chunked"),), Chunked(), id="chunked"),
        pytest.param((("transfer-encoding", "Chunked"),), Chunked(), id="chunked-any-case"),
        pytest.param((("content-length", "101"),), 413, id="length-over-the-cap"),
        pytest.param((("content-length", "-1"),), 400, id="negative"),
        pytest.param((("content-length", "1e3"),), 400, id="not-digits"),
        pytest.param((("content-length", "\uff11\uff12"),), 400, id="not-ascii"),
        pytest.param((("content-length", "1"), ("content-length", "2")), 400, id="two-lengths"),
        pytest.param((("transfer-encoding", "gzip, chunked"),), 400, id="another-coding"),
        pytest.param(
            (("transfer-encoding", "chunked"), ("content-length", "3")), 400, id="smuggling"
        ),
    ],
)
def test_body_framing(headers, expected):
    got = body_framing(head("POST", "/", *headers), max_bytes=100)
    if isinstance(expected, int):
        assert isinstance(got, Response)
        assert got.status == expected
    else:
        assert got == expected


def test_a_body_may_be_required_and_the_cap_says_its_size():
    assert body_framing(head("POST"), max_bytes=10, length_required=True).status == 411  # type: ignore[union-attr]
    assert body_framing(head("POST", "/", ("content-length", "11")), max_bytes=10) == plain(
        413, "request body over 10 bytes"
    )
    assert not has_body(head("POST", "/", ("content-length", "0")))
    assert has_body(head("POST", "/", ("content-length", "1")))
    assert has_body(head("POST", "/", ("transfer-encoding", "chunked")))


def test_keep_alive_follows_the_version_and_the_connection_header():
    assert head().keep_alive
    assert not head("GET", "/", ("connection", "close")).keep_alive
    assert not head(version="1.0").keep_alive
    assert head("GET", "/", ("connection", "Keep-Alive"), version="1.0").keep_alive


# -- chunked bodies ------------------------------------------------------------------------------


def chunked(*parts: bytes, trailers: bytes = b"") -> bytes:
    return (
        b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n" + trailers + b"\r\n"
    )


def decode(data: bytes, *, step: int | None = None) -> tuple[bytes, bytes]:
    """The body, and what followed it (the rest of the piece that ended it, and the pieces
    after it)."""
    decoder = ChunkedDecoder()
    out = b""
    pieces = [data] if step is None else [data[i : i + step] for i in range(0, len(data), step)]
    for i, piece in enumerate(pieces):
        out += decoder.feed(piece)
        if decoder.done:
            return out, decoder.rest + b"".join(pieces[i + 1 :])
    raise AssertionError("the body did not end")


def test_a_chunked_body_is_decoded_whole_or_byte_by_byte_and_what_follows_is_kept():
    data = chunked(b"hello ", b"chunked ", b"world") + b"GET / HTTP/1.1\r\n"
    assert decode(data) == (b"hello chunked world", b"GET / HTTP/1.1\r\n")
    assert decode(data, step=1) == (b"hello chunked world", b"GET / HTTP/1.1\r\n")


def test_chunk_extensions_and_trailers_are_read_and_dropped():
    data = b"5;name=value\r\nhello\r\nA ; x\r\n0123456789\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n"
    assert decode(data) == (b"hello0123456789", b"")
    assert decode(chunked()) == (b"", b"")  # (an empty body)


@given(
    st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    st.integers(min_value=1, max_value=64),
)
def test_any_body_in_any_pieces_decodes_to_itself(parts, step):
    body, rest = decode(chunked(*parts) + b"next", step=step)
    assert body == b"".join(parts)
    assert rest == b"next"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"zz\r\nhello\r\n0\r\n\r\n", id="not-hex"),
        pytest.param(b"\r\nhello\r\n0\r\n\r\n", id="no-size"),
        pytest.param(b"-5\r\nhello\r\n0\r\n\r\n", id="negative"),
        pytest.param(b"0x5\r\nhello\r\n0\r\n\r\n", id="prefixed"),
        pytest.param(b"5\nhello\r\n0\r\n\r\n", id="bare-newline"),
        pytest.param(b"5\r\nhelloXX0\r\n\r\n", id="data-longer-than-its-size"),
        pytest.param(b"1" * 17 + b"\r\n", id="size-over-64-bits"),
        pytest.param(b"5;" + b"x" * MAX_CHUNK_LINE + b"\r\n", id="size-line-too-long"),
        pytest.param(b"5;" + b"x" * (MAX_CHUNK_LINE + 10), id="size-line-without-end"),
        pytest.param(
            b"0\r\n" + b"X: y\r\n" * (MAX_TRAILER_BYTES // 6 + 1) + b"\r\n", id="trailers-too-big"
        ),
    ],
)
def test_a_malformed_chunked_body_is_refused(data):
    for step in (len(data), 7):  # (whole, and in pieces: a bound holds across feeds too)
        decoder = ChunkedDecoder()
        with pytest.raises(BodyError, match="malformed chunked body"):  # noqa: PT012
            for i in range(0, len(data), step):
                decoder.feed(data[i : i + step])


# -- Host, Origin, credentials -------------------------------------------------------------------


def test_hosts_normalize_ports_and_names():
    hosts = Hosts.loopback({PORT})
    assert hosts.allows(f"LOCALHOST:{PORT}")
    assert hosts.allows(f"[::1]:{PORT}")
    for bad in ("localhost", f"localhost.:{PORT}", f"x@localhost:{PORT}", f"127.0.0.2:{PORT}", ""):
        assert not hosts.allows(bad), bad
    wildcard = Hosts(frozenset(), any_ip_port=PORT)
    assert wildcard.allows(f"192.0.2.1:{PORT}")
    assert not wildcard.allows(f"192.0.2.1:{PORT + 1}")
    assert not wildcard.allows(f"example.org:{PORT}")


def test_an_origin_rule_takes_listed_or_own_origins_and_may_require_one():
    rule = OriginRule(
        frozenset({"https://tool.example"}),
        plain(403, "forbidden: Origin not allowed"),
        own_scheme="http",
        required_for=frozenset({"POST"}),
    )
    assert rule.check(head()) is None
    assert rule.check(head("GET", "/", ("origin", "https://TOOL.example/"))) is None
    assert rule.check(head("GET", "/", ("origin", f"http://127.0.0.1:{PORT}"))) is None
    for bad in (
        head("POST"),  # required here
        head("GET", "/", ("origin", "null")),
        head("GET", "/", ("origin", f"https://127.0.0.1:{PORT}")),  # another scheme: not own
        head("GET", "/", ("origin", "https://tool.example"), ("origin", "https://tool.example")),
    ):
        assert rule.check(bad) == plain(403, "forbidden: Origin not allowed")
    no_browser = OriginRule(frozenset(), plain(403, "no"))
    assert no_browser.check(head("GET", "/", ("origin", f"http://127.0.0.1:{PORT}"))) is not None


def test_the_bearer_token_is_read_from_the_header_or_the_query():
    assert presented_bearer(head("GET", "/", ("authorization", "Bearer  t ")), query=False) == "t"
    assert presented_bearer(head("GET", "/?token=t"), query=True) == "t"
    assert presented_bearer(head("GET", "/?token=t"), query=False) is None
    assert presented_bearer(head("GET", "/?token=a&token=b"), query=True) is None
    two = head("GET", "/", ("authorization", "Bearer t"), ("authorization", "Bearer t"))
    assert presented_bearer(two, query=True) is None
    assert presented_bearer(head("GET", "/", ("authorization", "Basic t")), query=True) is None
    bearer = BearerToken(b"t")
    assert bearer.authenticate(head("GET", "/?token=t"), now=0) is True
    assert bearer.authenticate(head("GET", "/?token=u"), now=0).status == 401  # type: ignore[union-attr]
    assert bearer.authenticate(head(), now=0).status == 401  # type: ignore[union-attr]


# -- a site's verdicts ---------------------------------------------------------------------------


def upgrade_form(head: RequestHead) -> Response | None:
    return None if head.values("upgrade") else plain(426, "upgrade required")


SITE: Site[str] = Site(
    Hosts.loopback({PORT}),
    {
        "/open": Route({"GET": "open"}),
        "/rpc": Route(
            {"POST": "post", "DELETE": "delete"},
            check=upgrade_form,
            origin=OriginRule(frozenset(), plain(403, "forbidden: Origin not allowed")),
            credential=BearerToken(b"t"),
        ),
    },
)
AUTH = ("authorization", "Bearer t")
UP = ("upgrade", "x")


@pytest.mark.parametrize(
    ("request_head", "verdict"),
    [
        pytest.param(head("GET", "/open"), Admitted("open"), id="open"),
        pytest.param(head("POST", "/rpc?x=1", UP, AUTH), Admitted("post", True), id="post"),
        pytest.param(head("DELETE", "/rpc", UP, AUTH), Admitted("delete", True), id="delete"),
        pytest.param(RequestHead("GET", "/open", "1.1", ()), 403, id="no-host"),
        pytest.param(RequestHead("GET", "/open", "1.1", (HOST, HOST)), 403, id="two-hosts"),
        pytest.param(
            RequestHead("GET", "/nope", "1.1", (("host", "evil.example"),)), 403, id="host-first"
        ),
        pytest.param(head("GET", "*"), 400, id="not-a-path"),
        pytest.param(head("GET", "/nope", UP, AUTH), 404, id="unknown-path"),
        pytest.param(head("GET", "/rpc", ("origin", "x")), 405, id="method-before-the-rest"),
        pytest.param(head("POST", "/rpc", ("origin", "x")), 426, id="check-before-origin"),
        pytest.param(head("POST", "/rpc", UP, ("origin", "x")), 403, id="origin-before-token"),
        pytest.param(head("POST", "/rpc", UP), 401, id="token-last"),
    ],
)
def test_a_site_answers_the_first_check_a_request_fails(request_head, verdict):
    got = SITE.judge(request_head, now=0.0)
    if isinstance(verdict, int):
        assert isinstance(got, Response)
        assert got.status == verdict
    else:
        assert got == verdict


def test_405_lists_the_methods_and_a_connection_may_bring_its_own_hosts():
    got = SITE.judge(head("GET", "/rpc"), now=0.0)
    assert got == plain(405, "method not allowed", (("Allow", "POST, DELETE"),))
    other = RequestHead("GET", "/open", "1.1", (("host", "127.0.0.1:9"),))
    assert isinstance(SITE.judge(other, now=0.0), Response)
    assert SITE.judge(other, now=0.0, hosts=Hosts.loopback({9})) == Admitted("open")


def test_a_site_wide_origin_rule_comes_right_after_host():
    site = Site(SITE.hosts, SITE.routes, origin=OriginRule(frozenset(), plain(403, "no web pages")))
    assert site.judge(head("GET", "/nope", ("origin", "x")), now=0.0) == plain(403, "no web pages")
