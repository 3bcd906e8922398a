"""What the bridge advertises and what it strips from a session's setup: pure, no trio."""

from __future__ import annotations

import copy

from acp_bridge.protocol.capabilities import advertised, strip_unsupported_setup


def test_advertised_is_the_default_agents_plus_what_the_bridge_serves_itself():
    default = {
        "loadSession": False,
        "promptCapabilities": {"image": True},
        "sessionCapabilities": {"fork": {}, "close": {"own": 1}},
    }
    before = copy.deepcopy(default)
    caps = advertised(default, [default, {}])
    assert caps == {
        "loadSession": True,
        "promptCapabilities": {"image": True},
        "sessionCapabilities": {"fork": {}, "resume": {}, "close": {}, "delete": {}},
    }
    assert default == before  # the agent's own capabilities are not changed


def test_list_is_advertised_when_any_agent_lists_sessions():
    lister = {"sessionCapabilities": {"list": {}}}
    assert "list" not in advertised({}, [{}, {"sessionCapabilities": {}}])["sessionCapabilities"]
    assert advertised({}, [{}, lister])["sessionCapabilities"]["list"] == {}


def test_an_agent_without_them_loses_additional_directories_and_http_sse_servers():
    """(``acp`` servers are left to the offer: one may be re-exported over HTTP.)"""
    params = {
        "cwd": "/w",
        "additionalDirectories": ["/x"],
        "mcpServers": [
            {"name": "local", "command": "srv", "args": [], "env": []},
            {"type": "http", "name": "h", "url": "http://127.0.0.1:1", "headers": []},
            {"type": "sse", "name": "s", "url": "http://127.0.0.1:2", "headers": []},
            {"type": "acp", "name": "a"},
            "not a server",
        ],
    }
    stripped = strip_unsupported_setup({}, params)
    assert stripped == [
        "additionalDirectories",
        "mcpServers: http server 'h'",
        "mcpServers: sse server 's'",
    ]
    assert params == {
        "cwd": "/w",
        "mcpServers": [
            {"name": "local", "command": "srv", "args": [], "env": []},
            {"type": "acp", "name": "a"},
            "not a server",
        ],
    }


def test_acp_mcp_servers_are_advertised_when_the_default_agent_takes_acp_or_http_ones():
    """The bridge relays ``mcp/message`` to the first and re-exports over HTTP to the second."""
    assert advertised({"mcpCapabilities": {"http": True}}, [])["mcpCapabilities"] == {
        "http": True,
        "acp": True,
    }
    assert advertised({"mcpCapabilities": {"acp": True}}, [])["mcpCapabilities"] == {"acp": True}
    assert "mcpCapabilities" not in advertised({}, [])
    assert advertised({"mcpCapabilities": {"sse": True}}, [])["mcpCapabilities"] == {"sse": True}


def test_what_the_agent_advertised_is_kept_and_nothing_is_reported():
    caps = {
        "sessionCapabilities": {"additionalDirectories": {}},
        "mcpCapabilities": {"http": True, "sse": False},
    }
    servers = [
        {"type": "http", "name": "h", "url": "http://127.0.0.1:1", "headers": []},
        {"type": "sse", "name": "s", "url": "http://127.0.0.1:2", "headers": []},
    ]
    params = {"additionalDirectories": ["/x"], "mcpServers": list(servers)}
    assert strip_unsupported_setup(caps, params) == ["mcpServers: sse server 's'"]
    assert params == {"additionalDirectories": ["/x"], "mcpServers": servers[:1]}
    params = {"additionalDirectories": ["/x"], "mcpServers": servers[:1]}
    assert strip_unsupported_setup(caps, params) == []
    assert params == {"additionalDirectories": ["/x"], "mcpServers": servers[:1]}


def test_malformed_capabilities_and_setup_are_left_to_the_agent():
    """A non-object mcpCapabilities counts as none; a non-list mcpServers is not touched."""
    params = {"mcpServers": {"not": "a list"}}
    assert strip_unsupported_setup({"mcpCapabilities": "yes"}, params) == []
    assert params == {"mcpServers": {"not": "a list"}}
    params = {"mcpServers": [{"type": "http", "name": "h"}]}
    assert strip_unsupported_setup({"mcpCapabilities": ["http"]}, params) == [
        "mcpServers: http server 'h'"
    ]
    assert params == {"mcpServers": []}
