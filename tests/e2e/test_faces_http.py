"""
ACP over HTTP with real processes and sockets: the daemon's banner and ``acp-bridge status``
name the HTTP connection, and the HTTP half speaks TLS where the WebSocket half does.
"""

from __future__ import annotations

import json
import re
import sys

import h11
import pytest
import trio

from tests.faces.test_http_acp import new_session, prompt, texts
from tests.faces.test_ws import NEW_SESSION, TIMEOUT, TOKEN, open_server
from tests.support.fakes import FakeAgent
from tests.support.http_acp import HttpAcpClient, opened, tcp, tls
from tests.support.serve import make_certificate, serve_process


async def test_serve_prints_the_http_url_and_status_shows_an_http_connection(tmp_path):
    with trio.fail_after(30):
        async with serve_process(tmp_path, demo_args=["--chunk-delay", "0"]) as served:
            m = await served.stderr.wait_for(rb"  http:    (http://127\.0\.0\.1:(\d+)/acp) ")
            port = int(m.group(2))
            assert port == served.port
            client = HttpAcpClient(tcp(port), host=f"127.0.0.1:{port}", token=served.token)
            await client.initialize()
            async with opened(client.events()) as events:
                sid = await new_session(client, events)
                status_argv = [sys.executable, "-m", "acp_bridge", "status"]
                status_argv += ["--config", str(served.config)]
                status_argv += ["--url", f"http://127.0.0.1:{port}"]
                shown = await trio.run_process(
                    status_argv, capture_stdout=True, capture_stderr=True, env=served.env
                )
                text = shown.stdout.decode()
                session = next(line for line in text.splitlines() if sid in line)
                assert re.search(r"connection http:[0-9a-f]{8}", session)
                assert re.search(r"^  http:[0-9a-f]{8}\s+http\s+queue", text, flags=re.M)
                as_json = await trio.run_process(
                    [*status_argv, "--json"],
                    capture_stdout=True,
                    capture_stderr=True,
                    env=served.env,
                )
                [connection] = json.loads(as_json.stdout)["connections"]
                assert connection["transport"] == "http"
            assert (await client.delete()).status == 202
            served.proc.terminate()
            assert await served.proc.wait() == 0


async def test_the_http_half_speaks_tls_where_the_websocket_half_does(tmp_path):
    cert, key, context = await make_certificate(tmp_path)
    agent = FakeAgent("a")
    with trio.fail_after(TIMEOUT):
        async with open_server({"a": agent}, tls_cert=str(cert), tls_key=str(key)) as server:
            port = server.port
            assert server.info.http_url == f"https://127.0.0.1:{port}/acp"
            client = HttpAcpClient(tls(port, context), host=f"127.0.0.1:{port}", token=TOKEN)
            reply = await client.initialize()
            assert "Secure" in reply.headers["set-cookie"]
            async with opened(client.events()) as events:
                sid = await new_session(client, events)
                async with opened(client.events(session=sid)) as session_events:
                    msg = prompt(client, sid, "count 3")
                    await client.post(msg, session=sid)
                    seen = await session_events.until(lambda m: m.get("id") == msg["id"])
            assert texts(seen) == ["a:s1:0", "a:s1:1", "a:s1:2"]
            # Plain HTTP to the TLS port is not served.
            plain = HttpAcpClient(tcp(port), host=f"127.0.0.1:{port}", token=TOKEN)
            refused = (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError)
            with pytest.raises(refused):
                await plain.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", **NEW_SESSION})
