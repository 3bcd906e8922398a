"""
The stdio face: the editor spawns ``acp-bridge stdio`` and speaks ACP on its stdin/stdout.

stdout is the protocol and nothing else: before anything runs, the protocol gets a private
duplicate of fd 1 and fd 1 itself is pointed at stderr, so a stray ``print`` or a library
writing to stdout lands in the diagnostics, never in the protocol stream.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import structlog
import trio

from acp_bridge.agents.prespawn import claim_stdout as claim_stdout  # (its old home)
from acp_bridge.agents.process import Reaper, make_subprocess_launcher
from acp_bridge.engine.audit import AuditLog
from acp_bridge.engine.bridge import Bridge
from acp_bridge.engine.journal import Journal
from acp_bridge.faces.stream import serve_client_stream
from acp_bridge.observe.redact import Redactor
from acp_bridge.runtime.heap import fix_mmap_threshold, trim_heap_forever
from acp_bridge.runtime.nursery import cancel_on_signals
from acp_bridge.store.db import Store, open_store

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import IO

    from acp_bridge.agents.prespawn import Prespawned
    from acp_bridge.agents.process import Launcher
    from acp_bridge.config.model import Config
    from acp_bridge.faces.early import Handover
    from acp_bridge.observe.trace import WireTrace
    from acp_bridge.protocol.jsonrpc import JsonObject

logger = structlog.get_logger("acp_bridge.stdio")


async def with_bridge(
    config: Config,
    body: Callable[[Bridge], Awaitable[object]],
    *,
    launcher: Launcher | None = None,
    agent_client_capabilities: JsonObject | None = None,
    tracer: WireTrace | None = None,
    redactor: Redactor | None = None,
    adopt: Prespawned | None = None,
) -> None:
    """
    Run a bridge with real agent processes around ``body(bridge)``; stop everything after it.

    Agents are stopped first (gracefully: stdin EOF → SIGTERM → SIGKILL), then the reaper
    watchdog is let go. SIGTERM and SIGINT end ``body`` early, the same way. The store
    (``[store] path``) holds the audit trail; it is opened first and closed last. ``tracer``
    sees every message crossing the bridge (a :class:`~acp_bridge.observe.trace.WireTrace`), and
    ``redactor`` becomes the bridge's (give the trace and the logs the same one). With
    glibc, large buffers get their own mappings and freed heap memory is given back to the
    system after each burst of traffic (see ``runtime.heap``). ``adopt``: the default agent, spawned
    before the imports (``agents.prespawn``), becomes its first launch.

    Raises:
        StoreError: the store cannot be opened (or is of a newer schema).
    """
    fix_mmap_threshold()
    store = await trio.to_thread.run_sync(open_store, config.store.resolved_path())
    try:
        async with trio.open_nursery() as outer:
            reaper: Reaper | None = None
            if launcher is None:
                reaper = Reaper()
                await outer.start(reaper.run)
                launcher = make_subprocess_launcher(
                    reaper=reaper, stop_grace=config.bridge.stop_grace, adopt=adopt
                )
            outer.start_soon(cancel_on_signals, outer.cancel_scope, logger)
            async with trio.open_nursery() as inner:
                bridge = Bridge(
                    config,
                    launcher,
                    agent_client_capabilities=agent_client_capabilities,
                    audit=AuditLog(store),
                    tracer=tracer,
                    journal=_journal_of(config, store),
                    redactor=redactor,
                )
                await inner.start(bridge.run)
                counters = bridge.hub.counters
                inner.start_soon(
                    trim_heap_forever, lambda: counters["from_agent"] + counters["to_client"]
                )
                try:
                    await body(bridge)
                finally:
                    inner.cancel_scope.cancel()
            outer.cancel_scope.cancel()
    finally:
        store.close()


async def serve_stdio(
    config: Config,
    protocol_fd: int,
    *,
    trace_file: IO[bytes] | None = None,
    redactor: Redactor | None = None,
    adopt: Prespawned | None = None,
    early: Handover | None = None,
) -> None:
    """
    Serve the client on stdin and ``protocol_fd`` until stdin ends (traced to ``trace_file``).

    ``redactor``: the secrets hidden in the trace, the bridge's and the logs' (pass the one
    logging was configured with). ``adopt``: the default agent's process, already spawned.
    ``early``: what the start read of stdin, and the ``initialize`` it answered (``faces.early``).
    """
    redactor = redactor if redactor is not None else Redactor()
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(protocol_fd)
    preread, request = b"", None
    if early is not None:
        for event, fields in early.notes:
            logger.debug(event, **fields)
        preread, request = early.stdin, early.request

    async def body(bridge: Bridge) -> None:
        on_open = None
        if request is not None:
            on_open = functools.partial(bridge.from_client.initialized_early, msg=request)
        await serve_client_stream(bridge, stdin, stdout, preread=preread, on_open=on_open)

    try:
        if trace_file is None:  # (the trace's module is not loaded without --trace)
            await with_bridge(config, body, redactor=redactor, adopt=adopt)
        else:
            from acp_bridge.observe.trace import open_wire_trace

            async with open_wire_trace(trace_file, redactor=redactor) as tracer:
                await with_bridge(config, body, tracer=tracer, redactor=redactor, adopt=adopt)
    finally:
        with trio.CancelScope(shield=True):
            await stdin.aclose()
            await stdout.aclose()


def _journal_of(config: Config, store: Store) -> Journal | None:
    settings = config.store
    if not settings.journal:
        return None
    days = settings.journal_days
    return Journal(
        store, keep_entries=settings.journal_keep, max_age=days * 86400 if days else None
    )
