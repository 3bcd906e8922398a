"""
Remote agents: the argv (pure), the bridge's handling of a remote agent's files, and real runs
through OpenSSH (a throwaway ``sshd`` on a loopback port) and stand-in ``kubectl``/``docker``.

The ssh tests need Debian's ``openssh-server`` (``./scripts/test`` installs it when it runs as
root with apt-get); without it they are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.agents.process import make_in_process_launcher, make_subprocess_launcher
from acp_bridge.config import remote
from acp_bridge.config.model import (
    AgentConfig,
    BridgeConfig,
    Config,
    ConfigError,
    SshConfig,
    parse_config,
)
from acp_bridge.engine import offers as offers_mod
from acp_bridge.engine.bridge import Bridge
from acp_bridge.engine.links import AgentState
from acp_bridge.faces.status import format_status
from acp_bridge.faces.stream import serve_client_stream
from tests.support.fakes import FakeAgent, TestClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

DEMO = [sys.executable, "-m", "acp_bridge", "demo-agent"]
SHELLS = [s for s in ("sh", "bash", "zsh") if shutil.which(s)]
#: what an end-to-end test may take at most (each is a few ssh logins)
E2E_TIMEOUT = 30
#: a prompt running when its ssh connection drops is answered within this long (the issue's bound)
DROP_ANSWER_BOUND = 2.0

# Arbitrary argument strings: anything an argv can hold (no NUL, no lone surrogates).
ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
ENV_NAME = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00="), min_size=1
).map(lambda s: "ACPT_" + s)
NASTY = ["two words", "it's", 'say "hi"', "$HOME", "${PATH}", "`id`", "$(id)", "a\\b", "*", "-x"]
NASTY += ["line\nbreak", "tab\there", "", " ", "~", "!event", "a;b", "a|b", "é ü", "--", "="]

_PRINT_ARGV_ENV = (
    "import json, os, sys; "
    "sys.stdout.write(json.dumps([os.getcwd(), sys.argv[1:], dict(os.environ)]))"
)


def agent(name: str = "r", **kwargs: Any) -> AgentConfig:
    kwargs.setdefault("command", "agent")
    return AgentConfig(name=name, **kwargs)


# --- the remote command line: quoted exactly once ----------------------------------------------


def run_line(shell: str, line: str) -> tuple[str, list[str], dict[str, str]]:
    """Run a remote command line the way sshd does (``$SHELL -c LINE``): its cwd, argv, env."""
    out = subprocess.run([shell, "-c", line], capture_output=True, check=True, timeout=30).stdout
    cwd, argv, env = orjson.loads(out)
    return cwd, argv, env


@pytest.mark.parametrize("shell", SHELLS)
def test_nasty_arguments_and_env_survive_the_remote_shell(shell):
    env = {"ACPT_VALUE": "a b 'c' \"d\" $HOME `id` \\n", "ACPT_EMPTY": ""}
    line = remote.remote_command(sys.executable, ["-c", _PRINT_ARGV_ENV, *NASTY], env)
    _, argv, got = run_line(shell, line)
    assert argv == NASTY
    assert {k: got[k] for k in env} == env


@settings(max_examples=40, deadline=None)
@given(args=st.lists(ARG, max_size=5), env=st.dictionaries(ENV_NAME, ARG, max_size=3))
def test_any_arguments_and_env_survive_the_remote_shell(args, env):
    line = remote.remote_command(sys.executable, ["-c", _PRINT_ARGV_ENV, *args], env)
    _, argv, got = run_line("sh", line)
    assert argv == args
    assert {k: got.get(k) for k in env} == env


def test_the_remote_command_runs_in_cwd(tmp_path):
    odd = tmp_path / "it's a $dir"
    odd.mkdir()
    line = remote.remote_command(sys.executable, ["-c", _PRINT_ARGV_ENV], {}, str(odd))
    cwd, _, _ = run_line("sh", line)
    assert cwd == str(odd)


def test_the_remote_command_execs_the_agent_through_env():
    """No shell stays between sshd and the agent (its stdin EOF is the agent's)."""
    line = remote.remote_command("agent", ["a b"], {"K": "v w"})
    assert line == "exec env -- 'K=v w' agent 'a b'"
    assert remote.remote_command("-odd", [], {}) == "exec env -- -odd"


# --- the ssh argv ------------------------------------------------------------------------------


def test_ssh_argv_batch_mode_no_tty_keepalives_and_the_host_after_double_dash():
    ssh = SshConfig(host="build.example", port=2222, user="me", identity="/k/id")
    argv = remote.agent_argv(agent(ssh=ssh, args=("demo-agent",), start_timeout=7.5))
    assert argv is not None
    assert argv[:6] == ["ssh", "-T", "-e", "none", "-o", "BatchMode=yes"]
    assert argv[6:12] == ["-p", "2222", "-l", "me", "-i", "/k/id"]
    options = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert {"ConnectTimeout=8", "ServerAliveInterval=15", "ServerAliveCountMax=3"} <= set(options)
    assert {"ForwardAgent=no", "ForwardX11=no", "IdentitiesOnly=yes"} <= set(options)
    assert argv[-3:] == ["--", "build.example", "exec env -- agent demo-agent"]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_ssh_takes_the_configured_options_over_the_defaults_but_never_over_batch_mode():
    """What ssh itself makes of the argv (``ssh -G`` evaluates it without connecting)."""
    ssh = SshConfig(host="h.example", user="u", options={"ServerAliveInterval": "5"})
    argv = remote.agent_argv(agent(ssh=ssh))
    assert argv is not None
    evaluated = subprocess.run(
        ["ssh", "-G", "-F", "none", *argv[1:]], capture_output=True, text=True, check=True
    ).stdout
    settings_ = dict(line.split(" ", 1) for line in evaluated.splitlines() if " " in line)
    assert settings_["hostname"] == "h.example"
    assert settings_["user"] == "u"
    assert settings_["batchmode"] == "yes"
    assert settings_["requesttty"] == "false"
    assert settings_["escapechar"] == "none"
    assert settings_["serveraliveinterval"] == "5"
    assert settings_["serveralivecountmax"] == "3"
    assert settings_["forwardagent"] == "no"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_a_forward_to_the_bridge_is_a_reverse_forward_that_must_succeed():
    """The remote's loopback port to the bridge's; ExitOnForwardFailure=yes over the config's."""
    ssh = SshConfig(host="h.example", options={"ExitOnForwardFailure": "no"})
    forwarded = remote.forward_to_bridge(ssh, 40001, 35000)
    assert forwarded.options == ssh.options
    assert forwarded.host == "h.example"
    argv = remote.agent_argv(agent(ssh=forwarded))
    assert argv is not None
    assert argv[argv.index("-R") + 1] == "127.0.0.1:40001:127.0.0.1:35000"
    assert "-R" not in (remote.agent_argv(agent(ssh=ssh)) or [])
    evaluated = subprocess.run(
        ["ssh", "-G", "-F", "none", *argv[1:]], capture_output=True, text=True, check=True
    ).stdout
    settings_ = dict(line.split(" ", 1) for line in evaluated.splitlines() if " " in line)
    assert settings_["remoteforward"] == "[127.0.0.1]:40001 [127.0.0.1]:35000"
    assert settings_["exitonforwardfailure"] == "yes"


def test_launcher_argv_is_the_prefix_then_env_then_the_command():
    kube = agent(launcher=("kubectl", "exec", "-i", "pod/agent-0", "--"), args=("x y",))
    assert remote.agent_argv(kube) == ["kubectl", "exec", "-i", "pod/agent-0", "--", "agent", "x y"]
    docker = agent(launcher=("docker", "exec", "-i", "box"), env={"K": "v w"})
    assert remote.agent_argv(docker) == [
        "docker",
        "exec",
        "-i",
        "box",
        "env",
        "--",
        "K=v w",
        "agent",
    ]
    assert remote.agent_argv(agent()) is None


def test_location_names_where_an_agent_runs():
    assert remote.location(agent()) == "local"
    assert remote.location(agent(ssh=SshConfig(host="h"))) == "ssh h"
    assert remote.location(agent(ssh=SshConfig(host="::1", port=22, user="u"))) == "ssh u@[::1]:22"
    kube = agent(launcher=("kubectl", "exec", "-i", "pod/a b", "--"))
    assert remote.location(kube) == "kubectl exec -i 'pod/a b' --"


def test_ssh_exit_255_is_explained_with_the_host_and_sshs_last_words():
    ssh = agent(ssh=SshConfig(host="h", port=2))
    tail = ["", "ssh: connect to host h port 2: Connection refused", "  "]
    assert remote.start_failure(ssh, 255, tail) == (
        ": ssh could not reach h:2: ssh: connect to host h port 2: Connection refused"
    )
    assert remote.start_failure(ssh, 1, tail) == ""  # the agent's own status
    assert remote.start_failure(agent(), 255, tail) == ""
    assert remote.death_reason(ssh, 255) == "lost its ssh connection to h:2"
    assert remote.death_reason(ssh, 0) == "exited"


# --- files: capabilities and path_map ----------------------------------------------------------

CAPS = {"fs": {"readTextFile": True}, "terminal": True, "elicitation": {}}


def test_a_remote_agent_is_not_offered_the_clients_files_unless_client_fs():
    assert remote.offered_capabilities(agent(), CAPS) == CAPS
    kube = agent(launcher=("kubectl",))
    assert remote.offered_capabilities(kube, CAPS) == {"elicitation": {}}
    assert not remote.may_call_client(kube, "fs/read_text_file")
    assert not remote.may_call_client(kube, "terminal/create")
    assert remote.may_call_client(kube, "session/request_permission")
    shared = agent(ssh=SshConfig(host="h"), client_fs=True)
    assert remote.offered_capabilities(shared, CAPS) == CAPS
    assert remote.may_call_client(shared, "fs/read_text_file")


def test_path_map_takes_the_longest_prefix_on_component_boundaries():
    paths = remote.PathMap({"/home/me": "/srv/me", "/home/me/big": "/data/big", "/": "/mnt/c"})
    assert paths.to_remote("/home/me") == "/srv/me"
    assert paths.to_remote("/home/me/p/x.py") == "/srv/me/p/x.py"
    assert paths.to_remote("/home/me/big/y") == "/data/big/y"
    assert paths.to_remote("/home/meat") == "/mnt/c/home/meat"  # not under /home/me
    assert paths.to_remote("/home/me/../you") == "/mnt/c/home/you"  # folded first
    assert paths.to_client("/data/big/y") == "/home/me/big/y"
    assert paths.to_client("/mnt/c/etc/passwd") == "/etc/passwd"
    # Folded out of every prefix: as it came (containment folds it again, and refuses it).
    assert paths.to_client("/srv/me/../../etc/passwd") == "/srv/me/../../etc/passwd"
    assert paths.to_client("relative") == "relative"
    narrow = remote.PathMap({"/a": "/b"})
    assert narrow.to_client("/elsewhere/x") == "/elsewhere/x"  # under no prefix: as it came


@given(rest=st.lists(st.sampled_from(["x", "y z", "..", ".", "é", "q'"]), max_size=6))
def test_path_map_round_trips_paths_under_a_prefix(rest):
    paths = remote.PathMap({"/client/proj": "/remote/work"})
    path = "/client/proj/" + "/".join(rest)
    there = paths.to_remote(path)
    if os.path.normpath(path).startswith("/client/proj"):
        assert there.startswith("/remote/work")
        assert paths.to_client(there) == os.path.normpath(path)


def test_map_to_agent_rewrites_session_directories_only():
    kube = agent(launcher=("k",), path_map={"/c": "/r"})
    params: dict[str, Any] = {"cwd": "/c/p", "additionalDirectories": ["/c/q", "/o"], "x": "/c"}
    remote.map_to_agent(kube, "session/new", params)
    assert params == {"cwd": "/r/p", "additionalDirectories": ["/r/q", "/o"], "x": "/c"}
    prompt: dict[str, Any] = {"cwd": "/c/p"}
    remote.map_to_agent(kube, "session/prompt", prompt)
    assert prompt == {"cwd": "/c/p"}


# --- configuration -----------------------------------------------------------------------------


def problems(table: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": {"r": {"command": "agent", **table}}})
    return list(info.value.problems)


def test_ssh_and_launcher_config_parse(tmp_path):
    config = parse_config(
        {
            "agents": {
                "box": {
                    "command": "claude-agent-acp",
                    "cwd": "work",
                    "ssh": {"host": "gpu1", "port": 2222, "identity": "~/id", "options": {}},
                    "path_map": {"/home/me/p": "/srv/p"},
                    "client_fs": True,
                },
                "pod": {"command": "a", "launcher": ["kubectl", "exec", "-i", "pod/x", "--"]},
            }
        },
        base_dir=str(tmp_path),
    )
    box = config.agents["box"]
    assert box.ssh == SshConfig(host="gpu1", port=2222, identity=os.path.expanduser("~/id"))
    assert box.cwd == "work"  # remote: not anchored here
    assert box.client_fs
    assert config.agents["pod"].launcher == ("kubectl", "exec", "-i", "pod/x", "--")


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (
            {"ssh": {"host": "h", "prot": 1}},
            "unknown key 'agents.r.ssh.prot' (did you mean 'port'?)",
        ),
        ({"ssh": {}}, "agents.r.ssh.host: required key missing"),
        ({"ssh": {"host": "-oProxyCommand=x"}}, "agents.r.ssh.host: expected a host name"),
        ({"ssh": {"host": "h", "port": 0}}, "agents.r.ssh.port: must be 1 to 65535"),
        (
            {"ssh": {"host": "h", "options": {"BatchMode": "no"}}},
            "agents.r.ssh.options.BatchMode: not allowed: the bridge sets BatchMode=yes: "
            "nothing can answer a prompt",
        ),
        (
            {"ssh": {"host": "h", "options": {"Port": "2"}}},
            "agents.r.ssh.options.Port: not allowed: use ssh.port",
        ),
        ({"ssh": {"host": "h", "options": {"A": 1}}}, "agents.r.ssh.options.A: expected a string"),
        ({"ssh": "h"}, "agents.r.ssh: expected a table"),
        ({"launcher": []}, "agents.r.launcher: must start with a command"),
        ({"launcher": "kubectl exec"}, "agents.r.launcher: expected an array of strings"),
        (
            {"launcher": ["k"], "ssh": {"host": "h"}},
            "agents.r.launcher: set ssh or launcher, not both",
        ),
        ({"client_fs": True}, "agents.r.client_fs: only for a remote agent (ssh or launcher)"),
        ({"client_fs": "yes"}, "agents.r.client_fs: expected true or false"),
        (
            {"path_map": {"/a": "/b"}},
            "agents.r.path_map: only for a remote agent (ssh or launcher)",
        ),
        (
            {"launcher": ["k"], "path_map": {"a": "/b"}},
            "agents.r.path_map: 'a': expected an absolute path",
        ),
        (
            {"launcher": ["k"], "path_map": {"/a": "/r", "/b": "/r/"}},
            "agents.r.path_map: two client paths map to ['/r']: ambiguous way back",
        ),
        (
            {"launcher": ["k"], "command": "A=b"},
            "agents.r.command: must not contain '=' for a remote agent",
        ),
    ],
)
def test_bad_remote_config_names_the_key(table, expected):
    assert expected in problems(table)


# --- the bridge with a remote agent (in-process fake agents) -----------------------------------


@contextlib.asynccontextmanager
async def open_bridge_with(
    config: Config, launcher: Any, *, initialize: bool = True, **caps: Any
) -> AsyncIterator[tuple[TestClient, Bridge]]:
    """A bridge on ``config`` with one client attached (initialized with ``caps`` if told)."""
    async with trio.open_nursery() as nursery:
        bridge: Bridge = await nursery.start(Bridge(config, launcher).run)
        client_side, bridge_side = trio.testing.memory_stream_pair()
        nursery.start_soon(
            functools.partial(serve_client_stream, bridge, bridge_side, bridge_side, linger=0)
        )
        client = TestClient(client_side)
        nursery.start_soon(client.read_loop)
        if initialize:
            await client.initialize(**caps)
        yield client, bridge
        nursery.cancel_scope.cancel()


def fake_config(**remote_keys: Any) -> Config:
    return Config(
        agents={"far": AgentConfig(name="far", command="a", start_timeout=5, **remote_keys)}
    )


async def test_a_remote_agent_gets_no_fs_or_terminal_and_its_calls_are_refused():
    fake = FakeAgent("far")
    config = fake_config(launcher=("kubectl", "exec", "-i", "pod/x", "--"))
    with trio.fail_after(10):
        async with open_bridge_with(config, make_in_process_launcher({"far": fake}), **CAPS) as (
            client,
            _,
        ):
            sid = await client.new_session()
            assert fake.client_capabilities == {"elicitation": {}}
            assert (await client.prompt(sid, "read /w/notes.txt"))["result"]
            (said,) = client.updates(sid)
    assert said.startswith("far:fs:{'code': -32601")
    assert "client_fs = false" in said
    assert not any(m.get("method") == "fs/read_text_file" for m in client.received)


@pytest.mark.parametrize("launcher", [None, ("kubectl", "exec", "-i", "pod/x", "--")])
async def test_an_agent_behind_a_launcher_is_not_offered_the_subagent_server(launcher):
    """A launcher's engine forwards no port to the bridge's loopback: no entry (a local is)."""
    fake = FakeAgent("far")
    config = fake_config(launcher=launcher)
    with trio.fail_after(10):
        async with open_bridge_with(config, make_in_process_launcher({"far": fake})) as (
            client,
            _,
        ):
            await client.new_session()
    (new,) = [m for m in fake.received if m.get("method") == "session/new"]
    names = [s.get("name") for s in new["params"]["mcpServers"]]
    assert names == ([] if launcher else ["acp-bridge"])


async def test_path_map_rewrites_session_dirs_and_maps_fs_paths_back_before_containment(tmp_path):
    here = tmp_path / "client proj"
    here.mkdir()
    (here / "notes.txt").write_text("hi")
    fake = FakeAgent("far")
    config = fake_config(
        ssh=SshConfig(host="h"), client_fs=True, path_map={str(here): "/remote/proj"}
    )
    launcher = make_in_process_launcher({"far": fake})
    with trio.fail_after(10):
        async with open_bridge_with(config, launcher, **CAPS) as (client, _):
            assert fake.client_capabilities == CAPS
            sid = await client.new_session(cwd=str(here), additionalDirectories=[])
            new = next(m for m in fake.received if m.get("method") == "session/new")
            assert new["params"]["cwd"] == "/remote/proj"

            async def serve_one_read() -> None:
                request = await client.agent_requests.receive()
                assert request["params"]["path"] == str(here / "notes.txt")
                await client.send(
                    {"jsonrpc": "2.0", "id": request["id"], "result": {"content": "hi"}}
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_one_read)
                await client.prompt(sid, "read /remote/proj/notes.txt")
            # Outside the mapped roots, or denied inside them: refused before the client sees it.
            await client.prompt(sid, "read /remote/elsewhere/x")
            await client.prompt(sid, "read /remote/proj/.env")
    fs_said = client.updates(sid)
    assert fs_said[0] == "far:fs:{'content': 'hi'}"
    assert "outside_roots" in fs_said[1]
    assert "denied" in fs_said[2]


async def test_agents_and_status_say_where_each_agent_runs():
    config = Config(
        agents={
            "here": AgentConfig(name="here", command="a"),
            "far": AgentConfig(name="far", command="a", ssh=SshConfig(host="gpu1", user="me")),
        }
    )
    launcher = make_in_process_launcher({"here": FakeAgent("here"), "far": FakeAgent("far")})
    with trio.fail_after(10):
        async with open_bridge_with(config, launcher) as (client, bridge):
            listed = await client.call("_acp_bridge/agents", {})
            status = bridge.status()
    where = {a["name"]: a["runsOn"] for a in listed["agents"]}
    assert where == {"here": "local", "far": "ssh me@gpu1"}
    text = format_status(status)
    assert any(
        line.strip().startswith("far") and line.endswith("on ssh me@gpu1")
        for line in text.splitlines()
    )


# --- a real sshd -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@attrs.frozen
class Sshd:
    proc: subprocess.Popen[bytes]
    port: int
    user: str
    identity: str
    other_identity: str
    known_hosts: str

    def ssh(self, **changes: Any) -> SshConfig:
        options = {"UserKnownHostsFile": self.known_hosts, "StrictHostKeyChecking": "yes"}
        base = SshConfig(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            identity=self.identity,
            options=options,
        )
        return attrs.evolve(base, **changes)

    def connection_children(self) -> list[int]:
        """The per-connection sshd processes: the listener's children."""
        return [pid for pid, ppid in _processes() if ppid == self.proc.pid]


def _processes() -> Iterator[tuple[int, int]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            yield int(entry), int(stat.rpartition(")")[2].split()[1])


def _keygen(path: pathlib.Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30
    )


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A throwaway sshd on 127.0.0.1 with generated host and user keys."""
    binary = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin")
    if binary is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip(
            "OpenSSH server or client missing (./scripts/test installs openssh-server "
            "when it runs as root with apt-get; else: apt-get install openssh-server)"
        )
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host", "user", "other"):
        _keygen(d / key)
    shutil.copy(d / "user.pub", d / "authorized_keys")
    port = _free_port()
    user = getpass.getuser()
    (d / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {d / 'host'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\n"
        "StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel INFO\n"
    )
    host_key = (d / "host.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    proc = subprocess.Popen(
        [binary, "-D", "-e", "-f", str(d / "sshd_config")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    listening = threading.Event()
    log: list[str] = []

    def drain() -> None:  # keeps reading, so sshd never blocks on a full pipe
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            log.append(line)
            if "Server listening" in line:
                listening.set()

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    if not listening.wait(15):
        proc.kill()
        proc.wait()
        drainer.join(10)
        assert proc.stderr is not None
        proc.stderr.close()
        reason = f"sshd did not start: {' | '.join(log[-5:])}"
        if os.geteuid() != 0:
            pytest.skip(reason + " (not root: sshd may need its privilege separation directory)")
        pytest.fail(reason)
    try:
        yield Sshd(
            proc=proc,
            port=port,
            user=user,
            identity=str(d / "user"),
            other_identity=str(d / "other"),
            known_hosts=str(d / "known_hosts"),
        )
    finally:
        proc.terminate()
        proc.wait(10)
        drainer.join(10)
        assert proc.stderr is not None
        proc.stderr.close()


def demo_over_ssh(ssh: SshConfig, *args: str, **bridge: Any) -> Config:
    agent_config = AgentConfig(
        name="far",
        command=DEMO[0],
        args=(*DEMO[1:], *args),
        env={"DEMO_NASTY": NASTY_VALUE},
        ssh=ssh,
        start_timeout=10,
    )
    return Config(agents={"far": agent_config}, bridge=BridgeConfig(**bridge))


NASTY_VALUE = 'two words, it\'s "quoted" and $HOME `id` \\ stays'


def said(client: TestClient, sid: str) -> str:
    return "".join(client.updates(sid))


async def test_a_session_and_a_prompt_over_ssh(sshd):
    config = demo_over_ssh(sshd.ssh(), "--chunk-delay", "0", "--name", NASTY_VALUE)
    with trio.fail_after(E2E_TIMEOUT):
        async with open_bridge_with(config, make_subprocess_launcher(stop_grace=2), **CAPS) as (
            client,
            _,
        ):
            sid = await client.new_session()
            assert (await client.prompt(sid, "env SSH_CONNECTION"))["result"]
            connection = said(client, sid)
            sid2 = await client.new_session()
            await client.prompt(sid2, "env DEMO_NASTY")
            sid3 = await client.new_session()
            await client.prompt(sid3, "read notes.txt")  # fs was not offered: it says so
            (far,) = (await client.call("_acp_bridge/agents", {}))["agents"]
    # SSH_CONNECTION is "client-ip client-port server-ip server-port": it ran behind sshd.
    assert connection.startswith("SSH_CONNECTION=127.0.0.1 ")
    assert connection.endswith(f" 127.0.0.1 {sshd.port}")
    assert said(client, sid2) == f"DEMO_NASTY={NASTY_VALUE}"
    assert far["agentInfo"]["name"] == NASTY_VALUE  # an argument, intact
    assert far["runsOn"] == f"ssh {sshd.user}@127.0.0.1:{sshd.port}"
    assert "fs" not in str(far.get("error", ""))
    assert not any(m.get("method") == "fs/read_text_file" for m in client.received)


async def test_a_dropped_connection_answers_the_prompt_and_the_next_session_reconnects(
    sshd, record_property
):
    config = demo_over_ssh(sshd.ssh(), "--chunk-delay", "0.05")
    with trio.fail_after(E2E_TIMEOUT):
        launcher = make_subprocess_launcher(stop_grace=2)
        async with open_bridge_with(config, launcher, initialize=False) as (client, bridge):
            first = time.monotonic()
            await client.initialize()  # starts the default agent: login, then initialize
            first_start = time.monotonic() - first
            sid = await client.new_session()
            far = bridge.hub.agents["far"]
            answer: dict[str, Any] = {}

            async def prompt() -> None:
                answer.update(await client.prompt(sid, "count 1000"))  # 50 s of chunks

            async with trio.open_nursery() as nursery:
                nursery.start_soon(prompt)
                await client.wait_for(
                    lambda m: (
                        m.get("method") == "session/update"
                        and m["params"]["update"].get("content", {}).get("text") == "1 "
                    )
                )
                (connection,) = sshd.connection_children()
                dropped = time.monotonic()
                os.kill(connection, signal.SIGKILL)
            answered = time.monotonic() - dropped
            assert far.state is AgentState.DEAD
            started = time.monotonic()
            sid2 = await client.new_session()
            reconnected = time.monotonic() - started
            await client.prompt(sid2, "env SSH_CONNECTION")
            restarts = far.starts
    assert answered < DROP_ANSWER_BOUND, f"answered after {answered:.3f}s"
    error = answer["error"]
    assert f"lost its ssh connection to {sshd.user}@127.0.0.1:{sshd.port}" in error["message"]
    assert restarts == 2
    assert said(client, sid2).endswith(f" 127.0.0.1 {sshd.port}")
    # The figures docs/remote.md quotes (see `-rP` or the junit properties).
    record_property("first_start_s", round(first_start, 3))
    record_property("drop_answered_s", round(answered, 3))
    record_property("reconnect_s", round(reconnected, 3))
    print(
        f"remote timings: first start {first_start:.3f}s; "
        f"prompt answered {answered:.3f}s after the drop; "
        f"session/new over a new connection {reconnected:.3f}s (backoff 0.5s included)"
    )


async def test_a_silent_connection_is_found_dead_by_the_keepalives(sshd, record_property):
    """
    The sshd serving the agent stops answering (SIGSTOP: no FIN, no RST, as a dead link):
    ssh's keepalives give up after interval * count, and the prompt is answered.
    """
    keepalive = {"ServerAliveInterval": "1", "ServerAliveCountMax": "2"}
    ssh = sshd.ssh(options={**sshd.ssh().options, **keepalive})
    config = demo_over_ssh(ssh, "--chunk-delay", "0.05")
    stopped: list[int] = []
    try:
        with trio.fail_after(E2E_TIMEOUT):
            async with open_bridge_with(config, make_subprocess_launcher(stop_grace=2)) as (
                client,
                _,
            ):
                sid = await client.new_session()
                answer: dict[str, Any] = {}

                async def prompt() -> None:
                    answer.update(await client.prompt(sid, "count 1000"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(prompt)
                    await client.wait_for(lambda m: m.get("method") == "session/update")
                    (connection,) = sshd.connection_children()
                    os.kill(connection, signal.SIGSTOP)
                    stopped.append(connection)
                    silent = time.monotonic()
                found = time.monotonic() - silent
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGKILL)
    # 1 s apart, 2 unanswered: ssh gives up after 2 to 3 s.
    assert 1.5 < found < 6, f"found dead after {found:.3f}s"
    assert "lost its ssh connection" in answer["error"]["message"]
    record_property("silent_drop_found_s", round(found, 3))
    print(f"remote timings: a silent connection found dead after {found:.3f}s (keepalive 1 s x 2)")


@pytest.mark.parametrize("fault", ["wrong port", "refused key"])
async def test_an_ssh_that_cannot_connect_is_a_start_error_naming_the_host(sshd, fault):
    """The client's initialize starts the default agent: it gets the error, with ssh's words."""
    if fault == "wrong port":
        ssh, expected = sshd.ssh(port=_free_port()), "Connection refused"
    else:
        ssh, expected = sshd.ssh(identity=sshd.other_identity), "Permission denied (publickey)"
    config = demo_over_ssh(ssh)
    started = time.monotonic()
    with trio.fail_after(E2E_TIMEOUT):
        launcher = make_subprocess_launcher(stop_grace=2)
        async with open_bridge_with(config, launcher, initialize=False) as (client, bridge):
            response = await client.request(
                "initialize", {"protocolVersion": 1, "clientCapabilities": {}}
            )
            elapsed = time.monotonic() - started
            again = await client.request(
                "initialize", {"protocolVersion": 1, "clientCapabilities": {}}
            )
            state = bridge.hub.agents["far"].state
    assert elapsed < config.agents["far"].start_timeout
    error = response["error"]
    assert f"ssh could not reach {sshd.user}@127.0.0.1:{ssh.port}: " in error["message"]
    assert expected in error["message"]
    assert error["data"]["exitStatus"] == 255
    assert any(expected in line for line in error["data"]["stderrTail"])
    # Still a start error on the next try (a restart, with the same explanation).
    assert "ssh could not reach" in again["error"]["message"]
    assert state is AgentState.DEAD


def far_and_near(ssh: SshConfig) -> Config:
    """``far``: the demo agent over ssh (the default); ``near``: a local one, for its children."""
    config = demo_over_ssh(ssh, "--chunk-delay", "0")
    near = AgentConfig(name="near", command=DEMO[0], args=(*DEMO[1:], "--chunk-delay", "0"))
    return attrs.evolve(config, agents={**config.agents, "near": near})


async def test_a_remote_agent_delegates_through_a_forwarded_port_to_a_local_child(sshd):
    """
    The far agent's session is offered the http entry on its own loopback, a port its ssh
    connection forwards to the MCP listener (a different one: the "remote" host is this one);
    its ``delegate`` spawns a child on the local agent and streams the child's text back.
    """
    with trio.fail_after(E2E_TIMEOUT):
        launcher = make_subprocess_launcher(stop_grace=2)
        async with open_bridge_with(far_and_near(sshd.ssh()), launcher) as (client, bridge):
            sid = await client.new_session()
            answer = await client.prompt(sid, "delegate near: count 3")
            endpoint = bridge.subagents.endpoint
            listener, forwarded = endpoint.port, dict(endpoint.forwarded)
    assert answer["result"]["stopReason"] == "end_turn"
    text = said(client, sid)
    assert re.search(r"\[near \([^)]+\): 1 2 3\] \(end_turn\)", text), text
    assert set(forwarded) == {"far"}
    assert forwarded["far"] in offers_mod.REMOTE_PORTS
    assert forwarded["far"] != listener


async def test_a_taken_remote_port_is_a_start_error_naming_the_host(sshd, monkeypatch):
    """ExitOnForwardFailure: ssh exits 255 when the remote port is taken, a start error."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(offers_mod, "REMOTE_PORTS", range(port, port + 1))
        with trio.fail_after(E2E_TIMEOUT):
            launcher = make_subprocess_launcher(stop_grace=2)
            config = far_and_near(sshd.ssh())
            async with open_bridge_with(config, launcher, initialize=False) as (client, _):
                response = await client.request(
                    "initialize", {"protocolVersion": 1, "clientCapabilities": {}}
                )
    error = response["error"]
    assert f"ssh could not reach {sshd.user}@127.0.0.1:{sshd.port}: " in error["message"]
    assert error["data"]["exitStatus"] == 255
    assert any(f"port {port}" in line for line in error["data"]["stderrTail"]), error


# --- launchers: stand-in kubectl and docker ----------------------------------------------------


def stand_in(bin_dir: pathlib.Path, name: str, skip_to_command: str) -> pathlib.Path:
    """An executable ``name`` that records its argv (NUL-separated) and runs the agent."""
    record = bin_dir / f"{name}.argv"
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'printf \'%s\\0\' "$(basename "$0")" "$@" > {shlex.quote(str(record))}\n'
        f"{skip_to_command}\n"
        'exec "$@"\n'
    )
    script.chmod(0o755)
    return record


#: kubectl exec [flags] POD -- COMMAND ARGS: everything after the first "--"
KUBECTL_SKIP = 'while [ "$#" -gt 0 ]; do a=$1; shift; [ "$a" = "--" ] && break; done'
#: docker exec [flags] CONTAINER COMMAND ARGS (the flags with a value: -e -w -u)
DOCKER_SKIP = (
    "shift\n"  # exec
    'while case "$1" in -e|-w|-u) shift 2;; -*) shift;; *) false;; esac; do :; done\n'
    "shift"  # the container
)


@pytest.mark.parametrize(
    ("engine", "launcher", "skip"),
    [
        ("kubectl", ["kubectl", "exec", "-i", "pod/agent-0", "-c", "agent", "--"], KUBECTL_SKIP),
        ("docker", ["docker", "exec", "-i", "-w", "/", "agent-box"], DOCKER_SKIP),
    ],
    ids=["kubectl", "docker"],
)
async def test_a_launcher_runs_the_agent_behind_the_engines_argv(
    tmp_path, monkeypatch, engine, launcher, skip
):
    record = stand_in(tmp_path, engine, skip)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    far = AgentConfig(
        name="far",
        command=DEMO[0],
        args=(*DEMO[1:], "--chunk-delay", "0", "--name", NASTY_VALUE),
        env={"DEMO_NASTY": NASTY_VALUE},
        launcher=tuple(launcher),
        start_timeout=10,
    )
    config = Config(agents={"far": far})
    with trio.fail_after(E2E_TIMEOUT):
        async with open_bridge_with(config, make_subprocess_launcher(stop_grace=2), **CAPS) as (
            client,
            _,
        ):
            sid = await client.new_session()
            await client.prompt(sid, "env DEMO_NASTY")
            (listed,) = (await client.call("_acp_bridge/agents", {}))["agents"]
    argv = record.read_bytes().decode().split("\0")[:-1]
    assert argv == [
        *launcher,
        "env",
        "--",
        f"DEMO_NASTY={NASTY_VALUE}",
        *DEMO,
        "--chunk-delay",
        "0",
        "--name",
        NASTY_VALUE,
    ]
    assert said(client, sid) == f"DEMO_NASTY={NASTY_VALUE}"
    assert listed["agentInfo"]["name"] == NASTY_VALUE
    assert listed["runsOn"] == shlex.join(launcher)
