"""
``acp-bridge stdio`` before its imports: stdout claimed, the default agent spawned.

The bridge answers ``initialize`` once its default agent has, and importing the configuration
code, trio and the bridge takes longer than most agents need to start. So ``acp-bridge
stdio`` reads just what spawning the default agent takes from its arguments and its TOML file
(:func:`prespawn`: the standard library only, no attrs, no cattrs, no trio) and spawns it at
once; the agent starts while the bridge imports. Once the configuration is loaded for real,
:meth:`Prespawned.confirm` checks that the process is what the launcher would have started
from it (the same argv, environment and cwd), and the supervisor's launcher adopts it for the
agent's first launch (``agents.process.make_subprocess_launcher``); later launches spawn as usual.
Should the quick reading and the real one disagree, the early process is stopped and the
agent is launched the usual way: the quick reading can cost time, never behaviour.

Then, while the imports run in a thread, ``faces.early`` may give it the client's ``initialize``
and answer the client (:attr:`Prespawned.initialized` carries its result to the launch,
which skips the handshake, and :attr:`Prespawned.stdout_rest` what was read of its stdout
besides the answer); an ``initialize`` that went wrong there stops it
(:meth:`Prespawned.abandon`) and the usual launch starts the agent anew.

The process is spawned as the launcher spawns one: three pipes, a session (process group) of
its own. A spawn that fails is kept and raised at adoption, with the launcher's own message.
An agent never adopted (no ``initialize`` came, the bridge failed to start) is stopped by
:meth:`Prespawned.discard` as the bridge exits. Spawned early: local agents only; an ssh
agent (its argv may carry a port forward to the bridge's MCP listener, which does not exist
yet) and a launcher agent start the usual way, and so does every agent where
``os.pidfd_open`` is missing (the adopted process is waited for through a pidfd).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from acp_bridge.config.model import AgentConfig, Config

#: Stopping a pre-spawned agent that was never adopted (the bridge's default ``stop_grace``
#: until the configuration says otherwise).
DEFAULT_GRACE = 2.0


def claim_stdout() -> int:
    """Take fd 1 for the protocol; point fd 1 (and ``sys.stdout``) at stderr. Returns the fd."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    return protocol_fd


class Spawn(NamedTuple):
    """What an agent process is started with."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None


def _local(
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    base_dir: str | None = None,
) -> Spawn:
    argv = [command, *args]
    if command == "acp-bridge" and shutil.which("acp-bridge") is None:
        # This very installation, when it is not on PATH (a venv that is not activated).
        argv = [sys.executable, "-m", "acp_bridge", *args]
    if cwd is not None and base_dir is not None and not os.path.isabs(cwd):
        cwd = os.path.join(base_dir, cwd)
    return Spawn(argv, {**os.environ, **env}, cwd)


def resolve_command(config: AgentConfig) -> list[str]:
    """
    The argv to run for an agent.

    ``acp-bridge`` as a command means this very installation: when it is not on PATH (a venv
    that is not activated), it runs as ``python -m acp_bridge`` with this interpreter. A
    remote agent's argv is the engine's (``ssh ...``, the launcher prefix) with its command
    as configured: the other machine has its own installation.
    """
    return spawn_settings(config).argv


def spawn_settings(config: AgentConfig, base_dir: str | None = None) -> Spawn:
    """An agent process's argv, environment and cwd (``base_dir`` anchors a relative cwd)."""
    if config.ssh is None and config.launcher is None:
        return _local(config.command, config.args, config.env, config.cwd, base_dir)
    from acp_bridge.config import remote  # (loaded with the configuration anyway)

    argv = remote.agent_argv(config)
    assert argv is not None
    # A remote agent's env is set on the far side; an ssh agent's cwd is the remote's.
    cwd = config.cwd if config.ssh is None else None
    if cwd is not None and base_dir is not None and not os.path.isabs(cwd):
        cwd = os.path.join(base_dir, cwd)
    return Spawn(argv, dict(os.environ), cwd)


def start_error(name: str, argv: list[str], exc: OSError) -> str:
    """What a failed spawn is reported as (at ``initialize``, or the session's request)."""
    return f"cannot start agent {name!r}: {shlex.join(argv)}: {exc.strerror or exc}"


def can_adopt() -> bool:
    """A spawned process can be waited for through a pidfd here (Linux 5.3 and later)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


class Prespawned:
    """
    The default agent's process, spawned before the imports, until the launcher adopts it.

    Either ``popen`` is set (with the parent's ends of its pipes, and a pidfd), or ``error``
    (the spawn failed). :meth:`confirm` ties it to the loaded configuration of its agent;
    :meth:`take` hands it over once; :meth:`discard` stops it if nobody took it.
    """

    def __init__(
        self,
        name: str,
        spawn: Spawn,
        *,
        popen: subprocess.Popen[bytes] | None = None,
        fds: tuple[int, int, int, int] | None = None,
        error: str | None = None,
    ) -> None:
        self.name = name
        self.spawn = spawn
        self.popen = popen
        #: the parent's ends: the agent's stdin (write), stdout, stderr (read); its pidfd
        self.fds = fds
        self.error = error
        #: the agent's loaded configuration, once :meth:`confirm` found it matches
        self.config: AgentConfig | None = None
        self.grace = DEFAULT_GRACE
        self.taken = False
        #: its ``initialize`` result, when ``faces.early`` initialized it (the launch skips the
        #: handshake), and what that read of its stdout besides the answer (its reader's first)
        self.initialized: dict[str, Any] | None = None
        self.stdout_rest = b""
        #: when ``faces.early`` sent it an ``initialize`` (``time.monotonic()``) that it did not
        #: answer as the early answer needs (an error, oddly, not in time, or it exited): the
        #: launch's handshake waits for that one's answer in what is left of its
        #: ``start_timeout``, instead of a second agent and a second ``initialize``
        self.initialize_sent: float | None = None

    def matches(self, config: Config) -> AgentConfig | None:
        """
        The configuration's default agent if it is the one spawned (its name, argv,
        environment and cwd as the launcher would have them), else None.
        """
        from acp_bridge.config.model import ConfigError  # (loaded already: the config is read)

        try:
            agent = config.default_agent
        except ConfigError:  # (no agents: the bridge reports it as it starts)
            return None
        if agent.name != self.name or spawn_settings(agent) != self.spawn:
            return None
        return agent

    def confirm(self, config: Config) -> bool:
        """Keep it if it is the configuration's default agent (:meth:`matches`); else stop it."""
        self.grace = config.bridge.stop_grace
        agent = self.matches(config)
        if agent is None:
            self.discard()
            return False
        self.config = agent
        return True

    def take(self, config: AgentConfig) -> Prespawned | None:
        """
        Itself, for the first launch of the agent it was confirmed as (``config`` equal to
        that one's); None afterwards, or for another agent. A first launch with another
        config (not expected: only ssh agents are launched with a changed one, and they are
        not pre-spawned) stops it and launches as usual.
        """
        if self.taken or self.config is None or config.name != self.name:
            return None
        self.taken = True
        if config != self.config:
            self._stop(0.0)
            return None
        return self

    def abandon(self) -> None:
        """
        Stop it at once (SIGTERM, SIGKILL to its group) and let the usual launch start the
        agent: ``faces.early`` gave it an ``initialize`` and then found that the configuration
        does not take it (another default agent, ``experimental_v2``, a failed load).
        """
        self.taken = True
        self._stop(0.0)

    def discard(self) -> None:
        """Stop it unless it was taken (stdin EOF, ``grace``, SIGTERM, ``grace``, SIGKILL)."""
        if not self.taken:
            self.taken = True
            self._stop(self.grace)

    def _stop(self, grace: float) -> None:
        popen = self.popen
        if popen is None:
            return
        assert self.fds is not None
        stdin, *rest = self.fds
        os.close(stdin)
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, sig)
            try:
                popen.wait(None if sig is signal.SIGKILL else grace)
                break
            except subprocess.TimeoutExpired:
                continue
        # Its children go with it (they may hold the pipes).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        for fd in rest:
            if fd >= 0:
                os.close(fd)
        self.popen = None


def _early_agent(config_path: str | None, specs: Sequence[str]) -> tuple[str, Spawn] | None:
    """
    The default agent's name and spawn settings, read quickly; None when that takes more
    than a plain reading (an ssh or launcher agent, anything unexpected: the real loading
    judges it).
    """
    if specs:  # (the first --agent is the default, with or without --config)
        name, eq, line = specs[0].partition("=")
        try:
            argv = shlex.split(line)
        except ValueError:
            return None
        if not (eq and name and argv):
            return None
        return name, _local(argv[0], argv[1:], {}, None)
    if config_path is None:
        return None
    import tomllib

    try:
        with open(config_path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):  # (TOMLDecodeError, UnicodeDecodeError are ValueErrors)
        return None
    agents = data.get("agents")
    bridge = data.get("bridge", {})
    if not isinstance(agents, dict) or not agents or not isinstance(bridge, dict):
        return None
    name = bridge.get("default_agent", next(iter(agents)))
    agent = agents.get(name) if isinstance(name, str) else None
    if not isinstance(agent, dict) or "ssh" in agent or "launcher" in agent:
        return None
    command = agent.get("command")
    args = agent.get("args", [])
    env = agent.get("env", {})
    cwd = agent.get("cwd")
    if not (
        isinstance(command, str)
        and isinstance(args, list)
        and all(isinstance(a, str) for a in args)
        and isinstance(env, dict)
        and all(isinstance(v, str) for v in env.values())
        and (cwd is None or isinstance(cwd, str))
    ):
        return None
    if cwd is not None:  # (as the configuration resolves it: ~, then the file's directory)
        cwd = os.path.join(os.path.dirname(os.path.abspath(config_path)), os.path.expanduser(cwd))
    return name, _local(command, args, env, cwd)


def prespawn(config_path: str | None, specs: Sequence[str]) -> Prespawned | None:
    """
    Spawn the default agent of ``--config config_path`` / ``--agent specs`` the way the
    launcher would; None when it is not spawned early. A failed spawn is kept, not raised.
    """
    early = _early_agent(config_path, specs)
    if early is None or not can_adopt():
        return None
    name, spawn = early
    # The parent's ends are not inherited (os.pipe is close-on-exec): the agent's stdin sees
    # EOF when the bridge exits, however it exits.
    pipes: list[int] = []
    try:
        for _ in range(3):
            pipes += os.pipe()
    except OSError:  # (out of descriptors: the usual launch will say so)
        for fd in pipes:
            os.close(fd)
        return None
    stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = pipes
    try:
        popen = subprocess.Popen(
            spawn.argv,
            stdin=stdin_r,
            stdout=stdout_w,
            stderr=stderr_w,
            env=spawn.env,
            cwd=spawn.cwd,
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        for fd in (stdin_w, stdout_r, stderr_r):
            os.close(fd)
        if isinstance(exc, ValueError):  # (a NUL in a word: the usual launch reports it)
            return None
        return Prespawned(name, spawn, error=start_error(name, spawn.argv, exc))
    finally:
        for fd in (stdin_r, stdout_w, stderr_w):  # (the agent's ends: it has its copies)
            os.close(fd)
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:
        # (can_adopt said yes: not expected) the usual launch will start another one.
        Prespawned(name, spawn, popen=popen, fds=(stdin_w, stdout_r, stderr_r, -1)).discard()
        return None
    return Prespawned(name, spawn, popen=popen, fds=(stdin_w, stdout_r, stderr_r, pidfd))


__all__ = [
    "Prespawned",
    "Spawn",
    "can_adopt",
    "claim_stdout",
    "prespawn",
    "resolve_command",
    "spawn_settings",
    "start_error",
]
