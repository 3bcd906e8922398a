"""
The tests of ``tests/engine/test_diagnostics.py`` that start other processes (kept here so that
``pytest tests/engine`` runs in-process only).
"""

from __future__ import annotations

import io
import sys

import trio
import trio.testing

from acp_bridge.cli.prompt import run_prompt
from acp_bridge.config.model import AgentConfig, Config, StoreConfig
from acp_bridge.observe.redact import Redactor


async def test_the_prompt_command_gives_its_redactor_to_the_bridge(tmp_path):
    """run_prompt (what `acp-bridge prompt` runs) hands the redactor it was given, the one its
    logs use, to the bridge: the real agent's env secret is registered there."""
    secret = "sk-prompt-secret-" + "x" * 12
    demo = (sys.executable, "-m", "acp_bridge", "demo-agent", "--chunk-delay", "0")
    config = Config(
        agents={
            "demo": AgentConfig(
                name="demo", command=demo[0], args=demo[1:], env={"API_KEY": secret}
            )
        },
        store=StoreConfig(path=":memory:"),
    )
    redactor = Redactor()
    with trio.fail_after(30):
        stop = await run_prompt(
            config,
            "hello",
            cwd=str(tmp_path),
            out=io.StringIO(),
            err=io.StringIO(),
            redactor=redactor,
        )
    assert stop == "end_turn"
    assert redactor.redact(secret) == "***"
