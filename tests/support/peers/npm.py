"""Where the npm test peers are: pinned in ``tests/support/peers/node``, in ``.node-peers``.

``./scripts/test`` installs them (``scripts/_node_peers.sh``) wherever node and npm are on
PATH, and stops if that install fails; a test that needs a peer calls :func:`npm_peer_bin`,
which skips the test with the reason when the peer cannot run here. See docs/interop.md.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: The committed pins: package.json (exact versions) and its package-lock.json.
SOURCE = Path(__file__).resolve().with_name("node")
#: Where scripts/_node_peers.sh installs them (gitignored).
INSTALL = ROOT / ".node-peers"
#: Written by scripts/_node_peers.sh after a successful install: the digest of the pins.
STAMP = INSTALL / ".acp-bridge-installed"


def pinned_dependencies() -> dict[str, str]:
    """Package name -> exact version, from tests/support/peers/node/package.json."""
    deps: dict[str, str] = json.loads((SOURCE / "package.json").read_text())["dependencies"]
    return deps


def pins_digest() -> str:
    """What the stamp holds when the install matches the pins (as ``cat ... | sha256sum``)."""
    data = (SOURCE / "package.json").read_bytes() + (SOURCE / "package-lock.json").read_bytes()
    return hashlib.sha256(data).hexdigest()


def npm_peer_dir(package: str) -> Path:
    """
    Where npm peer ``package`` is installed (its directory under ``node_modules``).

    Skips the calling test, saying what is missing, when node is not on PATH or the peers are
    not installed (or installed from other pins): run ``./scripts/test`` once to install them.
    Fails when the install is stamped good but the package is not there at its pinned version.
    """
    version = pinned_dependencies().get(package)
    if version is None:
        raise ValueError(f"{package} is not pinned in {SOURCE / 'package.json'}")
    if shutil.which("node") is None:
        pytest.skip(f"node is not on PATH, so the npm test peer {package} {version} cannot run")
    stamp = STAMP.read_text().strip() if STAMP.is_file() else None
    if stamp != pins_digest():
        state = "not installed" if stamp is None else "installed from other pins"
        pytest.skip(
            f"the npm test peers are {state} in {INSTALL.name}/ "
            f"(run ./scripts/test, which installs {package} {version})"
        )
    where = INSTALL / "node_modules" / package
    installed = json.loads((where / "package.json").read_text())["version"]
    assert installed == version, f"{package} {installed} installed, {version} pinned"
    return where


def npm_peer_bin(package: str, command: str | None = None) -> Path:
    """
    The installed executable ``command`` (default: the package's name) of npm peer ``package``.

    Skips or fails as :func:`npm_peer_dir`; fails too when the executable is not there.
    """
    npm_peer_dir(package)
    version = pinned_dependencies()[package]
    path = INSTALL / "node_modules" / ".bin" / (command or package)
    assert path.is_file(), f"{package} {version} is installed but has no {path.name} executable"
    return path
