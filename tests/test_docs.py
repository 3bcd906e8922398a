"""The README's examples stay true: its TOML parses with the project's own parsers."""

from __future__ import annotations

import pathlib
import re
import tomllib

import pytest

from acp_bridge._config import parse_config, parse_policy

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_toml_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("block", BLOCKS)
def test_readme_toml_examples_parse(block):
    data = tomllib.loads(block)
    if "agents" in data:
        parse_config(data, source="README.md")
    if "policy" in data:
        _, problems = parse_policy(data["policy"])
        assert problems == []
