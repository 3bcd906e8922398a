"""
Remote agents: the argv that runs an agent elsewhere, and what changes when it does.

Pure: no trio, no I/O. An agent with ``ssh = {...}`` runs through the system's OpenSSH
client; one with ``launcher = [...]`` through any other engine's argv prefix (``kubectl exec
-i POD --``, ``docker exec -i CONTAINER``, ``devcontainer exec``). The bridge supervises the
local engine process like any agent: its exit is the agent's death, whatever the cause (the
agent ended, or the connection dropped).

Quoting: sshd always runs the command it is given as ``$SHELL -c STRING`` with the remote
user's shell, and ssh joins its command arguments with spaces, so :func:`remote_command`
builds that STRING itself, quoting every word exactly once with :func:`shlex.quote`
(POSIX shells: sh, bash, dash, zsh, ksh). ``exec`` replaces that shell by ``env``, which
sets the agent's ``env`` and replaces itself by the agent: no login shell, no shell between
ssh and the agent (so its stdin EOF is the agent's). A launcher runs no shell at all: its
argv reaches the engine as separate words, so nothing is quoted.

Files: a remote agent's paths are the remote machine's. The client's ``fs/*`` and
``terminal/*`` are not offered to it (:func:`offered_capabilities`, :func:`may_call_client`)
unless ``client_fs = true`` says both sides see the same files; ``path_map`` (:class:`PathMap`)
rewrites the session's cwd and additionalDirectories from the client's paths to the remote's
on the way to the agent, and the agent's fs/terminal paths back before containment checks
them against the session's roots (the client's paths).

Sub-agents: the bridge's MCP server (DESIGN §9) listens on the bridge's loopback. An ssh agent
reaches it through a reverse forward on its own connection (:func:`forward_to_bridge`, wired by
``Offers.launch_config`` in ``engine.offers``). The remote port is not the bridge's own:
when the "remote" host is this one (ssh to another user here), the bridge already holds that
port. A launcher has no forward of its own: its agents get the server only over ACP
(``mcpCapabilities.acp``: through their own pipe, no port).
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
import types

# (Mapping at run time: cattrs reads SshConfig's annotations when it structures a config.)
from collections.abc import Mapping  # noqa: TC003
from typing import TYPE_CHECKING, Final, Protocol

import attrs

from acp_bridge.policy.rules import render_key_path

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "SSH_FAILED",
    "AgentConfig",
    "ForwardingSsh",
    "PathMap",
    "SshConfig",
    "agent_argv",
    "death_reason",
    "forward_to_bridge",
    "is_remote",
    "launcher_argv",
    "location",
    "map_from_agent",
    "map_listed_session",
    "map_to_agent",
    "may_call_client",
    "offered_capabilities",
    "remote_command",
    "remote_problems",
    "ssh_argv",
    "start_failure",
    "start_timeout_note",
]


def _frozen_options(options: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy, so a frozen config stays frozen all the way down."""
    return types.MappingProxyType(dict(options))


@attrs.frozen
class SshConfig:
    """
    An agent's ``ssh = { host, port?, user?, identity?, options? }``: run it on that host
    through the system's OpenSSH client (see :mod:`acp_bridge.config.remote`).

    Attributes:
        host: a host name, an address, or an alias of the user's ssh_config.
        port: the sshd port; default: ssh's (22, or the ssh_config's).
        user: the remote user; default: ssh's.
        identity: the private key file (``-i``, with ``IdentitiesOnly=yes``); relative to the
            config file's directory.
        options: extra ``-o NAME=VALUE`` options (strings), e.g. ``ProxyJump``.
    """

    host: str
    port: int | None = None
    user: str | None = None
    identity: str | None = None
    options: Mapping[str, str] = attrs.field(
        factory=lambda: types.MappingProxyType({}), converter=_frozen_options
    )


@attrs.frozen
class ForwardingSsh(SshConfig):
    """
    An :class:`SshConfig` whose connection also forwards the remote's
    ``127.0.0.1:remote_port`` to this machine's ``127.0.0.1:bridge_port`` (the MCP listener).
    Made by :func:`forward_to_bridge` for one launch, never read from a config file.
    """

    remote_port: int = attrs.field(default=0, kw_only=True)
    bridge_port: int = attrs.field(default=0, kw_only=True)


def forward_to_bridge(ssh: SshConfig, remote_port: int, bridge_port: int) -> ForwardingSsh:
    """``ssh`` with a reverse forward from the remote's loopback port to the bridge's."""
    return ForwardingSsh(
        **attrs.asdict(ssh, recurse=False), remote_port=remote_port, bridge_port=bridge_port
    )


class AgentConfig(Protocol):
    """What this module reads of an agent's configuration (``config.model.AgentConfig``)."""

    @property
    def name(self) -> str: ...
    @property
    def command(self) -> str: ...
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def cwd(self) -> str | None: ...
    @property
    def start_timeout(self) -> float: ...
    @property
    def ssh(self) -> SshConfig | None: ...
    @property
    def launcher(self) -> tuple[str, ...] | None: ...
    @property
    def client_fs(self) -> bool: ...
    @property
    def path_map(self) -> Mapping[str, str]: ...


#: ssh's exit status when ssh itself failed (could not connect, authenticate, or lost the
#: connection); any other status is the remote command's own.
SSH_FAILED: Final = 255
#: Seconds between ssh's keepalive probes, and how many may go unanswered: a connection that
#: silently died (a cable pulled, a NAT forgot it) is noticed after about 15 * 3 = 45 s, the
#: ssh client exits 255 and the agent is handled as dead. ``options`` can override both.
KEEPALIVE_INTERVAL: Final = 15
KEEPALIVE_COUNT: Final = 3

#: ssh options the bridge sets and a config may not override: each would break the protocol
#: pipe (a prompt for a password or host key read from the agent's stdin, a TTY that mangles
#: bytes, an escape character, another command, no command at all, a session in background).
_OWNED_OPTIONS: Final = {
    "batchmode": "the bridge sets BatchMode=yes: nothing can answer a prompt",
    "requesttty": "the bridge runs ssh with -T: a TTY would mangle the protocol",
    "escapechar": "the bridge runs ssh with -e none: the protocol is binary-clean",
    "remotecommand": "the command is the agent's command, args and env",
    "sessiontype": "the agent needs a command session",
    "stdinnull": "the agent's stdin is the protocol",
    "forkafterauthentication": "the bridge supervises the ssh process itself",
    "port": "use ssh.port",
    "user": "use ssh.user",
    "identityfile": "use ssh.identity",
}
_OPTION_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9]*")
#: A host as ssh takes it: a name, an address, an ssh_config alias (no spaces, no option).
_HOST: Final = re.compile(r"[^\s\-][^\s]*")
_ENV_NAME: Final = re.compile(r"[^=\x00]+")

#: Methods an agent calls on the client that touch the client's files or run its commands.
_CLIENT_FS_METHODS: Final = frozenset(
    {
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "terminal/output",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/release",
    }
)
#: Requests to an agent whose params carry the session's directories (client → remote paths).
_SETUP_METHODS: Final = frozenset(
    {"session/new", "session/load", "session/resume", "session/fork", "session/list"}
)


def is_remote(config: AgentConfig) -> bool:
    """The agent runs through ssh or a launcher (its files are not the client's)."""
    return config.ssh is not None or config.launcher is not None


# --- argv ------------------------------------------------------------------------------------


def remote_command(
    command: str, args: Sequence[str], env: Mapping[str, str], cwd: str | None = None
) -> str:
    """
    The command line sshd hands to the remote user's shell (``$SHELL -c LINE``).

    ``exec env -- K=V ... COMMAND ARGS``, each word quoted once, behind ``cd -- CWD &&`` when
    a cwd is given. ``--`` keeps a command or value that starts with ``-`` from being read as
    an option of ``env``; a command containing ``=`` would be read as a variable, so the
    configuration refuses one (:func:`remote_problems`).
    """
    words = ["exec", "env", "--", *(f"{k}={v}" for k, v in env.items()), command, *args]
    line = " ".join(shlex.quote(w) for w in words)
    if cwd is not None:
        line = f"cd -- {shlex.quote(cwd)} && {line}"
    return line


def ssh_argv(ssh: SshConfig, line: str, *, connect_timeout: float) -> list[str]:
    """
    The local argv: ``ssh`` with its options, ``--``, the host and the remote command line.

    ssh keeps the first value it is given for an option, so the order is: what the bridge
    needs (batch mode, no TTY, no escape character), the configured ``options``, then the
    defaults those may override (connect timeout, keepalives, no agent or X11 forwarding:
    the remote agent must not reach the user's ssh-agent).
    """
    argv = ["ssh", "-T", "-e", "none", "-o", "BatchMode=yes"]
    if ssh.port is not None:
        argv += ["-p", str(ssh.port)]
    if ssh.user is not None:
        argv += ["-l", ssh.user]
    if ssh.identity is not None:
        argv += ["-i", ssh.identity]
    if isinstance(ssh, ForwardingSsh):
        # Before the configured options, so ExitOnForwardFailure=yes wins: a remote port that
        # is taken is a start error (ssh exits 255 saying so), not an agent whose sub-agent
        # tools fail later.
        forward = f"127.0.0.1:{ssh.remote_port}:127.0.0.1:{ssh.bridge_port}"
        argv += ["-R", forward, "-o", "ExitOnForwardFailure=yes"]
    for name, value in ssh.options.items():
        argv += ["-o", f"{name}={value}"]
    defaults = [
        f"ConnectTimeout={max(1, math.ceil(connect_timeout))}",
        f"ServerAliveInterval={KEEPALIVE_INTERVAL}",
        f"ServerAliveCountMax={KEEPALIVE_COUNT}",
        "ForwardAgent=no",
        "ForwardX11=no",
    ]
    if ssh.identity is not None:
        # Only the configured key: keys offered from an ssh-agent first can use up the
        # server's MaxAuthTries before it is tried.
        defaults.append("IdentitiesOnly=yes")
    for option in defaults:
        argv += ["-o", option]
    return [*argv, "--", ssh.host, line]


def launcher_argv(
    prefix: Sequence[str], command: str, args: Sequence[str], env: Mapping[str, str]
) -> list[str]:
    """
    ``PREFIX [env -- K=V ...] COMMAND ARGS``: the engine runs the rest as an argv, no shell.

    The agent's ``env`` is set on the far side with ``env`` (engines differ in how they take
    variables, and not all of them can), so it needs ``env`` in the container or pod.
    """
    setenv = ["env", "--", *(f"{k}={v}" for k, v in env.items())] if env else []
    return [*prefix, *setenv, command, *args]


def agent_argv(config: AgentConfig) -> list[str] | None:
    """The local argv of a remote agent; None for an agent that runs here."""
    if config.ssh is not None:
        line = remote_command(config.command, config.args, config.env, config.cwd)
        return ssh_argv(config.ssh, line, connect_timeout=config.start_timeout)
    if config.launcher is not None:
        return launcher_argv(config.launcher, config.command, config.args, config.env)
    return None


# --- where it runs, and why it ended ---------------------------------------------------------


def _ssh_target(ssh: SshConfig) -> str:
    host = f"[{ssh.host}]" if ":" in ssh.host else ssh.host
    user = f"{ssh.user}@" if ssh.user is not None else ""
    port = f":{ssh.port}" if ssh.port is not None else ""
    return f"{user}{host}{port}"


def location(config: AgentConfig) -> str:
    """
    Where the agent runs, for ``acp-bridge status`` and ``_acp_bridge/agents``: ``local``,
    ``ssh USER@HOST:PORT`` (as configured; ssh_config may add to it), or the launcher's argv.
    """
    if config.ssh is not None:
        return f"ssh {_ssh_target(config.ssh)}"
    if config.launcher is not None:
        return shlex.join(config.launcher)
    return "local"


def _last_line(stderr_tail: Iterable[str]) -> str:
    lines = [line.strip() for line in stderr_tail if line.strip()]
    return lines[-1] if lines else "no message from ssh"


def start_failure(config: AgentConfig, status: int | None, stderr_tail: Iterable[str]) -> str:
    """
    Why an agent that exited before answering ``initialize`` did so, when the engine says
    more than its status: ssh's 255 (it could not connect or log in) names the host and
    carries ssh's last stderr line. "" otherwise.
    """
    if config.ssh is not None and status == SSH_FAILED:
        target = _ssh_target(config.ssh)
        return f": ssh could not reach {target}: {_last_line(stderr_tail)}"
    if config.launcher is not None:
        return f" (through {shlex.join(config.launcher)})"
    return ""


def death_reason(config: AgentConfig, status: int | None) -> str:
    """What to call a running agent's end: ``exited``, or a lost ssh connection."""
    if config.ssh is not None and status == SSH_FAILED:
        return f"lost its ssh connection to {_ssh_target(config.ssh)}"
    return "exited"


def start_timeout_note(config: AgentConfig) -> str:
    """Appended to "did not answer initialize within N s": where it was being started."""
    return "" if not is_remote(config) else f" (running on {location(config)})"


# --- the client's files ----------------------------------------------------------------------


def offered_capabilities(config: AgentConfig, caps: Mapping[str, object]) -> dict[str, object]:
    """
    The ``clientCapabilities`` an agent is initialized with: the client's, less ``fs`` and
    ``terminal`` for a remote agent without ``client_fs`` (its paths are not the client's).
    """
    if not is_remote(config) or config.client_fs:
        return dict(caps)
    return {k: v for k, v in caps.items() if k not in ("fs", "terminal")}


def may_call_client(config: AgentConfig, method: str) -> bool:
    """False for a remote agent's fs/terminal call the bridge did not offer it."""
    return method not in _CLIENT_FS_METHODS or not is_remote(config) or config.client_fs


def _norm(path: str) -> str:
    # Lexical only (no file is looked at: the paths are on another machine). posixpath keeps
    # a leading "//"; one root is enough.
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/") if norm.startswith("//") else norm


def _under(path: str, prefix: str) -> str | None:
    """The rest of ``path`` below ``prefix`` ("" for the prefix itself), or None."""
    if path == prefix:
        return ""
    if prefix == "/":
        return path
    if path.startswith(prefix + "/"):
        return path[len(prefix) :]
    return None


class PathMap:
    """
    ``path_map``: the client's directory prefixes and the remote's, both ways.

    A path is rewritten by its longest matching prefix, whole components only (``/a/b``
    is under ``/a`` but ``/ab`` is not), after ``.`` and ``..`` are folded lexically. A path
    under no prefix is returned as it came: the agent's own paths, or directories both
    sides share.
    """

    __slots__ = ("_to_client", "_to_remote")

    def __init__(self, mapping: Mapping[str, str]) -> None:
        pairs = [(_norm(client), _norm(remote)) for client, remote in mapping.items()]
        self._to_remote = sorted(pairs, key=lambda p: len(p[0]), reverse=True)
        self._to_client = sorted(((r, c) for c, r in pairs), key=lambda p: len(p[0]), reverse=True)

    @staticmethod
    def _rewrite(path: str, table: Sequence[tuple[str, str]]) -> str:
        if not path.startswith("/"):
            return path  # relative (or not a path): containment refuses it where it matters
        norm = _norm(path)
        for source, target in table:
            rest = _under(norm, source)
            if rest is not None:
                return target + rest if target != "/" or not rest else rest
        return path

    def to_remote(self, path: str) -> str:
        return self._rewrite(path, self._to_remote)

    def to_client(self, path: str) -> str:
        return self._rewrite(path, self._to_client)


def map_to_agent(config: AgentConfig, method: str, params: dict[str, object]) -> None:
    """
    Rewrite, in place, the ``cwd`` and ``additionalDirectories`` of a request to the agent
    from the client's paths to the remote's (``path_map``). Other requests are left alone.
    """
    if not config.path_map or method not in _SETUP_METHODS:
        return
    _map_dirs(params, PathMap(config.path_map).to_remote)


def _map_dirs(obj: dict[str, object], convert: Callable[[str], str]) -> None:
    """A session's ``cwd`` and ``additionalDirectories`` in ``obj``, converted in place."""
    cwd = obj.get("cwd")
    if isinstance(cwd, str):
        obj["cwd"] = convert(cwd)
    extra = obj.get("additionalDirectories")
    if isinstance(extra, list):
        obj["additionalDirectories"] = [convert(d) if isinstance(d, str) else d for d in extra]


def map_from_agent(config: AgentConfig, params: dict[str, object], key: str) -> None:
    """Rewrite, in place, a path the agent sent (``params[key]``) to the client's."""
    value = params.get(key)
    if config.path_map and isinstance(value, str):
        params[key] = PathMap(config.path_map).to_client(value)


def map_listed_session(config: AgentConfig, info: dict[str, object]) -> None:
    """A ``session/list`` entry from the agent: its directories as the client's paths."""
    if not config.path_map:
        return
    _map_dirs(info, PathMap(config.path_map).to_client)


# --- configuration checks --------------------------------------------------------------------


def remote_problems(config: AgentConfig) -> list[str]:
    """What the types cannot say about an agent's remote keys, each under its key path."""
    problems: list[str] = []

    def need(ok: bool, key: str | tuple[str, ...], message: str) -> None:
        if not ok:
            keys = key if isinstance(key, tuple) else (key,)
            problems.append(f"{render_key_path(('agents', config.name, *keys))}: {message}")

    ssh, launcher = config.ssh, config.launcher
    need(ssh is None or launcher is None, "launcher", "set ssh or launcher, not both")
    if launcher is not None:
        need(bool(launcher) and launcher[0] != "", "launcher", "must start with a command")
    if ssh is not None:
        need(_HOST.fullmatch(ssh.host) is not None, ("ssh", "host"), "expected a host name")
        need(ssh.port is None or 0 < ssh.port < 65536, ("ssh", "port"), "must be 1 to 65535")
        need(
            ssh.user is None or _HOST.fullmatch(ssh.user) is not None,
            ("ssh", "user"),
            "expected a user name",
        )
        need(ssh.identity != "", ("ssh", "identity"), "must not be empty")
        for name, value in ssh.options.items():
            owned = _OWNED_OPTIONS.get(name.lower())
            key = ("ssh", "options", name)
            need(owned is None, key, f"not allowed: {owned}")
            need(_OPTION_NAME.fullmatch(name) is not None, key, "not an ssh option name")
            need(not any(c in value for c in "\r\n\x00"), key, "must be one line")
    if is_remote(config):
        need("=" not in config.command, "command", "must not contain '=' for a remote agent")
        for name in config.env:
            need(_ENV_NAME.fullmatch(name) is not None, "env", f"invalid variable name {name!r}")
    else:
        need(not config.client_fs, "client_fs", "only for a remote agent (ssh or launcher)")
        need(not config.path_map, "path_map", "only for a remote agent (ssh or launcher)")
    remotes = list(config.path_map.values())
    for client, remote in config.path_map.items():
        need(client.startswith("/"), "path_map", f"{client!r}: expected an absolute path")
        need(remote.startswith("/"), "path_map", f"{remote!r}: expected an absolute path")
    dupes = {_norm(r) for r in remotes if [_norm(x) for x in remotes].count(_norm(r)) > 1}
    need(not dupes, "path_map", f"two client paths map to {sorted(dupes)}: ambiguous way back")
    return problems
