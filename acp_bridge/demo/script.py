"""
The demo agent's script, pure: what a prompt asks for, and what the agent answers with.

What the bundled demo agent (``demo.agent``) does with a prompt depends only on the prompt
text (see :func:`parse_script`):

- ``fail``: answer the prompt with a JSON-RPC error (-32603).
- ``write FILE TEXT``: a ``tool_call`` (kind ``edit``), ``session/request_permission``, then
  ``fs/write_text_file`` if allowed and the client advertised ``fs.writeTextFile``
  (``allow-always`` is remembered for the rest of the session).
- ``read FILE``: ``fs/read_text_file`` if the client advertised ``fs.readTextFile``, then stream
  the content back.
- ``count N`` / ``slow``: stream N (``slow``: 50) numbered chunks, ``chunk_delay`` apart.
- ``delegate AGENT: TEXT`` (only at the start of a prompt): call the bridge's ``spawn_agent``
  tool (the ``acp-bridge`` MCP server its ``session/new`` gave it, http or stdio) to start a
  sub-agent on AGENT with TEXT, and stream the child's answer (docs/subagents.md).
- ``env NAME``: stream ``NAME=VALUE`` of the agent's environment (``NAME is not set``; a
  secret-looking name, as :data:`acp_bridge.observe.redact.SECRET_NAME` sees them, shows
  ``***``): where it runs, e.g. ``SSH_CONNECTION`` over ssh.
- anything else: a ``plan``, then "You said: <text>" streamed word by word.

Keywords are case-insensitive whole words, tried in that order.

Here too: the agent's options and its command line, the fixed data it advertises (modes, the
config option, commands, permission options), the text helpers and the builders of its
results and updates. Pure: no trio, no I/O (fenced by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import attrs

from acp_bridge.observe.redact import MASK, SECRET_NAME
from acp_bridge.protocol.jsonrpc import JsonObject, JsonRpcError
from acp_bridge.protocol.wire import PROTOCOL_VERSION  # (the only one this agent speaks)

if TYPE_CHECKING:
    from collections.abc import Mapping

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

StopReason: TypeAlias = Literal["end_turn", "cancelled"]
END_TURN: Final = "end_turn"
CANCELLED: Final = "cancelled"

MODES: Final = (("ask", "Ask", "Answer questions"), ("code", "Code", "Pretend to write code"))
STYLES: Final = (("plain", "Plain"), ("fancy", "Fancy"))
ALLOW_ONCE: Final = "allow-once"
ALLOW_ALWAYS: Final = "allow-always"
REJECT_ONCE: Final = "reject-once"
PERMISSION_OPTIONS: Final = (
    {"optionId": ALLOW_ONCE, "name": "Allow once", "kind": "allow_once"},
    {"optionId": ALLOW_ALWAYS, "name": "Always allow in this session", "kind": "allow_always"},
    {"optionId": REJECT_ONCE, "name": "Reject", "kind": "reject_once"},
)
COMMANDS: Final = (
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
        mcp_http: advertise ``mcpCapabilities.http`` (else it is given stdio MCP servers).
    """

    chunk_delay: float = attrs.field(default=DEFAULT_CHUNK_DELAY, validator=attrs.validators.ge(0))
    name: str = attrs.field(default="acp-bridge-demo", validator=attrs.validators.min_len(1))
    title: str = "acp-bridge demo agent"
    session_prefix: str = "demo-"
    load_session: bool = True
    max_sessions: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    max_history: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    mcp_http: bool = True


# -- What a prompt asks for ----------------------------------------------------------------------


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
class Delegate:
    """Start a sub-agent on ``agent`` with ``text`` through the bridge's MCP tools."""

    agent: str
    text: str


@attrs.frozen
class ShowEnv:
    """Stream ``NAME=VALUE`` of the agent's own environment."""

    name: str


Script: TypeAlias = Echo | WriteFile | ReadFile | Count | Fail | ShowEnv | Delegate

_DELEGATE_RE: Final = re.compile(r"\s*delegate\s+([A-Za-z0-9_.-]+)\s*:\s*(.*)", re.I | re.S)

_FAIL_RE: Final = re.compile(r"\bfail\b", re.IGNORECASE)
# One separator character after FILE is dropped, so "write a.txt\nline" writes "line".
_WRITE_RE: Final = re.compile(r"\bwrite\s+(\S+)\s?(.*)", re.IGNORECASE | re.DOTALL)
_READ_RE: Final = re.compile(r"\bread\s+(\S+)", re.IGNORECASE)
_COUNT_RE: Final = re.compile(r"\bcount\s+(\d+)", re.IGNORECASE)
_SLOW_RE: Final = re.compile(r"\bslow\b", re.IGNORECASE)
_ENV_RE: Final = re.compile(r"\benv\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def parse_script(text: str) -> Script:
    """Decide what a prompt asks for; the first keyword in this order wins: fail, write, read,
    count, slow, env; ``delegate`` (at the start) before them all: its text is the child's."""
    if m := _DELEGATE_RE.match(text):
        return Delegate(m[1], m[2].strip())
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


def clip(text: str) -> str:
    return text if len(text) <= MAX_ENTRY_CHARS else text[:MAX_ENTRY_CHARS] + " [truncated]"


def text_block(text: str) -> JsonObject:
    return {"type": "text", "text": text}


def session_modes(current: str) -> JsonObject:
    return {
        "currentModeId": current,
        "availableModes": [{"id": i, "name": n, "description": d} for i, n, d in MODES],
    }


def config_options(style: str) -> list[JsonObject]:
    return [
        {
            "id": "style",
            "name": "Reply style",
            "description": "How the demo agent formats its echo",
            "type": "select",
            "currentValue": style,
            "options": [{"value": v, "name": n} for v, n in STYLES],
        }
    ]


def plan_update(reply_status: str) -> JsonObject:
    return {
        "sessionUpdate": "plan",
        "entries": [
            {"content": "Read the prompt", "priority": "high", "status": "completed"},
            {"content": "Echo it back", "priority": "medium", "status": reply_status},
        ],
    }


def initialize_result(options: DemoOptions) -> JsonObject:
    """The ``initialize`` result: version 1 whatever the client asked (the only one spoken, it
    is both "the same version" and "the latest we support"), capabilities, ``agentInfo``."""
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": options.load_session,
            "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
            "sessionCapabilities": {"list": {}, "close": {}, "resume": {}},
            "mcpCapabilities": {"http": options.mcp_http, "sse": False},
        },
        "agentInfo": {
            "name": options.name,
            "title": options.title,
            "version": _package_version(),
        },
        "authMethods": [],
    }


def file_pieces(name: str, content: str) -> list[str]:
    """The chunks ``read FILE`` streams: a ``FILE:`` line, then the file line by line (at most
    :data:`MAX_PIECES` lines, the tail as one piece)."""
    lines = content.splitlines(keepends=True)
    if len(lines) > MAX_PIECES:
        lines[MAX_PIECES - 1 :] = ["".join(lines[MAX_PIECES - 1 :])]
    return [f"{name}:\n", *lines]


def permission_choice(response: object) -> str | None:
    """The chosen optionId, ``"cancelled"``, or None for an answer we can't read."""
    outcome = response.get("outcome") if type(response) is dict else None
    if type(outcome) is not dict:
        return None
    if outcome.get("outcome") == "cancelled":
        return CANCELLED
    option = outcome.get("optionId")
    return option if outcome.get("outcome") == "selected" and type(option) is str else None


def str_param(params: JsonObject, key: str) -> str:
    value = params.get(key)
    if type(value) is not str:
        raise JsonRpcError.invalid_params(f"{key} must be a string")
    return value


def cwd_param(params: JsonObject) -> str:
    cwd = str_param(params, "cwd")
    if not os.path.isabs(cwd):
        raise JsonRpcError.invalid_params("cwd must be an absolute path")
    return cwd


def not_jsonrpc() -> JsonRpcError:
    return JsonRpcError.invalid_request("not a JSON-RPC 2.0 request, notification or response")


def error_from_wire(err: object) -> JsonRpcError:
    """Rebuild the client's error object (tolerating a malformed one)."""
    if type(err) is dict and type(err.get("code")) is int and type(err.get("message")) is str:
        return JsonRpcError(err["code"], err["message"], err.get("data"))
    return JsonRpcError.internal_error("malformed error from the client")


@attrs.frozen
class Entry:
    """One entry of a session's history: what ``session/load`` replays."""

    role: Literal["user", "agent"]
    text: str


# -- Command line ----------------------------------------------------------------------------------

_EPILOG = """\
prompt keywords (case-insensitive, first match wins):
  fail               answer the prompt with a JSON-RPC error
  write FILE TEXT    ask permission, then write TEXT to FILE (fs/write_text_file)
  read FILE          read FILE (fs/read_text_file) and stream it back
  count N            stream N numbered chunks
  slow               stream 50 numbered chunks
  env NAME           NAME=VALUE of the agent's environment (secret-looking names: ***)
  delegate AGENT: TEXT  (first) start a sub-agent on AGENT through the bridge's MCP tools
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
    parser.add_argument(
        "--no-mcp-http",
        dest="mcp_http",
        action="store_false",
        help="do not advertise mcpCapabilities.http (MCP servers come as stdio commands)",
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
        mcp_http=ns.mcp_http,
    )
