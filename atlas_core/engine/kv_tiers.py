"""Build the engine's storage tiers from its settings: host memory (``swap_space_gb``), then NVMe
(``kv_spill_dir`` / ``kv_spill_gb``, the ``nvme`` storage backend of the atlas-storage-nvme plugin).

On a split replica (``mirror``) each rank has tiers of its own for its shard of every record: rank 0 builds its
tiers here and tells the other ranks to build theirs with the same slot counts
(`atlas_core.parallel.tier_mirror.SplitTiers`). Each rank's NVMe tier lives in ``kv_spill_dir/rank-N`` (its own
lock files), and its identity names the parallel sizes and the rank, so a restarted replica of the same sizes
finds its shards and one of other sizes does not use them.
"""

from __future__ import annotations

import logging
from pathlib import Path

from atlas_core.batch.kv_cache import KVCache
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.config import EngineConfig
from atlas_core.engine.kv_offload import KVOffload
from atlas_core.engine.state_slots import StateSnapshots
from atlas_core.kvtiers.place import NVME_BACKEND, TierPlace, kv_record_format, open_tiers, state_record_format
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.parallel.mirror import RankMirror
from atlas_core.parallel.tier_mirror import SplitTiers
from atlas_core.storage.tiered import TieredStore

log = logging.getLogger("atlas.engine")

STATE_SHARE = 0.25
"""Hybrid models: the part of each tier kept for recurrent states (room for max_num_seqs of them at most):
swapped-out sequences' states, and the state snapshots spilled with prefix blocks."""


def build_offload(
    config: EngineConfig,
    kv: KVCache,
    blocks: BlockManager,
    state: RecurrentState | None,
    snapshots: StateSnapshots | None,
    model_name: str,
    mirror: RankMirror | None = None,
) -> KVOffload | None:
    """The `KVOffload` the settings ask for, or None when no tier is configured. Hybrid models (``state``)
    spill prefix blocks only with state ``snapshots`` (their prefix cache needs them). ``mirror``: rank 0 of a
    split replica (the other ranks build their tiers too)."""
    host_bytes = int(config.swap_space_gb * 2**30)
    spill_dir = Path(config.kv_spill_dir) if config.kv_spill_dir is not None else None
    nvme_bytes = int(config.kv_spill_gb * 2**30) if spill_dir is not None else 0
    if not host_bytes and not nvme_bytes:
        return None
    kv_format = kv_record_format(kv)
    state_format = state_record_format(state) if state is not None else None
    state_host = state_nvme = 0
    if state_format is not None:
        wanted = config.max_num_seqs * state_format.nbytes
        state_host, state_nvme = min(wanted, int(host_bytes * STATE_SHARE)), min(wanted, int(nvme_bytes * STATE_SHARE))
    split = SplitTiers(mirror) if mirror is not None else None
    place = TierPlace(
        spill_dir, model_name, config.kv_spill_persist, split.rank_tag if split else None, tuple(kv.scales)
    )
    formats = {"kv": kv_format} | ({"state": state_format} if state_format is not None else {})
    sizes = {"kv": [("host", host_bytes - state_host), ("nvme", nvme_bytes - state_nvme)]}
    sizes["state"] = [("host", state_host), ("nvme", state_nvme)]
    tiers = {part: open_tiers(fmt, sizes[part], place, part) for part, fmt in formats.items()}
    if split is not None:  # before the stores read what the tiers persisted: only records every rank holds count
        split.start(place, {part: (fmt, tiers[part], dict(sizes[part])) for part, fmt in formats.items()})
    store = TieredStore(kv_format, tiers["kv"], "kv")
    state_store = TieredStore(state_format, tiers["state"], "state") if state_format is not None else None
    if split is not None:
        store.journal = split.record
        if state_store is not None:
            state_store.journal = split.record
    log.info("KV tiers: %s", ", ".join(f"{name} {n} blocks" for name, n in store.capacities().items()) or "none")
    persist = config.kv_spill_persist and NVME_BACKEND in store.tier_names
    return KVOffload(
        kv,
        blocks,
        store,
        swap=config.preemption_mode != "recompute",
        spill=config.enable_prefix_caching and (state is None or snapshots is not None),
        state=state,
        state_store=state_store,
        snapshots=snapshots,
        persist_tier=NVME_BACKEND if persist else None,
        mirror=split,
    )
