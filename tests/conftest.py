from __future__ import annotations

import sys

import pytest

from acp_bridge._log import configure_logging, reset_logging


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
