"""`DirectoryLock`: one engine per spill directory, held with ``flock`` on a ``LOCK`` file (released when the
holder closes it or its process ends, so a crashed engine never leaves a stale lock)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from atlas_core.errors import ConfigError


class DirectoryLock:
    """An exclusive lock on ``directory``; `ConfigError` naming the holder's pid when another engine has it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "LOCK"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise ConfigError(
                f"kv_spill_dir {directory} is in use by another engine (pid {holder}, lock {self.path}); give each "
                "engine its own directory"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Unlock (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
