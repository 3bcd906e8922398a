"""
The build's one piece that pyproject.toml cannot say: the optional C extension.

``acp_bridge.protocol.scanc`` (the line scanner, issue 23 item 1) is compiled at install time when a C
compiler and the Python headers are there; ``optional=True`` makes a failed compile a warning,
not a failed install, and ``acp_bridge.protocol.scan`` then uses its pure-Python reference. Everything
else (metadata, the script, the package data) is in pyproject.toml.
"""

from __future__ import annotations

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "acp_bridge.protocol.scanc",
            sources=["acp_bridge/protocol/scanc.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
