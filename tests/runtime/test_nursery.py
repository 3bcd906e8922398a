"""The root nurseries' helpers: exception groups seen through."""

from __future__ import annotations

from acp_bridge.runtime.nursery import leaves


def test_leaves_are_the_exceptions_of_nested_groups_in_order():
    """Nested groups are flattened depth first; the exceptions themselves are kept."""
    a, b, c = ValueError("a"), KeyError("b"), OSError("c")
    group = BaseExceptionGroup(
        "outer", [a, BaseExceptionGroup("inner", [b, ExceptionGroup("x", [c])])]
    )
    assert leaves(group) == [a, b, c]
