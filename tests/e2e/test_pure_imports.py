"""
The pure modules, each imported alone in a fresh interpreter, load no trio: the static fence
of tests/test_architecture.py, checked at run time too (a lazy or dynamic import shows here).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_architecture import pure_modules

#: ``faces.status`` is pure besides the fence's globs: ``acp-bridge status`` must start quickly.
MODULES = [*pure_modules(), "faces.status"]


@pytest.mark.parametrize("module", MODULES)
def test_a_pure_module_loads_no_trio(module):
    code = (
        f"import sys, acp_bridge.{module}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'trio_websocket'))\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
