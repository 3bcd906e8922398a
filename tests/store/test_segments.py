"""The journal's bytes in segment files (``segments_mod``), indexed by the store's rows."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3

import pytest
import structlog
import trio

from acp_bridge.engine.journal import Journal
from acp_bridge.store import db as store_db
from acp_bridge.store import elide as elide_mod
from acp_bridge.store import segments as segments_mod
from acp_bridge.store.db import JournalEntry, SessionRow, open_store
from acp_bridge.store.segments import Segments
from tests.store.test_durable import history, record


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
    monkeypatch.setattr(
        segments_mod.os, "writev", lambda fd, bufs: writev(fd, [bytes(bufs[0])[:3]])
    )
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


def test_the_pages_of_each_append_are_let_go_once_synced(tmp_path, monkeypatch):
    """After its ``fdatasync``, an append tells the kernel its pages may go (they are clean):
    the range it wrote, nothing else, and never before the sync."""
    calls: list[tuple[str, int, int]] = []
    monkeypatch.setattr(segments_mod.os, "fdatasync", lambda fd: calls.append(("sync", 0, 0)))

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_DONTNEED
        calls.append(("dontneed", offset, length))

    monkeypatch.setattr(segments_mod.os, "posix_fadvise", fadvise)
    segments = Segments(str(tmp_path / "j"))
    segments.append([b"first run\n", b"x" * 10])
    segments.append([b"then\n"])
    assert calls == [("sync", 0, 0), ("dontneed", 0, 20), ("sync", 0, 0), ("dontneed", 20, 5)]
    with segments.reading() as read:
        assert read(1, 0, 25) == b"first run\n" + b"x" * 10 + b"then\n"
    segments.close()


def test_the_segment_is_synced_before_the_index_rows_are_committed(tmp_path, monkeypatch):
    path = str(tmp_path / "b.db")
    store = open_store(path)
    rows_at_sync = []

    def fdatasync(fd: int) -> None:
        with sqlite3.connect(path) as other:
            rows_at_sync.append(other.execute("SELECT COUNT(*) FROM journal").fetchone()[0])

    monkeypatch.setattr(segments_mod.os, "fdatasync", fdatasync)
    store.write(journal_runs=[run("s1", 1, 2)])
    store.write(journal_runs=[run("s1", 3, 2)])
    assert rows_at_sync == [0, 1]
    store.close()


def test_rows_of_the_inline_layout_are_read_after_the_migration_beside_new_ones(tmp_path):
    path = str(tmp_path / "v6.db")
    conn = sqlite3.connect(path)
    for number, script in enumerate(store_db.MIGRATIONS[:6], start=1):
        conn.executescript(f"BEGIN;{script};PRAGMA user_version={number};COMMIT;")
    conn.executemany("INSERT INTO journal VALUES (?,?,?,?,?,?)", [run("s1", 1, 3), run("s2", 1, 1)])
    conn.commit()
    conn.close()
    store = open_store(path)
    assert store._conn.execute("PRAGMA user_version").fetchone() == (len(store_db.MIGRATIONS),)
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

    monkeypatch.setattr(segments_mod.os, "writev", full)
    journal = Journal(store)
    record(journal, "s9", history(), b"lost\n")
    with pytest.raises(OSError, match="No space"):
        await journal._commit()
    assert store.journal_bounds("s9") == (0, 0)
    assert seqs(store, "s1") == [(1, b"u1\n"), (2, b"u2\n")]
    monkeypatch.setattr(segments_mod.os, "writev", writev)
    store.write(journal_runs=[run("s1", 3, 1)])
    assert seqs(store, "s1") == [(1, b"u1\n"), (2, b"u2\n"), (3, b"u3\n")]
    store.close()


def files_size(path: str) -> tuple[int, int]:
    """(bytes of the segment files but the newest, bytes of the newest)."""
    directory = path + ".journal"
    sizes = [os.stat(os.path.join(directory, n)).st_size for n in sorted(os.listdir(directory))]
    return sum(sizes[:-1]), sizes[-1]


def kept_bytes(store) -> int:
    return store._conn.execute("SELECT COALESCE(SUM(length), 0) FROM journal").fetchone()[0]


def pin_and_flood(store, commits: range, expected: list) -> None:
    """Each commit: one small update of the kept session "pin" beside a flood of a session
    deleted at the next commit: every segment keeps a little of "pin" and much dead."""
    for i in commits:
        expected.append((i, b"pin %d\n" % i))
        store.write(
            journal_runs=[("pin", i, i, 1, 1.0, b"pin %d\n" % i), run(f"flood{i}", 1, 100, b"F")],
            deleted=[f"flood{i - 1}"],
        )


def small_segments(tmp_path) -> tuple[str, store_db.Store]:
    """A store whose segments hold about three of :func:`pin_and_flood`'s commits."""
    path = str(tmp_path / "b.db")
    store = open_store(path)
    store.segments.max_bytes = 1000
    return path, store


def test_compaction_bounds_the_files_when_every_segment_keeps_a_little(tmp_path):
    """Without compaction, one kept update per segment pinned every segment: the files held
    all that was written. After each pass the sealed segments hold at most twice the kept
    bytes (the newest one apart), and every kept update reads back as written."""
    path, store = small_segments(tmp_path)
    expected: list = []
    for start in range(1, 300, 30):
        pin_and_flood(store, range(start, start + 30), expected)
        store.trim_journal(keep_entries=1000, sessions=[])
        sealed, newest = files_size(path)
        assert sealed <= 2 * kept_bytes(store), (start, sealed, kept_bytes(store))
        assert newest < store.segments.max_bytes + 410  # (+ one append: a commit here)
        assert seqs(store, "pin") == expected
    assert len(os.listdir(path + ".journal")) < 10  # (100 were written)
    store.close()
    store = open_store(path)  # (the counts again, from the index, after a restart)
    pin_and_flood(store, range(301, 331), expected)
    store.trim_journal(keep_entries=1000, sessions=[])
    assert files_size(path)[0] <= 2 * kept_bytes(store)
    assert seqs(store, "pin") == expected
    assert [e.seq for e in store.journal("pin", after_seq=150, limit=3)] == [151, 152, 153]
    store.close()


def test_a_pass_copies_at_most_its_budget_and_the_next_passes_go_on(tmp_path, monkeypatch):
    path, store = small_segments(tmp_path)
    expected: list = []
    pin_and_flood(store, range(1, 31), expected)  # 10 segments, each a little kept
    appended = []
    append = store.segments.append
    monkeypatch.setattr(
        store.segments,
        "append",
        lambda blobs: appended.append(sum(map(len, blobs))) or append(blobs),
    )
    sizes = [sum(files_size(path))]
    for _ in range(4):
        store.trim_journal(keep_entries=1000, sessions=[], compact_bytes=30)
        sizes.append(sum(files_size(path)))
        assert seqs(store, "pin") == expected
    assert all(size <= 30 for size in appended), appended  # (3 updates of "pin" a segment)
    assert len(appended) == 4  # (one segment a pass: the next would go past 30 bytes)
    assert sizes == sorted(sizes, reverse=True)
    assert len(set(sizes)) == 5
    assert files_size(path)[0] > 2 * kept_bytes(store)  # (not there yet)
    store.trim_journal(keep_entries=1000, sessions=[])  # (the default: 64 MiB a pass)
    assert len(os.listdir(path + ".journal")) <= 2
    assert files_size(path)[0] <= 2 * kept_bytes(store)
    store.close()


def test_a_crash_between_the_copy_and_the_deletion_leaves_both_copies_read_right(
    tmp_path, monkeypatch
):
    path, store = small_segments(tmp_path)
    expected: list = []
    pin_and_flood(store, range(1, 10), expected)
    before = sorted(os.listdir(path + ".journal"))

    def crash(number: int) -> None:
        raise KeyboardInterrupt  # (the process dies after the commit, before the unlink)

    monkeypatch.setattr(store.segments, "remove", crash)
    with pytest.raises(KeyboardInterrupt):
        store.trim_journal(keep_entries=1000, sessions=[])
    store.close()
    assert set(before) <= set(os.listdir(path + ".journal"))  # (both copies)
    store = open_store(path)
    assert index(store)[0][2] != int(before[0][:6])  # (the rows point at the copy)
    assert seqs(store, "pin") == expected
    store.trim_journal(keep_entries=1000, sessions=[])  # (the old file goes now)
    assert before[0] not in os.listdir(path + ".journal")
    assert seqs(store, "pin") == expected
    store.close()


def test_a_crash_between_the_copy_and_the_commit_leaves_the_old_rows_read_right(
    tmp_path, monkeypatch
):
    path, store = small_segments(tmp_path)
    expected: list = []
    pin_and_flood(store, range(1, 10), expected)
    before = index(store)
    append = store.segments.append

    def crash(blobs):
        append(blobs)  # (the copy is written and synced, then the process dies)
        raise KeyboardInterrupt

    monkeypatch.setattr(store.segments, "append", crash)
    with pytest.raises(KeyboardInterrupt):
        store.trim_journal(keep_entries=1000, sessions=[])
    store.close()
    store = open_store(path)
    assert index(store) == before
    assert seqs(store, "pin") == expected
    store.trim_journal(keep_entries=1000, sessions=[])
    assert files_size(path)[0] <= 2 * kept_bytes(store)
    assert seqs(store, "pin") == expected
    store.close()


def test_compaction_never_copies_out_of_the_segment_appended_to(tmp_path):
    """The newest segment, however little of it is kept, is neither copied nor deleted: the
    writer goes on appending to it, and the copies go there (or to the next one)."""
    _, store = small_segments(tmp_path)
    expected: list = []
    # (about 320 bytes a commit, the floods' lines stored elided) segments 1-2 full, 3 being
    # written
    pin_and_flood(store, range(1, 10), expected)
    store.write(deleted=["flood9"])
    assert store.segments.numbers() == [1, 2, 3]
    assert store.segments.sealed() == [1, 2]
    store.trim_journal(keep_entries=1000, sessions=[])
    assert store.segments.numbers() == [3]  # (3: all but a few bytes dead, kept)
    assert {segment for _, _, segment, *_ in index(store)} == {3}
    pin_and_flood(store, range(10, 11), expected)
    assert index(store)[-1][2] == 3  # (appended to it still)
    with pytest.raises(AssertionError):
        store.segments.remove(3)
    assert seqs(store, "pin") == expected
    store.close()


def test_a_reader_in_another_process_finds_the_rows_compaction_moved(tmp_path, monkeypatch):
    """``sessions export`` selects the index, then compaction (the daemon) copies the runs and
    deletes the file before the export reads it: the export selects again and reads the
    copies; it used to skip them as trimmed."""
    path = str(tmp_path / "b.db")
    daemon = open_store(path)
    daemon.segments.max_bytes = 1000
    expected: list = []
    pin_and_flood(daemon, range(1, 10), expected)
    export = open_store(path)
    reading = export.segments.reading
    compacted = []

    @contextlib.contextmanager
    def racing():
        with reading() as read:

            def first_compact(number, offset, length):
                if not compacted:  # (between the export's select and its first read)
                    compacted.append(daemon.trim_journal(keep_entries=1000, sessions=[]))
                return read(number, offset, length)

            yield first_compact

    monkeypatch.setattr(export.segments, "reading", racing)
    assert seqs(export, "pin") == expected
    assert compacted
    assert 1 not in daemon.segments.numbers()
    export.close()
    daemon.close()


# --------------------------------------------------------------------------- runs stored elided


def updates(first: int, count: int, sid: str = "sess_0123456789abcdef") -> bytes:
    """``count`` message chunks of one session, as an agent streams them (one line each)."""
    return b"".join(
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"%s","update":'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"chunk %d"}}}}\n'
        % (sid.encode(), seq)
        for seq in range(first, first + count)
    )


def lines_of(data: bytes, first: int) -> list[tuple[int, bytes]]:
    return list(enumerate(data.splitlines(keepends=True), first))


def stored(store) -> list[tuple]:
    return store._conn.execute(
        "SELECT session, first_seq, length, raw_length FROM journal ORDER BY segment, position"
    ).fetchall()


needs_c = pytest.mark.skipif(
    elide_mod.elide_c is None or not elide_mod.ACCELERATED,
    reason="acp_bridge.protocol.scanc not built (or ACP_BRIDGE_PURE_SCAN=1): runs are stored as is",
)


@needs_c
def test_a_run_of_updates_is_stored_with_shared_prefixes_elided_and_reads_back(tmp_path):
    """A session's updates share their envelope: the run takes about a third of its bytes in
    the segment; a run eliding does not make smaller is stored as it is (raw_length NULL)."""
    path = str(tmp_path / "b.db")
    store = open_store(path)
    data = updates(1, 200)
    store.write(journal_runs=[("s1", 1, 200, 1, 1.0, data), ("s1", 201, 201, 0, 1.0, b"hi\n")])
    (_, _, length, raw), small = stored(store)
    assert raw == len(data)
    assert length * 3 < len(data)
    assert small == ("s1", 201, 3, None)
    assert os.stat(store.segments.path(1)).st_size == length + 3
    expected = [*lines_of(data, 1), (201, b"hi\n")]
    assert seqs(store, "s1") == expected
    assert [e.seq for e in store.journal("s1", after_seq=150, limit=3)] == [151, 152, 153]
    assert [e.live for e in store.journal("s1", after_seq=199)] == [True, False]
    store.close()
    store = open_store(path)
    assert seqs(store, "s1") == expected
    assert store.trim_journal(keep_entries=1) == 200  # (retention: whole runs, as before)
    assert seqs(store, "s1") == [(201, b"hi\n")]
    store.close()


@needs_c
def test_the_journal_writes_a_flood_elided(tmp_path):
    """Through the journal's writer: the segment holds about a third of the flood's bytes,
    and every update reads back as relayed."""
    store = open_store(str(tmp_path / "b.db"))
    journal = Journal(store)
    h = history()
    data = updates(1, 3000)
    for line in data.splitlines(keepends=True):
        record(journal, "s1", h, line)
    trio.run(journal._commit)
    assert sum(store.segments.size(n) for n in store.segments.numbers()) * 3 < len(data)
    assert seqs(store, "s1") == lines_of(data, 1)
    store.close()


@needs_c
def test_compaction_copies_elided_runs_as_they_are(tmp_path):
    path, store = small_segments(tmp_path)
    kept = []
    for i in range(1, 8):
        data = updates(10 * i, 10, sid="keep")
        kept += lines_of(data, 10 * i)
        store.write(
            journal_runs=[
                ("keep", 10 * i, 10 * i + 9, 1, 1.0, data),
                run(f"flood{i}", 1, 100, b"F"),
            ],
            deleted=[f"flood{i - 1}"],
        )
    before = {first: (length, raw) for s, first, length, raw in stored(store) if s == "keep"}
    assert len(before) == 7
    assert all(raw is not None for _, raw in before.values())  # (every run of "keep" elided)
    store.trim_journal(keep_entries=1000, sessions=[])
    assert len(store.segments.numbers()) < 3  # (the sealed ones compacted)
    after = {first: (length, raw) for s, first, length, raw in stored(store) if s == "keep"}
    assert after == before
    assert seqs(store, "keep") == kept
    store.close()
    store = open_store(path)
    assert seqs(store, "keep") == kept
    store.close()


@needs_c
def test_a_corrupt_elided_run_is_skipped_as_a_bad_read_and_logged(tmp_path):
    """A run whose stored bytes are not a valid elided run (a disk's error, an edit) is left
    out of the read as a run whose bytes went is, with an error in the log: the runs around
    it read as written, a replay then says it is not complete (a gap in the numbers)."""
    path = str(tmp_path / "b.db")
    store = open_store(path)
    first, second, third = updates(1, 50), updates(51, 50), updates(101, 50)
    store.write(journal_runs=[("s1", 1, 50, 1, 1.0, first), ("s1", 51, 100, 1, 1.0, second)])
    store.write(journal_runs=[("s1", 101, 150, 1, 1.0, third)])
    (_, _, length, _), (_, _, second_length, _), _ = stored(store)
    with open(store.segments.path(1), "r+b") as f:
        for at, byte in ((length, 0x05), (length + second_length - 3, 0x0A)):
            f.seek(at)
            f.write(bytes([byte]))  # (a first prefix length past the empty line before; a
            # newline more near the end: each on its own makes the run invalid)
    with structlog.testing.capture_logs() as logs:
        entries = store.journal("s1")
    assert [(e.seq, e.data) for e in entries] == lines_of(first, 1) + lines_of(third, 101)
    corrupt = [log for log in logs if log["event"] == "journal_run_corrupt"]
    assert [(log["first_seq"], log["position"]) for log in corrupt] == [(51, length)]
    assert "longer than the line before" in corrupt[0]["reason"]
    store.close()


@needs_c
def test_elided_runs_read_with_the_reference_and_a_store_without_c_writes_them_as_is(
    tmp_path, monkeypatch
):
    path = str(tmp_path / "b.db")
    store = open_store(path)
    data = updates(1, 100)
    store.write(journal_runs=[("s1", 1, 100, 1, 1.0, data)])
    monkeypatch.setattr(elide_mod, "restore", elide_mod.restore_reference)
    monkeypatch.setattr(elide_mod, "elide", elide_mod._elide_nothing)
    assert seqs(store, "s1") == lines_of(data, 1)
    more = updates(101, 100)
    store.write(journal_runs=[("s1", 101, 200, 1, 1.0, more)])
    assert stored(store)[-1] == ("s1", 101, len(more), None)
    assert seqs(store, "s1") == lines_of(data + more, 1)
    store.close()


def test_runs_in_segments_of_a_store_before_elision_read_after_the_migration(tmp_path):
    """A store of schema 7 (runs in segments, stored as they are): opened by this version,
    its rows read as before (raw_length NULL), beside new ones, and retention goes on."""
    path = str(tmp_path / "v7.db")
    conn = sqlite3.connect(path)
    for number, script in enumerate(store_db.MIGRATIONS[:7], start=1):
        conn.executescript(f"BEGIN;{script};PRAGMA user_version={number};COMMIT;")
    old = updates(1, 100)
    segments = Segments(path + ".journal")
    assert segments.append([old]) == (1, 0)
    segments.close()
    conn.execute(
        "INSERT INTO journal VALUES (?,?,?,?,?,?,?,?,?)",
        ("s1", 1, 100, 1, 1.0, b"", 1, 0, len(old)),
    )
    conn.commit()
    conn.close()
    store = open_store(path)
    assert store._conn.execute("PRAGMA user_version").fetchone() == (len(store_db.MIGRATIONS),)
    assert stored(store) == [("s1", 1, len(old), None)]
    new = updates(101, 100)
    store.write(journal_runs=[("s1", 101, 200, 1, 1.0, new)])
    assert seqs(store, "s1") == lines_of(old + new, 1)
    assert store.trim_journal(keep_entries=100) == 100
    assert seqs(store, "s1") == lines_of(new, 101)
    store.close()
