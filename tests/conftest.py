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
