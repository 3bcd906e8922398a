"""Interop with real peers built on the official ACP Python SDK (``agent-client-protocol``).

Each scenario is an asyncio coroutine (the SDK is asyncio-based) run in a worker thread
with ``asyncio.run``, bounded on both sides. Most run twice:

- ``direct``: the SDK client talks straight to the scripted SDK agent; proves the harness;
- ``bridge``: the same client talks to ``acp-bridge stdio --agent ...`` in front of it.

Scenarios with several agents behind one connection only make sense through the bridge.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any

import acp
import pytest
import trio
from acp.schema import ToolCallStart

from tests.support.peers.sdk_agent import CRASH_EXIT_STATUS
from tests.support.peers.sdk_client import Peer, agent_argv, open_bridge, open_direct

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.support.peers.sdk_client import PermissionPolicy


MODES = ["direct", "bridge"]
SCENARIO_TIMEOUT = 20.0  # the asyncio side, so a hang still cleans its processes up
TEST_TIMEOUT = 30.0  # the trio side


def _run_bounded(scenario: Callable[..., Awaitable[None]], *args: Any) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(SCENARIO_TIMEOUT):
            await scenario(*args)

    asyncio.run(bounded())


async def run_scenario(scenario: Callable[..., Awaitable[None]], *args: Any) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        await trio.to_thread.run_sync(functools.partial(_run_bounded, scenario, *args))


def open_peer(
    mode: str,
    root: Path,
    agents: tuple[str, ...] = ("A",),
    policy: PermissionPolicy = "allow_once",
) -> contextlib.AbstractAsyncContextManager[Peer]:
    """All agents share the session prefix ``s``: their first session ids collide."""
    if mode == "direct":
        (name,) = agents
        return open_direct(agent_argv(name, "s"), root, policy=policy)
    return open_bridge({name: agent_argv(name, "s") for name in agents}, root, policy=policy)


def counted(name: str, agent_session_id: str, n: int) -> list[str]:
    return [f"{name}:{agent_session_id}:{i}" for i in range(1, n + 1)]


async def until_text(peer: Peer, session_id: str, text: str, turn: asyncio.Task[Any]) -> None:
    """Wait for a chunk, but fail at once if the turn ends (or fails) before it comes."""
    seen = asyncio.ensure_future(peer.client.wait_for_text(session_id, text))
    try:
        await asyncio.wait([seen, turn], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not seen.done():
            seen.cancel()
            await asyncio.wait([seen])
    if seen.cancelled():
        result = turn.result()  # raises the turn's error, if any
        pytest.fail(f"the turn ended ({result!r}) before {text!r} arrived")


# -- a. one agent, one session ------------------------------------------------------------


async def _count(mode: str, root: Path) -> None:
    async with open_peer(mode, root) as peer:
        assert peer.init.protocol_version == acp.PROTOCOL_VERSION
        if mode == "direct":
            assert peer.init.agent_info is not None
            assert peer.init.agent_info.name == "A"
        session_id = await peer.new_session(root)
        if mode == "direct":
            assert session_id == "s1"
        response = await peer.prompt(session_id, "count 20")
        assert response.stop_reason == "end_turn"
        assert peer.client.texts(session_id) == counted("A", "s1", 20)
        assert list(peer.client.updates) == [session_id]
        peer.assert_clean()


@pytest.mark.parametrize("mode", MODES)
async def test_count_streams_every_chunk_in_order(mode: str, tmp_path: Path) -> None:
    await run_scenario(_count, mode, tmp_path)


# -- b. two agents whose session ids collide, prompted concurrently ------------------------


async def _two_agents(mode: str, root: Path) -> None:
    async with open_peer(mode, root, agents=("A", "B")) as peer:
        on_a = await peer.new_session(root, agent="A")
        on_b = await peer.new_session(root, agent="B")
        # Both agents minted "s1"; the client must see two distinct ids.
        assert on_a != on_b

        done_a, done_b = await asyncio.gather(
            peer.prompt(on_a, "count 200"), peer.prompt(on_b, "count 200")
        )
        assert done_a.stop_reason == "end_turn"
        assert done_b.stop_reason == "end_turn"
        assert peer.client.texts(on_a) == counted("A", "s1", 200)
        assert peer.client.texts(on_b) == counted("B", "s1", 200)

        # No agent in _meta: the default (first) agent, A, whose second session is s2.
        on_default = await peer.new_session(root)
        assert on_default not in (on_a, on_b)
        response = await peer.prompt(on_default, "count 3")
        assert response.stop_reason == "end_turn"
        assert peer.client.texts(on_default) == counted("A", "s2", 3)

        assert set(peer.client.updates) == {on_a, on_b, on_default}
        peer.assert_clean()


@pytest.mark.parametrize("mode", ["bridge"])  # several agents: only behind a bridge
async def test_two_agents_with_colliding_session_ids(mode: str, tmp_path: Path) -> None:
    await run_scenario(_two_agents, mode, tmp_path)


# -- c. permission requests reach the client and its answer reaches the agent ---------------


async def _permission(mode: str, root: Path, policy: PermissionPolicy, reported: str) -> None:
    async with open_peer(mode, root, policy=policy) as peer:
        session_id = await peer.new_session(root)
        response = await peer.prompt(session_id, "permission")
        assert response.stop_reason == "end_turn"
        assert peer.client.texts(session_id) == [f"A:outcome:{reported}"]
        (asked,) = peer.client.permissions
        assert asked.session_id == session_id
        assert asked.tool_call.tool_call_id == "perm-1"
        assert [option.kind for option in asked.options] == ["allow_once", "reject_once"]
        # The tool call the agent announced came before the question, on the same session.
        assert isinstance(peer.client.updates[session_id][0], ToolCallStart)
        peer.assert_clean()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("policy", "reported"),
    [("allow_once", "allow"), ("reject_once", "reject"), ("cancelled", "cancelled")],
)
async def test_permission_answer_reaches_the_agent(
    mode: str, policy: PermissionPolicy, reported: str, tmp_path: Path
) -> None:
    await run_scenario(_permission, mode, tmp_path, policy, reported)


# -- d. fs requests from the agent are served by the client --------------------------------


async def _fs(mode: str, root: Path) -> None:
    target = root / "out" / "hello.txt"
    given = root / "given.txt"
    given.write_text("put there by the test", encoding="utf-8")
    async with open_peer(mode, root) as peer:
        assert peer.init.protocol_version == acp.PROTOCOL_VERSION
        session_id = await peer.new_session(root)

        wrote = await peer.prompt(session_id, f"write {target} hello from A")
        assert wrote.stop_reason == "end_turn"
        assert peer.client.texts(session_id) == [f"A:wrote:{target}"]
        assert target.read_text(encoding="utf-8") == "hello from A"
        (asked,) = peer.client.permissions
        assert asked.session_id == session_id

        read = await peer.prompt(session_id, f"read {target}")
        assert read.stop_reason == "end_turn"
        assert peer.client.texts(session_id)[-1] == "A:read:hello from A"

        read = await peer.prompt(session_id, f"read {given}")
        assert read.stop_reason == "end_turn"
        assert peer.client.texts(session_id)[-1] == "A:read:put there by the test"
        peer.assert_clean()


@pytest.mark.parametrize("mode", MODES)
async def test_fs_write_then_read(mode: str, tmp_path: Path) -> None:
    await run_scenario(_fs, mode, tmp_path)


# -- e. session/cancel ends a running turn with stopReason cancelled ------------------------


async def _cancel(mode: str, root: Path) -> None:
    async with open_peer(mode, root) as peer:
        session_id = await peer.new_session(root)
        turn = asyncio.create_task(peer.prompt(session_id, "wait"))
        await until_text(peer, session_id, "A:s1:waiting", turn)
        await peer.conn.cancel(session_id=session_id)
        response = await turn
        assert response.stop_reason == "cancelled"

        # The session still works after a cancelled turn.
        response = await peer.prompt(session_id, "count 2")
        assert response.stop_reason == "end_turn"
        assert peer.client.texts(session_id)[-2:] == counted("A", "s1", 2)
        peer.assert_clean()


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_ends_the_turn(mode: str, tmp_path: Path) -> None:
    await run_scenario(_cancel, mode, tmp_path)


# -- f. an agent that dies mid-turn: the turn fails fast, other agents carry on -------------


async def _crash_direct(root: Path) -> None:
    async with open_peer("direct", root) as peer:
        session_id = await peer.new_session(root)
        started = time.monotonic()
        # Straight to the agent there is nobody to answer: the SDK fails the pending
        # request with ConnectionError when the agent's stdout closes.
        with pytest.raises(ConnectionError):
            await peer.prompt(session_id, "crash")
        assert time.monotonic() - started < 1.0
        assert peer.client.texts(session_id) == ["A:s1:crashing"]
        assert await peer.process.wait() == CRASH_EXIT_STATUS
        peer.assert_clean()


async def _crash_bridge(root: Path) -> None:
    async with open_peer("bridge", root, agents=("A", "B")) as peer:
        on_a = await peer.new_session(root, agent="A")
        on_b = await peer.new_session(root, agent="B")
        started = time.monotonic()
        with pytest.raises(acp.RequestError) as failed:
            await peer.prompt(on_a, "crash")
        assert time.monotonic() - started < 1.0
        # What the agent said before dying came first (one FIFO per agent->client path),
        # and the error tells why it died (DESIGN §3: exit status and stderr tail).
        assert peer.client.texts(on_a) == ["A:s1:crashing"]
        why = f"{failed.value} {failed.value.data}"
        assert f"crashing on purpose with status {CRASH_EXIT_STATUS}" in why

        response = await peer.prompt(on_b, "count 5")
        assert response.stop_reason == "end_turn"
        assert peer.client.texts(on_b) == counted("B", "s1", 5)
        assert peer.process.returncode is None  # the bridge itself is still up
        peer.assert_clean()


@pytest.mark.parametrize("mode", MODES)
async def test_agent_crash_fails_the_turn_fast(mode: str, tmp_path: Path) -> None:
    if mode == "direct":
        await run_scenario(_crash_direct, tmp_path)
    else:
        await run_scenario(_crash_bridge, tmp_path)


# -- g. agent stderr never reaches the client's protocol stream -----------------------------


async def _stderr(mode: str, root: Path) -> None:
    async with open_peer(mode, root) as peer:
        session_id = await peer.new_session(root)
        response = await peer.prompt(session_id, "stderr")
        assert response.stop_reason == "end_turn"
        # The agent wrote a fake session/update for "s1" on stderr: it must not show up.
        assert peer.client.texts(session_id) == ["A:s1:stderr-done"]

        response = await peer.prompt(session_id, "count 3")
        assert response.stop_reason == "end_turn"
        assert peer.client.texts(session_id)[1:] == counted("A", "s1", 3)
        assert list(peer.client.updates) == [session_id]
        # Not a single unparseable line nor unknown method reached the client.
        peer.assert_clean()


@pytest.mark.parametrize("mode", MODES)
async def test_agent_stderr_stays_off_the_protocol(mode: str, tmp_path: Path) -> None:
    await run_scenario(_stderr, mode, tmp_path)
