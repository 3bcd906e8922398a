# The C line scanner (acp_bridge/_scanc.c); acp_bridge._scan is its interface and its docs.
from typing import Any

def scan(
    block: bytes, max_line: int, setup_kinds: tuple[bytes, ...], max_run: int = ..., /
) -> list[tuple[Any, ...]]: ...
