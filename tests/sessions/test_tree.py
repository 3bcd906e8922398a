"""The sub-agents' decisions, without trio (``sessions.tree``)."""

from __future__ import annotations

import pytest

from acp_bridge.config.model import SubagentsConfig
from acp_bridge.sessions.tree import (
    MAX_TURN_TEXT,
    TRUNCATED,
    Child,
    Tree,
    child_cwd,
    message_text,
    on_parent_session,
    spawn_refusal,
    subagent_update,
    supports_subagents,
    tools_for,
)


def test_the_tree_knows_depth_root_and_closes_deepest_first():
    tree = Tree()
    tree.add(Child("c1", "root", "b", 1, "/w"))
    tree.add(Child("c2", "root", "b", 1, "/w"))
    tree.add(Child("g1", "c1", "b", 2, "/w"))
    assert tree.depth("root") == 0
    assert tree.depth("g1") == 2
    assert tree.root("g1") == "root"
    assert [c.id for c in tree.descendants("root")] == ["g1", "c1", "c2"]
    assert tree.owned("root", "g1") is None  # a grandchild is its parent's, not the root's
    assert tree.owned("c1", "g1") is not None
    tree.remove("c1")
    assert [c.id for c in tree.of("root")] == ["c2"]


def test_a_turns_text_is_kept_in_order_and_bounded():
    child = Child("c", "p", "b", 1, "/w")
    child.start_turn()
    child.add_text("a")
    child.add_text("b")
    assert child.status().text is None  # running: no text yet
    child.end_turn("end_turn")
    assert child.status().text == "ab"
    child.start_turn()
    child.add_text("x" * (MAX_TURN_TEXT + 5))
    child.add_text("more")
    child.end_turn("end_turn")
    assert child.text == "x" * MAX_TURN_TEXT + TRUNCATED


def test_a_failed_turn_ends_the_child():
    child = Child("c", "p", "b", 1, "/w")
    child.start_turn()
    child.end_turn(None, "agent 'b' exited")
    assert child.status().state == "ended"


@pytest.mark.parametrize(
    ("config", "depth", "children", "agent", "why"),
    [
        (SubagentsConfig(enabled=False), 0, 0, "b", "disabled"),
        (SubagentsConfig(max_depth=1), 1, 0, "b", "max_depth = 1"),
        (SubagentsConfig(max_children=2), 0, 2, "b", "max_children = 2"),
        (SubagentsConfig(), 0, 0, "zz", "unknown agent 'zz'"),
        (SubagentsConfig(agents=("a*",)), 0, 0, "b", "may not be spawned"),
        (SubagentsConfig(), 1, 7, "b", None),
    ],
)
def test_spawn_refusals(config, depth, children, agent, why):
    refusal = spawn_refusal(
        config, parent_depth=depth, open_children=children, agent=agent, agents=["a", "b"]
    )
    if why is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert why in refusal


def test_no_spawn_tools_at_max_depth():
    assert "spawn_agent" in tools_for(1, 2)
    assert "spawn_agent" not in tools_for(2, 2)
    assert "close_agent" in tools_for(2, 2)


def test_a_childs_cwd_stays_inside_the_parents_roots():
    assert child_cwd(None, ("/w", "/x")) == "/w"
    assert child_cwd("/w/sub/../sub", ("/w",)) == "/w/sub"
    assert child_cwd("/x", ("/w", "/x")) == "/x"
    for outside in ("/w/../etc", "/wx", "/"):
        with pytest.raises(ValueError, match="outside"):
            child_cwd(outside, ("/w",))
    with pytest.raises(ValueError, match="no working directory"):
        child_cwd("/w", ())


def test_only_agent_message_text_counts():
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}
    assert message_text(chunk) == "hi"
    assert message_text({**chunk, "sessionUpdate": "agent_thought_chunk"}) is None
    assert message_text({**chunk, "content": {"type": "image", "data": ""}}) is None
    assert message_text(None) is None


def test_how_a_child_is_shown():
    child = Child("c", "p", "b", 2, "/w")
    shown = on_parent_session({"sessionId": "c", "_meta": {"x": 1}}, child, "root")
    assert shown["sessionId"] == "root"
    assert shown["_meta"] == {
        "x": 1,
        "acp_bridge": {"child": {"sessionId": "c", "agent": "b", "parent": "p"}},
    }
    announce = subagent_update(child, prompt="do it", state="running")
    assert announce["sessionUpdate"] == "subagent_update"
    assert announce["sessionId"] == "c"
    assert announce["state"] == {"state": "running"}
    assert announce["cwd"] == "/w"
    assert supports_subagents({"subagents": {}})
    assert not supports_subagents({"subagents": None})
