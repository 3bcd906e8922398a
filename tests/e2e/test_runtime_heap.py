"""
The tests of ``tests/runtime/test_heap.py`` that start other processes (kept here so that
``pytest tests/runtime`` runs in-process only).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from acp_bridge.runtime import heap
from tests.runtime.test_heap import _LARGE_BLOCK_MAPPED, glibc


@glibc
@pytest.mark.parametrize(("mode", "mapped"), [("fix", 1), ("glibc-default", 0)])
def test_a_fixed_mmap_threshold_keeps_large_blocks_out_of_the_heap(mode, mapped):
    """
    After a 4 MiB block is freed, glibc on its own carves a 512 KiB block from the heap (the
    control); with the threshold fixed, the block gets its own mapping. A fresh interpreter
    each: the setting is for the process.
    """
    if heap._mallinfo2() is None:
        pytest.skip("mallinfo2 is glibc 2.33's")
    run = subprocess.run(
        [sys.executable, "-c", _LARGE_BLOCK_MAPPED, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert int(run.stdout) == mapped
