"""ACP over HTTP, the pure core: what each request may do, where messages go, resumption."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.faces.http_acp_core import (
    Captured,
    Connection,
    Limits,
    Owner,
    Posted,
    StreamAsk,
    Table,
    judge_delete,
    judge_get,
    judge_post,
    parse_event_id,
    render_event_id,
    session_refusal,
)
from acp_bridge.http.wire import RequestHead, Response

JSON = ("content-type", "application/json")
CONN = ("acp-connection-id", "c1")


def head(method: str, *headers: tuple[str, str]) -> RequestHead:
    return RequestHead(method, "/acp", "1.1", headers)


def body(method: str | None = None, *, id: Any = 1, **params: Any) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id}
    if method is not None:
        msg["method"] = method
        msg["params"] = params
    else:
        msg["result"] = params
    return json.dumps(msg).encode()


def status(verdict: object) -> int:
    assert isinstance(verdict, Response), verdict
    return verdict.status


# -- POST, GET, DELETE ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "data", "expected"),
    [
        pytest.param((), body("initialize"), 415, id="no-content-type"),
        pytest.param((("content-type", "text/plain"),), body("initialize"), 415, id="text"),
        pytest.param((JSON,), b"{nope", 400, id="not-json"),
        pytest.param((JSON,), b"[]", 501, id="batch"),
        pytest.param((JSON,), b'"hello"', 400, id="not-an-object"),
        pytest.param((JSON, CONN), body("initialize"), 400, id="initialize-on-a-connection"),
        pytest.param((JSON,), body("initialize", id=None), 400, id="initialize-without-id"),
        pytest.param((JSON,), body("session/new", cwd="/"), 400, id="no-connection-id"),
        pytest.param(
            (JSON, CONN, CONN), body("session/new", cwd="/"), 400, id="two-connection-ids"
        ),
        pytest.param(
            (JSON, CONN), body("session/prompt", sessionId="s1"), 400, id="prompt-without-session"
        ),
        pytest.param(
            (JSON, CONN, ("acp-session-id", "s2")),
            body("session/prompt", sessionId="s1"),
            400,
            id="session-mismatch",
        ),
    ],
)
def test_post_refusals(headers, data, expected):
    assert status(judge_post(head("POST", *headers), data)) == expected


def test_post_accepts_what_both_sdks_send():
    opened = judge_post(
        head("POST", ("content-type", "application/json; charset=utf-8")), body("initialize")
    )
    assert isinstance(opened, Posted)
    assert opened.connection_id is None
    assert opened.method == "initialize"
    # (the Python SDK sends load without Acp-Session-Id; pretty-printed bodies become a line)
    pretty = json.dumps(json.loads(body("session/load", sessionId="s1")), indent=2).encode()
    load = judge_post(head("POST", JSON, CONN), pretty)
    assert isinstance(load, Posted)
    assert (load.connection_id, load.session, load.method) == ("c1", "s1", "session/load")
    assert b"\n" not in load.line.rstrip(b"\n")
    # an answer to the agent's request: the session from the header, if any
    answer = judge_post(head("POST", JSON, CONN, ("acp-session-id", "s1")), body())
    assert isinstance(answer, Posted)
    assert (answer.method, answer.session) == (None, "s1")


def test_a_message_about_another_connections_session_is_409_but_a_takeover():
    def posted(method: str) -> Posted:
        verdict = judge_post(
            head("POST", JSON, CONN, ("acp-session-id", "s1")), body(method, sessionId="s1")
        )
        assert isinstance(verdict, Posted)
        return verdict

    assert status(session_refusal(posted("session/prompt"), Owner.OTHER)) == 409
    for method in ("session/load", "session/resume"):
        assert session_refusal(posted(method), Owner.OTHER) is None
    for owner in (Owner.THIS, Owner.NOBODY):
        assert session_refusal(posted("session/prompt"), owner) is None
    # A watcher's messages reach the bridge: it refuses what only the owner may do (-32002,
    # with the take-over hint) and takes the answers to the permission requests it was shown.
    answer = judge_post(head("POST", JSON, CONN, ("acp-session-id", "s1")), body())
    assert isinstance(answer, Posted)
    for message in (posted("session/prompt"), posted("session/load"), answer):
        assert session_refusal(message, Owner.WATCHING) is None
    assert status(session_refusal(answer, Owner.OTHER)) == 409


def test_get_and_delete():
    events = ("accept", "text/event-stream")
    assert status(judge_get(head("GET", CONN))) == 406
    assert status(judge_get(head("GET", events))) == 400
    assert status(judge_get(head("GET", events, CONN, ("last-event-id", "x")))) == 400
    ask = judge_get(
        head("GET", ("accept", "text/event-stream, */*"), CONN, ("acp-session-id", "s1"))
    )
    assert ask == StreamAsk("c1", "s1", None)
    resumed = judge_get(head("GET", events, CONN, ("last-event-id", "41.2")))
    assert resumed == StreamAsk("c1", None, (41, 2))
    assert status(judge_delete(head("DELETE"))) == 400
    assert judge_delete(head("DELETE", CONN)) == "c1"


def test_the_table_tells_unknown_from_ended():
    table: Table[str] = Table()
    table.add("c1", "live")
    assert table.find("c1") == "live"
    assert status(table.find("c2")) == 404
    table.end("c1", "closed by the client")
    assert status(table.find("c1")) == 410


@pytest.mark.parametrize("text", ["0", "41", "41.2", "7.10"])
def test_event_ids_round_trip(text):
    parsed = parse_event_id(text)
    assert parsed is not None
    assert render_event_id(parsed) == text


@pytest.mark.parametrize("text", ["", "-1", "1.", ".1", "1.2.3", "a", "1" * 41, "\uff11"])
def test_malformed_event_ids(text):
    assert parse_event_id(text) is None


# -- routing ---------------------------------------------------------------------------------------


def update(sid: str, seq: int, text: str = "x") -> bytes:
    params = {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk", "text": text}}
    if seq:
        params["_meta"] = {"acp_bridge": {"seq": seq}}
    return json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}).encode()


def answer(id: Any, **result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id, "result": result}).encode()


def request(client: Connection, method: str, id: Any, sid: str | None = None) -> None:
    params = {"sessionId": sid} if sid is not None else {}
    client.note_request(
        Posted({"id": id, "method": method, "params": params}, b"", "c1", sid, method)
    )


def take_all(
    client: Connection, key: str | None, generation: int
) -> list[tuple[str, dict[str, Any]]]:
    """The events of a stream its reader may take now, as (id, message)."""
    out = []
    while batch := client.take(key, generation, 1 << 20):
        for data in batch:
            lines = data.decode().split("\n")
            assert lines[0].startswith("id: ")
            assert lines[1].startswith("data: ")
            out.append((lines[0][4:], json.loads(lines[1][6:])))
    return out


def connection(**limits: Any) -> Connection:
    return Connection("c1", Limits(**limits), initialize=0)


def test_the_initialize_answer_is_captured_for_the_post():
    client = connection()
    assert client.route(answer(0, protocolVersion=1)) == Captured(answer(0, protocolVersion=1))
    assert client.route(answer(0)) is None  # (a second one is an answer like any)


def test_session_messages_follow_the_session_stream_once_it_is_open():
    client = connection()
    conn = client.attach(None, None)
    assert isinstance(conn, int)
    request(client, "session/new", 1)
    assert client.route(answer(1, sessionId="s1")) is None
    assert client.route(update("s1", 1)) is None  # no stream of its own yet
    session = client.attach("s1", None)
    assert isinstance(session, int)
    request(client, "session/prompt", 2, "s1")
    assert client.route(update("s1", 2)) == "s1"
    assert client.route(answer(2, stopReason="end_turn")) == "s1"
    request(client, "session/load", 3, "s1")
    assert client.route(answer(3)) is None  # the RFD: a load's answer on the connection's
    permission = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "session/request_permission",
        "params": {"sessionId": "s1"},
    }
    assert client.route(json.dumps(permission).encode()) == "s1"
    other = {"jsonrpc": "2.0", "method": "_acp_bridge/log", "params": {"level": "info"}}
    assert client.route(json.dumps(other).encode()) is None
    # (the load's answer waits for what the session's stream had before it)
    assert [i for i, _ in take_all(client, None, conn)] == ["1", "2"]
    assert [i for i, _ in take_all(client, "s1", session)] == ["2", "2.1", "2.2"]
    assert [i for i, _ in take_all(client, None, conn)] == ["3", "4"]


def test_what_a_session_sent_elsewhere_first_is_written_first():
    """A session's messages switch streams in order: the session's stream waits for what it
    had on the connection's, and a load's answer waits for the replay before it."""
    client = connection()
    conn = client.attach(None, None)
    assert isinstance(conn, int)
    client.route(update("s1", 1))
    session = client.attach("s1", None)
    assert isinstance(session, int)
    client.route(update("s1", 2))
    assert not client.ready("s1")
    assert client.take("s1", session, 1 << 20) == []  # update 1 is not written yet
    assert [i for i, _ in take_all(client, None, conn)] == ["1"]
    assert client.ready("s1")
    request(client, "session/load", 5, "s1")
    client.route(update("s1", 3))
    client.route(answer(5))  # the load's answer, for the connection's stream
    assert client.take(None, conn, 1 << 20) == []  # after the replay of the session's stream
    assert [i for i, _ in take_all(client, "s1", session)] == ["2", "3"]
    assert [m["id"] for _, m in take_all(client, None, conn)] == [5]


def test_a_stream_without_a_reader_holds_nobody_back():
    client = connection()
    conn = client.attach(None, None)
    assert isinstance(conn, int)
    session = client.attach("s1", None)
    assert isinstance(session, int)
    client.route(update("s1", 1))
    client.release("s1", session)
    request(client, "session/load", 5, "s1")
    client.route(answer(5))
    assert client.ready(None)  # the session's stream has no reader: it does not hold the answer


def test_updates_numbered_again_keep_ids_increasing():
    """A second load on the same connection replays numbers already used: those events get
    minor ids after the last, never an id twice."""
    client = connection()
    session = client.attach("s1", None)
    assert isinstance(session, int)
    for seq in (1, 2, 3, 1, 2, 3, 4, 0):
        client.route(update("s1", seq))
    ids = [i for i, _ in take_all(client, "s1", session)]
    assert ids == ["1", "2", "3", "3.1", "3.2", "3.3", "4", "4.1"]


def test_a_newer_reader_replaces_the_older():
    client = connection()
    first = client.attach(None, None)
    second = client.attach(None, None)
    assert isinstance(first, int)
    assert isinstance(second, int)
    client.route(update("s1", 1))
    assert client.take(None, first, 1 << 20) is None
    assert client.readers == 1
    client.release(None, first)  # (the old reader leaving changes nothing)
    assert client.readers == 1
    assert len(take_all(client, None, second)) == 1


def test_bounds_streams_and_buffer():
    client = connection(max_streams=3, buffer_bytes=1000)
    assert isinstance(client.attach("s1", None), int)
    assert isinstance(client.attach("s2", None), int)
    assert status(client.attach("s3", None)) == 409
    while not client.full:
        client.route(update("s1", 1))
    assert client.unwritten >= 1000


def test_past_retention_is_refused_never_skipped():
    client = connection(retention_bytes=2000)
    session = client.attach("s1", None)
    conn = client.attach(None, None)
    assert isinstance(session, int)
    assert isinstance(conn, int)
    client.route(answer(9))
    take_all(client, None, conn)
    for seq in range(1, 101):
        client.route(update("s1", seq))
    take_all(client, "s1", session)
    assert client.retained <= 2000
    refused = client.attach("s1", (10, 0))
    assert status(refused) == 409
    assert b"after_seq 10" in refused.body  # type: ignore[union-attr]
    assert status(client.attach(None, (0, 0))) == 410
    assert status(client.attach("s1", (101, 0))) == 400  # never issued
    assert status(client.attach("s2", (3, 0))) == 409  # no such stream here to resume
    again = client.attach("s1", (99, 0))
    assert isinstance(again, int)
    assert [i for i, _ in take_all(client, "s1", again)] == ["100"]


# -- the property: cut anywhere, resume, nothing lost or repeated ---------------------------------


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 40), st.integers(0, 40)),
        min_size=1,
        max_size=12,
    ),
    retention=st.sampled_from([300, 3000, 1 << 20]),
)
def test_property_resumption_delivers_each_event_once_in_order_or_says_it_cannot(steps, retention):
    """Updates come in; a reader takes some, receives a prefix of what it took (the rest is
    lost on the way), and resumes after its last one. Every update is received exactly once,
    in order; or, when what it needs was dropped, the resumption is refused (and a session
    load takes over from the number the refusal names)."""
    client = connection(retention_bytes=retention, buffer_bytes=1 << 30)
    generation = client.attach("s1", None)
    assert isinstance(generation, int)
    seq = 0
    received: list[tuple[str, int]] = []
    for arriving, taking, lost in steps:
        for _ in range(arriving):
            seq += 1
            client.route(update("s1", seq, text=str(seq)))
        taken = []
        while len(taken) < taking and (batch := client.take("s1", generation, 1)):
            taken += batch
        delivered = taken[: max(0, len(taken) - lost)]
        for data in delivered:
            lines = data.decode().split("\n")
            received.append(
                (lines[0][4:], json.loads(lines[1][6:])["params"]["_meta"]["acp_bridge"]["seq"])
            )
        last = received[-1][0] if received else "0"
        after = parse_event_id(last)
        resumed = client.attach("s1", after)
        if isinstance(resumed, Response):
            assert resumed.status == 409
            assert taken
            assert len(taken) > len(delivered)
            return
        generation = resumed
    received += [
        (i, m["params"]["_meta"]["acp_bridge"]["seq"])
        for i, m in take_all(client, "s1", generation)
    ]
    assert [s for _, s in received] == list(range(1, seq + 1))
    assert [i for i, _ in received] == [str(s) for s in range(1, seq + 1)]


def test_answers_a_load_says_are_owed_here_follow_the_session():
    """The previous connection's running prompt is answered here (``pending`` in the load's
    answer): on the session's stream, after its updates."""
    client = connection()
    session = client.attach("s1", None)
    assert isinstance(session, int)
    request(client, "session/load", 5, "s1")
    meta = {"acp_bridge": {"lastSeq": 3, "complete": True, "pending": ["turn-7"]}}
    assert client.route(answer(5, _meta=meta)) is None
    client.route(update("s1", 4))
    assert client.route(answer("turn-7", stopReason="end_turn")) == "s1"
    assert [m.get("id") for _, m in take_all(client, "s1", session)] == [None, "turn-7"]


def cancel(request_id: Any) -> bytes:
    msg = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request_id}}
    return json.dumps(msg).encode()


def asking(request_id: Any, sid: str) -> bytes:
    msg = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "session/request_permission",
        "params": {"sessionId": sid},
    }
    return json.dumps(msg).encode()


def test_a_withdrawn_request_is_withdrawn_on_the_stream_it_went_on_after_it():
    """Another client answered first (a watcher that approves, or the owner): the
    ``$/cancel_request`` (which names no session) follows the request it withdraws."""
    client = connection()
    conn = client.attach(None, None)
    assert isinstance(conn, int)
    session = client.attach("s1", None)
    assert isinstance(session, int)
    assert client.route(asking(7, "s1")) == "s1"
    client.route(update("s1", 1))
    assert client.route(cancel(7)) == "s1"
    assert [m.get("id", m.get("method")) for _, m in take_all(client, "s1", session)] == [
        7,
        "session/update",
        "$/cancel_request",
    ]
    # Unknown, or withdrawn already, or answered by the client: the connection's stream.
    assert client.route(cancel(7)) is None
    assert client.route(cancel("nope")) is None
    client.route(asking(8, "s1"))
    client.note_request(Posted({"id": 8, "result": {}}, b"", "c1", None, None))
    assert client.route(cancel(8)) is None
    assert [i for i, _ in take_all(client, None, conn)] == ["1", "2", "3"]


def test_a_request_asked_before_its_session_had_a_stream_is_withdrawn_after_it():
    client = connection()
    conn = client.attach(None, None)
    assert isinstance(conn, int)
    assert client.route(asking(7, "s1")) is None  # (no stream of its own yet)
    session = client.attach("s1", None)
    assert isinstance(session, int)
    assert client.route(cancel(7)) == "s1"
    assert client.take("s1", session, 1 << 20) == []  # the request is not written yet
    assert [m["id"] for _, m in take_all(client, None, conn)] == [7]
    assert [m["method"] for _, m in take_all(client, "s1", session)] == ["$/cancel_request"]
