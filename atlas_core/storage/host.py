"""`HostMemoryStorage`: core's host-memory tier (``swap_space_gb``), records in preallocated NumPy arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from atlas_core.storage.backend import StorageBackend, TierSpec


class HostMemoryStorage(StorageBackend):
    """One host array per format entry, ``[capacity, *shape]``; slot ``s`` is row ``s`` of each.

    Host memory cannot be corrupted behind the engine's back, so `read` loses nothing that was written.
    The arrays are reserved up front but their pages are committed as records are written."""

    def __init__(self, spec: TierSpec) -> None:
        record_bytes = spec.format.nbytes
        self._capacity = spec.capacity_bytes // record_bytes if record_bytes else 0
        self._arrays = spec.format.empty(self._capacity)
        self._written = np.zeros(self._capacity, dtype=bool)

    @property
    def capacity_slots(self) -> int:
        return self._capacity

    def write(self, slots: Sequence[int], keys: Sequence[int | None], arrays: Sequence[np.ndarray]) -> None:
        rows = np.asarray(slots, dtype=np.int64)
        for store, values in zip(self._arrays, arrays, strict=True):
            store[rows] = values
        self._written[rows] = True

    def read(self, slots: Sequence[int], out: Sequence[np.ndarray]) -> list[int]:
        rows = np.asarray(slots, dtype=np.int64)
        for store, target in zip(self._arrays, out, strict=True):
            np.take(store, rows, axis=0, out=target[: len(rows)])  # no temporary copy
        return [slot for slot in slots if not self._written[slot]]

    def discard(self, slots: Sequence[int]) -> None:
        self._written[np.asarray(slots, dtype=np.int64)] = False
