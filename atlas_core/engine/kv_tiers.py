"""Build the engine's storage tiers from its settings: host memory (``swap_space_gb``), then NVMe
(``kv_spill_dir`` / ``kv_spill_gb``, the ``nvme`` storage backend of the atlas-storage-nvme plugin)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from atlas_core.batch.kv_cache import KVCache
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.config import EngineConfig
from atlas_core.engine.kv_offload import KVOffload, kv_record_format, state_record_format
from atlas_core.engine.state_slots import StateSnapshots
from atlas_core.errors import ConfigError
from atlas_core.model.recurrent_state import RecurrentState
from atlas_core.plugins import get_registry
from atlas_core.storage.backend import RecordFormat, StorageBackend, StorageFullError, TierSpec
from atlas_core.storage.host import HostMemoryStorage
from atlas_core.storage.tiered import TieredStore

log = logging.getLogger("atlas.engine")

NVME_BACKEND = "nvme"
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
) -> KVOffload | None:
    """The `KVOffload` the settings ask for, or None when no tier is configured. Hybrid models (``state``)
    spill prefix blocks only with state ``snapshots`` (their prefix cache needs them)."""
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
    identity = hashlib.sha256(f"{model_name}|{kv_format}".encode()).hexdigest()
    store = TieredStore(
        kv_format,
        _tiers(kv_format, host_bytes - state_host, nvme_bytes - state_nvme, spill_dir, "kv", identity, config),
    )
    state_store = None
    if state_format is not None:
        state_store = TieredStore(
            state_format, _tiers(state_format, state_host, state_nvme, spill_dir, "state", identity, config)
        )
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
    )


def _tiers(
    format: RecordFormat,
    host_bytes: int,
    nvme_bytes: int,
    spill_dir: Path | None,
    part: str,
    identity: str,
    config: EngineConfig,
) -> list[tuple[str, StorageBackend]]:
    tiers: list[tuple[str, StorageBackend]] = []
    if host_bytes > 0:
        tiers.append(("host", HostMemoryStorage(TierSpec(format, host_bytes))))
    if spill_dir is not None and nvme_bytes > 0:
        spec = TierSpec(format, nvme_bytes, spill_dir / part, identity, config.kv_spill_persist)
        nvme = _open_nvme(spec)
        if nvme is not None:
            tiers.append(("nvme", nvme))
    return tiers


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
