"""`TieredStore`: records under caller keys across storage tiers (fastest first), with LRU demotion.

New records go to the fastest tier with room. When a tier is full, its least recently used unpinned
record moves one tier down (or is dropped from the last tier) to make room. Pinned records (a swapped-out
sequence's, which must come back) are never evicted. A tier that fails a write (disk full, unwritable
path) is logged once and left out from then on: its records are forgotten and callers fall back to the
remaining tiers, or to recomputing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from atlas_core.storage.backend import RecordFormat, StorageBackend, StorageFullError

log = logging.getLogger("atlas.storage")

Key = Hashable


@dataclass
class _Tier:
    name: str
    backend: StorageBackend
    free: list[int]
    unpinned: OrderedDict[Key, int] = field(default_factory=OrderedDict)  # least recently used first
    pinned: dict[Key, int] = field(default_factory=dict)
    failed: bool = False
    reads: int = 0
    writes: int = 0

    @property
    def usable(self) -> bool:
        return not self.failed and self.backend.capacity_slots > 0


@dataclass(frozen=True)
class _Move:
    key: Key
    source: int
    source_slot: int
    target: int
    target_slot: int


class TieredStore:
    """Records of one `RecordFormat` under hashable keys, spread over ``tiers`` (``(name, backend)``,
    fastest first). Not thread-safe: the engine thread owns it."""

    def __init__(self, format: RecordFormat, tiers: Sequence[tuple[str, StorageBackend]]) -> None:
        self.format = format
        self._tiers = [_Tier(name, backend, list(range(backend.capacity_slots - 1, -1, -1))) for name, backend in tiers]
        self._where: dict[Key, tuple[int, int]] = {}
        for index, tier in enumerate(self._tiers):
            for slot, key in tier.backend.persisted().items():
                if slot in tier.free and key not in self._where:
                    tier.free.remove(slot)
                    tier.unpinned[key] = slot
                    self._where[key] = (index, slot)

    def __contains__(self, key: Key) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)

    @property
    def tier_names(self) -> list[str]:
        return [tier.name for tier in self._tiers]

    def tier_of(self, key: Key) -> str | None:
        """The name of the tier holding ``key``, None if no tier does."""
        where = self._where.get(key)
        return None if where is None else self._tiers[where[0]].name

    def room(self) -> int:
        """How many records `put` can place now: free slots of usable tiers plus those of evictable
        (unpinned) records."""
        return sum(len(t.free) + len(t.unpinned) for t in self._tiers if t.usable)

    def put(self, keys: Sequence[Key], arrays: Sequence[np.ndarray], *, pinned: bool) -> list[Key]:
        """Store record ``i`` (``arrays[j][i]``) under ``keys[i]`` (already stored keys are only marked
        recently used); return the keys that are stored afterwards. Evicts least recently used unpinned
        records to make room; records that find no room anywhere are not stored."""
        placed: list[tuple[int, Key, int, int]] = []  # (tier, key, slot, row)
        moves: list[_Move] = []
        stored: list[Key] = []
        fresh: set[Key] = set()  # placed by this call, not written yet: never evicted by it
        for row, key in enumerate(keys):
            if key in self._where:
                self._touch(key)
                stored.append(key)
                continue
            spot = self._make_room(0, moves, fresh)
            if spot is None:
                continue
            tier, slot = spot
            self._file(key, tier, slot, pinned)
            fresh.add(key)
            placed.append((tier, key, slot, row))
        self._apply_moves(moves)
        for index in range(len(self._tiers)):
            batch = [(key, slot, row) for tier, key, slot, row in placed if tier == index]
            slots, batch_keys, rows = [s for _, s, _ in batch], [k for k, _, _ in batch], [r for *_, r in batch]
            if batch and self._write(index, slots, batch_keys, arrays, rows):
                stored.extend(batch_keys)
        return stored

    def get(self, keys: Sequence[Key], out: Sequence[np.ndarray]) -> list[Key]:
        """Copy the records of ``keys`` into rows ``0 .. len(keys) - 1`` of ``out``; return the keys that
        are lost (not stored, unreadable or corrupt: they are forgotten), whose rows are undefined."""
        lost: list[Key] = [key for key in keys if key not in self._where]
        for index, tier in enumerate(self._tiers):
            rows = [row for row, key in enumerate(keys) if self._where.get(key, (-1, 0))[0] == index]
            if not rows:
                continue
            slots = [self._where[keys[row]][1] for row in rows]
            staging = self.format.empty(len(rows))
            try:
                bad = set(tier.backend.read(slots, staging))
            except OSError as exc:
                log.warning("KV tier %r: read failed (%s); its records are recomputed instead", tier.name, exc)
                bad = set(slots)
            tier.reads += len(rows)
            for position, (row, slot) in enumerate(zip(rows, slots, strict=True)):
                key = keys[row]
                if slot in bad:
                    lost.append(key)
                    self.drop([key])
                    continue
                for target, source in zip(out, staging, strict=True):
                    target[row] = source[position]
                self._touch(key)
        return lost

    def drop(self, keys: Sequence[Key]) -> None:
        """Forget ``keys`` (unknown ones are ignored) and free their slots."""
        for key in keys:
            where = self._where.pop(key, None)
            if where is None:
                continue
            tier = self._tiers[where[0]]
            tier.unpinned.pop(key, None)
            tier.pinned.pop(key, None)
            tier.free.append(where[1])
            if not tier.failed:
                tier.backend.discard([where[1]])

    def close(self) -> None:
        for tier in self._tiers:
            tier.backend.close()

    @property
    def num_pinned(self) -> int:
        """Records that are never evicted (swapped-out sequences')."""
        return sum(len(t.pinned) for t in self._tiers)

    def capacities(self) -> dict[str, int]:
        """Record slots per tier name."""
        return {t.name: t.backend.capacity_slots for t in self._tiers}

    def stats(self) -> dict[str, tuple[int, int, int]]:
        """Per tier name: ``(records held, records written, records read)``."""
        return {t.name: (len(t.pinned) + len(t.unpinned), t.writes, t.reads) for t in self._tiers}

    def _touch(self, key: Key) -> None:
        index, _ = self._where[key]
        tier = self._tiers[index]
        if key in tier.unpinned:
            tier.unpinned.move_to_end(key)

    def _file(self, key: Key, index: int, slot: int, pinned: bool) -> None:
        tier = self._tiers[index]
        (tier.pinned if pinned else tier.unpinned)[key] = slot
        self._where[key] = (index, slot)

    def _make_room(self, start: int, moves: list[_Move], fresh: set[Key]) -> tuple[int, int] | None:
        """A free ``(tier, slot)`` at tier ``start`` or below, evicting an unpinned LRU record (not one of
        ``fresh``) one tier down (recorded in ``moves``) or out of the last tier."""
        for index in range(start, len(self._tiers)):
            tier = self._tiers[index]
            if not tier.usable:
                continue
            if tier.free:
                return index, tier.free.pop()
            if not tier.unpinned or next(iter(tier.unpinned)) in fresh:
                continue
            key, slot = tier.unpinned.popitem(last=False)
            del self._where[key]
            below = self._make_room(index + 1, moves, fresh)
            if below is not None:
                moves.append(_Move(key, index, slot, *below))
                self._file(key, below[0], below[1], pinned=False)
                fresh.add(key)  # not written below yet
            return index, slot
        return None

    def _apply_moves(self, moves: list[_Move]) -> None:
        """Copy demoted records down, deepest first (a slot vacated below is written before it is read)."""
        for move in sorted(moves, key=lambda m: -m.source):
            staging = self.format.empty(1)
            source = self._tiers[move.source]
            lost = source.backend.read([move.source_slot], staging)
            source.reads += 1
            if lost or not self._write(move.target, [move.target_slot], [move.key], staging, [0]):
                self.drop([move.key])

    def _write(
        self, index: int, slots: list[int], keys: list[Key], arrays: Sequence[np.ndarray], rows: list[int]
    ) -> bool:
        """Write rows ``rows`` of ``arrays`` to tier ``index``; on failure the tier is left out from now on."""
        tier = self._tiers[index]
        picked = [a[rows] if len(rows) != len(a) or rows != list(range(len(a))) else a for a in arrays]
        try:
            tier.backend.write(slots, [key if isinstance(key, int) else None for key in keys], picked)
        except (OSError, StorageFullError) as exc:
            log.warning(
                "KV tier %r cannot store blocks (%s): it is no longer used; KV that does not fit the other "
                "tiers is recomputed instead",
                tier.name,
                exc,
            )
            tier.failed = True
            self.drop([key for key, (i, _) in list(self._where.items()) if i == index])
            return False
        tier.writes += len(slots)
        return True
