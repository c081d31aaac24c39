"""Where a rank's KV storage tiers are and what their records hold: the record formats of KV blocks and
recurrent states, `TierPlace` (directory, identity, persistence; ``kv_spill_dir/rank-N`` on split replicas), and
opening a tier by name (core's ``host``, the atlas-storage-nvme plugin's ``nvme``)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from atlas_core.batch.kv_cache import KVCache
from atlas_core.errors import ConfigError
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.plugins import get_registry
from atlas_core.storage.backend import RecordFormat, StorageBackend, StorageFullError, TierSpec
from atlas_core.storage.host import HostMemoryStorage

log = logging.getLogger("atlas.engine")

NVME_BACKEND = "nvme"


def kv_record_format(kv: KVCache) -> RecordFormat:
    """One KV block over every layer, plus ``int64[block_size + 1]``: its parent hash and token ids."""
    return RecordFormat((*kv.block_shapes(), ((kv.block_size + 1,), np.dtype(np.int64))))


def state_record_format(state: RecurrentState) -> RecordFormat:
    """One sequence's recurrent state over every layer."""
    return RecordFormat(tuple(state.slot_shapes()))


@dataclass(frozen=True)
class TierPlace:
    """Where a rank's file-backed tiers live and whom their records belong to: ``spill_dir`` (None: no NVMe
    tier), the model, persistence, and ``rank_tag`` (split replicas: the parallel sizes and the rank, whose
    ``rank-N`` subdirectory holds this rank's files)."""

    spill_dir: Path | None
    model_name: str
    persist: bool
    rank_tag: tuple[int, int, int] | None = None
    kv_scales: tuple[tuple[float, float] | None, ...] = ()
    """The KV cache's per-layer fp8 scales (`KVCache.scales`): records stored under other scales read wrong, so
    they are part of a persisted KV tier's identity (when any layer is scaled)."""

    def spec(self, format: RecordFormat, capacity_bytes: int, part: str) -> TierSpec:
        """The `TierSpec` of this rank's NVMe tier of ``part`` (``kv`` or ``state``)."""
        assert self.spill_dir is not None
        identity = f"{self.model_name}|{format}"
        if part == "kv" and any(scales is not None for scales in self.kv_scales):
            identity += f"|kv_scales={list(self.kv_scales)}"
        directory = self.spill_dir / part
        if self.rank_tag is not None:
            rank, tp, ep = self.rank_tag
            identity += f"|tensor_parallel_size={tp}|expert_parallel_size={ep}|rank={rank}"
            directory = self.spill_dir / f"rank-{rank}" / part
        return TierSpec(format, capacity_bytes, directory, hashlib.sha256(identity.encode()).hexdigest(), self.persist)


def open_tiers(
    format: RecordFormat, sizes: list[tuple[str, int]], place: TierPlace, part: str
) -> list[tuple[str, StorageBackend]]:
    """The tiers of ``sizes`` (``(name, capacity bytes)``, fastest first: ``host``, ``nvme``) that have room and
    could be opened."""
    tiers: list[tuple[str, StorageBackend]] = []
    for name, capacity in sizes:
        tier = open_tier(format, name, capacity, place, part)
        if tier is not None:
            tiers.append((name, tier))
    return tiers


def open_tier(format: RecordFormat, name: str, capacity: int, place: TierPlace, part: str) -> StorageBackend | None:
    """Tier ``name`` of ``capacity`` bytes; None when it has no room, no directory, or cannot be opened."""
    if capacity <= 0:
        return None
    if name == "host":
        return HostMemoryStorage(TierSpec(format, capacity))
    return _open_nvme(place.spec(format, capacity, part)) if place.spill_dir is not None else None


def _open_nvme(spec: TierSpec) -> StorageBackend | None:
    """The NVMe tier, or None (with one warning) when its directory cannot be used; ConfigError when the
    plugin is not installed or the directory is another engine's."""
    registration = get_registry().find("storage", NVME_BACKEND)
    if registration is None:
        raise ConfigError(
            "kv_spill_dir needs the NVMe storage tier: install the atlas-storage-nvme plugin, or unset kv_spill_dir"
        )
    try:
        backend: StorageBackend = registration.load()(spec)
        return backend
    except (OSError, StorageFullError) as exc:
        log.warning("KV tier on %s cannot be used (%s); running without it", spec.directory, exc)
        return None
