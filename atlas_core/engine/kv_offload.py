"""`KVOffload`: moves KV blocks (and recurrent states) between the device KV cache and the storage tiers.

Two uses, both through one `TieredStore` of KV blocks (host memory, then NVMe):

- **Preemption by swap**: `swap_out` copies a preempted sequence's computed blocks (and its recurrent
  state slot, hybrid models) to pinned records; `swap_in` brings them back into the fresh blocks of its
  readmission, so it continues exactly where it stopped. A lost record (a corrupt or unreadable disk block)
  makes the sequence recompute instead.
- **Prefix-cache spill** (models without recurrent state): a full block the device prefix cache evicts is
  stored under its chained hash (`BlockManager.on_evict`), together with its token ids and parent hash;
  `load_prefix` extends a prompt's device cache hit with spilled blocks whose tokens and parent hash match
  (a hash collision can only cost a miss), so they are loaded instead of recomputed.

Ordering with the forward (`before_forward`): evicted blocks are copied out first (their KV is intact until
this step writes anything), then the step's copy-on-write copies are applied, then the loads land in their
blocks; every device write of a step happens after every read. Reads from the tiers into host staging
happen while scheduling, so a lost record is known before the scheduler counts its tokens as computed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from atlas_core.batch.kv_cache import KVCache
from atlas_core.engine.block_manager import ROOT_HASH, BlockManager, block_hash
from atlas_core.engine.sequence import Sequence
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.storage.backend import RecordFormat
from atlas_core.storage.tiered import Key, TieredStore


def kv_record_format(kv: KVCache) -> RecordFormat:
    """One KV block over every layer, plus ``int64[block_size + 1]``: its parent hash and token ids."""
    return RecordFormat((*kv.block_shapes(), ((kv.block_size + 1,), np.dtype(np.int64))))


def state_record_format(state: RecurrentState) -> RecordFormat:
    """One sequence's recurrent state over every layer."""
    return RecordFormat(tuple(state.slot_shapes()))


@dataclass
class _Swapped:
    """Where a swapped-out sequence's records are: one key per computed block, and its state's key."""

    block_keys: list[Key]
    num_computed: int
    state_key: Key | None


@dataclass
class _Spill:
    block: int
    hash: int
    parent_hash: int
    tokens: tuple[int, ...]


class KVOffload:
    """The engine's transfers to and from the storage tiers (see the module docstring).

    ``swap``: preempt by swap (else callers recompute). ``spill``: keep evicted prefix-cache blocks.
    ``state``/``state_store``: hybrid models' recurrent state and the store for swapped states.
    Counters: ``swap_outs``, ``swap_ins``, ``swap_lost`` (sequences that had to recompute),
    ``spill_hit_tokens`` (prompt tokens loaded from the tiers), ``spill_lost_blocks``.
    """

    def __init__(
        self,
        kv: KVCache,
        blocks: BlockManager,
        store: TieredStore,
        *,
        swap: bool,
        spill: bool,
        state: RecurrentState | None = None,
        state_store: TieredStore | None = None,
    ) -> None:
        self.kv, self.blocks, self.store = kv, blocks, store
        self.swap, self.spill = swap, spill
        self.state, self.state_store = state, state_store
        self.swap_outs = self.swap_ins = self.swap_lost = 0
        self.spill_hit_tokens = self.spill_lost_blocks = 0
        self._swapped: dict[Sequence, _Swapped] = {}
        self._ids = itertools.count()
        self._spills: list[_Spill] = []
        self._loads: list[tuple[list[int], list[np.ndarray]]] = []
        if spill:
            blocks.on_evict = self._evicted

    def is_swapped(self, seq: Sequence) -> bool:
        return seq in self._swapped

    @property
    def num_swapped(self) -> int:
        """Sequences whose KV waits in the tiers."""
        return len(self._swapped)

    def swap_out(self, seq: Sequence, pending_copies: Iterable[tuple[int, int]] = ()) -> bool:
        """Copy ``seq``'s computed blocks (and state) to the tiers before the scheduler frees them; False
        (nothing stored) when swapping is off, there is nothing computed, or the tiers lack room.

        ``pending_copies``: this step's copy-on-write copies ``(src, dst)`` of ``seq`` that are not applied
        yet: a ``dst`` block of the table is read from its ``src``."""
        count = self.blocks.blocks_for(seq.num_computed)
        needs_state = self.state is not None
        if not self.swap or count == 0 or self.store.room() < count:
            return False
        if needs_state and (self.state_store is None or self.state_store.room() < 1 or seq.state_slot is None):
            return False
        source_of = {dst: src for src, dst in pending_copies}
        sources = [source_of.get(block, block) for block in seq.table.blocks[:count]]
        uid = next(self._ids)
        keys: list[Key] = [("swap", uid, i) for i in range(count)]
        arrays = [*self.kv.read_blocks(sources), np.zeros((count, self.kv.block_size + 1), np.int64)]
        stored = self.store.put(keys, arrays, pinned=True)
        if len(stored) < count:
            self.store.drop(stored)
            return False
        state_key: Key | None = None
        if needs_state:
            assert self.state is not None and self.state_store is not None and seq.state_slot is not None
            state_key = ("state", uid)
            if not self.state_store.put([state_key], self.state.read_slots([seq.state_slot]), pinned=True):
                self.store.drop(keys)
                return False
        self._swapped[seq] = _Swapped(keys, seq.num_computed, state_key)
        self.swap_outs += 1
        return True

    def swap_in(self, seq: Sequence) -> int:
        """After the scheduler gave a swapped-out ``seq`` fresh blocks (and a fresh state slot): load its
        records and return how many tokens are computed again, 0 when a record was lost (it recomputes).
        The records are forgotten either way."""
        record = self._swapped.pop(seq)
        staging = self.store.format.empty(len(record.block_keys))
        lost = self.store.get(record.block_keys, staging)
        state_rows = None
        if record.state_key is not None and self.state_store is not None and not lost:
            state_rows = self.state_store.format.empty(1)
            if self.state_store.get([record.state_key], state_rows):
                lost = [record.state_key]
        self._drop(record)
        if lost:
            self.swap_lost += 1
            return 0
        if state_rows is not None and self.state is not None:
            self.state.write_slots([seq.held_state_slot()], state_rows)
        self._loads.append((seq.table.blocks[: len(record.block_keys)], staging[:-1]))
        self.swap_ins += 1
        return record.num_computed

    def forget(self, seq: Sequence) -> None:
        """Drop the records of a sequence that finished or was aborted while swapped out."""
        record = self._swapped.pop(seq, None)
        if record is not None:
            self._drop(record)

    def load_prefix(self, seq: Sequence, cached: int) -> int:
        """Extend a new prompt's device prefix hit of ``cached`` tokens with spilled blocks: load the longest
        run of matching records into the table's next blocks; return the tokens loaded (a block multiple).
        Like a device hit, the last prompt token is never loaded (its logits are needed)."""
        if not self.spill:
            return 0
        size = self.blocks.block_size
        first = cached // size
        parent = seq.table.hashes[first - 1] if first else ROOT_HASH
        keys: list[Key] = []
        expected: list[np.ndarray] = []
        cache_ids = seq.cache_ids
        for i in range(first, (len(cache_ids) - 1) // size):
            ids = tuple(cache_ids[i * size : (i + 1) * size])
            h = block_hash(parent, ids)
            if h not in self.store:
                break
            keys.append(h)
            expected.append(np.asarray((parent, *ids), dtype=np.int64))
            parent = h
        if not keys:
            return 0
        staging = self.store.format.empty(len(keys))
        lost = set(self.store.get(keys, staging))
        good = 0
        for row, key in enumerate(keys):
            if key in lost:
                break
            if not np.array_equal(staging[-1][row], expected[row]):  # corrupt, or another prefix's hash
                self.store.drop([key])
                lost.add(key)
                break
            good += 1
        self.spill_lost_blocks += len(lost)
        if good:
            self._loads.append((seq.table.blocks[first : first + good], [a[:good] for a in staging[:-1]]))
            self.spill_hit_tokens += good * size
        return good * size

    def before_forward(self, copies: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Run the step's transfers: store evicted blocks, then (when loads are pending) apply ``copies`` and
        the loads. Returns the copies still to apply (the runner applies them)."""
        self._store_spills()
        if not self._loads:
            return copies
        if copies:
            self.kv.copy_blocks(copies)
        for blocks, arrays in self._loads:
            self.kv.write_blocks(blocks, arrays)
        self._loads.clear()
        return []

    def close(self) -> None:
        self.store.close()
        if self.state_store is not None:
            self.state_store.close()

    def _evicted(self, block: int, hash_: int, parent_hash: int, tokens: tuple[int, ...]) -> None:
        self._spills.append(_Spill(block, hash_, parent_hash, tokens))

    def _store_spills(self) -> None:
        spills = [s for s in self._spills if s.hash not in self.store]
        self._spills.clear()
        if not spills:
            return
        meta = np.asarray([(s.parent_hash, *s.tokens) for s in spills], dtype=np.int64)
        arrays = [*self.kv.read_blocks([s.block for s in spills]), meta]
        self.store.put([s.hash for s in spills], arrays, pinned=False)

    def _drop(self, record: _Swapped) -> None:
        self.store.drop(record.block_keys)
        if record.state_key is not None and self.state_store is not None:
            self.state_store.drop([record.state_key])
