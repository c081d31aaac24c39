"""`KVOffload`: moves KV blocks (and recurrent states) between the device KV cache and the storage tiers.

Three uses, through one `TieredStore` of KV blocks (host memory, then NVMe) and, on hybrid models, one of
recurrent states:

- **Preemption by swap**: `swap_out` starts copying a preempted sequence's computed blocks (and its
  recurrent state slot) to pinned records; on readmission `start_swap_in` brings them back into its fresh
  blocks, so it continues exactly where it stopped. A lost record (a corrupt or unreadable disk block) makes
  the sequence recompute instead.
- **Prefix-cache spill**: a full block the device prefix cache evicts is stored under its chained hash
  (`BlockManager.on_evict`), with its token ids and parent hash; on a hybrid model the state snapshot taken
  at that block's end (`StateSnapshots`) goes with it, into the state store under the same hash.
  `start_prefix_load` extends a prompt's device hit with spilled blocks whose tokens and parent hash match (a
  hash collision can only cost a miss); a hybrid model's hit must end on a block with a spilled snapshot,
  which is loaded into the sequence's state slot.
- **Write at shutdown**: with a persistent tier (``kv_spill_persist``), `close` moves every record of the
  faster tiers into it and writes the device prefix cache's blocks (and snapshots) there too, so a restarted
  engine finds them.

Transfers overlap compute: device -> host copies are started with `HostTransfers.gather` (ordered after the
ops issued so far, so blocks may be reused at once) and written to the tiers on the store's I/O thread; loads
run as `Loads` (fetch on the I/O thread, upload through `HostTransfers.scatter`) while their sequences wait
unscheduled. Evicted blocks are gathered before any write of the step that evicted them (`poll`,
`before_forward`), so a spilled record holds the block's old KV.

Split replicas (``mirror``): the stores' journals and the loads are posted to the other ranks
(`atlas_core.parallel.tier_mirror`); each ``put`` names its ``source`` (``kv`` blocks with their check rows, or
``state`` slots), which every rank gathers from its own shard at the same point of the step sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from atlas_core.batch.kv_cache import KVCache
from atlas_core.engine.block_manager import ROOT_HASH, BlockManager, CachedBlock, block_hash
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.state_slots import StateSnapshots
from atlas_core.kvtiers.loads import Load, LoadMirror, Loads
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.storage.tiered import Key, TieredStore


@dataclass
class _Swapped:
    """Where a swapped-out sequence's records are: one key per computed block, and its state's key."""

    block_keys: list[Key]
    num_computed: int
    state_key: Key | None


class KVOffload:
    """The engine's transfers to and from the storage tiers (see the module docstring).

    ``swap``: preempt by swap (else callers recompute). ``spill``: keep evicted prefix-cache blocks.
    ``state``/``state_store``: hybrid models' recurrent state and the store for swapped states and spilled
    snapshots (``snapshots``). ``persist_tier``: the tier `close` writes everything worth keeping to.
    ``mirror``: rank 0 of a split replica (the stores' journals must already go to it).
    Counters: ``swap_outs``, ``swap_ins``, ``swap_lost`` (sequences that had to recompute),
    ``spill_hit_tokens`` (prompt tokens loaded from the tiers), ``spill_lost_blocks``.
    Engine thread only (the stores do their I/O on their own threads).
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
        snapshots: StateSnapshots | None = None,
        persist_tier: str | None = None,
        mirror: LoadMirror | None = None,
    ) -> None:
        self.kv, self.blocks, self.store = kv, blocks, store
        self.swap, self.spill = swap, spill
        self.state, self.state_store, self.snapshots = state, state_store, snapshots
        self.persist_tier = persist_tier
        self.transfers = kv.backend.host_transfers()
        self.loads = Loads(self.transfers, kv.arrays, state.slot_arrays() if state is not None else [], mirror)
        self.swap_outs = self.swap_ins = self.swap_lost = 0
        self.spill_hit_tokens = self.spill_lost_blocks = 0
        self._swapped: dict[Sequence, _Swapped] = {}
        self._ids = itertools.count()
        self._spills: list[CachedBlock] = []
        self._closed = False
        if spill:
            blocks.on_evict = self._spills.append

    def is_swapped(self, seq: Sequence) -> bool:
        return seq in self._swapped

    def is_loading(self, seq: Sequence) -> bool:
        """True while ``seq``'s KV is on its way back: it holds its blocks but must not be scheduled."""
        return seq in self.loads

    @property
    def num_swapped(self) -> int:
        """Sequences whose KV waits in the tiers."""
        return len(self._swapped)

    def swap_out(self, seq: Sequence, pending_copies: Iterable[tuple[int, int]] = ()) -> bool:
        """Start copying ``seq``'s computed blocks (and state) to the tiers; the scheduler frees them right
        after. False (nothing stored) when swapping is off, there is nothing computed, or the tiers lack room.

        ``pending_copies``: this step's copy-on-write copies ``(src, dst)`` of ``seq`` that are not applied
        yet: a ``dst`` block of the table is read from its ``src``."""
        count = self.blocks.blocks_for(seq.num_computed)
        if not self.swap or count == 0 or self.store.room() < count:
            return False
        if self.state is not None and (
            self.state_store is None or self.state_store.room() < 1 or seq.state_slot is None
        ):
            return False
        source_of = {dst: src for src, dst in pending_copies}
        sources = [source_of.get(block, block) for block in seq.table.blocks[:count]]
        uid = next(self._ids)
        keys: list[Key] = [("swap", uid, i) for i in range(count)]
        self._put_blocks(keys, sources, None, pinned=True)
        state_key: Key | None = None
        if self.state is not None and self.state_store is not None:
            state_key = ("state", uid)
            self._put_states([state_key], [seq.held_state_slot()], pinned=True)
        self._swapped[seq] = _Swapped(keys, seq.num_computed, state_key)
        self.swap_outs += 1
        return True

    def start_swap_in(self, seq: Sequence) -> None:
        """After the scheduler gave a swapped-out ``seq`` fresh blocks (and a fresh state slot): start loading
        its records. It stays unscheduled (`is_loading`) until they are in; then ``num_computed`` is where it
        stopped, or 0 when a record was lost (it recomputes). The records are dropped once the load is over."""
        record = self._swapped[seq]
        rows = self.transfers.host_rows(self.store.format, len(record.block_keys))
        state = None
        if record.state_key is not None and self.state_store is not None:
            state_rows = self.transfers.host_rows(self.state_store.format, 1)
            state = (seq.held_state_slot(), state_rows, self.state_store.get_async([record.state_key], state_rows))

        def done(load: Load) -> None:
            del self._swapped[seq]
            self._drop(record)
            seq.num_computed = record.num_computed if load.good else 0
            self.swap_ins += bool(load.good)
            self.swap_lost += not load.good

        fetch = self.store.get_async(record.block_keys, rows)
        self.loads.start(Load(seq, list(seq.table.blocks), rows, fetch, record.block_keys, done, state=state))

    def forget(self, seq: Sequence) -> None:
        """Drop the records (and any load) of a sequence that finished or was aborted."""
        self.loads.cancel(seq)
        record = self._swapped.pop(seq, None)
        if record is not None:
            self._drop(record)

    def cancel_load(self, seq: Sequence) -> bool:
        """Stop ``seq``'s load (it is being preempted; a swapped sequence keeps its records); False if none."""
        return self.loads.cancel(seq)

    def start_prefix_load(self, seq: Sequence, cached: int) -> bool:
        """Extend a new prompt's device prefix hit of ``cached`` tokens with spilled blocks: start loading the
        longest run of matching records into the table's next blocks (on a hybrid model: the longest ending
        on a block with a spilled state snapshot). True when a load started: ``seq`` then stays unscheduled
        until it is over, and its ``num_computed`` grows by the tokens loaded. Like a device hit, the last
        prompt token is never loaded (its logits are needed)."""
        if not self.spill:
            return False
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
        state = None
        if self.state_store is not None:  # a hybrid model: the hit ends where a snapshot was spilled
            while keys and keys[-1] not in self.state_store:
                keys.pop()
            if keys:
                state_rows = self.transfers.host_rows(self.state_store.format, 1)
                state = (seq.held_state_slot(), state_rows, self.state_store.get_async(keys[-1:], state_rows))
        if not keys:
            return False

        def done(load: Load) -> None:
            self.store.drop([key for key in load.bad if key in self.store])  # corrupt, or another prefix's hash
            self.spill_lost_blocks += len(load.bad)
            self.spill_hit_tokens += load.good * size
            seq.num_computed = cached + load.good * size
            if load.good and seq.counts_cached_tokens:
                seq.request.num_cached_tokens += load.good * size

        rows = self.transfers.host_rows(self.store.format, len(keys))
        fetch = self.store.get_async(keys, rows)
        blocks = seq.table.blocks[first : first + len(keys)]
        self.loads.start(Load(seq, blocks, rows, fetch, keys, done, expected[: len(keys)], state))
        return True

    def poll(self) -> None:
        """Before scheduling: gather blocks evicted since the last call, then advance the loads (sequences whose
        load is over get their ``num_computed`` and may be scheduled)."""
        self._store_spills()
        self.loads.poll()

    def wait(self, timeout: float) -> None:
        """Block (the engine thread, when nothing else can run) until a load may have moved on."""
        self.loads.wait(timeout)

    def before_forward(self) -> None:
        """Before the step's forward (and its copy-on-write copies): gather the blocks this step evicted."""
        self._store_spills()

    def sync(self) -> None:
        """Wait until every transfer to and from the tiers asked for so far is done (tests, shutdown)."""
        self.store.sync()
        if self.state_store is not None:
            self.state_store.sync()

    def close(self) -> None:
        """Finish the transfers, write what a persistent tier should keep (see the module docstring) and close
        the tiers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._store_spills()
        if self.persist_tier is not None and self.spill:
            self._write_back(self.persist_tier)
        self.store.close()
        if self.state_store is not None:
            self.state_store.close()
        if self.loads.mirror is not None:
            self.loads.mirror.closed()

    def _write_back(self, tier: str) -> None:
        """Move the faster tiers' records into ``tier``, then store the device prefix cache's blocks (and
        their snapshots) there: the most recent records are written last, so they are the ones kept."""
        stores = [s for s in (self.store, self.state_store) if s is not None and tier in s.tier_names]
        for store in stores:
            store.demote(tier)
        self._store(self.blocks.cached_blocks(), tier)
        for store in stores:
            store.sync()

    def _store_spills(self) -> None:
        spills, self._spills[:] = list(self._spills), []
        self._store(spills)

    def _store(self, cached: list[CachedBlock], tier: str | None = None) -> None:
        """Start copying prefix-cache blocks (and, on a hybrid model, the snapshots taken at their ends, which
        then leave the device pool) into the tiers, under their hashes."""
        blocks = [c for c in cached if c.hash not in self.store]
        if blocks:
            meta = np.asarray([(c.parent_hash, *c.tokens) for c in blocks], dtype=np.int64)
            self._put_blocks([c.hash for c in blocks], [c.block for c in blocks], meta, pinned=False, tier=tier)
        snapshots, state_store = self.snapshots, self.state_store
        if snapshots is None or self.state is None or state_store is None:
            return
        taken = [(c, slot) for c in cached if (slot := snapshots.slot_of(c.content)) is not None]
        missing = [(c, slot) for c, slot in taken if c.hash not in state_store]
        if missing and (tier is None or tier in state_store.tier_names):
            self._put_states([c.hash for c, _ in missing], [slot for _, slot in missing], pinned=False, tier=tier)
        if tier is None:  # evicted blocks: their snapshots can never be hit on the device again
            for c, _ in taken:
                snapshots.discard(c.content)

    def _put_blocks(
        self, keys: list[Key], blocks: list[int], meta: np.ndarray | None, *, pinned: bool, tier: str | None = None
    ) -> None:
        """Start the device -> host copy of ``blocks`` and store them under ``keys`` (``meta``: their check rows;
        default zeros)."""
        gathered = self.transfers.gather(self.kv.arrays, blocks)
        rows = meta if meta is not None else np.zeros((len(blocks), self.kv.block_size + 1), np.int64)
        self.store.put_async(
            keys,
            lambda: [*gathered(), rows],
            pinned=pinned,
            tier=tier,
            source=lambda: {"kind": "kv", "rows": blocks, "meta": None if meta is None else meta.tolist()},
        )

    def _put_states(self, keys: list[Key], slots: list[int], *, pinned: bool, tier: str | None = None) -> None:
        """Start the device -> host copy of recurrent-state ``slots`` and store them under ``keys``."""
        assert self.state is not None and self.state_store is not None
        gathered = self.transfers.gather(self.state.slot_arrays(), slots)
        self.state_store.put_async(
            keys, gathered, pinned=pinned, tier=tier, source=lambda: {"kind": "state", "rows": slots}
        )

    def _drop(self, record: _Swapped) -> None:
        self.store.drop(record.block_keys)
        if record.state_key is not None and self.state_store is not None:
            self.state_store.drop([record.state_key])
