"""
Helpers for the commands' root nurseries: stop on a signal, see through exception groups.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

__all__ = ["cancel_on_signals", "leaves"]


async def cancel_on_signals(scope: trio.CancelScope, log: FilteringBoundLogger) -> None:
    """Cancel ``scope`` at the first SIGTERM or SIGINT (logged as ``signal_received``)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal_received", signal=signal.Signals(signum).name)
            scope.cancel()
            return


def leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions in ``group`` and its nested groups, depth first, in order."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
