"""How one rank's share of a model is cut from the checkpoint (tensor and expert parallelism).

The ``tensor_parallel_size`` ranks of a replica split every layer tensor-parallel: attention by heads
(key/value heads replicated when there are fewer than ranks), feed-forward layers by their
intermediate rows, the vocabulary of the embedding and the LM head by rows. Mixture-of-Experts layers
split their experts into ``expert_parallel_size`` groups of ``world_size / expert_parallel_size``
ranks each: a group holds ``num_experts / expert_parallel_size`` whole experts, and its ranks split
each of those experts' intermediate rows between them. With ``tensor_parallel_size=1`` and
``expert_parallel_size=N`` the N ranks each hold the whole attention and dense layers (computed
redundantly, no collective) and 1/N of the experts. Every rank routes every token the same way and computes
what its experts give; one all-reduce after the block sums the ranks' parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from atlas_core.comm import CommBackend
from atlas_core.errors import ConfigError, ModelLoadError


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank``'s ranges of each split dimension (`ConfigError` for sizes that do not compose).

    ``tensor_parallel_size`` ranks split attention, dense feed-forward layers and the vocabulary;
    ``expert_parallel_size`` groups split the routed experts. Either is 1 or the other is a multiple
    of it: the replica has ``max(tensor_parallel_size, expert_parallel_size)`` ranks, and with
    ``tensor_parallel_size=1`` every rank holds the whole attention and dense layers (replicated)."""

    rank: int = 0
    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1

    def __post_init__(self) -> None:
        tp, ep = self.tensor_parallel_size, self.expert_parallel_size
        if tp < 1 or ep < 1:
            raise ConfigError(f"tensor_parallel_size={tp} and expert_parallel_size={ep} must be at least 1")
        if tp > 1 and tp % ep:
            raise ConfigError(
                f"expert_parallel_size={ep} must divide tensor_parallel_size={tp} (the experts are split over "
                "groups of the tensor-parallel ranks), or tensor_parallel_size must be 1"
            )
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} does not exist among {self.world_size} ranks")

    @property
    def world_size(self) -> int:
        """Ranks of the replica: ``max(tensor_parallel_size, expert_parallel_size)``."""
        return max(self.tensor_parallel_size, self.expert_parallel_size)

    @property
    def is_split(self) -> bool:
        """Whether this rank holds less than the whole model (its experts, at least)."""
        return self.world_size > 1

    @property
    def tensor_split(self) -> bool:
        """Whether attention, dense layers and the vocabulary are split (else each rank holds them whole)."""
        return self.tensor_parallel_size > 1

    def split(self, total: int, what: str) -> range:
        """This rank's tensor-parallel share of ``total`` (``what`` names the dimension for the error):
        all of it when `tensor_split` is false."""
        return _share(
            total, self.rank % self.tensor_parallel_size, self.tensor_parallel_size, what, "tensor_parallel_size"
        )

    def kv_heads(self, num_kv_heads: int, num_heads: int) -> range:
        """The key/value heads this rank keeps: its share, or, with fewer KV heads than ranks, the one
        KV head its query heads (`split` of ``num_heads``) read, replicated on several ranks."""
        if num_kv_heads >= self.tensor_parallel_size:
            return self.split(num_kv_heads, "num_key_value_heads")
        if self.tensor_parallel_size % num_kv_heads:
            raise ModelLoadError(
                f"{num_kv_heads} key/value heads cannot be replicated evenly over {self.tensor_parallel_size} ranks; "
                f"use a tensor_parallel_size that {num_kv_heads} divides or that divides {num_kv_heads}"
            )
        first_query_head = self.split(num_heads, "num_attention_heads").start
        head = first_query_head // (num_heads // num_kv_heads)
        return range(head, head + 1)

    def vocab(self, vocab_size: int) -> tuple[range, int]:
        """``(this rank's token ids, rows per rank)``: ``ceil(vocab_size / tensor_parallel_size)`` rows each,
        the last rank's range shorter when the vocabulary does not split evenly (its table padded with zeros)."""
        per_rank = -(-vocab_size // self.tensor_parallel_size)
        start = min(vocab_size, self.rank % self.tensor_parallel_size * per_rank)
        return range(start, min(vocab_size, start + per_rank)), per_rank

    def experts(self, num_experts: int) -> range:
        """The routed experts this rank's expert group holds."""
        group = self.rank // self.expert_group_size
        return _share(num_experts, group, self.expert_parallel_size, "num_experts", "expert_parallel_size")

    @property
    def expert_group_size(self) -> int:
        """Ranks per expert group, which split each of the group's experts by intermediate rows."""
        return self.world_size // self.expert_parallel_size

    def expert_rows(self, intermediate: int) -> range:
        """This rank's share of each of its experts' intermediate rows."""
        return _share(
            intermediate,
            self.rank % self.expert_group_size,
            self.expert_group_size,
            "moe_intermediate_size",
            "tensor_parallel_size / expert_parallel_size",
        )


def _share(total: int, index: int, parts: int, what: str, setting: str) -> range:
    if total % parts:
        raise ModelLoadError(
            f"{what}={total} does not split evenly into {parts} parts; choose a {setting} that divides it"
        )
    size = total // parts
    return range(index * size, (index + 1) * size)


@dataclass(frozen=True)
class TensorParallel:
    """A rank's shard plan with the communicator its layers all-reduce and all-gather over."""

    plan: ShardPlan
    comm: CommBackend
