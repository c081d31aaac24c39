"""`UringIO`: reads and writes of staging rows through io_uring, with the ``liburing`` binding from PyPI.

One ring per data file, used by one thread at a time (the engine's). `UringIO.start` submits a batch and
returns without waiting, so the caller can pack or unpack other rows while the disk works; its wait reaps
completions (of any batch) until the batch's own are in. The binding's ``Iovec`` keeps a reference to
(and an export of) every buffer it is given and never lets go, so each staging row gets its vector once,
when the ring is made, and the rows live as long as the process.

`UringIO.open` raises `ImportError` / `OSError` where the binding is not installed, where its compiled code
does not run on this processor (it was seen to die of an illegal instruction, which would take the whole
process with it: `binding_problem` tries it once in a child process first), or where the kernel refuses
io_uring (before Linux 6.14 for this binding, or disabled by ``kernel.io_uring_disabled`` or a seccomp
profile); `atlas_storage_nvme.direct_io` then uses its thread pool.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

DEPTH = 64
"""Submission queue entries: requests in flight at once."""
_PROBE = (
    "import liburing; ring = liburing.Ring(); liburing.io_uring_queue_init(2, ring); liburing.io_uring_queue_exit(ring)"
)


class BindingCrashError(OSError):
    """The liburing binding's compiled code killed the process that tried it (wrong processor features)."""


@functools.cache
def binding_problem() -> str | None:
    """Why the liburing binding cannot be used in this process, or None: a child process makes and tears down a
    ring first, since a binding built for other processor features dies of a signal rather than raising.
    Not installed, or a ring the kernel refuses, is left to `UringIO.open` to raise as such."""
    try:
        child = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"trying the liburing binding in a child process failed: {exc}"
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        return f"the liburing binding's compiled code does not run on this processor (the process died of {name})"
    return None


class UringIO:
    """Moves whole rows of ``rows`` (page-aligned buffers) to and from offsets of ``fd``; at most ``depth``
    requests are in flight, over any number of started batches."""

    name = "io_uring"

    def __init__(self, fd: int, rows: Sequence[memoryview], liburing: Any, depth: int) -> None:
        self.fd = fd
        self._lib = liburing
        self._depth = depth
        self._ring: Any = liburing.Ring()
        self._cqe = liburing.Cqe()
        liburing.io_uring_queue_init(depth, self._ring)
        self._vectors = [liburing.Iovec([row]) for row in rows]
        self._ids = itertools.count()
        self._in_flight = 0  # prepared or submitted, not reaped
        self._results: dict[int, int | OSError] = {}

    @classmethod
    def open(cls, fd: int, rows: Sequence[memoryview], depth: int = DEPTH) -> UringIO:
        """A ring for ``fd``; `ImportError` without the binding, `BindingCrashError` where its code does not run
        on this processor (`binding_problem`), `OSError` where the kernel refuses a ring."""
        liburing = importlib.import_module("liburing")
        problem = binding_problem()
        if problem is not None:
            raise BindingCrashError(problem)
        return cls(fd, rows, liburing, depth)

    def start(self, requests: Sequence[tuple[int, int]], write: bool) -> Callable[[], list[int]]:
        """Submit a write (``write``) or read of row ``row`` at file ``offset`` for every ``(offset, row)``;
        returns the wait, which gives the bytes each moved or raises the first failure's `OSError`."""
        lib = self._lib
        prepare = lib.io_uring_prep_writev if write else lib.io_uring_prep_readv
        ids = []
        for offset, row in requests:
            while self._in_flight >= self._depth:
                self._reap()
            entry = lib.io_uring_get_sqe(self._ring)
            prepare(entry, self.fd, self._vectors[row], offset)
            entry.user_data = request = next(self._ids)
            ids.append(request)
            self._in_flight += 1
        lib.io_uring_submit(self._ring)
        return lambda: self._wait(ids)

    def _wait(self, ids: list[int]) -> list[int]:
        for request in ids:
            while request not in self._results:
                self._reap()
        results = [self._results.pop(request) for request in ids]
        for result in results:
            if isinstance(result, OSError):
                raise result
        return [result for result in results if isinstance(result, int)]

    def _reap(self) -> None:
        """Submit what is prepared and wait for one completion."""
        lib = self._lib
        lib.io_uring_submit(self._ring)
        lib.io_uring_wait_cqe(self._ring, self._cqe)
        completion = self._cqe[0]
        request = completion.user_data
        try:
            self._results[request] = completion.res  # the binding raises OSError for a negative result
        except OSError as exc:
            self._results[request] = exc
        finally:
            lib.io_uring_cq_advance(self._ring, 1)
            self._in_flight -= 1

    def close(self) -> None:
        """Tear the ring down (idempotent); the rows stay referenced by their vectors."""
        if self._ring is not None:
            self._lib.io_uring_queue_exit(self._ring)
            self._ring = None


def describe_failure(exc: BaseException) -> str:
    """Why io_uring is not used, for the tier's log line."""
    if isinstance(exc, ImportError):
        return "the liburing package is not installed"
    if isinstance(exc, BindingCrashError):
        return str(exc)
    reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
    return f"the kernel refuses io_uring: {reason}"
