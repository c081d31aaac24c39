"""`UringIO`: reads and writes of staging rows through io_uring, with the ``liburing`` binding from PyPI.

One ring per data file, used by one thread at a time (the engine's). Requests are submitted ``depth`` at a
time and a call returns when every completion has been reaped. The binding's ``Iovec`` keeps a reference to
(and an export of) every buffer it is given and never lets go, so each staging row gets its vector once,
when the ring is made, and the rows live as long as the process.

`UringIO.open` raises `ImportError` / `OSError` where the binding is not installed or the kernel refuses
io_uring (before Linux 6.14 for this binding, or disabled by ``kernel.io_uring_disabled`` or a seccomp
profile); `atlas_storage_nvme.direct_io` then uses its thread pool.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

DEPTH = 64
"""Submission queue entries: requests in flight at once."""


class UringIO:
    """Moves whole rows of ``rows`` (page-aligned buffers) to and from offsets of ``fd``."""

    name = "io_uring"

    def __init__(self, fd: int, rows: Sequence[memoryview], liburing: Any, depth: int) -> None:
        self.fd = fd
        self._lib = liburing
        self._depth = depth
        self._ring: Any = liburing.Ring()
        self._cqe = liburing.Cqe()
        liburing.io_uring_queue_init(depth, self._ring)
        self._vectors = [liburing.Iovec([row]) for row in rows]

    @classmethod
    def open(cls, fd: int, rows: Sequence[memoryview], depth: int = DEPTH) -> UringIO:
        """A ring for ``fd``; `ImportError` without the binding, `OSError` where the kernel refuses a ring."""
        return cls(fd, rows, importlib.import_module("liburing"), depth)

    def transfer(self, requests: Sequence[tuple[int, int]], write: bool) -> list[int]:
        """Write (``write``) or read row ``row`` at file ``offset`` for every ``(offset, row)``; return the
        bytes each moved. The first failed request raises its `OSError` once every completion is reaped."""
        lib = self._lib
        prepare = lib.io_uring_prep_writev if write else lib.io_uring_prep_readv
        done = [0] * len(requests)
        error: OSError | None = None
        for start in range(0, len(requests), self._depth):
            chunk = requests[start : start + self._depth]
            for index, (offset, row) in enumerate(chunk, start):
                entry = lib.io_uring_get_sqe(self._ring)
                prepare(entry, self.fd, self._vectors[row], offset)
                entry.user_data = index
            lib.io_uring_submit_and_wait(self._ring, len(chunk))
            for _ in chunk:
                lib.io_uring_wait_cqe(self._ring, self._cqe)
                completion = self._cqe[0]
                index = completion.user_data
                try:
                    done[index] = completion.res  # the binding raises OSError for a negative result
                except OSError as exc:
                    error = error or exc
                finally:
                    lib.io_uring_cq_advance(self._ring, 1)
        if error is not None:
            raise error
        return done

    def close(self) -> None:
        """Tear the ring down (idempotent); the rows stay referenced by their vectors."""
        if self._ring is not None:
            self._lib.io_uring_queue_exit(self._ring)
            self._ring = None


def describe_failure(exc: BaseException) -> str:
    """Why io_uring is not used, for the tier's log line."""
    if isinstance(exc, ImportError):
        return "the liburing package is not installed"
    reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
    return f"the kernel refuses io_uring: {reason}"
