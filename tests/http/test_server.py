"""The HTTP layer's trio half: connections served over memory streams, timers on the autojump
clock (a test that would hang fails at its ``fail_after`` instead)."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from acp_bridge.http.server import EventStream, Exchange, HttpServer, Limits
from acp_bridge.http.wire import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    BearerToken,
    Hosts,
    OriginRule,
    Response,
    Route,
    Site,
    plain,
)

PORT = 8765
MAX_BODY = 1000
TOKEN = "secret"
BOUND = 100  # virtual seconds: past every deadline here


async def echo(exchange: Exchange) -> Response:
    body = await exchange.body(MAX_BODY)
    if isinstance(body, Response):
        return body
    return Response(200, body, content_type="application/octet-stream")


async def kept(exchange: Exchange) -> Response:
    return Response(200, b"kept", content_type="text/plain", close=False)


async def kept_echo(exchange: Exchange) -> Response:
    body = await exchange.body(MAX_BODY)
    if isinstance(body, Response):
        return body
    return Response(200, body, content_type="text/plain", close=False)


async def take(exchange: Exchange) -> None:
    stream, rest = exchange.take()
    await stream.send_all(b"taken:" + rest)


async def events(exchange: Exchange) -> None:
    head = Response(200, b"retry: 1\n\n", content_type="text/event-stream")
    stream = await exchange.stream(head, send_timeout=5)
    assert stream is not None
    for i in range(3):
        assert await stream.send(b"data: %d\n\n" % i)


def site() -> Site:
    listed = OriginRule(
        frozenset({"http://ok.example"}), plain(403, "forbidden: Origin not allowed")
    )
    return Site(
        Hosts.loopback({PORT}),
        {
            "/echo": Route({"POST": echo}, origin=listed, credential=BearerToken(TOKEN.encode())),
            "/open": Route({"POST": echo}),
            "/kept": Route({"GET": kept, "POST": kept_echo}),
            "/take": Route({"GET": take}),
            "/events": Route({"GET": events}),
        },
    )


def server(**limits: object) -> HttpServer:
    return HttpServer(site(), Limits(**limits))  # type: ignore[arg-type]


def connect(http: HttpServer, nursery: trio.Nursery) -> trio.abc.Stream:
    client, served = trio.testing.memory_stream_pair()
    nursery.start_soon(http.handle_connection, served)
    return client


def connect_watched(http: HttpServer, nursery: trio.Nursery) -> tuple[trio.abc.Stream, trio.Event]:
    """A connection, and an event set once the server is done with it."""
    client, served = trio.testing.memory_stream_pair()
    done = trio.Event()

    async def serve() -> None:
        await http.handle_connection(served)
        done.set()

    nursery.start_soon(serve)
    return client, done


def request(
    method: str, target: str, *headers: str, body: bytes | None = None, host: str | None = None
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host or f'127.0.0.1:{PORT}'}", *headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


async def read_reply(stream: trio.abc.Stream, *, to_eof: bool = True) -> Reply | None:
    """A response: its head, then its body (by its length, or to EOF). None at EOF first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            assert not data, data
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    if not to_eof:
        length = int(headers["content-length"])
        while len(body) < length:
            body += await stream.receive_some(65536)
        assert len(body) == length  # (nothing more: the next response is asked for first)
    else:
        while chunk := await stream.receive_some(65536):
            body += chunk
    return Reply(int(status_line.split(" ")[1]), headers, body)


async def exchange(http: HttpServer, nursery: trio.Nursery, data: bytes) -> Reply:
    stream = connect(http, nursery)
    await stream.send_all(data)
    reply = await read_reply(stream)
    assert reply is not None
    return reply


AUTH = f"Authorization: Bearer {TOKEN}"


# -- routing and access --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "status", "why"),
    [
        pytest.param(request("GET", "/nope"), 404, b"not found\n", id="unknown-path"),
        pytest.param(request("GET", "/echo", AUTH), 405, b"method not allowed\n", id="method"),
        pytest.param(
            request("POST", "/echo", AUTH, body=b"", host="evil.example"),
            403,
            b"forbidden: unknown Host\n",
            id="host",
        ),
        pytest.param(
            request("POST", "/echo", AUTH, f"Host: 127.0.0.1:{PORT}", body=b""),
            400,
            b"bad request\n",
            id="two-hosts-malformed",
        ),
        pytest.param(
            request("POST", "/echo", "Origin: http://evil.example", body=b""),
            403,
            b"forbidden: Origin not allowed\n",
            id="origin-before-token",
        ),
        pytest.param(
            request("POST", "/echo", body=b""),
            401,
            b"unauthorized: a bearer token is required\n",
            id="no-token",
        ),
        pytest.param(
            request("POST", "/echo", "Authorization: Bearer nope", body=b""),
            401,
            b"unauthorized: wrong token\n",
            id="wrong-token",
        ),
    ],
)
async def test_refusals_come_before_the_handler(data, status, why, nursery, autojump_clock):
    with trio.fail_after(BOUND):
        http = server()
        reply = await exchange(http, nursery, data)
        assert (reply.status, reply.body) == (status, why)
        assert reply.headers["connection"] == "close"
        assert http.statistics().refused == 1
    if status == 405:
        assert reply.headers["allow"] == "POST"
    if status == 401:
        assert reply.headers["www-authenticate"].startswith("Bearer")


async def test_a_request_that_passes_is_answered_by_its_handler(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        reply = await exchange(
            server(),
            nursery,
            request("POST", "/echo", AUTH, "Origin: http://ok.example", body=b"hello"),
        )
    assert (reply.status, reply.body) == (200, b"hello")
    assert reply.headers["content-length"] == "5"


# -- the request head ----------------------------------------------------------------------------


def head_of_size(size: int) -> bytes:
    bare = request("POST", "/open", "X-Pad: ", body=b"")
    return request("POST", "/open", "X-Pad: " + "p" * (size - len(bare)), body=b"")


@pytest.mark.parametrize(("size", "status"), [(MAX_HEAD_BYTES, 200), (MAX_HEAD_BYTES + 1, 431)])
async def test_the_head_cap_is_exact_even_when_the_head_arrives_at_once(
    size, status, nursery, autojump_clock
):
    with trio.fail_after(BOUND):
        data = head_of_size(size)
        assert len(data) == size
        reply = await exchange(server(), nursery, data)
    assert reply.status == status


@pytest.mark.parametrize(("count", "status"), [(MAX_HEADERS, 200), (MAX_HEADERS + 1, 431)])
async def test_header_fields_are_counted(count, status, nursery, autojump_clock):
    extra = [f"X-{i}: 1" for i in range(count - 2)]  # (with Host and Content-Length)
    with trio.fail_after(BOUND):
        reply = await exchange(server(), nursery, request("POST", "/open", *extra, body=b""))
    assert reply.status == status


async def test_garbage_is_400_and_eof_before_a_head_is_no_answer(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        http = server()
        assert (await exchange(http, nursery, b"\x16\x03\x01 nope\r\n\r\n")).status == 400
        stream = connect(http, nursery)
        await stream.send_all(b"GET /open HT")
        await stream.send_eof()  # type: ignore[attr-defined]
        assert await read_reply(stream) is None


async def test_a_trickled_head_is_closed_unanswered_at_head_timeout(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        http = server(head_timeout=10)
        stream = connect(http, nursery)
        start = trio.current_time()
        for _ in range(5):
            await stream.send_all(b"X")
            await trio.sleep(1)
        await trio.testing.wait_all_tasks_blocked()
        assert http.statistics().pending == 1
        assert await read_reply(stream) is None
        assert trio.current_time() == start + 10
        assert http.statistics() == attrs.evolve(http.statistics(), connections=0, pending=0)


# -- bodies --------------------------------------------------------------------------------------


def chunked_request(body: bytes, *, pieces: int = 3) -> bytes:
    size = max(1, len(body) // pieces)
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    encoded = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks)
    head = request("POST", "/open", "Transfer-Encoding: chunked")
    return head + encoded + b"0\r\nX-Trailer: t\r\n\r\n"


async def test_a_chunked_body_is_read_in_pieces(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        data = chunked_request(b"0123456789" * 50)
        stream = connect(server(), nursery)
        for i in range(0, len(data), 13):  # (13 bytes a write: every piece boundary)
            await stream.send_all(data[i : i + 13])
            await trio.testing.wait_all_tasks_blocked()
        reply = await read_reply(stream)
    assert reply is not None
    assert (reply.status, reply.body) == (200, b"0123456789" * 50)


@pytest.mark.parametrize(
    ("tail", "status", "why"),
    [
        pytest.param(b"zz\r\nhello\r\n0\r\n\r\n", 400, b"bad request: malformed", id="not-hex"),
        pytest.param(b"5\r\nhelloXX0\r\n\r\n", 400, b"bad request: malformed", id="overrun"),
        pytest.param(b"5\r\nhel", 400, b"request body cut short", id="cut-short"),
    ],
)
async def test_a_malformed_chunked_body_is_400(tail, status, why, nursery, autojump_clock):
    with trio.fail_after(BOUND):
        stream = connect(server(), nursery)
        await stream.send_all(request("POST", "/open", "Transfer-Encoding: chunked") + tail)
        await stream.send_eof()  # type: ignore[attr-defined]
        reply = await read_reply(stream)
    assert reply is not None
    assert reply.status == status
    assert reply.body.startswith(why)


async def test_a_chunked_body_over_the_cap_is_413_as_soon_as_it_is(nursery, autojump_clock):
    """Chunks keep coming: the reader stops at the cap, answers 413 and drains no further than
    the linger allows."""
    with trio.fail_after(BOUND):
        stream = connect(server(linger_bytes=4096), nursery)
        await stream.send_all(request("POST", "/open", "Transfer-Encoding: chunked"))
        piece = b"%x\r\n%s\r\n" % (400, b"x" * 400)

        async def feed() -> None:
            with pytest.raises(trio.BrokenResourceError):  # (the server closes at last)  # noqa: PT012
                while True:
                    await stream.send_all(piece)

        async with trio.open_nursery() as inner:
            inner.start_soon(feed)
            reply = await read_reply(stream)
            assert reply is not None
            assert (reply.status, reply.body) == (413, b"request body over 1000 bytes\n")


async def test_a_length_over_the_cap_is_413_before_a_byte_is_read(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        http = server()
        stream = connect(http, nursery)
        start = trio.current_time()
        await stream.send_all(request("POST", "/open", f"Content-Length: {MAX_BODY + 1}"))
        reply = await read_reply(stream)  # (the body never comes: the answer does not wait)
        assert reply is not None
        assert (reply.status, reply.body) == (413, b"request body over 1000 bytes\n")
        assert trio.current_time() == start


async def test_a_slow_body_is_408_at_body_timeout(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        stream = connect(server(body_timeout=30), nursery)
        await stream.send_all(request("POST", "/open", "Content-Length: 10") + b"12345")
        start = trio.current_time()
        reply = await read_reply(stream)
        assert reply is not None
        assert (reply.status, reply.body) == (408, b"request body too slow\n")
        assert trio.current_time() == start + 30


async def test_a_client_that_expects_100_continue_gets_it_before_sending(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        stream = connect(server(), nursery)
        await stream.send_all(request("POST", "/open", "Expect: 100-continue", "Content-Length: 2"))
        assert await stream.receive_some(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        await stream.send_all(b"ok")
        reply = await read_reply(stream)
    assert reply is not None
    assert (reply.status, reply.body) == (200, b"ok")


# -- one connection, several requests; taken; streamed ------------------------------------------


async def test_a_kept_connection_serves_the_next_request(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        stream = connect(server(), nursery)
        await stream.send_all(request("GET", "/kept"))
        first = await read_reply(stream, to_eof=False)
        assert first is not None
        assert "connection" not in first.headers
        # (the next one pipelined with a body: read, and what follows it kept for after)
        await stream.send_all(request("POST", "/kept", body=b"two") + request("GET", "/kept"))
        second = await read_reply(stream, to_eof=False)
        third = await read_reply(stream, to_eof=False)
        await stream.send_all(request("POST", "/open", body=b"last"))
        last = await read_reply(stream)
    assert (first.body, second.body, third.body) == (b"kept", b"two", b"kept")  # type: ignore[union-attr]
    assert last is not None
    assert (last.status, last.body, last.headers["connection"]) == (200, b"last", "close")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(request("GET", "/kept", "Connection: close"), id="client-closes"),
        pytest.param(request("GET", "/kept").replace(b"HTTP/1.1", b"HTTP/1.0"), id="http-1.0"),
        pytest.param(request("GET", "/kept", body=b"unread"), id="body-unread"),
    ],
)
async def test_a_kept_response_closes_when_the_request_says_so(data, nursery, autojump_clock):
    with trio.fail_after(BOUND):
        reply = await exchange(server(), nursery, data)
    assert (reply.status, reply.headers["connection"]) == (200, "close")


async def test_a_kept_connection_waits_head_timeout_for_the_next_head(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        stream = connect(server(head_timeout=7), nursery)
        await stream.send_all(request("GET", "/kept"))
        assert await read_reply(stream, to_eof=False) is not None
        start = trio.current_time()
        assert await read_reply(stream) is None
        assert trio.current_time() == start + 7


async def test_a_handler_takes_the_connection_with_what_came_after_the_head(
    nursery, autojump_clock
):
    with trio.fail_after(BOUND):
        stream = connect(server(), nursery)
        await stream.send_all(request("GET", "/take") + b"first frames")
        data = b""
        while chunk := await stream.receive_some(100):
            data += chunk
    assert data == b"taken:first frames"


async def test_a_streamed_response_goes_out_over_time_without_a_length(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        reply = await exchange(server(), nursery, request("GET", "/events"))
    assert reply.status == 200
    assert "content-length" not in reply.headers
    assert reply.body == b"retry: 1\n\ndata: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_an_event_stream_whose_peer_takes_nothing_is_stalled(autojump_clock):
    a, b = trio.testing.lockstep_stream_pair()
    events = EventStream(a, 5)
    start = trio.current_time()
    assert not await events.send(b"data: x\n\n")
    assert events.stalled
    assert trio.current_time() == start + 5
    assert not await events.send(b"more")  # (no second wait)
    assert trio.current_time() == start + 5
    await b.aclose()


async def test_a_peer_that_goes_away_mid_body_ends_the_connection_quietly(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        http = server()
        stream = connect(http, nursery)
        await stream.send_all(request("POST", "/open", "Content-Length: 10") + b"123")
        await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert http.statistics().connections == 0


# -- places, caps, linger ------------------------------------------------------------------------


async def test_connections_past_the_cap_are_answered_busy(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        http = server(max_connections=1, busy=plain(503, "busy"))
        held = connect(http, nursery)
        await held.send_all(b"GET /open")
        await trio.testing.wait_all_tasks_blocked()
        reply = await exchange(http, nursery, request("POST", "/open", body=b""))
        assert (reply.status, reply.body) == (503, b"busy\n")
        assert http.statistics().connections == 1


async def test_pending_heads_give_their_place_to_a_newcomer_once_old(nursery, autojump_clock):
    """max_pending heads under way: a newcomer is busy while they are young; once the oldest
    is evict_age old, it is closed unanswered and the newcomer served in its place."""
    with trio.fail_after(BOUND):
        http = server(max_pending=2, evict_age=1.0, head_timeout=10)
        start = trio.current_time()
        first = connect(http, nursery)
        await first.send_all(b"GET /open HTTP/1.1\r\n")
        await trio.sleep(0.5)
        second = connect(http, nursery)
        await second.send_all(b"GET /open HTTP/1.1\r\n")
        await trio.testing.wait_all_tasks_blocked()
        busy = await exchange(http, nursery, request("POST", "/open", body=b""))
        assert (busy.status, busy.headers["retry-after"]) == (503, "5")
        await trio.sleep_until(start + 1.0)
        served = await exchange(http, nursery, request("POST", "/open", body=b"me"))
        assert (served.status, served.body) == (200, b"me")
        assert await read_reply(first) is None
        assert trio.current_time() == start + 1.0
        assert http.statistics().pending == 1  # the second, still waiting


async def test_the_linger_drains_the_rest_of_the_request_until_the_peer_closes(
    nursery, autojump_clock
):
    """A refusal before the body: the response, our end of the stream, then what the peer
    still sends is read and dropped until it closes (no reset can destroy the response)."""
    with trio.fail_after(BOUND):
        http = server()
        stream = connect(http, nursery)
        await stream.send_all(request("POST", "/echo", "Content-Length: 300"))
        reply = await read_reply(stream)  # (the server ended its side: EOF after the answer)
        assert reply is not None
        assert reply.status == 401
        start = trio.current_time()
        await stream.send_all(b"x" * 300)  # the body the server never wanted: drained
        await stream.send_eof()  # type: ignore[attr-defined]
        await trio.testing.wait_all_tasks_blocked()
        assert http.statistics().connections == 0
        assert trio.current_time() == start


async def test_the_linger_is_bounded_in_time_and_in_bytes(nursery, autojump_clock):
    with trio.fail_after(BOUND):
        http = server(linger_seconds=3, linger_bytes=65536)
        quiet, done = connect_watched(http, nursery)
        await quiet.send_all(request("GET", "/nope"))
        start = trio.current_time()
        assert (await read_reply(quiet)).status == 404  # type: ignore[union-attr]
        await done.wait()  # (the peer neither sends nor closes: the linger runs out)
        assert trio.current_time() == start + 3
        flood = connect(http, nursery)
        await flood.send_all(request("GET", "/nope") + b"x" * (3 * 65536))
        start = trio.current_time()
        assert (await read_reply(flood)).status == 404  # type: ignore[union-attr]
        await trio.testing.wait_all_tasks_blocked()
        assert http.statistics().connections == 0  # (stopped after linger_bytes, at once)
        assert trio.current_time() == start
        with pytest.raises(trio.BrokenResourceError):
            await flood.send_all(b"more")
