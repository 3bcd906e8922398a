"""The npm test peers stay pinned, and a test that cannot have its peer says why it skips."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.peers import npm

_EXACT = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$")


def _lock() -> dict[str, dict[str, object]]:
    packages: dict[str, dict[str, object]] = json.loads(
        (npm.SOURCE / "package-lock.json").read_text()
    )["packages"]
    return packages


def test_every_peer_is_pinned_to_an_exact_version():
    deps = npm.pinned_dependencies()
    assert deps
    assert {name: v for name, v in deps.items() if not _EXACT.match(v)} == {}


def test_the_lock_matches_the_pins():
    """scripts/lock-node-peers was run after the last change to package.json."""
    packages = _lock()
    assert packages[""].get("dependencies") == npm.pinned_dependencies()
    for name, version in npm.pinned_dependencies().items():
        assert packages[f"node_modules/{name}"]["version"] == version


def test_the_lock_pins_every_package_by_hash_and_names_no_registry():
    """The committed lock installs from whatever registry npm is set up with."""
    text = (npm.SOURCE / "package-lock.json").read_text()
    assert "registry" not in text.lower()
    for path, entry in _lock().items():
        if path:
            assert "resolved" not in entry, path
            assert str(entry.get("integrity", "")).startswith("sha512-"), path


def test_a_peer_without_node_skips_naming_node(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(pytest.skip.Exception, match=r"node is not on PATH.* acpx "):
        npm.npm_peer_bin("acpx")


@pytest.mark.parametrize(
    ("stamp", "state"), [(None, "not installed"), ("0" * 64, "installed from other pins")]
)
def test_a_peer_not_installed_from_these_pins_skips_saying_how_to_install(
    tmp_path, monkeypatch, stamp, state
):
    monkeypatch.setattr(npm, "STAMP", tmp_path / "stamp")
    if stamp is not None:
        npm.STAMP.write_text(stamp + "\n")
    monkeypatch.setattr(npm.shutil, "which", lambda _: "node")
    with pytest.raises(pytest.skip.Exception, match=rf"{state}.*run \./scripts/test"):
        npm.npm_peer_bin("acpx")


def test_an_unpinned_peer_is_a_mistake_in_the_test():
    with pytest.raises(ValueError, match="not pinned"):
        npm.npm_peer_bin("no-such-peer")
