"""
The bridge's peers in the benchmark: other programs that sit between an ACP client and an agent.

- supergateway (npm ``supergateway``): an MCP gateway whose stdio→WebSocket mode relays each of
  the agent's stdout lines as one WebSocket text message and each message back as a line, so
  it is a plain stdio↔WebSocket relay for any NDJSON protocol, ACP included (it rewrites the
  request ids to route answers to the right client and back; notifications are broadcast);
- the thinkwell conductor (npm ``@thinkwell/conductor``): an ACP proxy chain, run here with no
  proxies in front of the agent (``bench/conductor_stdio.mjs``: the package has no command);
- the TypeScript SDK's own Streamable HTTP server (npm ``@agentclientprotocol/sdk``:
  ``AcpServer`` behind ``createNodeHttpHandler``) relaying to the agent
  (``bench/acp_server.mjs``): the anchor of the bridge's HTTP face.

Both are pinned in ``tests/support/peers/node/package.json`` and installed into ``.node-peers/`` by
``./scripts/bench`` and ``./scripts/test``. A peer that is not there cannot be measured:
:func:`peer_argv` raises :class:`PeerUnavailable` saying why, and the table says so.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tests" / "support" / "peers" / "node" / "package.json"
NODE_MODULES = ROOT / ".node-peers" / "node_modules"
CONDUCTOR_MAIN = Path(__file__).with_name("conductor_stdio.mjs")
ACP_SERVER_MAIN = Path(__file__).with_name("acp_server.mjs")

SUPERGATEWAY = "supergateway"
CONDUCTOR = "@thinkwell/conductor"
SDK = "@agentclientprotocol/sdk"
#: how acp_server.mjs says where it listens (on stderr)
ACP_SERVER_MARKER = "acp-server listening on "
#: where supergateway serves WebSocket clients (its --messagePath default)
SUPERGATEWAY_PATH = "/message"


class PeerUnavailable(Exception):
    """A peer cannot run here: node is missing, or the pinned package is not installed."""


def pinned(package: str) -> str:
    """The version ``package`` is pinned at (``tests/support/peers/node/package.json``)."""
    deps: dict[str, str] = json.loads(PINS.read_text())["dependencies"]
    return deps[package]


def label(package: str) -> str:
    name = {CONDUCTOR: "thinkwell conductor", SDK: "TS SDK"}.get(package, package)
    return f"{name} {pinned(package)}"


def package_dir(package: str) -> Path:
    """The installed, pinned ``package``; :class:`PeerUnavailable` otherwise."""
    version = pinned(package)
    if shutil.which("node") is None:
        raise PeerUnavailable("node is not on PATH")
    where = NODE_MODULES / package
    try:
        installed = json.loads((where / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        raise PeerUnavailable(
            f"{package} {version} is not installed in .node-peers/ "
            "(./scripts/bench installs the pinned npm peers when npm is there)"
        ) from None
    if installed != version:
        raise PeerUnavailable(f"{package} {installed} is installed, {version} is pinned")
    return where


def supergateway_argv(agent: list[str], port: int) -> list[str]:
    """supergateway in stdio→WebSocket mode in front of ``agent``, quiet, on ``port``."""
    package_dir(SUPERGATEWAY)
    program = NODE_MODULES / ".bin" / "supergateway"
    # --stdio is run by a shell; --logLevel none: at "info" it logs every message it relays.
    return [
        str(program),
        "--stdio",
        shlex.join(agent),
        "--outputTransport",
        "ws",
        "--port",
        str(port),
        "--logLevel",
        "none",
    ]


def conductor_argv(agent: list[str]) -> list[str]:
    """The thinkwell conductor on stdio, no proxies, in front of ``agent``."""
    where = package_dir(CONDUCTOR)
    node = shutil.which("node")
    assert node is not None  # package_dir checked it
    return [node, str(CONDUCTOR_MAIN), str(where), json.dumps(agent)]


def acp_server_argv(agent: list[str]) -> list[str]:
    """The TypeScript SDK's AcpServer over Streamable HTTP, in front of ``agent``."""
    where = package_dir(SDK)
    node = shutil.which("node")
    assert node is not None  # package_dir checked it
    return [node, str(ACP_SERVER_MAIN), str(where), json.dumps(agent)]


def free_port() -> int:
    """A loopback port nothing listens on now (supergateway cannot be told to pick one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(port: int, deadline: float, alive: Callable[[], bool]) -> None:
    """Until something accepts on 127.0.0.1:``port``; ``alive()`` false means it died."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if not alive():
                raise RuntimeError("exited before it listened") from None
            time.sleep(0.02)
    raise RuntimeError(f"nothing listened on port {port} in time")
