"""
One service tells the others that something happened: a :class:`Topic` it publishes, which
the others subscribe to when the bridge is put together (``engine.bridge``).

Pure and synchronous: a listener runs inside :meth:`Topic.publish`, so it must not block (it
starts a task if it has waiting to do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, ParamSpec

if TYPE_CHECKING:
    from collections.abc import Callable

P = ParamSpec("P")


class Topic(Generic[P]):
    """An event with its listeners, told in the order they subscribed."""

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: list[Callable[P, None]] = []

    def subscribe(self, listener: Callable[P, None]) -> None:
        self._listeners.append(listener)

    def publish(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self._listeners:
            listener(*args, **kwargs)


__all__ = ["Topic"]
