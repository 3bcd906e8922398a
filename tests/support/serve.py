"""``acp-bridge serve`` as a real process, for the end-to-end and interop tests: a config with
the demo agent, the daemon started and its URL read off its stderr, stopped on the way out."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path

#: stderr kept for the test to read, at most (the rest is drained and let go)
STDERR_KEPT = 1024 * 1024


@attrs.define
class Stderr:
    """What the daemon wrote on stderr so far (its first STDERR_KEPT bytes); ``ended`` at EOF."""

    data: bytearray = attrs.field(factory=bytearray)
    ended: trio.Event = attrs.field(factory=trio.Event)
    _grew: trio.Event = attrs.field(factory=trio.Event)

    async def read(self, stream: trio.abc.ReceiveStream) -> None:
        while chunk := await stream.receive_some(65536):
            if len(self.data) < STDERR_KEPT:
                self.data += chunk
            self._grew.set()
            self._grew = trio.Event()
        self.ended.set()
        self._grew.set()

    async def wait_for(self, pattern: bytes) -> re.Match[bytes]:
        """The first match of ``pattern`` once it has been written (fails at EOF without one)."""
        while (m := re.search(pattern, self.data)) is None:
            assert not self.ended.is_set(), self.data.decode(errors="replace")
            await self._grew.wait()
        return m

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")


@attrs.frozen
class Served:
    """A running ``serve``: its process, config, environment, port and token."""

    proc: trio.Process
    config: Path
    env: dict[str, str]
    url: str
    stderr: Stderr

    @property
    def port(self) -> int:
        return port_of(self.url)

    @property
    def token(self) -> str:
        return (self.config.parent / "token").read_text().strip()


def demo_config(
    tmp_path: Path, *, demo_args: Sequence[str] = (), more: str = "", token: str | None = None
) -> Path:
    """``serve.toml``: the demo agent (with ``demo_args``), WebSocket on a free port, the
    token in a ``token`` file beside it (or ``token`` itself), an in-memory store; ``more``
    appended (other agents...)."""
    config = tmp_path / "serve.toml"
    args = ["-m", "acp_bridge", "demo-agent", *demo_args]
    secret = f"token = {json.dumps(token)}" if token is not None else 'token_file = "token"'
    config.write_text(
        f"[agents.demo]\ncommand = {json.dumps(sys.executable)}\nargs = {json.dumps(args)}\n"
        f'{more}[websocket]\nport = 0\n{secret}\n[store]\npath = ":memory:"\n'
    )
    return config


@contextlib.asynccontextmanager
async def serve_process(
    tmp_path: Path,
    *options: str,
    demo_args: Sequence[str] = (),
    more: str = "",
    token: str | None = None,
) -> AsyncIterator[Served]:
    """
    ``acp-bridge serve`` on :func:`demo_config` (with ``options``), once it printed where it
    listens; its stderr read all along (a full pipe would stall it). On the way out it is
    killed if it still runs (a test that wants a clean stop sends SIGTERM itself).
    """
    config = demo_config(tmp_path, demo_args=demo_args, more=more, token=token)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    argv = [sys.executable, "-m", "acp_bridge", "serve", "--config", str(config), *options]
    async with trio.open_nursery() as nursery:
        proc, url, stderr = await start_serve(nursery, argv, env)
        try:
            yield Served(proc, config, env, url, stderr)
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
            nursery.cancel_scope.cancel()  # (the stderr reader: cancelled already, if we are)


async def start_serve(
    nursery: trio.Nursery, argv: list[str], env: dict[str, str]
) -> tuple[trio.Process, str, Stderr]:
    """
    Start ``acp-bridge serve`` (``argv``) and wait for the WebSocket URL it prints on stderr,
    which is read in ``nursery`` until its end. Stopping the process is the caller's.
    """
    proc = await trio.lowlevel.open_process(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    assert proc.stderr is not None
    stderr = Stderr()
    nursery.start_soon(stderr.read, proc.stderr)
    m = await stderr.wait_for(rb"listening on (ws://\S+)")
    return proc, m.group(1).decode(), stderr


def port_of(url: str) -> int:
    """The port of a loopback ``ws://127.0.0.1:PORT/...`` URL ``serve`` printed."""
    m = re.match(r"ws://127\.0\.0\.1:(\d+)/", url)
    assert m is not None, url
    return int(m.group(1))


async def make_certificate(tmp_path: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1 (``openssl``; the test is skipped without it):
    its file, its key's, and a client context that trusts it."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    argv = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    argv += f" -keyout {key} -out {cert} -days 1 -subj /CN=x -addext subjectAltName=IP:127.0.0.1"
    await trio.run_process(argv.split(), capture_stdout=True, capture_stderr=True)
    return cert, key, ssl.create_default_context(cafile=str(cert))
