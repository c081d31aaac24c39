"""`TierReplay`: a rank's own tiers, driven by another rank's `TieredStore` journal (split replicas).

Rank 0 of a split replica decides where every record goes (its `TieredStore` keeps the index); each other rank
holds its own shard of the same records in tiers of its own, in the same slots. `TierReplay` runs the journal's
decisions on them in order, on an I/O thread of its own: demotions and writes of ``put``, the reads of ``get``,
the discards of ``drop``. It keeps no index: the backends' own bookkeeping says which slots hold a record.

It never returns mismatched data silently: a slot it could not write is discarded (a later read reports it
lost), a demotion whose read fails discards its target, a tier this rank could not open (None) loses every
record, and slots beyond a tier's capacity on this rank are lost. Lost records are reported to the caller, which
tells rank 0 (`atlas_core.kvtiers.agree.agree_loads`), so every rank recomputes them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from atlas_core.storage.backend import RecordFormat, StorageBackend, StorageFullError

log = logging.getLogger("atlas.storage")


class TierReplay:
    """``tiers[i]``: this rank's backend of rank 0's tier ``i`` (None: it could not be opened here)."""

    def __init__(self, format: RecordFormat, tiers: Sequence[StorageBackend | None]) -> None:
        self.format, self.tiers = format, list(tiers)
        self._io = ThreadPoolExecutor(1, thread_name_prefix="atlas-kv-replay")
        self._warned: set[int] = set()

    def put(self, moves: list[list[Any]], placed: list[list[int]], records: Callable[[], list[np.ndarray]]) -> None:
        """Run a journaled ``put``: the demotions ``moves``, then write row ``row`` of ``records()`` to each
        ``[tier, slot, row, key]`` of ``placed``."""
        self._io.submit(self._run_put, moves, placed, records)

    def get(self, reads: list[list[int]], count: int) -> tuple[list[np.ndarray], Future[list[int]]]:
        """Run a journaled ``get``: rows for ``count`` records, and a future giving the rows that are lost (the
        rows ``reads`` does not name are lost too)."""
        out = self.format.empty(count)
        return out, self._io.submit(self._run_get, reads, out, count)

    def drop(self, slots: list[list[int]]) -> None:
        """Run a journaled ``drop``: discard ``[tier, slot]`` pairs."""
        self._io.submit(self._discard, [(tier, slot) for tier, slot in slots])

    def demote(self, moves: list[list[Any]]) -> None:
        """Run a journaled ``demote``, waited for (it precedes the closing writes)."""
        self._io.submit(self._run_moves, moves).result()

    def close(self) -> None:
        """Finish the I/O, stop the thread and close the tiers (a persistent one writes its index)."""
        self._io.shutdown(wait=True)
        for tier in self.tiers:
            if tier is not None:
                tier.close()

    def _run_put(
        self, moves: list[list[Any]], placed: list[list[int]], records: Callable[[], list[np.ndarray]]
    ) -> None:
        self._run_moves(moves)
        arrays = records()
        for index in sorted({tier for tier, *_ in placed}):
            batch = [(slot, row, key) for tier, slot, row, key in placed if tier == index]
            self._write(
                index, [s for s, _, _ in batch], [k for *_, k in batch], [a[[r for _, r, _ in batch]] for a in arrays]
            )

    def _run_get(self, reads: list[list[int]], out: list[np.ndarray], count: int) -> list[int]:
        lost = set(range(count)) - {row for row, _, _ in reads}
        for index in sorted({tier for _, tier, _ in reads}):
            batch = [(row, slot) for row, tier, slot in reads if tier == index]
            slots = [slot for _, slot in batch]
            bad = self.format.read_rows(functools.partial(self._read, index), slots, [row for row, _ in batch], out)
            lost.update(row for row, slot in batch if slot in bad)
        return sorted(lost)

    def _run_moves(self, moves: list[list[Any]]) -> None:
        """Demotions, deepest first (as `TieredStore` applies them), each record written under its key."""
        for source, source_slot, target, target_slot, key in sorted(moves, key=lambda m: -m[0]):
            staging = self.format.empty(1)
            if self._read(source, [source_slot], staging):
                self._discard([(target, target_slot)])
            else:
                self._write(target, [target_slot], [key], staging)

    def _usable(self, index: int, slots: Sequence[int]) -> StorageBackend | None:
        tier = self.tiers[index]
        return tier if tier is not None and all(slot < tier.capacity_slots for slot in slots) else None

    def _read(self, index: int, slots: list[int], out: list[np.ndarray]) -> set[int]:
        """The slots of ``slots`` that are lost on this rank (all of them when the tier cannot be read)."""
        tier = self._usable(index, slots)
        try:
            return set(slots) if tier is None else set(tier.read(slots, out))
        except OSError as exc:
            self._warn(index, f"read failed ({exc})")
            return set(slots)

    def _write(self, index: int, slots: list[int], keys: list[int | None], arrays: list[np.ndarray]) -> None:
        tier = self._usable(index, slots)
        try:
            if tier is None:
                raise StorageFullError("the tier is not open on this rank, or too small")
            tier.write(slots, keys, arrays)
        except (OSError, StorageFullError) as exc:
            self._warn(index, f"cannot store blocks ({exc})")
            self._discard([(index, slot) for slot in slots])

    def _discard(self, slots: list[tuple[int, int]]) -> None:
        for index, slot in slots:
            tier = self.tiers[index]
            if tier is not None and slot < tier.capacity_slots:
                tier.discard([slot])

    def _warn(self, index: int, problem: str) -> None:
        """One warning per tier: its records are recomputed on every rank when they are needed."""
        if index not in self._warned:
            self._warned.add(index)
            log.warning("KV tier %d on this rank: %s; its records are recomputed instead", index, problem)
