"""The access token: the daemon's file (created, reused, guarded), and how clients resolve one."""

from __future__ import annotations

import os
import stat

import attrs
import pytest

from acp_bridge.cli.main import main
from acp_bridge.config.model import ConfigError, WebSocketConfig
from acp_bridge.faces.token import (
    TokenError,
    check_token,
    is_loopback,
    load_or_create_token,
    resolve_token,
)
from tests.support.fakes import FakeAgent, make_config

# -- the daemon's file ---------------------------------------------------------------------------


def test_token_file_is_generated_0600_and_reused(tmp_path, monkeypatch):
    """The default token is 256 random bits in a 0600 file, in a 0700 directory, reused."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = make_config({"a": FakeAgent("a")})
    token, path = load_or_create_token(config)
    assert path == str(tmp_path / "state" / "acp-bridge" / "token")
    assert len(token) >= 43  # 32 random bytes, URL-safe base64
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "acp-bridge").st_mode) == 0o700
    assert load_or_create_token(config) == (token, path)
    assert sorted(os.listdir(tmp_path / "state" / "acp-bridge")) == ["token"]


def test_configured_token_file_is_generated_when_missing(tmp_path):
    """A configured token_file that does not exist is generated the same way."""
    target = tmp_path / "conf" / "tok"
    config = attrs.evolve(
        make_config({"a": FakeAgent("a")}), websocket=WebSocketConfig(token_file=str(target))
    )
    token, path = load_or_create_token(config)
    assert path == str(target)
    assert target.read_bytes().strip() == token
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    """A token file readable by group or others stops start-up with a clear error."""
    target = tmp_path / "tok"
    target.write_text("a-token-that-is-long-enough\n")
    target.chmod(mode)
    config = attrs.evolve(
        make_config({"a": FakeAgent("a")}), websocket=WebSocketConfig(token_file=str(target))
    )
    with pytest.raises(ConfigError, match="readable by group or others"):
        load_or_create_token(config)


def test_inline_token_has_no_file():
    """An inline token is used as is, with no file."""
    config = attrs.evolve(
        make_config({"a": FakeAgent("a")}), websocket=WebSocketConfig(token="abc")
    )
    assert load_or_create_token(config) == (b"abc", None)


# -- the client side: attach -------------------------------------------------------------------


def test_token_comes_from_the_file_stripped(tmp_path):
    path = tmp_path / "token"
    path.write_text("  secret-token\n")
    assert resolve_token(str(path), None, "ws://127.0.0.1:1/acp") == "secret-token"


@pytest.mark.parametrize(
    ("file_text", "env", "message"),
    [
        (None, {}, "No such file"),
        ("\n", {}, "empty"),
        ("two words", {}, "not a token"),
    ],
)
def test_token_file_problems_are_reported(tmp_path, file_text, env, message):
    path = tmp_path / "token"
    if file_text is not None:
        path.write_text(file_text)
    with pytest.raises(TokenError, match=message):
        resolve_token(str(path), None, "ws://127.0.0.1:1/acp", environ=env)


def test_token_from_an_environment_variable_or_the_local_daemons_file(tmp_path, monkeypatch):
    url = "ws://127.0.0.1:1/acp"
    assert resolve_token(None, "MY_TOKEN", url, environ={"MY_TOKEN": "abc"}) == "abc"
    with pytest.raises(TokenError, match="MY_TOKEN: empty"):
        resolve_token(None, "MY_TOKEN", url, environ={})
    assert resolve_token(None, None, url, environ={"ACP_BRIDGE_TOKEN": "xyz"}) == "xyz"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "acp-bridge").mkdir()
    (tmp_path / "acp-bridge" / "token").write_text("local\n")
    (tmp_path / "acp-bridge" / "token").chmod(0o600)  # as `serve` writes it
    assert resolve_token(None, None, url, environ={}) == "local"
    # Never the local daemon's token for another machine.
    with pytest.raises(TokenError, match="no token"):
        resolve_token(None, None, "wss://example.org/acp", environ={})


def test_the_generated_file_is_read_with_the_daemons_care(tmp_path, monkeypatch):
    """attach takes the local daemon's token only from a private file, as `serve` does."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "acp-bridge").mkdir()
    token = tmp_path / "acp-bridge" / "token"
    token.write_text("a-token-that-is-long-enough\n")
    token.chmod(0o644)
    with pytest.raises(TokenError, match="readable by group or others"):
        resolve_token(None, None, "ws://localhost:1/acp", environ={})
    token.chmod(0o600)
    assert resolve_token(None, None, "ws://[::1]:1/acp", environ={}) == (
        "a-token-that-is-long-enough"
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.5", False),
        ("example.org", False),
        ("localhost.example.org", False),
        ("", False),
    ],
)
def test_one_loopback_rule(host, loopback):
    """Names and literals, bracketed or not, in any case: the same answer for every caller."""
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("", "empty"),
        ("two words", "not a token"),
        ("tab\there", "not a token"),
        ("caf\u00e9", "not a token"),
    ],
)
def test_a_token_a_client_cannot_send_is_a_usage_error(token, message):
    """A token travels in an HTTP header: printable ASCII, no spaces, not empty."""
    with pytest.raises(TokenError, match=message):
        check_token(token, "somewhere")


# -- the client side: status -------------------------------------------------------------------


def test_status_checks_a_named_token_file_like_attach(tmp_path, capsys):
    """`status --token-file` refuses what attach refuses, before any request (exit 1)."""
    path = tmp_path / "token"
    path.write_text("two words\n")
    assert main(["status", "--url", "http://127.0.0.1:9", "--token-file", str(path)]) == 1
    assert f"token file {path}: not a token" in capsys.readouterr().err
