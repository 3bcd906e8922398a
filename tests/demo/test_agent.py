"""Tests for the bundled demo agent: in-process over memory streams, plus one SDK end-to-end run."""

from __future__ import annotations

import collections
import os
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from acp_bridge.demo.agent import run_demo_agent_stdio, serve_demo_agent
from acp_bridge.demo.script import DemoOptions, count_pieces
from acp_bridge.protocol.framing import LineDecoder
from acp_bridge.protocol.jsonrpc import dumps, loads

TIMEOUT = 10
FAST = DemoOptions(chunk_delay=0)
CWD = os.path.abspath(os.sep + "work-demo")
ALL_FS = {"fs": {"readTextFile": True, "writeTextFile": True}}


class Wire:
    """The test's end of the connection: writes NDJSON lines to the agent, reads its lines."""

    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self.stream = stream
        self._decoder = LineDecoder()
        self._lines: collections.deque[bytes] = collections.deque()
        self._next_id = 100

    async def send(self, msg: dict[str, Any]) -> None:
        await self.stream.send_all(dumps(msg))

    async def receive(self) -> dict[str, Any]:
        while not self._lines:
            data = await self.stream.receive_some()
            assert data, "the agent closed its stream"
            for line in self._decoder.feed(bytes(data)):
                assert isinstance(line, bytes)
                self._lines.append(line)
        msg: dict[str, Any] = loads(self._lines.popleft())
        return msg

    async def request(self, method: str, params: dict[str, Any] | None = None) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            msg["params"] = params
        await self.send(msg)
        return self._next_id

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def answer(self, request: dict[str, Any], result: Any) -> None:
        await self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    async def until_response(self, id_: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every message before the response to ``id_``, and that response."""
        before = []
        while True:
            msg = await self.receive()
            if msg.get("id") == id_ and "method" not in msg:
                return before, msg
            before.append(msg)

    async def until_request(self, method: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every message before the agent's next ``method`` request, and that request."""
        before = []
        while True:
            msg = await self.receive()
            if msg.get("method") == method and "id" in msg:
                return before, msg
            before.append(msg)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request that must succeed with nothing else arriving first; its result."""
        before, response = await self.until_response(await self.request(method, params))
        assert before == []
        assert "error" not in response, response
        return response["result"]

    async def call_error(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a request that must fail; the error code."""
        _, response = await self.until_response(await self.request(method, params))
        assert "result" not in response, response
        code: int = response["error"]["code"]
        return code

    async def new_session(self, cwd: str = CWD) -> str:
        id_ = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        _, response = await self.until_response(id_)
        commands = await self.receive()
        assert commands["params"]["update"]["sessionUpdate"] == "available_commands_update"
        session_id: str = response["result"]["sessionId"]
        return session_id

    async def prompt(self, session_id: str, text: str) -> int:
        prompt = [{"type": "text", "text": text}]
        return await self.request("session/prompt", {"sessionId": session_id, "prompt": prompt})


def updates(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``update`` objects of the ``session/update`` notifications among ``messages``."""
    assert all(m.get("method") == "session/update" for m in messages), messages
    return [m["params"]["update"] for m in messages]


def chunks(messages: list[dict[str, Any]]) -> list[str]:
    return [
        u["content"]["text"]
        for u in updates(messages)
        if u["sessionUpdate"] == "agent_message_chunk"
    ]


def statuses(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(sessionUpdate, status) of the tool call updates among ``messages``."""
    return [
        (u["sessionUpdate"], u["status"])
        for u in updates(messages)
        if u["sessionUpdate"] in ("tool_call", "tool_call_update")
    ]


@pytest.fixture
def start_agent(nursery: trio.Nursery):
    """Start a demo agent in-process; return the test's :class:`Wire` to it."""

    async def start(
        options: DemoOptions = FAST,
        *,
        capabilities: dict[str, Any] | None = None,
        initialize: bool = True,
    ) -> Wire:
        client_end, agent_end = trio.testing.memory_stream_pair()
        nursery.start_soon(partial(serve_demo_agent, agent_end, agent_end, options=options))
        wire = Wire(client_end)
        if initialize:
            caps = ALL_FS if capabilities is None else capabilities
            params = {"protocolVersion": 1, "clientCapabilities": caps}
            await wire.call("initialize", params)
        return wire

    return start


# -- Command line --------------------------------------------------------------------------------


def test_bad_usage_returns_2(capsys):
    """A bad option is reported on stderr, with exit status 2 and nothing on stdout."""
    assert run_demo_agent_stdio(["--chunk-delay", "-1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--chunk-delay" in captured.err


# -- Connection setup ------------------------------------------------------------------------------


async def test_initialize_answers_version_1_with_capabilities(start_agent):
    """initialize gets version 1, the advertised capabilities, agentInfo and no auth methods."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(initialize=False)
        result = await wire.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert result == {
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
            "sessionCapabilities": {"list": {}, "close": {}, "resume": {}},
            "mcpCapabilities": {"http": True, "sse": False},
        },
        "agentInfo": {
            "name": "acp-bridge-demo",
            "title": "acp-bridge demo agent",
            "version": "0.1.0",
        },
        "authMethods": [],
    }


async def test_initialize_with_a_newer_version_answers_1(start_agent):
    """A client asking for v2 is told the latest we speak: 1."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(initialize=False)
        result = await wire.call("initialize", {"protocolVersion": 2})
    assert result["protocolVersion"] == 1


async def test_initialize_twice_or_without_version_is_rejected(start_agent):
    """initialize needs an integer version and happens once."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(initialize=False)
        assert await wire.call_error("initialize", {"protocolVersion": "1"}) == -32602
        await wire.call("initialize", {"protocolVersion": 1})
        assert await wire.call_error("initialize", {"protocolVersion": 1}) == -32600


async def test_requests_before_initialize_are_invalid(start_agent):
    """Anything but initialize first is an invalid request."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(initialize=False)
        assert await wire.call_error("session/new", {"cwd": CWD, "mcpServers": []}) == -32600


async def test_no_load_option_hides_session_load(start_agent):
    """--no-load: loadSession is false and session/load is an unknown method."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(
            initialize=False, options=DemoOptions(chunk_delay=0, load_session=False)
        )
        result = await wire.call("initialize", {"protocolVersion": 1})
        assert result["agentCapabilities"]["loadSession"] is False
        session_id = await wire.new_session()
        load = {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
        assert await wire.call_error("session/load", load) == -32601


# -- JSON-RPC edge cases ---------------------------------------------------------------------------


async def test_unknown_method_is_method_not_found(start_agent):
    """An unknown request gets -32601."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        assert await wire.call_error("_demo/nothing", {}) == -32601


async def test_unparseable_line_gets_parse_error_with_null_id(start_agent):
    """A line that is not JSON gets -32700 with id null, and the agent keeps serving."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        await wire.stream.send_all(b"{not json\n")
        response = await wire.receive()
        assert response["id"] is None
        assert response["error"]["code"] == -32700
        assert await wire.call("session/list", {}) == {"sessions": []}


async def test_invalid_envelope_gets_invalid_request(start_agent):
    """JSON that is not JSON-RPC 2.0 gets -32600, with its id when it has a usable one."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        await wire.send({"jsonrpc": "1.0", "id": 7, "method": "session/list"})
        assert (await wire.receive())["error"]["code"] == -32600
        await wire.stream.send_all(b"[1, 2]\n")
        response = await wire.receive()
        assert (response["id"], response["error"]["code"]) == (None, -32600)


async def test_unknown_notifications_are_ignored(start_agent):
    """Unknown notifications (and cancels for unknown sessions) get no answer."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        await wire.notify("_demo/ping", {})
        await wire.notify("session/cancel", {"sessionId": "nope"})
        assert await wire.call("session/list", {}) == {"sessions": []}


async def test_serve_returns_at_eof():
    """serve_demo_agent returns once the client closes its side."""
    client_end, agent_end = trio.testing.memory_stream_pair()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(serve_demo_agent, agent_end, agent_end, options=FAST))
            wire = Wire(client_end)
            await wire.call("initialize", {"protocolVersion": 1})
            await client_end.send_eof()


# -- Sessions --------------------------------------------------------------------------------------


async def test_new_session_mints_ids_and_announces_commands_after_the_response(start_agent):
    """session/new answers an id with modes and config options, then the commands update."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(DemoOptions(chunk_delay=0, session_prefix="s-"))
        id_ = await wire.request("session/new", {"cwd": CWD, "mcpServers": []})
        before, response = await wire.until_response(id_)
        commands = await wire.receive()
        second = await wire.new_session()
    assert before == []
    first = response["result"]["sessionId"]
    run = first.removeprefix("s-").removesuffix("-1")
    assert first == f"s-{run}-1"
    assert len(run) == 12  # (a run's random part: 48 bits in hex)
    assert response["result"] == {
        "sessionId": first,
        "modes": {
            "currentModeId": "ask",
            "availableModes": [
                {"id": "ask", "name": "Ask", "description": "Answer questions"},
                {"id": "code", "name": "Code", "description": "Pretend to write code"},
            ],
        },
        "configOptions": [
            {
                "id": "style",
                "name": "Reply style",
                "description": "How the demo agent formats its echo",
                "type": "select",
                "currentValue": "plain",
                "options": [
                    {"value": "plain", "name": "Plain"},
                    {"value": "fancy", "name": "Fancy"},
                ],
            }
        ],
    }
    assert commands["method"] == "session/update"
    assert commands["params"]["sessionId"] == first
    update = commands["params"]["update"]
    assert update["sessionUpdate"] == "available_commands_update"
    assert [c["name"] for c in update["availableCommands"]] == [
        "count",
        "slow",
        "write",
        "read",
        "fail",
        "env",
    ]
    assert second == f"s-{run}-2"


async def test_session_ids_are_unique_across_runs(start_agent):
    """Two processes of the demo agent (a bridge restarted on the same store) mint no id
    twice: the second run's sessions never take a stored session's id."""
    with trio.fail_after(TIMEOUT):
        first_run = await start_agent()
        second_run = await start_agent()
        ids = [await first_run.new_session(), await first_run.new_session()]
        ids += [await second_run.new_session(), await second_run.new_session()]
    assert len(set(ids)) == 4
    assert all(sid.startswith("demo-") for sid in ids)


async def test_new_session_needs_an_absolute_cwd(start_agent):
    """A relative cwd is invalid params."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        assert await wire.call_error("session/new", {"cwd": "rel", "mcpServers": []}) == -32602


async def test_session_limit(start_agent):
    """Past max_sessions, session/new fails until a session is closed."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(DemoOptions(chunk_delay=0, max_sessions=1))
        first = await wire.new_session()
        assert await wire.call_error("session/new", {"cwd": CWD, "mcpServers": []}) == -32603
        await wire.call("session/close", {"sessionId": first})
        assert await wire.new_session() == first.removesuffix("-1") + "-2"


async def test_unknown_session_is_resource_not_found(start_agent):
    """Every session method answers -32002 for an id the agent never minted."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        unknown = {"sessionId": "demo-9", "cwd": CWD, "mcpServers": []}
        for method, extra in [
            ("session/prompt", {"prompt": []}),
            ("session/load", {}),
            ("session/resume", {}),
            ("session/close", {}),
            ("session/set_mode", {"modeId": "ask"}),
            ("session/set_config_option", {"configId": "style", "value": "plain"}),
        ]:
            assert await wire.call_error(method, {**unknown, **extra}) == -32002, method


async def test_set_mode_answers_then_announces_the_mode(start_agent):
    """A valid mode is answered {} and followed by current_mode_update; others are -32602."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        assert (
            await wire.call_error("session/set_mode", {"sessionId": session_id, "modeId": "yolo"})
            == -32602
        )
        assert (
            await wire.call("session/set_mode", {"sessionId": session_id, "modeId": "code"}) == {}
        )
        note = await wire.receive()
        load = {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
        resumed = await wire.call("session/resume", load)
    assert note["params"] == {
        "sessionId": session_id,
        "update": {"sessionUpdate": "current_mode_update", "currentModeId": "code"},
    }
    assert resumed["modes"]["currentModeId"] == "code"


async def test_set_config_option_returns_the_full_list(start_agent):
    """A valid style value comes back in the full list; a bad value or id is -32602."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        base = {"sessionId": session_id, "configId": "style"}
        result = await wire.call("session/set_config_option", {**base, "value": "fancy"})
        bad_value = await wire.call_error("session/set_config_option", {**base, "value": "loud"})
        bad_type = await wire.call_error(
            "session/set_config_option", {**base, "type": "boolean", "value": True}
        )
        bad_id = await wire.call_error(
            "session/set_config_option", {**base, "configId": "nope", "value": "plain"}
        )
        _, response = await wire.until_response(await wire.prompt(session_id, "hi"))
    [option] = result["configOptions"]
    assert (option["id"], option["currentValue"]) == ("style", "fancy")
    assert (bad_value, bad_type, bad_id) == (-32602, -32602, -32602)
    assert response["result"] == {"stopReason": "end_turn"}


async def test_list_filters_by_cwd_and_close_forgets(start_agent):
    """session/list shows id, cwd and (after a prompt) a title; close removes the session."""
    other = os.path.join(CWD, "other")
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        first = await wire.new_session()
        second = await wire.new_session(other)
        await wire.until_response(await wire.prompt(first, "  hello\n  there "))
        listed = await wire.call("session/list", {})
        filtered = await wire.call("session/list", {"cwd": other})
        assert await wire.call("session/close", {"sessionId": first}) == {}
        after_close = await wire.call("session/list", {})
        code = await wire.call_error("session/prompt", {"sessionId": first, "prompt": []})
    assert listed == {
        "sessions": [
            {"sessionId": first, "cwd": CWD, "title": "hello there"},
            {"sessionId": second, "cwd": other},
        ]
    }
    assert filtered == {"sessions": [{"sessionId": second, "cwd": other}]}
    assert after_close == filtered
    assert code == -32002


# -- Prompt turns ----------------------------------------------------------------------------------


async def test_prompt_streams_plan_and_words_before_end_turn(start_agent):
    """The default turn: a plan, the echo word by word, the finished plan, then end_turn."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        prompt = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
        id_ = await wire.request("session/prompt", {"sessionId": session_id, "prompt": prompt})
        before, response = await wire.until_response(id_)
    assert {m["params"]["sessionId"] for m in before} == {session_id}
    plan = [
        {"content": "Read the prompt", "priority": "high", "status": "completed"},
        {"content": "Echo it back", "priority": "medium", "status": "in_progress"},
    ]
    done = [plan[0], {**plan[1], "status": "completed"}]
    assert updates(before) == [
        {"sessionUpdate": "plan", "entries": plan},
        *(
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": word}}
            for word in ["You ", "said: ", "hello ", "world"]
        ),
        {"sessionUpdate": "plan", "entries": done},
    ]
    assert response == {"jsonrpc": "2.0", "id": id_, "result": {"stopReason": "end_turn"}}


async def test_fail_answers_the_prompt_with_an_internal_error(start_agent):
    """A prompt saying "fail" gets JSON-RPC error -32603 and no updates."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        before, response = await wire.until_response(await wire.prompt(session_id, "fail"))
    assert before == []
    assert response["error"]["code"] == -32603


async def test_prompt_must_be_a_list(start_agent):
    """A prompt that is not a list of blocks is invalid params."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        params = {"sessionId": session_id, "prompt": "hi"}
        assert await wire.call_error("session/prompt", params) == -32602


async def test_count_streams_numbered_chunks(start_agent):
    """count N streams N chunks."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        before, response = await wire.until_response(await wire.prompt(session_id, "count 4"))
    assert chunks(before) == ["1 ", "2 ", "3 ", "4"]
    assert response["result"] == {"stopReason": "end_turn"}


async def test_env_streams_a_variable_of_the_agents_environment(start_agent, monkeypatch):
    """env NAME answers NAME=VALUE from the agent's own environment, then end_turn."""
    monkeypatch.setenv("DEMO_ENV_PROBE", "a b  'c' $d")
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        before, response = await wire.until_response(
            await wire.prompt(session_id, "env DEMO_ENV_PROBE")
        )
    assert "".join(chunks(before)) == "DEMO_ENV_PROBE=a b  'c' $d"
    assert response["result"] == {"stopReason": "end_turn"}


async def test_slow_paces_chunks_by_the_chunk_delay(start_agent, autojump_clock):
    """slow streams 50 chunks, one chunk_delay apart."""
    with trio.fail_after(TIMEOUT * 10):
        wire = await start_agent(DemoOptions(chunk_delay=1))
        session_id = await wire.new_session()
        start = trio.current_time()
        before, response = await wire.until_response(await wire.prompt(session_id, "slow"))
    assert chunks(before) == count_pieces(50)
    assert trio.current_time() - start == 49
    assert response["result"] == {"stopReason": "end_turn"}


async def test_cancel_mid_slow_prompt_answers_cancelled(start_agent, autojump_clock):
    """session/cancel stops the streaming turn at once, and the prompt answers cancelled."""
    with trio.fail_after(TIMEOUT * 10):
        wire = await start_agent(DemoOptions(chunk_delay=1))
        session_id = await wire.new_session()
        start = trio.current_time()
        id_ = await wire.prompt(session_id, "slow")
        first = await wire.receive()
        await wire.notify("session/cancel", {"sessionId": session_id})
        before, response = await wire.until_response(id_)
        # The cancel arrived before the first delay ran out.
        assert trio.current_time() == start
        # The session is idle again: a new prompt runs normally.
        _, again = await wire.until_response(await wire.prompt(session_id, "hi"))
    assert chunks([first, *before]) == ["1 "]
    assert response["result"] == {"stopReason": "cancelled"}
    assert again["result"] == {"stopReason": "end_turn"}


async def test_close_cancels_the_running_turn(start_agent, autojump_clock):
    """session/close cancels the session's turn (it answers cancelled) and forgets it."""
    with trio.fail_after(TIMEOUT * 10):
        wire = await start_agent(DemoOptions(chunk_delay=1))
        session_id = await wire.new_session()
        id_ = await wire.prompt(session_id, "slow")
        await wire.receive()
        close = await wire.request("session/close", {"sessionId": session_id})
        messages = [await wire.receive(), await wire.receive()]
    assert {m["id"]: m["result"] for m in messages} == {
        close: {},
        id_: {"stopReason": "cancelled"},
    }


async def test_eof_cancels_running_turns_and_returns(autojump_clock):
    """At EOF, serve_demo_agent cancels the turns still running (no response) and returns."""
    client_end, agent_end = trio.testing.memory_stream_pair()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            options = DemoOptions(chunk_delay=1)
            nursery.start_soon(partial(serve_demo_agent, agent_end, agent_end, options=options))
            wire = Wire(client_end)
            await wire.call("initialize", {"protocolVersion": 1})
            session_id = await wire.new_session()
            await wire.prompt(session_id, "slow")
            first = await wire.receive()
            await client_end.send_eof()
    assert chunks([first]) == ["1 "]
    assert trio.current_time() == 0


async def test_sessions_run_concurrently_one_prompt_each(start_agent):
    """A second prompt while the first runs is refused; other sessions stream meanwhile."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        first = await wire.new_session()
        second = await wire.new_session()
        write = await wire.prompt(first, "write a.txt x")
        _, ask = await wire.until_request("session/request_permission")
        busy = await wire.call_error("session/prompt", {"sessionId": first, "prompt": []})
        # The first session is parked on the permission request; the second one still streams.
        before, response = await wire.until_response(await wire.prompt(second, "hi there"))
        assert "".join(chunks(before)) == "You said: hi there"
        assert response["result"] == {"stopReason": "end_turn"}
        await wire.notify("session/cancel", {"sessionId": first})
        await wire.answer(ask, {"outcome": {"outcome": "cancelled"}})
        _, cancelled = await wire.until_response(write)
    assert busy == -32600
    assert cancelled["result"] == {"stopReason": "cancelled"}


async def test_load_replays_history_before_the_response(start_agent):
    """session/load replays the user and agent messages, then answers with modes and options."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        await wire.until_response(await wire.prompt(session_id, "hello"))
        await wire.until_response(await wire.prompt(session_id, "count 2"))
        load = {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
        before, response = await wire.until_response(await wire.request("session/load", load))
        resumed = await wire.call("session/resume", load)
    assert [(u["sessionUpdate"], u["content"]["text"]) for u in updates(before)] == [
        ("user_message_chunk", "hello"),
        ("agent_message_chunk", "You said: hello"),
        ("user_message_chunk", "count 2"),
        ("agent_message_chunk", "1 2"),
    ]
    assert response["result"]["modes"]["currentModeId"] == "ask"
    assert response["result"]["configOptions"][0]["currentValue"] == "plain"
    assert resumed == response["result"]  # resume: same answer, no replay (call checks that)


async def test_history_is_capped(start_agent):
    """Only the newest max_history entries are kept for a replay."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(DemoOptions(chunk_delay=0, max_history=3))
        session_id = await wire.new_session()
        await wire.until_response(await wire.prompt(session_id, "one"))
        await wire.until_response(await wire.prompt(session_id, "two"))
        load = {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
        before, _ = await wire.until_response(await wire.request("session/load", load))
    assert [u["content"]["text"] for u in updates(before)] == [
        "You said: one",
        "two",
        "You said: two",
    ]


# -- Write flow ------------------------------------------------------------------------------------


async def start_write(wire: Wire, text: str = "write notes.txt hello world"):
    """Prompt a write; return (session id, prompt id, messages before the permission request,
    the permission request)."""
    session_id = await wire.new_session()
    id_ = await wire.prompt(session_id, text)
    before, ask = await wire.until_request("session/request_permission")
    return session_id, id_, before, ask


async def test_write_allowed_writes_through_the_client(start_agent):
    """Allowed: the agent asks, then calls fs/write_text_file, then completes the tool call."""
    path = os.path.join(CWD, "notes.txt")
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id, id_, before, ask = await start_write(wire)
        await wire.answer(ask, {"outcome": {"outcome": "selected", "optionId": "allow-once"}})
        between, write = await wire.until_request("fs/write_text_file")
        await wire.answer(write, None)
        after, response = await wire.until_response(id_)
    assert updates(before) == [
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "call-1",
            "title": "Write notes.txt",
            "kind": "edit",
            "status": "pending",
            "locations": [{"path": path}],
            "content": [{"type": "diff", "path": path, "newText": "hello world"}],
        }
    ]
    assert ask["id"] == 0  # the agent's own ids count from 0
    assert ask["params"] == {
        "sessionId": session_id,
        "toolCall": {  # with the diff: what the human (a client, the console) approves
            "toolCallId": "call-1",
            "title": "Write notes.txt",
            "kind": "edit",
            "status": "pending",
            "locations": [{"path": path}],
            "content": [{"type": "diff", "path": path, "newText": "hello world"}],
        },
        "options": [
            {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
            {
                "optionId": "allow-always",
                "name": "Always allow in this session",
                "kind": "allow_always",
            },
            {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
        ],
    }
    assert statuses(between) == [("tool_call_update", "in_progress")]
    assert write["id"] == 1
    assert write["params"] == {"sessionId": session_id, "path": path, "content": "hello world"}
    assert statuses(after) == [("tool_call_update", "completed")]
    assert "".join(chunks(after)) == "Wrote 11 characters to notes.txt."
    assert response["result"] == {"stopReason": "end_turn"}


async def test_write_allowed_always_is_remembered(start_agent):
    """After allow-always, the next write in the session does not ask again."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id, id_, _, ask = await start_write(wire)
        await wire.answer(ask, {"outcome": {"outcome": "selected", "optionId": "allow-always"}})
        _, write = await wire.until_request("fs/write_text_file")
        await wire.answer(write, {})
        await wire.until_response(id_)
        second = await wire.prompt(session_id, "write other.txt more")
        before, write = await wire.until_request("fs/write_text_file")
        await wire.answer(write, {})
        _, response = await wire.until_response(second)
    assert statuses(before) == [("tool_call", "pending"), ("tool_call_update", "in_progress")]
    assert response["result"] == {"stopReason": "end_turn"}


async def test_write_rejected_fails_the_tool_call(start_agent):
    """Rejected: no write, the tool call fails and a message says it was denied."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        _, id_, _, ask = await start_write(wire)
        await wire.answer(ask, {"outcome": {"outcome": "selected", "optionId": "reject-once"}})
        after, response = await wire.until_response(id_)
    assert statuses(after) == [("tool_call_update", "failed")]
    assert "".join(chunks(after)) == "Permission denied, so I did not write notes.txt."
    assert response["result"] == {"stopReason": "end_turn"}


async def test_write_permission_cancelled_ends_the_turn_cancelled(start_agent):
    """A cancelled permission outcome ends the turn with stopReason cancelled."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        _, id_, _, ask = await start_write(wire)
        await wire.answer(ask, {"outcome": {"outcome": "cancelled"}})
        after, response = await wire.until_response(id_)
    assert statuses(after) == [("tool_call_update", "failed")]
    assert response["result"] == {"stopReason": "cancelled"}


async def test_session_cancel_waits_for_the_permission_answer(start_agent):
    """After session/cancel the agent still waits for the client's answer, then treats any
    outcome as cancelled."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id, id_, _, ask = await start_write(wire)
        await wire.notify("session/cancel", {"sessionId": session_id})
        await trio.testing.wait_all_tasks_blocked()
        # Everything the agent sent so far arrives before this answer: no prompt response yet.
        before, _ = await wire.until_response(await wire.request("session/list", {}))
        assert before == []
        await wire.answer(ask, {"outcome": {"outcome": "selected", "optionId": "allow-once"}})
        after, response = await wire.until_response(id_)
    assert statuses(after) == [("tool_call_update", "failed")]
    assert response["result"] == {"stopReason": "cancelled"}


async def test_permission_error_from_the_client_fails_the_tool_call(start_agent):
    """The client answering the permission request with an error: the tool call fails."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        _, id_, _, ask = await start_write(wire)
        await wire.send(
            {"jsonrpc": "2.0", "id": ask["id"], "error": {"code": -32603, "message": "boom"}}
        )
        after, response = await wire.until_response(id_)
    assert statuses(after) == [("tool_call_update", "failed")]
    assert "".join(chunks(after)) == "The permission request failed (boom)."
    assert response["result"] == {"stopReason": "end_turn"}


async def test_write_without_client_support_says_so(start_agent):
    """A client without fs.writeTextFile is told so; no tool call, no request."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(capabilities={"fs": {"readTextFile": True}})
        session_id = await wire.new_session()
        before, response = await wire.until_response(await wire.prompt(session_id, "write a.txt x"))
    assert "".join(chunks(before)) == "This client can't write files, so I can't write a.txt."
    assert response["result"] == {"stopReason": "end_turn"}


async def test_write_outside_the_cwd_is_refused(start_agent):
    """A path escaping the session cwd is refused without asking."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        id_ = await wire.prompt(session_id, "write ../x.txt hi")
        before, response = await wire.until_response(id_)
    assert "".join(chunks(before)).startswith("I won't write ../x.txt")
    assert response["result"] == {"stopReason": "end_turn"}


# -- Read flow -------------------------------------------------------------------------------------


async def test_read_streams_the_file_back(start_agent):
    """read FILE: a read tool call, fs/read_text_file, then the content streamed line by line."""
    path = os.path.join(CWD, "notes.txt")
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        id_ = await wire.prompt(session_id, "read notes.txt")
        before, read = await wire.until_request("fs/read_text_file")
        await wire.answer(read, {"content": "line one\nline two\n"})
        after, response = await wire.until_response(id_)
    assert updates(before) == [
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "call-1",
            "title": "Read notes.txt",
            "kind": "read",
            "status": "pending",
            "locations": [{"path": path}],
        }
    ]
    assert read["params"] == {"sessionId": session_id, "path": path}
    assert statuses(after) == [("tool_call_update", "completed")]
    assert chunks(after) == ["notes.txt:\n", "line one\n", "line two\n"]
    assert response["result"] == {"stopReason": "end_turn"}


async def test_read_error_from_the_client_is_reported(start_agent):
    """The client failing fs/read_text_file: the tool call fails and the error is shown."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent()
        session_id = await wire.new_session()
        id_ = await wire.prompt(session_id, "read gone.txt")
        _, read = await wire.until_request("fs/read_text_file")
        error = {"code": -32002, "message": "Resource not found"}
        await wire.send({"jsonrpc": "2.0", "id": read["id"], "error": error})
        after, response = await wire.until_response(id_)
    assert statuses(after) == [("tool_call_update", "failed")]
    assert "".join(chunks(after)) == "Could not read gone.txt: Resource not found"
    assert response["result"] == {"stopReason": "end_turn"}


async def test_read_without_client_support_says_so(start_agent):
    """A client without fs.readTextFile is told so."""
    with trio.fail_after(TIMEOUT):
        wire = await start_agent(capabilities={})
        session_id = await wire.new_session()
        before, response = await wire.until_response(await wire.prompt(session_id, "read a.txt"))
    assert "".join(chunks(before)) == "This client can't read files, so I can't read a.txt."
    assert response["result"] == {"stopReason": "end_turn"}


# -- End to end with the official SDK --------------------------------------------------------------
