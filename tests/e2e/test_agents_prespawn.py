"""
The tests of ``tests/agents/test_prespawn.py`` that start other processes (kept here so that
``pytest tests/agents`` runs in-process only).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys

import attrs
import pytest
import trio

from acp_bridge.agents.prespawn import Prespawned, _early_agent, prespawn
from acp_bridge.agents.process import AgentStartError, AgentTransport, make_subprocess_launcher
from acp_bridge.config.model import AgentConfig, config_from_agent_specs

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open here")


def _early(specs: list[str], *, grace: float | None = None) -> tuple[Prespawned, AgentConfig]:
    """Spawn ``specs``' default agent early, confirmed against their configuration."""
    config = config_from_agent_specs(specs)
    if grace is not None:
        config = attrs.evolve(config, bridge=attrs.evolve(config.bridge, stop_grace=grace))
    spawned = prespawn(None, specs)
    assert spawned is not None
    assert spawned.confirm(config)
    return spawned, config.default_agent


async def test_the_launcher_adopts_the_early_process_and_kills_its_group():
    """The first launch is the early process (its pipes, its pid); a kill is its group's."""
    spawned, agent = _early(["cat=cat"])
    assert spawned.popen is not None
    pid = spawned.popen.pid
    launcher = make_subprocess_launcher(adopt=spawned)
    statuses: list[int | None] = []

    async def launch(*, task_status: trio.TaskStatus[AgentTransport]) -> None:
        statuses.append(await launcher(agent, task_status=task_status))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            transport: AgentTransport = await nursery.start(launch)
            assert transport.pid == pid
            await transport.send.send_all(b"ping\n")
            assert await transport.receive.receive_some() == b"ping\n"
            assert transport.kill is not None
            transport.kill()
        assert statuses == [-signal.SIGKILL]
        # The next launch spawns a process of its own.
        async with trio.open_nursery() as nursery:
            transport = await nursery.start(launch)
            assert transport.pid != pid
            nursery.cancel_scope.cancel()


async def test_a_stopped_adopted_agent_gets_end_of_input_and_is_reaped():
    spawned, agent = _early(["cat=cat"])
    popen = spawned.popen
    assert popen is not None
    launcher = make_subprocess_launcher(adopt=spawned, stop_grace=5)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(launcher, agent)
            nursery.cancel_scope.cancel()
    assert popen.returncode == 0  # (cat ended at its stdin's end, and was reaped)


async def test_a_failed_early_spawn_is_the_launchers_own_error():
    """The first launch reports the early spawn's failure; the next, its own: the same."""
    specs = ["x=/nonexistent/agent --x"]
    spawned = prespawn(None, specs)
    assert spawned is not None
    assert spawned.popen is None
    config = config_from_agent_specs(specs)
    assert spawned.confirm(config)
    launcher = make_subprocess_launcher(adopt=spawned)
    messages = []
    with trio.fail_after(10):
        for _ in range(2):
            async with trio.open_nursery() as nursery:
                with pytest.raises(AgentStartError) as failed:
                    await nursery.start(launcher, config.default_agent)
            messages.append(str(failed.value))
    assert messages[0] == messages[1]
    assert messages[0] == (
        "cannot start agent 'x': /nonexistent/agent --x: No such file or directory"
    )


def test_an_early_process_the_configuration_disowns_is_stopped():
    """Loaded for real, the default agent is another command: the early one goes."""
    spawned = prespawn(None, ["a=cat"])
    assert spawned is not None
    popen = spawned.popen
    assert popen is not None
    assert not spawned.confirm(config_from_agent_specs(["a=cat -u"]))
    assert popen.returncode == 0  # (stdin's end was enough)
    assert spawned.take(config_from_agent_specs(["a=cat -u"]).default_agent) is None


def test_a_launch_with_another_config_stops_the_early_process():
    spawned, agent = _early(["a=cat"])
    popen = spawned.popen
    assert popen is not None
    assert spawned.take(attrs.evolve(agent, start_timeout=1.0)) is None
    assert popen.returncode is not None
    assert spawned.take(agent) is None  # (once)


def test_an_early_agent_never_taken_is_stopped_by_signal_after_the_grace():
    """One that ignores its stdin's end: SIGTERM to its group after ``stop_grace``."""
    spawned, _ = _early(["a=sleep 1000"], grace=0.05)
    popen = spawned.popen
    assert popen is not None
    spawned.discard()
    assert popen.returncode == -signal.SIGTERM
    spawned.discard()  # (once)


def test_this_installation_runs_with_this_interpreter(tmp_path, monkeypatch):
    """``acp-bridge`` as an agent's command, with no ``acp-bridge`` on PATH (a venv that is
    not activated): this very installation, through this interpreter."""
    monkeypatch.setenv("PATH", str(tmp_path))  # (an empty directory: nothing on PATH)
    assert shutil.which("acp-bridge") is None
    early = _early_agent(None, ["self=acp-bridge demo-agent"])
    assert early is not None
    assert early[1].argv == [sys.executable, "-m", "acp_bridge", "demo-agent"]
