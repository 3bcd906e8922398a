"""
The journal's bytes in append-only segment files beside the store's database
(``<db>.journal/000001.seg``...): SQLite keeps only the index of each run (its segment, offset
and length). SQLite would write each byte of a run twice (the WAL, then the checkpoint) with
system calls per page; a segment takes a commit's runs in one ``writev`` (docs/performance.md,
"The journal's bytes in append-only segments").

Durability: :meth:`Segments.append` ``fdatasync``\\s the bytes before it returns, and the store
commits the index rows after it: an index row never points at bytes an OS crash could lose.
A crash between the two leaves bytes no row points at: harmless, a reader only reads what an
index row names, and the next append goes after them. Pure of trio (blocking calls).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

#: a segment takes commits until it holds this many bytes (it ends at the first commit that
#: reaches it: a segment is at most this plus one commit's bytes); then the next one starts
SEGMENT_BYTES: Final = 64 * 1024 * 1024
SUFFIX: Final = ".seg"
#: buffers per ``writev`` at most (POSIX guarantees IOV_MAX >= 16; Linux has 1024)
_IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16


class Segments:
    """The segment files of one store. One writer (the store's lock serializes it)."""

    def __init__(self, directory: str, *, max_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._fd: int | None = None  # the segment being appended to (the newest)
        self._number = 0
        self._size = 0

    def path(self, number: int) -> str:
        return os.path.join(self.directory, f"{number:06d}{SUFFIX}")

    def numbers(self) -> list[int]:
        """The segment files there are, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(
            int(name[: -len(SUFFIX)])
            for name in names
            if name.endswith(SUFFIX) and name[: -len(SUFFIX)].isdigit()
        )

    def append(self, blobs: Sequence[bytes]) -> tuple[int, int]:
        """
        Write ``blobs`` one after the other at the end of the newest segment and
        ``fdatasync`` them; returns (segment number, offset of the first). An ``OSError``
        (a full disk) leaves whatever got written unreferenced, and the next append after it.
        """
        if self._fd is None or self._size >= self.max_bytes:
            self._rotate()
        assert self._fd is not None
        start = self._size
        try:
            _write_all(self._fd, blobs)
            os.fdatasync(self._fd)
        finally:
            self._size = os.fstat(self._fd).st_size
        # Synced, so clean: let the kernel drop those pages now. The journal is read back
        # rarely (a replay, an export), and keeping a flood's pages cached makes the next
        # writes dearer for the writer thread.
        with contextlib.suppress(OSError):
            os.posix_fadvise(self._fd, start, self._size - start, os.POSIX_FADV_DONTNEED)
        return self._number, start

    def _rotate(self) -> None:
        """Open the newest segment, or start the next one when it is full (or none is)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        numbers = self.numbers()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        number = numbers[-1] if numbers else 1
        if numbers and os.stat(self.path(number)).st_size >= self.max_bytes:
            number += 1  # (numbers never go back: see ``remove_unreferenced``)
        created = not numbers or number != numbers[-1]
        fd = os.open(
            self.path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        if created:  # the new file's name durable too, before an index row names it
            _fsync_directory(self.directory)
        self._fd, self._number, self._size = fd, number, os.fstat(fd).st_size

    @contextlib.contextmanager
    def reading(self) -> Iterator[Callable[[int, int, int], bytes | None]]:
        """
        ``read(segment, offset, length)``: the bytes, or None when the file is gone or
        shorter (retention or compaction removed it since the index was read: another
        process's pass; ``Store.journal`` then reads the index again).
        The files opened are closed at the end of the block.
        """
        fds: dict[int, int | None] = {}

        def read(number: int, offset: int, length: int) -> bytes | None:
            if number not in fds:
                try:
                    fds[number] = os.open(self.path(number), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    fds[number] = None
            fd = fds[number]
            if fd is None:
                return None
            data = os.pread(fd, length, offset)
            return data if len(data) == length else None

        try:
            yield read
        finally:
            for fd in fds.values():
                if fd is not None:
                    os.close(fd)

    def size(self, number: int) -> int:
        """The bytes of a segment file (0 when it is gone)."""
        try:
            return os.stat(self.path(number)).st_size
        except FileNotFoundError:
            return 0

    def sealed(self) -> list[int]:
        """
        The segments no append goes to any more, oldest first: every file but the newest and
        the one open for appending (compaction copies out of these only, into the newest).
        """
        return [n for n in self.numbers()[:-1] if n != self._number]

    def remove(self, number: int) -> None:
        """Delete a sealed segment (compaction, once no index row points into it)."""
        assert number in self.sealed(), number
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(number))

    def remove_unreferenced(self, referenced: Callable[[int], bool]) -> list[int]:
        """
        Delete the segments ``referenced`` says no index row points into; never the newest
        (the one appended to, or to be: a number is never used twice, so a reader holding an
        older index never reads another run's bytes). Returns the numbers removed.
        """
        removed = []
        for number in self.numbers()[:-1]:
            if number != self._number and not referenced(number):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(number))
                removed.append(number)
        return removed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, blobs: Sequence[bytes]) -> None:
    """``writev`` until every byte is written (a write may be short; IOV_MAX per call)."""
    views: list[bytes | memoryview] = [b for b in blobs if b]
    at = 0
    while at < len(views):
        written = os.writev(fd, views[at : at + _IOV_MAX])
        while at < len(views) and written >= len(views[at]):
            written -= len(views[at])
            at += 1
        if written:
            views[at] = memoryview(views[at])[written:]


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
