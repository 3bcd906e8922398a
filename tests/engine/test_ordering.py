"""
The ordering property (issue 8, item 4): random programs of prompts, agent-pushed updates,
permission answers, cancels, disconnects, reconnects and agent crashes, over 2-3 fake agents.

``hypothesis.stateful`` cannot await, so hypothesis draws a whole program (a list of steps) and
one trio run plays it against a bridge, as one logical client that comes and goes. The fake
agents number every update they write and record the order per session, so the oracle does not
rest on the bridge's own sequence numbers. Invariants:

- per session and connection, the client sees a gapless run of the agent's updates, in the
  agent's order: no loss while attached, no duplicates, no reordering;
- across reconnects: ``session/load`` with ``after_seq`` continues exactly where the last
  connection stopped; a plain ``session/load`` replays from the first update; ``session/resume``
  may skip only what came while nobody was attached; at the end a full replay equals what the
  agent wrote;
- every request of the client gets exactly one response (on whichever of its connections holds
  the session when the answer comes);
- every permission request an agent made gets exactly one outcome, in the life of the process
  that asked (never one for a request of a process that died).

CI runs ``CI_EXAMPLES`` programs; ``scripts/fuzz --minutes N`` runs it for its share of N minutes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
from typing import TYPE_CHECKING, Any, Final

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from acp_bridge.agents.process import make_in_process_launcher
from acp_bridge.engine.bridge import Bridge
from acp_bridge.engine.links import AgentState
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.observe.log import configure_logging
from acp_bridge.protocol.jsonrpc import dumps
from acp_bridge.sessions.table import SessionState
from tests.support.fakes import AgentCrash, FakeAgent, TestClient, connect, make_config, open_bridge
from tests.support.fuzz_targets import EXAMPLES, long_minutes, out_of_time, run_for_share

if TYPE_CHECKING:
    from collections.abc import Callable

CI_EXAMPLES: Final = 350
LONG_BATCH: Final = 1000
TIMEOUT: Final = 20.0
AGENT_NAMES: Final = ("a", "b", "c")

settings.register_profile(
    "acp-bridge-ordering",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


# -- the agents ---------------------------------------------------------------------------------


def is_replay(text: str) -> bool:
    """What the agent sends again when it loads a session itself: not a new update."""
    return ":replay#" in text


class OrderedAgent(FakeAgent):
    """A fake agent that makes every update unique and records what it wrote, in order."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.serial = itertools.count()
        #: agent session id → the update texts it wrote, in order (a session loaded again by
        #: a later process goes on in the same list; ids are unique across processes)
        self.emitted: dict[str, list[str]] = collections.defaultdict(list)
        #: permission requests it made: (request id, life)
        self.asked: list[tuple[Any, int]] = []
        #: index into ``received`` where each life began (life n starts at marks[n - 1])
        self.marks: list[int] = []
        #: its current process is running
        self.running = False

    async def __call__(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        self.marks.append(len(self.received))
        self.prefix = f"{self.name}{self.starts + 1}-s"
        self.running = True
        try:
            await super().__call__(receive, send)
        finally:
            self.running = False

    async def update(self, sid: str, text: str) -> None:
        await super().update(sid, f"{text}#{self.name}{next(self.serial)}")

    async def write(self, msg: dict[str, Any]) -> None:
        assert self._send is not None
        async with self._lock:  # recorded in the order written, once written
            await self._send.send_all(dumps(msg))
            if msg.get("method") == "session/update":
                params = msg["params"]
                text = params["update"]["content"]["text"]
                if not is_replay(text):
                    self.emitted[params["sessionId"]].append(text)
            elif msg.get("method") == "session/request_permission":
                self.asked.append((msg["id"], self.starts))

    def answers(self, request_id: Any) -> list[int]:
        """The lives in which a response with this id came."""
        lives = []
        for index, msg in enumerate(self.received):
            if "method" not in msg and msg.get("id") == request_id:
                lives.append(sum(1 for mark in self.marks if mark <= index))
        return lives


# -- programs -----------------------------------------------------------------------------------


@attrs.frozen
class Prompt:
    session: int
    text: str


@attrs.frozen
class Push:
    """The agent writes updates for a session outside any prompt."""

    session: int
    count: int


@attrs.frozen
class Answer:
    """The client answers the oldest permission request it was shown and not answered."""

    decision: str


@attrs.frozen
class Cancel:
    session: int


@attrs.frozen
class NewSession:
    agent: int


@attrs.frozen
class Drop:
    """The connection fails (``abrupt``: with its last requests still on their way)."""

    abrupt: bool = False


@attrs.frozen
class Reconnect:
    """A new connection takes every session back: ``resume``, ``load`` or ``load-after``."""

    how: str


@attrs.frozen
class Settle:
    """Let everything in flight finish before the next step."""


SESSION = st.integers(0, 7)
PROMPT = st.builds(
    Prompt,
    session=SESSION,
    text=st.sampled_from(
        ["count 3", "permission", "count 1", "permission", "wait", "count 8", "crash"]
    ),
)
PUSH = st.builds(Push, session=SESSION, count=st.integers(1, 4))
ANSWER = st.builds(Answer, decision=st.sampled_from(["allow", "reject", "error", "ignore"]))
RECONNECT = st.builds(Reconnect, how=st.sampled_from(["load-after", "resume", "load"]))
#: step kinds, weighted: mostly traffic, sometimes a failure
KINDS: Final = {
    "prompt": (PROMPT, 5),
    "push": (PUSH, 3),
    "answer": (ANSWER, 3),
    "cancel": (st.builds(Cancel, session=SESSION), 1),
    "new": (st.builds(NewSession, agent=st.integers(0, 2)), 1),
    "drop": (st.builds(Drop, abrupt=st.booleans()), 2),
    "reconnect": (RECONNECT, 2),
    "settle": (st.just(Settle()), 2),
}
STEPS = st.sampled_from(
    [kind for kind, (_, weight) in KINDS.items() for _ in range(weight)]
).flatmap(lambda kind: KINDS[kind][0])
PROGRAMS = st.lists(STEPS, min_size=10, max_size=40)


# -- the run ------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Tracked:
    """A session of the client's, as the test knows it."""

    bridge_id: str
    agent: OrderedAgent
    agent_id: str

    @property
    def emitted(self) -> list[str]:
        return self.agent.emitted[self.agent_id]


@attrs.define(eq=False)
class Connection:
    client: TestClient
    #: per session, how this connection took it back: "resume", "load" or "load-after" (the
    #: bridge replays its history), "agent" (an ended session: the agent loads it again)
    how: dict[str, str] = attrs.field(factory=dict)
    #: permission requests shown to it and not answered yet (oldest first)
    shown: list[dict[str, Any]] = attrs.field(factory=list)
    #: it was dropped with its last requests and answers possibly still on the way
    abrupt: bool = False
    #: the ids of its requests not answered on it when it was dropped
    outstanding: set[str] = attrs.field(factory=set)

    def answered(self) -> set[str]:
        return {
            m["id"]
            for m in self.client.received
            if "method" not in m and isinstance(m.get("id"), str)
        }

    def owed(self) -> set[str]:
        """The client's requests its take-backs said would be answered on this connection."""
        out: set[str] = set()
        for msg in self.client.received:
            result = msg.get("result") if "method" not in msg else None
            meta = result.get("_meta") if isinstance(result, dict) else None
            if isinstance(meta, dict) and isinstance(meta.get("acp_bridge"), dict):
                out.update(meta["acp_bridge"].get("pending") or ())
        return out


@attrs.define(eq=False)
class Player:
    """Plays a program as one logical client, and checks the invariants at the end."""

    bridge: Bridge
    agents: list[OrderedAgent]
    nursery: trio.Nursery
    sessions: list[Tracked] = attrs.field(factory=list)
    connections: list[Connection] = attrs.field(factory=list)
    current: Connection | None = None
    ids: Any = attrs.field(factory=lambda: itertools.count(1))
    #: the ids of every request the client sent, and on which connection
    sent: list[str] = attrs.field(factory=list)
    sent_on: dict[str, Connection] = attrs.field(factory=dict)
    #: how the client takes its sessions back when it returns to act
    comebacks: Any = attrs.field(factory=lambda: itertools.cycle(["load-after", "resume", "load"]))

    # -- connections

    async def connect(self, how: str | None) -> None:
        client_side, bridge_side = trio.testing.memory_stream_pair()
        self.nursery.start_soon(
            functools.partial(
                serve_client_stream, self.bridge, bridge_side, bridge_side, name="c", linger=0
            )
        )
        client = TestClient(client_side)
        self.nursery.start_soon(client.read_loop)
        await client.initialize(seq=True, fs={"readTextFile": True, "writeTextFile": True})
        connection = Connection(client)
        self.connections.append(connection)
        self.current = connection
        for tracked in self.sessions:
            if how is not None:
                await self.take_back(connection, tracked, how)

    async def take_back(self, connection: Connection, tracked: Tracked, how: str) -> None:
        params: dict[str, Any] = {"sessionId": tracked.bridge_id, "cwd": "/w", "mcpServers": []}
        method = "session/resume" if how == "resume" else "session/load"
        if how == "load-after":
            params["_meta"] = {"acp_bridge": {"after_seq": self.last_seq(tracked.bridge_id)}}
        connection.how[tracked.bridge_id] = how if self.alive(tracked) else "agent"
        await self.request(method, params, wait=True)

    def last_seq(self, bridge_id: str) -> int:
        seqs = [
            m["params"]["_meta"]["acp_bridge"]["seq"]
            for c in self.connections
            for m in c.client.received
            if m.get("method") == "session/update" and m["params"]["sessionId"] == bridge_id
        ]
        return max(seqs, default=0)

    async def request(self, method: str, params: dict[str, Any], *, wait: bool = False) -> Any:
        assert self.current is not None
        client = self.current.client
        req_id = f"r{next(self.ids)}"
        self.sent.append(req_id)
        self.sent_on[req_id] = self.current
        if not wait:
            await client.send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
            return None
        with trio.fail_after(TIMEOUT):
            return await client.request(method, params, id=req_id)

    async def settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()
        if self.current is not None:
            while True:
                try:
                    self.current.shown.append(self.current.client.agent_requests.receive_nowait())
                except trio.WouldBlock:
                    break

    # -- steps

    async def play(self, step: Any) -> None:
        if isinstance(step, Reconnect):
            if self.current is not None:
                await self.drop()
            await self.connect(step.how)
        elif isinstance(step, Drop):
            if self.current is not None:
                await self.drop(settle=not step.abrupt)
        elif isinstance(step, Settle):
            await self.settle()
        elif isinstance(step, Push):
            tracked = self.session(step.session)
            if tracked is not None and self.alive(tracked):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    for _ in range(step.count):  # (a process on its way out writes nothing)
                        await tracked.agent.update(tracked.agent_id, "push")
        else:
            if self.current is None:  # the client comes back to act
                await self.connect(next(self.comebacks))
            await self.act(step)

    async def act(self, step: Any) -> None:
        if isinstance(step, NewSession):
            await self.new_session(self.agents[step.agent % len(self.agents)])
        elif isinstance(step, Prompt):
            tracked = self.session(step.session)
            if tracked is not None:
                prompt = [{"type": "text", "text": step.text}]
                await self.request(
                    "session/prompt", {"sessionId": tracked.bridge_id, "prompt": prompt}
                )
        elif isinstance(step, Cancel):
            tracked = self.session(step.session)
            if tracked is not None:
                assert self.current is not None
                await self.current.client.notify("session/cancel", {"sessionId": tracked.bridge_id})
        elif isinstance(step, Answer):
            await self.settle()
            await self.answer(step.decision)

    def session(self, index: int) -> Tracked | None:
        return self.sessions[index % len(self.sessions)] if self.sessions else None

    def alive(self, tracked: Tracked) -> bool:
        """The session is live at the bridge and its agent runs."""
        session = self.bridge.hub.sessions.get(tracked.bridge_id)
        agent = self.bridge.hub.agents[tracked.agent.name]
        return (
            session is not None
            and session.state is SessionState.ACTIVE
            and agent.state is AgentState.READY
            and session.agent_id == tracked.agent_id
        )

    async def new_session(self, agent: OrderedAgent) -> None:
        params = {"cwd": "/w", "mcpServers": [], "_meta": {"acp_bridge": {"agent": agent.name}}}
        answer = await self.request("session/new", params, wait=True)
        if "result" in answer:
            bridge_id = answer["result"]["sessionId"]
            session = self.bridge.hub.sessions.get(bridge_id)
            assert session is not None
            self.sessions.append(Tracked(bridge_id, agent, session.agent_id))

    async def drop(self, *, settle: bool = True) -> None:
        connection = self.current
        assert connection is not None
        if settle:
            await self.settle()
        connection.abrupt = not settle
        mine = {r for r, c in self.sent_on.items() if c is connection}
        connection.outstanding = (mine | connection.owed()) - connection.answered()
        await connection.client.disconnect()
        self.current = None
        await trio.testing.wait_all_tasks_blocked()

    async def answer(self, decision: str) -> None:
        assert self.current is not None
        if not self.current.shown:
            return
        request = self.current.shown.pop(0)
        if decision == "ignore":
            return
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        if decision == "error":
            reply["error"] = {"code": -32000, "message": "the user closed the dialog"}
        else:
            option = "yes" if decision == "allow" else "no"
            reply["result"] = {"outcome": {"outcome": "selected", "optionId": option}}
        await self.current.client.send(reply)

    async def wind_down(self) -> None:
        """Connected, every shown request answered, every session cancelled, all quiet."""
        if self.current is None:
            await self.connect("load-after")
        assert self.current is not None
        for _ in range(20):
            await self.settle()
            while self.current.shown:
                await self.answer("reject")
            for tracked in self.sessions:
                await self.current.client.notify("session/cancel", {"sessionId": tracked.bridge_id})
            await self.settle()
            if not self.current.shown:
                return
        raise AssertionError("permission requests keep coming")

    # -- checks

    def check(self) -> None:
        self.check_updates()
        self.check_responses()
        self.check_permissions()

    def updates_on(self, connection: Connection, tracked: Tracked) -> list[int]:
        """Where in the agent's order each update this connection got for the session is."""
        position = {text: i for i, text in enumerate(tracked.emitted)}
        out = []
        for msg in connection.client.received:
            if msg.get("method") != "session/update":
                continue
            params = msg["params"]
            if params["sessionId"] != tracked.bridge_id:
                continue
            if params["update"]["sessionUpdate"] != "agent_message_chunk":
                continue
            text = params["update"]["content"]["text"]
            if is_replay(text):
                continue
            assert text in position, f"{tracked.bridge_id}: {text!r} was never written"
            out.append(position[text])
        return out

    def check_updates(self) -> None:
        for tracked in self.sessions:
            seen = -1  # the furthest update the client had, over its connections so far
            for connection in self.connections:
                got = self.updates_on(connection, tracked)
                where = f"{tracked.bridge_id} on connection {self.connections.index(connection)}"
                if not got:
                    continue
                # In the agent's order, nothing twice, nothing skipped while attached.
                assert got == list(range(got[0], got[0] + len(got))), (where, got)
                how = connection.how.get(tracked.bridge_id)
                if how == "load":
                    assert got[0] == 0, (where, "a full replay starts at the first update", got)
                elif how == "load-after":
                    assert got[0] == seen + 1, (where, "catch-up continues", seen, got)
                else:
                    assert got[0] > seen, (where, "never again what it had", seen, got)
                seen = max(seen, got[-1])

    def check_responses(self) -> None:
        """
        One response per request. None only for a request still out when its connection
        failed abruptly (its answer may have gone down with it) that no later take-back
        listed as owed (``_meta.acp_bridge.pending``): what the client is told to expect.
        """
        responses: collections.Counter[Any] = collections.Counter()
        for connection in self.connections:
            responses.update(
                m["id"]
                for m in connection.client.received
                if "method" not in m and isinstance(m.get("id"), str)
            )
        twice = [r for r, n in responses.items() if n > 1]
        assert not twice, f"answered more than once: {twice}"
        owed = [connection.owed() for connection in self.connections]
        for req_id in self.sent:
            if responses[req_id]:
                continue
            # The last connection responsible for it: its sender, or the latest take-back
            # that listed it as owed.
            last = self.sent_on[req_id]
            for connection, ids in zip(self.connections, owed, strict=True):
                if req_id in ids:
                    last = connection
            lost = last.abrupt and req_id in last.outstanding
            assert lost, f"never answered: {req_id} (last owed on {self.connections.index(last)})"

    def check_permissions(self) -> None:
        for agent in self.agents:
            for request_id, life in agent.asked:
                lives = agent.answers(request_id)
                assert all(n == life for n in lives), (agent.name, request_id, life, lives)
                if agent.starts == life and agent.running:
                    assert lives == [life], (agent.name, request_id, "one outcome", lives)
                else:
                    assert len(lives) <= 1, (agent.name, request_id, lives)

    async def check_full_replay(self) -> None:
        """A last connection loads each live session: the replay is all the agent wrote."""
        live = [tracked for tracked in self.sessions if self.alive(tracked)]
        await self.drop()
        await self.connect("load")
        assert self.current is not None
        for tracked in live:
            got = self.updates_on(self.current, tracked)
            assert got == list(range(len(tracked.emitted))), (tracked.bridge_id, got)


async def play(program: list[Any], agent_count: int) -> None:
    agents = [OrderedAgent(name) for name in AGENT_NAMES[:agent_count]]
    config = make_config(
        {a.name: a for a in agents},
        restart_backoff_initial=0.0,
        crash_loop_limit=1_000_000,
        stop_grace=0.0,
    )
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            bridge = await nursery.start(
                Bridge(config, make_in_process_launcher({a.name: a for a in agents})).run
            )
            player = Player(bridge, agents, nursery)
            await player.connect(None)
            for agent in agents[:2]:
                await player.new_session(agent)
            for step in program:
                await player.play(step)
            await player.wind_down()
            player.check()
            await player.check_full_replay()
            player.check()
            nursery.cancel_scope.cancel()


#: what the ordering programs did, in all (printed with ``-s``)
STEP_COUNTS: collections.Counter[str] = collections.Counter()


@given(program=PROGRAMS, agent_count=st.integers(2, 3))
def _ordering(program, agent_count):
    if out_of_time():
        return
    EXAMPLES["ordering"] += 1
    STEP_COUNTS.update(type(step).__name__.lower() for step in program)
    note(f"program: {program}")
    trio.run(play, program, agent_count)


def byte_targets() -> dict[str, Callable[[bytes], None]]:
    """The property as a function of raw bytes, for atheris (hypothesis decodes them)."""
    test = settings(settings.get_profile("acp-bridge-ordering"), database=None)(_ordering)
    fuzz = test.hypothesis.fuzz_one_input

    def run(data: bytes) -> None:
        fuzz(data)

    return {"ordering": run}


def test_ordering_property():
    """Updates arrive in the agent's order, every request gets one answer, every permission
    request one outcome, whatever the program does."""
    configure_logging(level="warning", fmt="json")
    profile = settings.get_profile("acp-bridge-ordering")
    examples = CI_EXAMPLES if long_minutes() is None else LONG_BATCH
    before = EXAMPLES["ordering"]
    STEP_COUNTS.clear()
    run_for_share("ordering", settings(profile, max_examples=examples)(_ordering))
    steps = ", ".join(f"{n:,} {kind}" for kind, n in STEP_COUNTS.most_common())
    print(f"\nordering: {EXAMPLES['ordering'] - before:,} programs, steps: {steps}")


# -- regressions: what the ordering property found ---------------------------------------------


class MortalAgent(FakeAgent):
    """A fake agent whose process the test can kill (``die.set()``)."""

    async def __call__(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        self.die = trio.Event()
        async with trio.open_nursery() as nursery:

            async def killer() -> None:
                await self.die.wait()
                raise AgentCrash("killed")

            nursery.start_soon(killer)
            await super().__call__(receive, send)
            nursery.cancel_scope.cancel()


async def test_a_turn_that_failed_while_the_client_was_away_is_answered_when_it_returns():
    """Regression: the agent died while nobody was attached; the error for the client's running
    prompt went to the closed connection (lost), and answers the bridge held for the session
    were never delivered when the agent itself loaded the session again."""
    agent = MortalAgent("a")
    with trio.fail_after(TIMEOUT):
        async with (
            open_bridge({"a": agent}, restart_backoff_initial=0.0) as (client, bridge),
            trio.open_nursery() as nursery,
        ):
            sid = await client.new_session()
            wait = {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
            await client.send(
                {"jsonrpc": "2.0", "id": "w", "method": "session/prompt", "params": wait}
            )
            await client.wait_for(lambda m: "waiting" in str(m))
            await client.disconnect()
            await trio.testing.wait_all_tasks_blocked()
            agent.die.set()  # its turn ends with an error while nobody is attached
            await trio.testing.wait_all_tasks_blocked()
            back = await connect(bridge, nursery)
            loaded = await back.request(
                "session/load", {"sessionId": sid, "cwd": "/w", "mcpServers": []}
            )
            assert "result" in loaded, loaded
            assert agent.starts == 2
            [answer] = [m for m in back.received if m.get("id") == "w"]
            assert answer["error"]["code"] == -32603
            nursery.cancel_scope.cancel()


async def test_the_program_that_lost_a_prompt_answer_after_an_agent_served_load():
    """Regression (found by the property): a prompt on a session its agent's death had ended,
    waiting on a permission when the client dropped, was never answered: the agent loaded the
    session again for the next connection, but the prompt's answer still went to the dead one."""
    program = [Prompt(0, "count 3")] * 4 + [
        Prompt(0, "crash"),
        Settle(),
        Answer("allow"),
        NewSession(0),
        Prompt(0, "permission"),
        Drop(abrupt=False),
    ]
    await play(program, 2)


@pytest.mark.parametrize("method", ["session/load", "session/resume"])
async def test_a_load_the_agent_serves_takes_the_session_like_a_reattach(method, autojump_clock):
    """
    Regression: a ``session/load`` or ``session/resume`` of an ended session (its agent
    restarted) that the agent itself serves made the loader the owner without what ownership
    entails: answers to requests a dead connection left out at the agent still went to that
    connection (lost), the requests the agent had made of it stayed parked (never shown), and
    the detach grace kept running (the session was closed under its new owner).
    """
    agent = OrderedAgent("a")  # (a new process gives new session ids)
    grace = 5.0
    with trio.fail_after(TIMEOUT):
        async with (
            open_bridge({"a": agent}, restart_backoff_initial=0.0, detach_grace=grace) as (
                client,
                bridge,
            ),
            trio.open_nursery() as nursery,
        ):
            sid = await client.new_session()
            crashed = await client.prompt(sid, "crash")
            assert crashed["error"]["code"] == -32603
            ended = bridge.hub.sessions.get(sid)
            assert ended is not None
            assert ended.state is SessionState.ENDED
            await client.new_session()  # the agent runs again (a new process)
            ask = {"sessionId": sid, "prompt": [{"type": "text", "text": "permission"}]}
            await client.send(
                {"jsonrpc": "2.0", "id": "p", "method": "session/prompt", "params": ask}
            )
            shown = await client.agent_requests.receive()
            assert shown["method"] == "session/request_permission"
            await client.disconnect()
            await trio.testing.wait_all_tasks_blocked()

            back = await connect(bridge, nursery)
            loaded = await back.request(method, {"sessionId": sid, "cwd": "/w", "mcpServers": []})
            assert "result" in loaded, loaded
            assert any(m.get("method") == method for m in agent.received)  # the agent served it
            await trio.sleep(grace + 1)  # past the grace the dropped connection started
            assert bridge.hub.sessions.get(sid) is not None, "closed under its new owner"
            again = await back.agent_requests.receive()  # shown to the new owner
            assert again["method"] == "session/request_permission"
            reply = {"outcome": {"outcome": "selected", "optionId": "yes"}}
            await back.send({"jsonrpc": "2.0", "id": again["id"], "result": reply})
            answer = await back.wait_for(lambda m: m.get("id") == "p")
            assert answer["result"] == {"stopReason": "end_turn"}, answer
            assert any(text.startswith("a:outcome:yes#") for text in back.updates(sid))
            nursery.cancel_scope.cancel()
