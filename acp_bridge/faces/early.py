"""
``acp-bridge stdio`` answers the client's first ``initialize`` before its imports are done
(docs/performance.md, "Start-up").

The default agent is spawned before the heavy imports (``agents.prespawn``); importing trio, the
configuration's code and the bridge then takes about 120 ms of CPU, which on a loaded machine
outlasts the agent's own start. So the imports run in a thread (:class:`Background`, which
also loads the configuration), and the main thread, with the standard library and the
bridge's pure codec only, waits for the client's first line (:func:`answer_early`). When it is
an ``initialize`` of protocol 1 that the bridge would answer (:func:`client_request`), the
agent gets the very ``initialize`` the supervisor's handshake sends (id 1, the params of
``protocol.initialize.agent_params``), and once it answered with a result of protocol 1 and the
configuration is loaded (its default agent the one spawned, no ``experimental_v2``, the line
within ``max_line_bytes``), the client gets the answer ``engine.from_client`` would give, built by
the same function (``protocol.initialize.bridge_answer``). The trio phase takes over from there
(:class:`Handover`): the client noted as initialized, the agent adopted as ready (its
launch skips the handshake), and every byte read but not consumed handed to the readers
first: the rest of stdin, the agent's stdout besides its answer (stray lines are reported
as stray then).

Anything else goes the usual way and loses nothing. Before the agent got an ``initialize``
(the first line is something else, the imports finished first, stdin ended), the bytes read
are handed over as they are. After, when the agent answered an error, oddly, another
version, exited or did not answer within its ``start_timeout``, the client's line is handed
over unconsumed and the agent with its ``initialize`` outstanding
(``Prespawned.initialize_sent``) and all it wrote: the trio phase answers the client the
usual way, its handshake waiting for that ``initialize``'s answer (or meeting the agent's
exit) in what is left of ``start_timeout``, so the client gets exactly today's answer from
the one agent. When the configuration disagrees or failed to load, the early agent is
stopped at once and the trio phase launches the agent anew with the client's line
unconsumed. Every wait is bounded: the client's first line by the imports' end, the agent's
answer by its ``start_timeout`` (once the configuration says it), the configuration by the
thread's end. Nothing is logged here (structlog is not loaded yet): what happened is held
in :attr:`Handover.notes` and logged by the trio phase. ``ACP_BRIDGE_EARLY_INIT=0`` in the
environment turns this off (the trio phase answers, as before).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable

    from acp_bridge.agents.prespawn import Prespawned
    from acp_bridge.protocol.jsonrpc import JsonObject

#: the environment switch: "0" turns the early answer off
ENV_SWITCH: Final = "ACP_BRIDGE_EARLY_INIT"
#: the id of the early ``initialize`` to the agent: its first request on the bridge's link
EARLY_ID: Final = 1
#: a first line or an agent's answer longer than this goes the usual way (both are small;
#: the bounds keep every write here within an empty pipe's 64 KiB, so none can block)
MAX_LINE: Final = 32 * 1024
#: the agent's stdout held while waiting for its answer; more goes the usual way
MAX_AGENT_BYTES: Final = 1024 * 1024
#: the GIL's switch interval while the imports run beside the main thread (the default
#: 5 ms would delay each of its few steps by up to that much)
SWITCH_INTERVAL: Final = 0.0002


def enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(ENV_SWITCH) != "0"


class Handover:
    """What the standard-library phase read and did, for the trio phase."""

    def __init__(self) -> None:
        #: bytes of stdin read and not consumed (the first line too, unless it was answered)
        self.stdin = b""
        #: the client's ``initialize`` request, when it was answered here
        self.request: JsonObject | None = None
        #: log lines held until structlog is up: (event, fields)
        self.notes: list[tuple[str, dict[str, Any]]] = []

    def note(self, event: str, **fields: Any) -> None:
        self.notes.append((event, fields))


class Background:
    """
    The heavy imports in a thread: first the pure modules the main thread needs, then the
    configuration loaded (``load``), then the rest (``imports``). Each stage makes
    :attr:`fd` readable; the switch interval is short until :meth:`join`.
    """

    def __init__(self, load: Callable[[], Any], imports: Callable[[], None]) -> None:
        self._load = load
        self._imports = imports
        self._config: Any = None
        self._error: BaseException | None = None
        self.config_done = False
        self.done = False
        self.fd, self._wake = os.pipe()
        self._interval = sys.getswitchinterval()
        self._thread = threading.Thread(target=self._run, name="acp-bridge-imports", daemon=True)

    def start(self) -> None:
        sys.setswitchinterval(SWITCH_INTERVAL)
        self._thread.start()

    def _run(self) -> None:
        try:
            import acp_bridge.protocol.initialize  # noqa: F401  (the main thread's, first)

            self._config = self._load()
        except BaseException as exc:  # (raised again by config(), in the main thread)
            self._error = exc
        self.config_done = True
        os.write(self._wake, b"c")
        if self._error is None:
            # (a failed import: the main thread's own import raises it again)
            with contextlib.suppress(BaseException):
                self._imports()
        self.done = True
        os.write(self._wake, b"d")

    def drain(self) -> None:
        os.read(self.fd, 64)

    @property
    def failed(self) -> bool:
        return self._error is not None

    def config(self) -> Any:
        """The loaded configuration (after :meth:`join`), or the loading's exception raised."""
        if self._error is not None:
            raise self._error
        return self._config

    def join(self) -> None:
        self._thread.join()
        sys.setswitchinterval(self._interval)
        os.close(self.fd)
        os.close(self._wake)


def v2_asked(config_path: str | None, flag: bool) -> bool:
    """``--experimental-v2``, or ``[bridge] experimental_v2`` in the file, read quickly."""
    if flag or config_path is None:
        return flag
    import tomllib

    try:
        with open(config_path, "rb") as f:
            bridge = tomllib.load(f).get("bridge")
    except (OSError, ValueError):  # (the loading proper reports it)
        return False
    return isinstance(bridge, dict) and bridge.get("experimental_v2") is True


def client_request(line: bytes) -> JsonObject | None:
    """
    The client's first line as an ``initialize`` request the early answer may take: a
    request the bridge would answer (its params pass ``protocol.initialize.client_options``) asking
    for protocol 1 or below (a v2 ``initialize`` goes the usual way); else None.
    """
    from acp_bridge.protocol.initialize import client_options
    from acp_bridge.protocol.jsonrpc import JsonRpcError, Kind, classify, loads, params_of

    if len(line) > MAX_LINE:
        return None
    try:
        msg = loads(line)
    except JsonRpcError:
        return None
    if classify(msg) is not Kind.REQUEST or msg["method"] != "initialize":
        return None
    params = params_of(msg)
    try:
        client_options(params)
    except JsonRpcError:
        return None
    if params["protocolVersion"] > 1:
        return None
    request: JsonObject = msg
    return request


def find_answer(data: bytes | bytearray) -> tuple[JsonObject, int, int] | None:
    """
    The agent's answer to the early ``initialize`` among the complete lines of ``data`` (its
    stdout so far): (the message, where its line starts, where it ends, newline included);
    None while it is not there. Other lines are left to the bridge's reader.
    """
    from acp_bridge.protocol.jsonrpc import JsonRpcError, Kind, classify, loads

    start = 0
    while (nl := data.find(b"\n", start)) >= 0:
        line = bytes(data[start:nl])
        if b'"id"' in line:  # (a line without one is no answer: not decoded here)
            try:
                msg = loads(line)
            except JsonRpcError:
                msg = None
            if classify(msg) is Kind.RESPONSE and msg.get("id") == EARLY_ID:
                return msg, start, nl + 1
        start = nl + 1
    return None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _write_all(fd: int, data: bytes) -> bool:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        return False
    return True


def answer_early(
    prespawned: Prespawned,
    background: Background,
    protocol_fd: int,
    *,
    stdin_fd: int = 0,
    v2_hint: bool = False,
) -> Handover:
    """
    Wait for the client's first line and answer it if it is an ``initialize`` the early path
    takes (see the module's docstring); returns what the trio phase takes over. ``v2_hint``:
    the command line or the file asks for ``experimental_v2`` (the configuration decides; the
    hint spares the agent an ``initialize`` that would be undone).
    """
    hand = Handover()
    began = time.monotonic()
    buf = bytearray()
    line = b""
    # 1. The client's first line, unless the imports are done first.
    while True:
        ready, _, _ = select.select([stdin_fd, background.fd], [], [])
        if background.fd in ready:
            background.drain()
            if background.done:
                hand.stdin = bytes(buf)
                hand.note("early_initialize_skipped", reason="the imports were done first")
                return hand
        if stdin_fd in ready:
            data = os.read(stdin_fd, 65536)
            buf += data
            nl = buf.find(b"\n")
            if not data or nl >= 0 or len(buf) > MAX_LINE:
                break
    nl = buf.find(b"\n")
    request = None
    if nl >= 0 and not v2_hint:
        line = bytes(buf[:nl])
        request = client_request(line)
    if request is None:
        hand.stdin = bytes(buf)
        hand.note("early_initialize_skipped", reason="the first line is not one it takes")
        return hand

    # 2. The agent's initialize, the one the supervisor's handshake sends.
    from acp_bridge.protocol.initialize import agent_params, client_options
    from acp_bridge.protocol.jsonrpc import dumps, params_of
    from acp_bridge.protocol.jsonrpc import request as rpc_request

    assert prespawned.fds is not None
    to_agent, from_agent = prespawned.fds[0], prespawned.fds[1]
    # (a local agent: it is offered the client's capabilities as they are, _remote)
    offered = dict(client_options(params_of(request)).capabilities)
    sent = _write_all(to_agent, dumps(rpc_request(EARLY_ID, "initialize", agent_params(offered))))
    sent_at = time.monotonic()

    def give_up(reason: str) -> Handover:
        prespawned.abandon()
        hand.stdin = bytes(buf)
        hand.note("early_initialize_abandoned", reason=reason)
        return hand

    def leave(reason: str) -> Handover:
        # The agent keeps its initialize: the launch's handshake waits for its answer (or
        # meets its exit), in what is left of start_timeout, with every byte it wrote.
        prespawned.initialize_sent = sent_at
        prespawned.stdout_rest = bytes(out)
        hand.stdin = bytes(buf)
        hand.note("early_initialize_left", reason=reason)
        return hand

    out = bytearray()
    if not sent:
        return give_up("the agent's stdin is closed")

    # 3. Its answer, and the configuration (checked once loaded, as the bridge checks).
    from acp_bridge.protocol.initialize import agent_fields, bridge_answer
    from acp_bridge.protocol.jsonrpc import result as rpc_result
    from acp_bridge.protocol.wire import PROTOCOL_VERSION

    found = None
    deadline: float | None = None
    config_at = answer_at = 0.0
    while found is None or deadline is None:
        if deadline is None and background.config_done:
            if background.failed:
                return give_up("the configuration did not load")
            config = background.config()
            agent = prespawned.matches(config)
            if agent is None:
                return give_up("the configuration's default agent is another")
            if config.bridge.experimental_v2:
                return give_up("experimental_v2")
            if len(line) > config.bridge.max_line_bytes:
                return give_up("the first line is over max_line_bytes")
            deadline = sent_at + agent.start_timeout
            config_at = time.monotonic()
            if found is not None:
                break
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        waits = [background.fd] if found is not None else [from_agent, background.fd]
        ready, _, _ = select.select(waits, [], [], timeout)
        if background.fd in ready:
            background.drain()
        if from_agent in ready:
            data = os.read(from_agent, 65536)
            if not data:
                return leave("the agent's stdout ended")
            out += data
            found = find_answer(out)
            answer_at = time.monotonic()
            if found is None and len(out) > MAX_AGENT_BYTES:
                return leave("the agent wrote too much before its answer")
        elif not ready and found is None:
            return leave("no answer within start_timeout")

    # 4. The answer checked as the handshake checks it, then the bridge's.
    answer, start, end = found
    result = answer.get("result")
    if end - start > MAX_LINE:
        return leave("the agent's answer is long")
    if "error" in answer or not isinstance(result, dict):
        return leave("the agent answered with an error, or oddly")
    if result.get("protocolVersion") != PROTOCOL_VERSION:
        return leave("the agent speaks another protocol version")
    fields = agent_fields(result)
    default = config.default_agent.name
    ours = bridge_answer(
        fields.capabilities,
        # (the others are not started: nothing advertised yet)
        [fields.capabilities if name == default else {} for name in config.agents],
        fields.auth_methods,
        default,
        list(config.agents),
    )
    if not _write_all(protocol_fd, dumps(rpc_result(request["id"], ours))):
        # (the client is gone: the trio phase meets that the usual way)
        hand.note("early_initialize_unsent")
    prespawned.initialized = result
    prespawned.stdout_rest = bytes(out[:start] + out[end:])
    hand.request = request
    hand.stdin = bytes(buf[nl + 1 :])
    hand.note(
        "early_initialize_answered",
        # (milliseconds from this phase's start: the initialize sent to the agent, the
        # configuration loaded, the agent's answer read, the client's answer written)
        sent_ms=_ms(sent_at - began),
        config_ms=_ms(config_at - began),
        agent_ms=_ms(answer_at - began),
        answered_ms=_ms(time.monotonic() - began),
    )
    return hand


__all__ = [
    "ENV_SWITCH",
    "Background",
    "Handover",
    "answer_early",
    "client_request",
    "enabled",
    "find_answer",
    "v2_asked",
]
