"""
The bundled demo agent: a deterministic, scripted ACP v1 agent (no model, no network).

It speaks NDJSON JSON-RPC 2.0 over any pair of trio byte streams, so tests drive it in-process
over memory streams and ``acp-bridge demo-agent`` runs it over stdin/stdout. What it does with a
prompt depends only on the prompt text (see :func:`parse_script`):

- ``fail``: answer the prompt with a JSON-RPC error (-32603).
- ``write FILE TEXT``: a ``tool_call`` (kind ``edit``), ``session/request_permission``, then
  ``fs/write_text_file`` if allowed and the client advertised ``fs.writeTextFile``
  (``allow-always`` is remembered for the rest of the session).
- ``read FILE``: ``fs/read_text_file`` if the client advertised ``fs.readTextFile``, then stream
  the content back.
- ``count N`` / ``slow``: stream N (``slow``: 50) numbered chunks, ``chunk_delay`` apart.
- ``env NAME``: stream ``NAME=VALUE`` of the agent's environment (``NAME is not set``; a
  secret-looking name, as :data:`acp_bridge._redact.SECRET_NAME` sees them, shows ``***``): where
  it runs, e.g. ``SSH_CONNECTION`` over ssh.
- anything else: a ``plan``, then "You said: <text>" streamed word by word.

Keywords are case-insensitive whole words, tried in that order. Every update of a turn is sent
before the ``session/prompt`` response, and a ``session/load`` replay before the load response.

Concurrency: one reader task dispatches every incoming line; each prompt turn runs as its own
task in a nursery, so several sessions stream at once while the reader still sees
``session/cancel`` and the client's responses. One writer task owns the output stream and drains a
bounded channel: a turn cancelled mid-write can never leave half a line on the wire.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import secrets
import sys
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, assert_never

import attrs
import structlog
import trio

from acp_bridge._framing import LineDecoder, Oversize
from acp_bridge._jsonrpc import (
    JsonObject,
    JsonRpcError,
    JsonRpcId,
    Kind,
    classify,
    dumps,
    error,
    is_valid_id,
    loads,
    notification,
    params_of,
    request,
    result,
)
from acp_bridge._log import configure_logging
from acp_bridge._redact import MASK, SECRET_NAME

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

logger = structlog.get_logger(__name__)

#: The only protocol version this agent speaks.
PROTOCOL_VERSION: Final = 1
#: Seconds between streamed chunks when run from the command line (a human sees it stream).
DEFAULT_CHUNK_DELAY: Final = 0.02
#: How many chunks ``slow`` streams.
SLOW_COUNT: Final = 50
#: Upper bound for ``count N``: a typo must not start a turn that streams for hours.
MAX_COUNT: Final = 1000
#: Longest text kept per history entry; longer prompts and replies are stored truncated.
MAX_ENTRY_CHARS: Final = 64 * 1024
#: Most message chunks one reply is split into; the tail of a long text goes out as one piece.
MAX_PIECES: Final = 100
#: Messages queued for the writer before senders wait (backpressure from a slow client).
OUTBOX_SIZE: Final = 64
_RECEIVE_BYTES: Final = 64 * 1024

StopReason: TypeAlias = Literal["end_turn", "cancelled"]
END_TURN: Final = "end_turn"
CANCELLED: Final = "cancelled"

_MODES: Final = (("ask", "Ask", "Answer questions"), ("code", "Code", "Pretend to write code"))
_STYLES: Final = (("plain", "Plain"), ("fancy", "Fancy"))
_ALLOW_ONCE: Final = "allow-once"
_ALLOW_ALWAYS: Final = "allow-always"
_REJECT_ONCE: Final = "reject-once"
_PERMISSION_OPTIONS: Final = (
    {"optionId": _ALLOW_ONCE, "name": "Allow once", "kind": "allow_once"},
    {"optionId": _ALLOW_ALWAYS, "name": "Always allow in this session", "kind": "allow_always"},
    {"optionId": _REJECT_ONCE, "name": "Reject", "kind": "reject_once"},
)
_COMMANDS: Final = (
    {"name": "count", "description": "Stream N numbered chunks", "input": {"hint": "N"}},
    {"name": "slow", "description": f"Stream {SLOW_COUNT} chunks slowly (try cancelling)"},
    {"name": "write", "description": "Write a file (asks first)", "input": {"hint": "FILE TEXT"}},
    {"name": "read", "description": "Read a file back to you", "input": {"hint": "FILE"}},
    {"name": "fail", "description": "Answer the prompt with a JSON-RPC error"},
    {"name": "env", "description": "Show one environment variable", "input": {"hint": "NAME"}},
)


def _package_version() -> str:
    # Imported late: acp_bridge/__init__.py may re-export this module.
    from acp_bridge import __version__

    return __version__


@attrs.frozen
class DemoOptions:
    """
    Knobs of the demo agent.

    Attributes:
        chunk_delay: seconds between streamed message chunks (0 in tests).
        name: ``agentInfo.name``.
        title: ``agentInfo.title``.
        session_prefix: session ids are ``f"{session_prefix}{run}-{n}"``: ``run`` is random
            per agent process (so ids are unique across runs: a bridge that restarts on the
            same store finds no new session with a stored one's id), n counts from 1.
        load_session: advertise and serve ``session/load``.
        max_sessions: open sessions at most; ``session/new`` fails beyond that.
        max_history: history entries kept per session (oldest dropped first); a ``session/load``
            replays only what is kept.
    """

    chunk_delay: float = attrs.field(default=DEFAULT_CHUNK_DELAY, validator=attrs.validators.ge(0))
    name: str = attrs.field(default="acp-bridge-demo", validator=attrs.validators.min_len(1))
    title: str = "acp-bridge demo agent"
    session_prefix: str = "demo-"
    load_session: bool = True
    max_sessions: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    max_history: int = attrs.field(default=1000, validator=attrs.validators.ge(1))


# -- What a prompt asks for (pure) ---------------------------------------------------------------


@attrs.frozen
class Echo:
    """Reply "You said: <text>"."""


@attrs.frozen
class WriteFile:
    """Write ``content`` to ``name`` (relative to the session cwd), with permission."""

    name: str
    content: str


@attrs.frozen
class ReadFile:
    """Read ``name`` (relative to the session cwd) and stream it back."""

    name: str


@attrs.frozen
class Count:
    """Stream ``n`` numbered chunks."""

    n: int


@attrs.frozen
class Fail:
    """Answer the prompt with a JSON-RPC error."""


@attrs.frozen
class ShowEnv:
    """Stream ``NAME=VALUE`` of the agent's own environment."""

    name: str


Script: TypeAlias = Echo | WriteFile | ReadFile | Count | Fail | ShowEnv

_FAIL_RE: Final = re.compile(r"\bfail\b", re.IGNORECASE)
# One separator character after FILE is dropped, so "write a.txt\nline" writes "line".
_WRITE_RE: Final = re.compile(r"\bwrite\s+(\S+)\s?(.*)", re.IGNORECASE | re.DOTALL)
_READ_RE: Final = re.compile(r"\bread\s+(\S+)", re.IGNORECASE)
_COUNT_RE: Final = re.compile(r"\bcount\s+(\d+)", re.IGNORECASE)
_SLOW_RE: Final = re.compile(r"\bslow\b", re.IGNORECASE)
_ENV_RE: Final = re.compile(r"\benv\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def parse_script(text: str) -> Script:
    """Decide what a prompt asks for; the first keyword in this order wins: fail, write, read,
    count, slow, env."""
    if _FAIL_RE.search(text):
        return Fail()
    if m := _WRITE_RE.search(text):
        return WriteFile(m[1], m[2])
    if m := _READ_RE.search(text):
        return ReadFile(m[1])
    if m := _COUNT_RE.search(text):
        return Count(min(int(m[1]), MAX_COUNT))
    if _SLOW_RE.search(text):
        return Count(SLOW_COUNT)
    if m := _ENV_RE.search(text):
        return ShowEnv(m[1])
    return Echo()


def prompt_text(prompt: object) -> str:
    """The text of a ``session/prompt``: its text blocks concatenated (other blocks ignored)."""
    if type(prompt) is not list:
        raise JsonRpcError.invalid_params("prompt must be an array of content blocks")
    return "".join(
        block["text"]
        for block in prompt
        if type(block) is dict and block.get("type") == "text" and type(block.get("text")) is str
    )


def resolve_path(cwd: str, name: str) -> str | None:
    """The absolute path of ``name`` under ``cwd``, or None when it would land outside ``cwd``."""
    base = os.path.normpath(cwd)
    path = os.path.normpath(os.path.join(base, name))
    if path == base or os.path.commonpath([base, path]) != base:
        return None
    return path


def split_words(text: str) -> list[str]:
    """Split text into word-sized pieces (each keeps its trailing whitespace); joined, they give
    back ``text``. At most :data:`MAX_PIECES` pieces."""
    pieces = re.findall(r"\s+|\S+\s*", text) if text else []
    if len(pieces) > MAX_PIECES:
        pieces[MAX_PIECES - 1 :] = ["".join(pieces[MAX_PIECES - 1 :])]
    return pieces


def env_line(name: str, environ: Mapping[str, str]) -> str:
    """What ``env NAME`` answers: ``NAME=VALUE``, ``NAME=***`` or ``NAME is not set``."""
    if name not in environ:
        return f"{name} is not set"
    return f"{name}={MASK if SECRET_NAME.search(name) else environ[name]}"


def count_pieces(n: int) -> list[str]:
    """The chunks of ``count N``: "1 ", "2 ", ..., "N" (nothing for 0)."""
    return [f"{i} " for i in range(1, n)] + ([f"{n}"] if n > 0 else [])


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ENTRY_CHARS else text[:MAX_ENTRY_CHARS] + " [truncated]"


def _text_block(text: str) -> JsonObject:
    return {"type": "text", "text": text}


def _modes(current: str) -> JsonObject:
    return {
        "currentModeId": current,
        "availableModes": [{"id": i, "name": n, "description": d} for i, n, d in _MODES],
    }


def _config_options(style: str) -> list[JsonObject]:
    return [
        {
            "id": "style",
            "name": "Reply style",
            "description": "How the demo agent formats its echo",
            "type": "select",
            "currentValue": style,
            "options": [{"value": v, "name": n} for v, n in _STYLES],
        }
    ]


def _plan(reply_status: str) -> JsonObject:
    return {
        "sessionUpdate": "plan",
        "entries": [
            {"content": "Read the prompt", "priority": "high", "status": "completed"},
            {"content": "Echo it back", "priority": "medium", "status": reply_status},
        ],
    }


def _permission_choice(response: object) -> str | None:
    """The chosen optionId, ``"cancelled"``, or None for an answer we can't read."""
    outcome = response.get("outcome") if type(response) is dict else None
    if type(outcome) is not dict:
        return None
    if outcome.get("outcome") == "cancelled":
        return CANCELLED
    option = outcome.get("optionId")
    return option if outcome.get("outcome") == "selected" and type(option) is str else None


def _str_param(params: JsonObject, key: str) -> str:
    value = params.get(key)
    if type(value) is not str:
        raise JsonRpcError.invalid_params(f"{key} must be a string")
    return value


def _cwd_param(params: JsonObject) -> str:
    cwd = _str_param(params, "cwd")
    if not os.path.isabs(cwd):
        raise JsonRpcError.invalid_params("cwd must be an absolute path")
    return cwd


# -- Per-session state ---------------------------------------------------------------------------


@attrs.frozen
class _Entry:
    role: Literal["user", "agent"]
    text: str


@attrs.define(eq=False)
class _Turn:
    """
    One running ``session/prompt``.

    Cancellation: ``session/cancel`` cancels :attr:`scope` at once, except while the turn waits
    for an answer from the client (permission, fs): the client still owes that answer (it must
    answer a permission request ``cancelled``), so the turn keeps waiting and then checks
    :attr:`cancel_requested` itself.
    """

    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    cancel_requested: bool = False
    awaiting_client: bool = False
    reply: list[str] = attrs.Factory(list)
    reply_chars: int = 0

    def request_cancel(self) -> None:
        self.cancel_requested = True
        if not self.awaiting_client:
            self.scope.cancel()

    def add_reply(self, text: str) -> None:
        # Bounded: the history keeps at most MAX_ENTRY_CHARS of a reply.
        room = MAX_ENTRY_CHARS - self.reply_chars
        if room > 0:
            self.reply.append(text[:room])
            self.reply_chars += min(len(text), room)


@attrs.define(eq=False)
class _Session:
    session_id: str
    cwd: str
    history: collections.deque[_Entry]
    mode_id: str = _MODES[0][0]
    style: str = _STYLES[0][0]
    title: str | None = None
    always_allow_writes: bool = False
    tool_calls: int = 0
    turn: _Turn | None = None

    def next_tool_call_id(self) -> str:
        self.tool_calls += 1
        return f"call-{self.tool_calls}"

    def info(self) -> JsonObject:
        info: JsonObject = {"sessionId": self.session_id, "cwd": self.cwd}
        if self.title is not None:
            info["title"] = self.title
        return info

    def setup_result(self) -> JsonObject:
        """The shared part of the new/load/resume results."""
        return {"modes": _modes(self.mode_id), "configOptions": _config_options(self.style)}


@attrs.frozen
class _Reply:
    """A handler's answer: the result, then notifications to send right after it."""

    result: JsonObject
    then: tuple[JsonObject, ...] = ()


class _ClientError(Exception):
    """The client answered one of our requests with a JSON-RPC error."""

    def __init__(self, err: JsonRpcError) -> None:
        super().__init__(err.message)
        self.error = err


@attrs.define(eq=False)
class _Waiter:
    """An agent→client request waiting for its response."""

    done: trio.Event = attrs.Factory(trio.Event)
    response: JsonObject = attrs.Factory(dict)


# -- The agent -----------------------------------------------------------------------------------


class _DemoAgent:
    """State of one connection; every method runs in the reader task or in a turn task."""

    def __init__(
        self,
        options: DemoOptions,
        outbox: trio.MemorySendChannel[bytes],
        turns: trio.Nursery,
    ) -> None:
        self._opts = options
        self._outbox = outbox
        self._turns = turns
        self._log = logger.bind(agent=options.name)
        self._initialized = False
        self._can_read = False
        self._can_write = False
        self._sessions: dict[str, _Session] = {}
        self._minted = 0
        #: 48 random bits per process: a second run of this agent mints no id of the first
        self._run = secrets.token_hex(6)
        self._next_id = 0
        self._waiting: dict[int, _Waiter] = {}
        handlers: dict[str, Callable[[JsonObject], Awaitable[_Reply]]] = {
            "initialize": self._initialize,
            "session/new": self._new_session,
            "session/resume": self._resume_session,
            "session/close": self._close_session,
            "session/list": self._list_sessions,
            "session/set_mode": self._set_mode,
            "session/set_config_option": self._set_config_option,
        }
        if options.load_session:
            handlers["session/load"] = self._load_session
        self._handlers = handlers

    # -- reading -------------------------------------------------------------------------------

    async def read_until_eof(self, receive: trio.abc.ReceiveStream) -> None:
        """Dispatch every line from ``receive`` until EOF (or a broken stream)."""
        decoder = LineDecoder()
        while True:
            try:
                data = await receive.receive_some(_RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._log.info("client_stream_broken")
                return
            if not data:
                break
            for line in decoder.feed(bytes(data)):  # receive_some may hand us a bytearray
                await self._on_line(line)
        # A last line without its newline: the client meant it, so serve it.
        tail = decoder.feed_eof()
        if tail is not None:
            await self._on_line(tail)
        self._log.info("client_eof")

    async def _on_line(self, line: bytes | Oversize) -> None:
        if isinstance(line, Oversize):
            self._log.warning("line_too_long", size=line.size)
            await self._send(error(None, JsonRpcError.parse_error(f"line of {line.size} bytes")))
            return
        try:
            msg = loads(line)
        except JsonRpcError as exc:
            self._log.warning("unparseable_line", size=len(line))
            await self._send(error(None, exc))
            return
        match classify(msg):
            case Kind.REQUEST:
                await self._on_request(msg)
            case Kind.NOTIFICATION:
                self._on_notification(msg)
            case Kind.RESPONSE:
                self._on_response(msg)
            case Kind.INVALID:
                id_ = msg.get("id") if type(msg) is dict else None
                await self._send(error(id_ if is_valid_id(id_) else None, _not_jsonrpc()))
            case unreachable:
                assert_never(unreachable)

    async def _on_request(self, msg: JsonObject) -> None:
        id_: JsonRpcId = msg["id"]
        method: str = msg["method"]
        params = params_of(msg)
        try:
            if not self._initialized and method != "initialize":
                raise JsonRpcError.invalid_request("send initialize first")
            if method == "session/prompt":
                self._start_turn(id_, params)
                return
            handler = self._handlers.get(method)
            if handler is None:
                raise JsonRpcError.method_not_found(method)
            reply = await handler(params)
        except JsonRpcError as exc:
            await self._send(error(id_, exc))
            return
        except Exception:  # a bug in one handler must not end the connection
            self._log.exception("handler_crashed", method=method)
            await self._send(error(id_, JsonRpcError.internal_error("demo agent bug")))
            return
        await self._send(result(id_, reply.result))
        for note in reply.then:
            await self._send(note)

    def _on_notification(self, msg: JsonObject) -> None:
        if msg["method"] != "session/cancel":
            return  # unknown notifications are ignored (ACP extensibility rules)
        session_id = params_of(msg).get("sessionId")
        session = self._sessions.get(session_id) if type(session_id) is str else None
        if session is not None and session.turn is not None:
            self._log.info("turn_cancel_requested", session_id=session.session_id)
            session.turn.request_cancel()

    def _on_response(self, msg: JsonObject) -> None:
        waiter = self._waiting.get(msg["id"]) if type(msg["id"]) is int else None
        if waiter is None:
            # Late answer to a request whose turn is gone, or a client bug: nothing waits.
            self._log.info("unexpected_response", id=msg["id"])
            return
        waiter.response = msg
        waiter.done.set()

    # -- writing and calling the client ----------------------------------------------------------

    async def _send(self, msg: JsonObject) -> None:
        await self._outbox.send(dumps(msg))

    async def _update(self, session: _Session, update: JsonObject) -> None:
        params = {"sessionId": session.session_id, "update": update}
        await self._send(notification("session/update", params))

    async def _call_client(self, method: str, params: JsonObject) -> object:
        """Send a request to the client and return its result; :class:`_ClientError` if it
        answers with an error."""
        id_ = self._next_id
        self._next_id += 1
        waiter = self._waiting[id_] = _Waiter()
        try:
            await self._send(request(id_, method, params))
            await waiter.done.wait()
        finally:
            del self._waiting[id_]
        if "error" in waiter.response:
            raise _ClientError(_error_from_wire(waiter.response["error"]))
        return waiter.response["result"]

    async def _ask_client(self, turn: _Turn, method: str, params: JsonObject) -> object:
        """:meth:`_call_client` from a turn: a ``session/cancel`` meanwhile is deferred, the
        caller checks ``turn.cancel_requested`` afterwards."""
        turn.awaiting_client = True
        try:
            return await self._call_client(method, params)
        finally:
            turn.awaiting_client = False

    # -- connection and session methods ----------------------------------------------------------

    async def _initialize(self, params: JsonObject) -> _Reply:
        if self._initialized:
            raise JsonRpcError.invalid_request("already initialized")
        version = params.get("protocolVersion")
        if type(version) is not int:
            raise JsonRpcError.invalid_params("protocolVersion must be an integer")
        caps = params.get("clientCapabilities")
        fs = caps.get("fs") if type(caps) is dict else None
        if type(fs) is dict:
            self._can_read = fs.get("readTextFile") is True
            self._can_write = fs.get("writeTextFile") is True
        self._initialized = True
        self._log.info(
            "initialized", client_version=version, fs_read=self._can_read, fs_write=self._can_write
        )
        # We only speak 1: that is both "the same version" and "the latest we support".
        return _Reply(
            {
                "protocolVersion": PROTOCOL_VERSION,
                "agentCapabilities": {
                    "loadSession": self._opts.load_session,
                    "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                    "sessionCapabilities": {"list": {}, "close": {}, "resume": {}},
                },
                "agentInfo": {
                    "name": self._opts.name,
                    "title": self._opts.title,
                    "version": _package_version(),
                },
                "authMethods": [],
            }
        )

    async def _new_session(self, params: JsonObject) -> _Reply:
        cwd = _cwd_param(params)
        if len(self._sessions) >= self._opts.max_sessions:
            raise JsonRpcError.internal_error("too many open sessions; close some")
        self._minted += 1
        session_id = f"{self._opts.session_prefix}{self._run}-{self._minted}"
        history = collections.deque[_Entry](maxlen=self._opts.max_history)
        session = self._sessions[session_id] = _Session(session_id, cwd, history)
        self._log.info("session_created", session_id=session_id)
        commands = {"sessionUpdate": "available_commands_update", "availableCommands": _COMMANDS}
        note = notification("session/update", {"sessionId": session_id, "update": commands})
        # The commands go after the response: before it, the client doesn't know the id.
        return _Reply({"sessionId": session_id, **session.setup_result()}, then=(note,))

    async def _load_session(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        session.cwd = _cwd_param(params)
        for entry in list(session.history):
            kind = "user_message_chunk" if entry.role == "user" else "agent_message_chunk"
            await self._update(session, {"sessionUpdate": kind, "content": _text_block(entry.text)})
        return _Reply(session.setup_result())

    async def _resume_session(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        session.cwd = _cwd_param(params)
        return _Reply(session.setup_result())

    async def _close_session(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        if session.turn is not None:
            session.turn.request_cancel()  # "as if session/cancel had been called"
        del self._sessions[session.session_id]
        self._log.info("session_closed", session_id=session.session_id)
        return _Reply({})

    async def _list_sessions(self, params: JsonObject) -> _Reply:
        cwd = params.get("cwd")
        sessions = [s.info() for s in self._sessions.values() if cwd is None or s.cwd == cwd]
        return _Reply({"sessions": sessions})  # one page: no nextCursor

    async def _set_mode(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        mode_id = _str_param(params, "modeId")
        if mode_id not in {m[0] for m in _MODES}:
            raise JsonRpcError.invalid_params(f"unknown mode {mode_id!r}")
        session.mode_id = mode_id
        update = {"sessionUpdate": "current_mode_update", "currentModeId": mode_id}
        note = notification("session/update", {"sessionId": session.session_id, "update": update})
        return _Reply({}, then=(note,))

    async def _set_config_option(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        config_id = _str_param(params, "configId")
        if config_id != "style":
            raise JsonRpcError.invalid_params(f"unknown config option {config_id!r}")
        value = params.get("value")
        if params.get("type") == "boolean" or value not in {s[0] for s in _STYLES}:
            raise JsonRpcError.invalid_params(f"style must be one of {[s[0] for s in _STYLES]}")
        session.style = str(value)
        return _Reply({"configOptions": _config_options(session.style)})

    def _session(self, params: JsonObject) -> _Session:
        session_id = _str_param(params, "sessionId")
        session = self._sessions.get(session_id)
        if session is None:
            raise JsonRpcError.resource_not_found(f"unknown session {session_id!r}")
        return session

    # -- prompt turns ------------------------------------------------------------------------------

    def _start_turn(self, id_: JsonRpcId, params: JsonObject) -> None:
        session = self._session(params)
        text = prompt_text(params.get("prompt"))
        if session.turn is not None:
            raise JsonRpcError.invalid_request("a prompt is already running in this session")
        turn = session.turn = _Turn()
        session.history.append(_Entry("user", _clip(text)))
        if session.title is None:
            session.title = " ".join(text.split())[:60] or None
        self._log.info("turn_started", session_id=session.session_id)
        self._turns.start_soon(self._run_turn, id_, session, turn, text)

    async def _run_turn(self, id_: JsonRpcId, session: _Session, turn: _Turn, text: str) -> None:
        stop: StopReason = CANCELLED  # stays so if the scope is cancelled
        failure: JsonRpcError | None = None
        try:
            with turn.scope:
                stop = await self._play(session, turn, text)
        except JsonRpcError as exc:
            failure = exc
        except Exception:  # a bug in a script must not end the connection
            self._log.exception("turn_crashed", session_id=session.session_id)
            failure = JsonRpcError.internal_error("demo agent bug")
        finally:
            # Before the response: a client that reacts to it at once sees the session idle
            # and the reply in the history.
            if session.turn is turn:
                session.turn = None
            if turn.reply:
                session.history.append(_Entry("agent", "".join(turn.reply)))
        if turn.cancel_requested:
            stop, failure = CANCELLED, None  # cancel wins: the spec wants stopReason cancelled
        self._log.info("turn_finished", session_id=session.session_id, stop_reason=stop)
        if failure is not None:
            await self._send(error(id_, failure))
        else:
            await self._send(result(id_, {"stopReason": stop}))

    async def _play(self, session: _Session, turn: _Turn, text: str) -> StopReason:
        match parse_script(text):
            case Fail():
                raise JsonRpcError.internal_error("the prompt asked the demo agent to fail")
            case WriteFile(name, content):
                return await self._write_file(session, turn, name, content)
            case ReadFile(name):
                return await self._read_file(session, turn, name)
            case Count(n):
                await self._stream(session, turn, count_pieces(n))
                return END_TURN
            case Echo():
                return await self._echo(session, turn, text)
            case ShowEnv(name):
                await self._say(session, turn, env_line(name, os.environ))
                return END_TURN
            case unreachable:
                assert_never(unreachable)

    async def _stream(self, session: _Session, turn: _Turn, pieces: Iterable[str]) -> None:
        """Send ``pieces`` as ``agent_message_chunk`` updates, ``chunk_delay`` apart."""
        for i, piece in enumerate(pieces):
            if i and self._opts.chunk_delay:
                await trio.sleep(self._opts.chunk_delay)
            chunk = {"sessionUpdate": "agent_message_chunk", "content": _text_block(piece)}
            await self._update(session, chunk)
            turn.add_reply(piece)

    async def _say(self, session: _Session, turn: _Turn, text: str) -> None:
        await self._stream(session, turn, split_words(text))

    async def _echo(self, session: _Session, turn: _Turn, text: str) -> StopReason:
        await self._update(session, _plan("in_progress"))
        said = "**You said:**" if session.style == "fancy" else "You said:"
        await self._say(session, turn, f"{said} {text}")
        await self._update(session, _plan("completed"))
        return END_TURN

    async def _tool_status(self, session: _Session, call_id: str, status: str) -> None:
        update = {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}
        await self._update(session, update)

    async def _write_file(
        self, session: _Session, turn: _Turn, name: str, content: str
    ) -> StopReason:
        path = resolve_path(session.cwd, name)
        if path is None:
            await self._say(session, turn, f"I won't write {name}: it is outside {session.cwd}.")
            return END_TURN
        if not self._can_write:
            await self._say(
                session, turn, f"This client can't write files, so I can't write {name}."
            )
            return END_TURN
        call_id = session.next_tool_call_id()
        call: JsonObject = {
            "toolCallId": call_id,
            "title": f"Write {name}",
            "kind": "edit",
            "status": "pending",
            "locations": [{"path": path}],
        }
        diff = {"type": "diff", "path": path, "newText": content}
        await self._update(session, {"sessionUpdate": "tool_call", **call, "content": [diff]})
        if not session.always_allow_writes:
            stop = await self._get_permission(session, turn, call, f"write {name}")
            if stop is not None:
                return stop
        await self._tool_status(session, call_id, "in_progress")
        write = {"sessionId": session.session_id, "path": path, "content": content}
        try:
            await self._ask_client(turn, "fs/write_text_file", write)
        except _ClientError as exc:
            await self._tool_status(session, call_id, "failed")
            if turn.cancel_requested:
                return CANCELLED
            await self._say(session, turn, f"Could not write {name}: {exc.error.message}")
            return END_TURN
        await self._tool_status(session, call_id, "completed")
        if turn.cancel_requested:
            return CANCELLED
        await self._say(session, turn, f"Wrote {len(content)} characters to {name}.")
        return END_TURN

    async def _get_permission(
        self, session: _Session, turn: _Turn, call: JsonObject, action: str
    ) -> StopReason | None:
        """
        Ask to run tool call ``call`` (``action`` says what it does, for the messages).

        Returns None to go ahead, or the stop reason that ends the turn.
        """
        call_id = call["toolCallId"]
        ask = {"sessionId": session.session_id, "toolCall": call, "options": _PERMISSION_OPTIONS}
        try:
            answer = await self._ask_client(turn, "session/request_permission", ask)
        except _ClientError as exc:
            choice: str | None = CANCELLED if turn.cancel_requested else None
            detail = exc.error.message
        else:
            choice = _permission_choice(answer)
            detail = "unreadable answer"
        if choice == CANCELLED or turn.cancel_requested:
            await self._tool_status(session, call_id, "failed")
            return CANCELLED
        if choice == _ALLOW_ALWAYS:
            session.always_allow_writes = True
        if choice in (_ALLOW_ONCE, _ALLOW_ALWAYS):
            return None
        await self._tool_status(session, call_id, "failed")
        if choice is None:
            await self._say(session, turn, f"The permission request failed ({detail}).")
        else:
            await self._say(session, turn, f"Permission denied, so I did not {action}.")
        return END_TURN

    async def _read_file(self, session: _Session, turn: _Turn, name: str) -> StopReason:
        path = resolve_path(session.cwd, name)
        if path is None:
            await self._say(session, turn, f"I won't read {name}: it is outside {session.cwd}.")
            return END_TURN
        if not self._can_read:
            await self._say(session, turn, f"This client can't read files, so I can't read {name}.")
            return END_TURN
        call_id = session.next_tool_call_id()
        call = {"toolCallId": call_id, "title": f"Read {name}", "kind": "read"}
        locations = [{"path": path}]
        tool_call = {"sessionUpdate": "tool_call", **call, "status": "pending"}
        await self._update(session, {**tool_call, "locations": locations})
        try:
            answer = await self._ask_client(
                turn, "fs/read_text_file", {"sessionId": session.session_id, "path": path}
            )
        except _ClientError as exc:
            await self._tool_status(session, call_id, "failed")
            if turn.cancel_requested:
                return CANCELLED
            await self._say(session, turn, f"Could not read {name}: {exc.error.message}")
            return END_TURN
        content = answer.get("content") if type(answer) is dict else None
        if turn.cancel_requested or type(content) is not str:
            await self._tool_status(session, call_id, "failed")
            if turn.cancel_requested:
                return CANCELLED
            await self._say(session, turn, f"The client sent no text for {name}.")
            return END_TURN
        await self._tool_status(session, call_id, "completed")
        lines = content.splitlines(keepends=True)
        if len(lines) > MAX_PIECES:
            lines[MAX_PIECES - 1 :] = ["".join(lines[MAX_PIECES - 1 :])]
        await self._stream(session, turn, [f"{name}:\n", *lines])
        return END_TURN


def _not_jsonrpc() -> JsonRpcError:
    return JsonRpcError.invalid_request("not a JSON-RPC 2.0 request, notification or response")


def _error_from_wire(err: object) -> JsonRpcError:
    """Rebuild the client's error object (tolerating a malformed one)."""
    if type(err) is dict and type(err.get("code")) is int and type(err.get("message")) is str:
        return JsonRpcError(err["code"], err["message"], err.get("data"))
    return JsonRpcError.internal_error("malformed error from the client")


async def _write_loop(
    send: trio.abc.SendStream,
    outbox: trio.MemoryReceiveChannel[bytes],
    on_broken: trio.CancelScope,
) -> None:
    """The only task that writes to ``send``; cancels ``on_broken`` if the client is gone."""
    async with outbox:
        async for data in outbox:
            try:
                await send.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                logger.info("client_gone")
                on_broken.cancel()
                return


async def serve_demo_agent(
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    *,
    options: DemoOptions | None = None,
) -> None:
    """
    Run the demo agent over ``receive`` (client→agent bytes) and ``send`` (agent→client bytes).

    Returns at EOF on ``receive``, after flushing what was already queued for ``send``; prompt
    turns still running then are cancelled without a response (nobody is left to ask). Returns
    early if ``send`` breaks.

    Resource handling:
        Neither stream is closed; they belong to the caller.

    Backpressure:
        At most :data:`OUTBOX_SIZE` messages wait for ``send``; beyond that the reader and the
        turns wait, so a client that stops reading stops the agent, without unbounded memory.
    """
    opts = options if options is not None else DemoOptions()
    outbox, outbox_receive = trio.open_memory_channel[bytes](OUTBOX_SIZE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_write_loop, send, outbox_receive, nursery.cancel_scope)
        async with outbox, trio.open_nursery() as turns:
            agent = _DemoAgent(opts, outbox, turns)
            await agent.read_until_eof(receive)
            turns.cancel_scope.cancel()


# -- Command line ----------------------------------------------------------------------------------

_EPILOG = """\
prompt keywords (case-insensitive, first match wins):
  fail               answer the prompt with a JSON-RPC error
  write FILE TEXT    ask permission, then write TEXT to FILE (fs/write_text_file)
  read FILE          read FILE (fs/read_text_file) and stream it back
  count N            stream N numbered chunks
  slow               stream 50 numbered chunks
  env NAME           NAME=VALUE of the agent's environment (secret-looking names: ***)
  anything else      echo "You said: ..." word by word
"""


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError("must be a number >= 0")
    return value


def _arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-bridge demo-agent",
        description="A scripted ACP v1 agent on stdin/stdout (logs go to stderr).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--chunk-delay",
        type=_non_negative_float,
        default=DEFAULT_CHUNK_DELAY,
        metavar="SECONDS",
        help=f"pause between streamed chunks (default {DEFAULT_CHUNK_DELAY})",
    )
    parser.add_argument("--name", default=DemoOptions().name, help="agentInfo.name")
    parser.add_argument(
        "--session-prefix", default="demo-", metavar="PREFIX", help="session id prefix"
    )
    parser.add_argument(
        "--no-load",
        dest="load_session",
        action="store_false",
        help="do not advertise or serve session/load",
    )
    return parser


def parse_demo_args(argv: list[str]) -> DemoOptions:
    """Options from the ``acp-bridge demo-agent`` arguments (argparse exits on bad usage)."""
    ns = _arg_parser().parse_args(argv)
    return DemoOptions(
        chunk_delay=ns.chunk_delay,
        name=ns.name,
        session_prefix=ns.session_prefix,
        load_session=ns.load_session,
    )


async def _serve_fds(stdin_fd: int, stdout_fd: int, options: DemoOptions) -> None:
    async with trio.lowlevel.FdStream(stdin_fd) as stdin, trio.lowlevel.FdStream(stdout_fd) as out:
        await serve_demo_agent(stdin, out, options=options)


def run_demo_agent_stdio(argv: list[str]) -> int:
    """
    Entry point of ``acp-bridge demo-agent``: serve ACP on stdin/stdout until stdin closes.

    Returns the exit status (2 for bad usage, 130 on Ctrl-C). Unix only (``FdStream``).

    Resource handling:
        The protocol uses duplicates of fds 0 and 1; while it runs, fd 1 itself points at
        stderr, so a stray ``print`` from anywhere lands in the log, never in the protocol.
    """
    try:
        options = parse_demo_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if not structlog.is_configured():
        # structlog's default prints to stdout; the CLI leaves the set-up to us.
        configure_logging(level="info", stream=sys.stderr)
    sys.stdout.flush()
    stdin_fd, stdout_fd = os.dup(0), os.dup(1)
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        trio.run(_serve_fds, stdin_fd, stdout_fd, options)
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
    return 0
