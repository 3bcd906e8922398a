"""
The tests of ``tests/faces/test_ws.py`` that start other processes (kept here so that
``pytest tests/faces`` runs in-process only).
"""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
import sys

import trio
import trio.testing
import trio_websocket

from tests.faces.test_ws import (
    AUTH_HEADERS,
    NEW_SESSION,
    TIMEOUT,
    WsPeer,
    get_request,
    http_exchange,
    open_server,
)
from tests.support.fakes import FakeAgent
from tests.support.serve import make_certificate, serve_process


async def test_tls_listener_serves_wss_and_health(tmp_path):
    """With tls_cert/tls_key the same checks run inside TLS; the URL says wss://."""
    cert, key, context = await make_certificate(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with open_server(
            {"a": FakeAgent("a")}, tls_cert=str(cert), tls_key=str(key)
        ) as server:
            port = server.port
            assert server.info.url == f"wss://127.0.0.1:{port}/acp"
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=context)
            async with stream:
                # Without a port, Host means 443 under TLS: refused like any foreign Host.
                await stream.send_all(get_request(port, "/healthz", host="127.0.0.1"))
                data = b""
                while chunk := await stream.receive_some(65536):
                    data += chunk
                assert data.startswith(b"HTTP/1.1 403 ")
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=context)
            async with stream, trio.open_nursery() as nursery:
                ws = await trio_websocket.wrap_client_stream(
                    nursery, stream, f"127.0.0.1:{port}", "/acp", extra_headers=AUTH_HEADERS
                )
                peer = WsPeer(ws)
                await peer.initialize()
                assert "sessionId" in (await peer.request("session/new", NEW_SESSION))["result"]
                await ws.aclose()
                nursery.cancel_scope.cancel()


def test_serve_refuses_a_remote_bind_without_the_flag(tmp_path):
    """`serve` exits 2 with a hint instead of listening beyond loopback unasked."""
    config = tmp_path / "c.toml"
    config.write_text('[agents.a]\ncommand = "x"\n[websocket]\nhost = "0.0.0.0"\ntoken = "t"\n')
    result = subprocess.run(
        [sys.executable, "-m", "acp_bridge", "serve", "--config", str(config)],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 2
    assert b"--allow-remote" in result.stderr


async def test_serve_process_answers_healthz_and_stops_on_sigterm(tmp_path):
    """The real daemon on port 0 reports its URL, answers /healthz 200, exits 0 on SIGTERM."""
    with trio.fail_after(30):
        async with serve_process(tmp_path) as served:
            assert re.fullmatch(r"ws://127\.0\.0\.1:\d+/acp", served.url)
            port = served.port
            response = await http_exchange(port, get_request(port, "/healthz"))
            assert response.status == 200
            assert json.loads(response.body)["agents"]["demo"]["state"] == "ready"
            token_file = tmp_path / "token"
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            served.proc.send_signal(signal.SIGTERM)
            assert await served.proc.wait() == 0


async def test_serve_without_a_terminal_never_writes_the_token_to_stderr(tmp_path):
    """The daemon's stderr is a pipe here (a log, a journal): its summary names the console
    and where the token is, never the token itself, and nothing else it writes does."""
    with trio.fail_after(30):
        async with serve_process(tmp_path) as served:
            # The summary ends with the editor entry's closing brace, alone on its line.
            await served.stderr.wait_for(rb"(?s)agent_servers.*\n    \}\n")
            port = served.port
            # A request that fails the token check is logged too: still no token.
            response = await http_exchange(port, get_request(port, "/status"))
            assert response.status == 401
            served.proc.send_signal(signal.SIGTERM)
            assert await served.proc.wait() == 0
            await served.stderr.ended.wait()
            text = served.stderr.text
    token = (tmp_path / "token").read_text().strip()
    assert len(token) > 20
    assert token not in text
    assert f"console: http://127.0.0.1:{port}/console (approvals; log in with" in text
    assert f"the token in {tmp_path / 'token'})" in text
