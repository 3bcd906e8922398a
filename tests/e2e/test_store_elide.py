"""
The tests of ``tests/store/test_elide.py`` that start other processes (kept here so that
``pytest tests/store`` runs in-process only).
"""

from __future__ import annotations

import os
import subprocess
import sys

from acp_bridge.store import elide


def test_pure_scan_stores_runs_as_they_are_and_restores_with_the_reference():
    code = (
        "from acp_bridge.store import elide as e; "
        "print(e.ACCELERATED, e.elide(b'abcdef\\nabcxyz\\n') is None, "
        "e.restore is e.restore_reference)"
    )
    for value, expect in (
        ("1", "False True True"),
        ("0", f"{elide.elide_c is not None} {elide.elide_c is None} {elide.elide_c is None}"),
    ):
        env = {**os.environ, "ACP_BRIDGE_PURE_SCAN": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == expect.split()
