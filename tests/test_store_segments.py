"""The journal's bytes in segment files (``_segments``), indexed by the store's rows."""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from acp_bridge import _segments, _store
from acp_bridge._journal import Journal
from acp_bridge._segments import Segments
from acp_bridge._store import JournalEntry, SessionRow, open_store

from .test_durable import history, record


def run(session: str, first: int, count: int, text: bytes = b"u") -> tuple:
    """A journal row of ``count`` entries from ``first``."""
    data = b"".join(b"%s%d\n" % (text, seq) for seq in range(first, first + count))
    return (session, first, first + count - 1, 1, 1.0, data)


def seqs(store, session: str) -> list[tuple[int, bytes]]:
    return [(e.seq, e.data) for e in store.journal(session)]


def index(store) -> list[tuple]:
    return store._conn.execute(
        "SELECT session, first_seq, segment, position, length, length(data) FROM journal "
        "ORDER BY segment, position"
    ).fetchall()


def test_segments_rotate_when_full_and_a_reopened_writer_goes_on_in_the_newest(tmp_path):
    segments = Segments(str(tmp_path / "j"), max_bytes=10)
    assert segments.numbers() == []
    assert segments.append([b"abc", b"defg"]) == (1, 0)
    assert segments.append([b"hijk"]) == (1, 7)  # (7 bytes: not full yet)
    assert segments.append([b"l"]) == (2, 0)  # 11 bytes: full, the next one starts
    segments.close()
    again = Segments(str(tmp_path / "j"), max_bytes=10)
    assert again.append([b"mn"]) == (2, 1)
    assert again.numbers() == [1, 2]
    with again.reading() as read:
        assert read(1, 3, 8) == b"defghijk"
        assert read(2, 0, 3) == b"lmn"
        assert read(2, 1, 5) is None  # (past the end: never trusted)
        assert read(7, 0, 1) is None  # (no such file)
    again.close()
    assert oct(os.stat(tmp_path / "j").st_mode & 0o777) == "0o700"
    assert oct(os.stat(segments.path(1)).st_mode & 0o777) == "0o600"


def test_a_short_write_is_completed(tmp_path, monkeypatch):
    writev = os.writev
    monkeypatch.setattr(_segments.os, "writev", lambda fd, bufs: writev(fd, [bytes(bufs[0])[:3]]))
    segments = Segments(str(tmp_path / "j"))
    blobs = [b"first run\n", b"", b"second\n", b"x" * 20]
    assert segments.append(blobs) == (1, 0)
    assert segments.append([b"then"]) == (1, 37)
    with segments.reading() as read:
        assert read(1, 0, 41) == b"".join(blobs) + b"then"
    segments.close()


def test_the_store_writes_bytes_to_segments_rotates_and_reads_them_after_a_restart(tmp_path):
    path = str(tmp_path / "b.db")
    store = open_store(path)
    assert store.segments is not None
    store.segments.max_bytes = 30
    store.write(journal_runs=[run("s1", 1, 3), run("s2", 1, 2)])  # 9 + 6 bytes: segment 1
    store.write(journal=[JournalEntry("s1", 4, b"prompt\n", live=False)])  # 22: still 1
    store.write(journal_runs=[run("s1", 5, 4, b"x")])  # 30: full, so this went to 1 too
    store.write(journal_runs=[run("s2", 3, 1)])  # segment 2
    assert index(store) == [
        ("s1", 1, 1, 0, 9, 0),
        ("s2", 1, 1, 9, 6, 0),
        ("s1", 4, 1, 15, 7, 0),
        ("s1", 5, 1, 22, 12, 0),
        ("s2", 3, 2, 0, 3, 0),
    ]  # (no byte of the journal in SQLite)
    expected = [(1, b"u1\n"), (2, b"u2\n"), (3, b"u3\n"), (4, b"prompt\n")]
    expected += [(seq, b"x%d\n" % seq) for seq in range(5, 9)]
    assert seqs(store, "s1") == expected
    store.close()
    store = open_store(path)
    assert seqs(store, "s1") == expected
    assert [e.live for e in store.journal("s1", after_seq=3, limit=2)] == [False, True]
    assert seqs(store, "s2") == [(1, b"u1\n"), (2, b"u2\n"), (3, b"u3\n")]
    assert store.journal_bounds("s2") == (1, 3)
    assert sorted(os.listdir(path + ".journal")) == ["000001.seg", "000002.seg"]
    store.close()


def test_bytes_a_crash_left_without_an_index_row_are_ignored_and_writing_goes_on(tmp_path):
    """A crash between the segment write and the commit of its index rows: what the write
    left (whole or torn) is after the last indexed run; nothing reads it, the next runs go
    after it."""
    path = str(tmp_path / "b.db")
    store = open_store(path)
    store.write(journal_runs=[run("s1", 1, 2)])
    store.segments.append([b"u3\nu4\n", b"u5"])  # (written, never indexed: the crash)
    store.close()
    store = open_store(path)
    assert seqs(store, "s1") == [(1, b"u1\n"), (2, b"u2\n")]
    store.write(journal_runs=[run("s1", 3, 2, b"v")])
    assert seqs(store, "s1") == [(1, b"u1\n"), (2, b"u2\n"), (3, b"v3\n"), (4, b"v4\n")]
    assert index(store)[-1] == ("s1", 3, 1, 14, 6, 0)
    store.close()


def test_the_segment_is_synced_before_the_index_rows_are_committed(tmp_path, monkeypatch):
    path = str(tmp_path / "b.db")
    store = open_store(path)
    rows_at_sync = []

    def fdatasync(fd: int) -> None:
        with sqlite3.connect(path) as other:
            rows_at_sync.append(other.execute("SELECT COUNT(*) FROM journal").fetchone()[0])

    monkeypatch.setattr(_segments.os, "fdatasync", fdatasync)
    store.write(journal_runs=[run("s1", 1, 2)])
    store.write(journal_runs=[run("s1", 3, 2)])
    assert rows_at_sync == [0, 1]
    store.close()


def test_rows_of_the_inline_layout_are_read_after_the_migration_beside_new_ones(tmp_path):
    path = str(tmp_path / "v6.db")
    conn = sqlite3.connect(path)
    for number, script in enumerate(_store.MIGRATIONS[:6], start=1):
        conn.executescript(f"BEGIN;{script};PRAGMA user_version={number};COMMIT;")
    conn.executemany("INSERT INTO journal VALUES (?,?,?,?,?,?)", [run("s1", 1, 3), run("s2", 1, 1)])
    conn.commit()
    conn.close()
    store = open_store(path)
    assert store._conn.execute("PRAGMA user_version").fetchone() == (len(_store.MIGRATIONS),)
    store.write(journal_runs=[run("s1", 4, 2, b"n")])
    assert seqs(store, "s1") == [
        (1, b"u1\n"),
        (2, b"u2\n"),
        (3, b"u3\n"),
        (4, b"n4\n"),
        (5, b"n5\n"),
    ]
    assert [e.seq for e in store.journal("s1", after_seq=2)] == [3, 4, 5]
    assert store.trim_journal(keep_entries=2) == 3  # (the inline run goes like any other)
    assert seqs(store, "s1") == [(4, b"n4\n"), (5, b"n5\n")]
    assert seqs(store, "s2") == [(1, b"u1\n")]
    store.close()


def test_a_segment_file_goes_once_no_row_points_into_it_and_never_the_newest(tmp_path):
    path = str(tmp_path / "b.db")
    store = open_store(path)
    store.segments.max_bytes = 1  # (a segment per commit)
    store.write(sessions=[SessionRow("s1", "a", "s1"), SessionRow("s2", "a", "s2")])
    store.write(journal_runs=[run("s1", 1, 2), run("s2", 1, 2)])  # 1: both sessions
    store.write(journal_runs=[run("s2", 3, 2)])  # 2
    store.write(journal_runs=[run("s1", 3, 2)])  # 3
    store.write(journal_runs=[run("s1", 5, 2)])  # 4
    files = lambda: sorted(os.listdir(path + ".journal"))  # noqa: E731
    assert files() == ["000001.seg", "000002.seg", "000003.seg", "000004.seg"]
    assert store.trim_journal(keep_entries=2, sessions=["s1"]) == 4
    assert files() == ["000001.seg", "000002.seg", "000004.seg"]  # (s2 still in 1)
    store.write(renamed=[("s2", "s2~a")])  # (an index operation: the bytes stay)
    assert seqs(store, "s2~a")[-1] == (4, b"u4\n")
    store.write(deleted=["s2~a"])
    assert files() == ["000004.seg"]
    assert seqs(store, "s1") == [(5, b"u5\n"), (6, b"u6\n")]
    store.write(deleted=["s1"])
    assert files() == ["000004.seg"]  # (the newest: the next writes go on in it)
    store.write(journal_runs=[run("s3", 1, 1)])
    assert files() == ["000004.seg", "000005.seg"]
    store.write(deleted=["s3"])
    assert files() == ["000005.seg"]
    store.close()


async def test_a_full_disk_raises_from_the_writer_and_leaves_the_store_as_it_was(
    tmp_path, monkeypatch
):
    """As before (SQLite's "database or disk is full"), the error is raised out of the
    journal's commit; nothing of the failed batch is indexed, and writing goes on once
    there is space again."""
    path = str(tmp_path / "b.db")
    store = open_store(path)
    store.write(journal_runs=[run("s1", 1, 2)])
    writev = os.writev

    def full(fd: int, buffers: list) -> int:
        writev(fd, [bytes(buffers[0])[:2]])  # (a torn write, then no space)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_segments.os, "writev", full)
    journal = Journal(store)
    record(journal, "s9", history(), b"lost\n")
    with pytest.raises(OSError, match="No space"):
        await journal._commit()
    assert store.journal_bounds("s9") == (0, 0)
    assert seqs(store, "s1") == [(1, b"u1\n"), (2, b"u2\n")]
    monkeypatch.setattr(_segments.os, "writev", writev)
    store.write(journal_runs=[run("s1", 3, 1)])
    assert seqs(store, "s1") == [(1, b"u1\n"), (2, b"u2\n"), (3, b"u3\n")]
    store.close()
