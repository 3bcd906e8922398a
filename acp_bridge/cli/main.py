"""
The ``acp-bridge`` command line (README.md's command table; docs/ for each command).

Every subcommand keeps stdout for its own output; in ``stdio`` mode stdout carries protocol
lines only, from the first byte, including when start-up fails (errors go to stderr).
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import TYPE_CHECKING

from acp_bridge import __version__

# (The configuration's code, attrs and cattrs, is imported where it is used: ``acp-bridge
# stdio`` spawns its default agent before that, see ``agents.prespawn``.)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import IO

    from acp_bridge.agents.prespawn import Prespawned
    from acp_bridge.config.model import Config
    from acp_bridge.faces.early import Background, Handover
    from acp_bridge.observe.redact import Redactor


EXIT_USAGE = 2


def _add_agent_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--agent",
        metavar="NAME=COMMAND",
        action="append",
        default=[],
        help="an agent to run (repeatable; the first is the default); COMMAND is split like a "
        "shell would",
    )


def _add_logging(parser: argparse.ArgumentParser, *, level: str = "info") -> None:
    parser.add_argument("--log-level", default=level, choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="auto", choices=["auto", "console", "json"])
    parser.add_argument("--log-file", metavar="FILE", help="write logs here instead of stderr")


def _add_trace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="record every message crossing the bridge in FILE (JSON lines, secrets redacted; "
        "overwritten; read it with `acp-bridge trace show FILE`)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-bridge",
        description="One ACP client, many ACP agents: routes every message by sessionId.",
    )
    parser.add_argument("--version", action="version", version=f"acp-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stdio = sub.add_parser("stdio", help="serve one ACP client on stdin/stdout")
    _add_agent_source(stdio)
    _add_v2(stdio)
    _add_trace(stdio)
    _add_logging(stdio)

    prompt = sub.add_parser(
        "prompt", help="send one prompt through the bridge and print the streamed reply"
    )
    prompt.add_argument("text", help="the prompt")
    _add_agent_source(prompt)
    prompt.add_argument("--to", metavar="AGENT", help="which configured agent gets the session")
    prompt.add_argument("--cwd", metavar="DIR", help="the session's working directory")
    prompt.add_argument(
        "--yes", action="store_true", help="allow the agent's permission requests (default: deny)"
    )
    # A person reads its output: warnings and up unless asked (agent diagnostics of that
    # level are shown readably, the bridge's own log lines only from that level on).
    _add_logging(prompt, level="warning")

    demo = sub.add_parser(
        "demo-agent", help="run the bundled scripted demo agent on stdin/stdout", add_help=False
    )
    demo.add_argument("demo_args", nargs=argparse.REMAINDER)

    serve = sub.add_parser("serve", help="the WebSocket daemon: many ACP clients, many agents")
    _add_agent_source(serve)
    _add_v2(serve)
    serve.add_argument("--host", help="listen address (overrides [websocket] host)")
    serve.add_argument(
        "--port", type=_port, help="listen port, 0 for a free one (overrides [websocket] port)"
    )
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow listening on a non-loopback address (needs TLS in the config, or --insecure)",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="with --allow-remote: serve without TLS (the token travels in clear text)",
    )
    _add_trace(serve)
    _add_logging(serve)

    status = sub.add_parser("status", help="agents, sessions and queues of a running `serve`")
    status.add_argument("--config", metavar="FILE", help="the daemon's configuration")
    status.add_argument("--url", help="the daemon (http://HOST:PORT or its ws:// URL)")
    status.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    status.add_argument("--json", action="store_true", help="print the status as JSON")

    trace = sub.add_parser("trace", help="read wire traces (written with --trace)")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    show = trace_sub.add_parser(
        "show", help="print a trace readably, grouped per session, or as a sequence view (--html)"
    )
    show.add_argument("file", metavar="FILE")
    show.add_argument("--session", metavar="ID", help="only this session")
    show.add_argument(
        "--html",
        action="store_true",
        help="write one self-contained HTML page: lanes, one arrow per message",
    )
    show.add_argument(
        "--output", metavar="OUT", help="with --html: write the page to OUT (default: stdout)"
    )
    show.add_argument(
        "--limit",
        metavar="N",
        type=_count,
        help="with --html: the first N messages, the rest counted "
        "(default: 10000; 0: every message)",
    )

    audit = sub.add_parser("audit", help="print the audit trail of approval decisions")
    _add_agent_source(audit)
    audit.add_argument("--follow", action="store_true", help="keep printing new records")
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    _add_logging(audit)

    sessions = sub.add_parser(
        "sessions", help="list the sessions in the store, or export one's journal"
    )
    _add_agent_source(sessions)
    sessions.add_argument(
        "action", nargs="?", choices=["list", "export"], default="list", help="(default: list)"
    )
    sessions.add_argument("session_id", nargs="?", metavar="ID", help="with export: the session")
    sessions.add_argument("--json", action="store_true", help="list as JSON lines")
    _add_logging(sessions)

    attach = sub.add_parser(
        "attach",
        help="stdio ↔ WebSocket shim: an editor's agent that reaches a running `serve`",
    )
    attach.add_argument("url", metavar="URL", help="the daemon's endpoint, ws://HOST:PORT/acp")
    token = attach.add_mutually_exclusive_group()
    token.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    token.add_argument("--token-env", metavar="VAR", help="environment variable holding it")
    attach.add_argument(
        "--agent", metavar="NAME", help="the agent of every new session that names none"
    )
    attach.add_argument(
        "--reconnect-for",
        metavar="SECONDS",
        type=float,
        default=300.0,
        help="keep reconnecting this long after a drop (default: 300, the daemon's grace)",
    )
    attach.add_argument(
        "--connect-for",
        metavar="SECONDS",
        type=float,
        default=10.0,
        help="keep trying this long to make the first connection (default: 10)",
    )
    _add_logging(attach)

    mcp = sub.add_parser(
        "mcp",
        help="stdio MCP server an agent runs: relays to the bridge's sub-agent tools (the "
        "bridge puts it in a session's mcpServers; token in $ACP_BRIDGE_MCP_TOKEN)",
    )
    mcp.add_argument(
        "--url", required=True, help="the bridge's MCP endpoint, http://127.0.0.1:PORT/mcp"
    )
    mcp.add_argument(
        "--token-env",
        metavar="VAR",
        help="environment variable holding the session's token (default: ACP_BRIDGE_MCP_TOKEN)",
    )
    _add_logging(mcp, level="warning")
    return parser


def _whole(text: str, low: int, high: int | None, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = low - 1
    if n < low or (high is not None and n > high):
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}")
    return n


def _port(text: str) -> int:
    return _whole(text, 0, 65535, "a port number")


def _count(text: str) -> int:
    return _whole(text, 0, None, "a count")


def _trace(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``trace show``: the text rendering, or with ``--html`` the sequence view's page."""
    if args.html:
        from acp_bridge.observe.sequence import DEFAULT_LIMIT
        from acp_bridge.observe.sequence_html import main_trace_html

        limit = DEFAULT_LIMIT if args.limit is None else (args.limit or None)
        return main_trace_html(args.file, output=args.output, session=args.session, limit=limit)
    if args.output is not None or args.limit is not None:
        parser.error("trace show: --output and --limit go with --html")
    from acp_bridge.observe.trace import main_trace

    return main_trace(args.file, session=args.session)


def _add_v2(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--experimental-v2",
        action="store_true",
        help="serve ACP v2 to clients that initialize with protocol 2 (docs/v2.md)",
    )


def _v2_override(config: Config, args: argparse.Namespace) -> Config:
    """``--experimental-v2`` sets ``[bridge] experimental_v2``."""
    import attrs

    if not getattr(args, "experimental_v2", False):
        return config
    return attrs.evolve(config, bridge=attrs.evolve(config.bridge, experimental_v2=True))


def _listen_overrides(config: Config, host: str | None, port: int | None) -> Config:
    """``serve --host/--port`` replace the config's ``[websocket]`` values."""
    import attrs

    ws = config.websocket
    ws = attrs.evolve(
        ws, host=ws.host if host is None else host, port=ws.port if port is None else port
    )
    return attrs.evolve(config, websocket=ws)


def _load(args: argparse.Namespace) -> Config:
    from acp_bridge.config.model import Config, ConfigError, config_from_agent_specs, load_config

    if args.config and args.agent:
        base = load_config(args.config)
        return config_from_agent_specs(args.agent, base=base)
    if args.config:
        return load_config(args.config)
    if args.command in ("audit", "sessions") and not args.agent:
        return Config(agents={})  # only the store matters: its default path
    if args.agent:
        return config_from_agent_specs(args.agent)
    raise ConfigError("<command line>", ["give --config FILE or at least one --agent NAME=COMMAND"])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo-agent"]:
        # The demo agent parses its own options (and must not touch logging set-up here).
        from acp_bridge.demo.agent import run_demo_agent_stdio

        return run_demo_agent_stdio(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "attach":
        from acp_bridge.faces.attach import main_attach

        return main_attach(args)
    if args.command == "mcp":
        from acp_bridge.faces.mcp_relay import main_mcp

        return main_mcp(args)
    if args.command == "status":
        from acp_bridge.faces.status import main_status

        return main_status(args)
    if args.command == "trace":
        return _trace(parser, args)

    protocol_fd = None
    prespawned = None
    background = early = None
    if args.command == "stdio":
        # Before anything can print: from here on fd 1 is stderr, the protocol has its own fd.
        from acp_bridge.agents.prespawn import claim_stdout, prespawn

        protocol_fd = claim_stdout()
        # The default agent starts now, while the bridge imports (agents.prespawn).
        prespawned = prespawn(args.config, args.agent)
        if prespawned is not None and prespawned.popen is not None and not args.trace:
            # The imports in a thread while initialize is answered here (faces.early). (Not with
            # --trace: the trace would miss those messages.)
            from acp_bridge.faces import early as early_start

            if early_start.enabled():
                background = early_start.Background(
                    functools.partial(_load_for_stdio, args), _import_for_stdio
                )
                background.start()
                try:
                    early = early_start.answer_early(
                        prespawned,
                        background,
                        protocol_fd,
                        v2_hint=early_start.v2_asked(args.config, args.experimental_v2),
                    )
                finally:
                    background.join()
    try:
        return _main_started(args, protocol_fd, prespawned, background, early)
    finally:
        if prespawned is not None:  # (not adopted: no initialize came, or the start failed)
            prespawned.discard()


def _load_for_stdio(args: argparse.Namespace) -> Config:
    """(In ``faces.early``'s thread: the configuration, as :func:`_main_started` loads it.)"""
    return _v2_override(_load(args), args)


def _import_for_stdio() -> None:
    """(In ``faces.early``'s thread: what ``stdio`` imports after the configuration.)"""
    import trio  # noqa: F401

    import acp_bridge.cli.prompt
    import acp_bridge.faces.stdio
    import acp_bridge.observe.log
    import acp_bridge.observe.redact
    import acp_bridge.store.db  # noqa: F401


def _main_started(
    args: argparse.Namespace,
    protocol_fd: int | None,
    prespawned: Prespawned | None,
    background: Background | None = None,
    early: Handover | None = None,
) -> int:
    from acp_bridge.observe.log import configure_logging
    from acp_bridge.observe.redact import Redactor

    # The bridge's secrets, masked in its logs, its trace and its reports alike.
    redactor = Redactor()
    configure_logging(
        level=args.log_level, fmt=args.log_format, file=args.log_file, redactor=redactor
    )
    from acp_bridge.config.model import ConfigError

    try:
        # (loaded in faces.early's thread: its result, or its error raised here)
        config = _v2_override(_load(args), args) if background is None else background.config()
    except ConfigError as exc:
        print(f"acp-bridge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if prespawned is not None:
        prespawned.confirm(config)

    from acp_bridge.cli.prompt import PromptFailed
    from acp_bridge.store.db import StoreError

    trace_file = None
    if getattr(args, "trace", None):
        from acp_bridge.observe.trace import open_trace_file

        try:
            trace_file = open_trace_file(args.trace)
        except OSError as exc:
            print(f"acp-bridge: --trace {args.trace}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        return _run(args, config, protocol_fd, trace_file, redactor, prespawned, early)
    except (StoreError, PromptFailed, BaseExceptionGroup) as exc:
        known = _known_failure(exc, (StoreError, PromptFailed))
        if known is None:
            raise
        print(f"acp-bridge {args.command}: {known}", file=sys.stderr)
        return 1 if isinstance(known, PromptFailed) else EXIT_USAGE


def _known_failure(
    exc: BaseException, kinds: tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception of ``kinds`` in ``exc`` (looking inside exception groups)."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _known_failure(inner, kinds)
            if found is not None:
                return found
    return None


def _run(
    args: argparse.Namespace,
    config: Config,
    protocol_fd: int | None,
    trace_file: IO[bytes] | None,
    redactor: Redactor,
    prespawned: Prespawned | None = None,
    early: Handover | None = None,
) -> int:
    import trio

    if args.command == "stdio":
        from acp_bridge.faces.stdio import serve_stdio

        assert protocol_fd is not None
        _freeze_start_up()
        trio.run(
            functools.partial(
                serve_stdio,
                config,
                protocol_fd,
                trace_file=trace_file,
                redactor=redactor,
                adopt=prespawned,
                early=early,
            )
        )
        return 0
    if args.command == "serve":
        from acp_bridge.faces.serve import run_serve

        _freeze_start_up()
        return run_serve(
            _listen_overrides(config, args.host, args.port),
            allow_remote=args.allow_remote,
            insecure=args.insecure,
            trace_file=trace_file,
            redactor=redactor,
        )
    if args.command == "prompt":
        from acp_bridge.cli.prompt import run_prompt

        stop = trio.run(
            lambda: run_prompt(
                config,
                args.text,
                agent=args.to,
                cwd=args.cwd,
                approve=args.yes,
                redactor=redactor,
                log_level=args.log_level,
            )
        )
        print(f"[stop reason: {stop}]", file=sys.stderr)
        return 0
    if args.command == "audit":
        return _audit(config, follow=args.follow, as_json=args.json)
    if args.command == "sessions":
        return _sessions(config, args.action, args.session_id, as_json=args.json)
    raise AssertionError(f"unknown command {args.command}")


def _freeze_start_up() -> None:
    """
    What start-up made (the modules, their classes and functions, the configuration: tens of
    thousands of objects) lives as long as the process: ``gc.freeze`` takes it out of the
    cyclic collector's generations, so that its full passes, which the traffic triggers now
    and then and which hold the event loop, walk only what the traffic made (a round trip
    that lands in one waits for it: docs/performance.md, "Start-up: initialize answered
    before the imports"). Objects freed by their reference count are freed as usual; only
    cycles among these objects are never collected.
    """
    import gc

    gc.freeze()


def _audit(config: Config, *, follow: bool, as_json: bool) -> int:
    """``acp-bridge audit``: the store's audit records, oldest first (``--follow``: and on)."""
    import json

    from acp_bridge.store.db import follow as follow_store
    from acp_bridge.store.db import format_audit, open_store

    store = open_store(config.store.resolved_path())
    try:
        rows = follow_store(store) if follow else iter(store.audit(limit=10**9))
        for row in rows:
            print(json.dumps(row) if as_json else format_audit(row), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
    return 0


def _sessions(config: Config, action: str, session_id: str | None, *, as_json: bool) -> int:
    """
    ``acp-bridge sessions``: what the store holds. ``export ID`` writes the session's journal
    as JSON lines (the relayed ``session/update`` messages, user prompts included, in order).
    """
    import json
    import time

    from acp_bridge.faces.status import session_tree
    from acp_bridge.store.db import open_store

    store = open_store(config.store.resolved_path())
    try:
        rows = store.sessions()
        if action == "export":
            if session_id is None:
                print("acp-bridge sessions export: which session? (ID)", file=sys.stderr)
                return EXIT_USAGE
            if session_id not in {r.bridge_id for r in rows}:
                print(f"acp-bridge sessions export: no session {session_id!r}", file=sys.stderr)
                return 1
            for entry in store.journal(session_id):
                sys.stdout.write(entry.data.decode("utf-8"))
            return 0
        # Sub-agents under their parents (docs/subagents.md).
        for depth, row in session_tree(rows, lambda r: r.bridge_id, lambda r: r.parent):
            first, last = store.journal_bounds(row.bridge_id)
            if as_json:
                record = {
                    "sessionId": row.bridge_id,
                    "agent": row.agent,
                    "agentSessionId": row.agent_id,
                    "cwd": row.roots[0] if row.roots else None,
                    "state": row.state,
                    "parent": row.parent,
                    "created": row.created,
                    "journal": {"first": first, "last": last},
                }
                print(json.dumps(record))
            else:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.created))
                cwd = row.roots[0] if row.roots else "-"
                name = "  " * (depth - 1) + "└ " + row.bridge_id if depth else row.bridge_id
                print(
                    f"{name}  {row.agent:12}  {row.state:7}  {when}  updates {first}..{last}  {cwd}"
                )
        return 0
    finally:
        store.close()
