"""
Fuzzing (issue 8, item 1): the line framing, the codec, and the JSON-RPC dispatcher in both
directions (a client's stdio stream, agents' stdout, WebSocket messages), with hypothesis.

Invariants, checked on every example:

- the bridge never raises: any exception in any of its tasks fails the example;
- every request-shaped line the client sends is answered exactly once, and every line that is
  not a message gets exactly one ``id: null`` error (the oracle: ``fuzz_targets.expect``);
- every request-shaped line an agent sends is answered exactly once while it lives;
- every line the bridge writes, to the client or to an agent, is a JSON-RPC message;
- afterwards the connection still runs a normal prompt to its end, and nothing is left
  pending at the bridge (every 10th example also disconnects: what the agents asked of the
  client is then answered by the bridge).

A program is built from one byte string (``fuzz_targets.Source``: one hypothesis draw), and
the dispatcher tests keep their bridge and connection across examples (``fuzz_targets.Host``;
after a failure, every example runs on a fresh bridge, so what hypothesis reports replays
alone): that is what makes the counts of ``CI_EXAMPLES`` (20,000 in all) fit in about a
minute. ``scripts/fuzz --minutes N`` runs the same tests for N minutes in all (env
``ACP_BRIDGE_FUZZ_MINUTES``), or feeds one to atheris.
"""

from __future__ import annotations

import collections
import functools
import inspect
import io
import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Final

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acp_bridge.observe.log import configure_logging
from acp_bridge.observe.redact import Redactor
from acp_bridge.observe.trace import WireTrace, _Message, format_record
from acp_bridge.protocol.framing import LineDecoder, Oversize
from acp_bridge.protocol.jsonrpc import JsonRpcError, classify, dumps, loads
from acp_bridge.store.db import AuditRecord, JournalEntry, open_store
from tests.support.fakes import FakeAgent, connect, open_bridge
from tests.support.fuzz_targets import (
    CAP,
    EXAMPLES,
    Filler,
    Item,
    Rig,
    Source,
    Stage,
    StageKey,
    WsClient,
    agent_program,
    client_program,
    cut,
    expect,
    finish,
    groups,
    hosted,
    id_key,
    json_value,
    long_minutes,
    noted,
    out_of_time,
    pieces_of,
    raw_line,
    record,
    render,
    run_example,
    run_for_share,
    split_lines,
)

if TYPE_CHECKING:
    from collections.abc import Callable

#: hypothesis examples per test in CI (20,000 in all)
CI_EXAMPLES: Final = {
    "framing": 8000,
    "codec": 8000,
    "client_stream": 1800,
    "agent_stream": 1500,
    "websocket": 700,
}
#: examples per call in a long run (each call draws fresh ones)
LONG_BATCH: Final = 2000

settings.register_profile(
    "acp-bridge-fuzz",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "acp-bridge-fuzz-long", settings.get_profile("acp-bridge-fuzz"), max_examples=LONG_BATCH
)


def fuzz(name: str, test: Any) -> None:
    """
    Run a @given test with its CI example count, or for its share of a long run. A test that
    takes a ``host`` first runs hosted: its stages are kept across examples (see
    ``fuzz_targets.Host``).
    """
    if long_minutes() is None:
        profile = settings(settings.get_profile("acp-bridge-fuzz"), max_examples=CI_EXAMPLES[name])
    else:
        profile = settings.get_profile("acp-bridge-fuzz-long")
    configured = settings(profile)(test)
    # Thousands of examples: debug logs (the suite's default) would cost more than they tell.
    configure_logging(level="warning", fmt="json", stream=sys.stderr)
    before, started = EXAMPLES[name], time.monotonic()
    if "host" in inspect.signature(test).parameters:
        run_for_share(name, lambda: hosted(configured))
    else:
        run_for_share(name, configured)
    took = time.monotonic() - started
    print(f"\nfuzz {name}: {EXAMPLES[name] - before:,} examples in {took:.1f} s")


def program_bytes(low: int, high: int) -> st.SearchStrategy[bytes]:
    """The bytes a program is built from (hypothesis' own sizes are too small for that)."""
    return st.integers(low, high).flatmap(lambda n: st.binary(min_size=n, max_size=n))


# -- framing ---------------------------------------------------------------------------------


def framing_case(data: bytes) -> tuple[bytes, list[int], int, bool]:
    src = Source(data)
    cap = src.pick((16, 1, 2, 64, CAP))
    tokens = (b"\n", b"x", b"\r\n", b"\r", b"xxxxxxx", b"\n\n", b"{}", b"\xff")
    blob = bytearray()
    for _ in range(src.below(48)):
        kind = src.below(8)
        if kind == 7:
            blob += b"y" * (cap + src.below(3) - 1)  # around the cap
        elif kind == 6:
            blob += src.blob(16)
        elif kind == 5:
            blob += raw_line(src)
        else:
            blob += src.pick(tokens)
    cuts = [src.below(4096) for _ in range(src.below(12))]
    return bytes(blob), cuts, cap, src.rare(2)


@given(case=st.binary(min_size=192, max_size=192).map(framing_case))
def _framing(case):
    if out_of_time():
        return
    EXAMPLES["framing"] += 1
    blob, cuts, cap, as_bytearray = case
    decoder = LineDecoder(max_line_bytes=cap)
    out: list[bytes | Oversize] = []
    for piece in cut(blob, cuts):
        out += decoder.feed(bytearray(piece) if as_bytearray else piece)
        assert decoder.pending <= cap  # an unfinished line never holds more than the cap
    last = decoder.feed_eof()
    *complete, rest = blob.split(b"\n")
    expected = [Oversize(len(x)) if len(x) > cap else x for x in complete if x and x != b"\r"]
    assert out == expected
    assert last == (Oversize(len(rest)) if len(rest) > cap else rest or None)
    assert decoder.feed_eof() is None  # and it was reset


def test_fuzz_line_framing():
    """Any bytes, cut anywhere, any cap: the decoder yields exactly the lines there are."""
    fuzz("framing", _framing)


# -- codec -------------------------------------------------------------------------------------


def codec_case(data: bytes) -> list[bytes]:
    src = Source(data)
    return [
        render(json_value(src, 10), ascii_only=not src.rare(3)),
        raw_line(src),
        render([json_value(src, 4), json_value(src, 4)], ascii_only=True),
    ]


@given(texts=st.binary(min_size=96, max_size=96).map(codec_case))
def _codec(texts):
    if out_of_time():
        return
    EXAMPLES["codec"] += 1
    codes: set[int] = set()
    for text in texts:
        try:
            decoded = loads(text)
        except JsonRpcError as exc:
            codes.add(exc.code)
            continue
        classify(decoded)
        line = dumps(decoded)
        assert line.endswith(b"\n")
        assert b"\n" not in line[:-1]
        line.decode("utf-8")
        assert loads(line) == decoded
    assert codes <= {-32700}


def test_fuzz_codec():
    """What ``loads`` accepts, ``dumps`` writes back as one UTF-8 line that reads the same."""
    fuzz("codec", _codec)


def test_codec_refuses_what_it_could_not_write_back():
    """Regression: NaN, 1e400 and nesting near the recursion limit crashed the bridge on
    ``dumps``; a lone surrogate escape crashed it on the UTF-8 encoding."""
    for text in (
        b"[NaN]",
        b"[-Infinity]",
        b"[1e400]",
        b"[" * 990 + b"]" * 990,
        b"[" * 129 + b"]" * 129,
    ):
        with pytest.raises(JsonRpcError) as refused:
            loads(text)
        assert refused.value.code == -32700
    deep = b"[" * 128 + b"]" * 128
    assert dumps(loads(deep)) == deep + b"\n"
    assert dumps(loads(b'["\\ud800",1e-400,1e308]')) == b'["\\ud800",0.0,1e+308]\n'


# -- client → bridge over a stream -----------------------------------------------------------


def check_client_oracle(client: Any, lines: list[bytes], *, cap: int | None = CAP) -> None:
    """Exactly one answer per request-shaped line, one id-null error per non-message."""
    expected: collections.Counter[tuple[str, Any]] = collections.Counter()
    nulls = 0
    for line in lines:
        e = expect(line, cap=cap, client=True)
        if e.answer is not None:
            expected[id_key(e.answer)] += 1
        nulls += e.null_error
    got = +client.responses
    assert got == expected, f"per id: missing {expected - got}, unexpected {got - expected}"
    assert client.null_errors == nulls


POLICY_NAMES: Final = ("ok", "ignore", "error", "twice", "garbage")


@attrs.frozen
class ClientCase:
    program: list[Item]
    policies: list[str]
    key: StageKey


def client_case(data: bytes) -> ClientCase:
    src = Source(data)
    names = ("a", "b") if not src.rare(3) else ("a",)
    policies = [src.pick(POLICY_NAMES) for _ in range(1 + src.below(3))]
    store = src.rare(3)
    traced = src.rare(4)
    # a big cap lets deep and long lines through to the dispatcher and the trace
    cap = 1 << 16 if traced or src.rare(4) else CAP
    return ClientCase(
        program=client_program(data[8:]),
        policies=policies,
        key=StageKey(names=names, store=store, traced=traced, cap=cap),
    )


async def client_body(case: ClientCase, stage: Stage) -> None:
    rig = await stage.open_rig(case.policies)
    filler = Filler(rig.refs(), serial=rig.serial)
    lines = []
    for group in groups(case.program):
        written = [filler.line(step) for step in group]
        for piece in pieces_of(written, group):
            await rig.client.write(piece)
        lines += written
        if group[-1].settle:
            await rig.settle()
        else:
            await rig.client.flush()
    await rig.quiesce()
    assert not rig.violations(), rig.violations()
    check_client_oracle(rig.client, split_lines(b"".join(lines)), cap=case.key.cap)
    await finish(rig)


@given(case=program_bytes(16, 600).map(client_case))
def _client_stream(host, case):
    noted(
        "client_stream", lambda: run_example(host, case.key, functools.partial(client_body, case))
    )


def test_fuzz_client_stream():
    """Fuzzed client lines in any pieces, while agents answer, ask, wait and crash."""
    fuzz("client_stream", _client_stream)


# -- agents → bridge -------------------------------------------------------------------------


@attrs.frozen
class AgentCase:
    program: list[Item]
    policies: list[str]
    key: StageKey


def agent_case(data: bytes) -> AgentCase:
    src = Source(data)
    policies = [src.pick(POLICY_NAMES) for _ in range(1 + src.below(3))]
    return AgentCase(
        program=agent_program(data[4:]),
        policies=policies,
        key=StageKey(store=src.rare(3)),
    )


async def agent_body(case: AgentCase, stage: Stage) -> None:
    rig = await stage.open_rig(case.policies)
    client_filler = Filler(rig.refs(), serial=rig.serial)
    fillers = {
        name: Filler(rig.agent_refs(name), serial=rig.serial, prefix="z") for name in rig.agents
    }
    client_lines: list[bytes] = []
    for group in groups(case.program):
        who = group[0].agent
        if who == "client":
            client_lines.append(client_filler.line(group[0]))
            await rig.client.write(client_lines[-1])
        else:
            await write_agent_lines(rig, who, group, fillers[who])
        if group[-1].settle:
            await rig.settle()
        else:
            await rig.client.flush()
    await rig.quiesce()
    assert not rig.violations(), rig.violations()
    check_client_oracle(rig.client, split_lines(b"".join(client_lines)))
    await finish(rig)


async def write_agent_lines(rig: Rig, name: str, group: list[Item], filler: Filler) -> None:
    """An agent writes fuzzed lines on its stdout (whole, between its own messages)."""
    agent = rig.agents[name]
    if not agent.lives:
        return
    life = agent.life
    steps = [step for step in group if step.agent == name]
    written = [filler.line(step) for step in steps]
    for line in split_lines(b"".join(written)):
        e = expect(line, cap=rig.stage.key.cap, client=False)
        if e.answer is not None:
            life.asked[id_key(e.answer)] += 1
    async with life.lock:
        for piece in pieces_of(written, steps):
            record(f"{name}>", piece)
            if life.ended:
                break
            try:
                await life.send.send_all(piece)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break


@given(case=program_bytes(16, 600).map(agent_case))
def _agent_stream(host, case):
    noted("agent_stream", lambda: run_example(host, case.key, functools.partial(agent_body, case)))


def test_fuzz_agent_stream():
    """Fuzzed agent lines (requests, updates, responses to the bridge's own requests,
    garbage) while the client prompts, cancels and answers in its own ways."""
    fuzz("agent_stream", _agent_stream)


# -- client → bridge over WebSocket ----------------------------------------------------------


async def ws_body(case: ClientCase, stage: Stage) -> None:
    rig = await stage.open_rig(case.policies)
    filler = Filler(rig.refs(), serial=rig.serial)
    frames = []
    for step in case.program:
        data = filler.line(step, newline=False)
        await rig.client.write(data)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            pass  # sent as a binary frame: ignored
        else:
            frames.append(data)
        if step.settle:
            await rig.settle()
        else:
            await rig.client.flush()
    await rig.quiesce()
    assert not rig.violations(), rig.violations()
    check_client_oracle(rig.client, frames, cap=None)
    await finish(rig)
    if stage.rig is None:  # it disconnected: with a close handshake
        assert isinstance(rig.client, WsClient)
        assert rig.client.close_code == 1000, rig.client.close_code


@given(case=program_bytes(16, 600).map(client_case))
def _websocket(host, case):
    key = attrs.evolve(case.key, websocket=True, traced=False, store=False)
    noted("websocket", lambda: run_example(host, key, functools.partial(ws_body, case)))


def test_fuzz_websocket():
    """Fuzzed client messages, one per WebSocket frame (binary when not UTF-8)."""
    fuzz("websocket", _websocket)


def byte_targets() -> dict[str, Callable[[bytes], None]]:
    """Each fuzz test as a function of raw bytes (what atheris feeds): same builders, same
    checks, a fresh bridge per input."""
    return {
        "framing": lambda data: _framing.hypothesis.inner_test(framing_case(data)),
        "codec": lambda data: _codec.hypothesis.inner_test(codec_case(data)),
        "client_stream": lambda data: _client_stream.hypothesis.inner_test(None, client_case(data)),
        "agent_stream": lambda data: _agent_stream.hypothesis.inner_test(None, agent_case(data)),
        "websocket": lambda data: _websocket.hypothesis.inner_test(None, client_case(data)),
    }


# -- regressions: what the fuzzers found --------------------------------------------------------

REGRESSION_TIMEOUT: Final = 10


async def test_lines_that_could_not_be_written_back_are_parse_errors_and_the_bridge_lives():
    """Regression (client → bridge): NaN, 1e400 and nesting near Python's recursion limit
    were accepted, then crashed the bridge when forwarded (``dumps``); a lone surrogate escape
    crashed it on the UTF-8 encoding. Now: parse errors, and the surrogate passes as is."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with open_bridge({"a": agent}) as (client, _):
            sid = await client.new_session()
            head = b'{"jsonrpc":"2.0","id":"x","method":"_x/echo","params":{"sessionId":"%s","v":'
            for value in (b"NaN", b"-Infinity", b"1e400", b"[" * 985 + b"]" * 985):
                await client.send_raw(head % sid.encode() + value + b"}}\n")
                refused = await client.wait_for(lambda m: m.get("id", 0) is None)
                assert refused["error"]["code"] == -32700
                client.received.remove(refused)
            echoed = await client.request("_x/echo", {"sessionId": sid, "v": "\ud800"})
            assert echoed["result"]["params"]["v"] == "\ud800"
            answer = await client.prompt(sid, "count 2")
            assert answer["result"] == {"stopReason": "end_turn"}
            assert client.updates(sid) == ["a:s1:0", "a:s1:1"]


async def test_an_agent_queue_full_error_carries_the_clients_own_id():
    """Regression: a request that found the agent's queue full was answered with the id the
    bridge had minted for the agent link, not the client's (the client waited forever)."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with open_bridge({"a": agent}, agent_queue=1) as (client, _):
            sid = await client.new_session()
            await client.prompt(sid, "stall")  # the agent stops reading its stdin
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "count 1"}]}
            sent = [f"p{i}" for i in range(8)]  # more than the agent, its writer and queue take
            for req_id in sent:
                await client.send(
                    {"jsonrpc": "2.0", "id": req_id, "method": "session/prompt", "params": prompt}
                )
            await trio.testing.wait_all_tasks_blocked()
            errors = {m["id"] for m in client.received if "error" in m}
            assert errors, client.received
            assert errors <= set(sent), client.received


async def test_cancel_after_resuming_on_the_same_connection_settles_the_shown_permission():
    """Regression: ``session/resume`` of a session the connection already had forgot the
    permission requests it was being shown, so a later ``session/cancel`` did not settle
    them and the cancelled turn hung until the approval deadline (60 s)."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with open_bridge({"a": agent}) as (client, _), trio.open_nursery() as nursery:
            sid = await client.new_session()
            turn: list[dict[str, Any]] = []
            ended = trio.Event()

            async def prompt() -> None:
                turn.append(await client.prompt(sid, "permission"))
                ended.set()

            nursery.start_soon(prompt)
            await client.agent_requests.receive()  # shown; the user says nothing
            resume = {"sessionId": sid, "cwd": "/w", "mcpServers": []}
            resumed = await client.call("session/resume", resume)
            assert resumed["_meta"]["acp_bridge"]["pending"]
            await client.notify("session/cancel", {"sessionId": sid})
            await ended.wait()
            assert turn[0]["result"] == {"stopReason": "cancelled"}
            [outcome] = [m for m in agent.received if m.get("id") == 100]
            assert outcome["result"] == {"outcome": {"outcome": "cancelled"}}


async def test_values_of_the_wrong_type_where_keys_go_are_refused_not_fatal():
    """Regression: a list or object where the bridge looks a value up in a table (log level,
    ``$/cancel_request`` ids from either side, a prompt block's type, an update's kind)
    raised TypeError (unhashable) and ended the connection, or on the agent side the
    bridge."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with open_bridge({"a": agent}) as (client, _):
            sid = await client.new_session()
            bad = await client.request("_acp_bridge/set_log_level", {"level": ["debug"]})
            assert bad["error"]["code"] == -32602
            await client.notify("$/cancel_request", {"requestId": [1]})
            block = {"type": ["image"], "text": "count 1"}
            odd = await client.request("session/prompt", {"sessionId": sid, "prompt": [block]})
            assert odd["result"] == {"stopReason": "end_turn"}
            update = {"sessionUpdate": ["current_mode_update"], "currentModeId": "x"}
            await agent.write(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": sid, "update": update},
                }
            )
            await agent.write(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": {"id": 1}}}
            )
            answer = await client.prompt(sid, "count 2")
            assert answer["result"] == {"stopReason": "end_turn"}
            assert client.updates(sid) == ["a:s1:0", "a:s1:1"]


async def test_the_wire_trace_keeps_a_line_too_deep_to_parse_as_text():
    """Regression: a traced line nested thousands deep (or ~600 deep once a secret is
    known) raised RecursionError in the trace writer, which ended a ``--trace`` bridge."""
    deep = b"[" * 5000 + b"]" * 5000
    setup = b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"mcpServers":%s}}' % deep
    redactor = Redactor()
    redactor.add("secret-value-123")
    for data in (deep, b"[" * 700 + b"]" * 700, setup):
        line = format_record(_Message(0.0, "client:x", "in", data), redactor)
        assert json.loads(line)["msg"] == {"raw": data.decode()}
    with trio.fail_after(REGRESSION_TIMEOUT):
        out = io.BytesIO()
        trace = WireTrace(out, redactor=redactor)
        out.close = lambda: None  # type: ignore[method-assign]  # read it afterwards
        async with trio.open_nursery() as nursery:
            await nursery.start(trace.run)
            trace("client:x", "in", setup)
            await trace.wait_flushed()
            trace.close()
        assert json.loads(out.getvalue())["msg"] == {"raw": setup.decode()}


async def test_a_malformed_error_is_relayed_as_a_well_formed_one_both_ways():
    """Regression: an agent's ``"error": null`` (or a client's ``"error": "no"``) was relayed
    as is: the other side got a response that is neither a result nor an error."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with open_bridge({"a": agent}) as (client, _):
            sid = await client.new_session()
            wait = {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
            await client.send(
                {"jsonrpc": "2.0", "id": "w", "method": "session/prompt", "params": wait}
            )
            await client.wait_for(lambda m: "waiting" in json.dumps(m))
            forwarded = [m for m in agent.received if m.get("method") == "session/prompt"][-1]
            await agent.write({"jsonrpc": "2.0", "id": forwarded["id"], "error": None})
            answer = await client.wait_for(lambda m: m.get("id") == "w")
            assert answer["error"]["code"] == -32603
            assert answer["error"]["data"] == {"error": None}
            await client.notify("session/cancel", {"sessionId": sid})
            ask = {"sessionId": sid, "prompt": [{"type": "text", "text": "permission"}]}
            await client.send(
                {"jsonrpc": "2.0", "id": "p", "method": "session/prompt", "params": ask}
            )
            shown = await client.agent_requests.receive()
            await client.send({"jsonrpc": "2.0", "id": shown["id"], "error": "no"})
            await client.wait_for(lambda m: m.get("id") == "p")
            [relayed] = [m for m in agent.received if m.get("id") == 100 and "method" not in m]
            assert relayed["error"]["code"] == -32603
            assert relayed["error"]["data"] == {"error": "no"}


async def test_a_duplicate_request_id_from_an_agent_never_reaches_its_next_process():
    """Regression: an agent that reused the id of a request still in flight hid the first
    from the bridge's tables; after the agent died, the client's late answer to the first was
    delivered to the restarted agent, whose own request with that id it would have settled."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with open_bridge({"a": agent}, restart_backoff_initial=0.0) as (client, _):
            sid = await client.new_session()
            params = {
                "sessionId": sid,
                "toolCall": {"toolCallId": "t", "title": "x"},
                "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"}],
            }
            ask = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "session/request_permission",
                "params": params,
            }
            await agent.write(ask)
            await agent.write(ask)
            shown = await client.agent_requests.receive()
            await trio.testing.wait_all_tasks_blocked()
            [refused] = [m for m in agent.received if m.get("id") == 7]
            assert refused["error"]["code"] == -32600
            assert "error" in await client.prompt(sid, "crash")
            before = len(agent.received)
            await client.new_session()  # the agent's next process
            allow = {"outcome": {"outcome": "selected", "optionId": "yes"}}
            await client.send({"jsonrpc": "2.0", "id": shown["id"], "result": allow})
            await client.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            assert agent.starts == 2
            assert not [m for m in agent.received[before:] if m.get("id") == 7]


def _read_and_permission_asks(sid: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """An agent's two requests of a client, by the agent's ids: a file read, a permission."""
    permission = {
        "sessionId": sid,
        "toolCall": {"toolCallId": "t", "title": "x"},
        "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"}],
    }
    return {
        "r": ("fs/read_text_file", {"sessionId": sid, "path": "/w/x"}),
        "p": ("session/request_permission", permission),
    }


async def test_a_request_the_agent_withdrew_is_answered_even_if_the_client_never_does():
    """Regression: an agent's ``$/cancel_request`` for a request shown to the client was only
    relayed; a client that did not answer the withdrawn request (honouring the cancel is
    optional) left the agent waiting forever (the fuzzer: an ``ignore`` client and a
    ``terminal/output`` withdrawn). Now the bridge answers it at once (-32800; a permission:
    ``cancelled``), exactly once: the client's late answer is dropped."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with open_bridge({"a": agent}) as (client, bridge):
            sid = await client.new_session()
            asks = _read_and_permission_asks(sid)
            shown_ids = []
            for agent_id, (method, params) in asks.items():
                ask = {"jsonrpc": "2.0", "id": agent_id, "method": method, "params": params}
                await agent.write(ask)
                shown = await client.agent_requests.receive()
                shown_ids.append(shown["id"])
                cancel = {"requestId": agent_id}
                await agent.write(
                    {"jsonrpc": "2.0", "method": "$/cancel_request", "params": cancel}
                )
                relayed = {"requestId": shown["id"]}
                await client.wait_for(
                    lambda m, relayed=relayed: (
                        m.get("method") == "$/cancel_request" and m["params"] == relayed
                    )
                )
            await trio.testing.wait_all_tasks_blocked()  # the client does not answer

            def answers() -> tuple[list[dict[str, Any]], ...]:
                return tuple([m for m in agent.received if m.get("id") == i] for i in asks)

            read, allow = answers()
            assert [m.get("error", {}).get("code") for m in read] == [-32800], read
            assert [m.get("result") for m in allow] == [{"outcome": {"outcome": "cancelled"}}]
            assert not bridge.hub.agents["a"].inflight
            for shown_id in shown_ids:  # late: dropped
                await client.send({"jsonrpc": "2.0", "id": shown_id, "result": {}})
            await trio.testing.wait_all_tasks_blocked()
            assert answers() == (read, allow)
            decisions = [(r.decision, r.source) for r in bridge.hub.audit.recent]
            assert decisions == [("cancelled", "agent_cancel"), ("refused", "late_answer")]
            answer = await client.prompt(sid, "count 1")
            assert answer["result"] == {"stopReason": "end_turn"}


async def test_a_parked_request_the_agent_withdrew_is_answered_and_not_shown_again():
    """Regression: a request parked for the next connection (its client dropped within
    ``detach_grace``) and then withdrawn by the agent was not answered until the grace
    period ended, and the connection that took the session back was shown it anyway."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with (
            open_bridge({"a": agent}, detach_grace=3600) as (client, bridge),
            trio.open_nursery() as nursery,
        ):
            sid = await client.new_session()
            asks = _read_and_permission_asks(sid)
            for agent_id, (method, params) in asks.items():
                ask = {"jsonrpc": "2.0", "id": agent_id, "method": method, "params": params}
                await agent.write(ask)
                await client.agent_requests.receive()
            await client.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            [session] = bridge.hub.sessions
            assert len(session.parked) == 2
            for agent_id in asks:
                cancel = {"requestId": agent_id}
                await agent.write(
                    {"jsonrpc": "2.0", "method": "$/cancel_request", "params": cancel}
                )
            await trio.testing.wait_all_tasks_blocked()
            read, allow = ([m for m in agent.received if m.get("id") == i] for i in asks)
            assert [m.get("error", {}).get("code") for m in read] == [-32800], read
            assert [m.get("result") for m in allow] == [{"outcome": {"outcome": "cancelled"}}]
            assert not session.parked
            other = await connect(bridge, nursery)
            await other.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            await trio.testing.wait_all_tasks_blocked()
            assert not [
                m
                for m in other.received
                if m.get("method") in ("fs/read_text_file", "session/request_permission")
            ]
            nursery.cancel_scope.cancel()


async def test_an_agent_reusing_the_id_of_a_parked_request_is_refused():
    """Regression: the duplicate-id check looked only at requests shown to a client. A
    request parked for the next connection (its client dropped) was not among them, so an
    agent reusing its id got the second request through; when the session was taken back,
    showing the parked one overwrote the second's entry: one of them was never answered."""
    agent = FakeAgent("a")
    with trio.fail_after(REGRESSION_TIMEOUT):
        async with (
            open_bridge({"a": agent}, detach_grace=3600) as (client, bridge),
            trio.open_nursery() as nursery,
        ):
            sid = await client.new_session()
            method, params = _read_and_permission_asks(sid)["r"]
            ask = {"jsonrpc": "2.0", "id": 5, "method": method, "params": params}
            await agent.write(ask)
            await client.agent_requests.receive()
            await client.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            [session] = bridge.hub.sessions
            assert len(session.parked) == 1
            await agent.write(ask)  # the same id again, while the first is parked
            await trio.testing.wait_all_tasks_blocked()
            [refused] = [m for m in agent.received if m.get("id") == 5]
            assert refused["error"]["code"] == -32600
            assert len(session.parked) == 1
            other = await connect(bridge, nursery)
            await other.call("session/resume", {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            shown = await other.agent_requests.receive()
            await other.send({"jsonrpc": "2.0", "id": shown["id"], "result": {"content": "x"}})
            await trio.testing.wait_all_tasks_blocked()
            answers = [m for m in agent.received if m.get("id") == 5]
            assert [("error" in m, m.get("result")) for m in answers] == [
                (True, None),
                (False, {"content": "x"}),
            ]
            assert not bridge.hub.agents["a"].inflight
            nursery.cancel_scope.cancel()


class _Overlap:
    """A stand-in for the store's connection that notices two transactions at once."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.both_inside = threading.Barrier(2, timeout=0.2)
        self.overlapped = False

    def __enter__(self) -> Any:
        try:
            self.both_inside.wait()  # passes only if the other thread is in a transaction too
            self.overlapped = True
        except threading.BrokenBarrierError:
            pass  # it was not: the writes take turns
        return self.conn.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.conn.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_the_store_takes_writes_from_two_threads():
    """Regression: the journal and the audit trail commit from different worker threads on
    one SQLite connection; two transactions at once raised ("cannot start a transaction
    within a transaction") and ended the bridge. Now the store's writes take turns."""
    store = open_store(":memory:")
    overlap = _Overlap(store._conn)
    store._conn = overlap  # type: ignore[assignment]
    failures: list[BaseException] = []

    def run(write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as exc:
            failures.append(exc)

    denied = AuditRecord(session="s", agent="a", decision="deny", source="x")
    threads = [
        threading.Thread(target=run, args=(lambda: store.append_audit([denied]),)),
        threading.Thread(
            target=run, args=(lambda: store.write(journal=[JournalEntry("s", 1, b"{}")]),)
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not overlap.overlapped
    assert failures == []
    assert len(store.audit()) == 1
    assert store.journal_bounds("s") == (1, 1)
    store.close()
