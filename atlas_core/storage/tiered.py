"""`TieredStore`: records under caller keys across storage tiers (fastest first), with LRU demotion.

New records go to the fastest tier with room. When a tier is full, its least recently used unpinned
record moves one tier down (or is dropped from the last tier) to make room. Pinned records (a swapped-out
sequence's, which must come back) are never evicted. A tier that fails a write (disk full, unwritable
path) is logged once and left out from then on: its records are forgotten and callers fall back to the
remaining tiers, or to recomputing.

Threads: the caller (the engine thread) decides where records go and which slots a read takes at call time,
under a lock; the tiers' reads and writes run on one I/O thread of the store, in call order, so a write
overlaps the model's forward and a read issued after a write of the same slot sees it. `put_async` and
`get_async` return futures; `put` and `get` wait for them. Only the I/O thread calls the backends.

Journal (split replicas): with ``journal`` set, every decision the caller's calls make is also handed to it, in
call order, as a JSON-able dict naming explicit tiers (by index) and slots: ``put`` (demotions ``moves`` and
the new records' ``placed`` ``[tier, slot, row, key]``, with the caller's ``source``), ``get`` (``reads``
``[row, tier, slot]``), ``drop`` (``slots`` ``[tier, slot]``), ``demote`` and ``close``. Another rank that
runs them on tiers of its own (`atlas_core.storage.replay.TierReplay`) keeps its records in the same slots.
Forgetting done on the I/O thread (a failed write, a lost read) is not journaled: the slots are only freed,
and a later journaled ``put`` overwrites them.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atlas_core.storage.backend import RecordFormat, StorageBackend, StorageFullError

log = logging.getLogger("atlas.storage")

Key = Hashable
Journal = Callable[[dict[str, Any]], None]
Records = Sequence[np.ndarray] | Callable[[], Sequence[np.ndarray]]
"""A batch of records: one array per format entry, or a wait that gives them (a device copy in flight)."""


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


@dataclass(frozen=True)
class _Read:
    row: int
    key: Key
    tier: int
    slot: int


class TieredStore:
    """Records of one `RecordFormat` under hashable keys, spread over ``tiers`` (``(name, backend)``,
    fastest first). One thread calls its methods (the engine's); the I/O runs on the store's own thread."""

    def __init__(self, format: RecordFormat, tiers: Sequence[tuple[str, StorageBackend]], name: str = "kv") -> None:
        self.format, self.name = format, name
        self.journal: Journal | None = None
        self._lock = threading.RLock()  # the index: changed by callers, and by the I/O thread on failures
        self._io = ThreadPoolExecutor(1, thread_name_prefix="atlas-kv-io")
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

    def put(self, keys: Sequence[Key], arrays: Records, *, pinned: bool, tier: str | None = None) -> list[Key]:
        """`put_async`, waited for."""
        return self.put_async(keys, arrays, pinned=pinned, tier=tier).result()

    def put_async(
        self,
        keys: Sequence[Key],
        arrays: Records,
        *,
        pinned: bool,
        tier: str | None = None,
        source: Callable[[], Any] | None = None,
    ) -> Future[list[Key]]:
        """Store record ``i`` (``arrays[j][i]``) under ``keys[i]`` (already stored keys are only marked
        recently used); the future gives the keys stored afterwards. Evicts least recently used unpinned
        records to make room; records that find no room anywhere are not stored. ``tier``: place the records
        in that tier or below (default: the fastest with room).

        Where each record goes is decided now (`__contains__` and `room` count it at once); the writes run on
        the I/O thread, which calls ``arrays`` first when it is a wait. A record whose write fails is forgotten.
        ``source()``: what the records are, for the journal (another rank gathers its own)."""
        start = 0 if tier is None else self.tier_names.index(tier)
        placed: list[tuple[int, Key, int, int]] = []  # (tier, key, slot, row)
        moves: list[_Move] = []
        stored: list[Key] = []
        with self._lock:
            fresh: set[Key] = set()  # placed by this call, not written yet: never evicted by it
            for row, key in enumerate(keys):
                if key in self._where:
                    self._touch(key)
                    stored.append(key)
                    continue
                spot = self._make_room(start, moves, fresh)
                if spot is None:
                    continue
                index, slot = spot
                self._file(key, index, slot, pinned)
                fresh.add(key)
                placed.append((index, key, slot, row))
            if self.journal is not None:
                rows = [[index, slot, row, key if isinstance(key, int) else None] for index, key, slot, row in placed]
                self._log("put", moves=_moves(moves), placed=rows, source=source() if source else None)
        return self._io.submit(self._run_put, moves, placed, arrays, stored)

    def _run_put(
        self, moves: list[_Move], placed: list[tuple[int, Key, int, int]], arrays: Records, stored: list[Key]
    ) -> list[Key]:
        """I/O thread: the demotions, then the writes of `put_async`."""
        self._apply_moves(moves)
        try:
            records = arrays() if callable(arrays) else arrays
        except Exception:  # the device copy failed: nothing of this batch is stored
            log.exception("KV tiers: the blocks to store could not be copied from the device")
            with self._lock:
                self._forget([(key, index, slot) for index, key, slot, _ in placed])
            return stored
        for index in range(len(self._tiers)):
            batch = [(key, slot, row) for tier, key, slot, row in placed if tier == index]
            slots, batch_keys, rows = [s for _, s, _ in batch], [k for k, _, _ in batch], [r for *_, r in batch]
            if batch and self._write(index, slots, batch_keys, records, rows):
                stored.extend(batch_keys)
        return stored

    def get(self, keys: Sequence[Key], out: Sequence[np.ndarray]) -> list[Key]:
        """`get_async`, waited for."""
        return self.get_async(keys, out).result()

    def get_async(self, keys: Sequence[Key], out: Sequence[np.ndarray]) -> Future[list[Key]]:
        """Copy the records of ``keys`` into rows ``0 .. len(keys) - 1`` of ``out`` (on the I/O thread, after
        every write already asked for); the future gives the keys that are lost (not stored, unreadable or
        corrupt: they are forgotten), whose rows are undefined. Found keys become the most recently used now."""
        with self._lock:
            missing = [key for key in keys if key not in self._where]
            reads = [_Read(row, key, *self._where[key]) for row, key in enumerate(keys) if key in self._where]
            for read in reads:
                self._touch(read.key)
            self._log("get", reads=[[read.row, read.tier, read.slot] for read in reads], count=len(keys))
        return self._io.submit(self._run_get, reads, out, missing)

    def _run_get(self, reads: list[_Read], out: Sequence[np.ndarray], lost: list[Key]) -> list[Key]:
        """I/O thread: the reads of `get_async`, tier by tier."""
        for index, tier in enumerate(self._tiers):
            batch = [read for read in reads if read.tier == index]
            if not batch:
                continue
            slots = [read.slot for read in batch]
            try:
                rows = [read.row for read in batch]
                bad = set(slots) if tier.failed else self.format.read_rows(tier.backend.read, slots, rows, out)
            except OSError as exc:
                log.warning("KV tier %r: read failed (%s); its records are recomputed instead", tier.name, exc)
                bad = set(slots)
            with self._lock:
                tier.reads += len(batch)
                self._forget([(read.key, index, read.slot) for read in batch if read.slot in bad])
            lost.extend(read.key for read in batch if read.slot in bad)
        return lost

    def drop(self, keys: Sequence[Key]) -> None:
        """Forget ``keys`` (unknown ones are ignored) and free their slots (the tiers hear of it in call order)."""
        self._drop(keys, journaled=True)

    def _drop(self, keys: Sequence[Key], journaled: bool) -> None:
        discards: list[tuple[int, int]] = []
        with self._lock:
            for key in keys:
                where = self._where.pop(key, None)
                if where is None:
                    continue
                tier = self._tiers[where[0]]
                tier.unpinned.pop(key, None)
                tier.pinned.pop(key, None)
                tier.free.append(where[1])
                discards.append(where)
            if journaled and discards:
                self._log("drop", slots=[list(where) for where in discards])
        if discards:
            self._io.submit(self._discard, discards)

    def _discard(self, discards: list[tuple[int, int]]) -> None:
        for index, slot in discards:
            if not self._tiers[index].failed:
                self._tiers[index].backend.discard([slot])

    def sync(self) -> None:
        """Wait until every read and write asked for so far is done."""
        self._io.submit(lambda: None).result()

    def demote(self, tier: str) -> None:
        """Move the unpinned records of every faster tier down into ``tier`` (most recently used first, while
        it has room that is not theirs; before closing, so that a persistent tier keeps them)."""
        target = self.tier_names.index(tier)
        moves: list[_Move] = []
        with self._lock:
            if not self._tiers[target].usable:
                return
            fresh: set[Key] = set()
            for index in range(target):
                source = self._tiers[index]
                for key in reversed(list(source.unpinned)):
                    spot = self._make_room(target, moves, fresh)
                    if spot is None:
                        break
                    slot = source.unpinned.pop(key)
                    source.free.append(slot)
                    moves.append(_Move(key, index, slot, *spot))
                    self._file(key, spot[0], spot[1], pinned=False)
                    fresh.add(key)
            self._log("demote", moves=_moves(moves))
        self._io.submit(self._apply_moves, moves).result()

    def close(self) -> None:
        """Finish the I/O asked for, stop the I/O thread and close every tier."""
        self._log("close")
        self._io.shutdown(wait=True)
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

    def _log(self, do: str, **fields: Any) -> None:
        """Hand one decision to the journal (if any)."""
        if self.journal is not None:
            self.journal({"do": do, "store": self.name, **fields})

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
        """I/O thread: copy demoted records down, deepest first (a slot vacated below is written before it is
        read); a record that cannot be read or written is forgotten."""
        for move in sorted(moves, key=lambda m: -m.source):
            staging = self.format.empty(1)
            source = self._tiers[move.source]
            lost = source.failed or bool(source.backend.read([move.source_slot], staging))
            with self._lock:
                source.reads += 1
            if lost or not self._write(move.target, [move.target_slot], [move.key], staging, [0]):
                with self._lock:
                    self._forget([(move.key, move.target, move.target_slot)])

    def _forget(self, entries: list[tuple[Key, int, int]]) -> None:
        """I/O thread, under the lock: forget each ``(key, tier, slot)`` still filed there (the caller may have
        dropped and stored the key again since)."""
        for key, index, slot in entries:
            if self._where.get(key) == (index, slot):
                self._drop([key], journaled=False)

    def _write(
        self, index: int, slots: list[int], keys: list[Key], arrays: Sequence[np.ndarray], rows: list[int]
    ) -> bool:
        """I/O thread: write rows ``rows`` of ``arrays`` to tier ``index``; on failure the tier is left out from
        now on (with one warning) and its records are forgotten."""
        tier = self._tiers[index]
        if tier.failed:
            return False
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
            with self._lock:
                tier.failed = True
                self._drop([key for key, (i, _) in list(self._where.items()) if i == index], journaled=False)
            return False
        with self._lock:
            tier.writes += len(slots)
        return True


def _moves(moves: list[_Move]) -> list[list[int | None]]:
    """Demotions as the journal writes them: ``[source tier, source slot, target tier, target slot, key]`` (the
    key when it is an int, as persisted records' keys are, else None), so a replaying rank files the moved
    record under the same key."""
    return [
        [move.source, move.source_slot, move.target, move.target_slot, move.key if isinstance(move.key, int) else None]
        for move in moves
    ]
