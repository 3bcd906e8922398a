"""
The bridge's SQLite store: the audit log of approval decisions (and, later, sessions and their
journal). Standard-library ``sqlite3``, WAL, one writer.

Pure of trio: the blocking calls live here; ``AuditLog`` below is the trio adapter that batches
records and writes them off the event loop.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import TYPE_CHECKING, Any, Final

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

#: The schema, one migration per version; ``PRAGMA user_version`` says which ran.
MIGRATIONS: Final[Sequence[str]] = (
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        session TEXT,
        agent TEXT,
        tool_call_id TEXT,
        title TEXT,
        kind TEXT,
        options TEXT NOT NULL,
        decision TEXT NOT NULL,
        option_id TEXT,
        source TEXT NOT NULL,
        connection TEXT,
        detail TEXT
    );
    """,
)


@attrs.frozen
class AuditRecord:
    """
    One decision about an agent's request (permission, file access, elicitation).

    Attributes:
        decision: what was answered: ``allow``, ``deny``, ``cancelled``, ``refused``...
        source: who decided: a rule id, ``client``, ``timeout``, ``cancel``, ``unattended``,
            ``grace``, ``agent_exit``, ``containment``, ``late_answer``...
    """

    session: str | None
    agent: str | None
    decision: str
    source: str
    tool_call_id: str | None = None
    title: str | None = None
    kind: str | None = None
    options: tuple[str, ...] = ()
    option_id: str | None = None
    connection: str | None = None
    detail: str | None = None
    time: float = attrs.field(factory=time.time)

    def as_row(self) -> tuple[Any, ...]:
        return (
            self.time,
            self.session,
            self.agent,
            self.tool_call_id,
            self.title,
            self.kind,
            json.dumps(list(self.options)),
            self.decision,
            self.option_id,
            self.source,
            self.connection,
            self.detail,
        )


_COLUMNS: Final = (
    "time, session, agent, tool_call_id, title, kind, options, decision, option_id, source, "
    "connection, detail"
)


class Store:
    """
    The database. Open with :func:`open_store`; every method blocks (call it off the event
    loop, e.g. through ``trio.to_thread``), and only one thread may write at a time.
    """

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self.path = path

    def close(self) -> None:
        self._conn.close()

    def append_audit(self, records: Iterable[AuditRecord]) -> None:
        """Append records in one transaction."""
        with self._conn:
            self._conn.executemany(
                f"INSERT INTO audit ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [r.as_row() for r in records],
            )

    def audit(self, *, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        """Audit records with an id above ``after_id``, oldest first."""
        cursor = self._conn.execute(
            f"SELECT id, {_COLUMNS} FROM audit WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit),
        )
        names = [d[0] for d in cursor.description]
        rows = []
        for row in cursor:
            record = dict(zip(names, row, strict=True))
            record["options"] = json.loads(record["options"])
            rows.append(record)
        return rows


def open_store(path: str) -> Store:
    """
    Open (creating if needed) the database at ``path`` (``":memory:"`` for a throwaway one) and
    bring its schema up to date.
    """
    try:
        return _open(path)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open the store {path}: {exc}") from None


def _open(path: str) -> Store:
    if path != ":memory:":
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.isolation_level = "DEFERRED"
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version > len(MIGRATIONS):
        conn.close()
        raise StoreError(
            f"{path}: schema version {version} is newer than this acp-bridge knows "
            f"({len(MIGRATIONS)})"
        )
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        with conn:
            conn.executescript(f"BEGIN;{script};PRAGMA user_version={number};COMMIT;")
    return Store(conn, path)


class StoreError(Exception):
    pass


def format_audit(record: dict[str, Any]) -> str:
    """One audit record as a line a person reads."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["time"]))
    what = record["title"] or record["kind"] or "request"
    chosen = f" ({record['option_id']})" if record.get("option_id") else ""
    parts = [
        stamp,
        f"{record['decision'].upper():9}",
        f"by {record['source']}",
        f"agent={record['agent']}",
        f"session={record['session']}",
        f"{what!r}{chosen}",
    ]
    if record.get("detail"):
        parts.append(f"— {record['detail']}")
    return "  ".join(parts)


def follow(store: Store, *, poll: float = 0.5) -> Iterator[dict[str, Any]]:
    """Yield audit records as they are written (a CLI helper; polls the database)."""
    last = 0
    while True:
        rows = store.audit(after_id=last)
        yield from rows
        if rows:
            last = rows[-1]["id"]
        else:
            time.sleep(poll)
