"""
The configuration: TOML in, frozen attrs classes out.

Pure: no I/O beyond reading the one file in :func:`load_config`, and no trio. One private
cattrs converter (:func:`make_converter`) structures the data with ``forbid_extra_keys`` so a
misspelt key stops the daemon at startup instead of being silently ignored. Scalars are
structured strictly (a number is not a string, a boolean is not a number), because cattrs'
defaults would happily turn ``command = 5`` into ``"5"``.

Every problem is reported as one line that names the file and the key path in TOML's own
dotted syntax, e.g. ``configs/x.toml: unknown key 'agents.demo.comand' (did you mean
'command'?)`` or ``configs/x.toml: agents.demo.command: expected a string``.
"""

from __future__ import annotations

import ast
import difflib
import os
import pathlib
import re
import shlex
import tomllib
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, cast

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override
from cattrs.v import format_exception

from acp_bridge._policy import Policy, parse_policy, render_key_path, unknown_agents
from acp_bridge._remote import SshConfig, remote_problems

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
        max_connections: WebSocket connections open at once (503 past it).
        ping_interval: seconds between keepalive pings; 0 disables them.
        ping_timeout: seconds a client has to answer a ping, or to take a frame we send,
            before the connection is dropped.
        idle_timeout: seconds without any message from a client before it is closed; 0: never.
        handshake_timeout: seconds allowed for TLS plus the HTTP upgrade request.
        max_handshakes: connections in their TLS/HTTP handshake at once, apart from
            ``max_connections``. Past it a new connection takes the place of the oldest
            handshake if that one has been going for a second or more; else it is refused
            with 503.
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


# --- the converter -------------------------------------------------------------------------


class _Invalid(ValueError):
    """A value of the wrong type or shape; the message is shown as is."""


def _structure_str(obj: object, _: object) -> str:
    if not isinstance(obj, str):
        raise _Invalid("expected a string")
    return obj


def _structure_int(obj: object, _: object) -> int:
    # bool is an int subclass, but `port = true` is a mistake, not 1.
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise _Invalid("expected an integer")
    return obj


def _structure_float(obj: object, _: object) -> float:
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        raise _Invalid("expected a number")
    return float(obj)


def _structure_bool(obj: object, _: object) -> bool:
    if not isinstance(obj, bool):
        raise _Invalid("expected true or false")
    return obj


def _noted(exc: Exception, index: int | str, type_: object) -> Exception:
    """Tag ``exc`` with the key or index it happened at, the way cattrs does."""
    exc.add_note(IterableValidationNote(f"Structuring item @ {index!r}", index, type_))
    return exc


def _structure_str_tuple(obj: object, type_: Any) -> tuple[str, ...]:
    # A bare string is iterable too; without this check "x y" would become ('x', ' ', 'y').
    if not isinstance(obj, list | tuple):
        raise _Invalid("expected an array of strings")
    errors = [
        _noted(_Invalid("expected a string"), i, str)
        for i, item in enumerate(obj)
        if not isinstance(item, str)
    ]
    if errors:
        raise IterableValidationError("expected strings", errors, type_)
    return tuple(obj)


def _structure_str_map(obj: object, type_: Any) -> Mapping[str, str]:
    if not isinstance(obj, Mapping):
        raise _Invalid("expected a table of strings")
    errors = [
        _noted(_Invalid("expected a string"), key, str)
        for key, value in obj.items()
        if not isinstance(value, str)
    ]
    if errors:
        raise IterableValidationError("expected strings", errors, type_)
    return types.MappingProxyType(dict(obj))


def _agents_hook(converter: cattrs.Converter) -> Callable[[object, Any], Mapping[str, AgentConfig]]:
    """
    Structure ``[agents]``: a table keyed by name whose values lack the ``name`` field.

    Each value is structured as an :class:`AgentConfig` with its key injected as ``name``;
    errors are gathered per agent and tagged with its name, so the paths read
    ``agents.NAME.KEY``.
    """

    def structure(obj: object, type_: Any) -> Mapping[str, AgentConfig]:
        if not isinstance(obj, Mapping):
            raise _Invalid("expected a table of agents, e.g. [agents.NAME]")
        agents: dict[str, AgentConfig] = {}
        errors: list[Exception] = []
        for name, table in obj.items():
            if not isinstance(name, str) or not AGENT_NAME_RE.fullmatch(name):
                errors.append(_noted(_Invalid(_BAD_NAME), name, AgentConfig))
            elif not isinstance(table, Mapping):
                errors.append(_noted(_Invalid("expected a table"), name, AgentConfig))
            elif "name" in table:
                # The name is the table key; a `name` inside would contradict or repeat it.
                extra = ForbiddenExtraKeysError("", AgentConfig, {"name"})
                errors.append(_noted(extra, name, AgentConfig))
            else:
                try:
                    agents[name] = converter.structure({**table, "name": name}, AgentConfig)
                except Exception as exc:  # a cattrs validation group: say whose it is
                    errors.append(_noted(exc, name, AgentConfig))
        if errors:
            raise IterableValidationError("While structuring agents", errors, type_)
        return types.MappingProxyType(agents)

    return structure


def _table_hook_factory(cl: Any, converter: cattrs.Converter) -> Callable[[object, Any], Any]:
    """Structure an attrs class from a TOML table, saying "expected a table" for anything else."""
    if cl is Config:  # `source` records where the data came from; it is not a TOML key
        inner = make_dict_structure_fn(cl, converter, source=override(omit=True))
    else:
        inner = make_dict_structure_fn(cl, converter)

    def structure(obj: object, _: Any) -> Any:
        if not isinstance(obj, Mapping):
            raise _Invalid("expected a table")
        return inner(obj, cl)

    return structure


def _is(expected: object) -> Callable[[object], bool]:
    return lambda type_: type_ == expected


def make_converter() -> cattrs.Converter:
    """
    Build the config converter: strict scalars, forbidden extra keys, tables checked.

    A new, private converter each call; never the global one.
    """
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(bool, _structure_bool)
    # Generic aliases are not classes, so they are matched by equality, not dispatch.
    converter.register_structure_hook_func(_is(tuple[str, ...]), _structure_str_tuple)
    converter.register_structure_hook_func(_is(Mapping[str, str]), _structure_str_map)
    converter.register_structure_hook_func(_is(Mapping[str, AgentConfig]), _agents_hook(converter))
    converter.register_structure_hook_factory(attrs.has, _table_hook_factory)
    return converter


_CONVERTER: Final = make_converter()


# --- error messages ------------------------------------------------------------------------

_NO_AGENTS: Final = "no agents configured: add an [agents.NAME] table with a command"
_BAD_NAME: Final = "invalid agent name: use letters, digits, '_', '.' and '-'"

_KeyPath = tuple[str | int, ...]

# One step of a cattrs path as rendered by transform_error: `.attr`, `[0]` or `['key']`.
_PATH_STEP: Final = re.compile(
    r"""\.(?P<attr>[A-Za-z_][A-Za-z0-9_]*)"""
    r"""|\[(?P<index>-?[0-9]+|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]"""
)


def _parse_path(text: str) -> _KeyPath:
    """Turn a transform_error path (without its root) back into keys and indices."""
    steps: list[str | int] = []
    pos = 0
    while pos < len(text):
        m = _PATH_STEP.match(text, pos)
        if m is None:  # not a shape cattrs produces; keep the text rather than lose it
            return (*steps, text[pos:])
        if m["attr"] is not None:
            steps.append(m["attr"])
        else:
            key = ast.literal_eval(m["index"])
            steps.append(key if isinstance(key, int) else str(key))
        pos = m.end()
    return tuple(steps)


def _at(path: _KeyPath, message: str) -> str:
    return f"{render_key_path(path)}: {message}" if path else message


def _unknown_key(path: _KeyPath, key: str, cl: type) -> str:
    known = [f.name for f in attrs.fields(cl) if f.name not in ("name", "source")]
    hint = difflib.get_close_matches(key, known, n=1)
    suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown key {render_key_path((*path, key))!r}{suffix}"


def _describe(exc: BaseException, type_: Any, path: _KeyPath) -> list[str]:
    if isinstance(exc, ForbiddenExtraKeysError):
        return [_unknown_key(path, key, exc.cl) for key in sorted(exc.extra_fields)]
    if isinstance(exc, _Invalid):
        return [_at(path, str(exc))]
    if isinstance(exc, KeyError):
        return [_NO_AGENTS if path == ("agents",) else _at(path, "required key missing")]
    return [_at(path, format_exception(exc, type_))]


def _validation_problems(exc: ClassValidationError) -> list[str]:
    """
    Flatten a cattrs error group into one message per problem, unknown keys first.

    ``transform_error`` walks the group and renders each leaf as ``"{message} @ {path}"``;
    the formatter it calls only records the leaf and returns its index, so the path can be
    split off without guessing at what a message or a key might contain.
    """
    leaves: list[tuple[BaseException, Any]] = []

    def record(leaf: BaseException, type_: Any) -> str:
        leaves.append((leaf, type_))
        return str(len(leaves) - 1)

    problems: list[str] = []
    for line in cattrs.transform_error(exc, path="", format_exception=record):
        index, _, path = line.partition(" @ ")
        leaf, type_ = leaves[int(index)]
        problems.extend(_describe(leaf, type_, _parse_path(path)))
    problems.sort(key=lambda p: not p.startswith("unknown key"))
    return problems


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
    # [policy] has its own parser (acp_bridge._policy), with messages of the same form.
    policy_data = data.get("policy", {}) if isinstance(data, Mapping) else {}
    rest = {k: v for k, v in data.items() if k != "policy"} if isinstance(data, Mapping) else data
    try:
        config: Config = _CONVERTER.structure(rest, Config)
    except ClassValidationError as exc:
        raise ConfigError(source, _validation_problems(exc)) from None
    except _Invalid as exc:  # the document itself is not a table
        raise ConfigError(source, [str(exc)]) from None
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
