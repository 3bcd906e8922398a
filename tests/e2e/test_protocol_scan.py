"""
The tests of ``tests/protocol/test_scan.py`` that start other processes (kept here so that
``pytest tests/protocol`` runs in-process only).
"""

from __future__ import annotations

import os
import subprocess
import sys

from acp_bridge.protocol import scan


def test_pure_scan_selects_the_reference():
    code = (
        "from acp_bridge.protocol import scan as s; "
        "print(s.ACCELERATED, s.scan is s.scan_reference)"
    )
    for value, expect in (
        ("1", "False True"),
        ("0", f"{scan.scan_c is not None} {scan.scan_c is None}"),
    ):
        env = {**os.environ, "ACP_BRIDGE_PURE_SCAN": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == expect.split()
