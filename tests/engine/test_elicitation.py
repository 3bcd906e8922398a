"""
Request-scoped elicitation: an agent's ``elicitation/create`` tied to a request (ACP's
``ElicitationRequestScope``, e.g. during ``authenticate``: no session yet) goes to the
connection whose request it names, under that client's own id for it, gated on the client's
``elicitation`` capability; declined when nobody can answer.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from tests.support.fakes import FakeAgent, TestClient, open_bridge
from tests.support.v1_schema import check_all

FORM = {"mode": "form", "message": "Your API key?", "requestedSchema": {"type": "object"}}


class AskingAgent(FakeAgent):
    """Answers ``authenticate`` and ``session/new`` after an elicitation tied to them."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        #: what each elicitation was answered
        self.elicited: list[dict[str, Any]] = []
        #: set it to let the agent ask (None: it asks at once)
        self.go: trio.Event | None = None
        self.scope: dict[str, Any] | None = None
        #: what it asks (the scope is added)
        self.form: dict[str, Any] = FORM

    async def _request_task(self, msg: dict[str, Any]) -> None:
        if msg["method"] not in ("authenticate", "session/new"):
            await super()._request_task(msg)
            return
        if self.go is not None:
            await self.go.wait()
        scope = self.scope if self.scope is not None else {"requestId": msg["id"]}
        self.elicited.append(await self.call("elicitation/create", {**self.form, **scope}))
        if msg["method"] == "session/new":
            await super()._request_task(msg)
            return
        await self.write({"jsonrpc": "2.0", "id": msg["id"], "result": {}})


async def initialized(client: TestClient, **caps: Any) -> None:
    await client.initialize(log=None, **caps)


async def test_an_elicitation_during_authenticate_reaches_the_client_under_its_own_id():
    agent = AskingAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await initialized(client, elicitation={"form": {}})
        async with trio.open_nursery() as nursery:
            done: list[dict[str, Any]] = []

            async def authenticate() -> None:
                done.append(await client.request("authenticate", {"methodId": "m"}, id="auth-1"))

            nursery.start_soon(authenticate)
            asked = await client.agent_requests.receive()
            assert asked["method"] == "elicitation/create"
            assert asked["params"] == {**FORM, "requestId": "auth-1"}
            accept = {"action": "accept", "content": {"key": "k"}}
            await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": accept})
        assert done[0]["result"] == {}
        [answer] = agent.elicited
        assert answer["result"] == accept
        check_all(client.received, client.asked)


async def test_an_elicitation_during_session_new_names_the_clients_request():
    agent = AskingAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await initialized(client, elicitation={"form": {}})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.new_session)
            asked = await client.agent_requests.receive()
            [new] = [i for i, m in client.asked.items() if m == "session/new"]
            assert asked["params"]["requestId"] == new
            await client.send(
                {"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}}
            )
        assert agent.elicited[0]["result"] == {"action": "decline"}
        check_all(client.received, client.asked)


async def test_a_client_without_the_capability_is_not_asked():
    agent = AskingAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await initialized(client)
        answer = await client.request("authenticate", {"methodId": "m"})
        assert answer["result"] == {}
        assert agent.elicited[0]["error"]["code"] == -32601
        assert not [m for m in client.received if m.get("method") == "elicitation/create"]


async def test_nobody_to_ask_means_declined():
    agent = AskingAgent("a")
    async with open_bridge({"a": agent}, initialize=False) as (client, bridge):
        await initialized(client, elicitation={"form": {}})
        # The request it names is not a client's (or was answered already): declined.
        agent.scope = {"requestId": 99999}
        assert (await client.request("authenticate", {"methodId": "m"}))["result"] == {}
        assert agent.elicited[-1]["result"] == {"action": "decline"}
        # An unattended session being opened: nobody will answer, declined.
        agent.scope = None
        await client.new_session(_meta={"acp_bridge": {"unattended": True}})
        assert agent.elicited[-1]["result"] == {"action": "decline"}
        # Its connection went away before the agent asked: declined.
        agent.go = trio.Event()
        await client.send(
            {"jsonrpc": "2.0", "id": 50, "method": "authenticate", "params": {"methodId": "m"}}
        )
        await trio.testing.wait_all_tasks_blocked()
        await client.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        agent.go.set()
        await trio.testing.wait_all_tasks_blocked()
        assert agent.elicited[-1]["result"] == {"action": "decline"}
        assert len(agent.elicited) == 3
        assert [r.decision for r in bridge.hub.audit.recent][-3:] == ["decline"] * 3
        assert not [m for m in client.received if m.get("method") == "elicitation/create"]


async def test_a_url_elicitations_completion_goes_to_the_connection_that_was_shown_it():
    agent = AskingAgent("a")
    url = {"mode": "url", "message": "Sign in", "url": "https://x.test", "elicitationId": "e1"}
    async with open_bridge({"a": agent}, initialize=False) as (client, _):
        await initialized(client, elicitation={"url": {}})
        agent.form = url
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.request, "authenticate", {"methodId": "m"})
            asked = await client.agent_requests.receive()
            assert asked["params"]["url"] == "https://x.test"
            await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}})
            await agent.write(
                {
                    "jsonrpc": "2.0",
                    "method": "elicitation/complete",
                    "params": {"elicitationId": "e1"},
                }
            )
            await client.wait_for(lambda m: m.get("method") == "elicitation/complete")
        check_all(client.received, client.asked)
