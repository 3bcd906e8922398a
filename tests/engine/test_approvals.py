"""The approval policy at work: rules, unattended, deadlines, one settlement, audit, files."""

from __future__ import annotations

import functools
import json
import os

import pytest
import structlog
import trio
import trio.testing

from acp_bridge.engine.audit import AuditLog
from acp_bridge.policy.rules import parse_policy
from acp_bridge.store.db import open_store
from tests.support.fakes import FakeAgent, connect, open_bridge

OPTIONS = [
    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
    {"optionId": "always", "name": "Always", "kind": "allow_always"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
]


def policy(**table):
    parsed, problems = parse_policy(table)
    assert problems == []
    return parsed


def permission(sid="s1", *, call="t1", kind="edit", title="edit it", paths=(), options=OPTIONS):
    tool_call = {"toolCallId": call, "title": title, "kind": kind}
    if paths:
        tool_call["locations"] = [{"path": p} for p in paths]
    return {"sessionId": sid, "toolCall": tool_call, "options": list(options)}


def outcome_of(answer):
    return answer["result"]["outcome"]


async def ask_many(agent, n, results, **kw):
    async def one(i):
        results[i] = await agent.call("session/request_permission", permission(call=f"t{i}", **kw))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)


async def test_timeout_never_grants(autojump_clock):
    """1,000 requests shown to a client that never answers: all denied at the deadline."""
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, policy=policy(ask_timeout=30)) as (client, bridge):
        await client.new_session()
        results = {}
        await ask_many(agent, 1000, results)
        assert trio.current_time() == 30
        outcomes = [outcome_of(r) for r in results.values()]
        assert outcomes == [{"outcome": "selected", "optionId": "no"}] * 1000
        # (The agent can have its last answer before the client has read the last notice.)
        await trio.testing.wait_all_tasks_blocked()
        resolved = [
            m for m in client.received if m.get("method") == "_acp_bridge/permission_resolved"
        ]
        assert len(resolved) == 1000
        assert {m["params"]["reason"] for m in resolved} == {"timeout"}
        sources = [r.source for r in bridge.hub.audit.recent]
        assert sources.count("timeout") == 1000
        assert not [r for r in bridge.hub.audit.recent if r.decision == "allow"]


async def test_no_client_attached_means_deny_at_once(autojump_clock):
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        await client.new_session()
        await client.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        results = {}
        await ask_many(agent, 1000, results)
        assert trio.current_time() == 0
        assert [outcome_of(r) for r in results.values()] == [
            {"outcome": "selected", "optionId": "no"}
        ] * 1000
        assert {r.source for r in bridge.hub.audit.recent} == {"unattended"}


async def test_no_reject_option_offered_means_cancelled_never_allow():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, _):
        await client.new_session()
        await client.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        answer = await agent.call("session/request_permission", permission(options=OPTIONS[:2]))
        assert outcome_of(answer) == {"outcome": "cancelled"}


async def test_rules_answer_with_the_agents_own_options_and_nothing_is_shown():
    rules = [
        {"id": "reads", "kind": "read", "action": "allow"},
        {"id": "always-search", "kind": "search", "action": "allow", "remember": True},
        {"id": "no-delete", "kind": "delete", "action": "deny"},
    ]
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, policy=policy(rules=rules)) as (client, bridge):
        await client.new_session()
        read = await agent.call("session/request_permission", permission(kind="read"))
        search = await agent.call("session/request_permission", permission(kind="search"))
        delete = await agent.call("session/request_permission", permission(kind="delete"))
        assert outcome_of(read) == {"outcome": "selected", "optionId": "yes"}
        assert outcome_of(search) == {"outcome": "selected", "optionId": "always"}
        assert outcome_of(delete) == {"outcome": "selected", "optionId": "no"}
        assert not [m for m in client.received if m.get("method") == "session/request_permission"]
        assert [(r.decision, r.source) for r in bridge.hub.audit.recent] == [
            ("allow", "reads"),
            ("allow", "always-search"),
            ("deny", "no-delete"),
        ]


async def test_a_rule_whose_option_is_missing_asks_the_attached_client():
    agent = FakeAgent("a")
    deny_all = policy(default="deny")
    async with open_bridge({"a": agent}, policy=deny_all) as (client, _):
        await client.new_session()
        async with trio.open_nursery() as nursery:
            results = {}
            nursery.start_soon(functools.partial(ask_many, agent, 1, results, options=OPTIONS[:2]))
            shown = await client.agent_requests.receive()
            await client.send(
                {
                    "jsonrpc": "2.0",
                    "id": shown["id"],
                    "result": {"outcome": {"outcome": "cancelled"}},
                }
            )
        assert outcome_of(results[0]) == {"outcome": "cancelled"}


async def test_cancel_settles_50_pending_at_once_and_late_answers_are_refused_and_audited():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        sid = await client.new_session()
        results = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_many, agent, 50, results)
            shown = [await client.agent_requests.receive() for _ in range(50)]
            await client.notify("session/cancel", {"sessionId": sid})
        assert [outcome_of(r) for r in results.values()] == [{"outcome": "cancelled"}] * 50
        # Late: the client answers "allow" to every one of them afterwards.
        for req in shown:
            await client.send(
                {
                    "jsonrpc": "2.0",
                    "id": req["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            )
        await client.call("_acp_bridge/agents", {})  # a round trip: the answers were handled
        late = [r for r in bridge.hub.audit.recent if r.source == "late_answer"]
        assert len(late) == 50
        assert {r.decision for r in late} == {"refused"}
        # The agent got exactly one answer per request, and never an allow.
        answers = [m for m in agent.received if "result" in m and "outcome" in m["result"]]
        assert len(answers) == 50
        assert {m["result"]["outcome"]["outcome"] for m in answers} == {"cancelled"}


async def test_unattended_session_denies_and_says_why():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        await client.new_session(_meta={"acp_bridge": {"unattended": True}})
        answer = await agent.call("session/request_permission", permission())
        assert outcome_of(answer) == {"outcome": "selected", "optionId": "no"}
        told = await client.wait_for(lambda m: m.get("method") == "_acp_bridge/log")
        assert "unattended" in told["params"]["data"]["message"]
        assert bridge.hub.audit.recent[-1].source == "unattended"
        elicit = await agent.call(
            "elicitation/create",
            {"sessionId": "s1", "mode": "form", "message": "name?", "requestedSchema": {}},
        )
        assert elicit["result"] == {"action": "decline"}


async def test_agent_exit_settles_what_it_asked_and_the_client_is_told():
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        sid = await client.new_session()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.prompt, sid, "permission")
            await client.agent_requests.receive()
            await client.prompt(sid, "crash")
            resolved = await client.wait_for(
                lambda m: m.get("method") == "_acp_bridge/permission_resolved"
            )
            assert resolved["params"]["reason"] == "agent_exit"
            nursery.cancel_scope.cancel()
        assert bridge.hub.audit.recent[-1].source == "agent_exit"


async def test_stale_approval_is_asked_again_then_denied(tmp_path):
    """An edit approval answered after the file changed is not delivered as is."""
    target = tmp_path / "f.txt"
    target.write_text("one")
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        await client.new_session(cwd=str(tmp_path))
        results = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(ask_many, agent, 1, results, paths=[str(target)]))
            first = await client.agent_requests.receive()
            target.write_text("two")
            allow = {"outcome": {"outcome": "selected", "optionId": "yes"}}
            await client.send({"jsonrpc": "2.0", "id": first["id"], "result": allow})
            again = await client.agent_requests.receive()
            assert "changed" in again["params"]["_meta"]["acp_bridge"]["note"]
            target.write_text("three")
            await client.send({"jsonrpc": "2.0", "id": again["id"], "result": allow})
        assert outcome_of(results[0]) == {"outcome": "selected", "optionId": "no"}
        assert [r.source for r in bridge.hub.audit.recent][-2:] == ["client", "stale"]


async def test_unchanged_file_approval_is_delivered(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("one")
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, _):
        await client.new_session(cwd=str(tmp_path))
        results = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(ask_many, agent, 1, results, paths=[str(target)]))
            first = await client.agent_requests.receive()
            await client.send(
                {
                    "jsonrpc": "2.0",
                    "id": first["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            )
        assert outcome_of(results[0]) == {"outcome": "selected", "optionId": "yes"}


async def test_file_access_outside_the_roots_is_refused_and_audited(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("canary")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    (root / "ok.txt").write_text("fine")
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        sid = await client.new_session(cwd=str(root))
        for path in (f"{root}/../secret.txt", f"{root}/link.txt", "relative.txt", f"{root}/.env"):
            answer = await agent.call("fs/read_text_file", {"sessionId": "s1", "path": path})
            assert answer["error"]["code"] == -32602, path
        refused = [r for r in bridge.hub.audit.recent if r.source == "containment"]
        assert len(refused) == 4
        assert not [m for m in client.received if m.get("method") == "fs/read_text_file"]
        # Inside: forwarded, with the resolved path.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                agent.call, "fs/read_text_file", {"sessionId": "s1", "path": f"{root}/./ok.txt"}
            )
            shown = await client.agent_requests.receive()
            assert shown["params"] == {"sessionId": sid, "path": str((root / "ok.txt").resolve())}
            await client.send({"jsonrpc": "2.0", "id": shown["id"], "result": {"content": "x"}})


async def test_audit_records_reach_the_store(tmp_path):
    store = open_store(str(tmp_path / "bridge.db"))
    agent = FakeAgent("a")
    rules = [{"id": "reads", "kind": "read", "action": "allow"}]
    async with open_bridge({"a": agent}, policy=policy(rules=rules), audit=AuditLog(store)) as (
        client,
        bridge,
    ):
        await client.new_session()
        await agent.call("session/request_permission", permission(kind="read"))
        with trio.fail_after(5):
            await bridge.hub.audit.wait_written(1)
    [row] = store.audit()
    assert (row["decision"], row["source"], row["option_id"], row["agent"]) == (
        "allow",
        "reads",
        "yes",
        "a",
    )
    assert row["options"] == ["yes", "always", "no"]


def test_audit_command_prints_the_trail(capsys):
    """`acp-bridge audit` reads the default store (the state dir is private to each test)."""
    from acp_bridge.cli.main import main
    from acp_bridge.config.model import default_state_dir
    from acp_bridge.store.db import AuditRecord

    store = open_store(str(default_state_dir() / "bridge.db"))
    store.append_audit(
        [
            AuditRecord(
                session="s1",
                agent="a",
                decision="allow",
                source="reads",
                title="Read x",
                options=("yes", "no"),
                option_id="yes",
            ),
            AuditRecord(
                session="s1",
                agent="a",
                decision="deny",
                source="timeout",
                title="Edit y",
                options=("yes", "no"),
                option_id="no",
            ),
        ]
    )
    store.close()
    assert main(["audit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "ALLOW" in lines[0]
    assert "by reads" in lines[0]
    assert "'Read x' (yes)" in lines[0]
    assert "DENY" in lines[1]
    assert "by timeout" in lines[1]
    assert main(["audit", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["source"] for r in rows] == ["reads", "timeout"]


async def test_a_permission_asked_as_the_client_drops_is_shown_to_the_next_one(
    tmp_path, monkeypatch
):
    """Regression (found by the soak): an edit's permission request reads the files' digests
    in a thread before it is shown; a client that dropped meanwhile was still shown it (on a
    dead connection), so the request was never shown to the connection that took the
    session back, and waited for ask_timeout (60 s in the soak) to be denied. It is now kept
    for the next owner (or shown to the current one)."""
    import threading

    from acp_bridge.engine import approvals
    from tests.support.fakes import connect

    hashing, release = threading.Event(), threading.Event()
    real_hash = approvals._hash_files

    def slow_hash(paths):
        hashing.set()
        release.wait(10)
        return real_hash(paths)

    monkeypatch.setattr(approvals, "_hash_files", slow_hash)
    agent = FakeAgent("a")
    target = str(tmp_path / "f.txt")
    answers = []
    answered = trio.Event()

    async def ask(sid):
        answers.append(
            await agent.call("session/request_permission", permission(sid, paths=[target]))
        )
        answered.set()

    with trio.fail_after(10):
        async with (
            open_bridge({"a": agent}, detach_grace=30.0) as (client, bridge),
            trio.open_nursery() as nursery,
        ):
            new = {"cwd": str(tmp_path), "mcpServers": []}
            sid = (await client.call("session/new", new))["sessionId"]
            nursery.start_soon(ask, sid)
            await trio.to_thread.run_sync(hashing.wait)
            try:
                await client.disconnect()
                await trio.testing.wait_all_tasks_blocked()
                assert bridge.hub.sessions.get(sid).client is None  # detached meanwhile
            finally:
                release.set()
            back = await connect(bridge, nursery, name="back")
            resumed = await back.request("session/resume", {**new, "sessionId": sid})
            assert "result" in resumed, resumed
            with trio.fail_after(2):
                shown = await back.agent_requests.receive()
            assert shown["method"] == "session/request_permission"
            allow = {"outcome": {"outcome": "selected", "optionId": "yes"}}
            await back.send({"jsonrpc": "2.0", "id": shown["id"], "result": allow})
            await answered.wait()
            assert outcome_of(answers[0]) == {"outcome": "selected", "optionId": "yes"}
            nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- ambiguous option lists (#17.7)

#: One id offered as both allow and reject: an agent may read "x" either way.
SAME_ID = [
    {"optionId": "x", "name": "Allow", "kind": "allow_once"},
    {"optionId": "x", "name": "Reject", "kind": "reject_once"},
]


async def test_an_ambiguous_list_is_cancelled_when_nobody_is_attached(autojump_clock):
    """Regression: an unattended deny answered "x", which the agent may read as its
    allow_once, and the audit said decision=allow. Now: cancelled, and audited so."""
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        await client.new_session()
        await client.disconnect()
        await trio.testing.wait_all_tasks_blocked()
        answer = await agent.call("session/request_permission", permission(options=SAME_ID))
        assert outcome_of(answer) == {"outcome": "cancelled"}
        record = bridge.hub.audit.recent[-1]
        assert (record.decision, record.source, record.option_id) == (
            "cancelled",
            "unattended",
            None,
        )


async def test_an_ambiguous_list_times_out_cancelled(autojump_clock):
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, policy=policy(ask_timeout=30)) as (client, bridge):
        await client.new_session()
        results = {}
        await ask_many(agent, 1, results, options=SAME_ID)
        assert trio.current_time() == 30
        assert outcome_of(results[0]) == {"outcome": "cancelled"}
        record = bridge.hub.audit.recent[-1]
        assert (record.decision, record.source) == ("cancelled", "timeout")
        assert not [r for r in bridge.hub.audit.recent if r.decision == "allow"]


async def test_rules_never_answer_with_an_id_another_kind_shares(autojump_clock):
    """A deny rule whose reject id is also an allow id, and an allow rule whose allow_once id
    is also an allow_always id: neither is delivered; nobody attached, so cancelled."""
    rules = [
        {"id": "no-delete", "kind": "delete", "action": "deny"},
        {"id": "reads", "kind": "read", "action": "allow"},
    ]
    reject_is_allow = [
        {"optionId": "a", "name": "Allow", "kind": "allow_once"},
        {"optionId": "r", "name": "Reject", "kind": "reject_once"},
        {"optionId": "r", "name": "Always", "kind": "allow_always"},
    ]
    once_is_always = [
        {"optionId": "x", "name": "Once", "kind": "allow_once"},
        {"optionId": "x", "name": "Always", "kind": "allow_always"},
        {"optionId": "n", "name": "No", "kind": "reject_once"},
    ]
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, policy=policy(rules=rules)) as (client, bridge):
        await client.new_session(_meta={"acp_bridge": {"unattended": True}})
        delete = await agent.call(
            "session/request_permission", permission(kind="delete", options=reject_is_allow)
        )
        read = await agent.call(
            "session/request_permission", permission(kind="read", options=once_is_always)
        )
        assert outcome_of(delete) == {"outcome": "cancelled"}
        assert outcome_of(read) == {"outcome": "cancelled"}
        assert [(r.decision, r.source) for r in bridge.hub.audit.recent] == [
            ("cancelled", "no-delete"),
            ("cancelled", "reads"),
        ]


async def test_a_clients_pick_of_a_shared_id_is_audited_as_the_agent_may_read_it():
    """The client may name an id two kinds share; the agent may take it as the allow, so the
    audit does not record a deny."""
    shared = list(reversed(SAME_ID))  # reject first: the old reading said deny
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        await client.new_session()
        results = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(ask_many, agent, 1, results, options=shared))
            shown = await client.agent_requests.receive()
            pick = {"outcome": {"outcome": "selected", "optionId": "x"}}
            await client.send({"jsonrpc": "2.0", "id": shown["id"], "result": pick})
        assert outcome_of(results[0]) == {"outcome": "selected", "optionId": "x"}
        record = bridge.hub.audit.recent[-1]
        assert (record.decision, record.source, record.option_id) == ("allow", "client", "x")


# ---------------------------------------------------------------- deny_paths bind approvals (#17.6)


async def test_deny_paths_bind_permission_requests_whatever_the_rules_say(tmp_path):
    """Regression: an allow rule for ROOT/** granted an edit of ROOT/.env and of
    ROOT/.git/config. A location that hits deny_paths (as written or resolved) is denied at
    once, audited with source deny_paths; nothing is shown to the attached client."""
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    os.symlink(root / ".env", root / "settings.txt")  # an innocent name for a denied file
    rules = [{"id": "my-project", "kind": "edit", "path": f"{root}/**", "action": "allow"}]
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}, policy=policy(rules=rules)) as (client, bridge):
        await client.new_session(cwd=str(root))
        for target in (root / ".env", root / ".git" / "config", root / "settings.txt"):
            answer = await agent.call("session/request_permission", permission(paths=[str(target)]))
            assert outcome_of(answer) == {"outcome": "selected", "optionId": "no"}, target
            record = bridge.hub.audit.recent[-1]
            assert (record.decision, record.source) == ("deny", "deny_paths"), target
            assert repr(str(target)) in record.detail
        # The rule still grants what deny_paths leave alone.
        fine = await agent.call(
            "session/request_permission", permission(paths=[str(root / "main.py")])
        )
        assert outcome_of(fine) == {"outcome": "selected", "optionId": "yes"}
        assert bridge.hub.audit.recent[-1].source == "my-project"
        # No reject option: cancelled at once, never put to the human.
        answer = await agent.call(
            "session/request_permission",
            permission(paths=[str(root / ".env")], options=OPTIONS[:2]),
        )
        assert outcome_of(answer) == {"outcome": "cancelled"}
        assert (bridge.hub.audit.recent[-1].decision, bridge.hub.audit.recent[-1].source) == (
            "cancelled",
            "deny_paths",
        )
        # A diff's path counts as a location.
        diff = permission(kind="edit")
        diff["toolCall"]["content"] = [
            {"type": "diff", "path": str(root / "id.key"), "oldText": None, "newText": "k"}
        ]
        answer = await agent.call("session/request_permission", diff)
        assert outcome_of(answer) == {"outcome": "selected", "optionId": "no"}
        assert bridge.hub.audit.recent[-1].source == "deny_paths"
        assert not [m for m in client.received if m.get("method") == "session/request_permission"]


async def test_a_session_in_a_denied_directory_cannot_read_what_it_denies(tmp_path):
    """Regression: with cwd = ROOT/.git, fs/read_text_file of ROOT/.git/config was forwarded
    (deny_paths were matched relative to the cwd: "config")."""
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "config").write_text("[remote] url = secret")
    (root / ".git" / "HEAD").write_text("ref")
    agent = FakeAgent("a")
    async with open_bridge({"a": agent}) as (client, bridge):
        await client.new_session(cwd=str(root / ".git"))
        path = str(root / ".git" / "config")
        with trio.fail_after(5):  # (before the fix: forwarded, and nobody answers it)
            answer = await agent.call("fs/read_text_file", {"sessionId": "s1", "path": path})
        assert answer["error"]["code"] == -32602
        assert "denied" in answer["error"]["message"]
        assert bridge.hub.audit.recent[-1].source == "containment"
        assert not [m for m in client.received if m.get("method") == "fs/read_text_file"]
        # Its other files are still readable.
        async with trio.open_nursery() as nursery:
            head = {"sessionId": "s1", "path": str(root / ".git" / "HEAD")}
            nursery.start_soon(agent.call, "fs/read_text_file", head)
            shown = await client.agent_requests.receive()
            assert shown["params"]["path"] == str((root / ".git" / "HEAD").resolve())
            await client.send({"jsonrpc": "2.0", "id": shown["id"], "result": {"content": "x"}})


# ---------------------------------------------------------------- bounded agent requests (#17.9)


async def raw_ask(agent, req_id, sid="s1", **kw):
    """A permission request written as is (its answer is found in ``agent.received``)."""
    params = permission(sid, call=f"t{req_id}", **kw)
    await agent.write(
        {"jsonrpc": "2.0", "id": req_id, "method": "session/request_permission", "params": params}
    )


def answer_of(agent, req_id):
    return next((m for m in agent.received if m.get("id") == req_id and "method" not in m), None)


def in_flight(bridge, name="a"):
    (entry,) = [a for a in bridge.status()["agents"] if a["name"] == name]
    return entry["requestsInFlight"], entry["requestsRefused"]


async def test_an_agent_asking_without_end_of_a_silent_client_holds_a_bounded_table(
    autojump_clock,
):
    """Regression: an agent could leave any number of requests waiting on a client that never
    answers (20,000 permission requests: +110 MiB). Past max_agent_requests each is answered
    at once: a permission cancelled (audited), anything else an error; counted and logged."""
    cap, extra = 8, 300
    agent = FakeAgent("a")
    with structlog.testing.capture_logs() as logs:
        async with open_bridge({"a": agent}, max_agent_requests=cap) as (client, bridge):
            await client.new_session()
            for i in range(cap + extra):
                await raw_ask(agent, 1000 + i)
            await agent.write(
                {
                    "jsonrpc": "2.0",
                    "id": 5000,
                    "method": "fs/read_text_file",
                    "params": {"sessionId": "s1", "path": "/w/a.txt"},
                }
            )
            await trio.testing.wait_all_tasks_blocked()
            assert trio.current_time() == 0  # at once, not at a deadline
            answers = [answer_of(agent, 1000 + i) for i in range(cap + extra)]
            assert answers[:cap] == [None] * cap  # shown to the client, waiting on it
            assert [outcome_of(a) for a in answers[cap:]] == [{"outcome": "cancelled"}] * extra
            error = answer_of(agent, 5000)["error"]
            assert error["code"] == -32603
            assert error["data"] == {"maxAgentRequests": cap}
            # What the bridge holds stays at the cap.
            (link,) = bridge.hub.clients
            assert len(link.pending) == cap
            assert len(bridge.hub.agents["a"].inflight) == cap
            assert in_flight(bridge) == (cap, extra + 1)
            shown = [m for m in client.received if m.get("method") == "session/request_permission"]
            assert len(shown) == cap
            refused = [r for r in bridge.hub.audit.recent if r.source == "max_agent_requests"]
            assert len(refused) == extra
            assert {r.decision for r in refused} == {"cancelled"}
            # One answer frees one place: the next request is shown, not refused.
            allow = {"outcome": {"outcome": "selected", "optionId": "yes"}}
            await client.send({"jsonrpc": "2.0", "id": shown[0]["id"], "result": allow})
            await trio.testing.wait_all_tasks_blocked()
            assert outcome_of(answer_of(agent, 1000)) == allow["outcome"]
            await raw_ask(agent, 6000)
            await trio.testing.wait_all_tasks_blocked()
            assert answer_of(agent, 6000) is None
            assert in_flight(bridge) == (cap, extra + 1)
    over = [e for e in logs if e["event"] == "agent_requests_over_limit"]
    assert len(over) == extra + 1
    assert over[-1]["limit"] == cap
    assert over[-1]["method"] == "fs/read_text_file"


async def raw_read(agent, req_id, sid="s1"):
    params = {"sessionId": sid, "path": f"/w/{req_id}.txt"}
    await agent.write(
        {"jsonrpc": "2.0", "id": req_id, "method": "fs/read_text_file", "params": params}
    )


async def answer_shown(client, shown):
    for request in shown:
        if request["method"] == "session/request_permission":
            answer = {"outcome": {"outcome": "selected", "optionId": "yes"}}
        else:
            answer = {"content": "x"}
        await client.send({"jsonrpc": "2.0", "id": request["id"], "result": answer})


async def end_by_answer(agent, client, bridge, shown, nursery):
    await answer_shown(client, shown)


async def end_by_cancel(agent, client, bridge, shown, nursery):
    await client.notify("session/cancel", {"sessionId": "s1"})


async def end_by_deadline(agent, client, bridge, shown, nursery):
    await trio.sleep(bridge.hub.config.policy.ask_timeout + 1)


async def end_by_withdrawal(agent, client, bridge, shown, nursery):
    for req_id in (1, 2):
        await agent.write(
            {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": req_id}}
        )


async def end_by_agent_exit(agent, client, bridge, shown, nursery):
    await client.prompt("s1", "crash")


async def end_by_grace(agent, client, bridge, shown, nursery):
    await client.disconnect()
    await trio.testing.wait_all_tasks_blocked()
    assert in_flight(bridge)[0] == 2  # parked for a reattach: still waiting
    await trio.sleep(bridge.hub.config.bridge.detach_grace + 1)


async def end_by_reattach(agent, client, bridge, shown, nursery):
    await client.disconnect()
    await trio.testing.wait_all_tasks_blocked()
    back = await connect(bridge, nursery, name="back")
    await back.call("session/resume", {"sessionId": "s1", "cwd": "/w", "mcpServers": []})
    again = [await back.agent_requests.receive() for _ in shown]
    await trio.testing.wait_all_tasks_blocked()
    assert in_flight(bridge)[0] == 2  # shown again: counted once
    await answer_shown(back, again)


ENDINGS = {
    "answer": end_by_answer,
    "cancel": end_by_cancel,
    "deadline": end_by_deadline,
    "withdrawal": end_by_withdrawal,
    "agent_exit": end_by_agent_exit,
    "grace": end_by_grace,
    "reattach": end_by_reattach,
}


#: (session/cancel and the deadline settle permission requests only)
ENDS = [
    pytest.param(ask, ending, id=f"{name}-{ending}")
    for name, ask in (("permission", raw_ask), ("fs_read", raw_read))
    for ending in ENDINGS
    if ask is raw_ask or ending not in ("cancel", "deadline")
]


@pytest.mark.parametrize(("ask", "ending"), ENDS)
async def test_every_way_a_request_ends_frees_its_place(autojump_clock, ask, ending):
    """The in-flight count is released however a request ends: the client's answer,
    session/cancel, the deadline, the agent's $/cancel_request, the agent's exit, the end of
    the detach grace period, and a reattach (where a request is shown again, counted once)."""
    agent = FakeAgent("a")
    async with (
        open_bridge({"a": agent}, max_agent_requests=2, detach_grace=30) as (client, bridge),
        trio.open_nursery() as nursery,
    ):
        await client.new_session()
        await ask(agent, 1)
        await ask(agent, 2)
        shown = [await client.agent_requests.receive() for _ in range(2)]
        await ask(agent, 3)
        await trio.testing.wait_all_tasks_blocked()
        assert answer_of(agent, 3) is not None  # refused at once
        assert in_flight(bridge) == (2, 1)
        await ENDINGS[ending](agent, client, bridge, shown, nursery)
        await trio.testing.wait_all_tasks_blocked()
        assert in_flight(bridge) == (0, 1)
        if ending in ("answer", "cancel", "deadline", "withdrawal", "reattach"):
            owner = bridge.hub.sessions.get("s1").client
            assert owner is not None
            await ask(agent, 4)
            await trio.testing.wait_all_tasks_blocked()
            assert answer_of(agent, 4) is None  # shown, not refused
            assert in_flight(bridge) == (1, 1)
        nursery.cancel_scope.cancel()
