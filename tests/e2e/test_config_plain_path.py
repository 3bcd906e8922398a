"""
The tests of ``tests/config/test_plain_path.py`` that start other processes (kept here so that
``pytest tests/config`` runs in-process only).
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_loading_a_plain_config_does_not_load_cattrs(tmp_path):
    """What ``acp-bridge stdio --config FILE`` pays before it can answer: no cattrs."""
    path = tmp_path / "c.toml"
    path.write_text('[agents.demo]\ncommand = "acp-bridge"\nargs = ["demo-agent"]\n')
    code = (
        "import json, sys\n"
        "from acp_bridge.config.model import load_config\n"
        "config = load_config(sys.argv[1])\n"
        "print(json.dumps([config.default_agent.name, sorted(sys.modules)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, check=True, timeout=60
    )
    name, modules = json.loads(out.stdout)
    assert name == "demo"
    assert [
        m for m in modules if m.split(".")[0] in ("cattrs", "acp_bridge.config.structure")
    ] == []
