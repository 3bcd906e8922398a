from __future__ import annotations

import pathlib
import sys

import pytest

from acp_bridge.observe.log import configure_logging, reset_logging


@pytest.fixture(autouse=True)
def _logs_to_stderr():
    """Bridge logs go to stderr (captured by pytest), never stdout, as in production."""
    configure_logging(level="debug", fmt="json", stream=sys.stderr)
    yield
    reset_logging()


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory, monkeypatch):
    """Every test (and every process it starts) keeps its store and token in its own place."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


#: Markers set by folder: ``pytest -m "not e2e"`` runs what needs no other process.
FOLDER_MARKERS = {
    "e2e": ("e2e",),
    "interop": ("e2e", "interop"),
    "fuzz": ("fuzz",),
}


def pytest_collection_modifyitems(config, items):
    root = pathlib.Path(__file__).parent
    for item in items:
        try:
            folder = item.path.relative_to(root).parts[0]
        except ValueError:
            continue
        for marker in FOLDER_MARKERS.get(folder, ()):
            item.add_marker(marker)
