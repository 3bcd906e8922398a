"""
The default agent spawned before the imports (``agents.prespawn``), and its adoption by the
launcher.

The quick reading of the arguments and the TOML file must give what the real configuration
gives (else the early process is stopped and the start-up gain lost); the adopted process is
then watched, killed and stopped like a spawned one, and a failed spawn is the same error.
"""

from __future__ import annotations

import os

import pytest

from acp_bridge.agents.prespawn import _early_agent, prespawn, spawn_settings
from acp_bridge.config.model import config_from_agent_specs, load_config

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open here")

CONFIGS = {
    "one agent, relative cwd, env": """
        [agents.a]
        command = "my-agent"
        args = ["--acp", "x y"]
        env = { MODEL = "small", TOKEN = "t" }
        cwd = "work"
    """,
    "the default named, ~ in its cwd": """
        [bridge]
        default_agent = "b"
        [agents.a]
        command = "first"
        [agents.b]
        command = "second"
        args = ["--b"]
        cwd = "~/somewhere"
    """,
    "absolute cwd, a launcher agent not the default": """
        [agents.a]
        command = "/usr/bin/agent"
        cwd = "/srv/agent"
        [agents.c]
        command = "agent"
        launcher = ["docker", "exec", "-i", "box", "--"]
    """,
    "this installation": """
        [agents.self]
        command = "acp-bridge"
        args = ["demo-agent"]
    """,
}


@pytest.mark.parametrize("text", CONFIGS.values(), ids=CONFIGS.keys())
def test_the_quick_reading_of_a_file_is_the_configuration(tmp_path, text):
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    agent = load_config(path).default_agent
    assert _early_agent(str(path), []) == (agent.name, spawn_settings(agent))


@pytest.mark.parametrize(
    "specs",
    [["a=my-agent --x 'two words'"], ["b=second", "a=first"], ["a=acp-bridge demo-agent"]],
)
def test_the_quick_reading_of_agent_options_is_the_configuration(tmp_path, specs):
    agent = config_from_agent_specs(specs).default_agent
    assert _early_agent(None, specs) == (agent.name, spawn_settings(agent))
    # With a file too, the first --agent is the default.
    path = tmp_path / "bridge.toml"
    path.write_text(CONFIGS["one agent, relative cwd, env"])
    agent = config_from_agent_specs(specs, base=load_config(path)).default_agent
    assert _early_agent(str(path), specs) == (agent.name, spawn_settings(agent))


NOT_EARLY = {
    "ssh": '[agents.a]\ncommand = "x"\nssh = { host = "h" }\n',
    "launcher": '[agents.a]\ncommand = "x"\nlauncher = ["docker", "exec", "-i", "c", "--"]\n',
    "no agents": "[bridge]\n",
    "unknown default": '[bridge]\ndefault_agent = "z"\n[agents.a]\ncommand = "x"\n',
    "a number for a command": "[agents.a]\ncommand = 5\n",
    "not TOML": "[agents.a\n",
}


@pytest.mark.parametrize("text", NOT_EARLY.values(), ids=NOT_EARLY.keys())
def test_what_the_quick_reading_leaves_to_the_usual_launch(tmp_path, text):
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    assert _early_agent(str(path), []) is None
    assert prespawn(str(path), []) is None


def test_no_early_agent_without_a_file_or_a_valid_option(tmp_path):
    assert _early_agent(None, []) is None
    assert _early_agent(str(tmp_path / "missing.toml"), []) is None
    assert _early_agent(None, ["no-equals-sign"]) is None
    assert _early_agent(None, ["a='unbalanced"]) is None


def test_a_word_popen_refuses_is_left_to_the_usual_launch(tmp_path):
    """A NUL in the command (TOML allows it): no early process, and no crash before the
    configuration is even checked."""
    path = tmp_path / "bridge.toml"
    path.write_text('[agents.a]\ncommand = "agent\\u0000x"\n')
    assert _early_agent(str(path), []) is not None
    assert prespawn(str(path), []) is None
