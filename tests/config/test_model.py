"""The configuration: TOML files, error messages that name the key, and --agent specs."""

from __future__ import annotations

import ast
import os
import pathlib
import shlex
import tomllib

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import acp_bridge.config.model as config_module
from acp_bridge.config.model import (
    AgentConfig,
    BridgeConfig,
    Config,
    ConfigError,
    StoreConfig,
    config_from_agent_specs,
    default_state_dir,
    load_config,
    make_converter,
    parse_config,
    redact_env,
)
from acp_bridge.policy.rules import Action, Policy

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"

MINIMAL = '[agents.demo]\ncommand = "acp-bridge"\n'


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text), source="x.toml")


def problems(text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert info.value.source == "x.toml"
    return info.value.problems


def test_default_toml_runs_the_demo_agent():
    """The shipped default config loads and starts the bundled demo agent by default."""
    config = load_config(CONFIGS / "default.toml")
    assert config.source == str(CONFIGS / "default.toml")
    assert list(config.agents) == ["demo", "helper"]  # helper: the sub-agent demo's other agent
    assert config.default_agent == AgentConfig(
        name="demo", command="acp-bridge", args=("demo-agent",)
    )
    assert config.bridge == BridgeConfig(default_agent="demo")
    assert config.websocket == config_module.WebSocketConfig()
    assert config.policy == Policy()
    assert config.store == StoreConfig()


def test_two_agents_toml_keeps_file_order():
    """Agents come out in file order, the named default first here, with their own args."""
    config = load_config(CONFIGS / "two-agents.toml")
    assert list(config.agents) == ["demo", "demo2"]
    assert config.default_agent.name == "demo"
    assert config.agents["demo2"].args == (
        "demo-agent",
        "--name",
        "demo2",
        "--session-prefix",
        "d2-",
    )


def test_minimal_config_takes_every_default():
    """One agent with a command is a complete config."""
    config = parse(MINIMAL)
    assert config == Config(
        agents={"demo": AgentConfig(name="demo", command="acp-bridge")}, source="x.toml"
    )


def test_numbers_and_optional_values_structure():
    """Integers are accepted where floats are expected; optional keys take their values."""
    config = parse(
        MINIMAL
        + 'args = ["a", "b c"]\nenv = {API_KEY = "k", LANG = "C"}\nstart_timeout = 5\n'
        + "[bridge]\nrestart_backoff_max = 10\nstop_grace = 0\n"
        + '[websocket]\nport = 0\ntoken = "t"\nallowed_origins = ["https://x"]\n'
        + '[policy]\ndefault = "deny"\n[store]\npath = ":memory:"\n'
    )
    agent = config.agents["demo"]
    assert agent.args == ("a", "b c")
    assert dict(agent.env) == {"API_KEY": "k", "LANG": "C"}
    assert agent.start_timeout == 5.0
    assert isinstance(agent.start_timeout, float)
    assert config.bridge.restart_backoff_max == 10.0
    assert isinstance(config.bridge.restart_backoff_max, float)
    assert config.websocket.allowed_origins == ("https://x",)
    assert config.policy.default is Action.DENY
    assert config.store.path == ":memory:"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            MINIMAL + "comand = 'x'\n",
            "unknown key 'agents.demo.comand' (did you mean 'command'?)",
            id="agent",
        ),
        pytest.param(MINIMAL + "name = 'x'\n", "unknown key 'agents.demo.name'", id="agent-name"),
        pytest.param(
            MINIMAL + "[bridge]\ndefault_agnet = 'demo'\n",
            "unknown key 'bridge.default_agnet' (did you mean 'default_agent'?)",
            id="bridge",
        ),
        pytest.param(
            MINIMAL + "[websocket]\nallowed_origin = []\n",
            "unknown key 'websocket.allowed_origin' (did you mean 'allowed_origins'?)",
            id="websocket",
        ),
        pytest.param(
            MINIMAL + "[policy]\nrule = []\n",
            "unknown key 'policy.rule' (did you mean 'rules'?)",
            id="policy",
        ),
        pytest.param(MINIMAL + "[store]\nfile = 'x'\n", "unknown key 'store.file'", id="store"),
        pytest.param(
            MINIMAL + "[bridg]\n", "unknown key 'bridg' (did you mean 'bridge'?)", id="top"
        ),
        pytest.param(
            "source = 'x'\n" + MINIMAL,
            "unknown key 'source' (did you mean 'store'?)",
            id="source-not-a-key",
        ),
        pytest.param(
            '[agents."my.agent"]\ncommand = "x"\nx = 1\n',
            "unknown key 'agents.\"my.agent\".x'",
            id="quoted-agent-name",
        ),
    ],
)
def test_unknown_keys_are_named_with_their_path(text, expected):
    """A misspelt key is an error naming its full dotted path, not silently ignored."""
    assert expected in problems(text)


def test_unknown_key_message_names_the_file(tmp_path):
    """The message of a file's error starts with the file as given."""
    path = tmp_path / "x.toml"
    path.write_text(MINIMAL + "comand = 'x'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: unknown key 'agents.demo.comand' (did you mean 'command'?)"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[agents.demo]\ncommand = 5\n", "agents.demo.command: expected a string"),
        (MINIMAL + "args = 'demo-agent'\n", "agents.demo.args: expected an array of strings"),
        (MINIMAL + "args = ['a', 3]\n", "agents.demo.args[1]: expected a string"),
        (MINIMAL + "env = {A = 1}\n", "agents.demo.env.A: expected a string"),
        (MINIMAL + "env = {'a b' = 1}\n", 'agents.demo.env."a b": expected a string'),
        (MINIMAL + "env = []\n", "agents.demo.env: expected a table of strings"),
        (MINIMAL + "cwd = ['.']\n", "agents.demo.cwd: expected a string"),
        (MINIMAL + "start_timeout = '5'\n", "agents.demo.start_timeout: expected a number"),
        (MINIMAL + "start_timeout = true\n", "agents.demo.start_timeout: expected a number"),
        (MINIMAL + "[bridge]\nclient_queue = 1.5\n", "bridge.client_queue: expected an integer"),
        (MINIMAL + "[bridge]\nagent_queue = true\n", "bridge.agent_queue: expected an integer"),
        (
            MINIMAL + "[bridge]\nrestart_backoff_max = 'x'\n",
            "bridge.restart_backoff_max: expected a number",
        ),
        (MINIMAL + "[websocket]\nport = '8765'\n", "websocket.port: expected an integer"),
        ("bridge = 3\n" + MINIMAL, "bridge: expected a table"),
        ("agents = 3\n", "agents: expected a table of agents, e.g. [agents.NAME]"),
        ("agents = {demo = 3}\n", "agents.demo: expected a table"),
        ("[agents.demo]\nargs = []\n", "agents.demo.command: required key missing"),
    ],
)
def test_wrong_types_are_named_with_their_path(text, expected):
    """A value of the wrong type is reported at its key; nothing is coerced to a string."""
    assert expected in problems(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no agents configured: add an [agents.NAME] table with a command"),
        ("[agents]\n", "no agents configured: add an [agents.NAME] table with a command"),
        ('[agents.demo]\ncommand = ""\n', "agents.demo.command: must not be empty"),
        (
            '[agents."a b"]\ncommand = "x"\n',
            "agents.\"a b\": invalid agent name: use letters, digits, '_', '.' and '-'",
        ),
        (
            MINIMAL + "[bridge]\ndefault_agent = 'other'\n",
            "bridge.default_agent: unknown agent 'other' (configured: demo)",
        ),
        (
            MINIMAL + "[policy]\ndefault = 'maybe'\n",
            "policy.default: expected one of 'allow', 'deny', 'ask'",
        ),
        (MINIMAL + "[websocket]\nport = 70000\n", "websocket.port: must be between 0 and 65535"),
        (MINIMAL + "[websocket]\npath = 'acp'\n", "websocket.path: must start with '/'"),
        (
            MINIMAL + "[websocket]\ntoken = 'a'\ntoken_file = 'b'\n",
            "websocket.token: set token or token_file, not both",
        ),
        (MINIMAL + "[bridge]\nagent_queue = 0\n", "bridge.agent_queue: must be at least 1"),
        (
            MINIMAL + "[bridge]\nmax_agent_requests = 0\n",
            "bridge.max_agent_requests: must be at least 1",
        ),
        (MINIMAL + "[bridge]\ncancel_grace = -1\n", "bridge.cancel_grace: must not be negative"),
        (
            MINIMAL + "[bridge]\nrestart_backoff_max = 0.1\n",
            "bridge.restart_backoff_max: must be at least bridge.restart_backoff_initial",
        ),
    ],
)
def test_invalid_values_are_named(text, expected):
    """What the types allow but the bridge cannot use is reported at its key."""
    assert expected in problems(text)


def test_every_problem_is_reported_at_once():
    """One run reports all mistakes, unknown keys first, each on its own line."""
    found = problems("[agents.demo]\ncomand = 'x'\nargs = [1]\n[bridge]\nmax_line_bytes = 'big'\n")
    assert found == (
        "unknown key 'agents.demo.comand' (did you mean 'command'?)",
        "agents.demo.command: required key missing",
        "agents.demo.args[0]: expected a string",
        "bridge.max_line_bytes: expected an integer",
    )


def test_toml_syntax_error_has_file_and_line(tmp_path):
    """A TOML syntax error names the file and carries tomllib's line and column."""
    path = tmp_path / "bad.toml"
    path.write_text(MINIMAL + "args = = []\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: invalid TOML: ")
    assert "line 3" in message


def test_missing_file(tmp_path):
    """A missing file is a ConfigError naming it, not a traceback."""
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file$"):
        load_config(path)


def test_directory_is_unreadable(tmp_path):
    """A path that is not a readable file is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)


def test_non_utf8_file(tmp_path):
    """A file that is not UTF-8 is a ConfigError, not a UnicodeDecodeError."""
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[agents.d\xe9mo]\ncommand = "x"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


def test_relative_paths_resolve_against_the_config_dir(tmp_path):
    """cwd, token_file and store.path are anchored at the file's directory; :memory: is not."""
    path = tmp_path / "x.toml"
    path.write_text(
        MINIMAL + 'cwd = "work"\n[websocket]\ntoken_file = "tok"\n[store]\npath = "db/b.db"\n'
    )
    config = load_config(path)
    assert config.agents["demo"].cwd == str(tmp_path / "work")
    assert config.websocket.token_file == str(tmp_path / "tok")
    assert config.store.path == str(tmp_path / "db" / "b.db")

    path.write_text(MINIMAL + 'cwd = "/abs"\n[store]\npath = ":memory:"\n')
    config = load_config(path)
    assert config.agents["demo"].cwd == "/abs"
    assert config.store.path == ":memory:"


def test_parse_config_without_base_dir_keeps_paths():
    """Without a base directory, paths stay as written."""
    assert parse(MINIMAL + 'cwd = "work"\n').agents["demo"].cwd == "work"


@pytest.mark.parametrize(
    ("agents", "default", "expected"),
    [
        (["a"], None, "a"),
        (["a", "b"], None, "a"),
        (["a", "b"], "b", "b"),
    ],
)
def test_default_agent_rules(agents, default, expected):
    """The named default wins; otherwise the only, or the first, agent."""
    text = "".join(f'[agents.{n}]\ncommand = "x"\n' for n in agents)
    if default is not None:
        text += f'[bridge]\ndefault_agent = "{default}"\n'
    assert parse(text).default_agent.name == expected


def test_default_agent_unknown_in_a_built_config():
    """A config built in code that names a missing default fails when it is asked for."""
    config = Config(
        agents={"a": AgentConfig(name="a", command="x")},
        bridge=BridgeConfig(default_agent="b"),
        source="built",
    )
    with pytest.raises(ConfigError, match=r"^built: bridge.default_agent: unknown agent 'b'"):
        _ = config.default_agent
    with pytest.raises(ConfigError, match="no agents configured"):
        _ = Config(agents={}).default_agent


def test_config_is_frozen_all_the_way_down():
    """Neither the config nor its mappings can be changed after loading."""
    config = parse(MINIMAL + 'env = {A = "1"}\n')
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.bridge = BridgeConfig()  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.agents["x"] = config.agents["demo"]  # type: ignore[index]
    with pytest.raises(TypeError):
        config.agents["demo"].env["B"] = "2"  # type: ignore[index]


def test_make_converter_builds_a_private_converter():
    """Each call builds a new converter; none is the global one."""
    import cattrs

    first, second = make_converter(), make_converter()
    assert first is not second
    assert first is not cattrs.global_converter


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        (
            ["demo=acp-bridge demo-agent --x 'a b'"],
            {"demo": ("acp-bridge", ("demo-agent", "--x", "a b"))},
        ),
        (["a=x", "b=y --flag=1"], {"a": ("x", ()), "b": ("y", ("--flag=1",))}),
        (['q="/opt/my agent/run"'], {"q": ("/opt/my agent/run", ())}),
        (["e=env A=B cmd"], {"e": ("env", ("A=B", "cmd"))}),
    ],
)
def test_agent_specs_split_like_a_shell(specs, expected):
    """NAME=COMMAND is split with shell rules; the first spec is the default agent."""
    config = config_from_agent_specs(specs)
    assert {n: (a.command, a.args) for n, a in config.agents.items()} == expected
    assert list(config.agents) == list(expected)
    assert config.default_agent.name == next(iter(expected))
    assert config.source == "--agent"


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        (["demo"], "'demo': expected NAME=COMMAND"),
        (["=cmd"], "'=cmd': empty agent name"),
        (["demo="], "'demo=': empty command"),
        (["demo=   "], "'demo=   ': empty command"),
        (["a b=cmd"], "'a b=cmd': invalid agent name"),
        (["demo=x 'unclosed"], '"demo=x \'unclosed": No closing quotation'),
        (["demo=x", "demo=y"], "'demo=y': agent 'demo' given twice"),
        ([], "no agents given"),
    ],
)
def test_bad_agent_specs(specs, expected):
    """Malformed --agent values are a ConfigError that quotes the value."""
    with pytest.raises(ConfigError) as info:
        config_from_agent_specs(specs)
    assert info.value.source == "--agent"
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_agent_specs_extend_a_base_config():
    """With a base config, its tables stay, specs add or replace agents, and lead."""
    base = load_config(CONFIGS / "two-agents.toml")
    config = config_from_agent_specs(["demo2=other", "extra=x"], base=base)
    assert list(config.agents) == ["demo", "demo2", "extra"]
    assert config.agents["demo2"].command == "other"
    assert config.default_agent.name == "demo2"
    assert config.websocket == base.websocket
    assert config.bridge.agent_queue == base.bridge.agent_queue


@given(argv=st.lists(st.text(st.characters(exclude_categories=["Cs"]), min_size=1), min_size=1))
def test_agent_spec_round_trips_shlex_join(argv):
    """Whatever argv shlex.join quotes comes back unchanged as command and args."""
    agent = config_from_agent_specs([f"a={shlex.join(argv)}"]).agents["a"]
    assert (agent.command, *agent.args) == tuple(argv)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {}),
        ({"PATH": "/bin", "LANG": "C"}, {"PATH": "/bin", "LANG": "C"}),
        (
            {
                "OPENAI_API_KEY": "k",
                "github_token": "t",
                "MySecret": "s",
                "DB_PASSWORD": "p",
                "AUTHORIZATION": "a",
                "HOME": "/h",
            },
            {
                "OPENAI_API_KEY": "***",
                "github_token": "***",
                "MySecret": "***",
                "DB_PASSWORD": "***",
                "AUTHORIZATION": "***",
                "HOME": "/h",
            },
        ),
    ],
)
def test_redact_env(env, expected):
    """Values of secret-looking names are hidden; others are kept, in order."""
    result = redact_env(env)
    assert result == expected
    assert list(result) == list(expected)


@pytest.mark.parametrize(
    ("xdg", "expected"),
    [
        ("/state", pathlib.Path("/state/acp-bridge")),
        ("", pathlib.Path.home() / ".local" / "state" / "acp-bridge"),
        ("relative", pathlib.Path.home() / ".local" / "state" / "acp-bridge"),
    ],
)
def test_default_state_dir(monkeypatch, xdg, expected):
    """$XDG_STATE_HOME when absolute, else ~/.local/state."""
    monkeypatch.setenv("XDG_STATE_HOME", xdg)
    assert default_state_dir() == expected


def test_default_store_path(monkeypatch):
    """An unset store path means bridge.db in the state directory."""
    monkeypatch.setenv("XDG_STATE_HOME", "/state")
    assert StoreConfig().resolved_path() == os.path.join("/state", "acp-bridge", "bridge.db")
    assert StoreConfig(path=":memory:").resolved_path() == ":memory:"


def test_config_module_does_not_import_trio():
    """The config module is part of the pure core: it never imports trio."""
    tree = ast.parse(pathlib.Path(config_module.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert "trio" not in imported
