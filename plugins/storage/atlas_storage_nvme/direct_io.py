"""Aligned, direct file I/O: a data file opened with ``O_DIRECT`` where the filesystem allows it, page-aligned
staging buffers, space preallocated, and batched vectored reads and writes through io_uring
(`atlas_storage_nvme.uring`) or, where io_uring is unavailable, ``preadv`` / ``pwritev`` on a thread pool.

``O_DIRECT`` bypasses the page cache, so spilled KV neither evicts other files' pages nor counts twice in
memory; it needs buffer addresses, lengths and offsets aligned to the device's logical block size (`ALIGN`
covers every common one). Filesystems without it (tmpfs) fall back to buffered I/O, reported by `direct`.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from atlas_storage_nvme.uring import UringIO, describe_failure

log = logging.getLogger("atlas.storage")

ALIGN = 4096
"""Alignment of buffers, lengths and offsets (a page: a multiple of every device's logical block size)."""

MAX_BUFFERS = 64
"""Extents joined into one vectored call (well below IOV_MAX)."""

IOChoice = Literal["auto", "io_uring", "threads"]
"""How transfers run: io_uring where it works (auto), io_uring or fail, or the thread pool."""

Request = tuple[int, int]
"""One transfer: a file offset and the staging row that is written there or read into."""


def aligned(size: int) -> int:
    """``size`` rounded up to a multiple of `ALIGN`."""
    return -(-size // ALIGN) * ALIGN


class BatchIO(Protocol):
    """Moves staging rows to and from file offsets; ``name`` says how (``io_uring`` or ``threads``)."""

    name: str

    def start(self, requests: Sequence[Request], write: bool) -> Callable[[], list[int]]:
        """Begin writing (or reading) every ``(offset, row)``; the returned wait gives the bytes each moved, or
        raises `OSError` for a failed request."""
        ...

    def close(self) -> None:
        """Release the ring or the threads."""
        ...


class ThreadPoolIO:
    """``pwritev`` / ``preadv`` on a pool of ``threads`` threads (they release the GIL); requests at adjacent
    offsets are joined into one vectored call of at most `MAX_BUFFERS` rows."""

    name = "threads"

    def __init__(self, fd: int, rows: Sequence[memoryview], threads: int) -> None:
        self.fd = fd
        self._rows = rows
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="atlas-nvme")

    def start(self, requests: Sequence[Request], write: bool) -> Callable[[], list[int]]:
        call = os.pwritev if write else os.preadv
        runs: list[list[int]] = []  # indices of requests, adjacent in the file
        end = -1
        for i in sorted(range(len(requests)), key=lambda i: requests[i][0]):
            offset, row = requests[i]
            if runs and offset == end and len(runs[-1]) < MAX_BUFFERS:
                runs[-1].append(i)
            else:
                runs.append([i])
            end = offset + len(self._rows[row])
        futures = [
            self._pool.submit(call, self.fd, [self._rows[requests[i][1]] for i in run], requests[run[0]][0])
            for run in runs
        ]

        def wait() -> list[int]:
            done = [0] * len(requests)
            for run, future in zip(runs, futures, strict=True):
                moved = future.result()
                for i in run:  # a short transfer fills the run's first rows
                    done[i] = max(0, min(moved, len(self._rows[requests[i][1]])))
                    moved -= len(self._rows[requests[i][1]])
            return done

        return wait

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def open_io(fd: int, rows: Sequence[memoryview], choice: IOChoice, threads: int) -> BatchIO:
    """The transfer engine ``choice`` asks for: ``auto`` takes io_uring where it works, else the thread pool
    (logged, with the reason); ``io_uring`` raises `ImportError` / `OSError` where it does not work."""
    if choice == "threads":
        return ThreadPoolIO(fd, rows, threads)
    try:
        return UringIO.open(fd, rows)
    except (ImportError, OSError) as exc:
        if choice == "io_uring":
            raise
        log.info("KV tier: io_uring is not used (%s); reads and writes run on a thread pool", describe_failure(exc))
        return ThreadPoolIO(fd, rows, threads)


class DirectFile:
    """One preallocated data file of ``size`` bytes, moved through ``rows`` page-aligned staging rows of
    ``row_bytes`` (a multiple of `ALIGN`) each: `staging` is ``uint8 [rows, row_bytes]``.

    `start_write` / `start_read` take ``(offset, row)`` requests, all in flight together, and return without
    waiting (``io``: `IOChoice`; ``threads``: the pool's size). `OSError` when the file cannot be created or
    its space reserved."""

    def __init__(
        self, path: Path, size: int, row_bytes: int, rows: int, io: IOChoice = "auto", threads: int = 4
    ) -> None:
        flags = os.O_RDWR | os.O_CREAT
        try:
            self.fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o600)
            self.direct = hasattr(os, "O_DIRECT")
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.fd = os.open(path, flags, 0o600)  # the filesystem refuses O_DIRECT (tmpfs)
            self.direct = False
        self.size = size
        self._buffer = mmap.mmap(-1, max(rows * row_bytes, ALIGN))  # page-aligned, zeroed
        self.staging = np.frombuffer(self._buffer, dtype=np.uint8, count=rows * row_bytes).reshape(rows, row_bytes)
        views = memoryview(self._buffer)
        self._rows = [views[i * row_bytes : (i + 1) * row_bytes] for i in range(rows)]
        try:
            self._preallocate(size)
            self.io = open_io(self.fd, self._rows, io, threads)
        except BaseException:
            os.close(self.fd)
            raise

    def _preallocate(self, size: int) -> None:
        """Reserve the file's blocks now, so a full disk shows at start rather than mid-run. Space the disk does
        not have is refused before anything is allocated (a failed ``fallocate`` can fill the disk on the way),
        and a failed allocation is given back."""
        current = os.fstat(self.fd).st_size
        if current >= size:
            return
        disk = os.fstatvfs(self.fd)
        if size - current > disk.f_bavail * disk.f_frsize:
            free = disk.f_bavail * disk.f_frsize
            raise OSError(errno.ENOSPC, f"No space left on device: {size - current} bytes needed, {free} free")
        try:
            os.posix_fallocate(self.fd, 0, size)
        except OSError as exc:
            os.ftruncate(self.fd, current)
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.ftruncate(self.fd, size)  # no fallocate here: sparse, a full disk shows on write

    def start_write(self, requests: Sequence[Request]) -> Callable[[], None]:
        """Begin writing staging row ``row`` at ``offset`` for every request; the returned wait raises `OSError`
        for a short or failed write (``ENOSPC``: disk full). The rows must not change until it returns."""
        wait = self.io.start(requests, write=True)

        def check() -> None:
            for (offset, row), done in zip(requests, wait(), strict=True):
                if done != len(self._rows[row]):
                    wanted = len(self._rows[row])
                    raise OSError(errno.ENOSPC, f"short write at offset {offset}: {done} of {wanted} bytes")

        return check

    def start_read(self, requests: Sequence[Request]) -> Callable[[], None]:
        """Begin filling staging row ``row`` from ``offset`` for every request; after the returned wait, bytes
        past the end of a truncated file read as zeros."""
        wait = self.io.start(requests, write=False)

        def fill() -> None:
            for (_, row), done in zip(requests, wait(), strict=True):
                self.staging[row, max(done, 0) :] = 0

        return fill

    def close(self) -> None:
        """Close the file and the ring or threads; the staging rows are released where the I/O engine lets go
        of them (see `atlas_storage_nvme.uring`)."""
        self.io.close()
        os.close(self.fd)
        if self.io.name == "threads":
            for row in self._rows:
                row.release()
            del self.staging
            self._buffer.close()
