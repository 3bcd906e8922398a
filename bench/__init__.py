"""
The project's benchmark (``./scripts/bench``): a flood agent, a minimal ACP client, scenarios.

Not part of the ``acp_bridge`` package and not a test: it measures the bridge against a direct
client-agent pipe on the same machine and reports (``python -m bench.run --help``).
"""
