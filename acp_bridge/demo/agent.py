"""
The bundled demo agent: a deterministic, scripted ACP v1 agent (no model, no network).

It speaks NDJSON JSON-RPC 2.0 over any pair of trio byte streams, so tests drive it in-process
over memory streams and ``acp-bridge demo-agent`` runs it over stdin/stdout. What it does with a
prompt depends only on the prompt text: the script is ``demo.script`` (pure), played here.
Every update of a turn is sent before the ``session/prompt`` response, and a ``session/load``
replay before the load response.

Concurrency: one reader task dispatches every incoming line; each prompt turn runs as its own
task in a nursery, so several sessions stream at once while the reader still sees
``session/cancel`` and the client's responses. One writer task owns the output stream and drains a
bounded channel: a turn cancelled mid-write can never leave half a line on the wire.
"""

from __future__ import annotations

import collections
import os
import secrets
import sys
from typing import TYPE_CHECKING, Final, assert_never

import attrs
import structlog
import trio

from acp_bridge.demo.mcp_client import McpError, connect, find_entry
from acp_bridge.demo.script import (
    ALLOW_ALWAYS,
    ALLOW_ONCE,
    CANCELLED,
    COMMANDS,
    END_TURN,
    MAX_ENTRY_CHARS,
    MODES,
    PERMISSION_OPTIONS,
    STYLES,
    Count,
    Delegate,
    DemoOptions,
    Echo,
    Entry,
    Fail,
    ReadFile,
    ShowEnv,
    StopReason,
    WriteFile,
    clip,
    config_options,
    count_pieces,
    cwd_param,
    env_line,
    error_from_wire,
    file_pieces,
    initialize_result,
    not_jsonrpc,
    parse_demo_args,
    parse_script,
    permission_choice,
    plan_update,
    prompt_text,
    resolve_path,
    session_modes,
    split_words,
    str_param,
    text_block,
)
from acp_bridge.observe.log import configure_logging
from acp_bridge.protocol.framing import LineDecoder, Oversize
from acp_bridge.protocol.jsonrpc import (
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

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping
    from typing import Any

logger = structlog.get_logger(__name__)

#: Messages queued for the writer before senders wait (backpressure from a slow client).
OUTBOX_SIZE: Final = 64
_RECEIVE_BYTES: Final = 64 * 1024


# -- Per-session state ---------------------------------------------------------------------------


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
    history: collections.deque[Entry]
    mode_id: str = MODES[0][0]
    style: str = STYLES[0][0]
    title: str | None = None
    always_allow_writes: bool = False
    tool_calls: int = 0
    turn: _Turn | None = None
    #: the bridge's ``acp-bridge`` MCP server entry from session/new (None: not given one)
    mcp: Mapping[str, Any] | None = None

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
        return {"modes": session_modes(self.mode_id), "configOptions": config_options(self.style)}


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
    """
    State of one connection; every method runs in the reader task or in a turn task (whose
    script :class:`_Play` plays).

    Attributes:
        options: the agent's knobs.
        can_read: the client advertised ``fs.readTextFile``.
        can_write: the client advertised ``fs.writeTextFile``.
    """

    def __init__(
        self,
        options: DemoOptions,
        outbox: trio.MemorySendChannel[bytes],
        turns: trio.Nursery,
    ) -> None:
        self.options = options
        self._outbox = outbox
        self._turns = turns
        self._log = logger.bind(agent=options.name)
        self._initialized = False
        self.can_read = False
        self.can_write = False
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
                await self._send(error(id_ if is_valid_id(id_) else None, not_jsonrpc()))
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

    async def update(self, session: _Session, update: JsonObject) -> None:
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
            raise _ClientError(error_from_wire(waiter.response["error"]))
        return waiter.response["result"]

    async def ask_client(self, turn: _Turn, method: str, params: JsonObject) -> object:
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
            self.can_read = fs.get("readTextFile") is True
            self.can_write = fs.get("writeTextFile") is True
        self._initialized = True
        self._log.info(
            "initialized", client_version=version, fs_read=self.can_read, fs_write=self.can_write
        )
        return _Reply(initialize_result(self.options))

    async def _new_session(self, params: JsonObject) -> _Reply:
        cwd = cwd_param(params)
        if len(self._sessions) >= self.options.max_sessions:
            raise JsonRpcError.internal_error("too many open sessions; close some")
        self._minted += 1
        session_id = f"{self.options.session_prefix}{self._run}-{self._minted}"
        history = collections.deque[Entry](maxlen=self.options.max_history)
        session = self._sessions[session_id] = _Session(session_id, cwd, history)
        session.mcp = find_entry(params.get("mcpServers"))
        self._log.info("session_created", session_id=session_id)
        commands = {"sessionUpdate": "available_commands_update", "availableCommands": COMMANDS}
        note = notification("session/update", {"sessionId": session_id, "update": commands})
        # The commands go after the response: before it, the client doesn't know the id.
        return _Reply({"sessionId": session_id, **session.setup_result()}, then=(note,))

    async def _load_session(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        session.cwd = cwd_param(params)
        session.mcp = find_entry(params.get("mcpServers")) or session.mcp
        for entry in list(session.history):
            kind = "user_message_chunk" if entry.role == "user" else "agent_message_chunk"
            await self.update(session, {"sessionUpdate": kind, "content": text_block(entry.text)})
        return _Reply(session.setup_result())

    async def _resume_session(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        session.cwd = cwd_param(params)
        session.mcp = find_entry(params.get("mcpServers")) or session.mcp
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
        mode_id = str_param(params, "modeId")
        if mode_id not in {m[0] for m in MODES}:
            raise JsonRpcError.invalid_params(f"unknown mode {mode_id!r}")
        session.mode_id = mode_id
        update = {"sessionUpdate": "current_mode_update", "currentModeId": mode_id}
        note = notification("session/update", {"sessionId": session.session_id, "update": update})
        return _Reply({}, then=(note,))

    async def _set_config_option(self, params: JsonObject) -> _Reply:
        session = self._session(params)
        config_id = str_param(params, "configId")
        if config_id != "style":
            raise JsonRpcError.invalid_params(f"unknown config option {config_id!r}")
        value = params.get("value")
        if params.get("type") == "boolean" or value not in {s[0] for s in STYLES}:
            raise JsonRpcError.invalid_params(f"style must be one of {[s[0] for s in STYLES]}")
        session.style = str(value)
        return _Reply({"configOptions": config_options(session.style)})

    def _session(self, params: JsonObject) -> _Session:
        session_id = str_param(params, "sessionId")
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
        session.history.append(Entry("user", clip(text)))
        if session.title is None:
            session.title = " ".join(text.split())[:60] or None
        self._log.info("turn_started", session_id=session.session_id)
        self._turns.start_soon(self._run_turn, id_, session, turn, text)

    async def _run_turn(self, id_: JsonRpcId, session: _Session, turn: _Turn, text: str) -> None:
        stop: StopReason = CANCELLED  # stays so if the scope is cancelled
        failure: JsonRpcError | None = None
        try:
            with turn.scope:
                stop = await _Play(self, session, turn).play(text)
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
                session.history.append(Entry("agent", "".join(turn.reply)))
        if turn.cancel_requested:
            stop, failure = CANCELLED, None  # cancel wins: the spec wants stopReason cancelled
        self._log.info("turn_finished", session_id=session.session_id, stop_reason=stop)
        if failure is not None:
            await self._send(error(id_, failure))
        else:
            await self._send(result(id_, {"stopReason": stop}))


@attrs.define(eq=False)
class _Play:
    """
    One prompt turn's script played out: what :func:`parse_script` found in the prompt.

    Runs in the turn's task. Talks to the client through the agent: updates, and requests
    during which a ``session/cancel`` waits for the client's answer (see :class:`_Turn`).
    """

    agent: _DemoAgent
    session: _Session
    turn: _Turn

    async def play(self, text: str) -> StopReason:
        match parse_script(text):
            case Fail():
                raise JsonRpcError.internal_error("the prompt asked the demo agent to fail")
            case WriteFile(name, content):
                return await self._write_file(name, content)
            case ReadFile(name):
                return await self._read_file(name)
            case Count(n):
                await self._stream(count_pieces(n))
                return END_TURN
            case Echo():
                return await self._echo(text)
            case ShowEnv(name):
                await self._say(env_line(name, os.environ))
                return END_TURN
            case Delegate(agent, task):
                return await self._delegate(agent, task)
            case unreachable:
                assert_never(unreachable)

    async def _stream(self, pieces: Iterable[str]) -> None:
        """Send ``pieces`` as ``agent_message_chunk`` updates, ``chunk_delay`` apart."""
        for i, piece in enumerate(pieces):
            if i and self.agent.options.chunk_delay:
                await trio.sleep(self.agent.options.chunk_delay)
            chunk = {"sessionUpdate": "agent_message_chunk", "content": text_block(piece)}
            await self._update(chunk)
            self.turn.add_reply(piece)

    async def _say(self, text: str) -> None:
        await self._stream(split_words(text))

    async def _echo(self, text: str) -> StopReason:
        await self._update(plan_update("in_progress"))
        said = "**You said:**" if self.session.style == "fancy" else "You said:"
        await self._say(f"{said} {text}")
        await self._update(plan_update("completed"))
        return END_TURN

    async def _delegate(self, agent: str, task: str) -> StopReason:
        """
        ``spawn_agent`` through the MCP server the session was given; the child's text is
        streamed as this turn's. A ``session/cancel`` meanwhile does not cut the call: the
        bridge cancels the child, and its ``cancelled`` turn answers the call.
        """
        if self.session.mcp is None:
            await self._say("No acp-bridge MCP server was given to this session.")
            return END_TURN
        await self._say(f"Delegating to {agent}:")
        self.turn.awaiting_client = True
        try:
            async with connect(self.session.mcp) as mcp:
                result = await mcp.call_tool("spawn_agent", {"agent": agent, "prompt": task})
        except McpError as exc:
            await self._say(f"[delegation failed: {exc}]")
            return END_TURN
        finally:
            self.turn.awaiting_client = False
        status = result.get("structuredContent")
        if result.get("isError") or not isinstance(status, dict):
            content = result.get("content") or [{}]
            await self._say(f"[{agent} could not help: {content[0].get('text', '?')}]")
        else:
            await self._stream([f"\n[{agent} ({status.get('child')}): "])
            await self._stream([status.get("text") or ""])
            await self._stream([f"] ({status.get('stopReason')})"])
        return CANCELLED if self.turn.cancel_requested else END_TURN

    async def _tool_status(self, call_id: str, status: str) -> None:
        update = {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}
        await self._update(update)

    async def _write_file(self, name: str, content: str) -> StopReason:
        path = resolve_path(self.session.cwd, name)
        if path is None:
            await self._say(f"I won't write {name}: it is outside {self.session.cwd}.")
            return END_TURN
        if not self.agent.can_write:
            await self._say(f"This client can't write files, so I can't write {name}.")
            return END_TURN
        call_id = self.session.next_tool_call_id()
        call: JsonObject = {
            "toolCallId": call_id,
            "title": f"Write {name}",
            "kind": "edit",
            "status": "pending",
            "locations": [{"path": path}],
        }
        diff = {"type": "diff", "path": path, "newText": content}
        await self._update({"sessionUpdate": "tool_call", **call, "content": [diff]})
        if not self.session.always_allow_writes:
            # The request carries the diff too: what a human is asked to approve.
            stop = await self._get_permission({**call, "content": [diff]}, f"write {name}")
            if stop is not None:
                return stop
        await self._tool_status(call_id, "in_progress")
        write = {"sessionId": self.session.session_id, "path": path, "content": content}
        try:
            await self._ask("fs/write_text_file", write)
        except _ClientError as exc:
            await self._tool_status(call_id, "failed")
            if self.turn.cancel_requested:
                return CANCELLED
            await self._say(f"Could not write {name}: {exc.error.message}")
            return END_TURN
        await self._tool_status(call_id, "completed")
        if self.turn.cancel_requested:
            return CANCELLED
        await self._say(f"Wrote {len(content)} characters to {name}.")
        return END_TURN

    async def _get_permission(self, call: JsonObject, action: str) -> StopReason | None:
        """
        Ask to run tool call ``call`` (``action`` says what it does, for the messages).

        Returns None to go ahead, or the stop reason that ends the turn.
        """
        call_id = call["toolCallId"]
        ask = {
            "sessionId": self.session.session_id,
            "toolCall": call,
            "options": PERMISSION_OPTIONS,
        }
        try:
            answer = await self._ask("session/request_permission", ask)
        except _ClientError as exc:
            choice: str | None = CANCELLED if self.turn.cancel_requested else None
            detail = exc.error.message
        else:
            choice = permission_choice(answer)
            detail = "unreadable answer"
        if choice == CANCELLED or self.turn.cancel_requested:
            await self._tool_status(call_id, "failed")
            return CANCELLED
        if choice == ALLOW_ALWAYS:
            self.session.always_allow_writes = True
        if choice in (ALLOW_ONCE, ALLOW_ALWAYS):
            return None
        await self._tool_status(call_id, "failed")
        if choice is None:
            await self._say(f"The permission request failed ({detail}).")
        else:
            await self._say(f"Permission denied, so I did not {action}.")
        return END_TURN

    async def _read_file(self, name: str) -> StopReason:
        path = resolve_path(self.session.cwd, name)
        if path is None:
            await self._say(f"I won't read {name}: it is outside {self.session.cwd}.")
            return END_TURN
        if not self.agent.can_read:
            await self._say(f"This client can't read files, so I can't read {name}.")
            return END_TURN
        call_id = self.session.next_tool_call_id()
        call = {"toolCallId": call_id, "title": f"Read {name}", "kind": "read"}
        locations = [{"path": path}]
        tool_call = {"sessionUpdate": "tool_call", **call, "status": "pending"}
        await self._update({**tool_call, "locations": locations})
        try:
            answer = await self._ask(
                "fs/read_text_file", {"sessionId": self.session.session_id, "path": path}
            )
        except _ClientError as exc:
            await self._tool_status(call_id, "failed")
            if self.turn.cancel_requested:
                return CANCELLED
            await self._say(f"Could not read {name}: {exc.error.message}")
            return END_TURN
        content = answer.get("content") if type(answer) is dict else None
        if self.turn.cancel_requested or type(content) is not str:
            await self._tool_status(call_id, "failed")
            if self.turn.cancel_requested:
                return CANCELLED
            await self._say(f"The client sent no text for {name}.")
            return END_TURN
        await self._tool_status(call_id, "completed")
        await self._stream(file_pieces(name, content))
        return END_TURN

    async def _update(self, update: JsonObject) -> None:
        await self.agent.update(self.session, update)

    async def _ask(self, method: str, params: JsonObject) -> object:
        return await self.agent.ask_client(self.turn, method, params)


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
