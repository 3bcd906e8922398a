"""
The line scanner (acp_bridge.protocol.scan, issue 23 item 1): the reference against hand-written
cases, and the C scanner held to it: identical segments on the lines agents write, and sound
(never plain where the reference is not) on mutated ones.
"""

from __future__ import annotations

import itertools
import json
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.protocol import scan
from acp_bridge.protocol.scan import DECODED_KINDS, LINE, OVERSIZE, RUN, scan_reference

BIG = 1 << 24

needs_c = pytest.mark.skipif(
    scan.scan_c is None,
    reason="acp_bridge.protocol.scanc is not built (no C compiler at install): C scanner untested",
)

#: The scanners to run the hand-written cases on: the C one too when it is built
SCANNERS = [
    pytest.param(scan_reference, id="reference"),
    pytest.param(scan.scan_c or scan_reference, id="c", marks=needs_c),
]


def update(sid="s1", kind="agent_message_chunk", **extra) -> dict:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": {"sessionUpdate": kind, **extra}},
    }


def line(msg) -> bytes:
    return orjson.dumps(msg)


def with_n(value: bytes, sid: str = "s1") -> bytes:
    """A plain line whose update has a member n of the value ``value`` (JSON text)."""
    return line(update(sid, n=1)).replace(b'"n":1', b'"n":' + value)


def block(*lines: bytes) -> bytes:
    return b"".join(x + b"\n" for x in lines)


# --------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("scan", SCANNERS)
def test_a_run_of_one_session_is_one_segment_and_its_bytes(scan):
    a = line(update("s1", content={"type": "text", "text": "hi"}))
    b = line(update("s1", "tool_call", toolCallId="c1"))
    data = block(a, b)
    assert scan(data, BIG) == [(RUN, 0, len(data), 2, "s1")]
    assert data[0 : len(data)].splitlines(keepends=True) == [a + b"\n", b + b"\n"]


@pytest.mark.parametrize("scan", SCANNERS)
def test_a_run_longer_than_max_run_comes_as_several(scan):
    """``max_run`` cuts a run into pieces of at most that many lines (the reader's turn),
    each a run of its own, together the bytes of the whole."""
    a = line(update("s1"))
    data = block(*[a] * 7)
    size = len(a) + 1
    assert scan(data, BIG, 3) == [
        (RUN, 0, 3 * size, 3, "s1"),
        (RUN, 3 * size, 6 * size, 3, "s1"),
        (RUN, 6 * size, 7 * size, 1, "s1"),
    ]
    assert scan(data, BIG, 7) == scan(data, BIG) == [(RUN, 0, len(data), 7, "s1")]


@pytest.mark.parametrize("scan", SCANNERS)
def test_runs_end_at_another_session_a_line_and_a_blank_line(scan):
    a, b = line(update("a")), line(update("b"))
    req = b'{"jsonrpc":"2.0","id":1,"method":"fs/read_text_file","params":{}}'
    data = block(a, a, b, a, req, a, b"", a, b"\r", a)
    ends = []
    pos = 0
    for x in (a, a, b, a, req, a, b"", a, b"\r", a):
        ends.append((pos, pos + len(x)))
        pos += len(x) + 1
    assert scan(data, BIG) == [
        (RUN, 0, ends[1][1] + 1, 2, "a"),
        (RUN, ends[2][0], ends[2][1] + 1, 1, "b"),
        (RUN, ends[3][0], ends[3][1] + 1, 1, "a"),
        (LINE, *ends[4]),
        (RUN, ends[5][0], ends[5][1] + 1, 1, "a"),
        (RUN, ends[7][0], ends[7][1] + 1, 1, "a"),
        (RUN, ends[9][0], ends[9][1] + 1, 1, "a"),
    ]


@pytest.mark.parametrize("scan", SCANNERS)
def test_blank_lines_give_nothing_and_an_empty_block_no_segment(scan):
    assert scan(b"", BIG) == []
    assert scan(b"\n\r\n\n", BIG) == []


@pytest.mark.parametrize("scan", SCANNERS)
def test_oversize_first_even_for_a_plain_line_and_a_line_keeps_its_cr(scan):
    a = line(update("a"))
    data = block(a, b"x" * 10 + b"\r", b"nope\r")
    assert scan(data, len(a) - 1) == [
        (OVERSIZE, len(a)),
        (LINE, len(a) + 1, len(a) + 12),
        (LINE, len(a) + 13, len(a) + 18),
    ]
    assert scan(data, len(a))[0] == (RUN, 0, len(a) + 1, 1, "a")


@pytest.mark.parametrize("scan", SCANNERS)
def test_a_crlf_line_is_plain_but_a_cr_inside_is_not(scan):
    a = line(update("a")) + b"\r"
    assert scan(block(a, a), BIG) == [(RUN, 0, 2 * len(a) + 2, 2, "a")]
    inner = line(update("a")).replace(b",", b",\r", 1)
    assert json.loads(inner)  # (valid JSON: CR is whitespace there)
    assert scan(block(inner), BIG) == [(LINE, 0, len(inner))]


@pytest.mark.parametrize("scan", SCANNERS)
def test_the_block_must_end_with_a_newline(scan):
    with pytest.raises(ValueError, match="newline"):
        scan(b"{}\n{}", BIG)


def _not_plain() -> list[bytes]:
    """One line for each condition of PLAIN that fails (the rest holds)."""
    cases = []
    msg = update()
    for key in ("jsonrpc", "method", "params"):
        bad = update()
        del bad[key]
        cases.append(line(bad))
    cases += [
        line({**msg, "jsonrpc": "1.0"}),
        line({**msg, "jsonrpc": 2.0}),
        line({**msg, "method": "session/prompt"}),
        line({**msg, "id": 1}),
        line({**msg, "id": None}),
        line({**msg, "params": [1]}),
        line({**msg, "params": None}),
        line(update(sid=1)),
        line(update(sid=None)),
        line({**msg, "params": {"sessionId": "s1", "update": "x"}}),
        line({**msg, "params": {"update": {"sessionUpdate": "plan"}}}),
        line({**msg, "params": {"sessionId": "s1"}}),
        line({**msg, "params": {"sessionId": "s1", "update": {"content": {}}}}),
        line(update(kind=3)),
        line(update(kind=None)),
        line(update(kind=["plan"])),
        line([msg]),
        b'"session/update"',
        b"null",
        # not JSON, or JSON the codec refuses
        line(msg)[:-1],
        line(msg) + b"}",
        line(msg) + b",",
        with_n(b"1e999"),
        with_n(b"NaN"),
        with_n(b"-Infinity"),
        with_n(b"01"),
        with_n(b"+1"),
        with_n(b"1."),
        with_n(b".5"),
        with_n(b"1e"),
        with_n(b"-"),
        with_n(b"tru"),
        line(update(t="a\tb")).replace(b"\\t", b"\t"),
        line(update(t="a")).replace(b'"a"', b'"\\x"'),
        line(update(t="a")).replace(b'"a"', b'"\\u12g4"'),
        line(update(t="a")).replace(b'"a"', b'"\xc0\xaf"'),  # overlong
        line(update(t="a")).replace(b'"a"', b'"\xed\xa0\x80"'),  # encoded surrogate
        line(update(t="a")).replace(b'"a"', b'"\xf4\x90\x80\x80"'),  # above U+10FFFF
        line(update(t="a")).replace(b'"a"', b'"\xe2\x82"'),  # truncated
        line(update(t="a")).replace(b'"a"', b'"\x80"'),  # stray continuation
        b"\xef\xbb\xbf" + line(msg),  # BOM
        line(msg) + b"\r\r",  # (a CR that is not the last byte)
        line(msg) + b"\r ",
        line(msg).replace(b"{", b"\x0c{", 1),  # form feed is not JSON whitespace
        line(update(t=[[[]]])).replace(b"[[[]]]", b"[" * 126 + b"]" * 126),  # depth 129
        line({**msg, "params": {**msg["params"], "update": {"sessionUpdate": "plan"}}})[:-1]
        + b',"extra":}',
        # a duplicate key: the last one counts, as in the codec
        line(msg)[:-1] + b',"method":"x"}',
        line(msg)[:-1] + b',"params":1}',
        line(msg)[:-1] + b',"params":{}}',
        line({**msg, "params": {"sessionId": "s1", "update": {"sessionUpdate": "plan"}}})[:-2]
        + b',"update":{}}}',
    ]
    # (setup updates, and notices: not history, only to clients that take them)
    cases += [line(update(kind=kind)) for kind in sorted(DECODED_KINDS)]
    return cases


@pytest.mark.parametrize("scan", SCANNERS)
@pytest.mark.parametrize("bad", _not_plain())
def test_each_failing_condition_makes_a_line(scan, bad):
    assert scan_reference(block(bad), BIG) == [(LINE, 0, len(bad))]
    assert scan(block(bad), BIG) == [(LINE, 0, len(bad))]


def _plain() -> list[tuple[bytes, str]]:
    msg = update("séance", content={"type": "text", "text": 'é "q" \\ \n\t → 𝄞'})
    return [
        (line(msg), "séance"),
        (json.dumps(msg, ensure_ascii=False).encode(), "séance"),
        (json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode(), "séance"),
        (json.dumps(update("s", x=[1, -2.5e-3, 0, True, False, None, {}, []])).encode(), "s"),
        (
            b' \t{"params":{"update":{"sessionUpdate":"plan"},"sessionId":""},'
            b'"method":"session/update","jsonrpc":"2.0"} \t',
            "",
        ),
        (line(update("s", t=[[[]]])).replace(b"[[[]]]", b"[" * 125 + b"]" * 125), "s"),
        (with_n(b"1e299", "s"), "s"),
        (with_n(b"-0.5E-9999", "s"), "s"),
        (with_n(b'"\\ud800"', "s"), "s"),  # the codec takes lone ones
        (with_n(b'"\xef\xbf\xbf\xf4\x8f\xbf\xbf"', "s"), "s"),
        (line({**update("s"), "_meta": {"id": 1, "method": "x"}}), "s"),
    ]


@pytest.mark.parametrize("scan", SCANNERS)
@pytest.mark.parametrize(("good", "sid"), _plain())
def test_plain_lines_of_every_ordinary_kind(scan, good, sid):
    assert scan(block(good), BIG) == [(RUN, 0, len(good) + 1, 1, sid)]


def _conservative() -> list[bytes]:
    """Plain lines the C scanner calls LINE, not being sure (rare in practice)."""
    return [
        line(update("s")).replace(b'"method"', b'"\\u006dethod"'),
        line(update("s")).replace(b'"s"', b'"\\u0073"'),
        line(update("s")).replace(b'"session/update"', b'"session\\/update"'),
        line(update("s")).replace(b'"sessionId"', b'"session\\u0049d"'),
        with_n(b"1e300", "s"),
        with_n(b"1" * 101, "s"),
        with_n(b"1e-00001", "s"),
        line(update("s"))[:-1] + b',"jsonrpc":"2.0"}',
        line(update("s"))[:-2] + b',"sessionId":"s2"}}',
    ]


@needs_c
@pytest.mark.parametrize("good", _conservative())
def test_the_c_scanner_says_line_when_unsure(good):
    assert scan_reference(block(good), BIG)[0][0] == RUN
    assert scan.scan_c is not None
    assert scan.scan_c(block(good), BIG) == [(LINE, 0, len(good))]


# --------------------------------------------------------------------------- C = reference

#: Session ids from a small pool, so that runs form
SIDS_ASCII = ("sess_a", "sess_b", "01HZX9", "")
SIDS = (*SIDS_ASCII, "séance-☃")
KINDS = ("agent_message_chunk", "agent_thought_chunk", "tool_call", "plan", *sorted(DECODED_KINDS))
EXTRA_KEYS = st.sampled_from(["_meta", "content", "toolCallId", "title", "status", "x"])
#: (no lone surrogates: the serializers refuse them)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=16)
LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(min_value=-1e200, max_value=1e200, allow_nan=False)
    | TEXT
)
CONTENT = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
#: How agents write a line: orjson, Python's json with and without spaces, json with
#: ensure_ascii (every non-ASCII character escaped); JSON.stringify and serde_json write what
#: the compact json one does (they differ in float spellings only, e.g. 1e-7 for 1e-07)
SERIALIZERS = {
    "orjson": orjson.dumps,
    "json": lambda m: json.dumps(m, ensure_ascii=False).encode(),
    "compact": lambda m: json.dumps(m, ensure_ascii=False, separators=(",", ":")).encode(),
    "ascii": lambda m: json.dumps(m).encode(),
    "js-like": lambda m: (
        json.dumps(m, ensure_ascii=False, separators=(",", ":")).replace("e-0", "e-").encode()
    ),
}
SPOILERS = ("id", "no-jsonrpc", "method", "params-list", "sid-int", "update-str", "no-kind")


@st.composite
def shuffled(draw, mapping: dict) -> dict:
    return dict(draw(st.permutations(list(mapping.items()))))


@st.composite
def with_extras(draw, required: dict) -> dict:
    extras = draw(st.dictionaries(EXTRA_KEYS, CONTENT, max_size=2))
    return draw(shuffled({**{k: v for k, v in extras.items() if k not in required}, **required}))


@st.composite
def an_update(draw, ascii_sid: bool, spoil: bool = True) -> dict:
    sid = draw(st.sampled_from(SIDS_ASCII if ascii_sid else SIDS))
    kind = draw(st.sampled_from(KINDS if spoil else KINDS[:4]))
    update = draw(with_extras({"sessionUpdate": kind}))
    params = draw(with_extras({"sessionId": sid, "update": update}))
    msg = {"jsonrpc": "2.0", "method": "session/update", "params": params}
    spoiler = draw(st.sampled_from((None,) * 10 + SPOILERS)) if spoil else None
    if spoiler == "id":
        msg["id"] = draw(st.integers(0, 9) | st.none())
    elif spoiler == "no-jsonrpc":
        del msg["jsonrpc"]
    elif spoiler == "method":
        msg["method"] = "session/updates"
    elif spoiler == "params-list":
        msg["params"] = [params]
    elif spoiler == "sid-int":
        params["sessionId"] = 7
    elif spoiler == "update-str":
        params["update"] = kind
    elif spoiler == "no-kind":
        del update["sessionUpdate"]
    return draw(with_extras(msg))


@st.composite
def other_message(draw) -> dict:
    payload = draw(st.dictionaries(EXTRA_KEYS, CONTENT, max_size=2))
    return draw(
        st.sampled_from(
            [
                {"jsonrpc": "2.0", "id": 3, "method": "session/request_permission", "params": {}},
                {"jsonrpc": "2.0", "id": "r1", "result": payload},
                {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "x"}},
                {"jsonrpc": "2.0", "method": "_x/notice", "params": payload},
            ]
        )
    )


@st.composite
def a_line(draw) -> bytes:
    """One line (no newline) as agents write them, and some that are not messages."""
    what = draw(st.sampled_from(["update"] * 6 + ["other", "garbage", "blank"]))
    if what == "blank":
        return draw(st.sampled_from([b"", b"\r"]))
    if what == "garbage":
        return draw(st.binary(max_size=24)).replace(b"\n", b"")
    style = draw(st.sampled_from(sorted(SERIALIZERS)))
    msg = draw(an_update(style == "ascii") if what == "update" else other_message())
    text = SERIALIZERS[style](msg)
    return draw(st.sampled_from([b"", b" "])) + text + draw(st.sampled_from([b"", b"\r", b" "]))


MAX_LINES = st.sampled_from([BIG, BIG, BIG, 300, 80])


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(a_line(), max_size=10),
    max_line=MAX_LINES,
    max_run=st.sampled_from([1, 2, 3, sys.maxsize]),
)
def test_c_equals_the_reference_on_the_lines_agents_write(lines, max_line, max_run):
    assert scan.scan_c is not None
    data = block(*lines)
    assert scan.scan_c(data, max_line, max_run) == scan_reference(data, max_line, max_run)


# --------------------------------------------------------------------------- C is sound

#: Bytes to put inside a string: control bytes, invalid UTF-8 (overlong, surrogate, above
#: U+10FFFF, truncated, stray), valid multi-byte characters, quotes, escapes good and bad
STRING_BYTES = st.one_of(
    st.integers(0, 0x1F).map(lambda b: bytes([b])),
    st.sampled_from(
        [
            b"\x7f",
            b"\xff",
            b"\x80",
            b"\xc0\x80",
            b"\xc1\xbf",
            b"\xc3",
            b"\xe2\x82",
            b"\xe0\x80\x80",
            b"\xed\xa0\x80",
            b"\xed\x9f\xbf",
            b"\xf0\x8f\xbf\xbf",
            b"\xf4\x90\x80\x80",
            b"\xf5\x80\x80\x80",
            b"\xef\xbb\xbf",
            b"\xc3\xa9",
            b"\xf0\x9d\x84\x9e",
            b'"',
            b"\\",
            b"\\\\",
            b'\\"',
            b"\\u00",
            b"\\u0041",
            b"\\ud800",
            b"\\U0041",
            b"\\x41",
            b"\\/",
            b"\\'",
        ]
    ),
)
#: Members to put into an object: duplicates of the ones the scanner reads, escaped spellings
MEMBERS = [
    b'"id":1,',
    b'"id":null,',
    b'"\\u0069d":1,',
    b'"method":"x",',
    b'"method":"session/update",',
    b'"\\u006dethod":"x",',
    b'"jsonrpc":"2.0",',
    b'"jsonrpc":"1.0",',
    b'"params":{},',
    b'"params":null,',
    b'"sessionId":"q",',
    b'"sessionId":"sess_a",',
    b'"sessionI\\u0064":"q",',
    b'"update":{},',
    b'"update":{"sessionUpdate":"plan"},',
    b'"sessionUpdate":"plan",',
    b'"sessionUpdate":"current_mode_update",',
    b'"session\\u0055pdate":"current_mode_update",',
]
#: Values, numbers most: at and past a double's range, past the codec's digits, bad grammar
VALUES = st.one_of(
    st.sampled_from(
        [
            b"1e308",
            b"1e309",
            b"1E+299",
            b"1e300",
            b"-1e-400",
            b"1e-99999",
            b"0.1e0300",
            b"9" * 18,
            b"9" * 25,
            b"9" * 120,
            b"1" * 4301,
            b"-0",
            b"-0.0e-0",
            b"01",
            b"-",
            b"1.",
            b".5",
            b"+1",
            b"1e",
            b"1e+",
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b"tru",
            b"nul",
            b"[1,]",
            b"{,}",
            b'{"a"}',
            b'{"a":1,}',
            b"[1 2]",
        ]
    ),
    st.integers(120, 130).map(lambda n: b"[" * n + b"]" * n),
    st.integers(120, 130).map(lambda n: b'{"a":' * n + b"0" + b"}" * n),
)
#: Bytes to put anywhere: the grammar's, whitespace JSON has and has not
ANYWHERE = [*(bytes([b]) for b in b'"\\[]{},: \t\r\n\x0b\x0c0-.+eE'), b"\xef\xbb\xbf", b"}", b"{}"]
#: Spellings the scanner reads, and escaped ones
ESCAPES = [
    (b'"method"', b'"\\u006dethod"'),
    (b'"params"', b'"param\\u0073"'),
    (b'"sessionId"', b'"sessionI\\u0064"'),
    (b'"update"', b'"\\u0075pdate"'),
    (b'"sessionUpdate"', b'"session\\u0055pdate"'),
    (b'"jsonrpc"', b'"json\\u0072pc"'),
    (b'"2.0"', b'"2\\u002e0"'),
    (b'"sess_a"', b'"sess\\u005fa"'),
    (b'"session/update"', b'"session\\/update"'),
    (b"_meta", b"id"),
]


@st.composite
def mutated(draw) -> bytes:
    """A plain update line (mostly), mutated once or a few times."""
    text = draw(a_line()) if draw(st.integers(0, 4)) == 0 else b""
    if not text:
        style = draw(st.sampled_from(sorted(SERIALIZERS)))
        text = SERIALIZERS[style](draw(an_update(style == "ascii", spoil=False)))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        op = draw(st.sampled_from(["string", "member", "value", "anywhere", "edit", "escape"]))
        if op == "escape":
            old, new = draw(st.sampled_from(ESCAPES))
            text = text.replace(old, new, 1)
            continue
        # where: inside a word (a string, mostly), after a brace, or anywhere
        words = [i for i in range(1, len(text)) if text[i - 1 : i + 1].isalpha()]
        braces = [i + 1 for i, b in enumerate(text) if b == ord("{")]
        anywhere = list(range(len(text) + 1))
        if op == "string":
            at = draw(st.sampled_from(words or anywhere))
            text = text[:at] + draw(STRING_BYTES) + text[at:]
        elif op == "member":
            closing = [i for i, b in enumerate(text) if b == ord("}")]
            member = draw(st.sampled_from(MEMBERS))
            if closing and draw(st.booleans()):  # after the members (the codec keeps the last)
                at = draw(st.sampled_from(closing))
                text = text[:at] + b"," + member[:-1] + text[at:]
            else:
                at = draw(st.sampled_from(braces or anywhere))
                text = text[:at] + member + text[at:]
        elif op == "value":
            at = draw(st.sampled_from(braces or anywhere))
            text = text[:at] + b'"n":' + draw(VALUES) + b"," + text[at:]
        elif op == "anywhere":
            at = draw(st.sampled_from([len(text), *anywhere]))
            text = text[:at] + draw(st.sampled_from(ANYWHERE)) + text[at:]
        elif text:
            at = draw(st.integers(0, len(text) - 1))
            edit = draw(st.sampled_from(["flip", "cut", "delete"]))
            if edit == "flip":
                text = text[:at] + bytes([text[at] ^ draw(st.integers(1, 255))]) + text[at + 1 :]
            elif edit == "cut":
                text = text[:at]
            else:
                text = text[:at] + text[at + draw(st.integers(1, 4)) :]
    return text


def labels(data: bytes, max_line: int, segments: list) -> dict[int, object]:
    """
    What the segments say of each line of ``data`` (by index): ("run", sid), "line" or
    "oversize"; checks on the way that they cover every non-blank line, in order, with the
    right offsets, and that no two runs of one session touch.
    """
    lines, pos = [], 0
    for text in data.split(b"\n")[:-1]:
        lines.append((pos, pos + len(text)))
        pos += len(text) + 1

    def blank(i: int) -> bool:
        start, end = lines[i]
        return end - start <= max_line and data[start:end] in (b"", b"\r")

    out: dict[int, object] = {}
    i = 0
    last_run: tuple[int, str] | None = None  # (end, sid) of the previous segment if a run
    for seg in segments:
        while i < len(lines) and blank(i):
            i += 1
        assert i < len(lines), segments
        if seg[0] == RUN:
            _, start, end, count, sid = seg
            assert count >= 1
            assert lines[i][0] == start
            assert lines[i + count - 1][1] + 1 == end
            assert last_run != (start, sid), "two runs of one session touch"
            for j in range(i, i + count):
                assert not blank(j)
                out[j] = ("run", sid)
            i += count
            last_run = (end, sid)
            continue
        if seg[0] == LINE:
            assert lines[i] == (seg[1], seg[2])
            out[i] = "line"
        else:
            assert seg == (OVERSIZE, lines[i][1] - lines[i][0])
            assert seg[1] > max_line
            out[i] = "oversize"
        i += 1
        last_run = None
    assert all(blank(j) for j in range(i, len(lines)))
    return out


@needs_c
@settings(max_examples=300, deadline=None)
@given(lines=st.lists(mutated() | a_line(), max_size=6), max_line=MAX_LINES)
def test_c_is_sound_on_mutated_lines(lines, max_line):
    assert_sound(block(*lines), max_line)


def assert_sound(data: bytes, max_line: int = BIG) -> int:
    """C against the reference on ``data``; returns how many lines the C scanner put in runs."""
    assert scan.scan_c is not None
    ours = labels(data, max_line, scan.scan_c(data, max_line))
    reference = labels(data, max_line, scan_reference(data, max_line))
    assert ours.keys() == reference.keys()
    for i, said in ours.items():
        if said != reference[i]:
            # the only difference allowed: a plain line the C scanner was not sure of
            assert said == "line", (data.split(b"\n")[i], said, reference[i])
            assert reference[i][0] == "run"  # type: ignore[index]
    return sum(1 for said in ours.values() if said != "line")


#: Plain lines to edit: compact, spaced with non-ASCII, nested content of every kind
BASES = [
    line(update("sess_a", content={"type": "text", "text": "hello world"})),
    json.dumps(update("séance", content={"text": 'é → 𝄞 \\ "'}), ensure_ascii=False).encode(),
    line(update("s", rawInput={"a": [1, -2.5e-3, True, None, {"b": "c"}], "d": 1e10})),
]


def _single_edits(base: bytes) -> list[bytes]:
    """Every single edit of the kinds ``mutated`` draws from, at every place it applies."""
    string_bytes = [bytes([b]) for b in range(0x20)] + [
        b"\x7f", b"\xff", b"\x80", b"\xc0\x80", b"\xc1\xbf", b"\xc3", b"\xe2\x82",
        b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xf0\x8f\xbf\xbf",
        b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xc3\xa9", b'"', b"\\", b"\\\\",
        b'\\"', b"\\u00", b"\\u0041", b"\\ud800", b"\\U0041", b"\\x41", b"\\/", b"\\'",
    ]  # fmt: skip
    values = [
        b"1e308", b"1e309", b"1E+299", b"1e300", b"-1e-400", b"1e-99999", b"0.1e0300",
        b"9" * 25, b"9" * 120, b"1" * 4301, b"-0", b"01", b"-", b"1.", b".5", b"+1", b"1e",
        b"NaN", b"Infinity", b"tru", b"[1,]", b'{"a"}', b'{"a":1,}', b"[1 2]",
        *(b"[" * n + b"]" * n for n in range(120, 131)),
    ]  # fmt: skip
    members = [
        b'"id":1,', b'"\\u0069d":1,', b'"method":"x",', b'"method":"session/update",',
        b'"\\u006dethod":"x",', b'"jsonrpc":"2.0",', b'"jsonrpc":"1.0",', b'"params":{},',
        b'"sessionId":"q",', b'"sessionI\\u0064":"q",', b'"update":{},',
        b'"sessionUpdate":"plan",', b'"sessionUpdate":"current_mode_update",',
    ]  # fmt: skip
    anywhere = [bytes([b]) for b in b'"\\[]{},: \t\r\x0b\x0c0-.+eE'] + [b"\xef\xbb\xbf", b"{}"]
    braces = [i + 1 for i, b in enumerate(base) if b == ord("{")]
    closing = [i for i, b in enumerate(base) if b == ord("}")]
    words = [i for i in range(1, len(base)) if base[i - 1 : i + 1].isalpha()]
    out = []
    for at in words:
        out += [base[:at] + x + base[at:] for x in string_bytes]
    for at in braces:
        out += [base[:at] + x + base[at:] for x in members]
        out += [base[:at] + b'"n":' + x + b"," + base[at:] for x in values]
    for at in closing:  # (a member after the one read: the codec keeps the last)
        out += [base[:at] + b"," + x[:-1] + base[at:] for x in members]
    for at in range(len(base) + 1):
        out += [base[:at] + x + base[at:] for x in anywhere]
        out.append(base[:at] + base[at + 1 :])
    out += [base.replace(old, new, 1) for old, new in ESCAPES]
    return out


@needs_c
@pytest.mark.parametrize("base", BASES)
def test_c_is_sound_on_every_single_edit_of_a_plain_line(base):
    assert scan_reference(block(base), BIG)[0][0] == RUN
    edits = [x.replace(b"\n", b"") for x in _single_edits(base)]
    assert assert_sound(block(*edits)) > 0


@needs_c
def test_c_is_sound_on_every_utf8_shape():
    """Every lead byte with continuation bytes at and around the bounds of Unicode's table."""
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    base = line(update("s", content="ab"))
    at = base.index(b"ab") + 1
    shapes = [
        bytes([lead, *rest])
        for lead in range(0x80, 0x100)
        for rest in itertools.chain(
            ((a,) for a in edges),
            ((a, b) for a in edges for b in (0x80, 0xBF, 0x7F, 0xC0)),
            ((a, b, c) for a in edges for b in (0x80, 0xBF, 0xC0) for c in (0x80, 0xBF, 0x7F)),
        )
    ]
    data = block(*(base[:at] + shape + base[at:] for shape in shapes if b"\n" not in shape))
    assert assert_sound(data) > 0
