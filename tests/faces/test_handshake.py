"""The listener's pure decisions: request-head verdicts, the upgrade, frames, bind policy.

Plain synchronous tests, no trio and no socket; ``test_ws.py`` sends the same requests over real
loopback sockets and checks what reaches the wire.
"""

from __future__ import annotations

import pytest

from acp_bridge.config.model import AgentConfig, Config, ConfigError, WebSocketConfig
from acp_bridge.faces.console_core import ConsoleKeys
from acp_bridge.faces.handshake import TOO_MANY, is_initialize, text_frames
from acp_bridge.faces.listener_core import HANDLERS, ListenerPolicy, check_bind, listener_site
from acp_bridge.http.wire import Admitted, RequestHead, Response, plain

AGENT = AgentConfig(name="a", command="fake")
TOKEN = "t"
UPGRADE_HEADERS = (
    ("upgrade", "websocket"),
    ("connection", "Upgrade"),
    ("sec-websocket-version", "13"),
    ("sec-websocket-key", "x"),
)
#: what the listener admits: the handler's name, and what the token proved
HEALTH = Admitted("health")
UPGRADE = Admitted("acp", True)


def judge(head: RequestHead, policy: ListenerPolicy) -> Response | Admitted[str]:
    """The listener's verdict on ``head``, its handlers named as in HANDLERS."""
    keys = ConsoleKeys.build(policy.token, port=policy.port, tls=False)
    return listener_site(policy, keys, {name: name for name in HANDLERS}).judge(head, now=0.0)


# -- the verdicts --------------------------------------------------------------------------------


def test_judge_host_forms():
    """IPv6 hosts, defaults and duplicates, decided without sockets."""
    settings = WebSocketConfig(host="::", port=9000, allowed_hosts=("bad host",))
    policy = ListenerPolicy.build(settings, token=b"t", port=9000, tls=False)

    def head(*headers: tuple[str, str]) -> RequestHead:
        base = (
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "x"),
            ("authorization", "Bearer t"),
        )
        return RequestHead("GET", "/acp", "1.1", (*headers, *base))

    assert judge(head(("host", "[::1]:9000")), policy) == UPGRADE
    # A wildcard bind: any IP literal with the right port (no name can be rebound to it).
    assert judge(head(("host", "192.0.2.7:9000")), policy) == UPGRADE
    assert judge(head(("host", "[2001:db8::1]:9000")), policy) == UPGRADE
    for bad in (
        "192.0.2.7:9001",
        "[::1",
        "::1:9000",
        "evil.example:9000",
        "a:b:c",
        "x@127.0.0.1:9000",
    ):
        verdict = judge(head(("host", bad)), policy)
        assert verdict == plain(403, "forbidden: unknown Host"), bad
    two = head(("host", "[::1]:9000"), ("host", "[::1]:9000"))
    assert judge(two, policy) == plain(403, "forbidden: unknown Host")
    # (past max_connections the upgrade's handler answers this: test_ws.py's connection cap)
    assert TOO_MANY.status == 503


def loopback_policy() -> ListenerPolicy:
    settings = WebSocketConfig(allowed_origins=("http://localhost:3000",))
    return ListenerPolicy.build(settings, token=TOKEN.encode(), port=8765, tls=False)


HOST = ("host", "127.0.0.1:8765")
AUTHORIZED = ("authorization", f"Bearer {TOKEN}")
EVIL_ORIGIN = ("origin", "https://evil.example")


@pytest.mark.parametrize(
    ("method", "target", "headers", "verdict"),
    [
        pytest.param("GET", "/healthz", (HOST,), HEALTH, id="health-without-token"),
        pytest.param("GET", "/healthz", (HOST, EVIL_ORIGIN), HEALTH, id="health-any-origin"),
        pytest.param("GET", "/status", (HOST, AUTHORIZED), Admitted("status", True), id="status"),
        pytest.param(
            "GET", "/metrics?token=t", (HOST,), Admitted("metrics", True), id="metrics-query"
        ),
        pytest.param("GET", "/acp", (HOST, AUTHORIZED, *UPGRADE_HEADERS), UPGRADE, id="upgrade"),
        pytest.param("GET", "/nope", (("host", "evil.example:8765"),), 403, id="host-first"),
        pytest.param("GET", "*", (HOST,), 400, id="not-a-path"),
        pytest.param("POST", "/healthz", (HOST,), 405, id="post-health"),
        pytest.param("POST", "/status", (HOST, AUTHORIZED), 405, id="post-status"),
        pytest.param("GET", "/status", (HOST,), 401, id="status-without-token"),
        pytest.param("GET", "/metrics", (HOST, AUTHORIZED, EVIL_ORIGIN), 403, id="metrics-origin"),
        pytest.param("GET", "/nope", (HOST, AUTHORIZED), 404, id="unknown-path"),
        pytest.param("PUT", "/acp", (HOST, AUTHORIZED, *UPGRADE_HEADERS), 405, id="put-acp"),
        pytest.param("GET", "/acp", (HOST, AUTHORIZED), 406, id="neither-upgrade-nor-events"),
        pytest.param(
            "GET",
            "/acp",
            (HOST, AUTHORIZED, ("accept", "text/event-stream")),
            Admitted("acp", True),
            id="events",
        ),
        pytest.param("POST", "/acp", (HOST, AUTHORIZED), Admitted("acp.post", True), id="post"),
        pytest.param("DELETE", "/acp", (HOST,), 401, id="delete-without-token"),
        pytest.param("POST", "/acp", (HOST, EVIL_ORIGIN, AUTHORIZED), 403, id="post-origin"),
        pytest.param("GET", "/acp", (HOST, *UPGRADE_HEADERS), 401, id="no-token"),
        pytest.param(
            "GET", "/acp", (HOST, EVIL_ORIGIN, *UPGRADE_HEADERS), 403, id="origin-before-token"
        ),
        pytest.param(
            "GET",
            "/acp",
            (HOST, AUTHORIZED, ("upgrade", "websocket"), ("sec-websocket-version", "13")),
            400,
            id="upgrade-without-connection-upgrade",
        ),
    ],
)
def test_judge_checks_host_path_method_upgrade_origin_then_token(method, target, headers, verdict):
    """Each request gets the verdict of the first check it fails, in the documented order."""
    got = judge(RequestHead(method, target, "1.1", headers), loopback_policy())
    if isinstance(verdict, int):
        assert isinstance(got, Response)
        assert got.status == verdict
    else:
        assert got == verdict


def test_an_upgrade_over_http_1_0_is_malformed():
    """The WebSocket handshake is HTTP/1.1 only."""
    head = RequestHead("GET", "/acp", "1.0", (HOST, AUTHORIZED, *UPGRADE_HEADERS))
    assert judge(head, loopback_policy()) == plain(400, "malformed WebSocket upgrade")


# -- what goes on the wire -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}', True),
        ('{"jsonrpc":"2.0","id":1,"method":"session/new"}', False),
        ('[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', False),
        ("{not json", False),
        ('"initialize"', False),
    ],
)
def test_is_initialize(message, expected):
    """Only a JSON object whose method is initialize counts as the first message."""
    assert is_initialize(message) is expected


@pytest.mark.parametrize("sizes", [[0, 1, 125], [126, 65535], [65536, 70000, 2], [3] * 500])
def test_text_frames_are_what_a_websocket_client_reads_as_whole_text_messages(sizes):
    """Each queued line becomes one final, unmasked text frame (all three length forms),
    read back by wsproto's own frame parser as the same text, newline dropped."""
    from wsproto.frame_protocol import FrameProtocol, Opcode

    messages = [("é" * (n // 2) + "x" * (n % 2) + "\n").encode() for n in sizes]
    parser = FrameProtocol(client=True, extensions=[])
    parser.receive_bytes(text_frames(messages))
    frames = list(parser.received_frames())
    assert [f.opcode for f in frames] == [Opcode.TEXT] * len(sizes)
    assert all(f.frame_finished and f.message_finished for f in frames)
    assert [f.payload for f in frames] == [m[:-1].decode() for m in messages]


# -- start-up: bind policy (the token file: test_token.py) ---------------------------------------


@pytest.mark.parametrize(
    ("host", "allow_remote", "insecure", "tls", "ok"),
    [
        ("127.0.0.1", False, False, False, True),
        ("localhost", False, False, False, True),
        ("::1", False, False, False, True),
        ("127.0.0.2", False, False, False, True),
        ("0.0.0.0", False, False, False, False),
        ("0.0.0.0", True, False, False, False),
        ("0.0.0.0", True, True, False, True),
        ("0.0.0.0", True, False, True, True),
        ("192.0.2.1", False, True, True, False),
        ("example.org", True, False, False, False),
    ],
)
def test_bind_policy(host, allow_remote, insecure, tls, ok):
    """Non-loopback needs --allow-remote, and TLS or --insecure; loopback needs neither."""
    tls_files = {"tls_cert": "c.pem", "tls_key": "k.pem"} if tls else {}
    config = Config(agents={"a": AGENT}, websocket=WebSocketConfig(host=host, **tls_files))
    if ok:
        check_bind(config, allow_remote=allow_remote, insecure=insecure)
    else:
        with pytest.raises(ConfigError, match="not a loopback address"):
            check_bind(config, allow_remote=allow_remote, insecure=insecure)
