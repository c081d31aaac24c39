"""`EngineConfig` and how its memory settings become a KV-cache budget."""

from __future__ import annotations

from dataclasses import dataclass

from atlas_core.backends.base import Backend
from atlas_core.errors import InvalidRequestError


@dataclass
class EngineConfig:
    """Engine limits and policies (CLI flags map one to one).

    ``max_seq_len`` None means the model's context length, capped at ``default_max_seq_len``.
    The KV cache gets ``gpu_memory_utilization`` of the device's memory on device backends
    (what the weights and other allocations already use is subtracted), or
    ``kv_cache_memory_gib`` on host backends. ``max_prefill_tokens`` None means
    ``max_num_batched_tokens``. ``max_state_snapshots`` (hybrid recurrent models with prefix caching:
    how many saved recurrent states back cached prefixes) None means ``max_num_seqs``.
    """

    max_seq_len: int | None = None
    default_max_seq_len: int = 8192
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_prefill_tokens: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fifo"
    tbt_slo_ms: float = 100.0
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_gib: float = 1.0
    max_state_snapshots: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise InvalidRequestError(f"max_prefill_tokens must be at least 1, got {self.max_prefill_tokens}")
        if self.max_state_snapshots is not None and self.max_state_snapshots < 0:
            raise InvalidRequestError(f"max_state_snapshots must be at least 0, got {self.max_state_snapshots}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise InvalidRequestError(f"max_seq_len must be at least 2, got {self.max_seq_len}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidRequestError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory_gib <= 0:
            raise InvalidRequestError(f"kv_cache_memory_gib must be positive, got {self.kv_cache_memory_gib}")


def kv_budget(backend: Backend, config: EngineConfig) -> tuple[int, str]:
    """``(bytes for the KV cache, a phrase naming where that number comes from)``."""
    memory = backend.device_memory()
    if memory is None:
        return int(config.kv_cache_memory_gib * 2**30), f"kv_cache_memory_gib={config.kv_cache_memory_gib:g}"
    free, total = memory
    budget = int(total * config.gpu_memory_utilization) - (total - free)
    return budget, (
        f"gpu_memory_utilization={config.gpu_memory_utilization:g} of {total / 2**30:.1f} GiB "
        f"minus {(total - free) / 2**30:.1f} GiB in use"
    )
