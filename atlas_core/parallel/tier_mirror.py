"""The KV storage tiers of a split replica: rank 0 decides, every rank moves its own shard.

Each rank holds its shard of every KV block (and of a hybrid model's recurrent state), so each has tiers of its
own (host memory, and NVMe in ``kv_spill_dir/rank-N``) with the same slots. Rank 0's `TieredStore`s keep the
index; their journals (`TieredStore.journal`) and the loads' starts and cancels are queued on the `RankMirror`
and go out ahead of the next thing it posts (a forward, a block copy, a state call), so every rank gathers its
blocks at the same point of the step sequence and runs the same tier operations in the same order
(`atlas_core.parallel.tier_follow`).

Loads finish together: a load is settled by `agree_loads`, one all-reduce of small integer flags in a poll in
which rank 0 has a fetched, unsettled load (rank 0 posts the loads' ids first). Only loads every rank has
fetched settle, and a record lost or failing its check on any rank is bad on every rank, so all ranks upload the
same leading records (or none: recompute) and rank 0 schedules the sequence only after its own upload, which
every other rank has fenced before its next op. No round trip is made in a step without loads to settle.

Persistence: `reconcile` keeps only the persisted records that every rank holds under the same key in the same
slot; the others are discarded on every rank before rank 0's stores read what was persisted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atlas_core.kvtiers.agree import agree_loads, closed_everywhere, reconcile
from atlas_core.kvtiers.loads import Load
from atlas_core.storage.backend import RecordFormat, StorageBackend

Store = tuple[RecordFormat, list[tuple[str, StorageBackend]], dict[str, int]]
"""Rank 0's store of one part: its record format, its tiers, and the bytes each tier was asked for."""

if TYPE_CHECKING:
    from atlas_core.kvtiers.place import TierPlace
    from atlas_core.parallel.mirror import RankMirror


class SplitTiers:
    """Rank 0's side: builds the other ranks' tiers (`start`), queues the journal (`record`), posts the loads
    and settles them with the other ranks (a `LoadMirror`)."""

    def __init__(self, mirror: RankMirror) -> None:
        self.mirror = mirror
        plan = mirror.world.parallel.plan
        self.rank_tag = (plan.rank, plan.tensor_parallel_size, plan.expert_parallel_size)

    def start(self, place: TierPlace, stores: dict[str, Store]) -> None:
        """Tell the other ranks to open tiers like rank 0's ``stores`` (per part: its record format, its tiers and
        the bytes each was asked for), then `reconcile` what they persisted."""
        spec = {
            part: {"nbytes": fmt.nbytes, "tiers": [[name, sizes[name], tier.capacity_slots] for name, tier in tiers]}
            for part, (fmt, tiers, sizes) in stores.items()
        }
        directory = None if place.spill_dir is None else str(place.spill_dir)
        self.mirror.post(
            {"op": "tiers", "stores": spec, "spill_dir": directory, "model": place.model_name, "persist": place.persist}
        )
        if place.persist:
            tiers = [tier for _, pairs, _ in stores.values() for _, tier in pairs]
            reconcile(self.mirror.world.parallel, self.mirror.backend, tiers, [tier.capacity_slots for tier in tiers])

    def record(self, op: dict[str, Any]) -> None:
        """The stores' journal: queue ``op`` for the other ranks."""
        self.mirror.tier_ops.append(op)

    def started(self, load: Load) -> None:
        expected = None if load.expected is None else [row.tolist() for row in load.expected]
        slot = None if load.state is None else load.state[0]
        self.record({"do": "load", "id": load.id, "blocks": list(load.blocks), "state": slot, "expected": expected})

    def cancelled(self, load: Load) -> None:
        self.record({"do": "cancel", "id": load.id})

    def agree(self, loads: list[Load]) -> None:
        self.mirror.post({"op": "loads", "ids": [load.id for load in loads]})
        self.mirror.guard(lambda: agree_loads(self.mirror.world.parallel, self.mirror.backend, loads))

    def closed(self) -> None:
        """After rank 0 closed its tiers: the other ranks close theirs, and rank 0 waits (at most the
        collective timeout) until they have."""
        if self.mirror.failure is None:  # a failed replica has no ranks left to tell
            self.mirror.post({"op": "tiers_closed"})
            self.mirror.guard(lambda: closed_everywhere(self.mirror.world.parallel, self.mirror.backend))
