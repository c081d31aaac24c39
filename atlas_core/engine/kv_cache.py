"""Paged KV cache storage and its sizing from a memory budget."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.errors import AtlasError


@dataclass(frozen=True)
class KVLayout:
    """One attention layer's KV: ``num_kv_heads`` heads of ``head_dim`` values for K and for V,
    stored in ``dtype`` (None: the backend's activation dtype; the seam for fp8 and lower)."""

    num_kv_heads: int
    head_dim: int
    dtype: np.dtype | None = None

    def bytes_per_token(self, default_dtype: np.dtype) -> int:
        itemsize = np.dtype(self.dtype or default_dtype).itemsize
        return 2 * self.num_kv_heads * self.head_dim * itemsize


class KVCacheTooSmallError(AtlasError):
    """The memory budget cannot hold what was asked; the message gives the numbers and what fits."""


@dataclass(frozen=True)
class KVPlan:
    """How many blocks the budget holds, and the figures behind it (for messages and the ready line)."""

    num_blocks: int
    block_size: int
    bytes_per_token: int

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


def plan_kv_cache(
    layouts: list[KVLayout], default_dtype: np.dtype, block_size: int, budget_bytes: int, max_seq_len: int,
    budget_source: str,
) -> KVPlan:
    """Blocks that fit in ``budget_bytes``; `KVCacheTooSmallError` if not one ``max_seq_len`` sequence.

    ``budget_source`` says where the budget came from and which setting changes it.
    """
    bytes_per_token = sum(layout.bytes_per_token(default_dtype) for layout in layouts)
    bytes_per_block = bytes_per_token * block_size
    num_blocks = max(0, budget_bytes) // bytes_per_block
    needed = -(-max_seq_len // block_size)
    if num_blocks < needed:
        mib = 2**20
        raise KVCacheTooSmallError(
            f"the KV cache cannot hold one sequence of max_seq_len={max_seq_len}: {budget_source} gives "
            f"{max(0, budget_bytes) / mib:.1f} MiB, which holds {num_blocks} blocks of {block_size} tokens "
            f"({bytes_per_token} bytes per token over {len(layouts)} layers), but one sequence needs {needed} blocks "
            f"({needed * bytes_per_block / mib:.1f} MiB). Lower max_seq_len to at most {num_blocks * block_size}, "
            f"or raise the budget to at least {needed * bytes_per_block / mib:.1f} MiB."
        )
    return KVPlan(int(num_blocks), block_size, bytes_per_token)


class KVCache:
    """Per-layer K and V arrays ``[num_blocks, block_size, num_kv_heads, head_dim]`` on the backend."""

    def __init__(self, backend: Backend, layouts: list[KVLayout], plan: KVPlan) -> None:
        self.block_size = plan.block_size
        self.num_blocks = plan.num_blocks
        self.keys: list[Array] = []
        self.values: list[Array] = []
        for layout in layouts:
            shape = (plan.num_blocks, plan.block_size, layout.num_kv_heads, layout.head_dim)
            dtype = layout.dtype or backend.activation_dtype
            self.keys.append(backend.zeros(shape, dtype))
            self.values.append(backend.zeros(shape, dtype))

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (copy-on-write of shared blocks)."""
        src = np.asarray([s for s, _ in copies])
        dst = np.asarray([d for _, d in copies])
        for cache in (*self.keys, *self.values):
            cache[dst] = cache[src]


def slots_for(blocks: list[int], block_size: int, start: int, end: int) -> np.ndarray:
    """Flat KV slots of token positions ``start..end-1`` of a sequence owning ``blocks``."""
    positions = np.arange(start, end)
    return np.asarray(blocks, dtype=np.int64)[positions // block_size] * block_size + positions % block_size
