"""The pure core: framing, JSON-RPC classification, session and request-id tables. No trio."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from acp_bridge.protocol import jsonrpc
from acp_bridge.protocol.framing import LineDecoder, Oversize
from acp_bridge.protocol.jsonrpc import JsonRpcError, Kind, classify, dumps, loads
from acp_bridge.protocol.wire import stamp_run
from acp_bridge.sessions.table import PendingTable, SessionTable

PURE_MODULES = [
    "acp_bridge.protocol.framing",
    "acp_bridge.protocol.jsonrpc",
    "acp_bridge.sessions.table",
    "acp_bridge.config.model",
]


# ----------------------------------------------------------------------------- framing


@given(
    lines=st.lists(
        st.binary(min_size=1, max_size=50).filter(lambda b: b"\n" not in b and b != b"\r"),
        max_size=20,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
)
def test_any_chunking_yields_the_same_lines(lines, cuts):
    data = b"".join(line + b"\n" for line in lines)
    points = sorted({c % (len(data) + 1) for c in cuts})
    decoder = LineDecoder(max_line_bytes=100)
    out = []
    start = 0
    for point in [*points, len(data)]:
        out += decoder.feed(data[start:point])
        start = point
    assert out == lines
    assert decoder.feed_eof() is None


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=10),
    chunk=st.integers(min_value=1, max_value=64),
)
def test_oversize_lines_become_markers_and_memory_stays_bounded(sizes, chunk):
    cap = 100
    data = b"".join(b"x" * n + b"\n" for n in sizes)
    decoder = LineDecoder(max_line_bytes=cap)
    out = []
    for i in range(0, len(data), chunk):
        out += decoder.feed(data[i : i + chunk])
        assert decoder.pending <= cap + chunk
    expected = [Oversize(n) if n > cap else b"x" * n for n in sizes]
    assert out == expected


def _block_lines(block: bytes, cap: int) -> list[bytes | Oversize]:
    """The lines of a block as :meth:`LineDecoder.feed` gives them (what the scan does)."""
    assert not block or block.endswith(b"\n")
    lines = block.split(b"\n")[:-1]
    return [Oversize(len(x)) if len(x) > cap else x for x in lines if x and x != b"\r"]


@given(
    data=st.binary(max_size=2000).map(lambda b: b.replace(b"a", b"\n").replace(b"b", b"\r")),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
    cap=st.integers(min_value=1, max_value=120),
)
def test_a_decoder_fed_blocks_yields_what_it_yields_fed_lines(data, cuts, cap):
    """``feed_block`` (a read's complete lines in one block, for the scan) holds the same
    lines as ``feed``, however the stream is cut, with the same bound on what it holds."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    by_line, by_block = LineDecoder(max_line_bytes=cap), LineDecoder(max_line_bytes=cap)
    lines: list[bytes | Oversize] = []
    blocks: list[bytes | Oversize] = []
    start = 0
    for point in [*points, len(data)]:
        piece = data[start:point]
        start = point
        lines += by_line.feed(piece)
        marker, block = by_block.feed_block(bytearray(piece))
        if marker is not None:
            blocks.append(marker)
        blocks += _block_lines(block, cap)
        assert by_block.pending <= cap
        assert by_block.discarding == by_line.discarding
    assert blocks == lines
    assert by_block.feed_eof() == by_line.feed_eof()


def test_empty_lines_are_skipped_and_a_fragment_is_returned_at_eof():
    decoder = LineDecoder()
    assert decoder.feed(b'\n\r\n{}\n{"a"') == [b"{}"]
    assert decoder.feed_eof() == b'{"a"'
    assert decoder.feed_eof() is None


def test_a_huge_line_fed_byte_by_byte_is_discarded_as_it_arrives():
    decoder = LineDecoder(max_line_bytes=10)
    for _ in range(1000):
        assert decoder.feed(b"y") == []
        assert decoder.pending <= 10
    assert decoder.feed(b"\nok\n") == [Oversize(1000), b"ok"]


# ----------------------------------------------------------------------------- JSON-RPC


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "m"}, Kind.REQUEST),
        ({"jsonrpc": "2.0", "id": "x", "method": "m", "params": {}}, Kind.REQUEST),
        ({"jsonrpc": "2.0", "method": "m"}, Kind.NOTIFICATION),
        ({"jsonrpc": "2.0", "id": 1, "result": None}, Kind.RESPONSE),
        ({"jsonrpc": "2.0", "id": None, "error": {"code": 1, "message": ""}}, Kind.RESPONSE),
        ({"jsonrpc": "2.0", "id": 1, "result": 1, "error": {}}, Kind.INVALID),
        ({"jsonrpc": "2.0", "id": 1}, Kind.INVALID),
        ({"jsonrpc": "1.0", "id": 1, "method": "m"}, Kind.INVALID),
        ({"jsonrpc": "2.0", "id": True, "method": "m"}, Kind.INVALID),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "m"}, Kind.INVALID),
        ({"jsonrpc": "2.0", "id": [1], "method": "m"}, Kind.INVALID),
        ({"jsonrpc": "2.0", "method": 5}, Kind.INVALID),
        ({"jsonrpc": "2.0", "method": "m", "params": 3}, Kind.INVALID),
        ([{"jsonrpc": "2.0", "method": "m"}], Kind.INVALID),
        ("text", Kind.INVALID),
    ],
)
def test_classify(message, kind):
    assert classify(message) is kind


@pytest.mark.parametrize("line", [b"{", b"\xff\xfe", b"[" * 100000, b"nan", b"", b"{'a': 1}"])
def test_bad_json_is_a_parse_error(line):
    with pytest.raises(JsonRpcError) as info:
        loads(line)
    assert info.value.code == -32700


def test_encoding_is_one_compact_line_and_keeps_unicode():
    data = dumps({"text": "héllo\nworld", "n": 1})
    assert data == '{"text":"héllo\\nworld","n":1}\n'.encode()
    assert data.count(b"\n") == 1


def _reference(line: bytes):
    """What the standard-library codec alone decides: the value, or the parse error."""
    try:
        return ("ok", jsonrpc._reference_loads(line))
    except JsonRpcError as exc:
        return ("error", exc.code)


def _decided(line: bytes):
    try:
        value = loads(line)
    except JsonRpcError as exc:
        return ("error", exc.code)
    return ("ok", value)


def _same(a, b) -> bool:
    """Equal, with the types of numbers kept (1 and 1.0 differ on the wire)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)


#: pieces of JSON and of near-JSON (escapes, a BOM, a surrogate in UTF-8, long digit runs)
_PIECES = [
    b"[", b"]", b"{", b"}", b'"', b"\\", b"u", b"d800", b"1", b"9" * 19, b"e400", b"-", b".",
    b",", b":", b" ", b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\xff", b"NaN", b"true", b"null",
    b'"a"', b"0",
]  # fmt: skip

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_json_values)
def test_fast_codec_decodes_exactly_as_the_reference(value):
    """orjson decodes what the standard library would, to the same values and types: big
    integers, floats, escapes and key order included (a fast-path mistake would change
    ids or numbers on the wire)."""
    line = jsonrpc._encoder.encode(value).encode("utf-8", "surrogatepass")
    reference = _reference(line)
    decided = _decided(line)
    assert decided[0] == reference[0]
    assert _same(decided[1], reference[1])


@given(
    st.binary(max_size=64)
    | st.lists(
        st.sampled_from(_PIECES),
        max_size=40,
    ).map(b"".join)
)
def test_fast_codec_accepts_and_refuses_exactly_what_the_reference_does(line):
    """Arbitrary bytes: the same verdict as the standard-library codec, and the same value."""
    reference = _reference(line)
    decided = _decided(line)
    assert decided[0] == reference[0], (line, decided, reference)
    assert _same(decided[1], reference[1])


@pytest.mark.parametrize(
    "line",
    [
        b"123456789012345678901234567890",
        b"-9223372036854775809",
        b'{"id":18446744073709551616}',
        b'"\\ud800"',
        b"[" * 129 + b"]" * 129,
        b"[" * 128 + b"]" * 128,
        b"\xef\xbb\xbf{}",
        b"1e400",
        b'{"a":1,"a":2}',
    ],
)
def test_fast_codec_edge_cases_match_the_reference(line):
    reference = _reference(line)
    decided = _decided(line)
    assert decided[0] == reference[0]
    assert _same(decided[1], reference[1])


@given(_json_values)
def test_fast_encoding_round_trips_to_the_same_value(value):
    """What ``dumps`` writes (orjson, or the reference codec for what orjson refuses) reads
    back as the same value, and is one compact line."""
    data = dumps({"v": value})
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1
    assert _same(jsonrpc._reference_loads(data[:-1])["v"], value)


_ids = st.text(min_size=1, max_size=8)


def _update_of(sid: str, update: object, extra: dict) -> dict:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": {"v": update, **extra}},
    }


def _encoded(msg: dict, spaced: bool) -> bytes:
    """``msg`` as the standard library writes it: compact, or spaced and ASCII-only."""
    encoder = jsonrpc.json.JSONEncoder(
        separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=spaced
    )
    return encoder.encode(msg).encode("utf-8", "surrogatepass")


@given(
    old=_ids,
    new=_ids,
    update=_json_values,
    extra=st.dictionaries(st.sampled_from(["sessionId", "x", "_meta"]), _json_values),
    spaced=st.booleans(),
)
def test_a_session_id_rewritten_on_the_bytes_is_the_message_encoded_again(
    old, new, update, extra, spaced
):
    """Whenever ``rewrite_session_id`` rewrites the bytes, they decode to the message with
    only ``params.sessionId`` changed, whatever else the line holds (the same id deeper
    down, the key as a value, escapes, other spacing); otherwise it declines (None)."""
    msg = _update_of(old, update, extra)
    line = _encoded(msg, spaced)
    rewritten = jsonrpc.rewrite_session_id(line, old, new)
    if rewritten is None:
        return
    expected = {**msg, "params": {**msg["params"], "sessionId": new}}
    assert _same(jsonrpc._reference_loads(rewritten), expected)


def test_rewriting_on_the_bytes_declines_what_it_cannot_do_safely():
    rewrite = jsonrpc.rewrite_session_id
    assert rewrite(b'{"params":{"sessionId":"s1","u":1}}', "s1", "s1~b") == (
        b'{"params":{"sessionId":"s1~b","u":1}}'
    )
    assert rewrite(b'{"params":{"sessionId":"s1","u":{"sessionId":"s1"}}}', "s1", "x") is None
    assert rewrite(b'{"params":{"sessionId": "s1"}}', "s1", "x") is None
    assert rewrite(b'{"params":{"session\\u0049d":"s1","u":{"sessionId":"s1"}}}', "s1", "x") is None
    assert rewrite(b'{"params":{"sessionId":"s1","u":"sessionId"}}', "s1", "x") is None


@given(
    old=_ids,
    new=_ids,
    updates=st.lists(
        st.tuples(
            _json_values,
            st.dictionaries(st.sampled_from(["sessionId", "x", "_meta"]), _json_values),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_a_run_rewritten_on_the_bytes_is_each_of_its_lines_rewritten(old, new, updates):
    """``rewrite_run_session_id`` over a run of lines either declines or gives exactly what
    ``rewrite_session_id`` gives line by line (and declines whenever one line would)."""
    lines = [_encoded(_update_of(old, update, extra), spaced) for update, extra, spaced in updates]
    each = [jsonrpc.rewrite_session_id(line, old, new) for line in lines]
    run = jsonrpc.rewrite_run_session_id(b"".join(x + b"\n" for x in lines), len(lines), old, new)
    if None in each:
        assert run is None
    else:
        assert run is not None
        assert run == b"".join(x + b"\n" for x in each if x is not None)


# ----------------------------------------------------------------------------- routing

AGENTS = ["a", "b", "c"]


@given(
    st.lists(
        st.tuples(st.sampled_from(AGENTS), st.sampled_from(["s1", "s2", "s1~b", "s1~a", "x"])),
        max_size=40,
    )
)
def test_colliding_session_ids_never_misroute(registrations):
    """Whatever ids agents mint, bridge ids are unique and map back to exactly their origin."""
    table = SessionTable()
    for agent, sid in registrations:
        session = table.register(agent, sid)
        assert table.get(session.bridge_id) is session
        assert table.find(agent, sid) is session
        assert (session.agent, session.agent_id) == (agent, sid)
        assert session.rewrite == (session.bridge_id != sid)
    bridge_ids = [s.bridge_id for s in table]
    assert len(bridge_ids) == len(set(bridge_ids)) == len(set(registrations))
    # The first agent to mint an id keeps it unchanged (the fast path).
    first_owner = {}
    for agent, sid in registrations:
        first_owner.setdefault(sid, agent)
    for sid, agent in first_owner.items():
        owner = table.get(sid)
        assert owner is not None
        if owner.agent_id == sid:
            assert owner.agent == agent


def test_removed_sessions_free_their_ids():
    table = SessionTable()
    s = table.register("a", "s1")
    table.remove(s)
    assert table.get("s1") is None
    assert table.find("a", "s1") is None
    assert table.register("b", "s1").bridge_id == "s1"


def test_a_kept_sessions_id_goes_to_a_new_session_and_the_kept_one_moves_aside():
    """Kept (only the store has it): a new session or a bound one takes the id, the kept one
    moves to a free ``~agent[~N]`` id (published on moved); no id is ever handed out twice."""
    moves: list[tuple[str, str]] = []
    table = SessionTable()
    table.moved.subscribe(lambda old, new: moves.append((old, new)))
    table.keep("s1", "a", "s1")
    table.keep("s1~a", "a", "s1")
    assert table.register("a", "s1").bridge_id == "s1"
    assert moves == [("s1", "s1~a~2")]
    assert table.register("b", "s1").bridge_id == "s1~b"  # (s1 is live: no move)
    table.keep("x", "c", "x")
    table.bind("a", "x", "x")
    assert moves[1:] == [("x", "x~c")]
    live = table.get("s1")
    assert live is not None
    table.keep("s1", "b", "s1")  # a live id is not kept: once free, it is free
    table.remove(live)
    assert table.register("c", "s1").bridge_id == "s1"
    assert len(moves) == 2


def test_bind_refuses_a_taken_id():
    table = SessionTable()
    table.register("a", "s1")
    with pytest.raises(ValueError, match="taken"):
        table.bind("b", "s1", "s1")
    assert table.bind("a", "s1", "s1").agent == "a"


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "pop"]), st.one_of(st.integers(0, 20), st.text(max_size=2))
        ),
        max_size=60,
    )
)
def test_pending_table_answers_each_id_once(ops):
    table: PendingTable[object] = PendingTable()
    live: dict[int, object] = {}
    for op, value in ops:
        if op == "add":
            entry = object()
            new_id = table.add(entry)
            assert new_id not in live
            live[new_id] = entry
        else:
            got = table.pop(value)
            expected = live.pop(value, None) if type(value) is int else None
            assert got is expected
    assert len(table) == len(live)
    assert dict(table.drain()) == live
    assert len(table) == 0


def test_the_decoder_says_while_it_drops_an_oversize_line():
    decoder = LineDecoder(max_line_bytes=1024)
    assert decoder.feed(b"x" * 1000) == []
    assert decoder.discarding is None
    assert decoder.feed(b"x" * 1000) == []
    assert decoder.discarding == 2000
    assert decoder.feed(b"x" * 5 + b"\n{}\n") == [Oversize(2005), b"{}"]
    assert decoder.discarding is None


def test_stamp_run_numbers_each_line_of_a_run():
    lines = [
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{}}}\n',
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{},'
        b'"_meta":{"other":1,"acp_bridge":{"x":2}}}}\n',
    ]
    stamped = stamp_run(b"".join(lines), 41).splitlines(keepends=True)
    assert [json.loads(line)["params"]["_meta"]["acp_bridge"]["seq"] for line in stamped] == [
        41,
        42,
    ]
    kept = json.loads(stamped[1])["params"]["_meta"]
    assert kept == {"other": 1, "acp_bridge": {"x": 2, "seq": 42}}
    assert all(line.endswith(b"\n") for line in stamped)
    unnumbered = stamp_run(b"".join(lines), 0).splitlines()
    assert [json.loads(line)["params"]["_meta"]["acp_bridge"]["seq"] for line in unnumbered] == [
        0,
        0,
    ]
