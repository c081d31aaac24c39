"""The StorageBackend contract: a slower tier (host RAM, NVMe) that KV blocks and recurrent states spill to.

A tier stores *records* of one fixed `RecordFormat` (a KV block over every layer, or one sequence's
recurrent state) in numbered slots ``0 .. capacity - 1``. The engine chooses the slot of every record
(`atlas_core.storage.tiered.TieredStore` keeps the index); a tier only moves bytes. Implementations
register through ``register_storage_backends`` and are constructed as ``cls(spec)`` from a `TierSpec`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from atlas_core.errors import AtlasError


@dataclass(frozen=True)
class RecordFormat:
    """The host arrays one record consists of: ``arrays[j]`` is ``(shape, dtype)`` of its j-th array.

    A batch of ``n`` records travels as one array per entry, ``[n, *shape]`` (see `StorageBackend.write`)."""

    arrays: tuple[tuple[tuple[int, ...], np.dtype], ...]

    @property
    def nbytes(self) -> int:
        """Bytes of one record's payload (every array, back to back)."""
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in self.arrays)

    def empty(self, count: int) -> list[np.ndarray]:
        """Host arrays for ``count`` records (uninitialised), one per entry."""
        return [np.empty((count, *shape), dtype) for shape, dtype in self.arrays]

    def read_rows(
        self,
        read: Callable[[list[int], list[np.ndarray]], Iterable[int]],
        slots: list[int],
        rows: list[int],
        out: Sequence[np.ndarray],
    ) -> set[int]:
        """Records ``slots`` into rows ``rows`` of ``out`` (``out[j]``: ``[n, *shape]`` per entry) through ``read``
        (a tier's `StorageBackend.read`) -> the slots that failed (their rows undefined). Straight into ``out``
        when ``rows`` is ``0 .. len(slots) - 1``; else through staging, one copy per entry."""
        if rows == list(range(len(slots))):
            return set(read(slots, [target[: len(slots)] for target in out]))
        staging = self.empty(len(slots))
        bad = set(read(slots, staging))
        good = [position for position, slot in enumerate(slots) if slot not in bad]
        if good:
            targets = np.asarray([rows[position] for position in good], dtype=np.int64)
            for target, source in zip(out, staging, strict=True):
                target[targets] = source[np.asarray(good, dtype=np.int64)]
        return bad


@dataclass(frozen=True)
class TierSpec:
    """What a tier is built for: its record ``format``, at most ``capacity_bytes`` of payload, and for
    tiers backed by files the ``directory`` they own; ``identity`` names the model and KV layout the
    records belong to (persistent tiers keep records only for the same identity); ``persist`` keeps
    records across restarts where the tier supports it."""

    format: RecordFormat
    capacity_bytes: int
    directory: Path | None = None
    identity: str = ""
    persist: bool = False


class StorageFullError(AtlasError):
    """A tier could not store what it was asked to (disk full, unwritable path): the caller degrades."""


class StorageBackend(ABC):
    """Stores fixed-format records in slots ``0 .. capacity_slots - 1``, chosen by the caller.

    Calls come from one thread at a time (the engine's). `write` replaces what a slot held; `read`
    verifies what it returns where the tier can be corrupted (checksums) and reports slots that are
    unreadable instead of returning wrong bytes.
    """

    @property
    @abstractmethod
    def capacity_slots(self) -> int:
        """How many records fit in this tier."""

    @abstractmethod
    def write(self, slots: Sequence[int], keys: Sequence[int | None], arrays: Sequence[np.ndarray]) -> None:
        """Store record ``i`` (``arrays[j][i]`` for every entry j of the format) in ``slots[i]``, under the
        caller's key ``keys[i]`` (a tier that persists keeps it for `persisted`; None: a record that is never
        persisted).

        Raises `StorageFullError` when the tier cannot take them (nothing is then known to be stored
        in those slots)."""

    @abstractmethod
    def read(self, slots: Sequence[int], out: Sequence[np.ndarray]) -> list[int]:
        """Copy the records of ``slots`` into ``out[j][i]``; return the slots whose record is lost
        (never written, truncated, or failing its checksum), whose ``out`` rows are then undefined."""

    def discard(self, slots: Sequence[int]) -> None:  # noqa: B027  # optional: most tiers just overwrite later
        """Forget the records of ``slots`` (a tier may release space or persisted entries)."""

    def close(self) -> None:  # noqa: B027  # optional: tiers without files or threads hold nothing
        """Release files, locks and threads; the tier is unusable afterwards."""

    def persisted(self) -> dict[int, int]:
        """Records kept from a previous run of the same ``identity`` (``persist``): slot -> the key it was
        written under; empty for tiers that do not persist."""
        return {}
