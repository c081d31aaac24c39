"""The StorageBackend contract: a slower tier (host RAM, NVMe) that KV blocks can spill to.

Core ships no implementation; the engine recomputes preempted sequences when none is
configured. Implementations register through ``register_storage_backends``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np


class StorageBackend(ABC):
    """Stores whole KV blocks under integer handles chosen by the engine.

    A block is a list of host arrays (one per layer and K/V, all of one fixed shape per index),
    so any KV layout can be spilled. Calls come from the engine thread only.
    """

    @property
    @abstractmethod
    def capacity_blocks(self) -> int:
        """How many blocks fit in this tier."""

    @abstractmethod
    def write_blocks(self, handles: Sequence[int], blocks: Sequence[Sequence[np.ndarray]]) -> None:
        """Store ``blocks[i]`` under ``handles[i]``, replacing anything stored there."""

    @abstractmethod
    def read_blocks(self, handles: Sequence[int], out: Sequence[Sequence[np.ndarray]]) -> None:
        """Copy the blocks stored under ``handles`` into the preallocated ``out`` arrays;
        an unknown handle raises ``KeyError``."""

    @abstractmethod
    def discard(self, handles: Sequence[int]) -> None:
        """Forget the given handles (unknown handles are ignored)."""
