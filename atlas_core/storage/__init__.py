"""KV storage tiers: the `StorageBackend` contract, core's host-memory tier and the keyed multi-tier store.

The engine spills KV blocks (and hybrid models' recurrent states) to these tiers when it preempts a
sequence by swap or evicts a prefix-cache block (`atlas_core.engine.kv_offload`).
"""

from atlas_core.storage.backend import RecordFormat, StorageBackend, StorageFullError, TierSpec

__all__ = ["RecordFormat", "StorageBackend", "StorageFullError", "TierSpec"]
