"""Paged KV cache storage and the block allocator that hands out its blocks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.errors import AtlasError


@dataclass(frozen=True)
class KVLayout:
    """One attention layer's KV shape: ``num_kv_heads`` heads of ``head_dim`` values for K and V."""

    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, itemsize: int) -> int:
        return 2 * self.num_kv_heads * self.head_dim * itemsize


class KVCacheTooSmallError(AtlasError):
    """The memory budget cannot hold what was asked; the message gives the numbers."""


def plan_num_blocks(
    layouts: list[KVLayout], itemsize: int, block_size: int, budget_bytes: int, max_seq_len: int
) -> int:
    """How many blocks fit in ``budget_bytes``; raise `KVCacheTooSmallError` if not one ``max_seq_len`` sequence."""
    bytes_per_token = sum(layout.bytes_per_token(itemsize) for layout in layouts)
    bytes_per_block = bytes_per_token * block_size
    num_blocks = budget_bytes // bytes_per_block
    needed = -(-max_seq_len // block_size)
    if num_blocks < needed:
        fitting_len = num_blocks * block_size
        raise KVCacheTooSmallError(
            f"the KV cache budget of {budget_bytes / 2**20:.1f} MiB holds {num_blocks} blocks of {block_size} tokens "
            f"({bytes_per_token} bytes per token over {len(layouts)} layers), but one sequence of max_seq_len="
            f"{max_seq_len} needs {needed} blocks ({needed * bytes_per_block / 2**20:.1f} MiB). Lower max_seq_len to "
            f"at most {fitting_len}, or raise the KV memory budget to at least {needed * bytes_per_block / 2**20:.1f} MiB."
        )
    return int(num_blocks)


class KVCache:
    """Per-layer K and V arrays ``[num_blocks, block_size, num_kv_heads, head_dim]`` on the backend."""

    def __init__(self, backend: Backend, layouts: list[KVLayout], num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        dtype = backend.activation_dtype
        self.keys: list[Array] = []
        self.values: list[Array] = []
        for layout in layouts:
            shape = (num_blocks, block_size, layout.num_kv_heads, layout.head_dim)
            self.keys.append(backend.zeros(shape, dtype))
            self.values.append(backend.zeros(shape, dtype))


class BlockAllocator:
    """A free list of KV block ids. Blocks are exclusively owned until freed."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        """``count`` block ids; raises `KVCacheTooSmallError` when fewer are free (callers check first)."""
        if count > len(self._free):
            raise KVCacheTooSmallError(f"asked for {count} KV blocks but only {len(self._free)} are free")
        return [self._free.pop() for _ in range(count)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


def slots_for(blocks: list[int], block_size: int, start: int, end: int) -> np.ndarray:
    """Flat KV slots of token positions ``start..end-1`` of a sequence owning ``blocks``."""
    positions = np.arange(start, end)
    return np.asarray(blocks, dtype=np.int64)[positions // block_size] * block_size + positions % block_size
