"""
The configuration: TOML in, frozen attrs classes out.

Pure: no I/O beyond reading the one file in :func:`load_config`, and no trio. One private
cattrs converter (:func:`make_converter`) structures the data with ``forbid_extra_keys`` so a
misspelt key stops the daemon at startup instead of being silently ignored. Scalars are
structured strictly (a number is not a string, a boolean is not a number), because cattrs'
defaults would happily turn ``command = 5`` into ``"5"``. A document with no mistake and only
plain values is structured without it, to the same result (``_quick_config``): cattrs and the
code it generates stay unloaded at start-up (``config.structure`` holds the converter).

Every problem is reported as one line that names the file and the key path in TOML's own
dotted syntax, e.g. ``configs/x.toml: unknown key 'agents.demo.comand' (did you mean
'command'?)`` or ``configs/x.toml: agents.demo.command: expected a string``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import attrs

from acp_bridge.config.remote import SshConfig, remote_problems
from acp_bridge.policy.rules import Policy, parse_policy, render_key_path, unknown_agents

if TYPE_CHECKING:
    import cattrs

    from acp_bridge.config import structure as config_cattrs

__all__ = [
    "AgentConfig",
    "BridgeConfig",
    "Config",
    "ConfigError",
    "SshConfig",
    "StoreConfig",
    "SubagentsConfig",
    "WebSocketConfig",
    "config_from_agent_specs",
    "default_state_dir",
    "load_config",
    "make_converter",
    "parse_config",
    "redact_env",
]

#: What an agent name may look like: it appears in logs, ``_meta`` and session ids.
AGENT_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")

#: Environment variable names whose values :func:`redact_env` hides.
_SECRET_NAME_RE: Final = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|AUTH", re.IGNORECASE)

_EMPTY: Final[Mapping[str, str]] = types.MappingProxyType({})


class ConfigError(Exception):
    """
    The configuration is unusable; the message says where and why.

    Attributes:
        source: the file (or ``--agent``, or ``<config>``) the problems were found in.
        problems: one line per problem, each without the source prefix.
    """

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__("\n".join(f"{source}: {p}" for p in self.problems))


def _frozen_env(env: Mapping[str, str]) -> Mapping[str, str]:
    """Copy into a read-only mapping, so a frozen config stays frozen all the way down."""
    return types.MappingProxyType(dict(env))


@attrs.frozen
class AgentConfig:
    """
    One ``[agents.NAME]`` table: how to start an agent subprocess.

    Attributes:
        name: the table key under ``[agents]``.
        command: the executable (looked up on ``PATH`` as a shell would).
        args: its arguments.
        env: extra environment variables, on top of the bridge's own environment.
        cwd: where the process starts (not the session cwd); relative paths in a config file
            are resolved against the file's directory. With ``ssh``: the remote directory,
            as written (relative to the remote user's home).
        start_timeout: seconds allowed for spawn plus ``initialize`` (with ``ssh``: the
            connection and login too).
        ssh: run ``command``, ``args`` and ``env`` on another host through OpenSSH.
        launcher: run them behind this argv prefix instead (``kubectl exec -i POD --``,
            ``docker exec -i CONTAINER``); ``env`` is set with ``env`` on the far side.
        client_fs: a remote agent gets the client's ``fs``/``terminal`` capabilities (the
            two sides share paths); default: not offered.
        path_map: the client's directory prefixes and the remote's, for a remote agent whose
            paths differ (session directories out, its fs/terminal paths back).
    """

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(default=_EMPTY, converter=_frozen_env)
    cwd: str | None = None
    start_timeout: float = 30.0
    ssh: SshConfig | None = None
    launcher: tuple[str, ...] | None = None
    client_fs: bool = False
    path_map: Mapping[str, str] = attrs.field(default=_EMPTY, converter=_frozen_env)


def _frozen_agents(agents: Mapping[str, AgentConfig]) -> Mapping[str, AgentConfig]:
    """Copy into a read-only mapping, keeping the order."""
    return types.MappingProxyType(dict(agents))


@attrs.frozen
class BridgeConfig:
    """
    The ``[bridge]`` table: routing defaults, limits and supervision.

    Attributes:
        default_agent: the agent of a ``session/new`` that names none.
        max_line_bytes: the longest protocol line accepted from any peer (a longer one from
            an agent stops that agent).
        client_queue: bounded outbound queue to a client, in messages.
        agent_queue: bounded outbound queue to an agent, in messages (requests and
            notifications; answers to the agent's own requests have as much again).
        max_agent_requests: requests one agent may have waiting on clients at once (shown,
            or kept for a reattach); past it a request is answered at once (a permission
            ``cancelled``, anything else an error). A few KiB each: 1024 bounds an agent that
            never stops asking at a client that never answers to a few MiB, far above what a
            real agent keeps open (one per tool call in flight).
        restart_backoff_initial: first delay before restarting a dead agent.
        restart_backoff_max: cap on that delay as it doubles.
        crash_loop_limit: restarts within ``crash_loop_window`` before giving up.
        crash_loop_window: seconds.
        stop_grace: seconds after closing an agent's stdin before SIGTERM, and again before
            SIGKILL.
        detach_grace: seconds a session outlives the connection that owned it (its agent
            keeps working; a new connection takes it back with session/resume or load).
        cancel_grace: seconds an agent has to end a cancelled turn (answer its
            ``session/prompt``) after ``session/cancel``; past them the bridge answers the
            prompt ``cancelled`` itself and drops the agent's late answer. 0: wait forever.
        history_limit: updates the bridge keeps per session for session/load replay.
        history_bytes: bytes of updates kept per session for replay (the older are trimmed).
        max_watchers: connections that may watch one session at once beside its owner
            (``_meta.acp_bridge.watch``); one more is refused.
        experimental_v2: serve ACP v2 to a client that initializes with protocol 2 (the
            draft; docs/v2.md); v1 clients are served v1 either way.
    """

    default_agent: str | None = None
    max_line_bytes: int = 16 * 1024 * 1024
    client_queue: int = 1024
    agent_queue: int = 256
    max_agent_requests: int = 1024
    restart_backoff_initial: float = 0.5
    restart_backoff_max: float = 30.0
    crash_loop_limit: int = 5
    crash_loop_window: float = 60.0
    stop_grace: float = 2.0
    detach_grace: float = 300.0
    cancel_grace: float = 10.0
    history_limit: int = 10_000
    history_bytes: int = 16 * 1024 * 1024
    max_watchers: int = 8
    experimental_v2: bool = False


@attrs.frozen
class WebSocketConfig:
    """
    The ``[websocket]`` table, used by ``acp-bridge serve``.

    Attributes:
        host: address to listen on; anything but loopback needs ``--allow-remote`` and TLS
            (or ``--insecure``).
        port: TCP port; 0 picks a free one.
        path: the HTTP path of the ACP endpoint.
        token: the bearer token clients must present (prefer ``token_file``).
        token_file: a file holding the token; relative to the config file's directory. With
            neither, a token is generated into ``token`` under :func:`default_state_dir`.
        allowed_origins: browser ``Origin`` values accepted; empty: only non-browser clients.
        allowed_hosts: ``Host`` header values accepted besides the loopback names and
            ``host``: ``NAME`` (with the listening port) or ``NAME:PORT`` (as a reverse proxy
            in front would present it).
        tls_cert: PEM certificate chain; with ``tls_key``, the listener speaks TLS (wss://).
        tls_key: PEM private key of ``tls_cert``.
        max_message_bytes: the largest WebSocket message accepted (close 1009 past it).
        max_connections: ACP connections open at once, WebSocket and HTTP together (503 past
            it).
        ping_interval: seconds between keepalive pings; 0 disables them.
        ping_timeout: seconds a client has to answer a ping, or to take a frame we send,
            before the connection is dropped.
        idle_timeout: seconds without any message from a client before it is closed; 0: never.
        handshake_timeout: seconds allowed for TLS plus the HTTP upgrade request.
        max_handshakes: connections in their TLS/HTTP handshake at once, apart from
            ``max_connections``. Past it a new connection takes the place of the oldest
            handshake if that one has been going for a second or more; else it is refused
            with 503.
        http_max_streams: server-sent-event streams one HTTP connection may hold, its
            connection's stream included (409 past it).
        http_buffer_bytes: what may wait for one HTTP connection's streams to take it; a
            connection that lets it fill up is cut off as a WebSocket client that stops
            reading is.
        http_retention_bytes: events one HTTP connection's streams wrote, kept so that a GET
            with ``Last-Event-ID`` resumes after any of them (the oldest go first).
        http_stream_timeout: seconds an HTTP connection lives with no stream open; then it
            ends and its sessions detach.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    path: str = "/acp"
    token: str | None = None
    token_file: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    max_message_bytes: int = 16 * 1024 * 1024
    max_connections: int = 64
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    idle_timeout: float = 3600.0
    handshake_timeout: float = 10.0
    max_handshakes: int = 16
    http_max_streams: int = 16
    http_buffer_bytes: int = 8 * 1024 * 1024
    http_retention_bytes: int = 8 * 1024 * 1024
    http_stream_timeout: float = 30.0


@attrs.frozen
class StoreConfig:
    """
    The ``[store]`` table: the SQLite database.

    Attributes:
        path: the database file; ``None`` for ``bridge.db`` under :func:`default_state_dir`;
            ``":memory:"`` for a throwaway store.
        journal: keep sessions and their relayed updates (replay after a restart).
        journal_keep: updates kept per session (the oldest are trimmed).
        journal_days: days an update is kept (0: no age limit).
    """

    path: str | None = None
    journal: bool = True
    journal_keep: int = 100_000
    journal_days: float = 30.0

    def resolved_path(self) -> str:
        """The database to open: ``path``, or the default under the state directory."""
        if self.path is not None:
            return self.path
        return str(default_state_dir() / "bridge.db")


@attrs.frozen
class SubagentsConfig:
    """
    The ``[subagents]`` table: agents starting sessions on other agents (docs/subagents.md).

    Attributes:
        enabled: offer the bridge's ``acp-bridge`` MCP server to every agent session.
        max_depth: how deep a tree of sessions may grow: a session at this depth (a client's
            session is at 0) is offered no ``spawn_agent``.
        max_children: children one session may have open at once (more: a tool error).
        agents: globs of the agents a parent may spawn.
    """

    enabled: bool = True
    max_depth: int = 2
    max_children: int = 8
    agents: tuple[str, ...] = ("*",)


@attrs.frozen
class Config:
    """
    The whole configuration.

    Attributes:
        agents: by name, in the order the file lists them.
        bridge: ``[bridge]``.
        websocket: ``[websocket]``.
        policy: ``[policy]``.
        store: ``[store]``.
        subagents: ``[subagents]``.
        source: where it came from, for messages (not a TOML key).
    """

    agents: Mapping[str, AgentConfig] = attrs.field(converter=_frozen_agents)
    bridge: BridgeConfig = BridgeConfig()
    websocket: WebSocketConfig = WebSocketConfig()
    policy: Policy = attrs.field(factory=Policy)
    store: StoreConfig = StoreConfig()
    subagents: SubagentsConfig = SubagentsConfig()
    source: str = "<config>"

    @property
    def default_agent(self) -> AgentConfig:
        """
        The agent of a session that names none.

        ``bridge.default_agent`` if set, else the first agent (the only one, or the first in
        file or command-line order).

        Raises:
            ConfigError: there are no agents, or ``bridge.default_agent`` names none of them.
        """
        name = self.bridge.default_agent
        if name is None:
            first = next(iter(self.agents.values()), None)
            if first is None:
                raise ConfigError(self.source, [_NO_AGENTS])
            return first
        try:
            return self.agents[name]
        except KeyError:
            raise ConfigError(self.source, [_unknown_default(name, self.agents)]) from None


# --- structuring ---------------------------------------------------------------------------


def make_converter() -> cattrs.Converter:
    """
    Build the config converter: strict scalars, forbidden extra keys, tables checked.

    A new, private converter each call; never the global one.
    """
    from acp_bridge.config.structure import make_converter as make

    return make(_schema())


def _schema() -> config_cattrs.Schema:
    """What the converter structures (its module is imported at the first document it takes)."""
    from acp_bridge.config.structure import Schema

    return Schema(Config, AgentConfig, AGENT_NAME_RE, _BAD_NAME, _NO_AGENTS)


def _quick_value(type_: object, value: object) -> tuple[bool, object]:
    """``(True, structured)`` when the converter's hooks take ``value`` as is, else False."""
    if type_ is str or type_ == str | None:  # (None, which TOML never gives, is left over)
        return isinstance(value, str), value
    if type_ is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if type_ is float and isinstance(value, int | float) and not isinstance(value, bool):
        return True, float(value)
    if type_ is bool:
        return isinstance(value, bool), value
    if type_ == tuple[str, ...] and isinstance(value, list | tuple):
        return all(isinstance(v, str) for v in value), tuple(value)
    if type_ == Mapping[str, str] and isinstance(value, Mapping):
        strings = all(isinstance(v, str) for v in value.values())
        return strings, types.MappingProxyType(dict(value))
    return False, value


#: The field types of each class, evaluated once (the annotations are strings).
_HINTS: dict[type, dict[str, Any]] = {}


def _quick_table(cl: Any, table: object, extra: Mapping[str, object] | None = None) -> Any:
    """``cl`` from a table of known keys and plain values (:func:`_quick_config`), or None."""
    if not isinstance(table, Mapping):
        return None
    hints = _HINTS.get(cl)
    if hints is None:
        hints = _HINTS[cl] = typing.get_type_hints(cl)
    kwargs: dict[str, object] = dict(extra or {})
    for key, value in table.items():
        if key in kwargs or not isinstance(key, str):
            return None
        ok, kwargs[key] = _quick_value(hints.get(key), value)
        if not ok:
            return None
    if any(f.default is attrs.NOTHING and f.name not in kwargs for f in attrs.fields(cl)):
        return None  # (a required key is missing)
    return cl(**kwargs)


#: The tables of :class:`Config` the quick structuring takes (``[agents]`` apart).
_QUICK_TABLES: Final[Mapping[str, type]] = {
    "bridge": BridgeConfig,
    "websocket": WebSocketConfig,
    "store": StoreConfig,
    "subagents": SubagentsConfig,
}


def _quick_config(data: object) -> Config | None:
    """
    The :class:`Config` the converter would build from ``data``, when that is plain; else None.

    Plain: known keys only, and values that pass the converter's checks as they are (strings,
    integers, numbers, booleans, arrays of strings, tables of strings), agents named as
    ``AGENT_NAME_RE`` says, and every required key there. Then the converter's result is
    this one: the same classes built with the same values (integers become floats where a
    number is expected, arrays tuples, tables read-only mappings). Anything else (a mistake,
    ``ssh``, ``launcher``, a ``source`` key) gets None, and the converter structures it and
    says what is wrong: its messages are the only ones. The converter's module (cattrs, and
    the code cattrs generates) then stays unloaded on the common path.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("agents"), Mapping):
        return None
    agents: dict[str, AgentConfig] = {}
    for name, table in data["agents"].items():
        if not isinstance(name, str) or not AGENT_NAME_RE.fullmatch(name):
            return None
        if not isinstance(table, Mapping) or "name" in table:
            return None
        agent = _quick_table(AgentConfig, table, {"name": name})
        if agent is None:
            return None
        agents[name] = agent
    tables: dict[str, Any] = {}
    for key, table in data.items():
        if key == "agents":
            continue
        cl = _QUICK_TABLES.get(key) if isinstance(key, str) else None
        tables[key] = None if cl is None else _quick_table(cl, table)
        if tables[key] is None:
            return None
    return Config(agents=agents, **tables)


# --- messages shared with the converter (config.structure) -------------------------------

_NO_AGENTS: Final = "no agents configured: add an [agents.NAME] table with a command"
_BAD_NAME: Final = "invalid agent name: use letters, digits, '_', '.' and '-'"


def _unknown_default(name: str, agents: Mapping[str, AgentConfig]) -> str:
    known = ", ".join(agents) or "none"
    return f"bridge.default_agent: unknown agent {name!r} (configured: {known})"


# --- semantic checks -----------------------------------------------------------------------


def _check(config: Config) -> list[str]:
    """What the types cannot say: non-empty commands, positive limits, known names."""
    problems: list[str] = []

    def need(ok: bool, path: str, message: str) -> None:
        if not ok:
            problems.append(f"{path}: {message}")

    if not config.agents:
        problems.append(_NO_AGENTS)
    for name, agent in config.agents.items():
        prefix = render_key_path(("agents", name))
        need(agent.command != "", f"{prefix}.command", "must not be empty")
        need(agent.start_timeout > 0, f"{prefix}.start_timeout", "must be positive")
        problems += remote_problems(agent)
    bridge = config.bridge
    if bridge.default_agent is not None and bridge.default_agent not in config.agents:
        problems.append(_unknown_default(bridge.default_agent, config.agents))
    need(bridge.max_line_bytes >= 1024, "bridge.max_line_bytes", "must be at least 1024")
    need(bridge.client_queue >= 1, "bridge.client_queue", "must be at least 1")
    need(bridge.agent_queue >= 1, "bridge.agent_queue", "must be at least 1")
    need(bridge.max_agent_requests >= 1, "bridge.max_agent_requests", "must be at least 1")
    need(bridge.detach_grace >= 0, "bridge.detach_grace", "must not be negative")
    need(bridge.max_watchers >= 0, "bridge.max_watchers", "must not be negative")
    need(bridge.cancel_grace >= 0, "bridge.cancel_grace", "must not be negative")
    need(bridge.history_limit >= 0, "bridge.history_limit", "must not be negative")
    need(bridge.history_bytes >= 0, "bridge.history_bytes", "must not be negative")
    need(bridge.restart_backoff_initial > 0, "bridge.restart_backoff_initial", "must be positive")
    need(
        bridge.restart_backoff_max >= bridge.restart_backoff_initial,
        "bridge.restart_backoff_max",
        "must be at least bridge.restart_backoff_initial",
    )
    need(bridge.crash_loop_limit >= 1, "bridge.crash_loop_limit", "must be at least 1")
    need(bridge.crash_loop_window > 0, "bridge.crash_loop_window", "must be positive")
    need(bridge.stop_grace >= 0, "bridge.stop_grace", "must not be negative")
    ws = config.websocket
    need(0 <= ws.port <= 65535, "websocket.port", "must be between 0 and 65535")
    need(ws.path.startswith("/"), "websocket.path", "must start with '/'")
    need(
        ws.token is None or ws.token_file is None,
        "websocket.token",
        "set token or token_file, not both",
    )
    need(ws.token != "", "websocket.token", "must not be empty")
    need(
        (ws.tls_cert is None) == (ws.tls_key is None),
        "websocket.tls_cert" if ws.tls_cert is None else "websocket.tls_key",
        "set both tls_cert and tls_key, or neither",
    )
    for i, entry in enumerate(ws.allowed_hosts):
        need(
            re.fullmatch(r"[^\s/@\\]+", entry) is not None,
            f"websocket.allowed_hosts[{i}]",
            "expected NAME or NAME:PORT",
        )
    need(ws.max_message_bytes >= 1024, "websocket.max_message_bytes", "must be at least 1024")
    need(ws.max_connections >= 1, "websocket.max_connections", "must be at least 1")
    need(ws.ping_interval >= 0, "websocket.ping_interval", "must not be negative")
    need(ws.ping_timeout > 0, "websocket.ping_timeout", "must be positive")
    need(ws.idle_timeout >= 0, "websocket.idle_timeout", "must not be negative")
    need(ws.handshake_timeout > 0, "websocket.handshake_timeout", "must be positive")
    need(ws.max_handshakes >= 1, "websocket.max_handshakes", "must be at least 1")
    need(ws.http_max_streams >= 2, "websocket.http_max_streams", "must be at least 2")
    need(ws.http_buffer_bytes >= 65536, "websocket.http_buffer_bytes", "must be at least 65536")
    need(ws.http_retention_bytes >= 0, "websocket.http_retention_bytes", "must not be negative")
    need(ws.http_stream_timeout > 0, "websocket.http_stream_timeout", "must be positive")
    need(config.store.path != "", "store.path", "must not be empty")
    need(config.store.journal_keep >= 1, "store.journal_keep", "must be at least 1")
    need(config.store.journal_days >= 0, "store.journal_days", "must not be negative")
    need(config.subagents.max_depth >= 0, "subagents.max_depth", "must not be negative")
    need(config.subagents.max_children >= 1, "subagents.max_children", "must be at least 1")
    return problems


def _resolve(path: str | None, base_dir: str | None) -> str | None:
    """Expand ``~`` and anchor a relative path at the config file's directory."""
    if path is None or path == ":memory:" or base_dir is None:
        return path
    return os.path.join(base_dir, os.path.expanduser(path))


def _resolve_agent(agent: AgentConfig, base_dir: str | None) -> AgentConfig:
    """An agent's local paths anchored; an ssh agent's ``cwd`` is the remote's, kept as is."""
    if agent.ssh is None:
        return attrs.evolve(agent, cwd=_resolve(agent.cwd, base_dir))
    ssh = attrs.evolve(agent.ssh, identity=_resolve(agent.ssh.identity, base_dir))
    return attrs.evolve(agent, ssh=ssh)


# --- entry points --------------------------------------------------------------------------


def parse_config(
    data: Mapping[str, object], *, source: str = "<config>", base_dir: str | None = None
) -> Config:
    """
    Structure and check already-parsed TOML data.

    Args:
        data: the document, as :func:`tomllib.loads` returns it.
        source: names the origin in messages.
        base_dir: relative ``cwd`` (but an ssh agent's, which is remote), ``ssh.identity``,
            ``token_file``, ``tls_cert``, ``tls_key`` and ``store.path`` values are resolved
            against it (after ``~`` expansion); ``None`` leaves them as
            written.

    Raises:
        ConfigError: with every problem found, one per line.
    """
    # [policy] has its own parser (acp_bridge.policy.rules), with messages of the same form.
    policy_data = data.get("policy", {}) if isinstance(data, Mapping) else {}
    rest = {k: v for k, v in data.items() if k != "policy"} if isinstance(data, Mapping) else data
    config = _quick_config(rest)
    if config is None:  # (a mistake, or a part the quick structuring leaves to the converter)
        from acp_bridge.config.structure import Problems, structure

        try:
            config = structure(rest, _schema())
        except Problems as exc:
            raise ConfigError(source, exc.problems) from None
    policy, policy_problems = parse_policy(cast("Mapping[str, object]", policy_data))
    problems = _check(config) + policy_problems
    if not policy_problems:
        problems += unknown_agents(policy, list(config.agents))
    if problems:
        raise ConfigError(source, problems)
    return attrs.evolve(
        config,
        source=source,
        policy=policy,
        agents={name: _resolve_agent(agent, base_dir) for name, agent in config.agents.items()},
        websocket=attrs.evolve(
            config.websocket,
            token_file=_resolve(config.websocket.token_file, base_dir),
            tls_cert=_resolve(config.websocket.tls_cert, base_dir),
            tls_key=_resolve(config.websocket.tls_key, base_dir),
        ),
        store=attrs.evolve(config.store, path=_resolve(config.store.path, base_dir)),
    )


def load_config(path: str | os.PathLike[str]) -> Config:
    """
    Read and check a TOML config file.

    Relative paths inside it are resolved against the file's directory.

    Raises:
        ConfigError: the file is missing or unreadable, is not valid TOML, or its content is
            wrong; the message names the file, and the key path where there is one.
    """
    source = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(source, ["no such file"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"not UTF-8 text ({exc.reason} at byte {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"invalid TOML: {exc}"]) from None
    base_dir = os.path.dirname(os.path.abspath(path))
    return parse_config(data, source=source, base_dir=base_dir)


def config_from_agent_specs(specs: Sequence[str], *, base: Config | None = None) -> Config:
    """
    Build a config from ``--agent NAME=COMMAND`` options (zero-config mode).

    ``COMMAND`` is split like a shell would (:func:`shlex.split`); its first word is the
    executable. The first spec is the default agent.

    Args:
        specs: the option values, in command-line order; at least one.
        base: a loaded config to extend: its other tables are kept, and so are its agents
            unless a spec reuses the name, in which case the spec replaces it.

    Raises:
        ConfigError: (source ``--agent``) for a spec without ``=``, an empty or invalid name,
            an empty command, unbalanced quotes, or a name given twice.
    """
    problems: list[str] = []
    agents: dict[str, AgentConfig] = {}
    for spec in specs:
        name, eq, command = spec.partition("=")
        where = f"{spec!r}"
        if not eq:
            problems.append(f"{where}: expected NAME=COMMAND")
            continue
        if not name:
            problems.append(f"{where}: empty agent name")
            continue
        if not AGENT_NAME_RE.fullmatch(name):
            problems.append(f"{where}: {_BAD_NAME}")
            continue
        if name in agents:
            problems.append(f"{where}: agent {name!r} given twice")
            continue
        try:
            argv = shlex.split(command)
        except ValueError as exc:  # unbalanced quotes, a trailing backslash
            problems.append(f"{where}: {exc}")
            continue
        if not argv:
            problems.append(f"{where}: empty command")
            continue
        agents[name] = AgentConfig(name=name, command=argv[0], args=tuple(argv[1:]))
    if not specs:
        problems.append("no agents given")
    if problems:
        raise ConfigError("--agent", problems)
    first = next(iter(agents))
    if base is None:
        return Config(agents=agents, bridge=BridgeConfig(default_agent=first), source="--agent")
    merged = {**{n: a for n, a in base.agents.items() if n not in agents}, **agents}
    return attrs.evolve(
        base,
        agents=merged,
        bridge=attrs.evolve(base.bridge, default_agent=first),
        source=f"{base.source} + --agent",
    )


def default_state_dir() -> pathlib.Path:
    """
    Where the bridge keeps its state: ``$XDG_STATE_HOME/acp-bridge``.

    Falls back to ``~/.local/state/acp-bridge`` when the variable is unset, empty or
    relative (the XDG spec says to ignore relative values).
    """
    xdg = os.environ.get("XDG_STATE_HOME", "")
    root = pathlib.Path(xdg) if os.path.isabs(xdg) else pathlib.Path.home() / ".local" / "state"
    return root / "acp-bridge"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """
    Copy ``env`` for logging, with secrets hidden.

    The value of every name containing KEY, TOKEN, SECRET, PASSWORD or AUTH (in any case)
    becomes ``"***"``.
    """
    return {name: "***" if _SECRET_NAME_RE.search(name) else value for name, value in env.items()}
