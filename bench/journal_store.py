"""
The journal's store alone: CPU per entry of writing a flood, as the journal writes it.

    python -m bench.journal_store [--entries N] [--repeat R]

Writes ``--entries`` chat-sized updates of one session (about 200 bytes each) in commits of
5,000 (a 50 ms burst at 100k updates/s), as runs of up to ``RUN_MAX_BYTES`` (the rows the
journal writes), then checkpoints the WAL, and prints the CPU time (user + system) and the
wall time per entry. The store the bridge opens (``open_store``: the bytes in segment
files, ``fdatasync``\ed each commit, the index in SQLite) is measured side by side with the
layouts it is the alternative to (the bytes inline in SQLite rows, in a rowid or a WITHOUT
ROWID table, with 16 or 4 KiB pages), each in a fresh file in a temporary directory,
``--repeat`` times each (the least is the figure to go by).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from typing import TYPE_CHECKING

from acp_bridge.engine.journal import RUN_MAX_BYTES
from acp_bridge.store.db import MIGRATIONS, open_store

if TYPE_CHECKING:
    from collections.abc import Callable

LINE = (
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":'
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"chunk 000000 '
    b'lorem ipsum dolor sit amet"}}}}\n'
)
PER_COMMIT = 5_000

Row = tuple[str, int, int, int, float, bytes]


def runs(first_seq: int, count: int) -> list[Row]:
    """``count`` entries from ``first_seq`` as the journal's run rows."""
    per_row = RUN_MAX_BYTES // len(LINE)
    out: list[Row] = []
    for first in range(first_seq, first_seq + count, per_row):
        last = min(first + per_row, first_seq + count) - 1
        out.append(("s1", first, last, 1, time.time(), LINE * (last - first + 1)))
    return out


def _bridge_store(path: str) -> Callable[[list[Row]], None]:
    store = open_store(path)
    return lambda rows: store.write(journal_runs=rows)


def _older_store(page_size: int, migrations: int) -> Callable[[str], Callable[[list[Row]], None]]:
    def open_(path: str) -> Callable[[list[Row]], None]:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(f"PRAGMA page_size={page_size}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        for script in MIGRATIONS[:migrations]:
            conn.executescript(f"BEGIN;{script};COMMIT;")

        def write(rows: list[Row]) -> None:
            with conn:
                conn.executemany("INSERT OR REPLACE INTO journal VALUES (?,?,?,?,?,?)", rows)

        return write

    return open_


LAYOUTS: dict[str, Callable[[str], Callable[[list[Row]], None]]] = {
    "the bridge's store (open_store)": _bridge_store,
    "bytes inline, 16 KiB pages (before)": _older_store(16384, 6),
    "WITHOUT ROWID, 4 KiB pages": _older_store(4096, 3),
    "rowid table, 4 KiB pages": _older_store(4096, 4),
    "WITHOUT ROWID, 16 KiB pages": _older_store(16384, 3),
}


def measure(
    open_: Callable[[str], Callable[[list[Row]], None]], entries: int
) -> tuple[float, float]:
    """(CPU us, wall us) per entry of writing ``entries`` and checkpointing, in a fresh store."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "journal.db")
        write = open_(path)
        batches = [
            runs(first, min(PER_COMMIT, entries - first + 1))
            for first in range(1, entries + 1, PER_COMMIT)
        ]
        cpu, wall = time.process_time(), time.perf_counter()
        for rows in batches:
            write(rows)
        checkpoint = sqlite3.connect(path)
        checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (the deferred half of the cost)
        checkpoint.close()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / entries * 1e6, wall / entries * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{args.entries:,} entries of {len(LINE)} bytes, commits of {PER_COMMIT:,}")
    print(f"{'layout':40}  {'CPU us/entry':>12}  {'wall us/entry':>13}")
    for name, open_ in LAYOUTS.items():
        figures = [measure(open_, args.entries) for _ in range(args.repeat)]
        cpu = min(f[0] for f in figures)
        wall = min(f[1] for f in figures)
        print(f"{name:40}  {cpu:12.3f}  {wall:13.3f}")


if __name__ == "__main__":
    main()
