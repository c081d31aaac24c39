"""What every rank of a split replica runs together for its KV storage tiers: `agree_loads` settles loads from
every rank's flags (one all-reduce), `reconcile` keeps the persisted records every rank holds alike (one
all-gather per tier), `rank_capacity` sizes a rank's tier like rank 0's (`atlas_core.parallel.tier_mirror`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from atlas_core.backends.base import Backend
from atlas_core.kvtiers.loads import Load
from atlas_core.model.sharding import TensorParallel
from atlas_core.storage.backend import StorageBackend


def rank_capacity(capacity: int, rank_0_nbytes: int, nbytes: int) -> int:
    """The bytes a rank whose records are ``nbytes`` long gives the tier that rank 0 sized ``capacity`` bytes for
    records of ``rank_0_nbytes``: the same when the records are (the same slot count), else scaled, with a slot
    of slack (a slot of a rank beyond its tier's capacity reads as lost)."""
    if nbytes == rank_0_nbytes:
        return capacity
    return -(-capacity * nbytes // max(rank_0_nbytes, 1)) + nbytes + 8192


def agree_loads(parallel: TensorParallel, backend: Backend, loads: Sequence[Load]) -> None:
    """Every rank, in the same order with the same ``loads`` (by id): settle those every rank has fetched, from
    the sum of every rank's `Load.flags` (one all-reduce)."""
    flags: list[int] = []
    for load in loads:
        flags += [1, *load.flags()] if load.fetched else [0] * (len(load.keys) + 2)
    summed = backend.to_numpy(
        parallel.comm.all_reduce(backend.from_numpy(np.asarray(flags, np.int32), dtype=np.dtype(np.int32)))
    )
    offset = 0
    for load in loads:
        part = [int(v) for v in np.asarray(summed)[offset : offset + len(load.keys) + 2]]
        offset += len(load.keys) + 2
        if part[0] == parallel.plan.world_size:
            load.settle(part[1:])


def closed_everywhere(parallel: TensorParallel, backend: Backend) -> None:
    """Every rank, once its tiers are closed (their last writes done): one all-reduce, so that rank 0 goes on
    to stop the replica only when every rank has written what it persists."""
    parallel.comm.all_reduce(backend.from_numpy(np.ones(1, np.int32), dtype=np.dtype(np.int32)))


def reconcile(
    parallel: TensorParallel, backend: Backend, tiers: Sequence[StorageBackend | None], slots: Sequence[int]
) -> None:
    """Every rank, with its tiers aligned to rank 0's (None: not open here) and rank 0's slot counts: discard the
    persisted records that not every rank holds under the same key in the same slot (one all-gather per tier)."""
    world = parallel.plan.world_size
    for tier, count in zip(tiers, slots, strict=True):
        mine = np.zeros((count, 2), np.int64)
        persisted = tier.persisted() if tier is not None else {}
        for slot, key in persisted.items():
            if slot < count:
                mine[slot] = (1, key)
        gathered = backend.to_numpy(parallel.comm.all_gather(backend.from_numpy(mine, dtype=np.dtype(np.int64))))
        every = np.asarray(gathered).reshape(world, count, 2)
        agreed = (every[:, :, 0] == 1).all(axis=0) & (every[:, :, 1] == every[0:1, :, 1]).all(axis=0)
        dropped = [slot for slot in persisted if slot >= count or not agreed[slot]]
        if tier is not None and dropped:
            tier.discard(dropped)
